"""Every checker on small hand-written histories: each one passes a good history and fails a bad one.

The checkers are pure functions over journal records, so no process is needed here; the runner
tests prove that real runs produce such records.
"""

from __future__ import annotations

import pytest

from harness import checks as C
from harness.family import get_family
from harness import verdicts as V
from harness.verdicts import ERROR_CHECKS

T0 = 100.0
CHECKS = C.checks_for(get_family("lookup"))  # the generic checks and the lookup family's


def meta(**kw) -> dict:
    base = {"type": "meta", "scenario": "s", "target": "hardened", "deadline_ms": 200.0, "tolerance_ms": 150.0,
            "t0": T0, "faults": [], "checks": {}}
    base.update(kw)
    return base


def op(i: int, t: float, *, phase: str = "ok", value=16, expected=16, outcome: str = "ok", elapsed_ms: float = 1.0,
       complete: bool = True, f: str = "lookup") -> list[dict]:
    recs = [{"type": "op", "id": i, "process": 0, "f": f, "phase": "invoke", "t": T0 + t, "kind": "full",
             "expected": expected}]
    if complete:
        recs.append({"type": "op", "id": i, "process": 0, "f": f, "phase": phase, "t": T0 + t + elapsed_ms / 1000,
                     "value": value, "outcome": outcome, "code": "", "elapsed_ms": elapsed_ms})
    return recs


def fault(i: int, name: str, start: float, stop: float) -> list[dict]:
    return [{"type": "fault", "id": i, "name": name, "phase": "start", "t": T0 + start, "params": {}},
            {"type": "fault", "id": i, "name": name, "phase": "stop", "t": T0 + stop}]


def probe(node: str, when: str, pid: int = 1, threads: int = 4, fds: int = 10, counters=None, alive=True,
          kind: str | None = None, t: float = 0.0) -> dict:
    kind = kind or {"server": "lookup-server", "client": "workload"}.get(node, node)
    return {"type": "probe", "node": node, "kind": kind, "when": when, "pid": pid, "threads": threads, "fds": fds,
            "counters": counters or {}, "alive": alive, "t": T0 + t}


def event(what: str, **kw) -> dict:
    return {"type": "event", "what": what, "t": T0, **kw}


def run(name: str, records: list[dict], opts=None, **kw) -> C.CheckResult:
    return CHECKS[name](C.CheckInput(records, **kw), opts or {})


def test_bounded_return() -> None:
    good = [meta(), *op(1, 0.1, elapsed_ms=200), *op(2, 0.2, phase="fail", value=0, outcome="timeout", elapsed_ms=349)]
    assert run("bounded_return", good).ok is True
    late = [meta(), *op(1, 0.1, phase="fail", value=0, outcome="timeout", elapsed_ms=351)]
    r = run("bounded_return", late)
    assert r.ok is False and "op 1" in r.message and r.details["limit_ms"] == 350
    stalled = [meta(), *op(1, 0.1, complete=False)]
    assert run("bounded_return", stalled).ok is False
    assert run("bounded_return", late, {"tolerance_ms": 200}).ok is True


def test_fail_open() -> None:
    assert run("fail_open", [meta(), *op(1, 0, phase="fail", value=0, outcome="timeout")]).ok is True
    assert run("fail_open", [meta(), *op(1, 0, phase="fail", value=5, outcome="protocol")]).ok is False
    assert run("fail_open", [meta(), *op(1, 0, phase="info", value=None, outcome="raised")]).ok is False


def test_correct_hits() -> None:
    assert run("correct_hits", [meta(), *op(1, 0, value=16, expected=16)]).ok is True
    r = run("correct_hits", [meta(), *op(1, 0, value=0, expected=16)])
    assert r.ok is False and "expected 16" in r.message
    # a failed op is not judged by correct_hits (fail_open covers it)
    assert run("correct_hits", [meta(), *op(1, 0, phase="fail", value=0, expected=16, outcome="timeout"),
                                *op(2, 1, value=16)]).ok is True


