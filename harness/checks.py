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

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import journal as J


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


class CheckRegistry:
    """Checks by YAML name. Registering a name twice is an error, as it is for faults."""

    def __init__(self, owner: str):
        self.owner = owner
        self.checks: dict[str, Checker] = {}

    def check(self, name: str):
        def deco(fn):
            if name in self.checks:
                raise TypeError(f"check {name!r} registered twice in {self.owner}")
            self.checks[name] = lambda inp, opts: _named(name, fn(inp, opts))
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
    if not inp.all_ops:
        return _r(False, "no op in the history: nothing returned, so nothing was bounded")
    late = [o for o in inp.all_ops if o.get("outcome") == "stalled" or (o.get("elapsed_ms") or 0) > limit]
    worst = max((o.get("elapsed_ms") or 0 for o in inp.all_ops), default=0)
    n = len(inp.all_ops)
    det = {"limit_ms": limit, "deadline_ms": deadline, "tolerance_ms": tol, "worst_ms": worst,
           "late_ops": _first([o["id"] for o in late])}
    if late:
        o = late[0]
        how = "never returned" if o.get("outcome") == "stalled" else f"took {o['elapsed_ms']:.1f} ms"
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


@check("recovery")
def recovery(inp: CheckInput, opts: dict) -> CheckResult:
    """After every fault window closes (overlapping windows merged), until the next one opens:
    each worker (one client each) that issues ops there succeeds, with the expected value, within
    its first N. A worker still busy with a call begun during the fault may issue none. Two
    windows with no op at all between them are judged as one period; if no op follows the last
    one, recovery cannot be shown, and that fails. (The schedule is validated to leave every
    worker time for N ops after each window.)"""
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
            bad.append(f"no op was invoked after {label} before the end of the run")
        for w, ops in by_worker.items():
            first = ops[:within]
            if not any(o.get("phase") == "ok" and o.get("value") == o.get("expected") for o in first):
                bad.append(f"after {label}, worker {w}'s op {first[0]['id']} was {first[0].get('outcome')}")
    if bad:
        return _r(False, f"{len(bad)} fault windows/workers without recovery within {within} ops; {bad[0]}",
                  problems=bad[:5])
    note = f" ({joined} windows with no op before the next one judged with it)" if joined else ""
    return _r(True, f"recovered after all {len(merged)} fault periods within {within} ops{note}", joined=joined)


@check("no_leaks")
def no_leaks(inp: CheckInput, opts: dict) -> CheckResult:
    """Every node process still running at the end (client included) is back to the threads and
    fds of its baseline probe, taken when it started. Every node must have given both probes. A
    process stopped, killed or swapped out during the run is not compared (its clients were still
    connected when it went, and the OS reclaims whatever it held)."""
    slack = int(opts.get("slack", 0))
    retired = {e.get("pid") for e in inp.events if e.get("what") in ("process_kill", "process_stop")}
    problems, compared = [], []
    for e in inp.events:
        if e.get("what") == "probe_silent" and e.get("when") in ("baseline", "final"):
            problems.append(f"{e.get('role')} ({e.get('kind')}) pid {e.get('pid')} gave no {e.get('when')} probe")
    finals = {p.get("pid"): p for p in inp.probes if p.get("when") == "final"}
    for b in (p for p in inp.probes if p.get("when") == "baseline"):
        who = f"{b.get('node')} ({b.get('kind') or 'node'}) pid {b.get('pid')}"
        fin = finals.get(b.get("pid"))
        if fin is None:
            if b.get("pid") not in retired:
                problems.append(f"{who}: no final probe, and it was not stopped during the run")
            continue
        compared.append(str(b.get("node")))
        for k in ("threads", "fds"):
            if (fin.get(k) or 0) > (b.get(k) or 0) + slack:
                problems.append(f"{who}: {k} {b.get(k)} -> {fin.get(k)}")
    if problems:
        return _r(False, "; ".join(problems[:4]), problems=problems)
    if not compared:
        return _r(False, "no node was probed at baseline and at the end: nothing to compare")
    return _r(True, f"threads and fds back to baseline ({', '.join(sorted(set(compared)))})")


_PIECES = (re.compile(r"[0-9a-fA-F]{16,}"), re.compile(r"[0-9A-Za-z]{16,}"))


