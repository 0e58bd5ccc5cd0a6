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
    tell the two apart from its side alone (docs/hardened-connector.md, open items)."""

    def __init__(self, refused_limit: int = 2, after_loss_s: float = 1.5):
        if refused_limit < 1 or after_loss_s < 0:
            raise ValueError("refused_limit >= 1 and after_loss_s >= 0")
        self.refused_limit = refused_limit
        self.after_loss_s = after_loss_s
        self.connected = False
        self.ever_connected = False
        self.refused = 0
        self.lost_at: float | None = None
        self._scheduled = False  # the RETRIED that follows DISCONNECTED is pending

    def on_connected(self, now: float) -> None:  # noqa: ARG002 - every event takes the time
        self.connected = self.ever_connected = True
        self.refused, self.lost_at, self._scheduled = 0, None, False

    def on_disconnected(self, now: float) -> None:
        self.connected = False
        self.refused, self.lost_at, self._scheduled = 0, now, True

    def on_retried(self, now: float) -> None:  # noqa: ARG002
        if self._scheduled:  # the reconnect scheduled at the disconnect: no attempt was refused
            self._scheduled = False
            return
        self.refused += 1

    def gone(self, now: float) -> bool:
        if self.refused < self.refused_limit:
            return False
        if not self.ever_connected:
            return True
        return self.lost_at is not None and now - self.lost_at >= self.after_loss_s
