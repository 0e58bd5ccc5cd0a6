"""Worker rank 0's side of the lookup RPC: exactly one reply per received request.

The REP socket is served by one thread. Each request is parsed, validated and answered inside a
per-request exception boundary. The backend is called inline on the serving thread (no thread
handoff on the normal path); a watchdog thread enforces ``backend_timeout_ms``: when a call
overruns, the watchdog takes ownership of the socket (an epoch number, switched under a lock, says
which thread owns it), answers BACKEND_TIMEOUT and starts a fresh serving thread. The stuck
thread is abandoned: when its call returns it sees the epoch changed and exits without touching
the socket. So a hung backend never ends the service, and ``close()`` returns within 2 s whatever
the backend does. If the REP socket itself fails (a zmq error on recv or send), it is closed with
linger=0 and bound again on the same endpoint.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, Sequence

import zmq

from .backend import Backend
from .client import validate_timeout_ms
from .dialect import ASCEND, Dialect
from .metrics import SERVER_CATEGORIES, Counters, RateLimitedWarner
from .protocol import LookupRequest, Code, Limits, ProtocolError, encode_error

logger = logging.getLogger("connector_patch.lookup.server")

_POLL_MS = 50
_JOIN_S = 1.5  # close() budget: well inside the promised 2 s


_NB = int(zmq.NOBLOCK)  # a plain int: enum flags cost microseconds per call in pyzmq


class _Abandoned(Exception):
    """The watchdog took the socket while this thread was in a backend call: exit quietly."""


_WATCHDOG_S = 0.02
MAX_ABANDONED = 4  # threads stuck in backend calls before the server stops calling the backend


class LookupServer:
    """``LookupServer(endpoint, backend)``; ``start()`` binds and serves on a thread; ``close()``
    stops it. ``groups`` defaults to the backend's ``groups`` attribute (1 if it has none).
    ``dialect`` is the channel's wire format (default: AscendStore's; vLLM's store connector
    passes ``connector_patch.store.protocol.STORE``)."""

    def __init__(self, endpoint: str, backend: Backend, *, groups: int | None = None,
                 max_token_len: int | None = None, max_hashes: int | None = None,
                 backend_timeout_ms: int = 4000, reset_drain_timeout_ms: int = 2000,
                 warn_interval_s: float = 10.0, context: zmq.Context | None = None,
                 dialect: Dialect = ASCEND):
        if not isinstance(endpoint, str) or not endpoint.startswith(("ipc://", "tcp://")):
            raise ValueError("endpoint must be an ipc:// or tcp:// address")
        self.endpoint = endpoint
        self.backend = backend
        self.dialect = dialect
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
        self._watchdog: threading.Thread | None = None
        # Socket ownership: the serving thread of epoch N owns the socket while self._epoch == N.
        # _inflight = (deadline, epoch, timeout code, request) while a backend call runs.
        self._own_lock = threading.Lock()
        self._epoch = 0
        self._inflight: tuple[float, int, str, LookupRequest | None] | None = None
        self._abandoned: list[threading.Thread] = []  # serving threads left stuck in a backend call
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
        self._spawn_serving(self._epoch)
        self._watchdog = threading.Thread(target=self._watch, name="lookup-server-watchdog", daemon=True)
        self._watchdog.start()
        return self

    def _spawn_serving(self, epoch: int) -> None:
        self._thread = threading.Thread(target=self._serve, args=(epoch,), name="lookup-server", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Idempotent, thread-safe, raises nothing; joins the serving thread within 2 s."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            deadline = time.monotonic() + _JOIN_S
            self._stop.set()
            if self._watchdog is not None:
                self._watchdog.join(max(0.0, deadline - time.monotonic()))
            thread = self._thread
            # Wait for the serving thread (it checks the stop flag every 50 ms), but not past the
            # deadline of a backend call it is stuck in: that thread is abandoned, not joined.
            while thread is not None and thread is not threading.current_thread() and thread.is_alive():
                inflight = self._inflight
                limit = deadline if inflight is None else min(deadline, inflight[0])
                now = time.monotonic()
                if now >= limit:
                    break
                thread.join(min(0.05, limit - now))
            with self._own_lock:  # take the socket from a thread stuck in a backend call, if any
                in_backend = self._inflight is not None
                self._epoch += 1
                self._inflight = None
            if thread is not None and thread.is_alive() and not in_backend and thread is not threading.current_thread():
                # it just came back from its backend call and may be sending its reply: let it
                # finish (it sees the stop flag next); the socket must not be closed under it
                thread.join(0.2)
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
        # ZMTP heartbeats: a client that vanished without a FIN or RST (a REJECT firewall, a host
        # crash) would otherwise hold a connection, and a descriptor, on the server forever
        sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)
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
    def _serve(self, epoch: int) -> None:
        while not self._stop.is_set() and self._epoch == epoch:
            sock = self._sock
            if sock is None:
                self._rebuild("bind", time.monotonic())
                continue
            try:  # blocks at most _POLL_MS (RCVTIMEO, set in _bind): one call instead of poll + recv
                frames = sock.recv_multipart(copy=True)
            except zmq.Again:
                continue
            except zmq.ZMQError:
                if self._epoch != epoch:
                    return
                self._rebuild("recv", time.monotonic())
                continue
            start = time.monotonic()
            self._counters.inc_unlocked("requests")  # only the serving thread counts requests
            try:
                reply = self._handle(frames, start, epoch)
            except _Abandoned:
                return  # the watchdog answered this request and serves on; the socket is not ours
            # counted before the send, so a client that reads the counters right after its reply
            # sees it; a send that fails is counted again as send_failed
            self._counters.inc_unlocked("replies")  # only the thread owning the socket sends
            try:
                sock.send(reply, _NB)
            except zmq.ZMQError:
                self._counters.inc("send_failed")
                self._rebuild("send", start)

    def _watch(self) -> None:
        """Every 20 ms: has a backend call overrun its deadline? Then take the socket, answer the
        request with the timeout envelope and start a new serving thread."""
        while not self._stop.wait(_WATCHDOG_S):
            with self._own_lock:
                inflight = self._inflight
                if inflight is None or time.monotonic() < inflight[0] or inflight[1] != self._epoch:
                    continue
                self._epoch += 1
                self._inflight = None
                epoch = self._epoch
            _, _, code, request = inflight
            reply = self._fail("timeout", code, "backend call exceeded its deadline", "backend",
                               time.monotonic() - self.backend_timeout_s, **_counts(request))
            sock = self._sock
            if sock is not None:
                self._counters.inc("replies_watchdog")
                try:
                    sock.send(reply, _NB)
                except zmq.ZMQError:
                    self._counters.inc("send_failed")
                    self._rebuild("send", time.monotonic())
            with self._own_lock:
                self._abandoned = [t for t in self._abandoned if t.is_alive()]
                if self._thread is not None:
                    self._abandoned.append(self._thread)  # stuck in the backend; exits when it returns
            if not self._stop.is_set():
                self._spawn_serving(epoch)

    def _fail(self, category: str, code: str, message: str, phase: str, start: float, **counts: int) -> bytes:
        self._counters.inc(category)
        self._warner.warn(category, code, phase, (time.monotonic() - start) * 1000.0, **counts)
        return encode_error(code, message)

    def _handle(self, frames: Sequence[bytes], start: float, epoch: int) -> bytes:
        """Every path ends in one envelope; raises only _Abandoned (the watchdog answered)."""
        try:
            dialect = self.dialect
            if dialect.is_reset(frames):
                return self._handle_reset(start, epoch)
            try:
                request = dialect.decode_request(frames, self.limits)
            except ProtocolError as exc:
                return self._fail("protocol", exc.code, exc.message, "decode", start, frames=len(frames))
            if self._abandoned and self._backend_stuck():
                return self._fail("timeout", Code.BACKEND_TIMEOUT, "backend still stuck: not called",
                                  "backend", start, **_counts(request))
            try:
                hit = self._call_backend(self.backend.hit_tokens, request, self.backend_timeout_s, epoch,
                                         Code.BACKEND_TIMEOUT)
            except _Abandoned:
                raise
            except Exception as exc:  # noqa: BLE001
                return self._fail("backend_error", Code.BACKEND_ERROR, f"backend raised {type(exc).__name__}",
                                  "backend", start, **_counts(request))
            if not dialect.valid_result(hit, request):
                return self._fail("backend_error", Code.BACKEND_ERROR, "backend returned an out-of-range hit",
                                  "backend", start, **_counts(request))
            self._counters.inc_unlocked("ok")  # only a serving thread that still owns the socket
            return dialect.encode_ok(hit)
        except _Abandoned:
            raise
        except Exception as exc:  # noqa: BLE001 - the per-request boundary
            return self._fail("server_error", Code.INTERNAL, f"internal error {type(exc).__name__}", "handle", start)

    def _handle_reset(self, start: float, epoch: int) -> bytes:
        def reset() -> None:
            if not self.backend.drain(self.reset_drain_timeout_s):
                raise TimeoutError("pending stores did not drain")
            self.backend.clear()

        try:
            self._call_backend(reset, None, self.reset_drain_timeout_s + self.backend_timeout_s, epoch,
                               Code.RESET_FAILED)
        except _Abandoned:
            raise
        except Exception as exc:  # noqa: BLE001
            return self._fail("backend_error", Code.RESET_FAILED, f"reset failed: {type(exc).__name__}",
                              "reset", start)
        self._counters.inc("resets")
        self._counters.inc("ok")
        return self.dialect.reset_ok

    def _backend_stuck(self) -> bool:
        """Circuit breaker: with MAX_ABANDONED serving threads still stuck in backend calls, a new
        request is answered BACKEND_TIMEOUT at once instead of leaving one more thread behind."""
        with self._own_lock:
            self._abandoned = [t for t in self._abandoned if t.is_alive()]
            return len(self._abandoned) >= MAX_ABANDONED

    def _call_backend(self, fn: Callable[..., Any], request: LookupRequest | None, timeout_s: float, epoch: int,
                      timeout_code: str) -> Any:
        """Run ``fn(request)`` (or ``fn()`` for an admin call) inline under the watchdog's deadline.
        Raises _Abandoned when the watchdog took over meanwhile (the result is then dropped), else
        returns or raises what ``fn`` did."""
        # a plain attribute store (atomic): the watchdog reads it under the lock and checks the epoch
        self._inflight = (time.monotonic() + timeout_s, epoch, timeout_code, request)
        error: BaseException | None = None
        value: Any = None
        try:
            value = fn() if request is None else fn(request)
        except Exception as exc:  # noqa: BLE001 - re-raised below once ownership is confirmed
            error = exc
        with self._own_lock:
            if self._epoch != epoch:
                raise _Abandoned()
            self._inflight = None
        if error is not None:
            raise error
        return value


def _counts(request: LookupRequest | None) -> dict[str, int]:
    """What a log line may say about a request: counts only."""
    if request is None:
        return {}
    return {"token_len": request.token_len, "hashes": len(request.hashes), "groups": len(request.group_ids)}
