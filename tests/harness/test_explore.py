"""pdchaos explore's core (harness/explore.py) with the pd family's real generator and the real
scenario schema, the runs judged by a stand-in (no nodes): what it draws validates, the budget
bounds it, a failing schedule is shrunk to the smallest one that still fails and written as a
scenario file that loads; the CLI's bad input is one clear error."""

from __future__ import annotations

import random
import re
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
            assert [t.fault for t in got.model.triggers if t.type == "ops_in_window"] == list(range(len(got.faults)))
            # a fault keyed on a protocol phase also proves it started there (harness/phases.py)
            assert [t.fault for t in got.model.triggers if t.type == "phase_keyed"] == \
                [j for j, f in enumerate(got.faults) if f.upon is not None]
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
    ex = Explorer(FAM, "hardened", seed=11, budget_s=3 * 3600, out_dir=tmp_path, run_one=_stand_in(clock, runs),
                  load=_load, say=lines.append, clock=clock)
    tally = ex.explore()
    covering = E.cover(random.Random(1))
    kinds = {E.signature(c) for c in covering}
    # two stops, two stops keyed on a phase, each fake-peer mode, 5 other kinds, P and D frozen at
    # once, a shared-prefix mix, the EOS prompt first, toxics, netns (the port faults among them), the store
    # master's two, two kills, D frozen inside P's held write
    assert len(kinds) == len(covering) == 2 + 2 + len(E.FAKE_MODES) + 5 + 2 + 1 + len(E.TOXICS) + len(E.NETNS) + 2 + 2 + 1
    assert sum("eos_first" in k for k in kinds) == 1

    def sig(sc) -> str:  # noqa: ANN001
        return E.signature({"faults": [{"type": f.type, **{k: getattr(f, k) for k in ("node", "mode", "direction",
                                                                                        "stream", "port")
                                                           if isinstance(getattr(f, k, None), str)},
                                        **({"upon": f.upon.model_dump()} if f.upon is not None else {})}
                                       for f in sc.faults],
                            "workload": {"shared_prefix_tokens": sc.model.workload.shared_prefix_tokens,
                                         "lead_prompts": sc.model.workload.lead_prompts}})

    first = [sig(sc) for sc in runs[:len(covering)]]
    assert {x.split("(")[0] for x in first} == {x.split("(")[0] for x in kinds}, first  # every kind alone first
    assert len(set(first)) == len(covering)
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


# ---------------------------------------------------------------- re-proving (N of N) and the written file's re-run

def _base(path: Path) -> Path:
    """The file a re-run's copy was made from (``NAME-r2.yaml`` -> ``NAME.yaml``)."""
    return path.with_name(re.sub(r"-r\d+$", "", path.stem) + path.suffix)


def _stand_in_runner(clock: Clock, calls: list, fails):  # noqa: ANN001
    """A stand-in runner (no nodes): ``fails(scenario, path, nth run of that schedule) -> bool``,
    ``path`` the file the explorer wrote first (a re-run's copy counts as its file's run); a
    failing run fails ``drained``; each run takes 30 s of the fake clock."""
    seen: dict[str, int] = {}

    def run_one(path: Path, target: str):
        sc = load_scenario(path)
        base = _base(path)
        seen[str(base)] = seen.get(str(base), 0) + 1
        calls.append(str(base))
        clock.t += 30.0
        bad = fails(sc, base, seen[str(base)])
        return SimpleNamespace(verdict="fail" if bad else "pass", failing=["drained"] if bad else [],
                               reason="drained" if bad else "")
    return run_one


def _stops_d(sc) -> bool:  # noqa: ANN001
    return any(f.type == "stop" and f.node == "decode:0" for f in sc.faults)


