"""Journal mutants (issue 17, item 11): for every check, histories it must reject.

Each base history (tests/mutants/histories.py: pd, lookup, layerwise, built the way a run writes
them, with the meta line from the runner's own code; and real lookup and pd journals saved in
tests/golden/journals) is judged ``as_expected`` by its family's real check registry. Each mutant
changes one thing a broken system (or a broken run) would change, and must turn that into a
``deviation`` or an ``error`` (asserted), with the check that exists for it among the failing ones.
Every history is judged from its files, as ``pdchaos check RUN_DIR`` does.

The last part tries to break the checks: histories that are broken but still read ``as_expected``
today. Each is a strict xfail naming the hole; when a check is fixed, its xfail turns into an
XPASS and fails, and the mark goes.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

import pytest

from harness import checks as C
from nodekit import journal as J
from harness import verdicts as V
from harness.family import get_family
from mutants.histories import (
    EXT,
    GOLDEN,
    LOOKUP_WINDOW,
    PD_PIDS,
    PD_WINDOW,
    T0,
    Judgement,
    Run,
    event,
    golden_run,
    judge,
    judge_inline,
    layerwise_run,
    lookup_kill_run,
    lookup_preload,
    pd_baseline_run,
    pd_stop_run,
)

pytestmark = pytest.mark.timeout(20)

# --------------------------------------------------------------------------- bases

BASES: dict[str, Callable[[], Run]] = {
    "pd": pd_stop_run,  # hardened, policy fail: P frozen 2.5-8.5 s
    "pd_recompute": lambda: pd_stop_run(policy="recompute"),
    "pd_baseline": pd_baseline_run,  # upstream, no fault
    "pd_baseline_hardened": lambda: pd_baseline_run("hardened"),
    "lookup": lookup_kill_run,  # server killed 0.8-1.5 s
    "lookup_norecovery": lambda: lookup_kill_run(recovery=False),
    "golden_server_kill": lambda: golden_run("lookup-server-kill.jsonl"),  # a real run (hardened)
    "golden_pd_baseline": lambda: golden_run("pd-baseline-upstream.jsonl"),  # a real run, real vLLM, no fault
    "golden_pd_abort": lambda: golden_run("pd-abort-while-decode-waits-hardened.jsonl"),  # real, one fault
    "layerwise": layerwise_run,  # listener_garbage 1-4.5 s
}
FAMILY_OF = {name: "pd" if "pd" in name else "layerwise" if "layerwise" in name else "lookup" for name in BASES}


@lru_cache(maxsize=None)
def _base(name: str) -> Run:
    run = BASES[name]()
    run.retally(create=True)  # the workload's own count of its ops (histories recorded before it had one)
    return run


def base(name: str) -> Run:
    return _base(name).copy()


@pytest.mark.parametrize("name", sorted(BASES))
def test_unmutated_history_is_as_expected(name: str, tmp_path) -> None:
    run = base(name)
    j = judge(run, tmp_path)
    assert j.outcome == "as_expected", j.why()
    if name.startswith("golden_pd"):  # see GOLDEN_EXPECT: the saved pd runs failed no_leaks only
        assert set(j.failing) <= {"no_leaks"}, j.why()
    else:
        assert j.verdict == "pass" and run.meta["expect"] == "pass", j.why()
    # the same chain called directly (registry, run_checks, of_results, outcome) agrees
    k = judge_inline(run)
    assert (k.verdict, k.failing, k.outcome) == (j.verdict, j.failing, j.outcome), k.why()
    judged = {n for n, c in j.checks.items() if c["ok"] is True}
    assert judged, "nothing was judged"


def test_pd_base_history_exercises_the_pd_checks(tmp_path) -> None:
    """The pd base is not vacuous: a fault window with its effect, a failed request judged by
    fail_fast and failures_explained, quiet intervals judged by no_busy_wait, D's pulls."""
    j = judge(base("pd"), tmp_path)
    assert "1 fault windows showed their effect" in j.checks["fault_effect"]["message"]
    assert "1 failed requests" in j.checks["fail_fast"]["message"]
    assert "4 intervals" in j.checks["no_busy_wait"]["message"]
    assert "1 failed ops" in j.checks["failures_explained"]["message"]
    assert j.checks["kv_transferred"]["ok"] is True
    # every pd check applies and holds, but reset_truth: the base's workload resets nothing (its
    # mutant, pd_reset_claimed_with_keys_left, adds a reset)
    assert j.checks["reset_truth"]["ok"] is None
    assert all(c["ok"] is True for n, c in j.checks.items() if n != "reset_truth")


# --------------------------------------------------------------------------- mutation helpers


def _first_window(run: Run) -> dict:
    return next(w for w in run.windows() if w["start"] is not None)


def _tail(run: Run, fid: int) -> float:
    return float(next((f.get("tail_s") or 0.0) for f in run.meta.get("faults") or [] if f.get("id") == fid))


def far_ok_ops(run: Run, n: int) -> list[dict]:
    """``n`` successful primary ops far (0.5 s) from every fault window and its tail, latest first,
    none of them a worker's first op after a window (so recovery is not what catches them)."""
    windows = [(w["start"], w["stop"] + _tail(run, w["id"])) for w in run.windows() if w["start"] is not None]
    primary = run.meta.get("primary_ops") or []
    ops = [o for o in run.ops() if o.get("phase") == "ok" and (not primary or o.get("f") in primary)]
    firsts = set()
    for w in run.windows():
        seen = set()
        for o in ops:
            if o["t_invoke"] >= w["stop"] and o.get("process") not in seen:
                seen.add(o.get("process"))
                firsts.add(o["id"])
    far = [o for o in ops if o["id"] not in firsts and all(o["t_complete"] < a - 0.5 or o["t_invoke"] > b + 0.5
                                                           for a, b in windows)]
    assert len(far) >= n, "not enough ops far from the faults"
    return sorted(far, key=lambda o: -o["t_invoke"])[:n]


def fail_op(run: Run, op_id: int, outcome: str, error_phase: str | None = None, *, value=None, phase="fail",
            code: str | None = None) -> dict:
    """The op's completion becomes a failure (the shape its family's workload writes)."""
    done = run.completion(op_id)
    lookup = done.get("f") == "lookup"
    done.update(phase=phase, outcome=outcome, value=(0 if lookup and value is None and phase == "fail" else value))
    if lookup:
        done.update(matched=0, code=code or outcome.upper())
    else:
        status = int(outcome.split("_")[1]) if outcome.startswith("http_") else None
        done.update(status=status, completion_tokens=None, code=code or ("bad_status" if status else outcome))
    done.pop("error_phase", None)
    if error_phase:
        done["error_phase"] = error_phase
    return done


def ok_ops(run: Run) -> list[dict]:
    return [o for o in run.ops() if o.get("phase") == "ok"]


def ops_in_window(run: Run, failed: bool) -> list[dict]:
    w = _first_window(run)
    return [o for o in run.ops() if w["start"] <= o["t_invoke"] <= w["stop"] and (o.get("phase") != "ok") == failed]


def drop_op(run: Run, op_id: int) -> None:
    run.remove(lambda r: r.get("type") == "op" and r.get("id") == op_id)


def stall_op(run: Run, op_id: int) -> None:
    """The op never returned: its completion is missing, its worker sent nothing after it; the
    workload left it behind (exit 3)."""
    run.remove(lambda r: r.get("type") == "op" and r.get("id") == op_id and r.get("phase") != "invoke")
    retire_worker_after(run, op_id)
    run.events("workload_exit")[-1]["returncode"] = 3
    run.end["stalled"] = 1


def final(run: Run, node: str) -> dict:
    return run.probe(node, "final")


def drop_probe(node: str, when: str) -> Callable[[Run], None]:
    return lambda r: r.remove(lambda x: x.get("type") == "probe" and x.get("node") == node and x.get("when") == when)


def effect_event(run: Run) -> dict:
    return run.events("fault_effect")[0]


def add_fault_error(run: Run) -> None:
    w = _first_window(run)
    run.add(event("fault_error", w["start"] - T0 + 0.003, fault=w["name"], phase="start",
                  error="HarnessError: node did not answer its control channel"))
    effect_event(run)["effect"] = {"acted": 0, "seen": 0, "unseen": 0}


def pd_burn(run: Run, rate: float = 0.95, since: float = 6.5) -> None:
    """D burns ``rate`` of a core from ``since`` s to the heal (no request running or coming)."""
    stop = PD_WINDOW[1]
    for p in run.probes("decode:0"):
        t = p["t"] - T0
        if t > since:
            p["counters"]["cpu_s"] = round(p["counters"]["cpu_s"] + rate * (min(t, stop) - since), 3)


