"""P's terminal records: requests P will never send (aborted, or their send failed), kept so that D's
pending or late pull gets an explicit answer at once instead of a wait (seed 003, transposed to
vLLM's Mooncake connector).

Bounded twice: at most ``capacity`` entries (4096 by default; the oldest go first) and each for
``ttl_s`` = max(abort timeout, 300 s), so a pull that comes late still finds its answer while
memory stays bounded whatever the abort rate. Recording the same id again keeps its first status
and refreshes its time (idempotent). Thread-safe. In the hardened P the records are written and
read on the worker's sender event loop (``record_send_reqs``, ``fetch_finished_sending_reqs``,
``send_kv_to_decode`` and the side-channel listener's cancel handling).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

DEFAULT_CAPACITY = 4096
MIN_TTL_S = 300.0


def ttl_for(abort_timeout_s: float) -> float:
    return max(float(abort_timeout_s), MIN_TTL_S)


class TerminalRecords:
    def __init__(self, abort_timeout_s: float, capacity: int = DEFAULT_CAPACITY):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.ttl_s = ttl_for(abort_timeout_s)
        self.capacity = capacity
        self._d: OrderedDict[str, tuple[str, float]] = OrderedDict()  # id -> (status, recorded at)
        self._lock = threading.Lock()
        self.evicted = 0  # dropped for room before their time (a metric: the bound was hit)
        self._evicted_newest: float | None = None  # the latest recording time of an evicted record

    def record(self, transfer_id: str, status: str, now: float) -> None:
        with self._lock:
            old = self._d.pop(transfer_id, None)
            self._d[transfer_id] = (old[0] if old else status, now)
            self._expire(now)
            while len(self._d) > self.capacity:
                _, (_, at) = self._d.popitem(last=False)
                self.evicted += 1
                self._evicted_newest = at if self._evicted_newest is None else max(self._evicted_newest, at)

    def lookup(self, transfer_id: str, now: float) -> str | None:
        """The status recorded for ``transfer_id`` if still kept, else None."""
        with self._lock:
            self._expire(now)
            hit = self._d.get(transfer_id)
            return hit[0] if hit else None

    def lost_since(self, since: float, now: float) -> bool:
        """Whether a record made at or after ``since`` may be gone by ``now`` (expired, or evicted
        for room): a pull P received at ``since`` and serves only now cannot trust a miss. (P's
        sender tasks may each wait the abort timeout for a prefill, so a pull can sit in P's queue
        longer than any record lives: issue 30, item 10.)"""
        with self._lock:
            return now - since >= self.ttl_s or (self._evicted_newest is not None and self._evicted_newest >= since)

    def __len__(self) -> int:
        with self._lock:
            return len(self._d)

    def _expire(self, now: float) -> None:
        # insertion order is recording order (a re-record moves to the end): expired ones lead
        while self._d:
            tid, (_, at) = next(iter(self._d.items()))
            if now - at < self.ttl_s:
                break
            del self._d[tid]
