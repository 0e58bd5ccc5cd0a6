"""Triggers: the events a scenario's claim rests on, and whether they happened.

A fault that acted (``fault_effect``) is not yet the point of a scenario: a hardened "pass" under a
stopped D means something only when a request was in flight while D was stopped; a scenario about a
prompt whose greedy answer is EOS means something only when that prompt was sent and answered. A
scenario names these events under ``triggers:``::

    triggers:
      - {type: ops_in_window, fault: 0, min: 1}   # a request was in flight during fault 0's window
      - {type: prompt_answered, index: 12}       # (pd) the EOS prompt went through P and D

Each trigger is a pure predicate over the saved history, registered under its YAML name (generic
ones here, a family's own on ``Family.triggers``), with a pydantic model of its parameters. The
generic check ``triggers`` (harness/checks.py) evaluates every trigger of the run; one that did not
fire makes the run a harness error naming it (it is one of ``verdicts.ERROR_CHECKS``): the
scenario's point never happened, so no verdict about it is honest.

Every scenario declares its triggers; there is no default. A scenario whose claim rests on no event
beyond its workload running (a baseline without faults) says so, with the reason::

    triggers: {none: "baseline without faults: every request is the claim"}

A scenario with faults (``faults:`` or ``random_faults:``) cannot say ``none``: a fault is there to
be met by something, and that meeting is what its claim rests on (``pdchaos validate`` refuses it, and
the check fails such a history). For a scenario without faults that says ``none`` the check is not
applicable and the report shows the reason; a history that declares neither (a journal written before
declarations were required) fails the check: "no trigger declared" is never a pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, field_validator


class NoTriggers(BaseModel):
    """``triggers: {none: REASON}``: the claim rests on no event beyond the workload running."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    none: str = Field(min_length=1, description="why no event is named (e.g. a baseline without faults); "
                                                "only a scenario without faults may say it")

    @field_validator("none")
    @classmethod
    def _reason(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("a reason is required: say why the claim rests on no event")
        return v.strip()


def none_reason(declared: Any) -> str | None:
    """The reason of a ``{none: REASON}`` declaration as the meta line holds it, else None."""
    if isinstance(declared, dict) and set(declared) == {"none"} and isinstance(declared["none"], str) \
            and declared["none"].strip():
        return declared["none"].strip()
    return None


class TriggerParams(BaseModel):
    """Parameters of a trigger entry (``type`` is added by the scenario schema)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass
class Fired:
    """What a trigger found: ``fired`` and the evidence (counts and times, never payloads)."""

    fired: bool
    evidence: str


Predicate = Callable[[Any, dict], Fired]  # (harness.checks.CheckInput, params) -> Fired


class TriggerRegistry:
    def __init__(self, owner: str):
        self.owner = owner
        self.predicates: dict[str, Predicate] = {}
        self.params: dict[str, type[TriggerParams]] = {}
        self.docs: dict[str, str] = {}

    def trigger(self, name: str, params: type[TriggerParams] = TriggerParams):
        if not (isinstance(params, type) and issubclass(params, TriggerParams)):
            raise TypeError(f"trigger {name!r} in {self.owner}: params must be a TriggerParams subclass")

        def deco(fn: Predicate) -> Predicate:
            if name in self.predicates:
                raise TypeError(f"trigger {name!r} registered twice in {self.owner}")
            self.predicates[name] = fn
            self.params[name] = params
            self.docs[name] = " ".join((fn.__doc__ or "").split())
            return fn
        return deco


GENERIC = TriggerRegistry("the generic triggers")


def registry_for(family: Any) -> TriggerRegistry:
    """The generic triggers and the family's own (a family may not reuse a generic name)."""
    out = TriggerRegistry(f"family {family.name!r} with the generic triggers")
    for reg in (GENERIC, getattr(family, "triggers", None)):
        if reg is None:
            continue
        for name, fn in reg.predicates.items():
            if name in out.predicates:
                raise TypeError(f"family {family.name!r}: trigger {name!r} is already a generic trigger")
            out.predicates[name], out.params[name], out.docs[name] = fn, reg.params[name], reg.docs[name]
    return out


# --------------------------------------------------------------------------- generic triggers

def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


class OpsInWindow(TriggerParams):
    fault: int = Field(ge=0, description="the fault entry (0-based, in file order) whose window is meant")
    min: int = Field(1, ge=1, le=1000, description="at least this many ops in flight during the window")
    f: str | None = Field(None, description="only ops of this kind (default: the workload's main operation)")
    at_start: bool = Field(False, description="count only ops in flight at the instant the fault acted (e.g. "
                                              "the request a kill or a cut caught), not ones sent later in its window")
    at_once: bool = Field(False, description="``min`` ops in flight together at one instant of the window, not "
                                             "one after another")
    since_start: bool = Field(False, description="count from the window's start record, not from when the fault "
                                                 "had acted: for a fault whose start is the whole action (a restart, "
                                                 "whose start returns once the new server is up)")


def _acted_at(inp: Any, fid: int) -> float | None:
    """When fault ``fid``'s injection had been done: its ``fault_started`` event (written once the
    fault's start returned; the window's start record is written before it acts)."""
    ts = [e.get("t") for e in inp.events if e.get("what") == "fault_started" and e.get("id") == fid]
    return ts[0] if len(ts) == 1 and _finite(ts[0]) else None


@GENERIC.trigger("ops_in_window", OpsInWindow)
def ops_in_window(inp: Any, params: dict) -> Fired:
    """At least ``min`` ops were in flight while fault ``fault`` acted: invoked before its heal and
    not completed before the fault had acted (its ``fault_started`` event; an op still open at the
    end counts as in flight to the end). ``at_start``: in flight at that instant; ``at_once``:
    ``min`` of them in flight together; ``since_start``: from the window's start instead (a fault
    whose start is its whole action, e.g. a restart)."""
    kind = params.get("f")
    ops = [o for o in (inp.all_ops if kind else inp.ops) if kind is None or o.get("f") == kind]
    return in_flight(inp, params, ops, f"{kind} ops" if kind else "ops")


def in_flight(inp: Any, params: dict, ops: list[dict], what: str) -> Fired:
    """``ops_in_window`` over the given ``ops`` (a family's trigger narrows them, e.g. to one node's):
    ``params`` holds ``fault``, ``min``, ``at_start`` and ``at_once``; ``what`` names the ops in the evidence."""
    fid, need = params["fault"], params.get("min", 1)
    w = next((w for w in inp.windows if w.get("id") == fid), None)
    if w is None or not _finite(w.get("start")) or not _finite(w.get("stop")):
        return Fired(False, f"fault {fid} never opened a window")
    acted = _acted_at(inp, fid)
    if acted is None or not w["start"] <= acted <= w["stop"]:
        return Fired(False, f"fault {fid} ({w.get('name')}) has no one record of when it acted inside its window")
    lo = w["start"] if params.get("since_start") else acted
    hi = acted if params.get("at_start") else w["stop"]
    spans = []
    for o in ops:
        a, b = o.get("t_invoke"), o.get("t_complete")
        if not _finite(a) or (b is not None and not _finite(b)):
            continue
        if a <= hi and (b is None or b > lo):
            spans.append((max(a, lo), hi if b is None else min(b, hi)))
    n = len(spans)
    how = (" at the instant it acted" if params.get("at_start") else "") + \
        (" from its start" if params.get("since_start") else "")
    if params.get("at_once"):
        edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda e: (e[0], -e[1]))
        cur = peak = 0
        for _, d in edges:
            cur += d
            peak = max(peak, cur)
        return Fired(peak >= need, f"at most {peak} {what} in flight together during {w.get('name')}{how} "
                                   f"(fault {fid}; {need} needed)")
    return Fired(n >= need, f"{n} {what} in flight during {w.get('name')}{how} (fault {fid}; {need} needed)")


