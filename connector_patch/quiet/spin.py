"""Pure logic of the shared-memory queue reader's spin window (no vLLM).

Upstream (vLLM 0.32.0 ``shm_broadcast.SpinCondition``) has a reader poll the buffer with
``sched_yield`` for ``busy_loop_s`` (1 s, hard-coded) after every read before it sleeps on the
writer's ZMQ notification. An engine that steps every few ms while it waits on a peer therefore
keeps its workers (and itself, reading their answers) spinning for good. Here the window follows
the reader's own traffic: when the last two reads came close together (a model running, steps back
to back) the reader spins as upstream does, for a short window that still covers such gaps; after
a long gap (an engine that only waits) it sleeps on the notification at once, which costs one ZMQ
wake (tens of microseconds) on the next read.
"""

from __future__ import annotations

BUSY_GAP_S = 0.02  # reads closer than this: traffic is dense, keep spinning between them
BUSY_WINDOW_S = 0.05  # how long a reader in dense traffic spins after a read (covers BUSY_GAP_S gaps twice over)


def spin_window_s(gap_s: float, cap_s: float) -> float:
    """The busy-poll window after a read that came ``gap_s`` after the one before; never more
    than upstream's ``cap_s``."""
    if gap_s <= BUSY_GAP_S:
        return min(BUSY_WINDOW_S, cap_s)
    return 0.0
