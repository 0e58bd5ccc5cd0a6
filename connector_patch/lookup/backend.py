"""Storage backends behind the lookup server.

Upstream's ``Backend`` ABC answers ``exists(keys) -> list[int]`` (1 present, 0 absent). The
server here asks a backend one question, ``hit_tokens(request)``, so each backend keeps the key
layout it uses; the hit rule shared by all of them is :func:`prefix_hit_tokens`.

``MemoryBackend`` is the embedded default: an in-process dict, with asynchronous stores modelled
by a queue so that the admin ``reset`` has real pending work to drain.
"""

from __future__ import annotations

import abc
import math
import queue
import threading
import time
from typing import Callable, Iterable, Sequence

from .protocol import LookupRequest


def prefix_hit_tokens(
    token_len: int,
    hashes: Sequence[str],
    group_ids: Sequence[int],
    hbm_hit_tokens: int,
    block_size: int,
    present: Callable[[str, int], bool],
) -> int:
    """The upstream hit rule.

    Block ``i`` covers tokens ``[i*block_size, min((i+1)*block_size, token_len))``. Only the first
    ``ceil(token_len / block_size)`` hashes are looked at (extra hashes are allowed and ignored).
    A block whose end is within ``hbm_hit_tokens`` counts as present. The hit is the longest prefix
    of blocks present in every requested group, in tokens, capped at ``token_len``.
    """
    n_blocks = min(len(hashes), math.ceil(token_len / block_size)) if token_len else 0
    hit_blocks = 0
    for i in range(n_blocks):
        end = min((i + 1) * block_size, token_len)
        if end <= hbm_hit_tokens or all(present(hashes[i], g) for g in group_ids):
            hit_blocks += 1
        else:
            break
    return min(hit_blocks * block_size, token_len)


def drain_queue(q: "queue.Queue | None", timeout_s: float) -> bool:
    """Wait until every item put on ``q`` was marked done (``task_done``), at most ``timeout_s``:
    False on timeout. A missing queue has nothing pending."""
    if q is None:
        return True
    deadline = time.monotonic() + timeout_s
    with q.all_tasks_done:
        while q.unfinished_tasks:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            q.all_tasks_done.wait(remaining)
    return True


class Backend(abc.ABC):
    """What the lookup server needs from a KV pool backend."""

    @abc.abstractmethod
    def hit_tokens(self, request: LookupRequest) -> int:
        """Tokens of the request's prefix held by the pool. May raise: the server reports that
        as BACKEND_ERROR, never as a miss."""

    @abc.abstractmethod
    def drain(self, timeout_s: float) -> bool:
        """Wait until every store accepted before the call has landed. False on timeout."""

    @abc.abstractmethod
    def clear(self) -> None:
        """Remove everything (upstream: ``remove_all(force=True)``)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources; idempotent."""


class MemoryBackend(Backend):
    """Keys are ``(hash_hex, group)`` in a set. ``put`` stores now; ``put_async`` queues a store
    that a background thread applies after ``delay_s``; ``drain`` waits for the queue."""

    def __init__(self, block_size: int = 16, groups: int = 1):
        for name, v in (("block_size", block_size), ("groups", groups)):
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"MemoryBackend {name} must be a positive int")
        self.block_size = block_size
        self.groups = groups
        self._keys: set[tuple[str, int]] = set()
        self._lock = threading.Lock()
        self._pending: queue.Queue = queue.Queue()
        self._worker: threading.Thread | None = None
        self._closed = threading.Event()

    # stores -----------------------------------------------------------------
    def put(self, hashes_hex: Iterable[str], groups: Iterable[int] | None = None) -> None:
        gs = list(range(self.groups)) if groups is None else list(groups)
        with self._lock:
            for h in hashes_hex:
                for g in gs:
                    self._keys.add((h.lower(), g))

    def put_async(self, hashes_hex: Iterable[str], groups: Iterable[int] | None = None,
                  delay_s: float = 0.0) -> None:
        self._pending.put((list(hashes_hex), None if groups is None else list(groups), delay_s))
        with self._lock:
            if self._worker is None:
                self._worker = threading.Thread(target=self._store_loop, name="memory-backend-store",
                                                daemon=True)
                self._worker.start()

    def _store_loop(self) -> None:
        while not self._closed.is_set():
            try:
                hashes, groups, delay = self._pending.get(timeout=0.1)
            except queue.Empty:
                continue
            try:
                if delay > 0:
                    self._closed.wait(delay)
                self.put(hashes, groups)
            finally:
                self._pending.task_done()

    # Backend ----------------------------------------------------------------
    def present(self, hash_hex: str, group: int) -> bool:
        return (hash_hex, group) in self._keys

    def hit_tokens(self, request: LookupRequest) -> int:
        with self._lock:
            return prefix_hit_tokens(request.token_len, request.hashes, request.group_ids,
                                     request.hbm_hit_tokens, self.block_size, self.present)

    def drain(self, timeout_s: float) -> bool:
        return drain_queue(self._pending, timeout_s)

    def clear(self) -> None:
        with self._lock:
            self._keys.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._keys)

    def close(self) -> None:
        self._closed.set()
        worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            worker.join(timeout=1.0)