def test_recovery() -> None:
    hist = [meta(), *fault(0, "slow_peer", 1.0, 2.0), *op(1, 1.5, phase="fail", value=0, outcome="timeout"),
            *op(2, 2.1)]
    assert run("recovery", hist).ok is True
    bad = [meta(), *fault(0, "slow_peer", 1.0, 2.0), *op(2, 2.1, phase="fail", value=0, outcome="timeout"),
           *op(3, 2.2)]
    assert run("recovery", bad).ok is False
    assert run("recovery", bad, {"within": 2}).ok is True
    # ops after the window but inside the next one do not count against the first
    nxt = [meta(), *fault(0, "a", 1.0, 2.0), *fault(1, "b", 2.05, 3.0),
           *op(2, 2.1, phase="fail", value=0, outcome="timeout"), *op(3, 3.1)]
    assert run("recovery", nxt).ok is True


def test_exactly_one_reply_and_node_alive() -> None:
    ok = {"requests": 10, "replies": 10, "ok": 7, "protocol": 2, "backend_error": 1}
    hist = [meta(), probe("server", "baseline"), probe("server", "final", counters=ok)]
    assert run("exactly_one_reply", hist).ok is True
    lost = dict(ok, requests=11)
    assert run("exactly_one_reply", [meta(), probe("server", "final", counters=lost)]).ok is False
    ev = {"type": "event", "what": "malformed_requests", "t": T0, "sent": 20, "answered": 19, "unanswered": 1}
    assert run("exactly_one_reply", [meta(), ev]).ok is False
    assert run("node_alive", hist).ok is True
    assert run("node_alive", [meta(), probe("server", "final", alive=False)]).ok is False
    assert run("node_alive", [meta()]).ok is False
    silent = [meta(), probe("interposer", "final"), event("probe_silent", role="server", when="final", pid=3)]
    r = run("node_alive", silent)
    assert r.ok is False and "server" in r.message


def test_no_leaks() -> None:
    good = [meta(), probe("server", "baseline"), probe("server", "final"), probe("client", "baseline", pid=2),
            probe("client", "final", pid=2)]
    assert run("no_leaks", good).ok is True
    leak = [meta(), probe("server", "baseline"), probe("server", "final", threads=5)]
    r = run("no_leaks", leak)
    assert r.ok is False and "threads 4 -> 5" in r.message
    assert run("no_leaks", leak, {"slack": 1}).ok is True
    # a restarted server is compared with its own baseline (same pid); the stopped one is not
    # (killed inside a fault's window: a kill event with no fault around it retires nothing)
    restarted = [meta(), probe("server", "baseline", pid=1), event("process_kill", pid=1),
                 probe("server", "baseline", pid=7, fds=12), probe("server", "final", pid=7, fds=12, t=1.0)]
    assert run("no_leaks", restarted + fault(0, "kill", -0.1, 0.1)).ok is True
    assert run("no_leaks", restarted).ok is False
    # the harness takes its final probes after every heal: one from before the last shows nothing
    r = run("no_leaks", restarted + fault(0, "kill", -0.1, 1.5))
    assert r.ok is False and r.message.startswith("cannot judge") and "before the last fault healed" in r.message


def test_log_hygiene() -> None:
    key = "ab" * 32
    pattern = get_family("lookup").log_pattern
    assert run("log_hygiene", [meta()], logs={"a.log": "lookup rpc timeout: code=TIMEOUT hashes=3"},
               secrets=[key], log_pattern=pattern).ok is True
    r = run("log_hygiene", [meta()], logs={"a.log": f"bad {key[:20]}"}, secrets=[key], log_pattern=pattern)
    assert r.ok is False and "a.log" in r.message
    assert run("log_hygiene", [meta()], logs={"b.log": "x " + "f" * 40}, log_pattern=pattern).ok is False
    # generic secrets (e.g. a prompt) and pieces of them, without any pattern
    prompt = "the quick brown fox jumps over the lazy dog"
    assert run("log_hygiene", [meta()], logs={"c.log": f"req {prompt}"}, secrets=[prompt]).ok is False
    assert run("log_hygiene", [meta()], logs={"c.log": "req 42 ok"}, secrets=[prompt]).ok is True


