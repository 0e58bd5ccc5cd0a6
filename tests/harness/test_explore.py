"""pdchaos explore's core (harness/explore.py) with the pd family's real generator and the real
scenario schema, the runs judged by a stand-in (no nodes): what it draws validates, the budget
bounds it, a failing schedule is shrunk to the smallest one that still fails and written as a
scenario file that loads; the CLI's bad input is one clear error."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.errors import UsageError
from harness.explore import Explorer, shrink_candidates
from harness.family import get_family
from harness.schema import load_scenario

pytestmark = pytest.mark.timeout(120)
FAM = get_family("pd").load()


def _load(path: Path):
    try:
        sc = load_scenario(path)
    except UsageError as exc:
        return str(exc)
    return FAM.excluded(sc.model, "hardened", None) or sc


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _stand_in(clock: Clock, runs: list):
    """A target that fails (drained) whenever D is stopped while two or more workers run; each run
    takes 30 s of the fake clock."""
    def run_one(path: Path, target: str):
        sc = load_scenario(path)
        runs.append(sc)
        clock.t += 30.0
        bad = any(f.type == "stop" and f.node == "decode:0" for f in sc.faults) and sc.model.workload.concurrency >= 2
        return SimpleNamespace(verdict="fail" if bad else "pass", failing=["drained"] if bad else [],
                               reason="drained: D held blocks" if bad else "")
    return run_one


def test_every_drawn_schedule_and_shrink_candidate_is_a_scenario_or_refused(tmp_path: Path) -> None:
    from families.pd import explore as E
    from harness.explore import write_scenario

    rng = random.Random(7)
    ok = refused = 0
    for i in range(60):
        s = E.draw(rng)
        assert 1 <= len(s["faults"]) <= 3 and 1 <= s["workload"]["concurrency"] <= 8
        hooks = [f for f in s["faults"] if f["type"] in E.PROXY_FAULTS]
        for a in hooks:  # proxy faults never overlap: each heal clears the proxy's hooks
            assert not any(b is not a and a["at"] < b["at"] + b["for"] and b["at"] < a["at"] + a["for"] for b in hooks)
        for _, cand in [("drawn", s)] + shrink_candidates(s, E.MIN_WINDOW_S):
            p = tmp_path / f"s{i}.yaml"
            write_scenario(E.render(cand, f"t-{i}", "hardened", i), p)
            got = _load(p)
            if isinstance(got, str):
                refused += 1  # refused before running (e.g. no time for recovery): never run
                continue
            ok += 1
            # each fault is a trigger: a window no request crossed is an error, not a pass
            assert [t.fault for t in got.model.triggers] == list(range(len(got.faults)))
    assert ok > 3 * refused, (ok, refused)


def test_a_failing_schedule_is_shrunk_and_written_as_a_scenario(tmp_path: Path) -> None:
    clock, runs, lines = Clock(), [], []
    ex = Explorer(FAM, "hardened", seed=5, budget_s=3 * 3600, out_dir=tmp_path, run_one=_stand_in(clock, runs),
                  load=_load, say=lines.append, clock=clock)
    tally = ex.explore()
    assert tally.schedules >= 5 and tally.runs == len(runs) and clock.t <= 3 * 3600 + 30
    assert tally.findings, "\n".join(lines)
    for f in tally.findings:
        repro = load_scenario(Path(f.path))  # a valid scenario
        assert repro.model.expect["hardened"] == "pass" and "Found by pdchaos explore" in repro.model.description
        # the stand-in is deterministic: every finding settled is re-proven 3 of 3 and by its file's re-run
        if f.status == "re-proven":
            assert (f.failed_runs, f.proving_runs) == (3, 3) and f.rerun["reproduces"] and f.rerun["path"] == f.path
        # minimal for the stand-in's rule: one fault (D stopped) and concurrency 2
        if f.shrunk is not None and not f.shrink_note:
            assert [x.type for x in repro.faults] == ["stop"] and repro.faults[0].node == "decode:0"
            assert repro.model.workload.concurrency == 2, f.shrunk
            assert f.shrunk_failing == ["drained"]
    assert any(f.shrunk is not None and not f.shrink_note and f.status == "re-proven" for f in tally.findings)
    summary = ex.summary()
    assert summary["schedules"] == tally.schedules and len(summary["findings"]) == len(tally.findings)


def test_every_fault_kind_is_tried_alone_first_and_a_repeat_finding_is_not_shrunk_again(tmp_path: Path) -> None:
    """The family's covering schedules run before any random draw (a 20-minute control once drew
    no silent peer in 12 schedules); findings made while covering are shrunk after it; a finding
    with the same fault kinds and failing checks as an earlier one is recorded, not shrunk."""
    from families.pd import explore as E

    clock, runs, lines = Clock(), [], []
    ex = Explorer(FAM, "hardened", seed=11, budget_s=3600, out_dir=tmp_path, run_one=_stand_in(clock, runs),
                  load=_load, say=lines.append, clock=clock)
    tally = ex.explore()
    covering = E.cover(random.Random(1))
    kinds = {E.signature(c) for c in covering}
    assert len(kinds) == len(covering) == 2 + len(E.FAKE_MODES) + 5
    first = [E.signature({"faults": [{"type": f.type, **({"node": f.node} if f.type == "stop" else {}),
                                      **({"mode": f.mode} if f.type == "fake_prefill_peer" else {})}
                                     for f in sc.faults]}) for sc in runs[:len(covering)]]
    assert set(first) == kinds, first  # every kind alone, before anything else
    stop_d = [f for f in tally.findings if f.same_as is None and "stop(decode:0)" in E.signature(f.schedule)]
    repeats = [f for f in tally.findings if f.same_as is not None]
    assert stop_d and stop_d[0].shrunk is not None  # the covering finding, shrunk once covering ended
    assert all(f.shrunk is None and f.shrink_runs == 0 and f.path for f in repeats)
    assert all(any(g.seed == f.same_as for g in tally.findings) for f in repeats)


def test_the_budget_bounds_the_exploration(tmp_path: Path) -> None:
    clock, runs = Clock(), []
    ex = Explorer(FAM, "hardened", seed=9, budget_s=100, out_dir=tmp_path, run_one=_stand_in(clock, runs),
                  load=_load, say=lambda s: None, clock=clock, shrink=False)
    ex.explore()
    assert 1 <= len(runs) <= 4 and clock.t <= 100 + 30  # the last run may end past it by its own length


@pytest.mark.parametrize("args, words", [
    (["--family", "nope"], "--family 'nope': no such family"),
    (["--family", "lookup"], "has no generator for pdchaos explore"),
    (["--family", "pd", "--budget", "5x"], "a duration such as 90s, 20m or 1h"),
    (["--family", "pd", "--target", "legacy"], "--target 'legacy'"),
])
def test_bad_input_is_one_clear_error(tmp_path: Path, args: list, words: str) -> None:
    r = subprocess.run([sys.executable, "-m", "harness.cli", "explore", *args, "--runs-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr
