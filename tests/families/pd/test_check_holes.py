"""Broken histories made from real saved P/D journals (tests/golden/holes/, README there) that read
as judged before these checks were closed: a final probe taken before the last heal, a restart
nothing in the history shows, a partition only its own report shows. Each real journal is first
judged as its run was (the checks hold); each mutant changes what a broken system or a broken run
would change and must make the check fail as undecided (or fault_effect fail): an error verdict,
never one an expectation can name."""

from __future__ import annotations

import copy
import gzip
import json
from functools import lru_cache
from pathlib import Path

import pytest

from harness import checks as C
from harness import verdicts as V
from harness.family import get_family
from harness.triggers import registry_for

pytestmark = pytest.mark.timeout(60)

HOLES = Path(__file__).resolve().parents[2] / "golden" / "holes"
KILL = "pd-kill-prefill-before-pull-hardened"  # local, kill of P healed 26 s after the client's end
PARTITION = "pd-partition-prefill-decode-upstream"  # local, iptables partition; the held request 504s after it
ATTACH_RESTART = "pd-attach-kill-prefill-upstream"  # attach mode: Chaos Mesh container-kill of P
ATTACH_PARTITION = "pd-attach-partition-prefill-decode-upstream"  # attach mode: Chaos Mesh partition


@lru_cache(maxsize=None)
def _load(name: str) -> tuple:
    with gzip.open(HOLES / f"{name}.jsonl.gz", "rt") as f:
        return tuple(json.loads(line) for line in f if line.strip())


def records(name: str) -> list[dict]:
    return copy.deepcopy(list(_load(name)))


def judge(recs: list[dict], name: str) -> C.CheckResult:
    family = get_family("pd")
    inp = C.CheckInput(sorted(recs, key=lambda r: (r.get("type") != "meta", r.get("t", 0.0))),
                       triggers=registry_for(family))
    meta = inp.meta
    return C.run_checks(inp, {name: (meta.get("checks") or {}).get(name, {})}, {name: C.checks_for(family)[name]})[0]


def undecided(r: C.CheckResult) -> bool:
    return r.ok is False and r.message.startswith(V.UNDECIDED) and V.of_results([r])[0] == "error"


def meta(recs: list[dict]) -> dict:
    return next(r for r in recs if r.get("type") == "meta")


def window(recs: list[dict], fid: int) -> tuple[float, float]:
    ts = {r["phase"]: r["t"] for r in recs if r.get("type") == "fault" and r.get("id") == fid}
    return ts["start"], ts["stop"]


def last_stop(recs: list[dict]) -> float:
    return max(r["t"] for r in recs if r.get("type") == "fault" and r.get("phase") == "stop")


def ops(recs: list[dict]) -> dict:
    out: dict = {}
    for r in recs:
        if r.get("type") == "op":
            out.setdefault(r["id"], {})["invoke" if r["phase"] == "invoke" else "done"] = r
    return out


# --------------------------------------------------------------------------- 1: the final probe and the last heal


def test_the_real_kill_run_reads_as_it_did_though_its_client_ended_before_the_heal() -> None:
    recs = records(KILL)
    client = next(r for r in recs if r.get("type") == "probe" and r.get("node") == "client" and r.get("when") == "final")
    assert client["t"] < last_stop(recs) - 20  # the workload ended ~26 s before P's restart healed the kill
    for name in ("no_leaks", "node_alive", "drained"):
        r = judge(recs, name)
        assert r.ok is True, (name, r.message)


@pytest.mark.parametrize("check", ["no_leaks", "node_alive", "drained"])
def test_a_node_final_probe_before_the_last_heal_cannot_judge(check: str) -> None:
    """The harness's final probes moved to before the kill healed (P's restart): they show nodes under
    the fault, not after it. Before the fix each check compared them and held."""
    recs = records(KILL)
    heal = last_stop(recs)
    for r in recs:
        if r.get("type") == "probe" and r.get("when") == "final" and r.get("node") != "client":
            r["t"] = heal - 5.0
    r = judge(recs, check)
    assert undecided(r) and "before the last fault healed" in r.message, r.message


def test_a_client_final_probe_before_its_own_last_op_cannot_judge() -> None:
    recs = records(KILL)
    last_op = max(r["t"] for r in recs if r.get("type") == "op")
    next(r for r in recs if r.get("type") == "probe" and r.get("node") == "client" and r.get("when") == "final")["t"] = \
        last_op - 3.0
    r = judge(recs, "no_leaks")
    assert undecided(r) and "not the client's end" in r.message, r.message


