"""D's pull, one per P side channel and step: which of its requests D asks P to cancel.

A pull carries every request of one step that reads from the same P worker. Two reasons make D
cancel at P: the pull itself failed while P may still write (its deadline passed, the connection
was lost, a transfer error): every request it still holds open is cancelled; or the scheduler
finished some of its requests (aborted by the client) while the pull waits: only those. Their
siblings are healthy: P answers them as usual, and D keeps listening for it. (Cancelling every
open id of the pull made a hardened P acknowledge and drop the siblings' KV too, and D, seeing
them settled with no failure, left them waiting for the load deadline: issue 30, item 2.)
"""

from __future__ import annotations

from typing import AbstractSet, Iterable


def cancel_targets(req_ids: Iterable[str], pull_failed: bool, cancel_wanted: AbstractSet[str]) -> set[str]:
    """The requests of one pull to cancel at P now (before filtering those already settled)."""
    ids = set(req_ids)
    return ids if pull_failed else ids & set(cancel_wanted)


class PeerWatch:
    """What the socket monitor of one pull (a ZMQ DEALER to P's side channel) says about P: is
    nobody listening there any more, so that P (and its transfer engine) is gone and cannot write?

    libzmq emits ``CONNECT_RETRIED`` each time it *schedules* a connect attempt: after a refused
    attempt, and also once right after ``DISCONNECTED``, before any attempt was made (measured with
    pyzmq: DISCONNECTED and RETRIED at the same instant, the first refusal 0.13 s later). Counting
    that one as a refusal made one refused connect after a lost connection read as "P is gone".

    Rules: before the pull ever connected (P never got it, so it can never write for it), P is gone
    after ``refused_limit`` refusals in a row. Once connected, P got the pull and may still write
    after a network blip heals, so it is gone only when, in addition, the connection has been lost
    for ``after_loss_s`` (D's heartbeat timeout): a port that refuses for that long is a process
    that is gone. A blip whose rule REJECTs (refusals) for longer still reads as P gone: D cannot
    tell the two apart from its side alone. P closes that gap from its side: it never writes for a
    pull whose connection dropped (:class:`RequesterLinks`), and sees the loss sooner than this.

    A write P had started before it saw the loss is cut at its next chunk
    (:mod:`connector_patch.pd.write`), and P's keepalive sees a refusing link only up to a probe
    interval after the link began to refuse, which may be after D's rule above held (a link that
    blackholed long enough for D's heartbeat timeout, then refuses: D reads P as gone 0.2 s into the
    refusals). So once P got the pull, "gone" also waits ``fence_s`` after the first refusal that
    followed the loss (:data:`GONE_FENCE_S`): P's keepalive has seen the loss by then and its write
    has ended or been cut (issue 43, 7a). Only the blocks wait: the load failed at the loss."""

    def __init__(self, refused_limit: int = 2, after_loss_s: float = 1.5, fence_s: float = 0.0):
        if refused_limit < 1 or after_loss_s < 0 or fence_s < 0:
            raise ValueError("refused_limit >= 1, after_loss_s >= 0 and fence_s >= 0")
        self.refused_limit = refused_limit
        self.after_loss_s = after_loss_s
        self.fence_s = fence_s
        self.connected = False
        self.ever_connected = False
        self.refused = 0
        self.lost_at: float | None = None
        self.refused_at: float | None = None  # the first refusal since the connection was lost
        self._scheduled = False  # the RETRIED that follows DISCONNECTED is pending

    def on_connected(self, now: float) -> None:  # noqa: ARG002 - every event takes the time
        self.connected = self.ever_connected = True
        self.refused, self.lost_at, self.refused_at, self._scheduled = 0, None, None, False

    def on_disconnected(self, now: float) -> None:
        self.connected = False
        self.refused, self.lost_at, self.refused_at, self._scheduled = 0, now, None, True

    def on_retried(self, now: float) -> None:
        if self._scheduled:  # the reconnect scheduled at the disconnect: no attempt was refused
            self._scheduled = False
            return
        self.refused += 1
        if self.refused_at is None:
            self.refused_at = now

    def gone_at(self) -> float | None:
        """When :meth:`gone` will hold if nothing else happens (None: not until more refusals)."""
        if self.refused < self.refused_limit:
            return None
        if not self.ever_connected:
            return float("-inf")
        if self.lost_at is None:
            return None
        first = self.refused_at if self.refused_at is not None else self.lost_at
        return max(self.lost_at + self.after_loss_s, first + self.fence_s)

    def gone(self, now: float) -> bool:
        at = self.gone_at()
        return at is not None and now >= at


