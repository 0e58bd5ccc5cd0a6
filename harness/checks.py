"""Checkers: pure functions over a saved journal (and the logs beside it).

Each check is ``fn(inp: CheckInput, opts: dict) -> CheckResult`` registered under the name the
YAML uses: the generic ones here, in :data:`GENERIC`, a family's own in its family's registry
(harness/family.py). A check returns ``ok`` True (holds) or False (violated, or could not be
decided from a history that should have decided it: the message says why). A check that does not
apply to a scenario and target (the family says which) is not run: it is reported as not
applicable (``ok`` None), never as passing. ``pdchaos check RUN_DIR`` re-runs them from the files
alone, with the options and the applicability saved in the journal's meta line.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from faults.base import Duration
from nodekit import journal as J
from .triggers import GENERIC as TRIGGERS, none_reason
from .verdicts import RAISED, UNDECIDED


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
    secrets: list[str] = field(default_factory=list)  # strings no log may contain (keys, prompts)
    log_pattern: str | None = None  # text no log may contain whatever the run (the family's)
    saved: dict | None = None  # the family's saved_inputs of the run folder; None: not judged from a run folder
    tally: bool = False  # the family's workload counts its ops in its final probe: the history must match it
    triggers: Any = None  # the family's TriggerRegistry with the generic triggers (harness/triggers.py); None: generic only

    def __post_init__(self) -> None:
        self.meta = J.meta(self.records)
        self.all_ops = J.ops(self.records)
        primary = self.meta.get("primary_ops") or []
        # the workload's main operation (e.g. lookups; admin calls are in all_ops only)
        self.ops = [o for o in self.all_ops if not primary or o.get("f") in primary]
        self.windows = J.fault_windows(self.records)
        self.probes = J.probes(self.records)
        self.events = [r for r in self.records if r.get("type") == "event"]


Checker = Callable[[CheckInput, dict], CheckResult]


class CheckOptions(BaseModel):
    """What a scenario may set for any check (``checks: {NAME: {...}}``); a check with options of
    its own declares a subclass beside it and registers it with the check."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True


class CheckRegistry:
    """Checks by YAML name, each with its options model. Registering a name twice is an error, as
    it is for faults."""

    def __init__(self, owner: str):
        self.owner = owner
        self.checks: dict[str, Checker] = {}
        self.options: dict[str, type[CheckOptions]] = {}
        self.docs: dict[str, str] = {}  # name -> the check function's docstring (pdchaos docs)

    def check(self, name: str, options: type[CheckOptions] = CheckOptions):
        if not (isinstance(options, type) and issubclass(options, CheckOptions)):
            raise TypeError(f"check {name!r} in {self.owner}: options must be a CheckOptions subclass")

        def deco(fn):
            if name in self.checks:
                raise TypeError(f"check {name!r} registered twice in {self.owner}")
            self.checks[name] = lambda inp, opts: _named(name, fn(inp, opts))
            self.options[name] = options
            self.docs[name] = " ".join((fn.__doc__ or "").split())
            return fn
        return deco


GENERIC = CheckRegistry("the generic checks")
check = GENERIC.check
CHECKS = GENERIC.checks  # the generic checks, by name


def checks_for(family: Any) -> dict[str, Checker]:
    """Every check a scenario of ``family`` runs: the generic ones it does not skip, then its own.
    A family check may not reuse a generic name."""
    out = {n: fn for n, fn in GENERIC.checks.items() if n not in family.skip_generic_checks}
    for name, fn in family.checks.checks.items():
        if name in GENERIC.checks:
            raise TypeError(f"family {family.name!r}: check {name!r} is already a generic check")
        out[name] = fn
    return out


def options_for(family: Any) -> dict[str, type[CheckOptions]]:
    """The options model of every check a scenario of ``family`` runs (as :func:`checks_for`)."""
    out = {n: m for n, m in GENERIC.options.items() if n not in family.skip_generic_checks}
    out.update(family.checks.options)
    return out


def _named(name: str, r: CheckResult) -> CheckResult:
    r.name = name
    return r


def _r(ok: bool | None, message: str, **details: Any) -> CheckResult:
    return CheckResult("", ok, message, details)


def undecided(message: str, **details: Any) -> CheckResult:
    """A check that cannot judge: it fails, and the run is an error (never a verdict that an
    expectation could name)."""
    return CheckResult("", False, UNDECIDED + message, details)


def _first(ids: list, n: int = 5) -> list:
    return ids[:n]


def same_output(o: dict) -> bool:
    """An op's output is the one it expected: the same value, and also the same digest of what
    it is made of when the op carries both (``value_ids`` / ``expected_ids``: e.g. a completion's
    token ids). Text alone is never enough where both digests exist, nor the digest alone (a
    forged history kept the digest and garbled the text)."""
    if o.get("value") != o.get("expected"):
        return False
    if o.get("value_ids") and o.get("expected_ids"):
        return o["value_ids"] == o["expected_ids"]
    return True


def op_elapsed_ms(o: dict) -> float:
    """How long an op took, ms: the larger of its own ``elapsed_ms`` and its journal timestamps
    (an op cannot understate its time); infinite when neither is a finite number (a stalled or
    malformed op can never read as quick)."""
    vals = []
    e = o.get("elapsed_ms")
    if e is not None and not finite(e):
        return math.inf  # a time that is not a number: the op's record is broken, never quick
    if e is not None:
        vals.append(float(e))
    a, b = o.get("t_invoke"), o.get("t_complete")
    if any(x is not None and not finite(x) for x in (a, b)):
        return math.inf  # a timestamp there but not a number: never read as quick from elapsed_ms alone
    if all(isinstance(x, (int, float)) and math.isfinite(x) for x in (a, b)):
        vals.append((b - a) * 1000.0)
    return max(vals) if vals else math.inf


def finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# --------------------------------------------------------------------------- checks


class BoundedReturnOptions(CheckOptions):
    tolerance: Duration | None = Field(None, description="overrides the scenario tolerance")


@check("bounded_return", BoundedReturnOptions)
def bounded_return(inp: CheckInput, opts: dict) -> CheckResult:
    """Every op returned within the deadline plus the tolerance (a stalled op did not)."""
    deadline = float(inp.meta.get("deadline_ms", 0))
    tol = opts.get("tolerance_ms")
    tol = float(inp.meta.get("tolerance_ms", 0)) if tol is None else float(tol)
    limit = deadline + tol
    if not inp.all_ops:
        return _r(False, "no op in the history: nothing returned, so nothing was bounded")
    late = [o for o in inp.all_ops if o.get("outcome") == "stalled" or op_elapsed_ms(o) > limit]
    worst = max((op_elapsed_ms(o) for o in inp.all_ops), default=0)
    n = len(inp.all_ops)
    det = {"limit_ms": limit, "deadline_ms": deadline, "tolerance_ms": tol, "worst_ms": worst,
           "late_ops": _first([o["id"] for o in late])}
    if late:
        o = late[0]
        how = "never returned" if o.get("outcome") == "stalled" else f"took {op_elapsed_ms(o):.1f} ms"
        return _r(False, f"{len(late)} of {n} ops over deadline+tolerance ({deadline:g}+{tol:g} ms); "
                         f"op {o['id']} {how}", **det)
    return _r(True, f"all {n} ops within {deadline:g}+{tol:g} ms (worst {worst:.1f} ms)", **det)


