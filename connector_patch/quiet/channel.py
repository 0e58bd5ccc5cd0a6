"""The wake channel: a worker's connector tells its engine core that it made progress, so an engine
waiting quietly (:mod:`.backoff`) steps at once instead of at the end of its wait.

vLLM's workers are child processes of the engine core (multiprocess executor), so the channel is
a ZMQ PULL socket the engine core binds on an ``ipc://`` path named after its pid, and each worker
PUSHes one empty message to its parent's path, without blocking (a wake nobody reads is dropped:
the engine's wait is bounded anyway). A worker living in the engine core's own process wakes it
directly. pyzmq is what vLLM itself uses for its queues' notifications.
"""

from __future__ import annotations

import os
import tempfile
import threading
from typing import Callable

import zmq


def wake_address(pid: int) -> str:
    return f"ipc://{tempfile.gettempdir()}/pdchaos-wake-{pid}"


class WakeListener:
    """Engine side: a daemon thread that calls ``on_wake`` for every message on this process's path."""

    def __init__(self, on_wake: Callable[[], None], ctx: zmq.Context | None = None) -> None:
        self.address = wake_address(os.getpid())
        self._ctx = ctx or zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.RCVHWM, 16)
        self._sock.bind(self.address)
        self._on_wake = on_wake
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pdchaos-quiet-wake", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                if not poller.poll(500):
                    continue
                while True:  # every wake queued so far is one step's worth
                    self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                self._on_wake()
            except zmq.ZMQError:
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close(linger=0)
        path = self.address[len("ipc://"):]
        try:
            os.unlink(path)
        except OSError:
            pass


class WakeSender:
    """Worker side: one PUSH socket to the parent engine's path; :meth:`wake` never blocks."""

    def __init__(self, pid: int, ctx: zmq.Context | None = None) -> None:
        self._ctx = ctx or zmq.Context.instance()
        self._lock = threading.Lock()  # the connector's threads share the socket
        self._sock = self._ctx.socket(zmq.PUSH)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 4)
        self._sock.setsockopt(zmq.IMMEDIATE, 1)  # no listener yet: drop, do not queue
        self._sock.connect(wake_address(pid))
        self.sent = 0
        self.dropped = 0

    def wake(self) -> None:
        with self._lock:
            try:
                self._sock.send(b"", zmq.NOBLOCK)
                self.sent += 1
            except zmq.ZMQError:
                self.dropped += 1

    def close(self) -> None:
        with self._lock:
            self._sock.close(linger=0)
