"""The lookup family's patched target on the vllm-store stack: vLLM's own store admin channel
(LookupKeyServer, LookupKeyClient) on a copy of the P/D node env's vLLM with connector_patch/upstream/
vllm/0.32.0/ applied, no plugin, claiming what hardened claims (vllm-ascend's AscendStore has its own:
test_ascend_patched_target.py). The standalone stack runs no upstream code: there it is listed as not
run, with the reason. A real run (both nodes, the real master-less channel) is here;
the whole store suite on patched runs in the CPU nightly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.plan import targets_of
from harness.schema import load_scenario

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.timeout(240)


def _pd_env_or_skip() -> None:
    from stacks.vllm_cpu.steps import PdStackStep

    if PdStackStep().check() is None:
        pytest.skip("the P/D node env is not installed: pdchaos setup")


def test_patched_is_asked_for_and_claims_what_hardened_claims() -> None:
    sc = load_scenario(REPO / "scenarios/store/reset.yaml")
    assert "patched" not in targets_of(sc) and targets_of(sc, ["patched"])[-1] == "patched"
    assert sc.model.expected("patched") == sc.model.expected("hardened") == "pass"


def test_patched_is_not_run_where_the_stack_has_no_upstream_diffs_wired() -> None:
    res = subprocess.run([sys.executable, "-m", "harness.cli", "run", "scenarios/lookup/baseline.yaml",
                          "--target", "patched", "--dry-run"], cwd=REPO, capture_output=True, text=True, timeout=100)
    assert "not run: baseline [patched]" in res.stdout and "standalone stack runs no upstream code" in res.stdout
    assert res.returncode == 2 and "nothing to run" in res.stderr
    assert "Traceback" not in res.stderr


def test_dry_run_gives_both_ends_the_copy_and_the_path_the_diff_derives() -> None:
    _pd_env_or_skip()
    res = subprocess.run([sys.executable, "-m", "harness.cli", "run", "scenarios/store/reset.yaml",
                          "--target", "patched", "--dry-run"], cwd=REPO, capture_output=True, text=True, timeout=100)
    assert res.returncode == 0, res.stderr[-2000:]
    server = next(ln for ln in res.stdout.splitlines() if "node store-lookup-server" in ln)
    assert "--impl patched" in server and "--upstream-overlay ~/.cache/pdchaos/patched/vllm-" in server
    assert "/lookup_rpc_" in server and "_dp_rank0" in server  # diff 33: named by the engine id
    config = json.loads(next(ln for ln in res.stdout.splitlines() if ln.strip().startswith("config:"))
                        .split("config:", 1)[1])
    assert config["target"] == "patched" and config["upstream_overlay"].startswith("~/.cache/pdchaos/patched/vllm-")


@pytest.mark.parametrize("argv", [["--impl", "patched"], ["--impl", "hardened", "--upstream-overlay", "/tmp"],
                                  ["--impl", "patched", "--upstream-overlay", "rel/dir"]])
def test_the_server_node_refuses_an_overlay_without_patched_or_that_is_not_one(argv: list[str], tmp_path) -> None:
    res = subprocess.run([sys.executable, "-m", "harness.cli", "node", "store-lookup-server", "--endpoint",
                          f"ipc://{tmp_path}/x", "--engine-id", "e", *argv], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2 and "--upstream-overlay" in res.stderr and "Traceback" not in res.stderr


def test_a_real_reset_scenario_on_the_patched_target_is_as_hardened(tmp_path: Path) -> None:
    """Both nodes on vLLM with the diffs: lookups within the deadline and a confirmed reset that
    removed this model's keys, judged by the same checks as hardened."""
    _pd_env_or_skip()
    res = subprocess.run([sys.executable, "-m", "harness.cli", "run", "scenarios/store/reset.yaml", "--target",
                          "patched", "--plain", "--runs-dir", str(tmp_path)], cwd=REPO, capture_output=True,
                         text=True, timeout=220)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "store-reset [patched] pass (expected pass) as expected" in res.stdout
