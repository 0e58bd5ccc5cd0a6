"""The patched target of the pd family: vLLM's own connector on a copy of the node env's vLLM with the
upstream diffs applied, no plugin. It runs only when asked for (`--target patched`), on every scenario
that runs hardened, and claims what hardened claims."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.plan import plan_for_reuse, targets_of
from harness.schema import load_scenario

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.timeout(120)


def test_patched_runs_only_when_asked_and_claims_what_hardened_claims() -> None:
    silent = load_scenario(REPO / "scenarios/pd/fake-prefill-silent.yaml")
    mixed = load_scenario(REPO / "scenarios/pd/mixed-upstream-decode.yaml")
    assert targets_of(silent) == ["upstream", "hardened"]
    assert targets_of(silent, ["patched"]) == ["upstream", "hardened", "patched"]
    assert targets_of(mixed, ["patched"]) == ["hardened", "patched"]
    assert silent.model.expected("patched") == silent.model.expected("hardened") == "pass"
    assert silent.model.expected("upstream") != silent.model.expected("patched")
    plan = plan_for_reuse([silent, mixed], ["patched"])
    assert sorted((sc.model.name, t) for sc, t in plan if t == "patched") == [
        ("pd-fake-prefill-silent", "patched"), ("pd-mixed-upstream-decode", "patched")]
    assert all(t != "patched" for _, t in plan_for_reuse([silent, mixed]))


def test_the_profiles_patched_connector() -> None:
    from families.pd.profile import load_profile

    cpu = load_profile(None, [])
    up, hard, patched = (cpu.connectors[t] for t in ("upstream", "hardened", "patched"))
    assert patched.name == up.name == "MooncakeConnector"  # upstream's own class, by its own name
    assert patched.extra_config == hard.extra_config and patched.upstream_series == "vllm/0.32.0"
    assert patched.unavailable is None
    ascend = load_profile("ascend", ["model=/tmp"])  # another vLLM installation: no copy of it is made
    assert "node env" in ascend.connectors["patched"].unavailable


def test_dry_run_starts_patched_nodes_on_the_copy_without_the_plugin() -> None:
    res = subprocess.run([sys.executable, "-m", "harness.cli", "run", "scenarios/pd/mixed-upstream-decode.yaml",
                          "--target", "patched", "--dry-run"], cwd=REPO, capture_output=True, text=True, timeout=100)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = {ln.split("--role ")[1].split()[0]: ln for ln in res.stdout.splitlines() if "node vllm --role" in ln}
    assert "--upstream-overlay" in lines["prefill"] and "--kv-connector MooncakeConnector" in lines["prefill"]
    assert "--kv-load-timeout-ms" in lines["prefill"]
    assert "--upstream-overlay" not in lines["decode"]  # mixed: D stays on vLLM's own code
    assert "Hardened" not in res.stdout
    bad = subprocess.run([sys.executable, "-m", "harness.cli", "run", "scenarios/pd/fake-prefill-silent.yaml",
                          "--target", "patched", "--profile", "ascend", "--set", "model=/tmp", "--dry-run"],
                         cwd=REPO, capture_output=True, text=True, timeout=100)
    assert bad.returncode == 2 and "not run: pd-fake-prefill-silent [patched]" in bad.stdout
    assert "Traceback" not in bad.stderr


def test_the_node_refuses_an_overlay_that_is_not_a_folder(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "harness.cli", "node", "vllm", "--role", "decode", "--port", "1",
                          "--bootstrap-port", "2", "--server-log", str(tmp_path / "s.log"),
                          "--upstream-overlay", "relative/dir"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--upstream-overlay" in res.stderr and "Traceback" not in res.stderr


def test_patched_nodes_turn_on_the_series_opt_in_switches(tmp_path: Path) -> None:
    """02's adaptive spin and 01/04/18's engine wake are off by default in the diffs (vLLM's behaviour): a
    node on the patched copy of vLLM turns them on, a node on upstream's code or a vllm-ascend copy does not."""
    from families.pd import vllm_node

    p = vllm_node.argparse.ArgumentParser()
    vllm_node.add_node_arguments(p, "vllm")
    (tmp_path / "copy" / "vllm").mkdir(parents=True)
    (tmp_path / "ascend" / "vllm_ascend").mkdir(parents=True)
    common = ["--role", "decode", "--port", "18001", "--bootstrap-port", "18002", "--server-log", str(tmp_path / "s")]
    envs = {}
    for name, extra in (("patched", ["--upstream-overlay", str(tmp_path / "copy")]), ("upstream", []),
                        ("ascend", ["--upstream-overlay", str(tmp_path / "ascend")])):
        node = vllm_node.VllmNode.__new__(vllm_node.VllmNode)
        node.args = p.parse_args(common + extra)
        node.role, node.kv_extra, node.extra_env = "decode", None, {}
        node.vllm_bin = tmp_path / "bin" / "vllm"
        envs[name] = node.environment()
    assert vllm_node.PATCHED_VLLM_ENV  # something to turn on
    for key, value in vllm_node.PATCHED_VLLM_ENV.items():
        assert envs["patched"][key] == value == "1"
        assert key not in envs["upstream"] and key not in envs["ascend"]
    assert envs["patched"]["PYTHONPATH"].split(":")[0] == str(tmp_path / "copy")
