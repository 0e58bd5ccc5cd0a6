"""Quiet waiting's pure parts (no vLLM): the empty-step backoff, the wait that input or a wake cuts
short, the reader's spin window, and the worker -> engine wake channel over real ZMQ ipc sockets
between two real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import given, settings, strategies as st

from connector_patch.quiet.backoff import FIRST_S, IdleBackoff, WakeCounter, wait_quietly
from connector_patch.quiet.spin import BUSY_GAP_S, BUSY_WINDOW_S, spin_window_s
from connector_patch.quiet.channel import WakeListener, WakeSender, wake_address

pytestmark = pytest.mark.timeout(60)


def test_backoff_grows_eightfold_from_upstreams_1ms_to_the_cap_and_resets() -> None:
    b = IdleBackoff(1.0)
    assert [round(b.next_delay(), 3) for _ in range(7)] == [0.001, 0.008, 0.064, 0.512, 1.0, 1.0, 1.0]
    b.reset()
    assert b.next_delay() == FIRST_S


@pytest.mark.parametrize("cap", [0, -1, float("nan")])
def test_backoff_refuses_a_cap_that_is_not_positive(cap) -> None:
    with pytest.raises(ValueError, match="cap"):
        IdleBackoff(cap)


@given(st.floats(min_value=1e-4, max_value=5.0), st.integers(min_value=1, max_value=60))
@settings(max_examples=100, deadline=None)
def test_backoff_never_exceeds_its_cap_nor_shrinks_without_reset(cap, n) -> None:
    b = IdleBackoff(cap)
    delays = [b.next_delay() for _ in range(n)]
    assert all(0 < d <= cap for d in delays)
    assert delays == sorted(delays)


def _cond_and_queue():
    import queue
    q: queue.Queue = queue.Queue()
    return q, WakeCounter(q.not_empty)


def test_the_wait_runs_out_when_nothing_happens() -> None:
    q, wakes = _cond_and_queue()
    t0 = time.monotonic()
    assert wait_quietly(q.not_empty, q._qsize, wakes, wakes.seq, 0.05) is False
    assert time.monotonic() - t0 >= 0.045


def test_new_input_ends_the_wait_at_once() -> None:
    q, wakes = _cond_and_queue()
    threading.Timer(0.05, q.put, args=("request",)).start()
    t0 = time.monotonic()
    assert wait_quietly(q.not_empty, q._qsize, wakes, wakes.seq, 10.0) is True
    assert time.monotonic() - t0 < 2.0  # woken, not timed out (10 s)


def test_a_wake_ends_the_wait_at_once_and_one_during_the_step_is_never_lost() -> None:
    q, wakes = _cond_and_queue()
    threading.Timer(0.05, wakes.wake).start()
    t0 = time.monotonic()
    assert wait_quietly(q.not_empty, q._qsize, wakes, wakes.seq, 10.0) is True
    assert time.monotonic() - t0 < 2.0
    seen = wakes.seq
    wakes.wake()  # progress reported while the engine was stepping: seen before the step
    t0 = time.monotonic()
    assert wait_quietly(q.not_empty, q._qsize, wakes, seen, 10.0) is True
    assert time.monotonic() - t0 < 0.5


def test_input_already_queued_means_no_wait() -> None:
    q, wakes = _cond_and_queue()
    q.put("abort")
    assert wait_quietly(q.not_empty, q._qsize, wakes, wakes.seq, 10.0) is True


def test_spin_window_follows_the_gap_between_reads() -> None:
    assert spin_window_s(0.001, 1.0) == BUSY_WINDOW_S  # a model running: spin as upstream (shorter)
    assert spin_window_s(BUSY_GAP_S, 1.0) == BUSY_WINDOW_S
    assert spin_window_s(BUSY_GAP_S + 0.001, 1.0) == 0.0  # an engine that only waits: sleep at once
    assert spin_window_s(0.001, 0.01) == 0.01  # never more than upstream's own window
    assert BUSY_WINDOW_S >= 2 * BUSY_GAP_S


SENDER = r"""
import os, sys, time
sys.path.insert(0, sys.argv[1])
from connector_patch.quiet.channel import WakeSender
s = WakeSender(os.getppid())
time.sleep(0.3)
for _ in range(3):
    s.wake()
    time.sleep(0.1)
print(s.sent, s.dropped)
s.close()
"""


def test_a_child_process_wakes_its_parent_over_ipc() -> None:
    woken = threading.Event()
    count = []

    def on_wake() -> None:
        count.append(1)
        woken.set()

    listener = WakeListener(on_wake)
    try:
        assert listener.address == wake_address(os.getpid())
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        r = subprocess.run([sys.executable, "-c", SENDER, root], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr[-2000:]
        sent, dropped = map(int, r.stdout.split())
        assert sent == 3 and dropped == 0
        assert woken.wait(5)
        deadline = time.monotonic() + 5
        while len(count) < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert 1 <= len(count) <= 3  # wakes queued together count as one step's worth
    finally:
        listener.close()
    assert not os.path.exists(listener.address[len("ipc://"):])


def test_a_wake_with_no_engine_listening_is_dropped_without_blocking() -> None:
    s = WakeSender(2 ** 22 + 12345)  # no such engine
    t0 = time.monotonic()
    for _ in range(10):
        s.wake()
    assert time.monotonic() - t0 < 1.0
    assert s.sent + s.dropped == 10
    s.close()


def test_the_connectors_wake_event_sets_and_wakes_without_an_engine() -> None:
    from connector_patch import quiet
    import connector_patch.quiet.channel  # noqa: F401  (a submodule must not shadow quiet.wake)

    assert callable(quiet.wake)
    ev = quiet.WakeEvent()
    ev.set()  # nothing installed in this process: a plain event
    assert ev.is_set()


def test_the_alarm_fires_once_at_the_earliest_time_asked() -> None:
    """quiet.wake_at's alarm (issue 30, item 14): a quietly waiting engine steps at a load's
    deadline, not up to its cap later; a later time than one pending changes nothing."""
    import threading
    import time

    from connector_patch.quiet.backoff import Alarm

    fired: list[float] = []
    done = threading.Event()

    def fire() -> None:
        fired.append(time.monotonic())
        done.set()

    alarm = Alarm(fire)
    t0 = time.monotonic()
    alarm.at(t0 + 0.3)
    alarm.at(t0 + 0.1)  # earlier: replaces it
    alarm.at(t0 + 0.5)  # later: nothing
    assert done.wait(2.0)
    assert 0.09 <= fired[0] - t0 < 0.25, fired[0] - t0
    time.sleep(0.6)
    assert len(fired) == 1 and alarm.fired == 1 and alarm.pending() is None
    done.clear()
    alarm.at(time.monotonic() - 1)  # already due: at once
    assert done.wait(1.0) and alarm.fired == 2