class OpsCompleted(TriggerParams):
    f: str | None = Field(None, description="only ops of this kind (e.g. `reset`; default: the workload's main "
                                            "operation)")
    min: int = Field(1, ge=1, le=100000, description="at least this many such ops completed")


@GENERIC.trigger("ops_completed", OpsCompleted)
def ops_completed(inp: Any, params: dict) -> Fired:
    """At least ``min`` ops of kind ``f`` were sent and came back with an answer, whatever it said
    (a completion record, ``ok`` or ``fail``; one that never returned or whose end is unknown does
    not count): a claim about an operation of the workload's own (e.g. the admin reset a scenario
    without faults is about) rests on it having happened."""
    kind, need = params.get("f"), params.get("min", 1)
    ops = [o for o in (inp.all_ops if kind else inp.ops) if kind is None or o.get("f") == kind]
    done = [o for o in ops if o.get("phase") in ("ok", "fail") and _finite(o.get("t_complete"))]
    what = f"{kind} ops" if kind else "ops"
    return Fired(len(done) >= need, f"{len(done)} of {len(ops)} {what} sent came back answered ({need} needed)")


class PhaseKeyed(TriggerParams):
    fault: int = Field(ge=0, description="the fault entry (0-based, in file order) keyed on a phase (`upon:`)")
    max_lag: float = Field(0.25, gt=0, le=10.0, description="at most this many seconds between the phase "
                                                             "event plus its offset and the fault's start")
    before: str | None = Field(None, description="a phase of the same node that must not have come between the "
                                                 "keyed event and the moment the fault had acted (its fault_started "
                                                 "event): e.g. P frozen before it answered the pull it was serving")


