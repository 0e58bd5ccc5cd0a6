"""The lookup family's checks (generic ones are in harness/checks.py)."""

from __future__ import annotations

from harness.checks import CheckInput, CheckResult, _first, _r, retired_pids, undecided

from .family import FAMILY

check = FAMILY.checks.check

FAIL_CATEGORIES = ("timeout", "transport", "protocol", "server_error", "backend_error", "bad_call")


@check("fail_open")
def fail_open(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """No lookup raised: every failed one returned 0 (a miss), as the scheduler needs."""
    if not inp.ops:
        return _r(False, "no lookup in the history: nothing shows the client fails open")
    raised = [o for o in inp.all_ops if o.get("outcome") == "raised"]
    nonzero = [o for o in inp.all_ops if o.get("phase") == "fail" and o.get("value") not in (0, False)]
    failed = [o for o in inp.all_ops if o.get("phase") == "fail"]
    if raised:
        o = raised[0]
        return _r(False, f"{len(raised)} ops raised to the caller; op {o['id']}: {o.get('code')}",
                  raised=_first([o["id"] for o in raised]))
    if nonzero:
        o = nonzero[0]
        return _r(False, f"{len(nonzero)} failed ops returned non-zero; op {o['id']} returned {o.get('value')}",
                  nonzero=_first([o["id"] for o in nonzero]))
    return _r(True, f"no op raised; {len(failed)} failed ops all returned 0", failed=len(failed))


@check("correct_hits")
def correct_hits(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """Every successful op returned exactly the expected hit (lookups) or reset (admin ops)."""
    ok_ops = [o for o in inp.all_ops if o.get("phase") == "ok"]  # lookups and admin resets
    wrong = [o for o in ok_ops if o.get("value") != o.get("expected")]
    if not any(o.get("phase") == "ok" for o in inp.ops) and not wrong:
        return _r(False, "no successful lookup: nothing returned a hit that could be checked")
    if wrong:
        o = wrong[0]
        return _r(False, f"{len(wrong)} of {len(ok_ops)} successful ops returned a wrong hit; op {o['id']} "
                         f"({o.get('kind')}) returned {o.get('value')}, expected {o.get('expected')}",
                  wrong=_first([o["id"] for o in wrong]))
    if not ok_ops:
        return _r(False, "no successful op: nothing returned a hit that could be checked")
    return _r(True, f"all {len(ok_ops)} successful ops returned the expected hit")


@check("reset_done")
def reset_done(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """The admin reset the workload was to make (``workload.reset_at``) is in the history: the trigger
    every reset claim rests on (a history without it cannot be judged: the run is an error). A reset
    the client saw succeed was counted by the server (where the server keeps counters: ``resets`` in
    its final probes), and every later lookup of the same worker expects a miss in the pool (no more than
    its ``hbm_hit_tokens``, the prefix already on the device)."""
    at = (inp.meta.get("workload") or {}).get("reset_at")
    if at is None:
        return _r(True, "the workload schedules no reset (workload.reset_at): nothing to judge")
    resets = [o for o in inp.all_ops if o.get("f") == "reset"]
    if not resets:
        return undecided(f"the workload was to reset at {at:g} s and the history holds no reset: the trigger "
                         "never fired")
    ok = [o for o in resets if o.get("phase") == "ok"]
    counted = [(p.get("counters") or {})["resets"] for p in inp.probes
               if p.get("when") == "final" and "resets" in (p.get("counters") or {})]
    if ok and counted and sum(counted) < len(ok):
        return _r(False, f"the client saw {len(ok)} reset(s) succeed, the servers counted {sum(counted)}",
                  succeeded=len(ok), counted=sum(counted))
    later = [o for r in ok for o in inp.ops if o.get("process") == r.get("process")
             and o.get("t_invoke", float("-inf")) > r.get("t_complete", float("inf"))
             and (o.get("expected") or 0) > (o.get("hbm_hit_tokens") or 0)]
    if later:
        o = later[0]
        return _r(False, f"{len(later)} lookups after a successful reset expect a pool hit; op {o['id']} expects "
                         f"{o.get('expected')} with {o.get('hbm_hit_tokens') or 0} on the device: the pool was not "
                         "emptied in the workload's model",
                  later=_first([o["id"] for o in later]))
    return _r(True, f"{len(resets)} reset(s) in the history, {len(ok)} succeeded"
              + (f", counted by the server ({sum(counted)})" if counted else " (the server keeps no counters)"),
              resets=len(resets), succeeded=len(ok))


def _sent(c: dict) -> int:
    # replies counts envelopes handed to the socket (by the serving thread or, for a backend call
    # that overran, by the watchdog); a send that raised is counted in send_failed
    return c.get("replies", 0) + c.get("replies_watchdog", 0) - c.get("send_failed", 0)


@check("exactly_one_reply")
def exactly_one_reply(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """Every request a real server received got exactly one reply: checked on every instance of
    the server (a server stopped, killed or swapped out during the run is probed just before,
    and may have had at most the one request it was serving in hand), and on every malformed
    request a fault sent (one v1 error envelope each)."""
    problems, evidence = [], []
    for ev in inp.events:
        if ev.get("what") == "malformed_requests":
            evidence.append("malformed_requests")
            if not ev.get("sent"):
                problems.append("malformed requests: none was sent, so none was shown to be answered")
            # every bad request must get exactly one reply, and that reply must be a v1 error
            # envelope (not accepted as ok, not an undecodable or raw 4-byte reply)
            if (ev.get("unanswered", 0) or ev.get("duplicates", 0) or ev.get("answered") != ev.get("sent")
                    or ev.get("invalid", 0) or ev.get("accepted", 0)):
                problems.append(f"malformed requests: sent {ev.get('sent')}, answered {ev.get('answered')}, "
                                f"unanswered {ev.get('unanswered')}, duplicates {ev.get('duplicates', 0)}, "
                                f"not an error envelope {ev.get('invalid', 0)}, accepted {ev.get('accepted', 0)}")
    counted = [p for p in inp.probes if p.get("node") == "server" and p.get("kind") in ("lookup-server", "ascend-lookup-server", "store-lookup-server")
               and "replies" in (p.get("counters") or {})]
    killed = retired_pids(inp, ("process_kill",))
    lost = 0
    for pid in dict.fromkeys(p.get("pid") for p in counted):
        mine = [p for p in counted if p.get("pid") == pid]
        last = mine[-1]
        if last.get("when") == "baseline":
            if pid not in killed:
                problems.append(f"server pid {pid}: no counters after its baseline")
            continue
        c = last["counters"]
        missing = c.get("requests", 0) - _sent(c)
        evidence.append(f"server pid {pid}")
        if last.get("when") == "final" and missing != 0 or last.get("when") == "last" and missing not in (0, 1):
            problems.append(f"server pid {pid} received {c.get('requests')} requests but sent {_sent(c)} replies "
                            f"(at its {last.get('when')} probe)")
        lost += max(missing, 0)
    if problems:
        return _r(False, "; ".join(problems[:3]), problems=problems)
    if not evidence:
        return _r(False, "no server counters and no malformed-request counts in this history")
    return _r(True, f"every request answered exactly once ({', '.join(evidence)}"
                    f"{f'; {lost} in service when its server was stopped' if lost else ''})", lost=lost)


@check("metrics_match")
def metrics_match(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """The client's failure counters equal the history, and every failure is explained by an
    injected fault that declares it causes (or may cause) that category."""
    final = [p for p in inp.probes if p.get("node") == "client" and p.get("when") == "final"]
    if not final:
        return _r(False, "no final client probe: the workload did not finish")
    counters = final[-1].get("counters") or {}
    tally = {c: 0 for c in ("ok",) + FAIL_CATEGORIES}
    for o in inp.all_ops:  # a failed reset counts under its failure category, a good one under reset_ok
        if o.get("outcome") in tally and not (o.get("f") == "reset" and o["outcome"] == "ok"):
            tally[o["outcome"]] += 1
    mismatch = {c: (counters.get(c, 0), n) for c, n in tally.items() if counters.get(c, 0) != n}
    if mismatch:
        c, (got, want) = next(iter(mismatch.items()))
        return _r(False, f"client counter {c}={got} but the history has {want} such ops", mismatch=mismatch)
    # failures by category must be explained by an injected fault active at the time
    grace = (float(inp.meta.get("deadline_ms", 0)) + float(inp.meta.get("tolerance_ms", 0))) / 1000.0
    faults = {f["id"]: f for f in inp.meta.get("faults", [])}
    unexplained, missing = [], []
    for o in inp.all_ops:  # a failed admin reset must be explained as much as a failed lookup
        if o.get("outcome") not in FAIL_CATEGORIES:
            continue
        t = o.get("t_invoke", 0)
        cats = set()
        active = False
        for w in inp.windows:
            if w["start"] is not None and w["start"] - grace <= t <= w["stop"] + grace:
                active = True
                # a fault explains only the categories it declares it causes or may cause
                f = faults.get(w["id"], {})
                cats |= set(f.get("explains", f.get("categories", [])))
        if not active or o["outcome"] not in cats:
            unexplained.append(o)
    for w in inp.windows:
        cats = set(faults.get(w["id"], {}).get("categories", []))
        if not cats or w["stop"] - w["start"] < grace:
            continue  # a window squeezed by slow fault set-up (a peer swap) may fairly cause nothing
        during = [o for o in inp.all_ops if w["start"] <= o.get("t_invoke", 0) <= w["stop"]]
        if during and not any(o.get("outcome") in cats for o in during):
            missing.append(f"{w['name']} (expected {'/'.join(sorted(cats))})")
    if unexplained:
        o = unexplained[0]
        return _r(False, f"{len(unexplained)} failures not explained by an injected fault; op {o['id']} "
                         f"{o.get('outcome')}/{o.get('code')}", unexplained=_first([o["id"] for o in unexplained]))
    if missing:
        return _r(False, f"injected faults left no failure of their category: {', '.join(missing)}")
    return _r(True, f"client counters match the history ({sum(tally.values())} ops) and every failure is "
                    f"explained by an injected fault")


@check("clean_close")
def clean_close(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """Closing the lookup server (``server_close``) left its process running: the close returned,
    and the node (vLLM's worker, in a real deployment) did not die with it."""
    closes = [e for e in inp.events if e.get("what") == "server_close"]
    if not closes:
        return _r(False, "no server_close in the history: nothing shows a close is survived")
    died = [e for e in closes if not e.get("survived")]
    if died:
        e = died[0]
        how = f"exit code {e.get('exit_code')}" if e.get("exit_code") is not None else (e.get("error") or "no answer")
        return _r(False, f"{len(died)} of {len(closes)} closes took the server process down ({how})",
                  exit_codes=[x.get("exit_code") for x in died])
    return _r(True, f"{len(closes)} closes returned in "
                    f"{', '.join(str(e.get('close_ms')) for e in closes)} ms; the process kept running")