# P's side channel (a ZMQ ROUTER): TCP keepalive probes after 1 s of silence on a connection, from
# the kernel. A link that now refuses (REJECT: a TCP reset) answers the first probe with a reset,
# so P sees the loss about 1 s after the link's last traffic, and then never writes for that
# connection's pulls, sooner than D may read P as gone (refused, and its connection lost for D's
# heartbeat timeout, 1.5 s). A requester that merely goes silent keeps its connection: its kernel
# answers the probes (an upstream D frozen past P's abort timeout still gets P's answer when it
# thaws), and a link that drops packets is given up only after a minute of unanswered probes. Not
# ZMQ heartbeats: pings from P to a frozen upstream D made P's process burn a core (measured on
# pd-mixed-upstream-decode: 1.06 of a core, 0.09 without).
KEEPALIVE_IDLE_S = 1
KEEPALIVE_UNANSWERED = 60
# D: a pull P got settles on "P gone" only this long after the first refusal that followed its
# loss: P's keepalive probe (every KEEPALIVE_IDLE_S) has met the reset by then, and the write it
# had started, cut at its next chunk (write.CHUNK_S, about 0.1 s), has ended (issue 43, 7a)
GONE_FENCE_S = KEEPALIVE_IDLE_S + 1.0


def side_channel_options() -> list[tuple[str, int]]:
    """(pyzmq option name, value) for P's side channel."""
    return [("TCP_KEEPALIVE", 1), ("TCP_KEEPALIVE_IDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPALIVE_INTVL", 1),
            ("TCP_KEEPALIVE_CNT", KEEPALIVE_UNANSWERED)]


def pull_socket_options(heartbeat_ms: int, heartbeat_timeout_ms: int) -> list[tuple[str, int]]:
    """(pyzmq option name, value) for D's pull socket (a DEALER): pings every ``heartbeat_ms``, P is
    lost after ``heartbeat_timeout_ms`` without an answer; the TTL its pings carry lets P drop the
    connection of a D that went silent as long."""
    return [("LINGER", 0), ("HEARTBEAT_IVL", heartbeat_ms), ("HEARTBEAT_TIMEOUT", heartbeat_timeout_ms),
            ("HEARTBEAT_TTL", heartbeat_timeout_ms)]


class RequesterLinks:
    """P's side: the connections its side channel (a ZMQ ROUTER) has accepted, as its socket monitor
    reports them by file descriptor, and whether the connection a pull came on is still up.

    A pull whose connection dropped is never written for. Its answer cannot reach D any more (a
    DEALER that reconnects gets a new routing id, the reply to the old one is dropped), and D may
    have read P as gone and freed the blocks the pull names: a link that refuses reconnects for D's
    heartbeat timeout looks to D exactly like a dead P (issue 30, item 4). A descriptor is reused
    by a later connection, so each accept starts a new generation of it; the listener reads the
    monitor before it takes a pull, so the generation a pull is tagged with is its own."""

    def __init__(self) -> None:
        self._gen: dict[int, int] = {}
        self._down: set[int] = set()  # descriptors whose current connection dropped

    def on_accepted(self, fd: int) -> None:
        self._gen[fd] = self._gen.get(fd, 0) + 1
        self._down.discard(fd)

    def on_disconnected(self, fd: int) -> None:
        if fd in self._gen:
            self._down.add(fd)

    def tag(self, fd: int | None) -> tuple[int, int] | None:
        """The connection a message just received on ``fd`` came on (None: not known)."""
        if fd is None or fd not in self._gen:
            return None
        return fd, self._gen[fd]

    def lost(self, tag: tuple[int, int] | None) -> bool:
        if tag is None:
            return False  # not known: upstream's behaviour
        fd, gen = tag
        return self._gen.get(fd) != gen or fd in self._down