def test_a_candidate_failing_2_of_3_runs_is_flaky_at_2_of_3_and_no_finding(tmp_path: Path) -> None:
    clock, calls, lines = Clock(), [], []
    run_one = _stand_in_runner(clock, calls, lambda sc, path, nth: _stops_d(sc) and nth != 3)
    ex = Explorer(FAM, "hardened", seed=11, budget_s=1800, out_dir=tmp_path, run_one=run_one, load=_load,
                  say=lines.append, clock=clock, reprove=3)
    tally = ex.explore()
    flaky = [f for f in tally.findings if f.status == "flaky"]
    assert flaky, "\n".join(lines)
    assert not tally.reproven  # a flaky candidate is never a finding
    for f in flaky:
        assert (f.failed_runs, f.proving_runs) == (2, 3) and f.why_not == "failed 2 of 3 runs"
        assert f.shrink_runs == 0 and f.shrunk is None and f.rerun is None  # not shrunk, not re-run
        assert calls.count(f.drawn) == 3  # its own drawn file, three times (twice as a copy under its own name)
    row = next(r for r in ex.summary()["findings"] if r["status"] == "flaky")
    assert row["rate"] == "2/3" and row["why_not"] == "failed 2 of 3 runs"
    assert any("flaky (failed 2 of 3 runs)" in line for line in lines)


def test_a_re_proven_finding_is_re_run_from_its_written_file(tmp_path: Path) -> None:
    clock, calls, lines = Clock(), [], []
    run_one = _stand_in_runner(clock, calls, lambda sc, path, nth: _stops_d(sc) and sc.model.workload.concurrency >= 2)
    ex = Explorer(FAM, "hardened", seed=11, budget_s=3 * 3600, out_dir=tmp_path, run_one=run_one, load=_load,
                  say=lines.append, clock=clock, reprove=3, first=True)
    tally = ex.explore()
    assert len(tally.reproven) == 1, "\n".join(lines)  # first=True: it stops at the first one
    f = tally.reproven[0]
    assert (f.failed_runs, f.proving_runs) == (3, 3) and f.checks == ["drained"]
    written = Path(f.path)
    assert written.parent == tmp_path and written.is_file() and "drawn" not in written.parts
    assert calls[-1] == f.path and calls.count(f.path) == 1  # the last run: the written file itself, once
    copies = sorted(p.name for p in (tmp_path / "drawn").glob("*-r[23].yaml"))
    assert copies and all(load_scenario(tmp_path / "drawn" / c).model.name == c[:-5] for c in copies)
    assert f.rerun == {"path": f.path, "verdict": "fail", "failing": ["drained"], "reproduces": True}
    assert "failed 3 of 3 runs" in load_scenario(written).model.description
    assert f.proven_at_s is not None and f.found_at_s <= f.proven_at_s <= f.reported_at_s
    # every kept shrink step failed 3 of 3: each kept schedule's drawn file ran 3 times
    kept = [line for line in lines if line.endswith("(kept)")]
    assert all("failed 3 of 3" in line for line in kept)


def test_a_finding_whose_written_file_does_not_reproduce_is_flaky_not_a_finding(tmp_path: Path) -> None:
    clock, calls, lines = Clock(), [], []
    run_one = _stand_in_runner(clock, calls, lambda sc, path, nth: _stops_d(sc) and "drawn" in path.parts)
    ex = Explorer(FAM, "hardened", seed=11, budget_s=1500, out_dir=tmp_path, run_one=run_one, load=_load,
                  say=lines.append, clock=clock, reprove=3, first=True, shrink=False)
    tally = ex.explore()
    settled = [f for f in tally.findings if f.rerun is not None]
    assert settled and not tally.reproven, "\n".join(lines)
    f = settled[0]
    assert f.status == "flaky" and f.why_not == "its re-run from the written file: pass"
    assert f.rerun["verdict"] == "pass" and not f.rerun["reproduces"] and calls.count(f.path) == 1


