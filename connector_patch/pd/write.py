"""P's write into D's blocks, in chunks that stop once the pull's connection dropped (issue 43, 7a).

Upstream writes a pull's KV with one ``batch_transfer_sync_write`` in P's sender executor: once
started it runs to its end, however long it takes. P checks the requester's link (the side-channel
connection the pull came on, :class:`connector_patch.pd.pull.RequesterLinks`) right before it
starts; a link that starts refusing after that looks to D exactly like a dead P, and D, reading P
as gone, used to free the blocks while the write went on and landed in another request's KV
(measured: a 3 s write, the side-channel port alone REJECTed right after it began: all 3 of the
next request's blocks overwritten).

So the hardened P writes the same descriptors in chunks, a descriptor split at any byte (each is a
plain copy of a byte range of registered memory), and before each chunk asks its
:class:`WriteGuard`, which P's sender loop cuts when it reads that the pull's connection dropped
(its socket monitor, which TCP keepalive feeds within about a second of a link that refuses) or
when P shuts down. A chunk is sized from the write speed measured so far to take about
``CHUNK_S`` (the first one ``FIRST_CHUNK_BYTES``), so P stops writing within about one chunk of
seeing the loss. D holds the blocks of a pull that had connected for a fence after the first
refusal (:data:`connector_patch.pd.pull.GONE_FENCE_S`) that covers P's keepalive and one chunk:
together, D gives the blocks back only once P's write has ended or been cut. What this does not
cover: a single chunk that takes longer than the fence leaves (a link whose speed drops more than
tenfold within one chunk, or a first chunk over a link slower than ~64 KiB/s).

Each chunk's descriptors are submitted one by one (``transfer_submit_write``) and their completion
polled with sleeps (``transfer_check_status``, :func:`submit_and_wait`), not written with
``batch_transfer_sync_write``: Mooncake's sync write polls its batch's status in a loop with no
sleep, so a write waiting on a D that does not take bytes (frozen, its link stalled) burned most
of a core of P for as long as it waited (measured on real nodes under a kubelet: a freeze of D that
acted after D's pull held P's write 14 s at 1.04 of a core; outside vLLM, two Mooncake 0.3.13
engines over TCP with the receiver stopped 4 s: 0.27-0.90 of a core in the sync write, 0.01 in a
submit polled every 10 ms). One submit per descriptor, because ``transfer_check_status`` reads the
first task of a batch only.

Pure: no vLLM, no torch, no zmq; the guard is shared by P's sender loop and its executor thread.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from typing import Any, Callable, Iterator

CHUNK_S = 0.1  # a chunk is sized to take about this long at the speed measured so far
FIRST_CHUNK_BYTES = 64 * 1024  # before any speed is known
MAX_CHUNK_BYTES = 64 * 1024 * 1024
POLL_FIRST_S = 0.0001  # the first sleep between two polls of a chunk's transfers; doubled each poll
POLL_MAX_S = 0.005  # up to this: at most ~5% on a chunk sized to CHUNK_S, next to nothing while D is stuck
SUBMIT_FAILED = -1  # transfer_submit_write gave no batch (its segment could not be opened, a bad range)


class WriteGuard:
    """One write of P's (the ready requests of one pull), as its sender task and the executor thread
    that writes it share it: the link the pull came on, the requests' send metas, and whether the
    write is cut (the link dropped, or P shuts down). Thread-safe."""

    def __init__(self, link, metas=()) -> None:  # noqa: ANN001 - RequesterLinks' tag, upstream's SendBlockMeta
        self.link = link
        self.metas = list(metas)
        self.reason: str | None = None
        self._cut = threading.Event()

    def cut(self, reason: str) -> bool:
        """Stop the write before its next chunk. True the first time."""
        if self._cut.is_set():
            return False
        self.reason = reason
        self._cut.set()
        return True

    def is_cut(self) -> bool:
        return self._cut.is_set()


class GuardedPtrs(list):
    """The source pointers of one write, carrying its guard from ``_build_transfer_params`` (on P's
    sender loop) to ``_send_blocks`` (in its executor): upstream passes the list through unchanged."""

    guard: WriteGuard | None = None


class ChunkSizer:
    """How many bytes the next chunk takes: about ``chunk_s`` at the speed measured over the
    chunks written so far (bytes over seconds, all of them), within [first, maximum]."""

    def __init__(self, chunk_s: float = CHUNK_S, first: int = FIRST_CHUNK_BYTES, maximum: int = MAX_CHUNK_BYTES):
        if chunk_s <= 0 or first < 1 or maximum < first:
            raise ValueError("chunk_s > 0 and 1 <= first <= maximum")
        self.chunk_s, self.first, self.maximum = chunk_s, first, maximum
        self.bytes = 0
        self.seconds = 0.0

    def wrote(self, nbytes: int, seconds: float) -> None:
        self.bytes += nbytes
        self.seconds += max(0.0, seconds)

    def next_bytes(self) -> int:
        if self.bytes <= 0:
            return self.first
        if self.seconds <= 0:
            return self.maximum
        return max(self.first // 16 or 1, min(self.maximum, int(self.bytes / self.seconds * self.chunk_s)))


def chunks(src: list[int], dst: list[int], lengths: list[int],
           sizer: ChunkSizer) -> Iterator[tuple[list[int], list[int], list[int]]]:
    """The descriptors (source pointer, destination pointer, length) in order, cut into chunks of
    at most ``sizer.next_bytes()`` bytes each, asked before each chunk (a descriptor longer than
    what is left of a chunk is split at that byte). Every byte is in exactly one chunk."""
    if not len(src) == len(dst) == len(lengths):
        raise ValueError("src, dst and lengths differ in length")
    i, off = 0, 0  # the descriptor being cut, and how much of it went out already
    while i < len(src):
        room = sizer.next_bytes()
        c_src: list[int] = []
        c_dst: list[int] = []
        c_len: list[int] = []
        while room > 0 and i < len(src):
            take = min(room, lengths[i] - off)
            if take > 0:
                c_src.append(src[i] + off)
                c_dst.append(dst[i] + off)
                c_len.append(take)
                room -= take
                off += take
            if off >= lengths[i]:
                i, off = i + 1, 0
        if c_len:
            yield c_src, c_dst, c_len


# what transfer_check_status answers (Mooncake's TransferEnginePy): 1 completed (the batch freed),
# -1 failed (freed), -2 timed out (a slice timeout, RDMA only: its slices are still posted and the
# batch is not freed, so it is polled on to 1 or -1), 0 pending
_DONE, _FAILED, _TIMEOUT = 1, -1, -2
_NO_BATCH = (0, 2**64 - 1)  # a failed submit: 0 in recent Mooncake, -1 cast unsigned in older ones
WAIT_TIMED_OUT = -3  # the write's deadline passed with descriptors still pending (they are left to the engine)


def sync_deadline_s(nbytes: int, env: dict | None = None) -> float:
    """The bound Mooncake's own ``batch_transfer_sync_write`` puts on a write, kept: MC_TRANSFER_TIMEOUT
    seconds (30 unless set; at least 5) plus a nanosecond a byte (TransferEnginePy's constructor and
    batchTransferSync)."""
    raw = (os.environ if env is None else env).get("MC_TRANSFER_TIMEOUT")
    try:
        base = max(5, int(raw)) if raw is not None else 30
    except ValueError:
        base = 5  # Mooncake reads it with atoi: a non-number is 0, raised to its floor of 5
    return base + nbytes * 1e-9


def submit_and_wait(engine: Any, session: str, src: list[int], dst: list[int], lengths: list[int],
                    deadline_s: float | None = None, sleep: Callable[[float], None] = time.sleep,
                    clock: Callable[[], float] = time.monotonic) -> int:
    """Write the descriptors into ``session`` and wait for all of them: 0 when every one completed,
    else the first failure's code (-1 failed, -2 a slice timed out, SUBMIT_FAILED, WAIT_TIMED_OUT).

    Each descriptor is one submit (``transfer_check_status`` reads a batch's first task only). Every
    descriptor submitted is waited for to its end whatever another's fate (its bytes read P's memory
    and land in D's until then), up to ``deadline_s`` (default: the sync call's own bound,
    :func:`sync_deadline_s`): past it the write fails and what is still pending is left to the engine,
    as the sync call leaves it. Only the oldest pending descriptor is polled while it is pending (a
    stalled D costs one call a poll, not one per descriptor), with sleeps between polls (POLL_FIRST_S
    doubling to POLL_MAX_S, again from POLL_FIRST_S after progress); once it ends, the next ones are
    swept at once. The write's guard is not asked while it waits: a descriptor in flight may still
    land in D's blocks, which D gives back once P answered. A submit that gives no batch hands the rest to the sync call, which fails at once
    on a segment it cannot open and drops it from the engine's cache (a D restarted at that address),
    or writes them."""
    limit = sync_deadline_s(sum(lengths)) if deadline_s is None else deadline_s
    t0 = clock()
    pending: deque[int] = deque()
    ret = 0
    for i, (s, d, n) in enumerate(zip(src, dst, lengths)):
        bid = engine.transfer_submit_write(session, s, d, n)
        if isinstance(bid, bool) or not isinstance(bid, int) or bid in _NO_BATCH:
            if engine.batch_transfer_sync_write(session, list(src[i:]), list(dst[i:]), list(lengths[i:])) != 0:
                ret = SUBMIT_FAILED
            break
        pending.append(bid)
    nap = POLL_FIRST_S
    while pending:
        st = engine.transfer_check_status(pending[0])
        if st in (_DONE, _FAILED):  # the engine freed the batch: never asked about again
            pending.popleft()
            ret = ret or (0 if st == _DONE else _FAILED)
            nap = POLL_FIRST_S
            continue
        if st == _TIMEOUT:
            ret = ret or _TIMEOUT
        elif st != 0:  # a status this code does not know: failed, and not asked about again
            pending.popleft()
            ret = ret or _FAILED
            continue
        if clock() - t0 > limit:
            return ret or WAIT_TIMED_OUT
        sleep(nap)
        nap = min(POLL_MAX_S, nap * 2)
    return ret