def test_no_op_after_the_last_heal_and_none_in_flight_cannot_judge_recovery() -> None:
    """A workload that had ended before the heal (its ops after it dropped): recovery once failed
    plainly, which an expectation naming recovery (many upstream claims do) read as expected."""
    recs = records(ATTACH_RESTART)
    assert judge(recs, "recovery").ok is True
    heal = last_stop(recs)
    late = {i for i, o in ops(recs).items() if o["invoke"]["t"] >= heal}
    assert late
    cut = [r for r in recs if not (r.get("type") == "op" and r.get("id") in late)]
    r = judge(cut, "recovery")
    assert undecided(r) and "ended before the last heal" in r.message, r.message
    # a worker held in a call across the heal (its op ended after it) is the failure recovery names
    last = max(ops(cut).values(), key=lambda o: o["invoke"]["t"])
    last["done"]["t"] = heal + 1.0
    r = judge(cut, "recovery")
    assert r.ok is False and not r.message.startswith(V.UNDECIDED), r.message


# --------------------------------------------------------------------------- 2: a restart the history must show


def test_the_real_restarts_show_their_effect() -> None:
    for name in (KILL, ATTACH_RESTART):
        r = judge(records(name), "fault_effect")
        assert r.ok is True, (name, r.message)


def test_an_attach_restart_whose_process_never_started_again_did_nothing() -> None:
    """Chaos Mesh said injected and recovered, the fault counted acted/seen, but every probe of P after
    the container-kill reads the start time it had before: nothing shows it started again."""
    recs = records(ATTACH_RESTART)
    start, _ = window(recs, 0)
    before = [r for r in recs if r.get("type") == "probe" and r.get("node") == "prefill:0" and r["t"] <= start][-1]
    for r in recs:
        if r.get("type") == "probe" and r.get("node") == "prefill:0":
            r["counters"]["started"] = before["counters"]["started"]
    r = judge(recs, "fault_effect")
    assert r.ok is False and "prefill:0 started again" in r.message, r.message
    assert V.of_results([r])[0] == "error"


def test_the_kubelets_restart_count_is_evidence_too() -> None:
    recs = records(ATTACH_RESTART)
    for r in recs:
        if r.get("type") == "probe" and r.get("node") == "prefill:0":
            r["counters"]["started"] = -1  # the pod's /proc could not be read: no start time either way
        if r.get("type") == "event" and r.get("what") == "chaos_restarted":
            r.update(name="restart-0", restarts_before=0, restarts_after=0)
    assert judge(recs, "fault_effect").ok is False
    next(r for r in recs if r.get("what") == "chaos_restarted")["restarts_after"] = 1
    assert judge(recs, "fault_effect").ok is True


def test_a_local_kill_without_the_new_process_did_nothing() -> None:
    recs = records(KILL)
    start, stop = window(recs, 1)
    recs = [r for r in recs if not (r.get("what") == "process_start" and start <= r["t"] <= stop)]
    # the restarted P's own probes (its final one) are of a process nothing started: gone too
    new_pids = {r.get("pid") for r in records(KILL) if r.get("what") == "process_start" and start <= r["t"] <= stop}
    recs = [r for r in recs if not (r.get("type") == "probe" and r.get("pid") in new_pids)]
    r = judge(recs, "fault_effect")
    assert r.ok is False and "prefill:0 started again" in r.message, r.message


# --------------------------------------------------------------------------- 3: a partition the traffic must show


def test_the_real_partitions_show_their_effect() -> None:
    for name in (PARTITION, ATTACH_PARTITION):
        r = judge(records(name), "fault_effect")
        assert r.ok is True, (name, r.message)


def test_a_chaos_probe_that_got_through_contradicts_the_effect() -> None:
    recs = records(ATTACH_PARTITION)
    next(r for r in recs if r.get("what") == "chaos_probe")["cut"] = 0
    r = judge(recs, "fault_effect")
    assert r.ok is False and "cut" in r.message, r.message


def test_a_chaos_window_without_its_chaos_events_did_nothing() -> None:
    recs = [r for r in records(ATTACH_PARTITION) if not str(r.get("what", "")).startswith("chaos_")]
    r = judge(recs, "fault_effect")
    assert r.ok is False and "chaos_injected" in r.message, r.message


def _unheld(recs: list[dict], fid: int) -> list[dict]:
    """Every op that failed or was in flight at the heal answered 200 at once (0.1 s): the traffic
    never met the cut."""
    _, stop = window(recs, fid)
    for o in ops(recs).values():
        done = o.get("done")
        if done is None:
            continue
        if done["phase"] != "ok" or (o["invoke"]["t"] < stop <= done["t"]):
            ok = next(x["done"] for x in ops(recs).values() if x.get("done") and x["done"]["phase"] == "ok")
            done.update({k: ok[k] for k in ("phase", "outcome", "status") if k in ok})
            done.pop("error_phase", None)
            done.pop("code", None)
            done["t"] = o["invoke"]["t"] + 0.1
            done["elapsed_ms"] = 100.0
    return recs