def pd_waf(late_writes: int = 0, watching: bool = True) -> Callable[[Run], None]:
    """Opt the history into no_write_after_free and give D's probes the watcher's counts: 3 blocks
    freed from failed loads watched, ``late_writes`` of them written after free by the last probe
    (``watching`` False: D's probes say nothing of a watcher)."""
    def f(run: Run) -> None:
        run.meta.setdefault("checks", {})["no_write_after_free"] = {"enabled": True}
        if not watching:
            return
        ps = run.probes("decode:0")
        for i, p in enumerate(ps):
            last = i == len(ps) - 1
            p["counters"].update({"waf_watching": 1, "waf_ok": 1, "waf_tensors": 2, "waf_errors": 0,
                                  "waf_poisoned": 3 if i else 0, "waf_late_writes": late_writes if last else 0})
    return f


def pd_prompts(run: Run) -> list[dict]:
    return json.loads(run.files["prompts.json"])


def retire_worker_after(run: Run, op_id: int) -> None:
    """Drop the ops the op's worker issued after it (it is busy with this one)."""
    inv = run.invoke(op_id)
    later = {r["id"] for r in run.records if r.get("type") == "op" and r["phase"] == "invoke"
             and r["process"] == inv["process"] and r["t"] > inv["t"]}
    run.remove(lambda r: r.get("type") == "op" and r.get("id") in later)


def pd_504_after_20s(run: Run) -> None:
    fail_op(run, 6, "http_504", "prefill", code="timeout")
    retire_worker_after(run, 6)
    run.retime(6, 20000.0)


def set_expect(text: str) -> Callable[[Run], None]:
    def f(run: Run) -> None:
        run.meta["expect"] = text
    return f


def both(*fs: Callable[[Run], None]) -> Callable[[Run], None]:
    def f(run: Run) -> None:
        for g in fs:
            g(run)
    return f


def strings(d: dict) -> dict:
    return {k: str(v) for k, v in d.items()}


# --------------------------------------------------------------------------- mutants


@dataclass
class Mutant:
    id: str
    base: str
    mutate: Callable[[Run], None]
    outcome: str  # "deviation" | "error" (or "as_expected" for the controls)
    killers: tuple[str, ...]  # checks that must be among the failing ones
    verdict: str | None = None  # when it matters (stall)
    marks: tuple = field(default_factory=tuple)


def _set(path_fn: Callable[[Run], dict], **kv) -> Callable[[Run], None]:
    def f(run: Run) -> None:
        path_fn(run).update(kv)
    return f


M = Mutant
def lying_reset(run: Run) -> None:
    """The workload resets D's cache and pool after its last request; the server says success
    and the store master still holds 6 keys before and after (upstream's unread remove_all)."""
    run.meta["not_applicable"].pop("reset_truth", None)
    run.meta["workload"]["resets"] = [{"at": 14.5, "node": "decode"}]
    last = max(o["t_complete"] for o in run.ops() if o.get("t_complete") is not None) - T0
    at = last + 0.5
    master = {"type": "probe", "node": "store", "kind": "mooncake-master", "when": "sample", "pid": 77,
              "counters": {"master_key_count": 6, "metrics_ok": 1}, "alive": True}
    run.add({"type": "op", "id": 9001, "process": -1, "f": "reset", "phase": "invoke", "t": T0 + at, "node": "decode"},
            {"type": "op", "id": 9001, "process": -1, "f": "reset", "phase": "ok", "outcome": "ok", "value": True,
             "status": 200, "code": "", "node": "decode", "t": T0 + at + 0.05, "elapsed_ms": 50.0},
            {**master, "t": T0 + at - 0.3}, {**master, "t": T0 + at + 1.6})
    end = run.end  # the run ends after what it recorded (a record past the end is a broken history)
    if end is not None and end["t"] < T0 + at + 1.7:
        end["t"] = T0 + at + 1.7


def drop_ops(pred: Callable[[dict], bool]) -> Callable[[Run], None]:
    """The workload never sent these ops (their invoke and completion gone)."""
    def f(run: Run) -> None:
        ids = {o["id"] for o in run.ops() if pred(o)}
        assert ids, "the mutant drops nothing"
        run.remove(lambda r: r.get("type") == "op" and r.get("id") in ids)
    return f


def _in_window(o: dict) -> bool:
    a, b = o.get("t_invoke"), o.get("t_complete")
    return a < T0 + PD_WINDOW[1] and (b is None or b > T0 + PD_WINDOW[0])


