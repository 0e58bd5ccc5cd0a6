"""D's settlements: a failed or aborted KV load frees its blocks only once P can no longer write
into them.

P writes D's blocks itself (Mooncake is push: P's transfer engine writes D's memory), and it waits
up to its abort timeout for its own prefill before it does (``send_kv_to_decode``). Upstream D
waits just as long (its receive timeout is abort timeout + 60 s, "let P wait timeout first"), so
its blocks are never given away under a late write. A load deadline breaks that: D gives up while
P may still write. Measured in the real Scheduler (tests/connector_patch/test_pd_hardened_inproc.py): a load failed
at 300 ms, its blocks went to another request, then P wrote 589,824 bytes over them.

So a load whose pulls are in flight is *open*; each pull (one per P side channel) *settles* once
P cannot write for it any more: P answered it (OK, error, abort, FINISH), P acknowledged D's
cancel for it while not writing it (a hardened P then never writes it), P's side-channel port
refuses connections (the process and its transfer engine are gone), or the bound passed (abort
timeout + 60 s after the pull, upstream's own). What is to be done with the blocks of a failed or
aborted load waits for that: the hardened worker asks for ``recv`` (report the request in
``finished_recving``, which frees the blocks vLLM kept for it); ``release`` (report it in
``finished_sending``, as P does for blocks it kept) is a rule the subclass no longer uses. A load
with no pull open (never opened: its bootstrap query failed or is still out; or settled) is acted
on at once, and closed: a late :meth:`opened` (the bootstrap query answered after an abort or the
load deadline) is refused, so no pull ever names blocks D gave away. Thread-safe.

Nothing is kept for a load once its pulls settled: a load that ended OK is never asked about, and
keeping each for a TTL (900 s) held ~900k entries at 1000 requests/s (132 MB measured) and scanned
them all every 10 s under the lock on the worker's step path (170-500 ms per scan, measured; issue
43, 7g). Only closed loads (failed or aborted) are kept, for the TTL, and forgotten oldest first.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Iterable

ACTIONS = ("release", "recv")


class Settlements:
    def __init__(self, ttl_s: float = 900.0):
        self.ttl_s = ttl_s
        self._open: dict[str, set[str]] = {}  # request -> pulls (P side channels) not settled yet
        self._want: dict[str, str] = {}  # request -> the action waiting for its settlement
        # request -> when its blocks were given up with no pull open; oldest first (expire)
        self._closed: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def opened(self, req_id: str, pulls: Iterable[str]) -> bool:
        """Pulls of ``req_id`` go out now, one per P side channel it reads from: True. False (nothing
        opened: the caller must not pull) when the scheduler already acted on the request's blocks
        before it opened (:meth:`want` found it not open): those blocks may belong to another
        request by now."""
        keys = set(pulls)
        if not keys:
            raise ValueError("a load opens with at least one pull")
        with self._lock:
            if req_id in self._closed:
                return False
            self._open.setdefault(req_id, set()).update(keys)
            return True

    def is_open(self, req_id: str, pull: str | None = None) -> bool:
        """Whether ``req_id`` (or its pull ``pull``) may still be written by P."""
        with self._lock:
            keys = self._open.get(req_id)
            return keys is not None and (pull is None or pull in keys)

    def settle(self, req_id: str, pull: str, now: float) -> str | None:
        """The pull ``pull`` of ``req_id`` settled (idempotent). When it was the last: the action the
        scheduler asked for meanwhile (the caller does it now), else None (nothing is kept)."""
        with self._lock:
            keys = self._open.get(req_id)
            if keys is None or pull not in keys:
                return None
            keys.discard(pull)
            if keys:
                return None
            del self._open[req_id]
            return self._want.pop(req_id, None)

    def want(self, req_id: str, action: str, now: float | None = None) -> bool:
        """The scheduler asks for ``action`` on ``req_id``'s blocks: True when it can be done now
        (no pull open: settled, or never opened; then it is closed, and never opens later); False
        when it waits for the settlement (then :meth:`settle` returns it)."""
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}")
        with self._lock:
            if req_id in self._open:
                self._want[req_id] = action
                return False
            self._closed.pop(req_id, None)
            self._closed[req_id] = time.monotonic() if now is None else now
            return True

    def closed(self, req_id: str) -> bool:
        """Whether ``req_id``'s blocks were given up while no pull of it was open (a later
        :meth:`opened` is refused)."""
        with self._lock:
            return req_id in self._closed

    def wanted(self, req_id: str) -> bool:
        with self._lock:
            return req_id in self._want

    def waiting(self) -> list[str]:
        with self._lock:
            return sorted(self._want)

    def expire(self, now: float) -> int:
        """Forget closed loads older than the TTL (a bootstrap query ends within 3 tries of
        VLLM_MOONCAKE_CONNECTOR_TIMEOUT: long before it), oldest first: the cost is the number
        forgotten, not the table's size. Returns how many."""
        n = 0
        with self._lock:
            while self._closed:
                rid, t = next(iter(self._closed.items()))
                if now - t <= self.ttl_s:
                    break
                del self._closed[rid]
                n += 1
        return n

    def __len__(self) -> int:
        """Loads kept: open ones and closed ones."""
        with self._lock:
            return len(self._open) + len(self._closed)


# failure codes after which P may still write: the pull goes on listening for P's last word
UNSETTLED_CODES = frozenset({"timeout", "peer_gone", "transfer_error"})
