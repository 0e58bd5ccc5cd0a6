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
