"""Every checker on small hand-written histories: each one passes a good history and fails a bad one.

The checkers are pure functions over journal records, so no process is needed here; the runner
tests prove that real runs produce such records.
"""

from __future__ import annotations

import pytest

from harness import checks as C

T0 = 100.0


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


def probe(node: str, when: str, pid: int = 1, threads: int = 4, fds: int = 10, counters=None, alive=True) -> dict:
    return {"type": "probe", "node": node, "when": when, "pid": pid, "threads": threads, "fds": fds,
            "counters": counters or {}, "alive": alive, "t": T0}


def run(name: str, records: list[dict], opts=None, **kw) -> C.CheckResult:
    return C.CHECKS[name](C.CheckInput(records, **kw), opts or {})


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
    assert run("recovery", [meta(), *op(1, 0)]).ok is None


def test_exactly_one_reply_and_server_alive() -> None:
    ok = {"requests": 10, "replies": 10, "ok": 7, "protocol": 2, "backend_error": 1}
    hist = [meta(), probe("server", "baseline"), probe("server", "final", counters=ok)]
    assert run("exactly_one_reply", hist).ok is True
    lost = dict(ok, requests=11)
    assert run("exactly_one_reply", [meta(), probe("server", "final", counters=lost)]).ok is False
    ev = {"type": "event", "what": "malformed_requests", "t": T0, "sent": 20, "answered": 19, "unanswered": 1}
    assert run("exactly_one_reply", [meta(), ev]).ok is False
    assert run("server_alive", hist).ok is True
    assert run("server_alive", [meta(), probe("server", "final", alive=False)]).ok is False
    assert run("server_alive", [meta()]).ok is False


def test_no_leaks() -> None:
    good = [meta(), probe("server", "baseline"), probe("server", "final"), probe("client", "baseline", pid=2),
            probe("client", "final", pid=2)]
    assert run("no_leaks", good).ok is True
    leak = [meta(), probe("server", "baseline"), probe("server", "final", threads=5)]
    r = run("no_leaks", leak)
    assert r.ok is False and "threads 4 -> 5" in r.message
    assert run("no_leaks", leak, {"slack": 1}).ok is True
    # a restarted server is compared with its own baseline (same pid)
    restarted = [meta(), probe("server", "baseline", pid=1), probe("server", "baseline", pid=7, fds=12),
                 probe("server", "final", pid=7, fds=12)]
    assert run("no_leaks", restarted).ok is True


def test_log_hygiene() -> None:
    key = "ab" * 32
    assert run("log_hygiene", [meta()], logs={"a.log": "lookup rpc timeout: code=TIMEOUT hashes=3"},
               preload=[key]).ok is True
    r = run("log_hygiene", [meta()], logs={"a.log": f"bad {key[:20]}"}, preload=[key])
    assert r.ok is False and "a.log" in r.message
    assert run("log_hygiene", [meta()], logs={"b.log": "x " + "f" * 40}).ok is False


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
    assert run("metrics_match", [meta(target="legacy")]).ok is None


def test_no_stall_and_verdict() -> None:
    good = [meta(), *op(1, 0)]
    assert run("no_stall", good).ok is True
    stalled = [meta(), *op(1, 0, complete=False)]
    assert run("no_stall", stalled).ok is False
    assert C.verdict(C.run_checks(C.CheckInput(stalled), {})) == "stall"
    wrong = [meta(), *op(1, 0, value=3)]
    assert C.verdict(C.run_checks(C.CheckInput(wrong), {})) == "fail"


@pytest.mark.parametrize("name", sorted(C.CHECKS))
def test_every_check_can_be_disabled(name: str) -> None:
    results = C.run_checks(C.CheckInput([meta(), *op(1, 0)]), {name: {"enabled": False}})
    assert name not in {r.name for r in results}


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
    w = meta(workload={"rate": 10, "duration": 1.0})
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


def test_harness_integrity() -> None:
    assert run("harness_integrity", [meta()]).ok is True
    for what in ("fault_error", "probe_failed", "leftovers", "nemesis_stuck"):
        r = run("harness_integrity", [meta(), {"type": "event", "what": what, "t": T0, "error": "x"}])
        assert r.ok is False and what in r.message


def test_exactly_one_reply_counts_replies_sent() -> None:
    sent = {"requests": 10, "replies": 9, "replies_watchdog": 1}
    assert run("exactly_one_reply", [meta(), probe("server", "final", counters=sent)]).ok is True
    lost = {"requests": 10, "replies": 9, "replies_watchdog": 0}
    assert run("exactly_one_reply", [meta(), probe("server", "final", counters=lost)]).ok is False


def test_exactly_one_reply_subtracts_failed_sends() -> None:
    failed = {"requests": 10, "replies": 10, "replies_watchdog": 0, "send_failed": 1}
    assert run("exactly_one_reply", [meta(), probe("server", "final", counters=failed)]).ok is False