PD_MUTANTS = [
    # issue 30, item 13: the point of a scenario that never happened is an error, not a verdict
    M("pd_no_request_in_flight_while_p_frozen", "pd", drop_ops(_in_window), "error", ("triggers",)),
    # a slow failed load (4.6 s, over kv_load_timeout 2 s + 2 s) stays a fail_fast failure; only the
    # proxy's own aborts are not timed (see the control pd_proxy_abort_after_a_long_wait_is_not_timed)
    M("pd_slow_failed_load_in_the_window", "pd", lambda r: fail_op(r, 5, "http_502", "decode", code="bad_status"),
      "deviation", ("fail_fast",)),
    M("pd_only_one_request_in_flight_of_two_needed", "pd", drop_ops(lambda o: _in_window(o) and o["id"] != 4),
      "error", ("triggers",)),
    M("pd_trigger_prompt_never_sent", "pd_baseline", drop_ops(lambda o: o.get("prompt_index") == 3),
      "error", ("triggers",)),
    M("pd_trigger_prompt_never_answered", "pd_baseline",
      lambda r: r.completion(next(o["id"] for o in r.ops() if o.get("prompt_index") == 3)).update(
          phase="info", outcome="stalled", code="timeout", status=None, value=None),
      "error", ("triggers",)),
    # seed 002's stale-cache hole: a reset reported done while the pool kept its keys
    M("pd_reset_claimed_with_keys_left", "pd", lying_reset, "deviation", ("reset_truth",)),
    # ---- the ones issue 17 lists
    # upstream promises no load deadline: fail_fast bounds its failures by the scenario's deadline +
    # tolerance (12 s), which these fast 502s meet: failures_explained alone kills it
    M("pd_baseline_15_of_16_http_502", "pd_baseline",
      lambda r: [fail_op(r, o["id"], "http_502", "decode") for o in r.ops()[1:]],
      "deviation", ("failures_explained",)),
    # ... and a 502 that comes back after the deadline + tolerance is no fast failure
    M("pd_baseline_http_502_after_13s", "pd_baseline",
      lambda r: (fail_op(r, 6, "http_502", "decode"), retire_worker_after(r, 6), r.retime(6, 13000.0)),
      "deviation", ("failures_explained", "fail_fast", "bounded_return")),
    # hardened promises a bound (kv_load_timeout + 2 s) these fast 502s meet: failures_explained alone kills it
    M("pd_baseline_hardened_15_of_16_http_502", "pd_baseline_hardened",
      lambda r: [fail_op(r, o["id"], "http_502", "decode") for o in r.ops()[1:]],
      "deviation", ("failures_explained",)),
    M("pd_two_ok_far_from_fault_become_http_500", "pd",
      lambda r: [fail_op(r, o["id"], "http_500", "decode") for o in far_ok_ops(r, 2)],
      "deviation", ("failures_explained",)),
    M("pd_fault_failed_to_start", "pd", add_fault_error, "error", ("harness_integrity", "fault_effect")),
    M("pd_fault_reported_no_effect", "pd",
      lambda r: effect_event(r).update(effect=None, error="ControlError: no answer from proxy"),
      "error", ("fault_effect",)),
    M("pd_fault_effect_counts_zero", "pd",
      lambda r: effect_event(r).update(effect={"acted": 1, "seen": 0, "unseen": 1}), "error", ("fault_effect",)),
    M("pd_expected_fail_no_busy_wait_but_fail_fast_fails", "pd",
      both(set_expect("fail[no_busy_wait]"), lambda r: fail_op(r, 4, "http_504", "decode", code="timeout")),
      "deviation", ("fail_fast",)),
    M("pd_expected_fail_no_busy_wait_and_fail_fast_fails_too", "pd",
      both(set_expect("fail[no_busy_wait]"), pd_burn, lambda r: fail_op(r, 4, "http_504", "decode", code="timeout")),
      "deviation", ("no_busy_wait", "fail_fast")),
    M("pd_expected_fail_no_busy_wait_but_nothing_fails", "pd", set_expect("fail[no_busy_wait]"), "deviation", ()),
    # a probe without a count cannot show a leak either: no_leaks cannot judge (an error), so it never
    # meets an expectation that names no_leaks (upstream's `pass|fail[no_leaks]`)
    M("pd_probe_lacks_threads_and_fds", "pd", lambda r: [final(r, "decode:0").pop(k) for k in ("threads", "fds")],
      "error", ("no_leaks",)),
    M("pd_probe_threads_unreadable", "pd", _set(lambda r: final(r, "proxy"), threads=-1), "error", ("no_leaks",)),
    M("pd_http_504_after_20s_policy_fail", "pd", pd_504_after_20s, "deviation", ("fail_fast", "bounded_return")),
    M("pd_recompute_http_502_after_d_was_asked", "pd_recompute", lambda r: fail_op(r, 4, "http_502", "decode"),
      "deviation", ("fail_fast",)),
    M("pd_op_outside_any_window_fails", "pd",
      lambda r: fail_op(r, far_ok_ops(r, 1)[0]["id"], "connect", code="ConnectionRefusedError"),
      "deviation", ("failures_explained",)),
    M("pd_stalled_op", "pd", lambda r: stall_op(r, far_ok_ops(r, 1)[0]["id"]), "deviation",
      ("no_stall", "bounded_return"), verdict="stall"),
    M("pd_wrong_completion_text", "pd",
      lambda r: r.completion(9).update(value=r.completion(9)["value"] + " river"), "deviation", ("correct_output",)),
    M("pd_kv_usage_not_back_to_baseline", "pd",
      lambda r: final(r, "decode:0")["counters"].update(kv_cache_usage_perc=0.0125), "deviation", ("drained",)),
    M("pd_request_waiting_at_the_end", "pd",
      lambda r: final(r, "prefill:0")["counters"].update(num_requests_waiting=1), "deviation", ("drained",)),
    M("pd_decode_burns_cpu_in_a_quiet_fault_interval", "pd", pd_burn, "deviation", ("no_busy_wait",)),
    # P wrote into blocks D had freed from a failed load: only D's watcher sees it (Mooncake is push)
    M("pd_write_after_free_on_decode", "pd", pd_waf(late_writes=1), "deviation", ("no_write_after_free",)),
    M("pd_write_after_free_watcher_silent", "pd", pd_waf(watching=False), "error", ("no_write_after_free",)),
    M("pd_decode_pulled_no_tokens", "pd",
      lambda r: [p["counters"].update({EXT: 0}) for p in r.probes("decode:0")], "deviation", ("kv_transferred",)),
    M("pd_secret_prompt_in_a_server_log", "pd",
      lambda r: r.logs.update({"server-logs/decode-0.log": r.logs["server-logs/decode-0.log"]
                               + f"INFO Received request cmpl-3: prompt: '{pd_prompts(r)[3]['prompt']}'\n"}),
      "deviation", ("log_hygiene",)),
    M("pd_reference_output_in_the_proxy_log", "pd",
      lambda r: r.logs.update({"logs/03-pd-proxy.log": r.logs["logs/03-pd-proxy.log"]
                               + f"answer{pd_prompts(r)[1]['expected']}\n"}), "deviation", ("log_hygiene",)),
    M("pd_workload_exit_code_4", "pd", lambda r: r.events("workload_exit")[-1].update(returncode=4), "error",
      ("workload_ran",)),
    # ---- one per other check, and the broken-run shapes
    M("pd_ok_op_over_deadline_plus_tolerance", "pd", lambda r: r.retime(12, 13000.0), "deviation",
      ("bounded_return",)),
    M("pd_first_op_after_the_window_fails", "pd",
      lambda r: fail_op(r, 7, "http_502", "decode"), "deviation", ("recovery",)),
    M("pd_proxy_dead_at_the_end", "pd", _set(lambda r: final(r, "proxy"), alive=False), "deviation", ("node_alive",)),
    # the runner probes every node at teardown or records it silent: a probe gone without either is a
    # history that lost its end (it read as a plain no_leaks/node_alive failure, which may_fail admitted)
    M("pd_decode_final_probe_lost", "pd",
      drop_probe("decode:0", "final"),
      "error", ("harness_integrity", "node_alive", "no_leaks")),
    M("pd_run_hit_its_cap", "pd", lambda r: r.end.update(reason="cap"), "deviation", ("no_stall",), verdict="stall"),
    M("pd_leftovers_after_teardown", "pd",
      lambda r: r.add(event("leftovers", 15.5, what_left=["pid 4103 (node pd-proxy)"])), "error",
      ("harness_integrity",)),
    M("pd_proxy_silent_at_the_end", "pd",
      both(drop_probe("proxy", "final"),
           lambda r: r.add(event("probe_silent", 15.0, role="proxy", kind="pd-proxy", pid=PD_PIDS["proxy"],
                                 when="final"))),
      "error", ("harness_integrity", "node_alive")),
    M("pd_no_workload_exit_recorded", "pd", lambda r: r.remove(lambda x: x.get("what") == "workload_exit"), "error",
      ("workload_ran",)),
    M("pd_workload_issued_2_of_14_ops", "pd",
      lambda r: r.remove(lambda x: x.get("type") == "op" and x["id"] >= 3), "error", ("workload_ran",)),
    M("pd_no_logs", "pd", lambda r: r.logs.clear(), "deviation", ("log_hygiene",)),
    M("pd_all_probes_lost", "pd", lambda r: r.remove(lambda x: x.get("type") == "probe"), "error",
      ("harness_integrity",)),
    M("pd_fault_records_lost", "pd",
      lambda r: r.remove(lambda x: x.get("type") == "fault" or x.get("what") in ("fault_effect", "fault_started")),
      "error", ("fault_effect", "recovery", "no_busy_wait")),
    M("pd_fault_start_record_lost", "pd",
      lambda r: r.remove(lambda x: x.get("type") == "fault" and x.get("phase") == "start"), "error", ("no_busy_wait",)),
    # ---- values of the wrong type: never read as holding
    M("pd_elapsed_ms_as_string", "pd", lambda r: r.completion(3).update(elapsed_ms="170.0"), "deviation",
      ("bounded_return",)),
    M("pd_final_counters_as_strings", "pd",
      lambda r: final(r, "decode:0").update(counters=strings(final(r, "decode:0")["counters"])), "error",
      ("drained", "kv_transferred")),
    M("pd_threads_as_string", "pd", _set(lambda r: final(r, "proxy"), threads="4"), "error", ("no_leaks",)),
    M("pd_workload_returncode_as_string", "pd", lambda r: r.events("workload_exit")[-1].update(returncode="0"),
      "error", ("workload_ran",)),
]


def lookup_hash_in_log(run: Run) -> None:
    run.logs["logs/client-workload.log"] = run.logs.get("logs/client-workload.log", "") + \
        f"lookup failed for block {lookup_preload()[2]}\n"


def lookup_server_final(run: Run) -> dict:
    return [p for p in run.probes("server", "final")][-1]


def lookup_server_close_killed(run: Run) -> None:
    run.meta["not_applicable"].pop("clean_close", None)
    run.add(event("server_close", 2.5, survived=False, exit_code=-11, close_ms=None))


LOOKUP_ALL = ("lookup", "golden_server_kill")


def planned_reset_never_sent(run: Run) -> None:
    """The workload was to reset the pool at 1 s (workload.reset_at) and the history holds no reset."""
    run.meta["not_applicable"].pop("reset_done", None)
    run.meta.setdefault("workload", {})["reset_at"] = 1.0