def test_metrics_match() -> None:
    m = meta(faults=[{"id": 0, "categories": ["timeout"]}])
    hist = [m, *fault(0, "slow_peer", 1.0, 2.0), *op(1, 0.5), *op(2, 1.2, phase="fail", value=0, outcome="timeout"),
            probe("client", "final", counters={"ok": 1, "timeout": 1})]
    assert run("metrics_match", hist).ok is True
    wrong_count = hist[:-1] + [probe("client", "final", counters={"ok": 1, "timeout": 2})]
    assert run("metrics_match", wrong_count).ok is False
    # a failure outside every fault window is unexplained
    outside = [m, *fault(0, "slow_peer", 1.0, 2.0), *op(1, 3.5, phase="fail", value=0, outcome="timeout"),
               probe("client", "final", counters={"timeout": 1})]
    assert run("metrics_match", outside).ok is False
    # a failure of another category than the fault causes is unexplained
    other = [m, *fault(0, "slow_peer", 1.0, 2.0), *op(1, 1.5, phase="fail", value=0, outcome="protocol"),
             probe("client", "final", counters={"protocol": 1})]
    assert run("metrics_match", other).ok is False
    # a fault that should cause timeouts but left none
    none = [m, *fault(0, "slow_peer", 1.0, 2.0), *op(1, 1.5), probe("client", "final", counters={"ok": 1})]
    assert run("metrics_match", none).ok is False
    # a fault may explain a category without having to cause it (a bandwidth limit)
    may = meta(faults=[{"id": 0, "categories": [], "explains": ["timeout"]}])
    maybe = [may, *fault(0, "bandwidth", 1.0, 2.0), *op(1, 1.5, phase="fail", value=0, outcome="timeout"),
             probe("client", "final", counters={"timeout": 1})]
    assert run("metrics_match", maybe).ok is True
    quiet = [may, *fault(0, "bandwidth", 1.0, 2.0), *op(1, 1.5), probe("client", "final", counters={"ok": 1})]
    assert run("metrics_match", quiet).ok is True


def test_metrics_match_explains_failed_resets_too() -> None:
    """A failed admin reset is a failure the client saw: no fault, no excuse (it used to be
    checked for lookups only); a fault's effect may be shown by a failed reset alone."""
    lookups = [*op(1, 0.5), *op(3, 1.8)]
    bare = [meta(primary_ops=["lookup"]), *lookups, *op(2, 1.0, phase="fail", value=False, expected=True, outcome="backend_error", f="reset"),
            probe("client", "final", counters={"ok": 2, "backend_error": 1})]
    r = run("metrics_match", bare)
    assert r.ok is False and "not explained" in r.message
    m = meta(primary_ops=["lookup"], faults=[{"id": 0, "categories": ["backend_error"]}])
    shown = [m, *fault(0, "stuck_puts", 0.9, 1.5), *lookups,
             *op(2, 1.0, phase="fail", value=False, expected=True, outcome="backend_error", f="reset"),
             probe("client", "final", counters={"ok": 2, "backend_error": 1})]
    assert run("metrics_match", shown).ok is True


def test_no_stall_and_verdict() -> None:
    good = [meta(), *op(1, 0)]
    assert run("no_stall", good).ok is True
    stalled = [meta(), *op(1, 0, complete=False)]
    assert run("no_stall", stalled).ok is False
    # the system's checks only: these hand-made histories have no end record, no probes and no
    # workload exit, so the error checks (harness_integrity, workload_ran) fail on them; no_leaks,
    # with no probe to compare, cannot judge (an error too)
    system = {k: v for k, v in CHECKS.items() if k not in ERROR_CHECKS and k != "no_leaks"}
    assert C.verdict(C.run_checks(C.CheckInput(stalled), {}, system)) == "stall"
    wrong = [meta(), *op(1, 0, value=3)]
    assert C.verdict(C.run_checks(C.CheckInput(wrong), {}, system)) == "fail"
    # with them, a history the harness did not finish cannot be judged: error, whatever else failed
    assert C.verdict(C.run_checks(C.CheckInput(stalled), {}, CHECKS)) == "error"
    assert C.verdict(C.run_checks(C.CheckInput(wrong), {}, CHECKS)) == "error"


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_every_check_can_be_disabled(name: str) -> None:
    """Every check but those whose failure makes the run a harness error (harness_integrity,
    workload_ran, and fault_effect once a fault is scheduled): those run even when disabled or
    marked not applicable."""
    results = C.run_checks(C.CheckInput([meta(), *op(1, 0)]), {name: {"enabled": False}}, CHECKS)
    if name in ERROR_CHECKS and name != "fault_effect":  # fault_effect: no fault in this meta
        assert name in {r.name for r in results}
        results = C.run_checks(C.CheckInput([meta(), *op(1, 0)]), {}, CHECKS, {name: "said not applicable"})
        assert next(r for r in results if r.name == name).ok is not None
    else:
        assert name not in {r.name for r in results}


