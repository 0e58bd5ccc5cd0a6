"""Pure logic of quiet waiting (no vLLM, no torch): how long an engine step that ran nothing may
wait before the next one, and the wait itself, cut short by new input or a connector's wake.

Upstream (vLLM 0.32.0 ``EngineCore._process_engine_step``) sleeps 1 ms after every step that ran no
model while the scheduler still has requests (a request waiting for remote KV, blocks P keeps for
D), so a node that waits on a peer steps ~1000 times a second, each step an RPC to its workers.
Here the wait grows eightfold after each such step, from 1 ms (upstream's) up to a cap, and ends at once
when the engine's input queue gets anything (a new request, an abort, a utility call) or when a
worker's connector reports progress (a finished pull, a served pull, a cancel): the step after any
of those runs at upstream's 1 ms pace again.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

FIRST_S = 0.001  # upstream's fixed sleep: the first wait after progress is never longer
# each empty step's wait is this many times the one before (up to the cap): 1, 8, 64, 512 ms. Every
# event a waiting engine must act on wakes it at once (input, a connector's progress or deadline:
# quiet.wake_at), so how fast the waits grow only sets how many empty steps follow a burst of
# progress: 5 to reach a 1 s cap, each costing the worker ~5-8 ms on this CPU (issue 30, item 14;
# doubling took 11, packed into the first 0.1 s)
GROWTH = 8


class IdleBackoff:
    """Waits of 1, 8, 64, ... ms (:data:`GROWTH`) up to ``cap_s`` between steps that ran nothing;
    reset by progress."""

    def __init__(self, cap_s: float) -> None:
        if not cap_s > 0:
            raise ValueError(f"the backoff cap must be > 0 s, got {cap_s!r}")
        self.cap_s = float(cap_s)
        self._next = FIRST_S

    def reset(self) -> None:
        self._next = FIRST_S

    def next_delay(self) -> float:
        """The wait before the next empty step; each call multiplies the one after it by
        :data:`GROWTH`, up to the cap."""
        delay = min(self._next, self.cap_s)
        self._next = min(self._next * GROWTH, self.cap_s)
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


class Alarm:
    """Calls ``fire`` once at the earliest time asked for (:meth:`at`, on ``clock``'s scale), on
    its own daemon thread (started at the first :meth:`at`). A connector asks for the time it
    must next look at the clock (a load's deadline), so a quietly waiting engine, which otherwise
    steps only at its backoff's cap, steps then: the cap may be long without a deadline being
    noticed late. A later time than one pending changes nothing; each firing takes the pending one."""

    def __init__(self, fire: Callable[[], None], clock: Callable[[], float] = time.monotonic) -> None:
        self._fire = fire
        self._clock = clock
        self._cond = threading.Condition()
        self._due: float | None = None
        self._thread: threading.Thread | None = None
        self.fired = 0

    def at(self, when: float) -> None:
        with self._cond:
            if self._due is not None and self._due <= when:
                return
            self._due = when
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pdchaos-quiet-alarm", daemon=True)
                self._thread.start()
            self._cond.notify()

    def pending(self) -> float | None:
        with self._cond:
            return self._due

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._due is None:
                    self._cond.wait()
                left = self._due - self._clock()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self._due = None
                self.fired += 1
            try:
                self._fire()
            except Exception:  # noqa: BLE001 - a failed wake must not end the alarm
                pass
