"""``pdchaos run scenarios/pd/ --profile k8s --dry-run``: every workload and Chaos Mesh object per
scenario and target, against a golden file (PDCHAOS_UPDATE_GOLDEN=1 rewrites it after a
deliberate change); nothing is started and no cluster is asked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
GOLDEN = REPO / "tests" / "golden" / "dry_run_k8s.txt"


@pytest.mark.timeout(120)
def test_the_k8s_dry_run_matches_its_golden_file_and_asks_no_cluster(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PDCHAOS_KUBECONFIG": str(tmp_path / "no-such-kubeconfig"),
           "KUBECONFIG": str(tmp_path / "no-such-kubeconfig")}
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "run", "scenarios/pd/", "--profile", "k8s",
                           "--dry-run", "--runs-dir", str(tmp_path / "runs")], cwd=REPO, capture_output=True,
                          text=True, timeout=110, env=env)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "runs").exists()
    if os.environ.get("PDCHAOS_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(proc.stdout)
    assert proc.stdout == GOLDEN.read_text(), "differs from tests/golden/dry_run_k8s.txt"
    out = proc.stdout
    runs = out.count("\n== ") + out.startswith("== ")
    assert out.count("runtime objects:") == runs and runs >= 38  # 45 less what k8s lists as not run
    assert out.count("kind: Namespace") == runs and out.count("kind: LeaderWorkerSet") == 2 * runs
    # every fault is said: a Chaos Mesh object, exec, or pd-chaos's own peers and hooks
    assert out.count("# fault ") == out.count("# fault ") and "Chaos Mesh PodChaos kill-1" in out
    assert out.count("kind: NetworkChaos") == 2 and "action: partition" in out
    # every object with a lasting effect ends by itself if the harness dies: its duration
    lasting = [d for d in out.split("\n---\n") if "kind: NetworkChaos" in d or "kind: StressChaos" in d]
    assert lasting and all("\n  duration: " in d for d in lasting)
    assert "exec in the pod of decode:0: kill -STOP -1" in out
    # a toxic on one link (P's bootstrap port) is refused before anything starts, listed like other
    # exclusions: Chaos Mesh selects pods, not ports, so it would be a fault on all of P's traffic
    assert out.count("not run: pd-bootstrap-reset") == 2 and out.count("not run: pd-bootstrap-latency") == 2
    assert "selects pods, not ports" in out
    assert "--cpu-core" not in out  # pods are hosts of their own: nothing pins cores
    assert f"dry run: {runs} scenario/target run(s); nothing was started" in out


HIDE_CLIENT = ("import sys; sys.modules['kubernetes'] = None  # as if the k8s extra were not installed\n"
               "from harness.cli import main; sys.exit(main(sys.argv[1:]))\n")


@pytest.mark.timeout(120)
def test_without_the_k8s_extra_the_dry_run_works_and_a_cluster_command_says_one_line(tmp_path: Path) -> None:
    """``kubernetes`` is the optional extra ``.[k8s]``: rendering needs none of it, and a command that
    needs a cluster names the extra in one line (no ImportError, no traceback)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PDCHAOS_KUBECONFIG": str(tmp_path / "none")}
    dry = subprocess.run([sys.executable, "-c", HIDE_CLIENT, "run", "scenarios/pd/baseline.yaml", "--profile", "k8s",
                          "--dry-run", "--runs-dir", str(tmp_path / "runs")], cwd=REPO, capture_output=True,
                         text=True, timeout=100, env=env)
    assert dry.returncode == 0 and "kind: Namespace" in dry.stdout, dry.stderr
    doc = subprocess.run([sys.executable, "-c", HIDE_CLIENT, "doctor", "--profile", "k8s"], cwd=REPO,
                         capture_output=True, text=True, timeout=100, env=env)
    line = [ln for ln in doc.stdout.splitlines() if "k8s-api" in ln]
    assert len(line) == 1 and "pip install -e '.[k8s]'" in line[0], doc.stdout
    assert "Traceback" not in doc.stdout + doc.stderr + dry.stderr