def test_a_chaos_partition_that_cut_nothing_did_nothing() -> None:
    """Its probe across the link got through (cut 0, the effect says so: no contradiction) and no
    request failed or waited in it: nothing but the object's conditions says it acted."""
    recs = _unheld(records(ATTACH_PARTITION), 0)
    for r in recs:
        if r.get("what") == "chaos_probe":
            r["cut"] = 0
        if r.get("what") == "fault_effect":
            r["effect"]["cut"] = 0
    r = judge(recs, "fault_effect")
    assert r.ok is False and "nothing on the traffic side shows the cut" in r.message, r.message


def test_a_local_partition_only_its_counter_shows_did_nothing() -> None:
    """iptables counted 6 packets, yet no request failed or waited across the cut."""
    recs = records(PARTITION)
    fid = next(f["id"] for f in meta(recs)["faults"] if f["type"] == "partition")
    r = judge(_unheld(recs, fid), "fault_effect")
    assert r.ok is False and "nothing on the traffic side shows the cut" in r.message, r.message


# --------------------------------------------------------------------------- 3b: a window is the fault its id schedules


def _renamed(recs: list[dict], fid: int, name: str) -> list[dict]:
    for r in recs:
        if r.get("type") == "fault" and r.get("id") == fid:
            r["name"] = name
    return recs


def test_a_kill_recorded_under_another_fault_name_is_not_judged_by_that_faults_bar() -> None:
    """The kill's window renamed to a proxy fault's (which needs no restart evidence) and P's new
    process dropped: the saved pd-kill-prefill-before-pull [hardened] of a real run then read "pass,
    as expected", the evidence a kill needs chosen by the name the record carries, not by the fault
    the scenario schedules under that id."""
    recs = records(KILL)
    fid = next(f["id"] for f in meta(recs)["faults"] if f["type"] == "kill")
    start, stop = window(recs, fid)
    recs = [r for r in recs if not (r.get("what") == "process_start" and start <= r["t"] <= stop)]
    r = judge(_renamed(recs, fid, "fake_prefill_peer"), "fault_effect")
    assert r.ok is False and "the scenario's fault" in r.message and "'kill'" in r.message, r.message
    assert V.of_results([r])[0] == "error"


def test_a_partition_recorded_as_a_delay_or_an_unscheduled_window_is_an_error() -> None:
    recs = records(PARTITION)
    fid = next(f["id"] for f in meta(recs)["faults"] if f["type"] == "partition")
    r = judge(_renamed(recs, fid, "delay"), "fault_effect")
    assert r.ok is False and "'partition'" in r.message and V.of_results([r])[0] == "error", r.message
    recs = records(PARTITION)
    for r in [r for r in recs if r.get("type") == "fault" and r.get("id") == fid]:
        recs.append({**r, "id": 77})
    r = judge(recs, "fault_effect")
    assert r.ok is False and any("window 77) is no fault the scenario schedules" in x for x in r.details["problems"]), \
        r.details


# --------------------------------------------------------------------------- harness_integrity: a history that lost part of itself

KILL_UP = "pd-kill-prefill-before-pull-upstream"  # local; its one request in the kill stalled (client gave up at 20 s)


def test_the_real_runs_are_whole_histories() -> None:
    for name in (KILL, KILL_UP, PARTITION, ATTACH_RESTART, ATTACH_PARTITION):
        r = judge(records(name), "harness_integrity")
        assert r.ok is True, (name, r.message)


def test_a_stalled_request_deleted_with_its_count_still_in_the_end_record() -> None:
    """The request that stalled in the kill dropped, the client's tally made to match: no_stall and
    bounded_return then held; the runner's count of stalled ops in the end record still says 1."""
    recs = records(KILL_UP)
    sid = next(r["id"] for r in recs if r.get("type") == "op" and r.get("outcome") == "stalled")
    recs = [r for r in recs if not (r.get("type") == "op" and r.get("id") == sid)]
    c = next(r for r in recs if r.get("node") == "client" and r.get("when") == "final")["counters"]
    c["ops"] -= 1
    del c["ops_stalled"]
    assert judge(recs, "no_stall").ok is True and judge(recs, "bounded_return").ok is True  # the hole
    r = judge(recs, "harness_integrity")
    assert r.ok is False and "stalled ops" in r.message, r.message


def test_a_slow_request_whose_invoke_record_went_reads_as_quick() -> None:
    """The 504 after 19 s without its invoke record and with a short elapsed_ms: bounded_return read it
    as quick (nothing else in the history times it)."""
    recs = records(PARTITION)
    slow = next(r for r in recs if r.get("type") == "op" and r.get("outcome") == "http_504")
    recs = [r for r in recs if not (r.get("type") == "op" and r.get("id") == slow["id"] and r["phase"] == "invoke")]
    slow["elapsed_ms"] = 120.0
    assert judge(recs, "bounded_return").ok is True
    r = judge(recs, "harness_integrity")
    assert r.ok is False and "no invoke record" in r.message, r.message


