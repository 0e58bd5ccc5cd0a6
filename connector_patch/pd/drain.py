"""P's abort drain (seed 003, transposed to vLLM's Mooncake connector): an aborted request's
blocks are released only once no transfer of it is in flight, on every TP rank.

Each rank keeps, per aborted request, how many of its transfers are still in flight. A rank alone
must not release: with TP > 1 another rank may still be writing from the same blocks. So the
ranks agree, round by round: each contributes 1 (drained here) or 0 for every request of an
agreed, sorted list of candidates, the vector is all-reduced with MIN, and exactly the requests
at 1 everywhere are released, by every rank in the same round. The all-reduce is injected
(``torch.distributed.all_reduce(..., op=MIN)`` on a CPU group, as tests/helpers/drain_gloo.py does
with real Gloo; the identity with TP = 1), so this module stays free of torch.

The hardened connector does not use it with vLLM 0.32: vLLM's ``KVOutputAggregator`` frees a
request only once every rank reported it in ``finished_sending``, and upstream expires a transfer
on a rank only when nothing of it is being sent there.

State changes happen under the lock; the callbacks (the all-reduce, a notification to D) run
outside it.
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

AllReduceMin = Callable[[list[int]], list[int]]


def single_rank(flags: list[int]) -> list[int]:
    return list(flags)


class AbortDrain:
    def __init__(self, allreduce_min: AllReduceMin = single_rank):
        self._allreduce_min = allreduce_min
        self._in_flight: dict[str, int] = {}  # request -> transfers in flight on this rank
        self._aborted: set[str] = set()
        self._lock = threading.Lock()

    def transfer_started(self, req_id: str) -> None:
        with self._lock:
            self._in_flight[req_id] = self._in_flight.get(req_id, 0) + 1

    def transfer_done(self, req_id: str) -> None:
        """A transfer of ``req_id`` ended, OK or not (a failed send drains like a good one)."""
        with self._lock:
            n = self._in_flight.get(req_id, 0) - 1
            if n > 0:
                self._in_flight[req_id] = n
            else:
                self._in_flight.pop(req_id, None)

    def abort(self, req_id: str) -> None:
        """``req_id`` was aborted (or its send failed): release it once drained everywhere."""
        with self._lock:
            self._aborted.add(req_id)

    def aborted(self) -> list[str]:
        with self._lock:
            return sorted(self._aborted)

    def agree(self, candidates: Sequence[str]) -> list[str]:
        """One round: ``candidates`` must be the same sorted list on every rank (e.g. the aborted
        requests the scheduler told every rank about); returns those drained on every rank, now
        released here (forgotten). Call it on every rank in the same order: it is a collective."""
        cands = list(candidates)
        with self._lock:
            flags = [1 if (rid in self._aborted and self._in_flight.get(rid, 0) == 0) else 0 for rid in cands]
        agreed = self._allreduce_min(flags) if cands else []
        if len(agreed) != len(cands):
            raise RuntimeError(f"all-reduce returned {len(agreed)} flags for {len(cands)} requests")
        released = [rid for rid, ok in zip(cands, agreed) if ok >= 1]
        with self._lock:
            for rid in released:
                self._aborted.discard(rid)
                self._in_flight.pop(rid, None)
        return released
