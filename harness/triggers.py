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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field


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


@GENERIC.trigger("ops_in_window", OpsInWindow)
def ops_in_window(inp: Any, params: dict) -> Fired:
    """At least ``min`` ops were in flight while fault ``fault`` acted: invoked before its heal
    and not completed before its start (an op still open at the end counts as in flight to the end)."""
    fid, need, kind = params["fault"], params.get("min", 1), params.get("f")
    w = next((w for w in inp.windows if w.get("id") == fid), None)
    if w is None or not _finite(w.get("start")) or not _finite(w.get("stop")):
        return Fired(False, f"fault {fid} never opened a window")
    ops = [o for o in (inp.all_ops if kind else inp.ops) if kind is None or o.get("f") == kind]
    n = 0
    for o in ops:
        a, b = o.get("t_invoke"), o.get("t_complete")
        if not _finite(a):
            continue
        if a < w["stop"] and (b is None or (_finite(b) and b > w["start"])):
            n += 1
    what = f"{kind} ops" if kind else "ops"
    return Fired(n >= need, f"{n} {what} in flight during {w.get('name')} (fault {fid}; {need} needed)")