def test_fault_effect_cannot_be_disabled_once_a_fault_is_scheduled() -> None:
    m = meta(faults=[{"id": 0, "type": "server_kill", "required": {"acted": 1, "seen": 1}}])
    hist = [m, *op(1, 0), *fault(0, "server_kill", 1.0, 2.0)]
    results = C.run_checks(C.CheckInput(hist), {"fault_effect": {"enabled": False}}, CHECKS)
    r = next(r for r in results if r.name == "fault_effect")
    assert r.ok is False and "reported no effect" in r.message


def test_recovery_is_per_worker() -> None:
    """One worker's success does not cover another worker that never recovers."""
    def op_w(i, t, worker, **kw):
        recs = op(i, t, **kw)
        for r in recs:
            r["process"] = worker
        return recs

    hist = [meta(), *fault(0, "slow_peer", 1.0, 2.0), *op_w(1, 2.01, 0),
            *op_w(2, 2.02, 1, phase="fail", value=0, outcome="timeout"), *op_w(3, 2.3, 1)]
    assert run("recovery", hist).ok is False
    assert run("recovery", hist, {"within": 2}).ok is True


def test_workload_ran() -> None:
    exit0 = {"type": "event", "what": "workload_exit", "t": T0, "returncode": 0}
    w = meta(planned_ops=10.0)
    good = [w, exit0, *[r for i in range(10) for r in op(i, i * 0.1)]]
    assert run("workload_ran", good).ok is True
    assert run("workload_ran", [w, exit0]).ok is False  # no op at all: nothing was tested
    assert run("workload_ran", [w, *op(1, 0)]).ok is False  # no record of the exit
    crashed = [w, {**exit0, "returncode": 4}, *[r for i in range(10) for r in op(i, i * 0.1)]]
    r = run("workload_ran", crashed)
    assert r.ok is False and "code 4" in r.message
    # a quarter of the planned ops is the floor, unless the target hung (no_stall reports that)
    assert run("workload_ran", [w, exit0, *op(1, 0), *op(2, 0.1)]).ok is False
    assert run("workload_ran", [w, {**exit0, "returncode": 3}, *op(1, 0), *op(2, 0.1, complete=False)]).ok is True


def end() -> dict:
    return {"type": "end", "t": T0 + 10, "reason": "done", "stalled": 0}


def test_harness_integrity() -> None:
    assert run("harness_integrity", [meta(), probe("server", "final"), end()]).ok is True
    for what in ("fault_error", "probe_failed", "leftovers", "nemesis_stuck", "probe_silent"):
        r = run("harness_integrity", [meta(), probe("server", "final"), event(what, error="x"), end()])
        assert r.ok is False and what in r.message
    # a journal the run did not finish writing
    r = run("harness_integrity", [meta(), probe("server", "final")])
    assert r.ok is False and "no end record" in r.message


def test_exactly_one_reply_counts_replies_sent() -> None:
    sent = {"requests": 10, "replies": 9, "replies_watchdog": 1}
    assert run("exactly_one_reply", [meta(), probe("server", "final", counters=sent)]).ok is True
    lost = {"requests": 10, "replies": 9, "replies_watchdog": 0}
    assert run("exactly_one_reply", [meta(), probe("server", "final", counters=lost)]).ok is False