LOOKUP_FAULTED = ("lookup", "golden_server_kill")
LOOKUP_MUTANTS = [
    *[M(f"{b}_ok_lookups_far_from_fault_time_out", b,
        lambda r: [fail_op(r, o["id"], "timeout") for o in far_ok_ops(r, 2)],
        "deviation", ("failures_explained", "metrics_match")) for b in LOOKUP_ALL],
    *[M(f"{b}_fail_open_returns_nonzero", b, lambda r: fail_op(r, ops_in_window(r, True)[0]["id"], "timeout", value=5),
        "deviation", ("fail_open",)) for b in LOOKUP_FAULTED],
    *[M(f"{b}_lookup_raised_to_the_caller", b,
        lambda r: fail_op(r, ops_in_window(r, True)[0]["id"], "raised", phase="info", value=None, code="ZMQError"),
        "deviation", ("fail_open",)) for b in LOOKUP_FAULTED],
    *[M(f"{b}_wrong_hit", b, lambda r: r.completion(ok_ops(r)[5]["id"]).update(value=ok_ops(r)[5]["expected"] + 16),
        "deviation", ("correct_hits",)) for b in LOOKUP_ALL],
    *[M(f"{b}_server_lost_a_reply", b,
        lambda r: lookup_server_final(r)["counters"].update(
            requests=lookup_server_final(r)["counters"]["requests"] + 1),
        "deviation", ("exactly_one_reply",)) for b in LOOKUP_ALL],
    *[M(f"{b}_client_counter_off_by_one", b,
        lambda r: final(r, "client")["counters"].update(ok=final(r, "client")["counters"]["ok"] + 1),
        "deviation", ("metrics_match",)) for b in LOOKUP_ALL],
    *[M(f"{b}_server_fd_leak", b, lambda r: lookup_server_final(r).update(fds=lookup_server_final(r)["fds"] + 3),
        "deviation", ("no_leaks",)) for b in LOOKUP_ALL],
    *[M(f"{b}_block_hash_in_a_log", b, lookup_hash_in_log, "deviation", ("log_hygiene",)) for b in LOOKUP_ALL],
    *[M(f"{b}_planned_reset_never_sent", b, planned_reset_never_sent, "error", ("reset_done",)) for b in LOOKUP_ALL],
    *[M(f"{b}_expected_fail_fail_open_but_nothing_fails", b, set_expect("fail[fail_open]"), "deviation", ())
      for b in LOOKUP_ALL],
    *[M(f"{b}_fault_effect_zero", b, lambda r: effect_event(r).update(effect={"acted": 1, "seen": 0, "unseen": 1}),
        "error", ("fault_effect",)) for b in LOOKUP_FAULTED],
    *[M(f"{b}_fault_failed_to_start", b, add_fault_error, "error", ("harness_integrity", "fault_effect"))
      for b in LOOKUP_FAULTED],
    *[M(f"{b}_workload_exit_code_4", b, lambda r: r.events("workload_exit")[-1].update(returncode=4), "error",
        ("workload_ran",)) for b in LOOKUP_ALL],
    *[M(f"{b}_stalled_lookup", b, lambda r: stall_op(r, far_ok_ops(r, 1)[0]["id"]), "deviation", ("no_stall",),
        verdict="stall") for b in LOOKUP_ALL],
    *[M(f"{b}_lookup_over_deadline", b, lambda r: r.retime(far_ok_ops(r, 1)[0]["id"], 400.0), "deviation",
        ("bounded_return",)) for b in LOOKUP_ALL],
    *[M(f"{b}_first_lookup_after_the_window_times_out", b,
        lambda r: fail_op(r, next(o["id"] for o in r.ops() if o["t_invoke"] >= _first_window(r)["stop"]), "timeout"),
        "deviation", ("recovery",)) for b in LOOKUP_FAULTED],
    *[M(f"{b}_server_dead_at_the_end", b, lambda r: lookup_server_final(r).update(alive=False), "deviation",
        ("node_alive",)) for b in LOOKUP_ALL],
    M("lookup_server_close_took_the_process_down", "lookup", lookup_server_close_killed, "deviation",
      ("clean_close",)),
    M("lookup_fault_window_without_start_record", "lookup",
      lambda r: r.remove(lambda x: x.get("type") == "fault" and x.get("phase") == "start"), "error",
      ("metrics_match",)),
]


def lw_op(op_id: int, **done) -> Callable[[Run], None]:
    return lambda r: r.completion(op_id).update(**done)


def lw_failed_on_decode(aimed: str) -> Callable[[Run], None]:
    """The base's fault (1-4.5 s) aimed at the D ``aimed`` only, and op 6 (invoked at 2.55 s, on
    the base's one D, ``decode``) failed."""
    def mutate(r: Run) -> None:
        r.meta.setdefault("not_applicable", {}).pop("failed_where_faulted", None)
        for f in r.meta.get("faults") or []:
            f.setdefault("params", {})["decode"] = aimed
        for o in r.records:
            if o.get("type") == "op":
                o["decode"] = "decode"
        r.completion(6).update(phase="fail", value="failed", outcome="failed_load", blocks_reported=4)
    return mutate


LAYERWISE_MUTANTS = [
    M("layerwise_request_failed_on_a_d_the_fault_spared", "layerwise", lw_failed_on_decode("decode2"), "deviation",
      ("failed_where_faulted",)),
    M("layerwise_request_left_waiting", "layerwise",
      lw_op(5, phase="info", value="waiting", outcome="stalled", code="still_waiting"), "deviation",
      ("left_waiting",)),
    M("layerwise_failed_load_with_blocks_unreported", "layerwise",
      lw_op(6, phase="fail", value="failed", outcome="failed_load", blocks_reported=2), "deviation",
      ("left_waiting",)),
    M("layerwise_decode_did_not_answer", "layerwise",
      lw_op(7, phase="info", value=None, outcome="raised", code="ControlError"), "deviation", ("left_waiting",)),
    M("layerwise_listener_never_answered", "layerwise",
      lambda r: r.events("listener_probe")[2].update(answered=False, reply=None, tries=3, elapsed_ms=3301.0),
      "deviation", ("listener_answers",)),
    M("layerwise_listener_answered_on_second_try", "layerwise",
      lambda r: r.events("listener_probe")[0].update(tries=2, elapsed_ms=1102.0), "deviation",
      ("listener_answers",)),
    # the probes are the event the scenario's claim rests on (its trigger listener_probed): an error now
    M("layerwise_no_listener_probe_recorded", "layerwise",
      lambda r: r.remove(lambda x: x.get("what") == "listener_probe"), "error", ("listener_answers", "triggers")),
    M("layerwise_prefill_partial_send", "layerwise",
      lambda r: final(r, "prefill")["counters"].update(partial_sends=1), "deviation", ("layers_complete",)),
    M("layerwise_decode_blocks_leaked", "layerwise",
      lambda r: final(r, "decode")["counters"].update(free_blocks=27, blocks_held_finished=4), "deviation",
      ("blocks_returned",)),
    M("layerwise_decode_no_block_counters", "layerwise",
      lambda r: final(r, "decode").update(counters={}), "error", ("blocks_returned",)),
    M("layerwise_decode_content_bad", "layerwise",
      lambda r: final(r, "decode")["counters"].update(content_bad=1), "deviation", ("kv_content",)),
    M("layerwise_decode_content_unchecked", "layerwise",
      lambda r: final(r, "decode")["counters"].update(content_checked=40), "error", ("kv_content",)),
    M("layerwise_prefill_wrote_after_free", "layerwise",
      lambda r: final(r, "decode")["counters"].update(writes_after_free=1), "deviation", ("no_write_after_free",)),
    M("layerwise_decode_no_free_watch_counters", "layerwise",
      lambda r: [p["counters"].pop("writes_after_free") for p in r.records if p.get("type") == "probe"
                 and p.get("node") == "decode"], "error", ("no_write_after_free",)),
    M("layerwise_decode_more_writes_than_watched", "layerwise",
      lambda r: final(r, "decode")["counters"].update(writes_after_free=3), "error", ("no_write_after_free",)),
    M("layerwise_decode_posted_twice", "layerwise",
      lambda r: final(r, "metaserver")["counters"].update(posts=13, repeat_posts=1), "deviation", ("post_once",)),
    M("layerwise_metaserver_no_post_counters", "layerwise",
      lambda r: final(r, "metaserver").update(counters={}), "error", ("post_once",)),
    M("layerwise_workload_exit_code_4", "layerwise", lambda r: r.events("workload_exit")[-1].update(returncode=4),
      "error", ("workload_ran",)),
]



def decode_probes(run: Run) -> list[dict]:
    return [p for p in run.probes("decode:0") if p.get("kind") == "vllm"]


def d_pulled_nothing(run: Run) -> None:
    """Every decode probe's external-KV counter stays at its process's baseline."""
    base_of = {p["pid"]: p["counters"].get(EXT, 0) for p in decode_probes(run) if p.get("when") == "baseline"}
    for p in decode_probes(run):
        p["counters"][EXT] = base_of.get(p["pid"], 0)


def reference_in_log(run: Run) -> None:
    ref = next(o["expected"] for o in run.ops() if len(o.get("expected") or "") >= 16)
    run.logs["logs/01-pd-proxy.log"] += f"decode answered: {ref!r}\n"