def merged_windows(windows: list[dict]) -> list[tuple[float, float, list[str]]]:
    """Fault windows with overlapping ones merged: [(start, stop, names)], in time order."""
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


class RecoveryOptions(CheckOptions):
    within: int = Field(1, ge=1, description="the first N ops after a window must include a success")


@check("recovery", RecoveryOptions)
def recovery(inp: CheckInput, opts: dict) -> CheckResult:
    """After every fault window closes (overlapping windows merged), until the next one opens:
    each worker (one client each) that issues ops there succeeds, with the expected value, within
    its first N. A worker still busy with a call begun during the fault may issue none. Two
    windows with no op at all between them are judged as one period; if no op follows the last
    one while an op was still in flight at the heal, recovery cannot be shown, and that fails; if
    none was in flight either (the workload had ended before the heal), it cannot judge. (The
    schedule is validated to leave every worker time for N ops after each window.)"""
    within = int(opts.get("within", 1))
    if not inp.windows:
        return _r(False, "no fault window in the history, though the scenario schedules faults")
    bad: list[str] = []
    # Windows with no op at all between them (e.g. the first one's heal, a process restart, ran
    # into the next one's start) were never seen healthy apart: they are judged as one period.
    merged: list[tuple[float, float, list[str]]] = []
    joined = 0
    for start, stop, names in merged_windows(inp.windows):
        if merged and not any(merged[-1][1] <= o.get("t_invoke", 0) < start for o in inp.ops):
            merged[-1] = (merged[-1][0], stop, merged[-1][2] + names)
            joined += 1
        else:
            merged.append((start, stop, list(names)))
    for i, (start, stop, names) in enumerate(merged):
        next_start = merged[i + 1][0] if i + 1 < len(merged) else float("inf")
        label = "+".join(names)
        by_worker: dict = {}
        for o in inp.ops:
            if stop <= o.get("t_invoke", 0) < next_start:
                by_worker.setdefault(o.get("process"), []).append(o)
        if not by_worker:
            if i == len(merged) - 1 and not any(o.get("t_complete") is None or o["t_complete"] > stop
                                                for o in inp.all_ops):
                # no op was still in flight at the last heal, yet none came after it: the workload
                # had ended before it (a history that never saw the system healed), so there is
                # nothing to judge; a worker held in a call across the heal is the failure recovery names
                return undecided(f"no op was invoked after {label} (healed at {stop - (inp.meta.get('t0') or 0.0):.2f} "
                                 f"s) and none was in flight then: the workload ended before the last heal")
            bad.append(f"no op was invoked after {label} before the end of the run")
        for w, ops in by_worker.items():
            first = ops[:within]
            if not any(o.get("phase") == "ok" and same_output(o) for o in first):
                bad.append(f"after {label}, worker {w}'s op {first[0]['id']} was {first[0].get('outcome')}")
    if bad:
        return _r(False, f"{len(bad)} fault windows/workers without recovery within {within} ops; {bad[0]}",
                  problems=bad[:5])
    note = f" ({joined} windows with no op before the next one judged with it)" if joined else ""
    return _r(True, f"recovered after all {len(merged)} fault periods within {within} ops{note}", joined=joined)


class NoLeaksOptions(CheckOptions):
    slack: int = Field(0, ge=0, description="allowed extra threads/fds")


@check("no_leaks", NoLeaksOptions)
def no_leaks(inp: CheckInput, opts: dict) -> CheckResult:
    """Every node process still running at the end (client included) is back to the threads and
    fds of its baseline probe, taken when it started. Every node must have given both probes. A
    process stopped, killed or swapped out during the run is not compared (its clients were still
    connected when it went, and the OS reclaims whatever it held). A node's final probe taken before
    the last fault healed (the harness takes them at teardown, after every heal), or the client's
    before an op record of its own, cannot show the end state: the check cannot judge."""
    slack = int(opts.get("slack", 0))
    early = final_too_early(inp, [p for p in inp.probes if p.get("when") == "final"])
    if early:
        return undecided(early)
    retired = retired_pids(inp)
    # problems: a node shown to keep more than it started with; unread: a node whose end state, or
    # the baseline to compare it with, the history lacks. Only the first is a failure an expectation
    # may name (upstream's `fail[no_leaks]`): a probe without a count once read as that failure
    problems, unread, compared = [], [], []
    for e in inp.events:
        if e.get("what") == "probe_silent" and e.get("when") in ("baseline", "final"):
            unread.append(f"{e.get('role')} ({e.get('kind')}) pid {e.get('pid')} gave no {e.get('when')} probe")
    finals = {p.get("pid"): p for p in inp.probes if p.get("when") == "final"}
    based = {p.get("pid") for p in inp.probes if p.get("when") == "baseline"}
    for pid, fin in finals.items():
        if pid not in based:
            unread.append(f"{fin.get('node')} ({fin.get('kind') or 'node'}) pid {pid}: a final probe but no "
                          f"baseline to compare it with")
    for b in (p for p in inp.probes if p.get("when") == "baseline"):
        who = f"{b.get('node')} ({b.get('kind') or 'node'}) pid {b.get('pid')}"
        fin = finals.get(b.get("pid"))
        if fin is None:
            if b.get("pid") not in retired:
                unread.append(f"{who}: no final probe, and it was not stopped during the run")
            continue
        compared.append(str(b.get("node")))
        for k in ("threads", "fds"):
            before, after = b.get(k), fin.get(k)
            if not _count_value(before) or not _count_value(after):
                # a probe without the value cannot show the node is back, nor that it leaked
                unread.append(f"{who}: its {'baseline' if not _count_value(before) else 'final'} probe has no "
                              f"{k} count ({before!r} -> {after!r})")
            elif after > before + slack:
                problems.append(f"{who}: {k} {before} -> {after}")
    if problems:  # a leak the readable probes show fails whatever the others could not show
        return _r(False, "; ".join(problems[:4]), problems=problems)
    if unread:
        return undecided("; ".join(unread[:4]), unread=unread)
    if not compared:
        return undecided("no node was probed at baseline and at the end: nothing to compare")
    return _r(True, f"threads and fds back to baseline ({', '.join(sorted(set(compared)))})")


