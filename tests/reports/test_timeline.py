"""The incident timeline (reports/timeline.py): a pure function of a journal, in every report.

Synthetic journals with known numbers (tests/synthetic_runs.py and hand-made records), the real
journals kept in tests/golden/journals/ (the P/D one's timeline is a golden file:
PDCHAOS_UPDATE_GOLDEN=1 rewrites it), and the cases that must be said, not hidden: no fault, no
failure, a fault that never healed, a failure before any fault.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from nodekit import journal as J
from reports import data as D
from reports.build import generate
from reports.timeline import incident_of_journal, incident_timeline, markdown
from synthetic_runs import T0, make_run, scenario_journal

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
PD_JOURNAL = GOLDEN / "journals" / "pd-abort-while-decode-waits-hardened.jsonl"
PD_TIMELINE = GOLDEN / "timeline-pd-abort-while-decode-waits-hardened.md"


def stages(inc) -> list[str]:
    return [e.stage for e in inc.entries]


def by_stage(inc, stage: str) -> list:
    return [e for e in inc.entries if e.stage == stage]


# ------------------------------------------------------------------ a synthetic journal

def test_synthetic_slow_peer_timeline_has_the_journal_numbers() -> None:
    recs = scenario_journal("slow-peer", "hardened")
    inc = incident_timeline(recs)
    ops = J.ops(recs)
    fails = [o for o in ops if o["phase"] == "fail"]
    oks = [o for o in ops if o["phase"] == "ok"]
    assert fails and oks
    # the fault: start and stop records, relative to t0
    (f,) = inc.faults
    assert (f.name, f.start - T0, f.healed - T0, f.healed_by) == ("slow_peer", 2.0, 4.0, "schedule")
    # the first failure the client saw: the earliest completion of a failed op, after the fault
    first = min(o["t_complete"] for o in fails) - T0
    assert inc.first_failure.t == pytest.approx(first)
    assert 2.0 <= first < 2.5 and not inc.failure_before_fault
    assert "timeout (TIMEOUT)" in inc.first_failure.text
    # terminal states grouped by outcome: counts, first and last time
    groups = {(g.cls, g.outcome, g.code): g for g in inc.groups}
    g_fail = groups[("fail-open", "timeout", "TIMEOUT")]
    g_ok = groups[("ok", "ok", "")]
    assert (g_fail.count, g_ok.count) == (len(fails), len(oks))
    assert g_fail.first == pytest.approx(first)
    assert g_fail.last == pytest.approx(max(o["t_complete"] for o in fails) - T0)
    assert sum(g.count for g in inc.groups) == len(ops) == inc.n_ops
    # recovered: the first ok op sent at or after the heal
    after = min((o for o in oks if o["t_invoke"] >= T0 + 4.0), key=lambda o: o["t_invoke"])
    (rec,) = inc.recovered
    assert rec.t == pytest.approx(after["t_complete"] - T0)
    assert "recovered after slow_peer" in rec.text
    # the order a reader follows: injected, first failure, healed, recovered
    order = [stages(inc).index(s) for s in ("fault", "failure", "healed", "recovered")]
    assert order == sorted(order)
    assert inc.headline().startswith("slow_peer injected at 2.00 s, healed at 4.00 s; first failure at ")


def test_the_family_word_for_a_failed_op_comes_from_the_meta_line() -> None:
    recs = scenario_journal("slow-peer", "hardened")
    recs[0] = {**recs[0], "failed_words": ["failed open", "failed open (returned 0)"]}
    inc = incident_timeline(recs)
    assert "failed open: timeout" in inc.first_failure.text
    assert any(g.words == "failed open" for g in inc.groups)


def test_a_stalled_target_is_not_recovered_and_says_so() -> None:
    inc = incident_timeline(scenario_journal("silent-server", "legacy"))
    assert inc.first_failure is not None and "stalled" in inc.first_failure.text
    # healed on schedule, and no request after it succeeded (the one in flight never returned)
    (f,) = inc.faults
    assert f.healed_by == "schedule" and f.healed - T0 == 5.0
    assert [e.t for e in inc.recovered] == [None] and "NOT RECOVERED" in inc.recovered[0].text
    assert "not recovered" in inc.headline()


def test_a_heal_left_to_teardown_is_said() -> None:
    recs = [{**r, "healed_by": "teardown"} if r.get("type") == "fault" and r.get("phase") == "stop" else r
            for r in scenario_journal("silent-server", "legacy")]
    inc = incident_timeline(recs)
    assert [e.text for e in by_stage(inc, "healed")] == [
        "fault silent_server (#0) healed (by teardown, not by its schedule)"]


# ------------------------------------------------------------------ the cases that must be said

def test_no_fault_and_no_failure() -> None:
    recs = scenario_journal("normal", "hardened")
    inc = incident_timeline(recs)
    assert inc.faults == [] and inc.first_failure is None and inc.recovered == []
    assert [g.cls for g in inc.groups] == ["ok"] and inc.groups[0].count == len(J.ops(recs))
    assert inc.headline() == f"no fault injected; no failure ({len(J.ops(recs))} requests, all ok)"


def _hand_made(fault_stop: bool, fail_at: float | None) -> list[dict]:
    """t0 100; ops every 0.5 s from 0 to 4 s, each ok in 10 ms; a fault from 1.0 s (stopped at
    2.0 s or never); one op that fails at ``fail_at`` (its invoke time)."""
    recs = [{"type": "meta", "scenario": "hand", "target": "t", "t0": 100.0, "deadline_ms": 100, "tolerance_ms": 0,
             "faults": [], "failed_words": ["failed fast", "failed fast (an error)"]}]
    for i in range(9):
        x = 100.0 + i * 0.5
        bad = fail_at is not None and abs(i * 0.5 - fail_at) < 1e-9
        recs.append({"type": "op", "id": i, "process": 0, "f": "complete", "phase": "invoke", "t": x,
                     "expected": "the prompt's reference output", "prompt_index": i})
        recs.append({"type": "op", "id": i, "process": 0, "f": "complete", "t": x + 0.01,
                     "phase": "fail" if bad else "ok", "outcome": "http_503" if bad else "ok",
                     "code": "unavailable" if bad else "", "elapsed_ms": 10.0,
                     "value": None if bad else "the prompt's reference output"})
    recs.append({"type": "fault", "id": 0, "name": "node_down", "phase": "start", "t": 101.0, "params": {}})
    if fault_stop:
        recs.append({"type": "fault", "id": 0, "name": "node_down", "phase": "stop", "t": 102.0,
                     "healed_by": "schedule"})
    recs.append({"type": "end", "t": 105.0, "reason": "done", "stalled": 0})
    recs.sort(key=lambda r: (r["type"] != "meta", r.get("t", 0.0)))
    return recs


def test_a_fault_that_never_healed_is_said() -> None:
    inc = incident_timeline(_hand_made(fault_stop=False, fail_at=1.5))
    (f,) = inc.faults
    assert f.healed is None and f.healed_by is None
    healed = by_stage(inc, "healed")
    assert len(healed) == 1 and healed[0].t is None and "NEVER HEALED" in healed[0].text
    assert inc.recovered == []  # nothing healed: no recovery to look for
    assert "node_down injected at 1.00 s, never healed" in inc.headline()
    assert inc.first_failure.t == pytest.approx(1.51) and not inc.failure_before_fault


def test_a_failure_before_any_fault_is_said_not_hidden() -> None:
    inc = incident_timeline(_hand_made(fault_stop=True, fail_at=0.5))
    assert inc.failure_before_fault
    assert inc.first_failure.t == pytest.approx(0.51)
    assert "BEFORE ANY FAULT (the first was injected at 1.00 s)" in inc.first_failure.text
    assert "a failure came BEFORE ANY FAULT" in inc.headline()
    assert "failed fast: http_503 (unavailable)" in inc.first_failure.text
    # the failure still sorts first: the timeline is in time order, whatever it shows
    assert stages(inc)[:2] == ["outcome", "failure"] or stages(inc).index("failure") < stages(inc).index("fault")
    assert [e.t for e in inc.recovered] == [pytest.approx(2.01)]


def test_failures_with_no_fault_at_all_are_said() -> None:
    recs = [r for r in _hand_made(fault_stop=True, fail_at=2.5) if r["type"] != "fault"]
    inc = incident_timeline(recs)
    assert inc.faults == [] and inc.failure_before_fault
    assert "BEFORE ANY FAULT (no fault was injected)" in inc.first_failure.text
    assert "failures with NO FAULT injected" in inc.headline()


# ------------------------------------------------------------------ the nodes' records, joined

def test_node_events_gauges_counters_and_the_effect_are_joined() -> None:
    recs = _hand_made(fault_stop=True, fail_at=1.5)
    recs[0]["gauges"] = [["num_waiting", "waiting requests"]]

    def sample(node, t, waiting, errors, pid=7, when="sample"):
        return {"type": "probe", "node": node, "kind": "server", "when": when, "t": t, "pid": pid, "threads": 3,
                "fds": 9, "counters": {"num_waiting": waiting, "requests": int(t), "errors": {"refused": errors},
                                       "cpu_s": t / 10}}
    recs += [sample("decode:0", 99.0, 0, 0, when="baseline"), sample("decode:0", 100.8, 0, 0),
             sample("decode:0", 101.4, 2, 0), sample("decode:0", 101.6, 1, 1), sample("decode:0", 102.5, 0, 1),
             {"type": "event", "what": "fault_started", "t": 101.05, "fault": "node_down", "id": 0, "s": 0.05},
             {"type": "event", "what": "fault_effect", "t": 102.0, "fault": "node_down", "id": 0,
              "effect": {"errors.refused": 1}, "required": {"errors.refused": 1}},
             {"type": "event", "what": "process_kill", "t": 101.02, "role": "decode:0", "kind": "server", "pid": 4242,
              "signal": "SIGKILL"}]
    recs.sort(key=lambda r: (r["type"] != "meta", r.get("t", 0.0)))
    inc = incident_timeline(recs)
    (f,) = inc.faults
    assert f.injected - 100.0 == pytest.approx(1.05)
    assert f.effect_seen - 100.0 == pytest.approx(1.6) and f.effect_where == "decode:0 (errors.refused)"
    texts = {e.stage: e for e in inc.entries}
    assert "injected, in effect 1.05 s" in by_stage(inc, "fault")[0].text
    assert texts["effect"].source == "decode:0" and texts["effect"].t == pytest.approx(1.6)
    (gauge,) = by_stage(inc, "gauge")
    assert (gauge.source, gauge.t) == ("decode:0", pytest.approx(1.4))
    assert gauge.text == "waiting requests: peak 2 (from 0); back to 0 at 2.50 s"
    (counters,) = by_stage(inc, "counters")
    # the failure-named counter first; the process resources (cpu_s, fds) and the gauge are not counters here
    assert counters.text.startswith("counters moved: errors.refused +1 (from 1.60 s); requests +2 (from 1.40 s)")
    assert "cpu_s" not in counters.text and "num_waiting" not in counters.text
    (kill,) = [e for e in by_stage(inc, "node") if "process_kill" in e.text]
    assert kill.source == "decode:0" and "signal SIGKILL" in kill.text and "4242" not in kill.text


def test_nothing_secret_reaches_the_timeline() -> None:
    """No request ids, prompts, outputs, token digests, keys, hashes or paths: counts, codes,
    phases and times only."""
    recs = _hand_made(fault_stop=True, fail_at=1.5)
    hexkey = "9f86d081884c7d659a2feaa0c55ad015"
    for r in recs:
        if r["type"] == "op":
            r.update(value_ids="840e9d480ee7832dc91c8ddd", hashes=[hexkey], id=r["id"] + 7000)
    recs.append({"type": "event", "what": "side_channel_garbage", "t": 101.2, "role": "prefill:0",
                 "frame": hexkey, "log": "/runs/x/logs/01.log", "key": "k" * 40, "mode": "garbage"})
    inc = incident_timeline(recs)
    text = "\n".join(markdown(inc))
    for bad in ("reference output", "840e9d48", hexkey, "7000", "7001", "/runs/", "k" * 24, "prompt_index"):
        assert bad not in text
    assert "side_channel_garbage (mode garbage)" in text


# ------------------------------------------------------------------ every report has it

def test_every_scenario_run_has_its_timeline_in_summary_md_and_report_html(tmp_path: Path) -> None:
    root = make_run(tmp_path / "run", bench=False)
    generate(root, jobs=1)
    md = (root / "summary.md").read_text()
    html = (root / "report.html").read_text()
    assert "#### Incident timelines" in md
    for s in ("slow-peer", "silent-server", "bad-reply", "normal"):
        for t in ("hardened", "legacy"):
            inc = incident_of_journal(root / s / t / "journal.jsonl")
            assert f"<summary>{s} / {t}: {inc.headline()}</summary>" in md
            assert f"incident timeline of {t}" in html
    assert html.count("incident timeline of ") == 8
    assert "no fault injected; no failure" in md
    assert "BEFORE ANY FAULT" not in md  # no synthetic run fails before its fault
    # regenerating gives the same text (a pure function of the journals)
    generate(root, jobs=1)
    assert (root / "summary.md").read_text() == md


def test_the_timeline_of_a_real_journal_is_its_golden() -> None:
    """The P/D abort scenario's real journal (tests/golden/journals/): three 502s while the fault
    aborts D's waits, the proxy's counters, recovery after the heal."""
    inc = incident_of_journal(PD_JOURNAL)
    text = "\n".join(markdown(inc)) + "\n"
    if os.environ.get("PDCHAOS_UPDATE_GOLDEN") == "1":
        PD_TIMELINE.write_text(text)
    assert text == PD_TIMELINE.read_text()
    assert inc.first_failure.t == pytest.approx(2.0931, abs=1e-3)
    assert [(g.cls, g.outcome, g.code, g.phase, g.count) for g in inc.groups] == [
        ("ok", "ok", "", "", 7), ("fail-open", "http_502", "aborted", "decode", 3)]
    assert re.search(r"proxy \| counters moved: aborted \+3", text)


def test_the_plots_timeline_and_the_incident_agree_on_t0() -> None:
    recs = J.read_journal(PD_JOURNAL)
    inc = incident_timeline(recs)
    tl = D.timeline(recs, "s", "t")
    assert inc.end == pytest.approx(tl.end)


def test_a_run_the_runner_gave_up_says_so() -> None:
    """A run abandoned before its workload (a topology that could not start): its meta line says
    why, and the timeline says it rather than an empty history that reads as a clean run."""
    inc = incident_timeline([{"type": "meta", "scenario": "s", "t0": None, "error": "topology: OSError: no free port"},
                             {"type": "end", "t": 5.0, "reason": "error", "stalled": 0}])
    assert inc.headline() == ("the run did not happen (error: topology: OSError: no free port); no fault injected; "
                              "no request in the history")
    assert inc.entries == []