GOLDEN_PD = ("golden_pd_baseline", "golden_pd_abort")
GOLDEN_PD_MUTANTS = [
    # fast 502s are within upstream's bound (the scenario's deadline + tolerance): fail_fast holds
    M("golden_pd_baseline_15_of_16_http_502", "golden_pd_baseline",
      lambda r: [fail_op(r, o["id"], "http_502", "decode") for o in r.ops()[1:]],
      "deviation", ("failures_explained",)),
    *[M(f"{b}_two_ok_far_from_fault_become_http_500", b,
        lambda r: [fail_op(r, o["id"], "http_500", "decode") for o in far_ok_ops(r, 2)],
        "deviation", ("failures_explained",)) for b in GOLDEN_PD],
    M("golden_pd_abort_fault_effect_zero", "golden_pd_abort",
      lambda r: effect_event(r).update(effect={"aborted_by.decode_wait": 0.0, "abort_missed": 3.0}), "error",
      ("fault_effect",)),
    M("golden_pd_abort_fault_failed_to_start", "golden_pd_abort", add_fault_error, "error",
      ("harness_integrity", "fault_effect")),
    M("golden_pd_abort_http_504_after_20s", "golden_pd_abort",
      lambda r: (lambda i: (fail_op(r, i, "http_504", "decode", code="timeout"), retire_worker_after(r, i),
                            r.retime(i, 20000.0)))(ops_in_window(r, True)[0]["id"]),
      "deviation", ("fail_fast", "bounded_return")),
    M("golden_pd_abort_first_op_after_the_window_fails", "golden_pd_abort",
      lambda r: fail_op(r, next(o["id"] for o in r.ops() if o["t_invoke"] >= _first_window(r)["stop"]),
                        "http_502", "decode"), "deviation", ("recovery",)),
    *[M(f"{b}_wrong_completion_text", b,
        lambda r: r.completion(ok_ops(r)[-1]["id"]).update(value=ok_ops(r)[-1]["value"] + " river"), "deviation",
        ("correct_output",)) for b in GOLDEN_PD],
    *[M(f"{b}_kv_usage_not_back_to_baseline", b,
        lambda r: final(r, "decode:0")["counters"].update(kv_cache_usage_perc=0.02), "deviation", ("drained",))
      for b in GOLDEN_PD],
    *[M(f"{b}_decode_pulled_no_tokens", b, d_pulled_nothing, "deviation", ("kv_transferred",)) for b in GOLDEN_PD],
    *[M(f"{b}_reference_output_in_a_log", b, reference_in_log, "deviation", ("log_hygiene",)) for b in GOLDEN_PD],
    *[M(f"{b}_workload_exit_code_4", b, lambda r: r.events("workload_exit")[-1].update(returncode=4), "error",
        ("workload_ran",)) for b in GOLDEN_PD],
    *[M(f"{b}_stalled_op", b, lambda r: stall_op(r, far_ok_ops(r, 1)[0]["id"]), "deviation", ("no_stall",),
        verdict="stall") for b in GOLDEN_PD],
    *[M(f"{b}_proxy_dead_at_the_end", b, _set(lambda r: final(r, "proxy"), alive=False), "deviation",
        ("node_alive",)) for b in GOLDEN_PD],
]


# --------------------------------------------------------------------------- triggers, per family

# Issue 43, item 6: each base declares the events its claim rests on (its scenario's ``triggers:``);
# removing that event from the saved history turns the run into a harness error (``triggers``), and
# so does a history that declares nothing, or says ``none`` while faults are scheduled.


def drop_ops_in_first_window(keep: int = 0) -> Callable[[Run], None]:
    """Remove every primary op in flight during the first fault window (from its start record to its
    stop record), but the first ``keep`` of them: the workload sent nothing the fault could meet."""
    def f(run: Run) -> None:
        w = _first_window(run)
        primary = run.meta.get("primary_ops") or []
        hit = [o for o in run.ops() if (not primary or o.get("f") in primary) and o["t_invoke"] <= w["stop"]
               and (o.get("t_complete") is None or o["t_complete"] > w["start"])]
        ids = {o["id"] for o in hit[keep:]}
        assert ids, "the mutant drops nothing"
        run.remove(lambda r: r.get("type") == "op" and r.get("id") in ids)
    return f


def declare(triggers) -> Callable[[Run], None]:  # noqa: ANN001 - a list of entries, or {"none": ...}
    def f(run: Run) -> None:
        run.meta["triggers"] = triggers
    return f


def drop_fault_started(run: Run) -> None:
    run.remove(lambda r: r.get("what") == "fault_started")


TRIGGER_MUTANTS = [
    # pd (the synthetic base's are above: pd_no_request_in_flight_while_p_frozen, ...): the real run
    M("golden_pd_abort_no_request_in_flight_while_the_hook_was_armed", "golden_pd_abort", drop_ops_in_first_window(),
      "error", ("triggers",)),
    M("pd_no_record_of_when_the_stop_acted", "pd", drop_fault_started, "error", ("triggers",)),
    # lookup: the synthetic kill and the real one
    M("lookup_no_lookup_in_flight_while_the_server_was_killed", "lookup", drop_ops_in_first_window(), "error",
      ("triggers",)),
    M("lookup_one_lookup_in_flight_of_two_needed", "lookup", drop_ops_in_first_window(keep=1), "error",
      ("triggers",)),
    M("golden_server_kill_no_lookup_in_flight_while_the_server_was_killed", "golden_server_kill",
      drop_ops_in_first_window(), "error", ("triggers",)),
    M("golden_server_kill_no_record_of_when_the_kill_acted", "golden_server_kill", drop_fault_started, "error",
      ("triggers",)),
    # layerwise: no request met the garbage (listener_probe removed: layerwise_no_listener_probe_recorded)
    M("layerwise_no_request_in_flight_during_the_garbage", "layerwise", drop_ops_in_first_window(), "error",
      ("triggers",)),
    M("layerwise_four_messages_to_the_listener_of_five_needed", "layerwise",
      lambda r: r.remove(lambda x: x.get("what") == "listener_probe" and x.get("probe") == "two_payloads"),
      "error", ("triggers",)),
    # every family: a history that declares nothing, or says none while a fault is scheduled, is no verdict
    *[M(f"{b}_no_trigger_declared", b, declare([]), "error", ("triggers",))
      for b in ("pd", "golden_pd_abort", "lookup", "golden_server_kill", "layerwise")],
    *[M(f"{b}_none_declared_with_a_fault_scheduled", b, declare({"none": "baseline without faults"}), "error",
        ("triggers",)) for b in ("pd", "lookup", "layerwise")],
    # a baseline whose none lost its reason, or whose meta line lost the mark the runner gives it
    M("golden_pd_baseline_none_without_a_reason", "golden_pd_baseline", declare({"none": " "}), "error",
      ("triggers",)),
    M("golden_pd_baseline_none_not_marked_not_applicable", "golden_pd_baseline",
      lambda r: r.meta["not_applicable"].pop("triggers"), "error", ("triggers",)),
]

MUTANTS = PD_MUTANTS + GOLDEN_PD_MUTANTS + LOOKUP_MUTANTS + LAYERWISE_MUTANTS + TRIGGER_MUTANTS


@pytest.mark.parametrize("m", MUTANTS, ids=lambda m: m.id)
def test_mutant_is_caught(m: Mutant, tmp_path) -> None:
    run = base(m.base)
    m.mutate(run)
    run.retally()
    j = judge(run, tmp_path)
    assert j.outcome == m.outcome, j.why()
    assert j.outcome in ("deviation", "error")
    assert set(m.killers) <= set(j.failing), j.why()
    if m.verdict:
        assert j.verdict == m.verdict, j.why()


def test_mutant_ids_are_unique() -> None:
    ids = [m.id for m in MUTANTS]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("family", ["pd", "lookup", "layerwise"])
def test_every_check_has_a_mutant_that_kills_it(family: str) -> None:
    """Each of the family's own checks, and each generic one in some family, is a killer."""
    killed = {k for m in MUTANTS if FAMILY_OF[m.base] == family for k in m.killers}
    fam = get_family(family)
    assert set(fam.checks.checks) <= killed, sorted(set(fam.checks.checks) - killed)
    if family == "pd":  # the generic ones: every one of them is killed in the pd family
        assert set(C.checks_for(fam)) <= killed, sorted(set(C.checks_for(fam)) - killed)


# --------------------------------------------------------------------------- controls: these must stay as expected


CONTROLS = [
    # found by pdchaos explore: a request that waited 4.6 s before D was asked (P's bootstrap frozen),
    # then aborted by the proxy's hook, is the hook's timing, not a slow failed load
    M("pd_proxy_abort_after_a_long_wait_is_not_timed", "pd",
      lambda r: fail_op(r, 5, "http_502", "decode", code="aborted"), "as_expected", ()),
    M("pd_expected_fail_no_busy_wait_and_only_it_fails", "pd", both(set_expect("fail[no_busy_wait]"), pd_burn),
      "as_expected", ("no_busy_wait",)),
    M("pd_write_after_free_watched_and_clean", "pd", pd_waf(late_writes=0), "as_expected", ()),
    M("pd_recompute_http_502_before_d_was_asked", "pd_recompute", lambda r: fail_op(r, 4, "http_502", "bootstrap"),
      "as_expected", ()),
    M("pd_stalled_op_expected_stall", "pd",
      both(set_expect("stall[bounded_return,fail_fast,no_stall]"), lambda r: stall_op(r, 6)), "as_expected",
      ("no_stall", "fail_fast", "bounded_return")),
]


