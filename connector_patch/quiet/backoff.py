"""Pure logic of quiet waiting (no vLLM, no torch): how long an engine step that ran nothing may
wait before the next one, and the wait itself, cut short by new input or a connector's wake.

Upstream (vLLM 0.32.0 ``EngineCore._process_engine_step``) sleeps 1 ms after every step that ran no
model while the scheduler still has requests (a request waiting for remote KV, blocks P keeps for
D), so a node that waits on a peer steps ~1000 times a second, each step an RPC to its workers.
Here the wait doubles after each such step, from 1 ms (upstream's) up to a cap, and ends at once
when the engine's input queue gets anything (a new request, an abort, a utility call) or when a
worker's connector reports progress (a finished pull, a served pull, a cancel): the step after any
of those runs at upstream's 1 ms pace again.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

FIRST_S = 0.001  # upstream's fixed sleep: the first wait after progress is never longer


class IdleBackoff:
    """Waits of 1, 2, 4, ... ms up to ``cap_s`` between steps that ran nothing; reset by progress."""

    def __init__(self, cap_s: float) -> None:
        if not cap_s > 0:
            raise ValueError(f"the backoff cap must be > 0 s, got {cap_s!r}")
        self.cap_s = float(cap_s)
        self._next = FIRST_S

    def reset(self) -> None:
        self._next = FIRST_S

    def next_delay(self) -> float:
        """The wait before the next empty step; each call doubles the one after it, up to the cap."""
        delay = min(self._next, self.cap_s)
        self._next = min(self._next * 2, self.cap_s)
        return delay


class WakeCounter:
    """Counts wakes (a connector's progress) and notifies a condition: a waiter that records
    :attr:`seq` before its step and waits only while it is unchanged never misses a wake that
    came during the step."""

    def __init__(self, cond: threading.Condition) -> None:
        self.cond = cond
        self.seq = 0

    def wake(self) -> None:
        with self.cond:
            self.seq += 1
            self.cond.notify_all()


def wait_quietly(cond: threading.Condition, has_input: Callable[[], bool], wakes: WakeCounter, seen: int,
                 delay_s: float, clock: Callable[[], float] = time.monotonic) -> bool:
    """Wait up to ``delay_s`` on ``cond`` (whose lock ``has_input`` may rely on: it is called with the
    lock held) while there is no input and no wake since ``seen``. True when woken (input or a wake),
    False when the delay ran out."""
    end = clock() + delay_s
    with cond:
        while True:
            if has_input() or wakes.seq != seen:
                return True
            left = end - clock()
            if left <= 0:
                return False
            cond.wait(left)