def test_a_shrink_step_failing_1_of_3_is_not_kept(tmp_path: Path) -> None:
    """A step is kept only when it too fails 3 of 3: here every smaller schedule fails its first run
    only; the reproduction is the drawn schedule, re-proven."""
    clock, calls, lines = Clock(), [], []
    drawn: set[str] = set()

    def fails(sc, path, nth):  # noqa: ANN001
        if not drawn and _stops_d(sc) and sc.model.workload.concurrency >= 2:
            drawn.add(str(path))  # the first failing schedule: fails always, and so does its written file;
        written = "drawn" not in path.parts  # a shrink step fails its first run only
        return str(path) in drawn or written or (_stops_d(sc) and nth == 1 and "-k" in path.stem)

    ex = Explorer(FAM, "hardened", seed=11, budget_s=3 * 3600, out_dir=tmp_path,
                  run_one=_stand_in_runner(clock, calls, fails), load=_load, say=lines.append, clock=clock,
                  reprove=3, first=True)
    tally = ex.explore()
    f = tally.reproven[0]
    assert f.shrunk is None and f.shrink_runs >= 2, "\n".join(lines)
    assert not any(line.endswith("(kept)") for line in lines)
    assert any("-> failed 1 of 2" in line for line in lines)  # stopped at the step's first pass


def test_a_re_run_that_cannot_be_judged_is_run_again_not_counted(tmp_path: Path) -> None:
    """A harness error in a re-run is no evidence either way: run again (a copy under its own
    name), never counted as a pass; the finding is re-proven 3 of 3 judged runs."""
    clock, calls, lines, seen = Clock(), [], [], {}

    def run_one(path: Path, target: str):
        sc, base = load_scenario(path), _base(path)
        seen[base] = seen.get(base, 0) + 1
        calls.append(path)
        clock.t += 30.0
        if _stops_d(sc) and sc.model.workload.concurrency >= 2:
            if seen[base] == 2:  # its second run: a harness error
                return SimpleNamespace(verdict="error", failing=["triggers"], reason="no request crossed the window")
            return SimpleNamespace(verdict="fail", failing=["drained"], reason="drained")
        return SimpleNamespace(verdict="pass", failing=[], reason="")

    ex = Explorer(FAM, "hardened", seed=11, budget_s=3 * 3600, out_dir=tmp_path, run_one=run_one, load=_load,
                  say=lines.append, clock=clock, reprove=3, first=True, shrink=False)
    tally = ex.explore()
    f = tally.reproven[0]
    assert (f.failed_runs, f.proving_runs, f.not_judged) == (3, 3, 1), "\n".join(lines)
    assert [p.name for p in calls if _base(p) == Path(f.drawn)][1:] == [Path(f.drawn).stem + "-r2.yaml",
                                                                        Path(f.drawn).stem + "-r3.yaml",
                                                                        Path(f.drawn).stem + "-r4.yaml"]
    assert ex.summary()["findings"][0]["not_judged"] == 1


def test_a_finding_the_budget_cuts_short_is_not_re_proven(tmp_path: Path) -> None:
    clock, calls, lines = Clock(), [], []
    run_one = _stand_in_runner(clock, calls, lambda sc, path, nth: True)  # the very first schedule fails
    ex = Explorer(FAM, "hardened", seed=11, budget_s=50, out_dir=tmp_path, run_one=run_one, load=_load,
                  say=lines.append, clock=clock, reprove=3, first=True)
    tally = ex.explore()
    assert len(tally.findings) == 1 and not tally.reproven
    f = tally.findings[0]
    assert f.status == "not re-proven" and f.why_not.startswith("the budget ended after"), f.why_not
    assert ex.summary()["findings"][0]["status"] == "not re-proven" and ex.summary()["reproven"] == 0


# ---------------------------------------------------------------- --mutant and mutate --list

def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def _pd_mutants() -> list[str]:
    from harness.cli.mutate import mutant_tables

    return [m[0] for m in mutant_tables()["pd"].MUTANTS]


def test_mutate_list_names_the_mutants_one_a_line() -> None:
    r = _cli("mutate", "--list", "--family", "pd")
    assert r.returncode == 0 and r.stdout.splitlines() == _pd_mutants() and len(_pd_mutants()) == 10, r.stderr
    every = _cli("mutate", "--list")
    assert every.returncode == 0 and set(_pd_mutants()) <= set(every.stdout.splitlines())