@pytest.mark.parametrize("m", CONTROLS, ids=lambda m: m.id)
def test_control_stays_as_expected(m: Mutant, tmp_path) -> None:
    """What the mutants must not over-kill: the claimed failure, or a failure the policy allows."""
    run = base(m.base)
    m.mutate(run)
    run.retally()
    j = judge(run, tmp_path)
    assert j.outcome == "as_expected", j.why()
    assert set(j.failing) == set(m.killers), j.why()


@pytest.mark.parametrize("family, check, base_name", [("pd", "correct_output", "pd"), ("lookup", "fail_open", "lookup"),
                                                      ("pd", "no_stall", "pd")])
def test_a_checker_that_raises_is_an_error(family: str, check: str, base_name: str, monkeypatch, tmp_path) -> None:
    def boom(inp, opts):  # noqa: ARG001
        raise ZeroDivisionError("checker bug")

    registry = get_family(family).checks.checks if check in get_family(family).checks.checks else C.GENERIC.checks
    monkeypatch.setitem(registry, check, boom)
    j = judge(base(base_name), tmp_path)
    assert (j.verdict, j.outcome) == ("error", "error"), j.why()
    assert check in j.failing and j.checks[check]["message"].startswith(V.RAISED)
    k = judge_inline(base(base_name))
    assert (k.verdict, k.outcome) == ("error", "error")


def test_a_baseline_that_says_none_shows_the_reason_never_a_pass(tmp_path) -> None:
    """The real baseline run declares ``triggers: {none: ...}`` (no fault): the check is not
    applicable, with the reason, in the re-check from files and in the direct chain alike."""
    for j in (judge(base("golden_pd_baseline"), tmp_path), judge_inline(base("golden_pd_baseline"))):
        c = j.checks["triggers"]
        assert c["ok"] is None and c["message"] == "not applicable: none declared: baseline without faults", j.why()
        assert "triggers" not in j.failing


@pytest.mark.parametrize("name", ["pd", "golden_pd_abort", "lookup", "golden_server_kill", "layerwise"])
def test_every_fault_base_fires_its_triggers(name: str, tmp_path) -> None:
    """The unmutated bases with faults hold ``triggers`` because their events happened, not because
    nothing was declared: each names at least one trigger and each fired."""
    j = judge(base(name), tmp_path)
    c = j.checks["triggers"]
    assert c["ok"] is True and c["details"]["seen"] and "fired" in c["message"], j.why()


def test_golden_journals_are_small_real_runs() -> None:
    paths = sorted(GOLDEN.glob("*.jsonl"))
    assert 1 <= len(paths) <= 3
    for path in paths:
        assert path.stat().st_size < 200_000, path
        text = path.read_text()
        meta = json.loads(text.splitlines()[0])
        assert meta["type"] == "meta" and meta["family"] in ("lookup", "pd") and meta["t0"] is not None
        assert "/tmp/" not in text  # no path that could exist on a test machine (README)


# --------------------------------------------------------------------------- holes: broken, yet read as expected


def hole(reason: str, raises: type[BaseException] = AssertionError):
    """A strict xfail that only an assertion (the outcome read as expected) satisfies: a mutator
    that breaks on a changed history shape fails the test instead of hiding in the xfail."""
    return pytest.mark.xfail(strict=True, reason=reason, raises=raises)


def h_truncated_prompt_in_log(run: Run) -> None:
    """vLLM logs a request's prompt cut at --max-log-len: the first 60 characters, words of <16."""
    p = pd_prompts(run)[3]["prompt"]
    run.logs["server-logs/decode-0.log"] += f"INFO Received request cmpl-3: prompt: '{p[:60]}', params: ...\n"


def h_truncated_reference_in_log(run: Run) -> None:
    """A real run's reference output, cut at 40 characters in the proxy's log."""
    ref = max((o["expected"] for o in run.ops() if isinstance(o.get("expected"), str)), key=len)
    run.logs["logs/01-pd-proxy.log"] += f"decode answered: {ref[:40]!r}...\n"


def h_golden_late_failure_without_elapsed(run: Run) -> None:
    """(The run has one worker: its later ops stay, so that recovery still sees the heal.)"""
    op_id = ops_in_window(run, True)[0]["id"]
    run.retime(op_id, 20000.0)
    run.completion(op_id).pop("elapsed_ms")


def h_late_failure_without_elapsed(value) -> Callable[[Run], None]:
    def f(run: Run) -> None:
        fail_op(run, 6, "http_502", "decode")
        retire_worker_after(run, 6)
        run.retime(6, 20000.0)  # by its timestamps: 20 s
        done = run.completion(6)
        if value is _MISSING:
            done.pop("elapsed_ms")
        else:
            done["elapsed_ms"] = value
    return f


_MISSING = object()


def h_nan_kv_usage(run: Run) -> None:
    final(run, "decode:0")["counters"]["kv_cache_usage_perc"] = float("nan")


def h_nan_cpu_first_interval(run: Run) -> None:
    pd_burn(run, since=7.0)
    s = next(p for p in run.probes("decode:0", "sample") if abs(p["t"] - T0 - 6.5) < 1e-6)
    s["counters"]["cpu_s"] = float("nan")


def h_duplicate_fault_id(run: Run) -> None:
    """A second window under the same id, before the real one, whose kill did nothing."""
    run.add({"type": "fault", "id": 0, "name": "kill", "phase": "start", "t": T0 + 0.4, "params": {"node": "decode:0"}},
            {"type": "fault", "id": 0, "name": "kill", "phase": "stop", "t": T0 + 0.9, "healed_by": "schedule"},
            event("fault_effect", 0.9001, fault="kill", id=0, effect={"acted": 1, "seen": 0, "unseen": 1},
                  required={"acted": 1, "seen": 1}))


def h_meta_disables_harness_integrity(run: Run) -> None:
    run.meta["checks"]["harness_integrity"] = {"enabled": False}
    run.add(event("fault_error", 2.503, fault="stop", phase="start", error="HarnessError: node not running"),
            event("leftovers", 15.5, what_left=["pid 4103 (node pd-proxy)"]))


def h_meta_says_fault_effect_not_applicable(run: Run) -> None:
    run.meta["not_applicable"]["fault_effect"] = "no fault is scheduled"
    effect_event(run)["effect"] = {"acted": 0, "seen": 0, "unseen": 0}


def h_scheduled_fault_never_ran(run: Run) -> None:
    """lookup, recovery disabled by the scenario: the server_kill scheduled in the meta never ran
    (no fault records, no kill); the server served throughout."""
    for o in [o for o in run.ops() if o.get("phase") != "ok"]:
        run.completion(o["id"]).update(phase="ok", outcome="ok", code="", value=o["expected"], matched=o["expected"])
    run.remove(lambda x: x.get("type") == "fault" or x.get("what") in ("fault_effect", "fault_started",
                                                                        "process_kill", "process_start"))
    run.remove(lambda x: x.get("type") == "probe" and x.get("node") == "server" and x.get("pid") == 502
               and x.get("when") == "baseline")
    run.remove(lambda x: x.get("type") == "probe" and x.get("node") == "server" and x.get("when") == "last")
    n = len(ok_ops(run))
    srv = lookup_server_final(run)
    srv.update(pid=501)
    srv["counters"].update(requests=n, replies=n, ok=n)
    final(run, "client")["counters"].update(ok=n, timeout=0, socket_rebuilds=0)


def h_duplicate_op_id(run: Run) -> None:
    """Op 9 failed far from any fault; a later op was journalled under the same id and succeeded."""
    fail_op(run, 9, "http_500", "decode")
    for r in run.records:
        if r.get("type") == "op" and r.get("id") == 11:
            r["id"] = 9


def h_failure_without_invoke_record(run: Run) -> None:
    op_id = far_ok_ops(run, 1)[0]["id"]
    fail_op(run, op_id, "http_502", "decode")
    run.remove(lambda x: x.get("type") == "op" and x.get("id") == op_id and x.get("phase") == "invoke")


def h_final_probe_without_baseline(run: Run) -> None:
    run.remove(lambda x: x.get("type") == "probe" and x.get("node") == "decode:0" and x.get("when") == "baseline")
    final(run, "decode:0").update(threads=140, fds=300)


