"""Faults keyed on protocol phases: the nemesis waits for an event a node journals, then acts.

A fault at a fixed time lands wherever the system happens to be; the interesting interleavings are
the narrow ones (P has just begun writing a request's KV, D's bootstrap query is out). A family
whose nodes journal their protocol events declares the phase names (``Family.phases``: name ->
what is seen, where), its topology says where the live events are (``phase_files()``: node role
-> a JSON-lines file, one ``{"t": <time.monotonic()>, "phase": NAME}`` per line, appended by the
node), and a fault entry may say when to act relative to one::

    faults:
      - {type: kill, node: prefill:0, at: 1s, for: 2s,
         upon: {phase: p_write_started, offset: 0ms, nth: 1, within: 6s}}

``at`` becomes the time the fault is *armed* (from the workload start, as before); the fault
starts ``offset`` after the ``nth`` ``phase`` event (of any node, or of ``node`` when given) whose
time is at or after the arming, and is healed ``for`` after it started. When that event has not
come ``within`` of the arming, the fault never starts and the run is a harness error naming the
phase: a phase that never came tested nothing, so no verdict about it is honest. Schedule checks
(a fault ends inside the workload, recovery gaps) take the latest the fault may act:
``at + within + offset + for``.

The fault's start record in the journal carries ``keyed`` (phase, nth, the event's time and node,
offset, when it was armed); every phase event seen during the run is journalled as an event
``phase`` (role, phase, t: counts and times, never a request id); the generic trigger
``phase_keyed`` (harness/triggers.py) proves a keyed fault acted where its scenario says.

The core never names a phase: it waits on events by name; the family declares them. A family
may say a phase is seen only on some targets (``Family.phase_targets``): a scenario that keys a
fault on it and runs another target is refused by ``pdchaos validate``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import BaseModel, ConfigDict, Field

from faults.base import Duration

POLL_S = 0.002  # how often the nemesis reads the phase files while a keyed fault is armed
WITHIN_DEFAULT_S = 5.0
MAX_JOURNALLED = 20000  # phase events written into one run's journal, at most (the rest are counted)


class PhaseKey(BaseModel):
    """``upon:`` of a fault entry: act at a protocol phase instead of at a fixed time. (Not ``on:``:
    YAML 1.1 reads that key as ``true``.)"""

    model_config = ConfigDict(extra="forbid", frozen=True)
    phase: str = Field(description="the phase event to wait for (the family declares its names)")
    offset: Duration = Field(0.0, description="how long after the event the fault starts (e.g. 0ms, 200ms)")
    nth: int = Field(1, ge=1, le=1000, description="the nth such event at or after the fault is armed (`at`)")
    within: Duration = Field(WITHIN_DEFAULT_S, description="how long after `at` the event may take to come; "
                             "when it has not come by then the fault never starts and the run is a harness error")
    node: Optional[str] = Field(None, description="only events of this node role (e.g. prefill:0); default: any")


def phase_key_model(family: Any) -> type[PhaseKey]:
    """``PhaseKey`` whose ``phase`` must be one of the family's declared phases."""
    from typing import Literal

    from pydantic import create_model

    names = tuple(sorted(getattr(family, "phases", {}) or {}))
    if not names:
        from pydantic import field_validator

        def _none(cls, v: str) -> str:  # noqa: ANN001
            raise ValueError(f"family {family.name!r} declares no phases: a fault cannot be keyed on one")
        return create_model(f"PhaseKey_{family.name}", __base__=PhaseKey,
                            __validators__={"no_phases": field_validator("phase")(classmethod(_none))})
    return create_model(f"PhaseKey_{family.name}", __base__=PhaseKey,
                        phase=(Literal[names], Field(description=PhaseKey.model_fields["phase"].description)))


def latest_end(f: Any) -> float:
    """The latest time (s from the workload start) a scheduled fault may still be in its window."""
    on = getattr(f, "upon", None)
    return f.at + f.for_ + (on.within + on.offset if on is not None else 0.0)


def span(f: Any) -> tuple[float, float]:
    """(earliest start, latest end) of a scheduled fault's window."""
    return f.at, latest_end(f)


