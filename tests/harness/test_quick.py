"""`pdchaos run PATH --quick`: the first-result path runs only the scenarios marked `quick: true`
(for P/D: the baseline and two fake prefill peers, a silent one among them, on both targets), and
refuses a selection that has none; checked with --dry-run (nothing started)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)


def pdchaos(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=100)


def test_quick_runs_the_marked_scenarios_on_both_targets() -> None:
    res = pdchaos("run", "scenarios/pd/", "--quick", "--dry-run")
    assert res.returncode == 0, res.stderr
    runs = sorted(ln.split()[1] + " " + ln.split()[2].strip("[]")
                  for ln in res.stdout.splitlines() if ln.startswith("== "))
    assert runs == sorted(f"{s} {t}" for s in ("pd-baseline", "pd-fake-prefill-garbage", "pd-fake-prefill-silent")
                          for t in ("upstream", "hardened")), res.stdout[:2000]
    assert res.stdout.rstrip().endswith("dry run: 6 scenario/target run(s); nothing was started")


def test_quick_without_a_marked_scenario_is_one_error_line() -> None:
    res = pdchaos("run", "scenarios/lookup/", "--quick")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip() == "error: --quick: no selected scenario is marked `quick: true`"