@check("log_hygiene")
def log_hygiene(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """No log holds a secret of the run (a key, a prompt: the family says which), nor a 16+
    character piece of one, nor any text matching the family's pattern (e.g. 32+ hex digits)."""
    if not inp.logs:
        return _r(False, "no logs captured: every node writes one, so something lost them")
    pattern = re.compile(inp.log_pattern) if inp.log_pattern else None
    secrets = [x.lower() for x in inp.secrets if len(x) >= 16]
    hits = []
    for name, text in inp.logs.items():
        if pattern is not None and pattern.search(text):
            hits.append(name)
            continue
        low_text = text.lower()
        if any(x in low_text for x in secrets) or any(
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


HARNESS_PROBLEMS = ("fault_error", "probe_failed", "probe_silent", "leftovers", "nemesis_stuck")


@check("harness_integrity")
def harness_integrity(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """The run itself went as planned: every fault started and healed without error, every probe
    of a running node answered (baseline, before a stop, final), nothing outlived the teardown."""
    bad = [e for e in inp.events if e.get("what") in HARNESS_PROBLEMS]
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
    silent = [e for e in inp.events if e.get("what") == "probe_silent" and e.get("when") == "final"]
    dead = [p for p in final if not p.get("alive")]
    gone = {e.get("pid") for e in inp.events if e.get("what") in ("process_kill", "process_stop")}
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
    stalled = [o for o in inp.all_ops if o.get("outcome") == "stalled"]
    end = next((r for r in inp.records if r.get("type") == "end"), {})
    if not inp.all_ops:
        return _r(False, "no op in the history: nothing shows that ops return")
    if stalled:
        return _r(False, f"{len(stalled)} ops never returned (first: op {stalled[0]['id']}); the runner "
                         f"stopped the client", stalled=len(stalled))
    if end.get("reason") == "cap":
        return _r(False, "the scenario hit its wall-clock cap")
    return _r(True, f"every one of {len(inp.all_ops)} ops returned")


# --------------------------------------------------------------------------- running


def run_checks(inp: CheckInput, config: dict[str, dict], checks: dict[str, Checker] | None = None,
               not_applicable: dict[str, str] | None = None) -> list[CheckResult]:
    """Run ``checks`` (default: the generic ones) with ``config`` {name: options}; a check with
    ``enabled: false`` is left out, one in ``not_applicable`` is reported as such (ok None) and not
    run. A check that returns None from a history it should have decided fails, saying why."""
    out = []
    na = not_applicable or {}
    for name, fn in (CHECKS if checks is None else checks).items():
        opts = config.get(name, {})
        if opts.get("enabled", True) is False:
            continue
        if name in na:
            out.append(CheckResult(name, None, f"not applicable: {na[name]}"))
            continue
        try:
            r = fn(inp, opts)
        except Exception as exc:  # a checker bug must show, not pass
            r = CheckResult(name, False, f"checker error: {type(exc).__name__}: {exc}")
        if r.ok is None:
            r.ok, r.message = False, f"undecided: {r.message}"
        out.append(r)
    return out


def verdict(results: list[CheckResult]) -> str:
    if any(r.name == "no_stall" and r.ok is False for r in results):
        return "stall"
    if any(r.ok is False for r in results):
        return "fail"
    return "pass"


def load_input(journal_path: str | Path) -> tuple[CheckInput, dict[str, Checker]]:
    """The check input of a saved run and the checks its family runs (found from the meta line)."""
    from .family import DEFAULT_FAMILY, get_family

    jp = Path(journal_path)
    records = J.read_journal(jp)
    family = get_family(J.meta(records).get("family") or DEFAULT_FAMILY)
    logs = {}
    for log in sorted((jp.parent / "logs").glob("*.log")):
        logs[log.name] = log.read_text(encoding="utf-8", errors="replace")
    inp = CheckInput(records, logs, family.log_secrets(jp.parent), family.log_pattern)
    return inp, checks_for(family)


def check_saved(journal_path: str | Path) -> list[CheckResult]:
    """Re-run the checks of one saved scenario run, with the options and applicability it saved."""
    inp, checks = load_input(journal_path)
    return run_checks(inp, inp.meta.get("checks") or {}, checks, inp.meta.get("not_applicable") or {})