def test_exactly_one_reply_subtracts_failed_sends() -> None:
    failed = {"requests": 10, "replies": 10, "replies_watchdog": 0, "send_failed": 1}
    assert run("exactly_one_reply", [meta(), probe("server", "final", counters=failed)]).ok is False


# --------------------------------------------------------------------------- vacuous passes
# Each history below passed before the families rework (a check that could not decide counted as
# holding, or looked at too little); each must fail now.


def test_metrics_match_a_fault_without_categories_explains_nothing() -> None:
    """A protocol failure inside a malformed_requests window (a fault that causes nothing in the
    workload's own lookups) is unexplained; it used to be explained by any category-less fault."""
    m = meta(faults=[{"id": 0, "categories": []}])
    hist = [m, *fault(0, "malformed_requests", 1.0, 2.0), *op(1, 1.5, phase="fail", value=0, outcome="protocol"),
            probe("client", "final", counters={"protocol": 1})]
    r = run("metrics_match", hist)
    assert r.ok is False and "not explained" in r.message


def test_exactly_one_reply_reads_every_server_instance() -> None:
    """A server swapped out (last probe) that lost replies, before the final server took over."""
    good = {"requests": 5, "replies": 5}
    lost = {"requests": 9, "replies": 5}
    hist = [meta(), probe("server", "baseline", pid=1), probe("server", "last", pid=1, counters=lost, t=1),
            probe("server", "baseline", pid=2, t=1.5), probe("server", "final", pid=2, counters=good, t=3)]
    r = run("exactly_one_reply", hist)
    assert r.ok is False and "pid 1" in r.message
    # one request in service when the server was stopped is allowed (and counted), not more
    one = {"requests": 6, "replies": 5}
    ok = [meta(), probe("server", "last", pid=1, counters=one, t=1), probe("server", "final", pid=2, counters=good)]
    r = run("exactly_one_reply", ok)
    assert r.ok is True and r.details["lost"] == 1
    # an instance probed at start and never again, and not killed: its replies are unknown
    unknown = [meta(), probe("server", "baseline", pid=1, counters={"requests": 0, "replies": 0}),
               probe("server", "final", pid=2, counters=good)]
    assert run("exactly_one_reply", unknown).ok is False
    killed = unknown + [event("process_kill", pid=1)]
    assert run("exactly_one_reply", killed + fault(0, "kill", -0.1, 0.1)).ok is True
    assert run("exactly_one_reply", killed).ok is False  # no fault killed it
    # a fake peer swapped in is no server under test: its counters are not judged
    fake = [meta(), probe("server", "last", pid=1, kind="fake-peer", counters={"requests": 9, "replies": 0}),
            probe("server", "final", pid=2, counters=good)]
    assert run("exactly_one_reply", fake).ok is True
    assert run("exactly_one_reply", [meta()]).ok is False  # nothing to judge is no pass


def test_recovery_without_an_op_after_the_window_fails() -> None:
    """Undecided used to count as holding."""
    hist = [meta(), *op(1, 0.5), *fault(0, "server_kill", 1.0, 2.0), *op(2, 1.5, phase="fail", value=0,
                                                                        outcome="timeout")]
    r = run("recovery", hist)
    assert r.ok is False and "no op was invoked after server_kill" in r.message
    # two windows with no op between them are judged as one period
    two = [meta(), *fault(0, "a", 1.0, 2.0), *fault(1, "b", 2.01, 3.0), *op(1, 3.1)]
    r = run("recovery", two)
    assert r.ok is True and r.details["joined"] == 1
    assert run("recovery", [meta(), *op(1, 0)]).ok is False  # faults scheduled but no window recorded


