"""The patched target of the layerwise family: vllm-ascend's own MooncakeLayerwiseConnector on a copy of
the conformance env's vllm_ascend with connector_patch/upstream/vllm-ascend/ applied, no plugin. It runs
only when asked (`--target patched`) and claims what hardened claims; a real run of it is in .ci/run
(scenarios/ascend-cpu/layerwise-transfer-error.yaml with all three targets) and the CPU nightly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.plan import targets_of
from harness.schema import load_scenario

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.timeout(120)



def _cached(shown: str) -> Path:
    """A cache path as the dry run shows it (``~/.cache/pdchaos/...``) where it is on this machine
    (``XDG_CACHE_HOME`` moves the cache)."""
    from harness.nodeenv.venv import cache_root

    return Path(shown.replace("~/.cache/pdchaos", str(cache_root()), 1))

def test_patched_runs_only_when_asked_and_claims_what_hardened_claims() -> None:
    sc = load_scenario(REPO / "scenarios/ascend-cpu/layerwise-transfer-error.yaml")
    assert "patched" not in targets_of(sc)
    assert targets_of(sc, ["patched"])[-1] == "patched"
    assert sc.model.expected("patched") == sc.model.expected("hardened")


def test_dry_run_starts_both_connector_nodes_on_the_copy() -> None:
    from stacks.ascend_cpu.steps import AscendStackStep

    if AscendStackStep().check() is None:
        pytest.skip("the conformance env is not installed: pdchaos setup --family layerwise")
    res = subprocess.run([sys.executable, "-m", "harness.cli", "run", "scenarios/ascend-cpu/layerwise-transfer-error.yaml",
                          "--target", "patched", "--dry-run"], cwd=REPO, capture_output=True, text=True, timeout=100)
    assert res.returncode == 0, res.stderr[-2000:]
    nodes = [ln for ln in res.stdout.splitlines() if "--impl patched" in ln]
    assert len(nodes) == 2 and all("--upstream-overlay ~/.cache/pdchaos/patched/vllm_ascend-" in ln
                                   for ln in nodes), res.stdout[-2000:]
    overlay = _cached(nodes[0].split("--upstream-overlay ")[1].split()[0])
    assert (overlay / "vllm_ascend" / "distributed" / "kv_transfer" / "kv_p2p" / "mooncake_layerwise_rules.py").is_file()


@pytest.mark.parametrize("argv,word", [
    (["--impl", "patched"], "--upstream-overlay"),
    (["--impl", "hardened", "--upstream-overlay", "/tmp"], "--upstream-overlay"),
    (["--impl", "patched", "--upstream-overlay", "relative/dir"], "--upstream-overlay"),
])
def test_the_node_refuses_an_overlay_without_patched_or_that_is_not_one(argv: list[str], word: str) -> None:
    res = subprocess.run([sys.executable, "-m", "harness.cli", "node", "layerwise-prefill", "--kv-port", "20001",
                          "--dist-port", "20002", *argv], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and word in res.stderr and "Traceback" not in res.stderr, res.stderr[-1000:]
