"""Each runtime patch stands for an upstream diff (connector_patch/*/diffs/*.diff): every diff
applies, as written, to the file the P/D node env installs (vLLM 0.32.0's CPU wheel), and names a
file that is there. A diff that no longer applies says the patch and its diff have drifted apart."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DIFFS = sorted(REPO.glob("connector_patch/*/diffs/*.diff"))
pytestmark = pytest.mark.timeout(60)


def test_there_are_diffs() -> None:
    assert {d.name for d in DIFFS} >= {"engine_core_quiet_wait.diff", "shm_broadcast_adaptive_spin.diff",
                                       "kv_output_aggregator_failed_early.diff"}


@pytest.mark.parametrize("diff", DIFFS, ids=[d.name for d in DIFFS])
def test_each_diff_applies_to_the_pinned_upstream_file(diff: Path, tmp_path: Path) -> None:
    from stacks.vllm_cpu.recipe import pd_node_env

    env = pd_node_env(out=lambda line: None)
    if not env.installed():
        pytest.skip("the P/D node stack is not installed here: run `pdchaos setup --only pd-node-stack`")
    text = diff.read_text()
    assert text.startswith("# vLLM 0.32.0"), "the header names the upstream release the diff is against"
    targets = re.findall(r"^\+\+\+ b/(\S+)$", text, re.M)
    assert targets, "no file named"
    for rel in targets:
        src = env.site_packages() / rel
        assert src.is_file(), f"{rel} is not in the node env"
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, tmp_path / rel)
    res = subprocess.run(["git", "apply", "-p1", "-v", str(diff)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr[-2000:]
    for rel in targets:  # the patched file is still Python
        compile((tmp_path / rel).read_text(), rel, "exec")