def test_recovery_schedule_without_room_is_a_validation_error(tmp_path) -> None:
    from harness.errors import UsageError
    from harness.schema import load_scenario

    f = tmp_path / "late.yaml"
    f.write_text("name: late\nfamily: lookup\nworkload: {duration: 2s, concurrency: 2, rate: 20}\n"
                 "faults:\n  - {type: server_kill, at: 1s, for: 950ms}\ntriggers: [{type: ops_in_window, fault: 0}]\n"
                 "expect: {hardened: pass, legacy: pass}\n")
    with pytest.raises(UsageError) as e:
        load_scenario(f)
    assert "recovery" in str(e.value) and f"{f}:1" in str(e.value)
    f.write_text(f.read_text() + "checks: {recovery: {enabled: false}}\n")
    assert load_scenario(f).name == "late"


def test_no_leaks_compares_every_node_that_had_a_baseline() -> None:
    """The interposer (or any node) with a baseline but no final probe, and not stopped during
    the run, used to be skipped."""
    hist = [meta(), probe("server", "baseline"), probe("server", "final", t=0.5),  # final: after every heal
            probe("interposer", "baseline", pid=5)]
    r = run("no_leaks", hist)
    assert r.ok is False and "interposer" in r.message
    swapped = hist + [event("process_stop", pid=5)]
    assert run("no_leaks", swapped + fault(0, "swap", -0.1, 0.1)).ok is True
    assert run("no_leaks", swapped).ok is False  # a stop no fault made excuses nothing
    silent = [meta(), probe("server", "baseline"), probe("server", "final"),
              event("probe_silent", role="fake", kind="fake-peer", pid=9, when="baseline")]
    assert run("no_leaks", silent).ok is False
    assert run("no_leaks", [meta()]).ok is False


def test_no_leaks_cannot_judge_a_probe_without_its_counts() -> None:
    """A probe without a usable thread or fd count (-1: /proc unreadable, missing, not a number), a
    final probe with no baseline, a silent probe: none shows a leak, and no_leaks used to fail
    plainly on them, so a saved upstream run of pd-abort-while-decode-waits (expected
    `pass|fail[no_leaks]`) read as expected with D's final thread count set to -1, or with the
    client's baseline probe gone. Now it cannot judge (an error); a leak a readable pair of probes
    shows still fails."""
    def verdict_of(hist: list[dict]) -> C.CheckResult:
        return run("no_leaks", hist)

    good = [meta(), probe("server", "baseline"), probe("server", "final")]
    for broken in ([meta(), probe("server", "baseline"), probe("server", "final", threads=-1)],
                   [meta(), probe("server", "baseline", fds=None), probe("server", "final")],
                   [meta(), probe("server", "final")],
                   good + [event("probe_silent", role="fake", kind="fake-peer", pid=9, when="final")],
                   [meta()]):
        r = verdict_of(broken)
        assert r.ok is False and r.message.startswith(V.UNDECIDED), r.message
        assert V.of_results([r])[0] == "error"
    leak = good[:2] + [probe("server", "final", threads=9), probe("client", "final", pid=2, threads=-1)]
    r = verdict_of(leak)
    assert r.ok is False and not r.message.startswith(V.UNDECIDED) and "threads 4 -> 9" in r.message, r.message


def test_bounded_return_counts_late_ops_over_all_ops() -> None:
    hist = [meta(primary_ops=["lookup"]), *op(1, 0.1), *op(2, 0.2, f="reset", elapsed_ms=900, value=True,
                                                              expected=True)]
    r = run("bounded_return", hist)
    assert r.ok is False and "1 of 2 ops" in r.message


def test_harness_integrity_needs_a_final_probe() -> None:
    r = run("harness_integrity", [meta(), end()])
    assert r.ok is False and "final probe" in r.message


def test_a_check_name_registered_twice_is_an_error() -> None:
    reg = C.CheckRegistry("a test registry")
    reg.check("x")(lambda inp, opts: C.CheckResult("", True, "ok"))
    with pytest.raises(TypeError, match="registered twice"):
        reg.check("x")(lambda inp, opts: C.CheckResult("", True, "ok"))
    with pytest.raises(TypeError, match="registered twice"):
        C.check("no_stall")(lambda inp, opts: C.CheckResult("", True, "ok"))


