"""The control channel of every node process the harness starts.

A node binds a REP socket on a private ipc path and answers msgpack maps: ``{"cmd": NAME, ...}``
-> ``{"ok": True, ...}`` or ``{"ok": False, "error": TEXT}``. Every node answers ``ping`` and
``stats`` (threads, open fds, pid, plus the node's own counters); nodes add their own commands.
The runner uses it for readiness, fault switches (backend faults, interposer rules) and the
leak probes. It is a test-harness channel, never part of the system under test.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

import msgpack
import zmq

Handler = Callable[[dict], dict]


def process_stats() -> dict[str, int]:
    """Threads and open file descriptors of this process (Linux /proc; -1 where unknown)."""
    try:
        fds = len(os.listdir("/proc/self/fd"))
    except OSError:
        fds = -1
    return {"pid": os.getpid(), "threads": threading.active_count(), "fds": fds}


class ControlServer:
    def __init__(self, endpoint: str, handlers: dict[str, Handler] | None = None,
                 stats: Callable[[], dict] | None = None):
        self.endpoint = endpoint
        self._handlers: dict[str, Handler] = dict(handlers or {})
        self._stats = stats
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(endpoint)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pdchaos-control", daemon=True)

    def add(self, name: str, handler: Handler) -> None:
        self._handlers[name] = handler

    def start(self) -> "ControlServer":
        self._thread.start()
        return self

    def _answer(self, raw: list[bytes]) -> dict:
        try:
            msg = msgpack.unpackb(raw[0], raw=False) if len(raw) == 1 else None
        except Exception:
            msg = None
        if not isinstance(msg, dict) or not isinstance(msg.get("cmd"), str):
            return {"ok": False, "error": "expected one msgpack map with a 'cmd' string"}
        cmd = msg["cmd"]
        if cmd == "ping":
            return {"ok": True}
        if cmd == "stats":
            out = {"ok": True, **process_stats()}
            if self._stats is not None:
                try:
                    out.update(self._stats())
                except Exception as exc:  # the node's own gauges failed: say so, the control thread goes on
                    return {"ok": False, "error": f"stats: {type(exc).__name__}: {exc}"}
            return out
        handler = self._handlers.get(cmd)
        if handler is None:
            return {"ok": False, "error": f"unknown command {cmd!r}"}
        try:
            return {"ok": True, **(handler(msg) or {})}
        except Exception as exc:  # a bad command must not kill the node
            return {"ok": False, "error": f"{cmd}: {type(exc).__name__}: {exc}"}

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if not self._sock.poll(50, zmq.POLLIN):
                    continue
                raw = self._sock.recv_multipart()
                self._sock.send(msgpack.packb(self._answer(raw), default=str))
            except zmq.ZMQError:
                if self._stop.is_set():
                    return

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(2.0)
        self._sock.close(linger=0)
        self._ctx.term()
        if self.endpoint.startswith("ipc://"):
            try:
                os.unlink(self.endpoint[len("ipc://"):])
            except OSError:
                pass


class ControlError(Exception):
    pass


def control_call(endpoint: str, cmd: str, timeout_ms: int = 2000, **fields: Any) -> dict:
    """One request on a fresh socket; raises ControlError on timeout or an error answer."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send(msgpack.packb({"cmd": cmd, **fields}))
        if not sock.poll(timeout_ms, zmq.POLLIN):
            raise ControlError(f"control {cmd}: no answer within {timeout_ms} ms")
        answer = msgpack.unpackb(sock.recv(), raw=False)
    finally:
        sock.close(linger=0)
    if not answer.get("ok"):
        raise ControlError(f"control {cmd}: {answer.get('error')}")
    return answer


class ControlClient:
    """A kept-open control connection (so probing a node does not itself change its fd count).

    Same rules as the lookup client: one deadline per call, and on any failure the REQ socket is
    closed with linger=0 and rebuilt, so the next call starts clean (a node restarted on the same
    endpoint is simply reconnected to)."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self._ctx = zmq.Context.instance()
        self._sock: zmq.Socket | None = None
        self._lock = threading.Lock()

    def _socket(self) -> zmq.Socket:
        if self._sock is None:
            self._sock = self._ctx.socket(zmq.REQ)
            self._sock.setsockopt(zmq.LINGER, 0)
            self._sock.connect(self.endpoint)
        return self._sock

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    def call(self, cmd: str, timeout_ms: int = 2000, **fields: Any) -> dict:
        with self._lock:
            sock = self._socket()
            try:
                sock.send(msgpack.packb({"cmd": cmd, **fields}))
                if not sock.poll(timeout_ms, zmq.POLLIN):
                    raise ControlError(f"control {cmd}: no answer within {timeout_ms} ms")
                answer = msgpack.unpackb(sock.recv(), raw=False)
            except (zmq.ZMQError, ControlError, ValueError):
                self._drop()
                raise
        if not isinstance(answer, dict) or not answer.get("ok"):
            raise ControlError(f"control {cmd}: {answer.get('error') if isinstance(answer, dict) else answer}")
        return answer

    def close(self) -> None:
        with self._lock:
            self._drop()