@pytest.mark.parametrize("args, words", [
    (["mutate", "--list", "--family", "nope"], "--family 'nope': no system mutants"),
    (["mutate", "--list", "scenarios/pd/"], "--list prints the system mutants' names"),
    (["mutate"], "name the scenario files or folders (DIR), or --list"),
])
def test_mutate_list_bad_input_is_one_clear_error(args: list, words: str) -> None:
    r = _cli(*args)
    assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_explore_mutant_bad_name_lists_the_valid_names(tmp_path: Path) -> None:
    r = _cli("explore", "--family", "pd", "--mutant", "NoSuch", "--runs-dir", str(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "--mutant 'NoSuch': no such system mutant of family pd (valid: " + ", ".join(_pd_mutants()) + ")" \
        in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not any(tmp_path.iterdir())  # nothing started


@pytest.mark.parametrize("args, words", [
    (["--mutant", "LoudWait", "--target", "upstream"], "a system mutant of family pd runs as 'hardened'"),
    (["--reprove", "0"], "'0': between 1 and 10 runs"),
    (["--reprove", "x"], "'x': a whole number of runs"),
])
def test_explore_mutant_and_reprove_bad_input(tmp_path: Path, args: list, words: str) -> None:
    r = _cli("explore", "--family", "pd", *args, "--runs-dir", str(tmp_path))
    assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr


# ---------------------------------------------------------------- the power driver (harness/ci/explore_power.py)

def test_power_table_rows_come_from_explore_summaries(tmp_path: Path) -> None:
    """The table is generated from the explorer's own summaries: a kill's time, rate, re-run and
    kept reproduction; a survivor with its unsettled candidates; an exit that is no verdict."""
    from harness.ci.explore_power import render, row_of

    meta = {"family": "pd", "budget_s": 600.0, "seed": 1, "commit": "abc1234", "date": "2026-12-07",
            "machine": "2 cores x86_64"}
    killed = {"schedules": 4, "runs": 11, "elapsed_s": 412.0, "reprove": 3,
              "mutant": {"name": "M1", "killed": True, "time_to_kill_s": 181.2, "reported_at_s": 400.5,
                         "reproduction": "runs/x/explore-pd-hardened-5.yaml", "rate": "3/3"},
              "findings": [{"seed": 5, "status": "re-proven", "checks": ["no_stall"], "rate": "3/3",
                            "rerun": {"verdict": "fail"}, "kept": "concurrency 1, rate 0.5/s; stop(decode:0)@1s+3s",
                            "shrunk_faults": 1, "shrink_note": "", "why_not": ""}]}
    survived = {"schedules": 20, "runs": 22, "elapsed_s": 601.0, "reprove": 3,
                "mutant": {"name": "M2", "killed": False},
                "findings": [{"seed": 9, "status": "flaky", "why_not": "failed 1 of 3 runs"}]}
    rows = [row_of(killed, "M1", "g1", 1, meta), row_of(survived, "M2", "g2", 0, meta), row_of({}, "M3", "g3", 2, meta)]
    assert rows[0]["killed"] and rows[0]["time_to_kill_s"] == 181.2 and rows[0]["rerun"] == "fail"
    assert not rows[1]["killed"] and rows[1]["unsettled"] == ["seed 9: flaky (failed 1 of 3 runs)"]
    assert rows[2]["error"] == "pdchaos explore ended with exit 2 (not a verdict)"
    md = render(rows, "explore-power.json")
    assert md.startswith("<!-- generated by python3 -m harness.ci.explore_power") and "Killed: **1 of 3**" in md
    line = next(x for x in md.splitlines() if "| M1 |" in x)
    assert "| killed | 181 s | 400 s | 3 of 3 (no_stall) | fail |" in line and "explore-pd-hardened-5.yaml" in line
    assert "not killed (seed 9: flaky (failed 1 of 3 runs))" in md and "error: pdchaos explore ended with exit 2" in md


def test_power_driver_bad_mutant_is_one_clear_error(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "harness.ci.explore_power", "--family", "pd", "--mutant", "Nope",
                        "--json", str(tmp_path / "p.json"), "--out", str(tmp_path / "p.md")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--mutant 'Nope': no such system mutant of family pd (valid: " in r.stderr
    assert "Traceback" not in r.stderr and not any(tmp_path.iterdir())


def test_a_shrunk_reproduction_that_does_not_reproduce_from_its_file_falls_back_to_the_drawn_one(tmp_path: Path) -> None:
    """The shrunk schedule fails 3 of 3 as drawn files, but its written file passes: the drawn
    schedule (3 of 3 too) is written under its own name and re-run from that file instead."""
    clock, calls, lines = Clock(), [], []

    def fails(sc, path, nth):  # noqa: ANN001
        if not (_stops_d(sc) and sc.model.workload.concurrency >= 2):
            return False
        return "drawn" in path.parts or "and shrunk" not in sc.model.description

    ex = Explorer(FAM, "hardened", seed=11, budget_s=3 * 3600, out_dir=tmp_path,
                  run_one=_stand_in_runner(clock, calls, fails), load=_load, say=lines.append, clock=clock,
                  reprove=3, first=True)
    tally = ex.explore()
    f = tally.reproven[0]
    assert f.shrunk is None and "so the drawn schedule is kept" in f.shrink_note, "\n".join(lines)
    assert f.rerun["reproduces"] and f.path.endswith("-w2.yaml") and calls[-1] == f.path
    assert any("back to the drawn schedule" in line for line in lines)
    assert "and shrunk" not in load_scenario(Path(f.path)).model.description


def test_a_repeat_of_a_flaky_finding_is_settled_again(tmp_path: Path) -> None:
    """Only a re-proven (or still pending) earlier finding makes a later one "the same": after a
    flaky one, the next with the same kinds and checks is re-proven on its own."""
    clock, calls, lines = Clock(), [], []
    first_seen: list[str] = []

    def fails(sc, path, nth):  # noqa: ANN001
        if not _stops_d(sc):
            return False
        # the flaky one: the first that also aborts after prefill (a kind pair the wider generator
        # draws again in this budget; a lone stop of D is rarer now, most get a second fault)
        if not first_seen and any(f.type == "abort_after_prefill" for f in sc.faults):
            first_seen.append(str(path))
        return nth != 3 if first_seen and str(path) == first_seen[0] else True  # flaky once, others always

    from families.pd import explore as E

    ex = Explorer(FAM, "hardened", seed=11, budget_s=5 * 3600, out_dir=tmp_path,
                  run_one=_stand_in_runner(clock, calls, fails), load=_load, say=lines.append, clock=clock,
                  reprove=3, shrink=False)
    tally = ex.explore()
    flaky = next(f for f in tally.findings if str(Path(f.drawn)) == first_seen[0])
    assert flaky.status == "flaky", "\n".join(lines)
    later = tally.findings[tally.findings.index(flaky) + 1:]
    alike = [f for f in later if E.signature(f.schedule) == E.signature(flaky.schedule)
             and f.failing == flaky.failing]
    assert alike and alike[0].same_as is None and alike[0].status == "re-proven", [(f.seed, f.status) for f in alike]
    assert all(f.same_as == alike[0].seed and f.status == "same" for f in alike[1:])


def test_the_covering_round_stops_to_keep_the_budget_for_re_proving_its_findings(tmp_path: Path) -> None:
    """A target that fails every covering schedule (upstream fails many kinds): the round stops when
    the budget left is what re-proving its findings needs, and those findings are re-proven; before,
    a 20-minute upstream control covered 32 schedules and re-proved none of its 13 findings."""
    clock, calls, lines = Clock(), [], []
    run_one = _stand_in_runner(clock, calls, lambda sc, path, nth: True)  # everything fails
    ex = Explorer(FAM, "upstream", seed=11, budget_s=1200, out_dir=tmp_path, run_one=run_one, load=_load,
                  say=lines.append, clock=clock, reprove=3)
    tally = ex.explore()
    assert ex.covering_cut and ex.summary()["covering_cut"] is True
    assert any("the covering round stops after" in ln for ln in lines), lines
    settled = [f for f in tally.findings if f.same_as is None]
    # every one re-proven but perhaps the last (the last run's time is the soft bound); shrinking
    # left room for the ones still waiting (a real 20-minute control re-proved 4 of 7 before)
    assert tally.reproven and len(tally.reproven) >= len(settled) - 1, [(f.seed, f.status, f.why_not) for f in settled]
    hclock = Clock()
    hardened = Explorer(FAM, "hardened", seed=11, budget_s=1200, out_dir=tmp_path / "h",
                        run_one=_stand_in_runner(hclock, [], lambda sc, path, nth: False), load=_load,
                        say=lambda s: None, clock=hclock, reprove=3)
    hardened.explore()
    assert not hardened.covering_cut  # nothing found: the whole round runs


def test_a_shrink_step_whose_run_cannot_be_judged_is_dropped_at_once(tmp_path: Path) -> None:
    """A halved window in which the fault no longer acts is an error (fault_effect), not evidence:
    the step is dropped after its first run instead of being run N times."""
    clock, calls, lines = Clock(), [], []

    def run_one(path: Path, target: str):
        sc = load_scenario(path)
        calls.append(path)
        clock.t += 30.0
        if _stops_d(sc) and sc.model.workload.concurrency >= 2:
            if "-k" in path.stem:  # every shrink step: its fault no longer acts
                return SimpleNamespace(verdict="error", failing=["fault_effect"], reason="no effect")
            return SimpleNamespace(verdict="fail", failing=["drained"], reason="drained")
        return SimpleNamespace(verdict="pass", failing=[], reason="")

    ex = Explorer(FAM, "hardened", seed=11, budget_s=3 * 3600, out_dir=tmp_path, run_one=run_one, load=_load,
                  say=lines.append, clock=clock, reprove=3, first=True)
    tally = ex.explore()
    f = tally.reproven[0]
    steps = [line for line in lines if f"shrink seed {f.seed}:" in line and "-> failed" in line]
    not_judged = [line for line in steps if line.endswith("-> failed 0 of 0")]
    assert len(not_judged) >= 2, "\n".join(lines)  # the halved window, the later start
    assert all(line.endswith(("-> failed 0 of 0", "-> failed 0 of 1")) for line in steps), "\n".join(lines)
    assert f.shrunk is None and f.shrink_runs == len(steps), "\n".join(lines)  # one run a step


def test_re_proving_is_budgeted_by_each_finding_s_own_run_time(tmp_path: Path) -> None:
    """Upstream's findings differ in cost: a stall's run takes about 60 s, a fail's 20 s, and a run
    after a failing one pays the nodes' restart. The covering round keeps what re-proving its
    findings needs at their own runs' times, so each finding it settles is re-proven; counted in
    runs of the last one's time, a real 20-minute control left 2 of its 7 (both stalls) cut."""
    clock, lines, last = Clock(), [], {"failed": False}

    def run_one(path: Path, target: str):
        sc = load_scenario(path)
        stall = any(f.type == "fake_prefill_peer" for f in sc.faults)
        clock.t += (60.0 if stall else 20.0) + (10.0 if last["failed"] else 0.0)
        last["failed"] = True  # everything fails, as upstream fails many kinds
        return SimpleNamespace(verdict="stall" if stall else "fail",
                               failing=["no_stall"] if stall else ["drained"], reason="")

    ex = Explorer(FAM, "upstream", seed=12, budget_s=1200, out_dir=tmp_path, run_one=run_one, load=_load,
                  say=lines.append, clock=clock, reprove=3)
    tally = ex.explore()
    assert ex.covering_cut, "\n".join(lines)
    stop = next(ln for ln in lines if "the covering round stops after" in ln)
    covered = int(re.search(r"stops after (\d+) schedules", stop).group(1))
    settled = [f for f in tally.findings[:covered] if f.same_as is None]  # found while covering
    assert len(settled) >= 3 and any(f.run_s >= 60 for f in settled), "\n".join(lines)
    assert all(f.status == "re-proven" for f in settled), "\n".join(lines)
    assert ex.elapsed() <= 1200 + 70  # one run past the budget at most (a drawn schedule after them
    # may still be cut: the budget is the user's)