@GENERIC.trigger("phase_keyed", PhaseKeyed)
def phase_keyed(inp: Any, params: dict) -> Fired:
    """Fault ``fault`` started at the protocol phase its entry names (``upon:``, harness/phases.py):
    its start record names that phase, the phase event it names is in the history (journalled from
    the node that wrote it), and the fault started ``offset`` after it, at most ``max_lag`` s late;
    with ``before``, that phase of the same node did not come between the event and the moment the
    fault had acted (its ``fault_started`` event): the fault caught what it was keyed on.
    A fault whose phase never came has no start record: the trigger does not fire."""
    fid, lag_max = params["fault"], params.get("max_lag", 0.25)
    declared = next((f for f in inp.meta.get("faults") or [] if f.get("id") == fid), None)
    on = (declared or {}).get("upon")
    if not isinstance(on, dict):
        return Fired(False, f"fault {fid} is not keyed on a phase (no `upon:` in its entry)")
    starts = [r for r in inp.records if r.get("type") == "fault" and r.get("id") == fid and r.get("phase") == "start"]
    if len(starts) != 1:
        return Fired(False, f"fault {fid} has {len(starts)} start records (phase {on.get('phase')} never came, "
                            f"or the history is not one run's)")
    start = starts[0]
    keyed = start.get("keyed")
    if not isinstance(keyed, dict) or keyed.get("phase") != on.get("phase"):
        return Fired(False, f"fault {fid}'s start record does not name phase {on.get('phase')} as what started it")
    t_ph, t_start, offset = keyed.get("t_phase"), start.get("t"), on.get("offset", 0.0)
    if not (_finite(t_ph) and _finite(t_start) and _finite(offset)):
        return Fired(False, f"fault {fid}: its phase or start time is not a number")
    seen = [e for e in inp.events if e.get("what") == "phase" and e.get("phase") == on.get("phase")
            and e.get("t") == t_ph and (not on.get("node") or e.get("role") == on.get("node"))]
    if not seen:
        return Fired(False, f"fault {fid}: the {on.get('phase')} event its start names is not in the history")
    lag = t_start - (t_ph + offset)
    ok = -1e-6 <= lag <= lag_max
    said = (f"fault {fid} started {lag * 1000:.1f} ms after {on.get('phase')} (of {seen[0].get('role')})"
            f" + {offset * 1000:g} ms offset ({lag_max * 1000:g} ms allowed)")
    before = params.get("before")
    if ok and before:
        acted = _acted_at(inp, fid)
        if acted is None:
            return Fired(False, f"{said}; no one record of when it had acted")
        early = [e for e in inp.events if e.get("what") == "phase" and e.get("phase") == before
                 and e.get("role") == seen[0].get("role") and _finite(e.get("t")) and t_ph <= e["t"] <= acted]
        ok = not early
        said += (f"; {before} came {(early[0]['t'] - t_ph) * 1000:.1f} ms after the phase, before the fault had "
                 f"acted ({(acted - t_ph) * 1000:.1f} ms)" if early else
                 f"; it had acted {(acted - t_ph) * 1000:.1f} ms after the phase, before any {before}")
    return Fired(ok, said)