def _count_value(v: Any) -> bool:
    """A usable count: a non-negative number (probes say -1 where /proc could not be read)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


SLICE = 24
_PIECES = (re.compile(r"[0-9a-fA-F]{16,}"), re.compile(r"[0-9A-Za-z]{16,}"))


@check("log_hygiene")
def log_hygiene(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """No log holds a secret of the run (a key, a prompt: the family says which), nor a 16+
    character piece of one, nor any text matching the family's pattern (e.g. 32+ hex digits)."""
    if not inp.logs:
        return _r(False, "no logs captured: every node writes one, so something lost them")
    missing = sorted(n.split(":", 1)[1] for n in inp.logs if n.startswith("missing:"))
    if missing:
        return _r(False, f"{len(missing)} log(s) the run names could not be read: {', '.join(missing[:3])}")
    pattern = re.compile(inp.log_pattern) if inp.log_pattern else None
    secrets = [x.lower() for x in inp.secrets if len(x) >= 16]
    # a secret cut short is still a leak: every SLICE-character slice (step SLICE // 2) of a long
    # secret is looked for, so any 1.5 * SLICE characters of it in a log are found
    slices = {x[i:i + SLICE] for x in secrets if len(x) > SLICE for i in range(0, len(x) - SLICE + 1, SLICE // 2)}
    hits = []
    for name, text in inp.logs.items():
        if pattern is not None and pattern.search(text):
            hits.append(name)
            continue
        low_text = text.lower()
        if any(x in low_text for x in secrets) or any(x in low_text for x in slices) or any(
                any(run in x for x in secrets) for pat in _PIECES for run in (r.lower() for r in pat.findall(text))):
            hits.append(name)
    if hits:
        return _r(False, f"secret-like text (a key or a piece of one) in {len(hits)} log(s): "
                         f"{', '.join(sorted(hits)[:3])}")
    return _r(True, f"no secret in {len(inp.logs)} logs")


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
    planned = float(inp.meta.get("planned_ops") or 0)
    n = len(inp.all_ops)
    stalled = any(o.get("outcome") == "stalled" for o in inp.all_ops)
    if n == 0 or (planned and n < 0.25 * planned and not stalled):
        return _r(False, f"only {n} ops of about {planned:.0f} planned")
    return _r(True, f"{n} ops (about {planned:.0f} planned), workload exit {code}")


HARNESS_PROBLEMS = ("fault_error", "probe_failed", "probe_silent", "leftovers", "nemesis_stuck",
                    "journal_line_unreadable")


def _client_tally(inp: CheckInput) -> str | None:
    """A workload that counts its own primary ops in its final probe (counters ``ops`` and
    ``ops_<outcome>``, integers) must find each of them in the history: an op lost, deleted,
    duplicated under another id or re-labelled shows here. Ops with no end at all are allowed only
    for the workers the workload reported stuck. A family whose workload tallies (``tally``) must
    have that probe."""
    tallies = [p for p in inp.probes if p.get("node") == "client" and p.get("when") == "final"
               and "ops" in (p.get("counters") or {})]
    if not tallies:
        return "the client's final probe with its own count of requests is missing" if inp.tally else None
    if len(tallies) > 1:
        return "two final tallies of the client: the history is not one run's"
    p = tallies[0]
    c = p.get("counters") or {}
    counts = {k: v for k, v in c.items() if k == "ops" or k.startswith("ops_")}
    bad = [k for k, v in counts.items() if type(v) is not int or v < 0]
    stuck = p.get("stuck_workers", 0)
    if bad or type(stuck) is not int or stuck < 0:
        return f"the client's tally is not a count ({', '.join(bad) or 'stuck_workers'}): the history is not the client's"
    ended = [o for o in inp.ops if o.get("t_complete") is not None]
    if len(ended) != c["ops"]:
        return f"the client counted {c['ops']} ended requests, the history has {len(ended)}: the history is not the client's"
    outcomes = {o.get("outcome") for o in ended}
    for key in set(counts) - {"ops"} | {f"ops_{x}" for x in outcomes}:
        have = sum(1 for o in ended if f"ops_{o.get('outcome')}" == key)
        if have != counts.get(key, 0):
            return (f"the client counted {counts.get(key, 0)} requests with outcome {key[4:]}, the history has "
                    f"{have}: the history is not the client's")
    open_ = len(inp.ops) - len(ended)
    if open_ > stuck:
        return f"{open_} requests never ended in the history but the client reported {stuck} stuck workers"
    if stuck > open_:  # a stuck worker is in the call its open request is: its op cannot be missing
        return f"the client reported {stuck} stuck workers but {open_} requests never ended in the history"
    return None


@check("harness_integrity")
def harness_integrity(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """The run itself went as planned: every fault started and healed without error, every probe
    of a running node answered (baseline, before a stop, final), nothing outlived the teardown.
    The history is whole: each worker's ops follow one another (one call at a time), every
    completion has its invoke, the end record's count of stalled ops is the history's, the
    client's stuck workers are its open requests, each fault's started and effect events lie in
    its window, and every node probed at its start has a final probe, a silent one, or a fault
    that stopped it."""
    bad = [e for e in inp.events if e.get("what") in HARNESS_PROBLEMS]
    if not any(r.get("type") == "end" for r in inp.records):
        return _r(False, "the journal has no end record: the run did not finish writing its history")
    # one run writes one meta line, one end record and one workload exit: a second one (two runs
    # appended into one journal, seen in a saved explore journal) made the checks read one of them
    # each (workload_ran the last exit, no_stall the first end): an exit 1 before an exit 0, or an
    # end at the cap before one that says done, read as a run that went well
    for what, n in (("meta line", sum(1 for r in inp.records if r.get("type") == "meta")),
                    ("end record", sum(1 for r in inp.records if r.get("type") == "end")),
                    ("workload_exit event", sum(1 for e in inp.events if e.get("what") == "workload_exit"))):
        if n > 1:
            return _r(False, f"{n} {what}s in the journal: the history is not one run's")
    end_t = max((r["t"] for r in inp.records if r.get("type") == "end" and finite(r.get("t"))), default=None)
    seen: set = set()
    for r in inp.records:
        if "t" in r and not finite(r.get("t")):
            return _r(False, f"a {r.get('type')} record's time is not a finite number ({r.get('t')!r}): "
                             f"the history is broken")
        if end_t is not None and "t" in r and r["t"] > end_t:
            return _r(False, f"a {r.get('type')} record is {r['t'] - end_t:.2f} s after the run's end record: "
                             f"the history is not one run's")
        if r.get("type") in ("op", "fault"):
            key = (r.get("type"), r.get("id"), r.get("phase") if r.get("type") == "fault" or
                   r.get("phase") == "invoke" else "done")
            if key in seen:
                return _r(False, f"two {key[0]} records for id {key[1]} ({key[2]}): the history is not one run's")
            seen.add(key)
    invoked = {r.get("id"): r for r in inp.records if r.get("type") == "op" and r.get("phase") == "invoke"}
    for r in inp.records:
        if r.get("type") != "op":
            continue
        if r.get("phase") != "invoke" and r.get("id") not in invoked:
            # the workload writes an op's invoke before it sends it: a completion alone has a time
            # and an elapsed_ms nothing else in the history vouches for
            return _r(False, f"op {r.get('id')} has a completion but no invoke record: the history is not one run's")
        if {"t_invoke", "t_complete"} & set(r):
            return _r(False, f"op {r.get('id')}'s {r.get('phase')} record carries its own t_invoke or t_complete: "
                             f"the history contradicts its record times")
        if r.get("phase") != "invoke" and r.get("id") in invoked:
            inv = invoked[r.get("id")]
            t0, t1 = inv.get("t"), r.get("t")
            if isinstance(t0, (int, float)) and isinstance(t1, (int, float)) and t1 < t0:
                return _r(False, f"op {r.get('id')} completed before it was invoked: the history is not one run's")
            clash = sorted(k for k in r.keys() & inv.keys() - {"type", "phase", "t"} if r[k] != inv[k])
            if clash:
                return _r(False, f"op {r.get('id')}'s completion says another {', '.join(clash)} than its invoke: "
                                 f"the history contradicts itself")
    started = {r.get("id") for r in inp.records if r.get("type") == "fault" and r.get("phase") == "start"}
    stopped = {r.get("id") for r in inp.records if r.get("type") == "fault" and r.get("phase") == "stop"}
    if started - stopped and not bad:  # a heal that failed is a fault_error event, reported below
        return _r(False, f"fault {sorted(started - stopped, key=str)[0]} started and was never healed")
    end = [r for r in inp.records if r.get("type") == "end"][-1]
    n_stalled = sum(1 for o in inp.all_ops if o.get("outcome") == "stalled")
    if "stalled" in end and end.get("stalled") != n_stalled:
        # the runner counts them when it writes the end record, from the same records
        return _r(False, f"the end record counts {end.get('stalled')!r} stalled ops, the history holds {n_stalled}: "
                         f"the history is not the one the run ended with")
    spans = {w.get("id"): w for w in inp.windows if finite(w.get("start")) and finite(w.get("stop"))}
    for e in inp.events:
        w = spans.get(e.get("id")) if e.get("what") in ("fault_started", "fault_effect") else None
        if w is None or not finite(e.get("t")):
            continue
        # fault_started is written once the fault acted (after its start record, before its heal);
        # fault_effect right after its stop record: elsewhere they are another window's
        if e["what"] == "fault_started" and not w["start"] <= e["t"] <= w["stop"] or \
                e["what"] == "fault_effect" and e.get("id") in stopped and e["t"] < w["stop"]:
            return _r(False, f"fault {e.get('id')}'s {e['what']} event lies outside its window: the history is not "
                             f"one run's")
    ended = {p.get("pid") for p in inp.probes if p.get("when") == "final"} | {
        e.get("pid") for e in inp.events if e.get("what") == "probe_silent" and e.get("when") == "final"} | retired_pids(inp)
    lost = [p for p in inp.probes if p.get("when") == "baseline" and p.get("node") != "client" and p.get("pid") not in ended]
    if lost and not bad:
        # at teardown the runner probes every node it still runs, or records it silent; a process a
        # fault took away is retired by its event: a node with none of these has lost its end
        p = lost[0]
        return _r(False, f"{p.get('node')} (pid {p.get('pid')}) has a baseline probe but neither a final probe, nor a "
                         f"silent one, nor a fault that stopped it: the history lost its end")
    # a process is its node and its pid: a pid is unique on one host only (nodes in pods each count theirs)
    finals = [(p.get("node"), p.get("pid")) for p in inp.probes if p.get("when") == "final" and p.get("pid") is not None]
    if len(finals) != len(set(finals)):
        return _r(False, "two final probes of one process: the history is not one run's")
    kinds = inp.meta.get("op_kinds")
    alien = [o for o in inp.all_ops if kinds is not None and o.get("f") not in kinds]
    if alien:
        return _r(False, f"op {alien[0]['id']} is a {alien[0].get('f')!r} op, a kind this family's workload never "
                         f"writes ({', '.join(map(str, kinds))}): the history is not one run's")
    by_worker: dict = {}
    for o in inp.all_ops:
        if finite(o.get("t_invoke")):
            by_worker.setdefault(o.get("process"), []).append(o)
    for w, mine in by_worker.items():
        # a worker makes one call at a time (measured: no overlap in 341 saved journals of the four
        # families): an op invoked while the worker's previous one had not ended moved in time
        mine.sort(key=lambda o: o["t_invoke"])
        for a, b in zip(mine, mine[1:]):
            if not finite(a.get("t_complete")) or b["t_invoke"] < a["t_complete"]:
                return _r(False, f"worker {w}'s op {b.get('id')} was invoked while its op {a.get('id')} had not ended: "
                                 f"a worker makes one call at a time, the history is not one run's")
    odd = [o for o in inp.all_ops if (o.get("phase") == "ok") != (o.get("outcome") == "ok")]
    if odd:
        o = odd[0]
        return _r(False, f"op {o['id']} reads phase {o.get('phase')!r} with outcome {o.get('outcome')!r}: "
                         f"the history contradicts itself")
    tally = _client_tally(inp)
    if tally:
        return _r(False, tally)
    if bad:
        e = bad[0]
        detail = e.get("error") or e.get("what_left") or e.get("fault") or (
            f"{e.get('role')} ({e.get('kind')}) at {e.get('when')}" if e.get("what") == "probe_silent" else "")
        return _r(False, f"{len(bad)} harness problem(s); first: {e['what']} {detail}".strip())
    if not any(p.get("when") == "final" for p in inp.probes):
        return _r(False, "no final probe of any node was recorded")
    return _r(True, "faults started and healed cleanly; every probe answered; nothing left behind")


@check("node_alive")
def node_alive(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """Every node of the topology is up and serving at the end (its final probe answered and says
    its serving threads are alive)."""
    final = [p for p in inp.probes if p.get("when") == "final"]
    early = final_too_early(inp, final)
    if early:
        return undecided(early)
    silent = [e for e in inp.events if e.get("what") == "probe_silent" and e.get("when") == "final"]
    dead = [p for p in final if not p.get("alive")]
    gone = retired_pids(inp)
    seen = {p.get("pid") for p in final} | {e.get("pid") for e in silent} | gone
    unknown = [p for p in inp.probes if p.get("when") == "baseline" and p.get("pid") not in seen]
    if unknown:
        p = unknown[0]
        return _r(False, f"{p.get('node')} ({p.get('kind')}) pid {p.get('pid')} started, but neither answered at "
                         f"the end nor was stopped: its state at the end is unknown")
    if silent:
        e = silent[0]
        return _r(False, f"{e.get('role')} ({e.get('kind')}) pid {e.get('pid')} did not answer at the end")
    if dead:
        p = dead[0]
        return _r(False, f"{p.get('node')} ({p.get('kind')}) process {p.get('pid')} is up but its serving "
                         f"thread is dead")
    if not final:
        return _r(False, "no final probe: no node answered its control channel at the end")
    return _r(True, f"{len(final)} nodes alive and serving at the end: "
                    f"{', '.join(str(p.get('node')) for p in final)}")


@check("no_stall")
def no_stall(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """No op stayed unanswered: a hung call is recorded as stalled when the runner gives up on it."""
    stalled = [o for o in inp.all_ops if o.get("outcome") == "stalled"]
    end = next((r for r in inp.records if r.get("type") == "end"), {})
    if not inp.all_ops:
        return _r(False, "no op in the history: nothing shows that ops return")
    if stalled:
        return _r(False, f"{len(stalled)} ops never returned (first: op {stalled[0]['id']}); the runner "
                         f"stopped the client", stalled=len(stalled))
    capped = [e for e in inp.events if e.get("what") == "workload_killed" and "cap" in str(e.get("reason", ""))]
    if end.get("reason") == "cap" or capped:  # the runner's event says so too: an end record alone cannot undo it
        return _r(False, "the scenario hit its wall-clock cap")
    return _r(True, f"every one of {len(inp.all_ops)} ops returned")


# faults whose window ends with the node's process started again (a new process locally; the same
# pod's container started again by the kubelet on a cluster): the history itself must show it
RESTARTING_FAULTS = ("restart", "kill", "node_down", "server_kill", "server_restart", "server_down")
CUTTING_FAULTS = ("partition", "refuse")  # faults that cut a network link: traffic across it must show the cut


def _spec_names(spec: Any, node: Any) -> bool:
    """Whether a fault's ``node`` parameter (a role, ``ROLE:*``, ``all``) names ``node``."""
    spec, node = str(spec), str(node)
    return spec == "all" or spec == node or (spec.endswith(":*") and node.startswith(spec[:-1]))


def _chaos_name(w: dict) -> str:
    """The Chaos Mesh object a window's fault made on a cluster (runtimes/k8s/manifests.py names it
    ``<fault type as a DNS label>-<fault id>``)."""
    return f"{re.sub(r'[^a-z0-9-]', '-', str(w.get('name')).lower()).strip('-')}-{w.get('id')}"


def _in(e: dict, w: dict) -> bool:
    return finite(e.get("t")) and w["start"] <= e["t"] <= w["stop"]


def _restart_unshown(inp: CheckInput, w: dict) -> str | None:
    """Why the history does not show that window ``w``'s node process started again, or None. The
    evidence, per node the fault acted on: a ``process_start`` inside the window of another process
    of that node (locally: the runner started it; its role, or for an event without one the kind of
    the process the window stopped), or a probe of the node after the window began whose process or
    start time (``counters.started``: a pod's container the kubelet started again keeps its pod uid)
    differs from its last probe before, or the ``chaos_restarted`` event's restart counts going up.
    The fault's own count (``acted``/``seen``: what Chaos Mesh reported) is not evidence."""
    spec = (w.get("params") or {}).get("node")
    gone = [e for e in inp.events if e.get("what") in ("process_kill", "process_stop") and _in(e, w)]
    roles = {str(e.get("role")) for e in gone if e.get("role") is not None}
    if spec is not None:
        roles |= {str(p.get("node")) for p in inp.probes if p.get("node") != "client" and _spec_names(spec, p.get("node"))}
    if not roles:
        return "no node it names appears in the history (no probe of it, no process stopped in its window)"
    chaos = [e for e in inp.events if e.get("what") == "chaos_restarted" and _in(e, w)
             and e.get("name", _chaos_name(w)) == _chaos_name(w)]
    if any(finite(e.get("restarts_before")) and finite(e.get("restarts_after")) and e["restarts_after"] > e["restarts_before"]
           for e in chaos):
        return None  # the kubelet's own restart count of the pods it selects went up
    gone_pids = {e.get("pid") for e in gone}
    for role in sorted(roles):
        kinds = {e.get("kind") for e in gone if str(e.get("role")) == role}
        started = [e for e in inp.events if e.get("what") == "process_start" and _in(e, w) and e.get("pid") not in gone_pids
                   and (str(e.get("role")) == role if e.get("role") is not None else e.get("kind") in kinds)]
        if started:
            continue
        mine = sorted((p for p in inp.probes if str(p.get("node")) == role and finite(p.get("t"))), key=lambda p: p["t"])
        before = [p for p in mine if p["t"] <= w["start"]]
        if before and any(_another_process(before[-1], p) for p in mine if p["t"] > w["start"]):
            continue
        return (f"nothing shows {role} started again: no process_start of it in the window, no probe of it after the "
                f"window began from another process or start time than its last one before")
    return None


def _another_process(a: dict, b: dict) -> bool:
    """Probe ``b`` is of another process than probe ``a``: another pid, or the same pid (a pod) whose
    processes started at another time (``counters.started``, both read: -1 is a count that failed)."""
    if a.get("pid") != b.get("pid"):
        return True
    sa, sb = ((x.get("counters") or {}).get("started") for x in (a, b))
    return finite(sa) and finite(sb) and sa >= 0 and sb >= 0 and sa != sb


def _cut_unshown(inp: CheckInput, w: dict, faults: dict) -> str | None:
    """Why the history does not show that window ``w`` cut its link, or None. Evidence from the
    traffic side: an op that failed inside the cut (from its start record to its heal plus its tail)
    in a way the fault explains, at a time no other fault window explains; or an op still in flight at
    the heal that had waited inside the cut (from when the fault had acted) longer than any op that
    succeeded outside every fault window took in all; or a probe across the link (Chaos Mesh's
    partitions: ``chaos_probe`` of its object, ``cut`` 1) that did not get through. The fault's own
    count (packets an iptables rule counted, a Chaos Mesh object's conditions) is not evidence."""
    name = _chaos_name(w)
    if any(e.get("what") == "chaos_probe" and e.get("name") == name and e.get("cut") == 1 and _in(e, w)
           for e in inp.events):
        return None
    f = faults.get(w.get("id"), {})
    explains = set(f.get("explains") or ()) | {"stalled"}
    others = [(v, window_tail_s(v, faults.get(v.get("id"), {}))) for v in inp.windows
              if v.get("id") != w.get("id") and finite(v.get("start")) and finite(v.get("stop"))]

    def other_covers(t: float, cats: set) -> bool:
        return any(v["start"] <= t <= v["stop"] + tail and cats & (set(faults.get(v.get("id"), {}).get("explains") or ())
                                                                  | {"stalled"}) for v, tail in others)

    tail = window_tail_s(w, f)
    for o in inp.all_ops:
        tc, cats = o.get("t_complete"), op_categories(o)
        if o.get("phase") != "ok" and finite(tc) and w["start"] <= tc <= w["stop"] + tail and cats & explains \
                and not other_covers(tc, cats):
            return None
    spans = [(v["start"], v["stop"] + t) for v, t in others] + [(w["start"], w["stop"] + tail)]
    healthy = [op_elapsed_ms(o) / 1000.0 for o in inp.all_ops if o.get("phase") == "ok" and finite(o.get("t_invoke"))
               and finite(o.get("t_complete")) and not any(o["t_invoke"] <= b and o["t_complete"] >= a for a, b in spans)]
    acted = [e["t"] for e in inp.events if e.get("what") == "fault_started" and e.get("id") == w.get("id") and _in(e, w)]
    since = min(acted) if acted else w["start"]
    if healthy:
        slowest = max(healthy)
        for o in inp.all_ops:
            ti, tc = o.get("t_invoke"), o.get("t_complete")
            if finite(ti) and ti < w["stop"] and (tc is None or finite(tc) and tc >= w["stop"]) \
                    and w["stop"] - max(ti, since) > slowest and not other_covers(w["stop"], op_categories(o) | {"stalled"}):
                return None
    return ("nothing on the traffic side shows the cut: no op failed in it as the fault explains, none was held "
            "across it longer than a healthy op takes" + ("" if healthy else " (no op succeeded outside every fault "
                                                         "window to compare with)") + ", no probe across it failed")


def _chaos_unrecorded(inp: CheckInput, w: dict, eff: dict) -> str | None:
    """A window whose effect reports what a Chaos Mesh object did (``injected``, ``recovered``,
    ``cut``) must have those events in the history, inside the window, saying the same."""
    if not any(k in eff for k in ("injected", "recovered", "cut")):
        return None
    name = _chaos_name(w)
    mine = [e for e in inp.events if str(e.get("what", "")).startswith("chaos_") and e.get("name") == name and _in(e, w)]
    for k, what in (("injected", "chaos_injected"), ("recovered", "chaos_recovered")):
        if finite(eff.get(k)) and eff[k] > 0 and not any(e.get("what") == what for e in mine):
            return f"its effect says {k} {eff[k]!r}, but no {what} event of {name} is in its window"
    if "cut" in eff:
        probes = [e.get("cut") for e in mine if e.get("what") == "chaos_probe"]
        if probes != [eff["cut"]]:
            return f"its effect says cut {eff['cut']!r}, but its window's probes across the link say {probes}"
    return None


@check("fault_effect")
def fault_effect(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """Every fault window did what its kind must do: the counts its fault reported at the heal
    (``fault_effect`` events: requests held or redirected, processes seen gone or stopped) reach
    what the fault requires (``required`` in the event and in the meta line's fault list). A
    scheduled fault that never opened a window, a window whose fault requires an effect and
    reported none, or less, tested nothing: the run is a harness error, never a verdict. Faults
    that cannot count what they did (toxics) are listed as unmeasured. What a fault reports is not
    enough for the faults whose effect the history can show from another side: a restart, kill or
    node_down must show its node's process started again (a process_start in the window, a probe
    after it from another process or start time, or the kubelet's restart count going up); a
    partition or refuse must show the cut on the traffic side (a request failed in it as the fault
    explains, or waited across it longer than any healthy one took, or a probe across the link did
    not get through); a Chaos Mesh window's injected/recovered/cut counts must match its chaos_*
    events. Absent that evidence the window cannot be shown to have acted: a harness error."""
    effects: dict = {}
    for e in inp.events:
        if e.get("what") == "fault_effect":
            if e.get("id") in effects:
                return _r(False, f"two fault_effect records for fault {e.get('id')}: the history is not one run's")
            effects[e.get("id")] = e
    scheduled = {f.get("id"): f for f in inp.meta.get("faults") or []}
    problems, judged, unmeasured = [], 0, []
    windows = {w.get("id"): w for w in inp.windows}
    for fid, f in scheduled.items():
        if fid not in windows or windows[fid].get("start") is None:
            problems.append(f"{f.get('type')} (fault {fid}) was scheduled but never started")
    for w in inp.windows:
        # a window is the scheduled fault of its id: the evidence a kind needs (a restart's new
        # process, a cut on the traffic side) is chosen by that kind, so a window whose record
        # names another fault (a kill or a partition saved as a fault that needs no such evidence)
        # or a fault the scenario never scheduled would be judged by the wrong bar
        want = (scheduled.get(w.get("id")) or {}).get("type")
        if w.get("id") not in scheduled:
            problems.append(f"{w.get('name')} (window {w.get('id')}) is no fault the scenario schedules: the history "
                            f"is not this scenario's")
            continue
        if want is not None and w.get("name") != want:
            problems.append(f"window {w.get('id')} is recorded as {w.get('name')!r}, but the scenario's fault "
                            f"{w.get('id')} is {want!r}: the history is not this scenario's")
            continue
        e = effects.get(w.get("id")) or {}
        # the bar is the higher of what the fault said at the heal and what the scenario's fault
        # declares (pdchaos check rebuilds that from the scenario file): neither can lower it
        req = dict((scheduled.get(w.get("id")) or {}).get("required") or {})
        for k, v in (e.get("required") or {}).items():
            if finite(v):
                req[k] = max(v, req.get(k, v))
        if not req:
            unmeasured.append(str(w.get("name")))
            continue
        judged += 1
        eff = e.get("effect")
        if not isinstance(eff, dict):
            problems.append(f"{w.get('name')} (window {w.get('id')}) reported no effect"
                            + (f": {e['error']}" if e.get("error") else ""))
            continue
        short = [f"{k} {eff.get(k)!r} < {v:g}" for k, v in req.items() if not finite(eff.get(k)) or eff.get(k) < v]
        if short:
            problems.append(f"{w.get('name')} (window {w.get('id')}) did not act: {', '.join(short)}")
            continue
        # what the fault reported is not enough: the history must show it from another side too
        why = _chaos_unrecorded(inp, w, eff)
        if why is None and w.get("name") in RESTARTING_FAULTS:
            why = _restart_unshown(inp, w)
        if why is None and w.get("name") in CUTTING_FAULTS:
            why = _cut_unshown(inp, w, scheduled)
        if why:
            problems.append(f"{w.get('name')} (window {w.get('id')}) cannot be shown to have acted: {why}")
    if problems:
        return _r(False, f"{len(problems)} fault windows without their effect; {problems[0]}", problems=problems[:5])
    note = f"; unmeasured: {', '.join(sorted(set(unmeasured)))}" if unmeasured else ""
    return _r(True, f"{judged} fault windows showed their effect{note}", judged=judged, unmeasured=len(unmeasured))


@check("triggers")
def triggers(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """Every event the scenario's claim rests on happened (``triggers:`` of the scenario, rebuilt
    from its file by ``pdchaos check``; harness/triggers.py): a trigger that did not fire, that no
    registry knows, or a history that declares none (or says ``none`` with faults scheduled) makes
    the run a harness error naming it, never a verdict; a scenario without faults that says
    ``{none: REASON}`` has it not applicable, with the reason. Lists each trigger with its evidence."""
    entries = inp.meta.get("triggers")
    faults = inp.meta.get("faults") or []
    reason = none_reason(entries)
    if reason is not None:
        if faults:  # pdchaos validate refuses this; a history that says it anyway tested nothing named
            return _r(False, f"none declared ({reason}), yet {len(faults)} faults are scheduled: a scenario with "
                             f"faults names the events its claim rests on, it cannot say none", seen=[])
        # a scenario without faults that said none has this check marked not applicable (harness/runner.py):
        # reaching it here means the meta line lost that mark, so nothing says the run may go unjudged
        return undecided(f"none declared ({reason}), but the meta line does not mark triggers not applicable")
    if entries is not None and not isinstance(entries, list):
        return undecided("the meta line's triggers are neither a list nor {none: REASON}")
    if not entries:
        return _r(False, "no trigger declared: a scenario names the events its claim rests on, or (without "
                         "faults) says `triggers: {none: REASON}`; this history does neither", seen=[])
    reg = inp.triggers if inp.triggers is not None else TRIGGERS
    seen, missed = [], []
    for i, e in enumerate(entries):
        name = e.get("type") if isinstance(e, dict) else None
        if name not in reg.predicates:
            return undecided(f"triggers[{i}]: no trigger {name!r} in the family's registry")
        try:
            params = reg.params[name].model_validate({k: v for k, v in e.items() if k != "type"}).model_dump()
        except Exception as exc:  # noqa: BLE001 - pydantic's ValidationError: parameters no run could have had
            return undecided(f"triggers[{i}] ({name}): bad parameters ({type(exc).__name__})")
        got = reg.predicates[name](inp, params)
        (seen if got.fired else missed).append(f"{name}: {got.evidence}")
    if missed:
        return _r(False, f"{len(missed)} of {len(entries)} triggers did not fire, the scenario's point never "
                         f"happened; {missed[0]}", missed=missed, seen=seen)
    return _r(True, f"{len(seen)} triggers fired: " + "; ".join(seen), seen=seen)


def retired_pids(inp: CheckInput, how: tuple[str, ...] = ("process_kill", "process_stop")) -> set:
    """Pids of node processes a fault stopped or killed (``how``: the events that count): the
    harness's kill/stop event of that pid inside a window of a fault that ran (its start record
    is written before the fault acts, its stop record after the heal). A kill or stop event at any
    other time retires nothing: no process may be excused from its final probe by an event alone."""
    spans = [(w["start"], w["stop"]) for w in inp.windows if finite(w.get("start")) and finite(w.get("stop"))]
    return {e.get("pid") for e in inp.events if e.get("what") in how and finite(e.get("t"))
            and any(a <= e["t"] <= b for a, b in spans)}


def last_heal(inp: CheckInput) -> float | None:
    """When the last fault window closed (its stop record, written once the heal was done; a window
    without one closes at the history's end); None without a window."""
    stops = [w["stop"] for w in inp.windows if w.get("start") is not None and finite(w.get("stop"))]
    return max(stops) if stops else None


def final_too_early(inp: CheckInput, finals: list[dict]) -> str | None:
    """Why one of ``finals`` (final probes) cannot show the state after the run, or None. A node's
    final probe is the harness's, taken at teardown once every fault healed (harness/runner.py:
    the heals, then ``final_probe``), so one timed before the last heal's stop record shows a node
    still under a fault, not after it. The client's is its own, written when its last op ended
    (nodekit/workload.py ``finish``): that may come before a slow heal (a killed P started again
    after the workload's last request, pd-kill-prefill-before-pull), and it is the client's end as
    long as no op record of the history comes after it. A final probe without a finite time shows
    nothing. Checks that judge after the run (no_leaks, node_alive, the families' drained) cannot
    judge from such a probe: they fail as undecided, never pass."""
    t0 = inp.meta.get("t0") or 0.0
    heal = last_heal(inp)
    op_ts = [r["t"] for r in inp.records if r.get("type") == "op" and finite(r.get("t"))]
    for p in finals:
        t, who = p.get("t"), f"{p.get('node')} (pid {p.get('pid')})"
        if not finite(t):
            return f"{who}: its final probe has no finite time ({t!r}): whether it came after the run is unknown"
        if p.get("node") == "client":
            if op_ts and t < max(op_ts):
                return (f"the client's final probe ({t - t0:.2f} s) comes before an op record of its history "
                        f"({max(op_ts) - t0:.2f} s): it is not the client's end")
        elif heal is not None and t < heal:
            return (f"{who}: its final probe was taken at {t - t0:.2f} s, before the last fault healed ({heal - t0:.2f} s): "
                    f"it cannot show the state after the run")
    return None


def history_end(inp: CheckInput) -> float:
    """The time of the history's last record: where the span of an op that never completed ends."""
    return max((r.get("t", 0.0) for r in inp.records if "t" in r), default=0.0)


def op_span(o: dict, end: float) -> tuple[Any, Any]:
    """An op's span (invoke, complete), ``end`` for an op that never completed; a side is None or
    not finite when the journal lacks it (check with :func:`finite`)."""
    b = o.get("t_complete")
    return o.get("t_invoke"), end if b is None else b


def window_tail_s(w: dict, fault: dict) -> float:
    """How long after window ``w`` a failure may still be its fault's doing: the tail the journal's
    fault list declares, or the shorter one its stop record gives (``Fault.tail_after_heal``)."""
    declared = float(fault.get("tail_s") or 0.0)
    own = w.get("tail_s")
    return min(declared, float(own)) if finite(own) and own >= 0 else declared


def in_window(a: float, b: float, w: dict, tail_s: float) -> bool:
    """The span [a, b] overlaps fault window ``w`` (its start to its heal) plus ``tail_s``."""
    return a <= float(w["stop"]) + tail_s and b >= w["start"]


def op_categories(o: dict) -> set[str]:
    """The categories a failed op is known by: its ``outcome`` (``http_502``, ``timeout``,
    ``stalled``) and, when the client learnt where it failed, ``outcome@error_phase``."""
    cat = str(o.get("outcome") or "unknown")
    return {cat, f"{cat}@{o['error_phase']}"} if o.get("error_phase") else {cat}


class FailuresExplainedOptions(CheckOptions):
    tail: Duration | None = Field(None, description="how long after each fault window a failure may still be "
                                  "its doing, instead of what each fault declares (damage measured to outlast "
                                  "the heal)")
    allow: list[str] = Field(default_factory=list, description="op failure categories (outcome or "
                             "outcome@error_phase) the scenario allows outside fault windows")


@check("failures_explained", FailuresExplainedOptions)
def failures_explained(inp: CheckInput, opts: dict) -> CheckResult:
    """Every op the client saw fail (any phase but ok, stalled ones included) is explained by a
    fault: its span overlaps a fault window (start to heal, plus the tail the fault declares,
    ``tail_s`` in the journal's fault list) of a fault that declares it may cause that failure
    (``explains``: ``outcome`` or ``outcome@error_phase``; a fault that explains any failure also
    explains a stalled op: a client without a deadline hangs where it would have failed).
    Outside windows and tails every op
    succeeds, unless the scenario allows a category anywhere (option ``allow``) or sets every
    fault's tail itself (option ``tail``: damage it measured to outlast the heal). Lists the
    unexplained ones."""
    allow = set(opts.get("allow") or ())
    tail_opt = opts.get("tail_ms")  # the scenario's own tail for every fault (damage it measured to last)
    faults = {f.get("id"): f for f in inp.meta.get("faults") or []}
    end = history_end(inp)
    failed = [o for o in inp.all_ops if o.get("phase") != "ok"]
    unexplained, by = [], {}
    for o in failed:
        cats = op_categories(o)
        if cats & allow:
            continue
        a, b = op_span(o, end)
        ok = False
        if not finite(a) or not finite(b):  # no invoke record: its span is unknown, so nothing explains it
            unexplained.append(o)
            by["no_span"] = by.get("no_span", 0) + 1
            continue
        for w in inp.windows:
            f = faults.get(w.get("id"), {})
            explains = set(f.get("explains") or ())
            if explains:  # a fault that may fail a call may also hang one in a client without a deadline
                explains.add("stalled")
            if w.get("start") is None or not (explains & cats):
                continue
            tail = float(tail_opt) / 1000.0 if tail_opt is not None else window_tail_s(w, f)
            if in_window(a, b, w, tail):
                ok = True
                break
        if not ok:
            unexplained.append(o)
            key = "/".join(sorted(cats))
            by[key] = by.get(key, 0) + 1
    if unexplained:
        o = unexplained[0]
        t0 = inp.meta.get("t0") or 0.0
        return _r(False, f"{len(unexplained)} of {len(failed)} failed ops not explained by a fault window "
                         f"({', '.join(f'{n} x {k}' for k, n in sorted(by.items()))}); first: op {o['id']} "
                         f"{o.get('outcome')} invoked at {o.get('t_invoke', 0.0) - t0:.2f} s",
                  unexplained=_first([o["id"] for o in unexplained], 20), by_category=by)
    return _r(True, f"{len(failed)} failed ops, each in the window of a fault that explains it"
              + (f" (allowed anywhere: {', '.join(sorted(allow))})" if allow else ""), failed=len(failed))


# --------------------------------------------------------------------------- running


def run_checks(inp: CheckInput, config: dict[str, dict], checks: dict[str, Checker] | None = None,
               not_applicable: dict[str, str] | None = None) -> list[CheckResult]:
    """Run ``checks`` (default: the generic ones) with ``config`` {name: options}; a check with
    ``enabled: false`` is left out, one in ``not_applicable`` is reported as such (ok None) and not
    run. A check that returns None from a history it should have decided fails, saying why."""
    out = []
    na = not_applicable or {}
    from .verdicts import ERROR_CHECKS

    faults = (getattr(inp, "meta", None) or {}).get("faults")
    for name, fn in (CHECKS if checks is None else checks).items():
        opts = config.get(name, {})
        said_none = none_reason((getattr(inp, "meta", None) or {}).get("triggers"))
        if name == "triggers" and not faults and said_none is not None \
                and na.get(name) == f"none declared: {said_none}":
            # a scenario without faults that said its claim rests on no event, and why: shown as such
            out.append(CheckResult(name, None, f"not applicable: {na[name]}"))
            continue
        guard = name in ERROR_CHECKS and not (name == "fault_effect" and not faults)
        if opts.get("enabled", True) is False and not guard:
            continue
        if name in na and not guard:
            out.append(CheckResult(name, None, f"not applicable: {na[name]}"))
            continue
        try:
            r = fn(inp, opts)
        except Exception as exc:  # a checker bug must show, not pass
            r = CheckResult(name, False, f"{RAISED}{type(exc).__name__}: {exc}")
        if r.ok is None:
            r.ok, r.message = False, f"undecided: {r.message}"
        out.append(r)
    return out


def verdict(results: list[CheckResult]) -> str:
    """error / stall / fail / pass: see harness/verdicts.py."""
    from .verdicts import of_results

    return of_results(results)[0]


def run_logs(jp: Path, records: list[dict]) -> dict[str, str]:
    """Every log of one scenario run: the nodes' logs (``logs/``), servers' own logs in the run's
    folder (``server-logs/``), and every log a ``server_log`` event names (a warm server's log
    lives in the run folder and spans the scenarios it served). A named log that cannot be found
    is listed under ``missing:<name>`` with empty text, so log_hygiene cannot pass it unread."""
    logs: dict[str, str] = {}
    for sub in ("logs", "server-logs"):
        for log in sorted((jp.parent / sub).glob("*.log")):
            logs[f"{sub}/{log.name}"] = log.read_text(encoding="utf-8", errors="replace")
    for e in records:
        if e.get("type") != "event" or e.get("what") != "server_log" or not e.get("path"):
            continue
        p = Path(str(e["path"]))
        # absolute when written; a run folder moved since: the same name under this run's folders
        tries = [p, jp.parent / "server-logs" / p.name, jp.parent.parent.parent / "pooled-logs" / p.name]
        found = next((t for t in tries if t.is_file()), None)
        key = f"{found.parent.name}/{found.name}" if found is not None else f"missing:{p.name}"
        if key not in logs:
            logs[key] = found.read_text(encoding="utf-8", errors="replace") if found is not None else ""
    return logs
