"""D's KV loads: each with a deadline, outcomes from any thread, reported to the scheduler once.

Why (measured on vLLM 0.32.0's MooncakeConnector: the scenarios of ``scenarios/pd/``): a
request waiting for remote KV leaves WAITING_FOR_REMOTE_KVS only through ``finished_recving``;
upstream reports a failed pull there when P *says* it failed (seed 001, merged), but a dead,
frozen, silent or partitioned P leaves D waiting for its ZMQ receive timeout (abort timeout + 60
s: 540 s by default), and a FINISH reply naming only ids D never asked for leaves it waiting
forever. The ledger gives every load a deadline (``kv_load_timeout_ms``) and treats an id D asked
for but a FINISH did not name as failed.

Rules (seed 001's, plus the deadline):

- one entry per request; its blocks are flattened across KV cache groups;
- a load with no block to fill (a pull that only asks P to free its side) is never reported: the
  scheduler asserts the request is still known, and it may not be;
- ``expect`` pulls per request (one per remote TP rank it reads from): the load is OK once every
  pull said OK; any failure fails it, and an OK arriving later for a failed load never completes
  it (the request is reported once, as failed). The hardened connector counts the pulls with
  upstream's own ``PullReqMeta.pull_tasks_count`` and starts each load here with ``expect=1``;
- outcomes come from the receiver threads through a thread-safe queue; :meth:`collect` (the
  worker thread, once per step) applies them and the deadlines, and returns what to report.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Iterable, Sequence

DEFAULT_KV_LOAD_TIMEOUT_MS = 30000


def validate_kv_load_timeout_ms(value: object, name: str = "kv_load_timeout_ms") -> int:
    """Positive int milliseconds only (as seed 000's lookup timeout): 0, negatives, bools, floats
    and strings raise ValueError naming the setting; there is no "wait forever"."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a positive int (milliseconds), got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int (milliseconds), got {value}; there is no 'wait forever'")
    return value


def flatten_blocks(groups: Iterable[Sequence[int]]) -> frozenset[int]:
    """Block ids of every KV cache group, as one set."""
    return frozenset(b for group in groups for b in group)


@dataclass
class _Load:
    req_id: str
    blocks: frozenset[int]
    deadline: float
    expect: int
    oks: int = 0
    failed: str | None = None  # the failure code, once failed


@dataclass
class Report:
    """What one :meth:`LoadLedger.collect` gives the scheduler: requests to put in
    ``finished_recving`` (done, OK or not), those of them whose load failed (for ``failed_recving``
    when blocks cannot name them: several KV cache groups), the blocks whose load failed (for
    ``get_block_ids_with_load_errors``), and failure counts by code (for metrics and one
    rate-limited log line: counts and codes only)."""

    finished: set[str] = field(default_factory=set)
    failed_ids: set[str] = field(default_factory=set)
    failed_blocks: set[int] = field(default_factory=set)
    failures: dict[str, int] = field(default_factory=dict)


class LoadLedger:
    def __init__(self, timeout_ms: int = DEFAULT_KV_LOAD_TIMEOUT_MS):
        self.timeout_s = validate_kv_load_timeout_ms(timeout_ms) / 1000.0
        self._loads: dict[str, _Load] = {}
        self._events: queue.SimpleQueue[tuple[str, str, str]] = queue.SimpleQueue()
        self._lock = threading.Lock()  # start() may come from another thread than collect()

    # ------------------------------------------------------------------ the worker thread
    def start(self, req_id: str, block_groups: Iterable[Sequence[int]], now: float, expect: int = 1) -> bool:
        """Track a load; False (nothing tracked) when it has no block to fill, or is tracked already."""
        if expect < 1:
            raise ValueError("expect must be at least 1 pull")
        blocks = flatten_blocks(block_groups)
        if not blocks:
            return False
        with self._lock:
            if req_id in self._loads:
                return False
            self._loads[req_id] = _Load(req_id, blocks, now + self.timeout_s, expect)
        return True

    def forget(self, req_id: str) -> bool:
        """Stop tracking ``req_id`` without reporting it (its report now comes another way); True
        when it was tracked."""
        with self._lock:
            return self._loads.pop(req_id, None) is not None

    def tracked(self, req_id: str) -> bool:
        """Whether ``req_id`` is a load still waiting to be reported."""
        with self._lock:
            return req_id in self._loads

    def pending(self) -> int:
        with self._lock:
            return len(self._loads)

    def next_deadline(self) -> float | None:
        """The earliest deadline of a pending load (for a wait that must wake up for it)."""
        with self._lock:
            return min((ld.deadline for ld in self._loads.values()), default=None)

    def collect(self, now: float) -> Report:
        """Apply the outcomes queued since the last call, then the deadlines; return what to report.
        Each tracked request is reported exactly once, then forgotten."""
        rep = Report()
        while True:
            try:
                kind, req_id, code = self._events.get_nowait()
            except queue.Empty:
                break
            with self._lock:
                ld = self._loads.get(req_id)
                if ld is None:
                    continue  # unknown, or already reported: a late or duplicate outcome
                if kind == "fail":
                    ld.failed = ld.failed or code
                elif ld.failed is None:
                    ld.oks += 1
                if ld.failed is not None or ld.oks >= ld.expect:
                    self._finish(ld, rep)
        with self._lock:
            for ld in [ld for ld in self._loads.values() if ld.deadline <= now]:
                ld.failed = "timeout"
                self._finish(ld, rep)
        return rep

    def _finish(self, ld: _Load, rep: Report) -> None:
        del self._loads[ld.req_id]
        rep.finished.add(ld.req_id)
        if ld.failed is not None:
            rep.failed_ids.add(ld.req_id)
            rep.failed_blocks |= ld.blocks
            rep.failures[ld.failed] = rep.failures.get(ld.failed, 0) + 1

    # ------------------------------------------------------------------ any thread
    def ok(self, req_id: str) -> None:
        """One pull of ``req_id`` completed."""
        self._events.put(("ok", req_id, ""))

    def fail(self, req_id: str, code: str) -> None:
        """A pull of ``req_id`` failed (``code``: a short category such as ``peer_error``,
        ``bad_reply``, ``unreachable``, ``aborted``)."""
        self._events.put(("fail", req_id, code))

    def reply(self, asked: Iterable[str], ok: Iterable[str] = (), failed: Iterable[str] = (),
              final: bool = True, code: str = "peer_error") -> int:
        """Apply one reply of P to a pull for ``asked``: ``ok`` and ``failed`` ids count as such;
        ids P named that D did not ask for are ignored (returned: how many); with a ``final``
        reply (FINISH), an asked id P did not name at all failed (``code`` ``unanswered``) —
        upstream leaves it waiting forever."""
        asked_set = set(asked)
        named = 0
        seen: set[str] = set()
        for rid in ok:
            if rid in asked_set:
                self.ok(rid)
                seen.add(rid)
            else:
                named += 1
        for rid in failed:
            if rid in asked_set:
                self.fail(rid, code)
                seen.add(rid)
            else:
                named += 1
        if final:
            for rid in asked_set - seen:
                self.fail(rid, "unanswered")
        return named