def describe(on: PhaseKey) -> str:
    nth = "" if on.nth == 1 else f" #{on.nth}"
    who = f" of {on.node}" if on.node else ""
    off = f" + {on.offset * 1000:g} ms" if on.offset else ""
    return f"{on.phase}{nth}{who}{off} (within {on.within:g} s)"


def key_meta(on: PhaseKey | None) -> dict | None:
    return None if on is None else on.model_dump(mode="json")


class PhaseTail:
    """The live phase events of a run's nodes, read from the files the topology names.

    ``files`` is called at every poll (a node started again may write a new file); each file is
    read from where it stood when it was first seen at construction (older lines belong to an
    earlier run of a pooled node), and from its start when it appears later. Events are kept in
    arrival order with the role of the file they came from."""

    def __init__(self, files: Callable[[], dict[str, Path]]):
        self._files = files
        self._offsets: dict[str, int] = {}
        self._partial: dict[str, bytes] = {}
        self._roles: dict[str, str] = {}
        self.events: list[dict] = []
        self.unreadable = 0
        self._lock = threading.Lock()
        for role, path in self._current().items():
            p = str(path)
            self._roles[p] = role
            try:
                self._offsets[p] = os.path.getsize(p)
            except OSError:
                self._offsets[p] = 0

    def _current(self) -> dict[str, Path]:
        try:
            return dict(self._files() or {})
        except Exception:  # noqa: BLE001 - a topology that cannot say now says nothing new
            return {}

    def poll(self) -> list[dict]:
        """Read what was appended since the last poll; returns the new events."""
        new: list[dict] = []
        with self._lock:
            for role, path in self._current().items():
                p = str(path)
                self._roles.setdefault(p, role)
                off = self._offsets.setdefault(p, 0)
                try:
                    with open(p, "rb") as fh:
                        fh.seek(off)
                        data = fh.read()
                except OSError:
                    continue
                if not data:
                    continue
                self._offsets[p] = off + len(data)
                data = self._partial.pop(p, b"") + data
                lines = data.split(b"\n")
                if lines[-1]:
                    self._partial[p] = lines[-1]  # a line still being written
                for line in lines[:-1]:
                    if not line.strip():
                        continue
                    try:
                        rec = json.loads(line)
                        t, name = float(rec["t"]), str(rec["phase"])
                    except (ValueError, KeyError, TypeError):
                        self.unreadable += 1
                        continue
                    new.append({"t": t, "phase": name, "role": self._roles[p]})
            new.sort(key=lambda e: e["t"])
            self.events.extend(new)
        return new

    def find(self, key: PhaseKey, since: float) -> dict | None:
        """The ``key.nth`` event named ``key.phase`` (of ``key.node`` if set) at or after ``since``."""
        n = 0
        with self._lock:
            for e in sorted(self.events, key=lambda e: e["t"]):
                if e["phase"] != key.phase or e["t"] < since or (key.node and e["role"] != key.node):
                    continue
                n += 1
                if n == key.nth:
                    return e
        return None

    def count(self, name: str, since: float, until: float) -> int:
        with self._lock:
            return sum(1 for e in self.events if e["phase"] == name and since <= e["t"] <= until)

    def journal_records(self, since: float, until: float) -> tuple[list[dict], int]:
        """The events between ``since`` and ``until`` as journal records (at most MAX_JOURNALLED),
        and how many more there were."""
        with self._lock:
            inside = [e for e in self.events if since <= e["t"] <= until]
        recs = [{"type": "event", "what": "phase", "phase": e["phase"], "role": e["role"], "t": e["t"]}
                for e in inside[:MAX_JOURNALLED]]
        return recs, max(0, len(inside) - MAX_JOURNALLED)


def wait_for(tail: PhaseTail, key: PhaseKey, since: float, stop: threading.Event,
             until: float | None = None) -> dict | None:
    """Block until the keyed event comes (returned), ``until`` passes or ``stop`` is set (None)."""
    until = since + key.within if until is None else until
    while True:
        tail.poll()
        ev = tail.find(key, since)
        if ev is not None:
            return ev
        if time.monotonic() >= until or stop.wait(POLL_S):
            tail.poll()
            return tail.find(key, since)
