"""Checkers: pure functions over a saved journal (and the logs beside it).

Each check is ``fn(inp: CheckInput, opts: dict) -> CheckResult`` registered under the name the YAML
uses. ``ok`` is True (holds), False (violated) or None (cannot be decided from this history, e.g.
the legacy client keeps no counters); None never fails a run. ``pdchaos check RUN_DIR`` re-runs
them from the files alone, with the options saved in the journal's meta line.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import journal as J

FAIL_CATEGORIES = ("timeout", "transport", "protocol", "server_error", "backend_error", "bad_call")


@dataclass
class CheckResult:
    name: str
    ok: bool | None
    message: str
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class CheckInput:
    records: list[dict]
    logs: dict[str, str] = field(default_factory=dict)
    preload: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.meta = J.meta(self.records)
        self.all_ops = J.ops(self.records)
        self.ops = [o for o in self.all_ops if o.get("f") == "lookup"]
        self.admin_ops = [o for o in self.all_ops if o.get("f") == "reset"]
        self.windows = J.fault_windows(self.records)
        self.probes = J.probes(self.records)
        self.events = [r for r in self.records if r.get("type") == "event"]


CHECKS: dict[str, Callable[[CheckInput, dict], CheckResult]] = {}


def check(name: str):
    def deco(fn):
        CHECKS[name] = lambda inp, opts: _named(name, fn(inp, opts))
        return fn
    return deco


def _named(name: str, r: CheckResult) -> CheckResult:
    r.name = name
    return r


def _r(ok: bool | None, message: str, **details: Any) -> CheckResult:
    return CheckResult("", ok, message, details)


def _first(ids: list, n: int = 5) -> list:
    return ids[:n]


# --------------------------------------------------------------------------- checks


@check("bounded_return")
def bounded_return(inp: CheckInput, opts: dict) -> CheckResult:
    deadline = float(inp.meta.get("deadline_ms", 0))
    tol = opts.get("tolerance_ms")
    tol = float(inp.meta.get("tolerance_ms", 0)) if tol is None else float(tol)
    limit = deadline + tol
    if not inp.ops:
        return _r(None, "no ops")
    late = [o for o in inp.all_ops if o.get("outcome") == "stalled" or (o.get("elapsed_ms") or 0) > limit]
    worst = max((o.get("elapsed_ms") or 0 for o in inp.all_ops), default=0)
    det = {"limit_ms": limit, "deadline_ms": deadline, "tolerance_ms": tol, "worst_ms": worst,
           "late_ops": _first([o["id"] for o in late])}
    if late:
        o = late[0]
        how = "never returned" if o.get("outcome") == "stalled" else f"took {o['elapsed_ms']:.1f} ms"
        return _r(False, f"{len(late)} of {len(inp.ops)} ops over deadline+tolerance ({deadline:g}+{tol:g} ms); "
                         f"op {o['id']} {how}", **det)
    return _r(True, f"all {len(inp.ops)} ops within {deadline:g}+{tol:g} ms (worst {worst:.1f} ms)", **det)


@check("fail_open")
def fail_open(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
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
    ok_ops = [o for o in inp.all_ops if o.get("phase") == "ok"]  # lookups and admin resets
    wrong = [o for o in ok_ops if o.get("value") != o.get("expected")]
    if wrong:
        o = wrong[0]
        return _r(False, f"{len(wrong)} of {len(ok_ops)} successful ops returned a wrong hit; op {o['id']} "
                         f"({o.get('kind')}) returned {o.get('value')}, expected {o.get('expected')}",
                  wrong=_first([o["id"] for o in wrong]))
    if not ok_ops:
        return _r(None, "no successful op to check")
    return _r(True, f"all {len(ok_ops)} successful ops returned the expected hit")


def _merged_windows(windows: list[dict]) -> list[tuple[float, float, list[str]]]:
    out: list[list] = []
    for w in sorted(windows, key=lambda w: w["start"] or 0.0):
        if w["start"] is None:
            continue
        if out and w["start"] <= out[-1][1]:
            out[-1][1] = max(out[-1][1], w["stop"])
            out[-1][2].append(w["name"])
        else:
            out.append([w["start"], w["stop"], [w["name"]]])
    return [tuple(x) for x in out]  # type: ignore[misc]


@check("recovery")
def recovery(inp: CheckInput, opts: dict) -> CheckResult:
    """For every worker (one client each): among its first N ops after a fault window closes (and
    before the next one opens), one succeeds with the right hit."""
    within = int(opts.get("within", 1))
    if not inp.windows:
        return _r(None, "no fault windows")
    bad, checked = [], 0
    merged = _merged_windows(inp.windows)
    for i, (start, stop, names) in enumerate(merged):
        next_start = merged[i + 1][0] if i + 1 < len(merged) else float("inf")
        # ops between this window's end and the next window's start, per worker
        after = [o for o in inp.ops if stop <= o.get("t_invoke", 0) < next_start]
        if not after:
            continue
        checked += 1
        by_worker: dict = {}
        for o in after:
            by_worker.setdefault(o.get("process"), []).append(o)
        for ops_of_worker in by_worker.values():
            first = ops_of_worker[:within]
            if not any(o.get("phase") == "ok" and o.get("value") == o.get("expected") for o in first):
                bad.append((names, first[0]))
    if bad:
        names, o = bad[0]
        return _r(False, f"{len(bad)} fault windows not recovered from within {within} ops; after "
                         f"{'+'.join(names)} op {o['id']} was {o.get('outcome')}", windows=len(bad))
    if checked == 0:
        return _r(None, "no op was invoked after any fault window")
    return _r(True, f"recovered after all {checked} fault windows within {within} ops")


def _server_probes(inp: CheckInput) -> tuple[list[dict], list[dict]]:
    base = [p for p in inp.probes if p.get("node") == "server" and p.get("when") == "baseline"]
    final = [p for p in inp.probes if p.get("node") == "server" and p.get("when") == "final"]
    return base, final


@check("exactly_one_reply")
def exactly_one_reply(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    problems, evidence = [], []
    for ev in inp.events:
        if ev.get("what") == "malformed_requests":
            evidence.append("malformed_requests")
            # every bad request must get exactly one reply, and that reply must be a v1 error
            # envelope (not accepted as ok, not an undecodable or raw 4-byte reply)
            if (ev.get("unanswered", 0) or ev.get("duplicates", 0) or ev.get("answered") != ev.get("sent")
                    or ev.get("invalid", 0) or ev.get("accepted", 0)):
                problems.append(f"malformed requests: sent {ev.get('sent')}, answered {ev.get('answered')}, "
                                f"unanswered {ev.get('unanswered')}, duplicates {ev.get('duplicates', 0)}, "
                                f"not an error envelope {ev.get('invalid', 0)}, accepted {ev.get('accepted', 0)}")
    _, final = _server_probes(inp)
    c = final[-1].get("counters") if final else None
    if c and "replies" in c:
        # replies counts envelopes handed to the socket (by the serving thread or, for a backend
        # call that overran, by the watchdog); a send that raised is counted in send_failed
        sent = c.get("replies", 0) + c.get("replies_watchdog", 0) - c.get("send_failed", 0)
        evidence.append("server counters")
        if sent != c.get("requests", 0):
            problems.append(f"server received {c.get('requests')} requests but sent {sent} replies")
    if problems:
        return _r(False, "; ".join(problems))
    if not evidence:
        return _r(None, "no server counters or request probes in this history (legacy server keeps none)")
    return _r(True, f"every request answered exactly once ({', '.join(evidence)})")


@check("server_alive")
def server_alive(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    _, final = _server_probes(inp)
    if not final:
        return _r(False, "no final server probe: the server did not answer its control channel at the end")
    p = final[-1]
    if not p.get("alive"):
        return _r(False, f"server process {p.get('pid')} is up but its serving thread is dead")
    return _r(True, f"server process {p.get('pid')} alive and serving at the end")


@check("no_leaks")
def no_leaks(inp: CheckInput, opts: dict) -> CheckResult:
    slack = int(opts.get("slack", 0))
    problems, compared = [], []
    finals = [p for p in inp.probes if p.get("when") == "final"]
    for fin in finals:
        node = fin.get("node")
        base = [p for p in inp.probes if p.get("when") == "baseline" and p.get("node") == node
                and p.get("pid") == fin.get("pid")]
        if not base:
            continue
        b = base[-1]
        compared.append(node)
        for k in ("threads", "fds"):
            if fin.get(k, 0) > b.get(k, 0) + slack:
                problems.append(f"{node}: {k} {b.get(k)} -> {fin.get(k)}")
    if problems:
        return _r(False, "leak: " + "; ".join(problems))
    if not compared:
        return _r(None, "no baseline/final probe pair")
    return _r(True, f"threads and fds back to baseline ({', '.join(compared)})")


_HEXRUN = re.compile(r"[0-9a-fA-F]{16,}")


@check("log_hygiene")
def log_hygiene(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """No block hash, nor a 16+ hex-digit piece of one, nor any 32+ hex-digit run in any log."""
    keys = [h.lower() for h in inp.preload if len(h) >= 16]
    hits = []
    for name, text in inp.logs.items():
        for run in _HEXRUN.findall(text):
            low = run.lower()
            if len(low) >= 32 or any(low in k or k in low for k in keys):
                hits.append(name)
                break
    if hits:
        return _r(False, f"block-hash-like text in {len(hits)} log(s): {', '.join(sorted(hits)[:3])}")
    if not inp.logs:
        return _r(None, "no logs captured")
    return _r(True, f"no block hash in {len(inp.logs)} logs")


@check("metrics_match")
def metrics_match(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    if inp.meta.get("target") != "hardened":
        return _r(None, "the legacy client keeps no failure counters")
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
    for o in inp.ops:
        if o.get("outcome") not in FAIL_CATEGORIES:
            continue
        t = o.get("t_invoke", 0)
        cats = set()
        active = False
        for w in inp.windows:
            if w["start"] is not None and w["start"] - grace <= t <= w["stop"] + grace:
                active = True
                cats |= set(faults.get(w["id"], {}).get("categories", []) or [o["outcome"]])
        if not active or o["outcome"] not in cats:
            unexplained.append(o)
    for w in inp.windows:
        cats = set(faults.get(w["id"], {}).get("categories", []))
        if not cats or w["stop"] - w["start"] < grace:
            continue  # a window squeezed by slow fault set-up (a peer swap) may fairly cause nothing
        during = [o for o in inp.ops if w["start"] <= o.get("t_invoke", 0) <= w["stop"]]
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


@check("workload_ran")
def workload_ran(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """The history is not empty by accident: the workload process exited as it should (0, or 3
    when it left calls stuck in a hung client) and issued at least a quarter of its planned ops
    (a target whose calls hang issues fewer; no_stall says so). Without this, a workload that
    crashed would leave a history in which every other check holds vacuously."""
    ev = [e for e in inp.events if e.get("what") == "workload_exit"]
    if not ev:
        return _r(False, "no record of the workload's exit")
    code = ev[-1].get("returncode")
    if code not in (0, 3):
        return _r(False, f"the workload exited with code {code} (see logs/client-workload.log)")
    w = inp.meta.get("workload") or {}
    planned = float(w.get("rate", 0)) * float(w.get("duration", 0))
    n = len(inp.all_ops)
    stalled = any(o.get("outcome") == "stalled" for o in inp.ops)
    if n == 0 or (planned and n < 0.25 * planned and not stalled):
        return _r(False, f"only {n} ops of about {planned:.0f} planned")
    return _r(True, f"{n} ops (about {planned:.0f} planned), workload exit {code}")


@check("harness_integrity")
def harness_integrity(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """The run itself went as planned: every fault started and healed without error, the final
    server probe answered, nothing outlived the teardown."""
    bad = [e for e in inp.events if e.get("what") in ("fault_error", "probe_failed", "leftovers", "nemesis_stuck")]
    if bad:
        e = bad[0]
        detail = e.get("error") or e.get("what_left") or e.get("fault") or ""
        return _r(False, f"{len(bad)} harness problem(s); first: {e['what']} {detail}".strip())
    return _r(True, "faults started and healed cleanly; nothing left behind")


@check("no_stall")
def no_stall(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    stalled = [o for o in inp.all_ops if o.get("outcome") == "stalled"]
    end = next((r for r in inp.records if r.get("type") == "end"), {})
    if stalled:
        return _r(False, f"{len(stalled)} ops never returned (first: op {stalled[0]['id']}); the runner "
                         f"stopped the client", stalled=len(stalled))
    if end.get("reason") == "cap":
        return _r(False, "the scenario hit its wall-clock cap")
    return _r(True, "every op returned")


# --------------------------------------------------------------------------- running


def run_checks(inp: CheckInput, config: dict[str, dict]) -> list[CheckResult]:
    """``config``: {name: options}; a check with ``enabled: false`` is left out."""
    out = []
    for name, fn in CHECKS.items():
        opts = config.get(name, {})
        if opts.get("enabled", True) is False:
            continue
        try:
            out.append(fn(inp, opts))
        except Exception as exc:  # a checker bug must show, not pass
            out.append(CheckResult(name, False, f"checker error: {type(exc).__name__}: {exc}"))
    return out


def verdict(results: list[CheckResult]) -> str:
    if any(r.name == "no_stall" and r.ok is False for r in results):
        return "stall"
    if any(r.ok is False for r in results):
        return "fail"
    return "pass"


def load_input(journal_path: str | Path) -> CheckInput:
    jp = Path(journal_path)
    records = J.read_journal(jp)
    logs = {}
    for log in sorted((jp.parent / "logs").glob("*.log")):
        logs[log.name] = log.read_text(encoding="utf-8", errors="replace")
    preload_path = jp.parent / "preload.txt"
    preload = preload_path.read_text().split() if preload_path.exists() else []
    return CheckInput(records, logs, preload)