def test_undecided_fails_and_not_applicable_is_not_a_pass() -> None:
    checks = {"maybe": lambda inp, opts: C.CheckResult("maybe", None, "no data")}
    r = C.run_checks(C.CheckInput([meta()]), {}, checks)[0]
    assert r.ok is False and r.message.startswith("undecided")
    r = C.run_checks(C.CheckInput([meta()]), {}, checks, {"maybe": "legacy keeps no counters"})[0]
    assert r.ok is None and r.message.startswith("not applicable")
    assert C.verdict([r]) == "pass"  # ignored by the verdict, and shown as n/a in the reports


def test_checks_do_not_pass_on_an_empty_history() -> None:
    for name in ("no_stall", "fail_open", "correct_hits", "bounded_return", "node_alive", "no_leaks",
                 "harness_integrity", "exactly_one_reply"):
        assert run(name, [meta()]).ok is False, name
    # admin resets alone do not show that lookups return correct hits
    reset_only = [meta(primary_ops=["lookup"]), *op(1, 0, f="reset", value=True, expected=True)]
    assert run("correct_hits", reset_only).ok is False
    # a malformed_requests fault that sent nothing shows nothing
    none_sent = [meta(), event("malformed_requests", sent=0, answered=0, unanswered=0)]
    assert run("exactly_one_reply", none_sent).ok is False


def test_node_alive_needs_every_started_node_accounted_for() -> None:
    hist = [meta(), probe("server", "baseline", pid=1), probe("interposer", "baseline", pid=2),
            probe("server", "final", pid=1, t=0.5)]  # final: after every heal
    r = run("node_alive", hist)
    assert r.ok is False and "interposer" in r.message
    assert run("node_alive", hist + [probe("interposer", "final", pid=2, t=0.5)]).ok is True
    assert run("node_alive", hist + [event("process_stop", pid=2)] + fault(0, "swap", -0.1, 0.1)).ok is True
    assert run("node_alive", hist + [event("process_stop", pid=2)]).ok is False


def test_reset_done_needs_the_scheduled_reset_its_count_and_misses_after_it() -> None:
    """The admin reset a scenario schedules is the trigger its claim rests on: a history without it
    cannot be judged; a reset the client saw succeed must be counted by the server, and the lookups
    after it expect no pool hit (the device's own prefix, hbm_hit_tokens, still counts)."""
    m = meta(primary_ops=["lookup"], workload={"reset_at": 1.0})
    after_hbm = op(3, 1.5, value=32, expected=32)
    after_hbm[0]["hbm_hit_tokens"] = 32
    good = [m, *op(1, 0.5), *op(2, 1.0, value=True, expected=True, f="reset"), *after_hbm,
            probe("server", "final", counters={"resets": 1})]
    assert run("reset_done", good).ok is True
    no_reset = [m, *op(1, 0.5), *op(3, 1.5, value=0, expected=0), probe("server", "final", counters={"resets": 0})]
    r = run("reset_done", no_reset)
    assert r.ok is False and r.message.startswith("cannot judge") and "never fired" in r.message
    uncounted = [m, *op(1, 0.5), *op(2, 1.0, value=True, expected=True, f="reset"),
                 probe("server", "final", counters={"resets": 0})]
    r = run("reset_done", uncounted)
    assert r.ok is False and "the servers counted 0" in r.message
    pool_hit = [m, *op(1, 0.5), *op(2, 1.0, value=True, expected=True, f="reset"), *op(3, 1.5, value=16, expected=16),
                probe("server", "final", counters={"resets": 1})]
    r = run("reset_done", pool_hit)
    assert r.ok is False and "expect a pool hit" in r.message
    # a server that keeps no counters (upstream's): the count is not asked for, the rest still is
    assert run("reset_done", [m, *op(2, 1.0, value=True, expected=True, f="reset"), *op(3, 1.5, value=0, expected=0),
                              probe("server", "final")]).ok is True


# --------------------------------------------------------------------------- triggers (issue 43, item 6)

def _started(fid: int = 0, t: float = 1.001) -> dict:
    return {"type": "event", "what": "fault_started", "id": fid, "t": T0 + t}


KILL = {"id": 0, "type": "server_kill"}