def test_a_stuck_worker_without_its_open_request() -> None:
    recs = records(KILL)
    next(r for r in recs if r.get("node") == "client" and r.get("when") == "final")["stuck_workers"] = 1
    r = judge(recs, "harness_integrity")
    assert r.ok is False and "stuck workers" in r.message, r.message


@pytest.mark.parametrize("what", ["fault_started", "fault_effect"])
def test_a_fault_event_moved_out_of_its_window(what: str) -> None:
    recs = records(KILL)
    start, stop = window(recs, 1)
    e = next(r for r in recs if r.get("what") == what and r.get("id") == 1)
    e["t"] = start - 1.0 if what == "fault_started" else stop - 1.0
    r = judge(recs, "harness_integrity")
    assert r.ok is False and "outside its window" in r.message, r.message


def test_a_node_final_probe_gone_without_a_silent_probe() -> None:
    """D's final probe dropped: no_leaks and node_alive failed plainly, which an expectation with
    may_fail [no_leaks, node_alive] admitted; the runner records every node's end or its silence."""
    recs = [r for r in records(KILL) if not (r.get("type") == "probe" and r.get("node") == "decode:0"
                                             and r.get("when") == "final")]
    r = judge(recs, "harness_integrity")
    assert r.ok is False and "lost its end" in r.message, r.message


def test_a_capped_run_whose_end_record_says_done_still_hit_its_cap() -> None:
    """The runner killed the workload at the scenario's cap (its event says so); an end record
    rewritten to ``done`` made no_stall hold."""
    recs = records(KILL)
    t = next(r for r in recs if r.get("what") == "workload_exit")["t"] - 0.01
    recs.append({"type": "event", "what": "workload_killed", "t": t,
                 "reason": "the scenario's cap (500 s after t0) was reached"})
    r = judge(recs, "no_stall")
    assert r.ok is False and "cap" in r.message, r.message


@pytest.mark.parametrize("second", ["exit", "end", "meta"])
def test_two_runs_worth_of_exit_end_or_meta_records_is_not_one_history(second: str) -> None:
    """A workload exit 1 before the exit 0 (workload_ran read the last one), an end record at the
    cap before the one that says done (no_stall read the first): a saved pd-fake-prefill-silent
    [hardened] read "pass, as expected" with the first. A saved explore journal holds two runs
    appended into one; one run writes one of each."""
    recs = records(KILL)
    assert judge(recs, "harness_integrity").ok is True and judge(recs, "workload_ran").ok is True
    if second == "exit":
        ex = next(r for r in recs if r.get("what") == "workload_exit")
        recs.append({**ex, "returncode": 1, "t": ex["t"] - 0.01})
    elif second == "end":
        end = next(r for r in recs if r.get("type") == "end")
        recs.append({**end, "reason": "cap", "t": end["t"] - 0.01})
    else:
        recs.append({**meta(recs), "wall_start": "later"})
    r = judge(recs, "harness_integrity")
    assert r.ok is False and "the history is not one run's" in r.message, r.message
    assert V.of_results([r])[0] == "error"


def test_a_failure_after_the_heal_moved_into_the_window_is_not_explained() -> None:
    """A request after the heal fails (a broken system: nothing explains it), and its invoke record
    moved back into the partition (its tally made to match): failures_explained held, and nothing
    else this upstream run is expected to pass changed (it took 5 s of a 17 s bound). Its worker was
    still in earlier calls then: a worker makes one call at a time."""
    recs = records(PARTITION)
    start, stop = window(recs, next(f["id"] for f in meta(recs)["faults"] if f["type"] == "partition"))
    o = next(o for o in sorted(ops(recs).values(), key=lambda o: o["invoke"]["t"])
             if o["invoke"]["t"] > stop + 5.0 and o["done"]["phase"] == "ok")
    o["done"].update(phase="fail", outcome="http_502", status=502, error_phase="decode", value=None)
    c = next(r for r in recs if r.get("node") == "client" and r.get("when") == "final")["counters"]
    c["ops_ok"] -= 1
    c["ops_http_502"] = c.get("ops_http_502", 0) + 1
    assert judge(recs, "failures_explained").ok is False  # the broken system, caught as it is
    o["invoke"]["t"] = stop - 0.5
    assert judge(recs, "failures_explained").ok is True  # the hole
    assert o["invoke"]["id"] not in (judge(recs, "bounded_return").details.get("late_ops") or [])
    r = judge(recs, "harness_integrity")
    assert r.ok is False and "one call at a time" in r.message, r.message