# holes found by trying to break the checks, each closed since: kept as mutants that must stay caught
HOLES = [
    pytest.param("pd", h_truncated_prompt_in_log, "deviation", ("log_hygiene",),
                 id="hole_log_hygiene_truncated_prompt"),
    pytest.param("golden_pd_baseline", h_truncated_reference_in_log, "deviation", ("log_hygiene",), id="hole_log_hygiene_truncated_reference_golden_pd"),
    # its ops in the window are the proxy's own aborts, which fail_fast does not time (their timing is
    # the hook's): bounded_return, which times every op, is the one that must see the 20 s
    pytest.param("golden_pd_abort", h_golden_late_failure_without_elapsed, "deviation", ("bounded_return",), id="hole_elapsed_ms_missing_golden_pd"),
    pytest.param("pd", h_late_failure_without_elapsed(_MISSING), "deviation", ("fail_fast", "bounded_return"),
                 id="hole_elapsed_ms_missing_on_a_20s_failure"),
    pytest.param("pd", h_late_failure_without_elapsed(float("nan")), "deviation", ("fail_fast", "bounded_return"),
                 id="hole_elapsed_ms_nan_on_a_20s_failure"),
    pytest.param("pd", h_late_failure_without_elapsed(150.0), "deviation", ("fail_fast", "bounded_return"),
                 id="hole_elapsed_ms_understates_a_20s_failure"),
    pytest.param("pd", h_nan_kv_usage, "error", ("drained",), id="hole_drained_nan_kv_usage"),
    # a check that cannot judge makes the run an error (verdicts.UNDECIDED), never a verdict
    pytest.param("pd", h_nan_cpu_first_interval, "error", ("no_busy_wait",),
                 id="hole_no_busy_wait_nan_cpu_hides_a_burn"),
    pytest.param("pd", lambda r: r.remove(lambda x: x.get("what") == "fault_effect"), "error", ("fault_effect",), id="hole_fault_effect_event_missing"),
    pytest.param("pd", lambda r: effect_event(r).update(effect={"acted": float("nan"), "seen": float("nan")}), "error",
                 ("fault_effect",), id="hole_fault_effect_nan_counts"),
    pytest.param("pd", h_duplicate_fault_id, "error", (), id="hole_duplicate_fault_id"),
    pytest.param("pd", h_meta_disables_harness_integrity, "error", ("harness_integrity",),
                 id="hole_meta_disables_harness_integrity"),
    pytest.param("pd", h_meta_says_fault_effect_not_applicable, "error", ("fault_effect",),
                 id="hole_meta_fault_effect_not_applicable_with_windows"),
    pytest.param("pd", lambda r: r.remove(lambda x: x.get("type") == "end"), "error", (),
                 id="hole_no_end_record"),
    pytest.param("lookup_norecovery", h_scheduled_fault_never_ran, "error", ("fault_effect",),
                 id="hole_scheduled_fault_never_ran"),
    pytest.param("pd_recompute", lambda r: fail_op(r, 4, "http_500"), "deviation", ("fail_fast",),
                 id="hole_recompute_failure_without_error_phase"),
    pytest.param("pd_recompute", lambda r: fail_op(r, 4, "connect", phase="info", code="ConnectionResetError"),
                 "deviation", ("fail_fast",), id="hole_recompute_connection_reset"),
    pytest.param("pd", h_duplicate_op_id, "error", ("harness_integrity",), id="hole_duplicate_op_id_hides_a_failure"),
    pytest.param("pd", h_failure_without_invoke_record, "error", ("harness_integrity", "failures_explained"),
                 id="hole_failure_without_invoke_record_is_explained"),
    pytest.param("pd", h_final_probe_without_baseline, "error", ("no_leaks",), id="hole_final_probe_without_baseline"),
]


@pytest.mark.parametrize("base_name, mutate, want, killers", HOLES)
def test_hole(base_name: str, mutate, want: str, killers: tuple, tmp_path) -> None:
    run = base(base_name)
    mutate(run)
    run.retally()
    j = judge(run, tmp_path)
    assert j.outcome == want, j.why()
    assert set(killers) <= set(j.failing), j.why()


def f_drop_failed_op(run: Run) -> None:
    """A failure deleted from the history (the client counted it)."""
    first = ok_ops(run)[-1]["id"]
    fail_op(run, first, "http_502", "decode")
    run.retally()
    run.remove(lambda r: r.get("type") == "op" and r.get("id") == first)


def f_duplicate_ok_op(run: Run) -> None:
    """A success copied under a new id to outweigh failures."""
    first = ok_ops(run)[0]["id"]
    inv, done = dict(run.invoke(first)), dict(run.completion(first))
    inv["id"] = done["id"] = 999
    run.add(inv, done)


def f_rewrite_value_and_expected(run: Run) -> None:
    """A wrong completion made to look right by rewriting its reference in the journal too."""
    first = ok_ops(run)[0]["id"]
    run.completion(first)["value"] = "wrong text"
    run.invoke(first)["expected"] = "wrong text"


def f_cpu_backwards(run: Run) -> None:
    """prefill's CPU time mirrored during the fault: it runs backwards, the burn reads negative."""
    samples = [p for p in run.probes("decode:0", "sample")]
    top = max(p["counters"]["cpu_s"] for p in samples) + 100
    for p in samples:
        p["counters"]["cpu_s"] = top - p["counters"]["cpu_s"]


def f_tally_not_a_count(run: Run) -> None:
    fail_op(run, ok_ops(run)[-1]["id"], "http_502", "decode")
    run.retally()
    c = run.probe("client", "final")["counters"]
    run.remove(lambda r: r.get("type") == "op" and r.get("id") == ok_ops(run)[0]["id"])
    c["ops"] = float(c["ops"] - 1)  # 25.0: not the workload's count


def f_no_tally(run: Run) -> None:
    run.probe("client", "final")["counters"].pop("ops")


def f_completion_renames_its_op(run: Run) -> None:
    """A failure the op-type filter would hide: its completion says another ``f`` than its
    invoke, and the client's counts leave it out (helper-15: recovery and failed_where_faulted
    read only the workload's main ops)."""
    first = ok_ops(run)[-1]["id"]
    fail_op(run, first, "http_502", "decode")
    run.completion(first)["f"] = "warmup"
    run.retally()


def f_op_of_an_unknown_kind(run: Run) -> None:
    """A failure relabelled, invoke and completion alike, as an op kind the workload never writes."""
    first = ok_ops(run)[-1]["id"]
    fail_op(run, first, "http_502", "decode")
    run.invoke(first)["f"] = run.completion(first)["f"] = "warmup"
    run.retally()


def f_completion_moves_its_invoke(run: Run) -> None:
    """A completion that carries its own ``t_invoke`` (into a fault window) over the invoke's time."""
    first = ok_ops(run)[-1]["id"]
    fail_op(run, first, "http_502", "decode")
    run.retally()
    run.completion(first)["t_invoke"] = T0 + PD_WINDOW[0] + 0.1


def f_infinite_baseline(run: Run) -> None:
    """A node that leaked, its baseline made infinite so nothing can exceed it."""
    b, f = run.probe("decode:0", "baseline"), run.probe("decode:0", "final")
    f["threads"], f["fds"] = f["threads"] + 40, f["fds"] + 90
    b["threads"] = b["fds"] = math.inf


def f_kill_outside_every_window(run: Run) -> None:
    """A node's final probe removed and a kill event of its pid written after every window: no
    fault killed it, so nothing excuses the missing probe."""
    pid = PD_PIDS["proxy"]
    run.remove(lambda r: r.get("type") == "probe" and r.get("node") == "proxy" and r.get("when") == "final")
    run.add(event("process_kill", PD_WINDOW[1] + 1.0, kind="pd-proxy", role="proxy", pid=pid))
    run.sort()


# forged histories: no workload wrote them (the client's own tally is not updated); each is a
# harness error or a deviation, never "as expected"
FORGERIES = [
    pytest.param("pd", lambda r: fail_op(r, ok_ops(r)[-1]["id"], "http_502", "decode"), "error", ("harness_integrity",),
                 id="forged_failure_the_client_never_counted"),
    pytest.param("golden_pd_baseline", f_drop_failed_op, "error", ("harness_integrity",),
                 id="forged_failed_op_deleted_golden_pd"),
    pytest.param("pd", f_duplicate_ok_op, "error", ("harness_integrity",), id="forged_ok_op_duplicated"),
    pytest.param("pd", lambda r: r.completion(ok_ops(r)[0]["id"]).update(status=502), "deviation", ("correct_output",),
                 id="forged_ok_op_without_http_200"),
    pytest.param("golden_pd_baseline", f_rewrite_value_and_expected, "deviation", ("correct_output",),
                 id="forged_value_and_expected_rewritten_golden_pd"),
    # found by a helper trying to fool the checks (helper-7)
    pytest.param("pd", f_cpu_backwards, "error", ("no_busy_wait",), id="forged_cpu_time_runs_backwards"),
    pytest.param("pd", f_tally_not_a_count, "error", ("harness_integrity",), id="forged_tally_as_a_float"),
    pytest.param("pd", f_no_tally, "error", ("harness_integrity",), id="forged_tally_removed"),
    # found by helper-15
    pytest.param("pd", f_completion_renames_its_op, "error", ("harness_integrity",), id="forged_completion_renames_op"),
    pytest.param("pd", f_op_of_an_unknown_kind, "error", ("harness_integrity",), id="forged_op_of_an_unknown_kind"),
    pytest.param("pd", f_completion_moves_its_invoke, "error", ("harness_integrity",),
                 id="forged_completion_carries_t_invoke"),
    pytest.param("pd", f_infinite_baseline, "error", ("no_leaks",), id="forged_infinite_baseline"),
    pytest.param("pd", f_kill_outside_every_window, "error", ("harness_integrity", "no_leaks", "node_alive"),
                 id="forged_kill_event_outside_every_window"),
]