def test_triggers_no_longer_pass_a_history_that_declares_none():
    hist = [*op(1, 0.5), *op(2, 1.5)]
    for declared in (None, []):  # a journal written before declarations were required
        r = run("triggers", [meta(triggers=declared), *hist])
        assert r.ok is False and "no trigger declared" in r.message, r.message
    r = run("triggers", [meta(triggers=[], faults=[KILL]), *hist, *fault(0, "server_kill", 1.0, 2.0), _started()])
    assert r.ok is False and "no trigger declared" in r.message
    r = run("triggers", [meta(triggers={"bogus": 1}), *hist])
    assert r.ok is False and r.message.startswith(C.UNDECIDED), r.message


def test_none_is_not_applicable_without_faults_and_an_error_with_them():
    hist = [*op(1, 0.5), *op(2, 1.5)]
    said = {"none": "baseline without faults"}
    na = {"triggers": "none declared: baseline without faults"}
    r = next(x for x in C.run_checks(C.CheckInput([meta(triggers=said), *hist]), {}, CHECKS, na) if x.name == "triggers")
    assert r.ok is None and r.message == "not applicable: none declared: baseline without faults"
    # the mark alone is not enough: the meta line must say none, with that reason
    for other in ([], {"none": " "}, {"none": "another reason"}):
        r = next(x for x in C.run_checks(C.CheckInput([meta(triggers=other), *hist]), {}, CHECKS, na)
                 if x.name == "triggers")
        assert r.ok is False, (other, r.message)
    # called without the mark (the runner always gives it): not judged, so not a pass
    assert run("triggers", [meta(triggers=said), *hist]).ok is False
    # a fault scheduled: none is refused, with or without the mark, and the run is an error
    faulted = [meta(triggers=said, faults=[KILL]), *hist, *fault(0, "server_kill", 1.0, 2.0), _started()]
    results = C.run_checks(C.CheckInput(faulted), {}, CHECKS, na)
    r = next(x for x in results if x.name == "triggers")
    assert r.ok is False and "cannot say none" in r.message, r.message
    assert C.verdict(results) == "error"


def test_ops_in_window_and_ops_completed_fire_on_their_events_only():
    from harness.triggers import GENERIC

    hist = [meta(faults=[KILL], primary_ops=["lookup"]), *fault(0, "server_kill", 1.0, 2.0), _started(),
            *op(1, 0.5), *op(2, 1.5), *op(3, 1.6, f="reset", value=True, expected=True, elapsed_ms=50.0)]
    inp = C.CheckInput(hist)
    win, done = GENERIC.predicates["ops_in_window"], GENERIC.predicates["ops_completed"]
    assert win(inp, {"fault": 0, "min": 1}).fired and not win(inp, {"fault": 0, "min": 2}).fired
    assert win(inp, {"fault": 0, "f": "reset"}).fired
    got = done(inp, {"f": "reset", "min": 1})
    assert got.fired and "1 of 1 reset ops" in got.evidence, got.evidence
    assert done(inp, {"min": 2}).fired and not done(inp, {"min": 3}).fired  # the two lookups
    # a restart is its start: the lookup in flight while it ran (before it returned) met it
    restart = [meta(faults=[KILL], primary_ops=["lookup"]), *fault(0, "server_restart", 1.0, 1.3),
               _started(t=1.3), *op(1, 1.1, elapsed_ms=100.0), *op(2, 2.0)]
    got = win(C.CheckInput(restart), {"fault": 0})
    assert not got.fired, got.evidence  # ended before the restart returned
    got = win(C.CheckInput(restart), {"fault": 0, "since_start": True})
    assert got.fired and "from its start" in got.evidence, got.evidence
    # a reset that never came back, or never went out, is no reset the claim can rest on
    stalled = [r for r in hist if not (r.get("id") == 3 and r.get("phase") != "invoke")]
    got = done(C.CheckInput(stalled), {"f": "reset", "min": 1})
    assert not got.fired and "0 of 1 reset ops" in got.evidence, got.evidence
    assert not done(C.CheckInput([r for r in hist if r.get("id") != 3]), {"f": "reset"}).fired
