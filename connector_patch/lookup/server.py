"""Worker rank 0's side of the lookup RPC: exactly one reply per received request.

The REP socket is served by one thread. Each request is parsed, validated and answered inside a
per-request exception boundary; the backend call runs on a separate daemon worker with its own
deadline (``backend_timeout_ms``) so a hung backend produces a BACKEND_TIMEOUT envelope instead
of a dead loop, and ``close()`` can join the serving thread within 2 s whatever the backend does.
If the REP socket itself fails (a zmq error on recv or send), it is closed with linger=0 and
bound again on the same endpoint.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any, Callable, Sequence

import zmq

from .backend import Backend
from .client import validate_timeout_ms
from .metrics import SERVER_CATEGORIES, Counters, RateLimitedWarner
from .protocol import (
    REQUEST_CODES,
    RESET_FRAME,
    Code,
    Limits,
    ProtocolError,
    decode_request,
    encode_error,
    encode_ok,
)

logger = logging.getLogger("connector_patch.lookup.server")

_POLL_MS = 50
_JOIN_S = 2.0


class _BackendTimeout(Exception):
    pass


class _BackendWorker:
    """Runs backend calls on one daemon thread. A call that overruns its deadline is abandoned
    together with its thread; the next call gets a fresh worker."""

    def __init__(self) -> None:
        # SimpleQueue (C, no Condition/Event per call): the handoff costs ~20 us less per request.
        # One result queue per worker; an abandoned worker takes its queue with it, so a late
        # result can never be read as the answer to a later call.
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="lookup-backend", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        jobs, results = self._jobs, self._results
        while True:
            fn = jobs.get()
            if fn is None:
                return
            try:
                results.put((True, fn()))
            except BaseException as exc:  # noqa: BLE001 - reported as BACKEND_ERROR
                results.put((False, exc))

    def call(self, fn: Callable[[], Any], timeout_s: float, stop: threading.Event) -> Any:
        self._jobs.put(fn)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                ok, value = self._results.get(timeout=min(0.05, max(0.0, deadline - time.monotonic())))
                break
            except queue.Empty:
                if stop.is_set() or time.monotonic() >= deadline:
                    raise _BackendTimeout() from None
        if ok:
            return value
        raise value

    def stop(self) -> None:
        self._jobs.put(None)


class LookupServer:
    """``LookupServer(endpoint, backend)``; ``start()`` binds and serves on a thread; ``close()``
    stops it. ``groups`` defaults to the backend's ``groups`` attribute (1 if it has none)."""

    def __init__(self, endpoint: str, backend: Backend, *, groups: int | None = None,
                 max_token_len: int | None = None, max_hashes: int | None = None,
                 backend_timeout_ms: int = 4000, reset_drain_timeout_ms: int = 2000,
                 warn_interval_s: float = 10.0, context: zmq.Context | None = None):
        if not isinstance(endpoint, str) or not endpoint.startswith(("ipc://", "tcp://")):
            raise ValueError("endpoint must be an ipc:// or tcp:// address")
        self.endpoint = endpoint
        self.backend = backend
        lim: dict[str, int] = {"num_groups": groups if groups is not None else int(getattr(backend, "groups", 1))}
        if max_token_len is not None:
            lim["max_token_len"] = max_token_len
        if max_hashes is not None:
            lim["max_hashes"] = max_hashes
        self.limits = Limits(**lim)
        self.backend_timeout_s = validate_timeout_ms(backend_timeout_ms, "backend_timeout_ms") / 1000.0
        self.reset_drain_timeout_s = validate_timeout_ms(reset_drain_timeout_ms, "reset_drain_timeout_ms") / 1000.0
        self._own_ctx = context is None
        self._ctx = context if context is not None else zmq.Context()
        self._sock: zmq.Socket | None = None
        self._bound_endpoint: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._worker: _BackendWorker | None = None
        self._close_lock = threading.Lock()
        self._closed = False
        self._counters = Counters("server", SERVER_CATEGORIES)
        self._warner = RateLimitedWarner(logger, warn_interval_s)

    @property
    def counters(self) -> dict[str, int]:
        return self._counters.snapshot()

    @property
    def bound_endpoint(self) -> str | None:
        """The endpoint actually bound (tcp://127.0.0.1:0 resolves to a real port)."""
        return self._bound_endpoint

    def start(self) -> "LookupServer":
        """Bind, then serve on a daemon thread. A bind failure raises zmq.ZMQError here, in the
        caller's thread, before anything is left running."""
        if self._thread is not None or self._closed:
            raise RuntimeError("LookupServer.start() called twice or after close()")
        self._bind(self.endpoint)
        self._worker = _BackendWorker()  # started now, so thread counts are stable from here on
        self._thread = threading.Thread(target=self._serve, name="lookup-server", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Idempotent, thread-safe, raises nothing; joins the serving thread within 2 s."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._stop.set()
            thread = self._thread
            if thread is not None and thread is not threading.current_thread():
                thread.join(_JOIN_S)
                if thread.is_alive():  # pragma: no cover - the loop polls every 50 ms
                    logger.error("lookup server: serving thread did not stop within %.1f s", _JOIN_S)
            if self._worker is not None:
                self._worker.stop()
            if thread is None or not thread.is_alive():
                self._close_socket()
                self._unlink_ipc()
                if self._own_ctx:
                    self._ctx.term()
        except Exception:  # pragma: no cover - close must never raise
            logger.debug("lookup server close: ignored error")

    def __enter__(self) -> "LookupServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- sockets
    def _bind(self, endpoint: str) -> None:
        sock = self._ctx.socket(zmq.REP)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, _POLL_MS)  # the serving loop checks the stop flag this often
        try:
            sock.bind(endpoint)
        except zmq.ZMQError:
            sock.close(linger=0)
            raise
        self._sock = sock
        self._bound_endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def _close_socket(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close(linger=0)
            finally:
                self._sock = None

    def _unlink_ipc(self) -> None:
        """Remove our ipc socket file so no stale path is left behind (upstream never does)."""
        ep = self._bound_endpoint or ""
        if ep.startswith("ipc://") and not ep.startswith("ipc://@"):
            try:
                os.unlink(ep[len("ipc://"):])
            except OSError:
                pass

    def _rebuild(self, phase: str, start: float) -> None:
        self._counters.inc("transport")
        self._warner.warn("transport", Code.INTERNAL, phase, (time.monotonic() - start) * 1000.0)
        self._close_socket()
        # Re-bind the resolved endpoint (a tcp port 0 keeps the port it was given).
        while not self._stop.is_set():
            try:
                self._bind(self._bound_endpoint or self.endpoint)
                self._counters.inc("socket_rebuilds")
                return
            except zmq.ZMQError:
                self._stop.wait(0.05)

    # ------------------------------------------------------------------- loop
    def _serve(self) -> None:
        while not self._stop.is_set():
            sock = self._sock
            if sock is None:
                self._rebuild("bind", time.monotonic())
                continue
            try:  # blocks at most _POLL_MS (RCVTIMEO, set in _bind): one call instead of poll + recv
                frames = sock.recv_multipart(copy=True)
            except zmq.Again:
                continue
            except zmq.ZMQError:
                self._rebuild("recv", time.monotonic())
                continue
            start = time.monotonic()
            self._counters.inc("requests")
            reply = self._handle(frames, start)
            if reply is None:  # stopping while the backend ran: nobody to answer
                return
            try:
                sock.send(reply, flags=zmq.NOBLOCK, copy=True)
            except zmq.ZMQError:
                self._rebuild("send", start)

    def _fail(self, category: str, code: str, message: str, phase: str, start: float, **counts: int) -> bytes:
        self._counters.inc(category)
        self._warner.warn(category, code, phase, (time.monotonic() - start) * 1000.0, **counts)
        return encode_error(code, message)

    def _handle(self, frames: Sequence[bytes], start: float) -> bytes | None:
        """Never raises: every path ends in one envelope (or None when the server is stopping)."""
        try:
            if len(frames) == 1 and frames[0] == RESET_FRAME:
                return self._handle_reset(start)
            try:
                request = decode_request(frames, self.limits)
            except ProtocolError as exc:
                return self._fail("protocol", exc.code, exc.message, "decode", start, frames=len(frames))
            counts = {"token_len": request.token_len, "hashes": len(request.hashes), "groups": len(request.group_ids)}
            try:
                hit = self._call_backend(lambda: self.backend.hit_tokens(request))
            except _BackendTimeout:
                if self._stop.is_set():
                    return None
                return self._fail("timeout", Code.BACKEND_TIMEOUT, "backend call exceeded its deadline",
                                  "backend", start, **counts)
            except Exception as exc:  # noqa: BLE001
                return self._fail("backend_error", Code.BACKEND_ERROR, f"backend raised {type(exc).__name__}",
                                  "backend", start, **counts)
            if not isinstance(hit, int) or isinstance(hit, bool) or not 0 <= hit <= request.token_len:
                return self._fail("backend_error", Code.BACKEND_ERROR, "backend returned an out-of-range hit",
                                  "backend", start, **counts)
            self._counters.inc("ok")
            return encode_ok(hit)
        except Exception as exc:  # noqa: BLE001 - the per-request boundary
            return self._fail("server_error", Code.INTERNAL, f"internal error {type(exc).__name__}", "handle", start)

    def _handle_reset(self, start: float) -> bytes | None:
        def reset() -> None:
            if not self.backend.drain(self.reset_drain_timeout_s):
                raise TimeoutError("pending stores did not drain")
            self.backend.clear()

        try:
            self._call_backend(reset, self.reset_drain_timeout_s + self.backend_timeout_s)
        except _BackendTimeout:
            if self._stop.is_set():
                return None
            return self._fail("timeout", Code.RESET_FAILED, "reset exceeded its deadline", "reset", start)
        except Exception as exc:  # noqa: BLE001
            return self._fail("backend_error", Code.RESET_FAILED, f"reset failed: {type(exc).__name__}",
                              "reset", start)
        self._counters.inc("resets")
        self._counters.inc("ok")
        return encode_ok(0)

    def _call_backend(self, fn: Callable[[], Any], timeout_s: float | None = None) -> Any:
        if self._worker is None:
            self._worker = _BackendWorker()
        try:
            return self._worker.call(fn, self.backend_timeout_s if timeout_s is None else timeout_s, self._stop)
        except _BackendTimeout:
            self._worker.stop()  # abandoned: it exits once the stuck call returns
            self._worker = None
            raise