@pytest.mark.parametrize("base_name, mutate, want, killers", FORGERIES)
def test_forged_history_is_caught(base_name: str, mutate, want: str, killers: tuple, tmp_path) -> None:
    run = base(base_name)
    mutate(run)
    j = judge(run, tmp_path)
    assert j.outcome == want, j.why()
    assert set(killers) <= set(j.failing), j.why()


def test_meta_line_is_rebuilt_from_the_scenario_file(tmp_path, monkeypatch) -> None:
    """pdchaos check reads what the checks need besides the history (expectation, options,
    applicability, the effect each fault must show) from the scenario file the meta line names,
    when it is here: a history that edits its own meta line cannot lower its bar."""
    from mutants.histories import PD_STOP_YAML

    here = tmp_path / "here"
    (here / "scenarios" / "mutants").mkdir(parents=True)
    (here / "scenarios" / "mutants" / "mut-pd-stop-prefill.yaml").write_text(
        PD_STOP_YAML.format(target="hardened", policy="fail"))

    def run_with_file() -> Run:
        return base("pd")  # its scenario is found by name under ./scenarios/ (below: cwd = here)

    def judged(run: Run) -> Judgement:
        from harness.cli.check import recheck
        from mutants.histories import write_run

        d = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        write_run(run, d)
        [row] = recheck(d)
        return Judgement(row["verdict"], tuple(row.get("failing") or ()), row["outcome"],
                         {c["name"]: c for c in row["checks"]}, row.get("reason", ""))

    def far_failure(run: Run) -> None:
        fail_op(run, far_ok_ops(run, 1)[0]["id"], "http_500", "decode")
        run.retally()

    monkeypatch.chdir(here)
    # an unexplained failure, with the meta line expecting exactly that failure
    forged = run_with_file()
    far_failure(forged)
    forged.meta["expect"] = "fail[failures_explained]"
    j = judged(forged)
    assert j.outcome == "deviation" and "failures_explained" in j.failing, j.why()
    # ... the same edit where no scenario of that name is here: an error, unless the saved line is
    # trusted on purpose (--trust-saved-meta)
    monkeypatch.chdir(tmp_path)
    saved = base("pd")
    far_failure(saved)
    saved.meta["expect"] = "fail[failures_explained]"
    j = judged(saved)
    assert j.outcome == "error" and "cannot be rebuilt" in j.reason, j.why()
    assert judge(saved, tmp_path).outcome == "as_expected"  # trusted
    monkeypatch.chdir(here)
    # a journal naming a file of its own: ignored, the scenario is looked up by name
    own = run_with_file()
    far_failure(own)
    mine = tmp_path / "mine.yaml"
    mine.write_text(PD_STOP_YAML.format(target="hardened", policy="fail").replace(
        "hardened: pass", "hardened: {verdict: fail, failing: [failures_explained]}"))
    own.meta["file"] = str(mine)
    assert judged(own).outcome == "deviation"
    # a meta line that switches a check off, or lowers a fault's required effect
    off = run_with_file()
    far_failure(off)
    off.meta["checks"]["failures_explained"] = {"enabled": False}
    assert judged(off).outcome == "deviation"
    lowered = run_with_file()
    effect_event(lowered).update(effect={"acted": 0, "seen": 0}, required={})
    for f in lowered.meta["faults"]:
        f["required"] = {}
    j = judged(lowered)
    assert j.outcome == "error" and "fault_effect" in j.failing, j.why()


@pytest.mark.parametrize("mutate", [
    pytest.param(lambda r: r.completion(5).pop("phase"), id="op_completion_without_phase"),
    pytest.param(lambda r: r.invoke(5).pop("id"), id="op_without_id"),
    pytest.param(lambda r: next(x for x in r.records if x.get("type") == "fault").pop("t"),
                 id="fault_record_without_t"),
])
def test_malformed_record_is_an_error_not_a_crash(mutate, tmp_path) -> None:
    run = base("pd")
    mutate(run)
    j = judge(run, tmp_path)
    assert j.outcome == "error", j.why()


def test_nan_survives_the_journal(tmp_path) -> None:
    """The NaN holes are real journal content: the writer and reader keep NaN (json allows it)."""
    run = base("pd")
    h_nan_kv_usage(run)
    J.write_journal(tmp_path / "j.jsonl", run.records)
    back = J.read_journal(tmp_path / "j.jsonl")
    fin = next(r for r in back if r.get("type") == "probe" and r.get("node") == "decode:0" and r.get("when") == "final")
    assert math.isnan(fin["counters"]["kv_cache_usage_perc"])


def test_a_stop_record_can_only_shorten_its_windows_tail() -> None:
    """``Fault.tail_after_heal`` goes into the stop record; failures_explained takes the shorter."""
    recs = [{"type": "fault", "id": 0, "name": "x", "phase": "start", "t": 1.0},
            {"type": "fault", "id": 0, "name": "x", "phase": "stop", "t": 2.0, "tail_s": 1.0}]
    w = J.fault_windows(recs)[0]
    assert w["tail_s"] == 1.0
    assert C.window_tail_s(w, {"tail_s": 1e9}) == 1.0
    assert C.window_tail_s(w, {"tail_s": 0.5}) == 0.5  # never longer than declared
    for odd in (-1.0, math.nan, True, "1", None):
        assert C.window_tail_s(dict(w, tail_s=odd), {"tail_s": 3.0}) == 3.0
    assert C.in_window(2.9, 3.5, w, 1.0) and not C.in_window(3.1, 3.5, w, 1.0)


def test_windows_are_where_the_builders_say() -> None:
    assert [(w["start"] - T0, w["stop"] - T0) for w in base("pd").windows()] == [PD_WINDOW]
    assert [(round(w["start"] - T0, 3), round(w["stop"] - T0, 3)) for w in base("lookup").windows()] == [LOOKUP_WINDOW]


def test_recheck_holds_the_folder_to_its_journal(tmp_path) -> None:
    """Found by a helper trying to fool the checks: a journal copied into another scenario's or
    target's folder, a run the summary lists whose journal is gone, and a 'skipped' run with ops
    are errors, never as expected."""
    import json as _json

    from harness.cli.check import recheck
    from mutants.histories import write_run

    def rows(run: Run, move: tuple[str, str] | None = None, summary: list | None = None) -> list[dict]:
        d = tmp_path / f"r{len(list(tmp_path.iterdir()))}"
        src = write_run(run, d)
        if move:
            dst = d / move[0] / move[1]
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(src), str(dst))
        if summary is not None:
            (d / "summary.json").write_text(_json.dumps({"results": summary}))
        return recheck(d, trust_saved_meta=True)

    [row] = rows(base("pd"), move=("pd-kill-prefill-before-pull", "hardened"))
    assert row["outcome"] == "error" and "not this folder's" in row["reason"]
    [row] = rows(base("pd"), move=(base("pd").meta["scenario"], "upstream"))  # meta.target swapped
    assert row["outcome"] == "error" and "not this folder's" in row["reason"]
    run = base("pd")
    gone = [{"scenario": "pd-partition-prefill-decode", "target": "upstream", "verdict": "fail",
             "dir": "pd-partition-prefill-decode/upstream"}]
    out = rows(run, summary=gone)
    assert [r["outcome"] for r in out] == ["as_expected", "error"] and "journal is not" in out[1]["reason"]
    skipped = base("pd")
    skipped.meta["skipped"] = "toxiproxy-server missing"
    [row] = rows(skipped)
    assert row["outcome"] == "error" and "holds ops" in row["reason"]


def test_the_rebuilt_meta_line_says_what_the_run_said() -> None:
    """pdchaos check rebuilds a run's meta line from its scenario: a delay under half the client
    deadline declares no failure category, as the run's own fault instance (over its topology)
    does; without the deadline the rebuilt line expected timeouts that never come (found when the
    recorded CI runs were re-judged: backend-slow and toxic-latency-below-deadline deviated)."""
    from harness.runner import scenario_meta
    from harness.schema import load_scenario

    root = Path(__file__).resolve().parents[2] / "scenarios"
    for f in ("network/toxic-latency-below-deadline.yaml", "lookup/backend-slow.yaml"):
        m = scenario_meta(load_scenario(root / f), "hardened")
        assert [x["categories"] for x in m["faults"]] == [[]] * len(m["faults"]), f
