"""`pdchaos run --concurrency N` (harness/schema.py: at_concurrency): the same scenario and claims
with at least N workers, the rate scaled by as much."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import UsageError
from harness.schema import at_concurrency, load_scenario

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(60)


def test_scales_workers_and_rate_and_keeps_the_claims() -> None:
    s = load_scenario(REPO / "scenarios/pd/stop-decode.yaml")
    c4 = at_concurrency(s, 4)
    assert c4.name == "pd-stop-decode@c4"
    assert (c4.workload.concurrency, c4.workload.rate) == (4, s.workload.rate * 4 / s.workload.concurrency)
    assert c4.model.expect == s.model.expect and c4.model.triggers == s.model.triggers
    assert [f.type for f in c4.faults] == [f.type for f in s.faults]
    assert at_concurrency(s, 1) is s  # already at least that many workers


def test_a_workload_without_workers_is_refused_by_name() -> None:
    s = load_scenario(REPO / "scenarios/pd/stop-decode.yaml")
    w = s.model.workload.model_copy(update={"concurrency": None})
    odd = type(s)(s.model.model_copy(update={"workload": w}), s.path)
    with pytest.raises(UsageError, match="stop-decode.yaml: --concurrency"):
        at_concurrency(odd, 4)


def test_cli_refuses_a_bad_value_without_a_traceback() -> None:
    r = subprocess.run([sys.executable, "-m", "harness.cli", "run", "scenarios/pd/stop-decode.yaml",
                        "--concurrency", "0"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--concurrency 0: between 1 and 64" in r.stderr and "Traceback" not in r.stderr
