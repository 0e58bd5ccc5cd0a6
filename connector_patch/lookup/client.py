"""The scheduler's side of the lookup RPC: one deadline per call, fail-open, socket recovery.

State machine (DESIGN.md, "Client state machine"): IDLE -> SENDING -> WAITING -> VALIDATING ->
IDLE on success; any failure in any phase goes to RECOVERING (close the REQ socket with
linger=0, open and connect a new one) and then IDLE, before ``lookup()`` returns 0.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Sequence

import zmq

from .metrics import CLIENT_CATEGORIES, Counters, RateLimitedWarner
from .protocol import BACKEND_CODES, OK_PREFIX, RESET_FRAME, Code, ProtocolError, decode_reply, encode_request

logger = logging.getLogger("connector_patch.lookup.client")

DEFAULT_TIMEOUT_MS = 5000


def validate_timeout_ms(value: object, name: str = "lookup_rpc_timeout_ms") -> int:
    """Positive int milliseconds only: 0, negatives, bools, floats and strings raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a positive int (milliseconds), got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int (milliseconds), got {value}; there is no 'wait forever'")
    return value


def backend_timeout_for(rpc_timeout_ms: int, backend_timeout_ms: object = None,
                        rpc_key: str = "lookup_rpc_timeout_ms", backend_key: str = "lookup_backend_timeout_ms") -> int:
    """The server's backend deadline: below the client's, so that its BACKEND_TIMEOUT reaches a
    client still waiting (issue 30, item 11: 4000 ms against the client's 1000 ms, the server's
    answer never came in time and every lookup spent the client's full deadline). Unset: three
    quarters of the client's; set: it must be less than the client's (ValueError naming both)."""
    if backend_timeout_ms is None:
        return max(1, rpc_timeout_ms * 3 // 4)
    value = validate_timeout_ms(backend_timeout_ms, backend_key)
    if value >= rpc_timeout_ms:
        raise ValueError(f"{backend_key} ({value}) must be less than {rpc_timeout_ms} ({rpc_key}): the server's "
                         f"BACKEND_TIMEOUT answer would reach no client still waiting")
    return value


_OK_PREFIX = OK_PREFIX  # the v1 ok envelope up to the hit_tokens value (the server's encoding)


def _canonical_ok_hit(reply: list[bytes], token_len: int | None) -> int | None:
    """Fast path for the one reply a v1 server sends on success: one frame, byte-identical to
    ``encode_ok(hit)``. Returns the hit when it is an int in [0, token_len], else None, and the
    caller runs the full ``decode_reply`` (any other shape, key order or value goes that way, so
    the rules and error codes are exactly decode_reply's). The int is read by hand from msgpack's
    unsigned encodings (positive fixint, uint 8/16/32/64): cheaper than a decoder call."""
    if len(reply) != 1:
        return None
    frame = reply[0]
    if not frame.startswith(_OK_PREFIX):
        return None
    tail = frame[_PREFIX_LEN:]
    n = len(tail)
    if n == 1 and tail[0] < 0x80:
        hit = tail[0]
    elif n in (2, 3, 5, 9) and tail[0] == _UINT_TAG[n]:
        hit = int.from_bytes(tail[1:], "big")
    else:
        return None
    if token_len is not None and hit > token_len:
        return None
    return hit


_PREFIX_LEN = len(_OK_PREFIX)
_UINT_TAG = {2: 0xCC, 3: 0xCD, 5: 0xCE, 9: 0xCF}


# Flags as plain ints: pyzmq's send_multipart/recv with enum flags spends ~14 us per lookup on
# enum arithmetic (flags | SNDMORE for every frame), a tenth of a whole round trip.
_NB = int(zmq.NOBLOCK)
_NB_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)


def _send_frames(sock: zmq.Socket, frames: list[bytes]) -> None:
    """send_multipart(frames, NOBLOCK) without the enum overhead (a REQ message is queued whole
    or not at all: the first frame raises zmq.Again when it cannot be)."""
    if len(frames) == 4:  # a lookup: unrolled
        send = sock.send
        send(frames[0], _NB_MORE)
        send(frames[1], _NB_MORE)
        send(frames[2], _NB_MORE)
        send(frames[3], _NB)
        return
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        sock.send(frame, _NB_MORE if i < last else _NB)


class _Failure(Exception):
    def __init__(self, category: str, code: str):
        super().__init__(code)
        self.category = category
        self.code = code


class LookupClient:
    """REQ client. ``lookup()`` and ``reset()`` never raise and never take longer than the deadline
    (plus scheduling noise): every failure returns 0 / False and leaves a fresh socket behind.

    One call at a time per client (REQ is strictly request-reply); concurrent callers wait for the
    lock within their own deadline.
    """

    def __init__(self, endpoint: str, timeout_ms: int = DEFAULT_TIMEOUT_MS, *,
                 context: zmq.Context | None = None, warn_interval_s: float = 10.0):
        self.timeout_ms = validate_timeout_ms(timeout_ms)
        self._timeout_s = self.timeout_ms / 1000.0
        if not isinstance(endpoint, str) or not endpoint.startswith(("ipc://", "tcp://")):
            raise ValueError("endpoint must be an ipc:// or tcp:// address")
        self.endpoint = endpoint
        self._own_ctx = context is None
        self._ctx = context if context is not None else zmq.Context()
        self._sock: zmq.Socket | None = None
        self._poller: zmq.Poller | None = None  # POLLIN on _sock; made and dropped with it
        self._lock = threading.Lock()
        self._closed = False
        self._counters = Counters("client", CLIENT_CATEGORIES)
        self._warner = RateLimitedWarner(logger, warn_interval_s)
        self.last_outcome = "none"  # category of the last call: ok / timeout / transport / ...
        self.last_code = ""

    # ------------------------------------------------------------------ public
    @property
    def counters(self) -> dict[str, int]:
        return self._counters.snapshot()

    def lookup(self, token_len: int, block_hashes: Sequence[bytes],
               kv_cache_group_ids: Sequence[int] = (0,), hbm_hit_tokens: int = 0) -> int:
        start = time.monotonic()
        # the log counts are only worked out when something fails (see _counts)
        call = (token_len, block_hashes, kv_cache_group_ids)
        try:
            frames = encode_request(token_len, [h.hex() for h in block_hashes], kv_cache_group_ids,
                                    hbm_hit_tokens)
        except Exception:  # a caller bug must not reach the scheduler either
            self._record("bad_call", Code.BAD_CALL, "encode", start, call, recover=False)
            return 0
        result = self._exchange(frames, start + self._timeout_s, start, call, token_len)
        return 0 if result is None else result

    def reset(self) -> bool:
        start = time.monotonic()
        deadline = start + self.timeout_ms / 1000.0
        result = self._exchange([RESET_FRAME], deadline, start, None, None, admin=True)
        ok = result is not None
        self._counters.inc("reset_ok" if ok else "reset_failed")
        return ok

    def close(self) -> None:
        """Idempotent, thread-safe, raises nothing. A call in flight returns 0 within its deadline.

        Never waits longer than a call's deadline (+1 s) for the lock: a KeyboardInterrupt that
        lands between a call's acquire and its ``try`` leaves the lock held by nobody (measured:
        ``pdchaos bench lookup`` interrupted by SIGINT hung in close, once in a full test run)."""
        try:
            got = self._lock.acquire(timeout=self._timeout_s + 1.0)
            try:
                if self._closed:
                    return
                self._closed = True
                self._drop_socket()
                if self._own_ctx:
                    self._ctx.term()
            finally:
                if got:
                    self._lock.release()
        except Exception:  # pragma: no cover - close must never raise
            logger.debug("lookup client close: ignored error", exc_info=False)

    def __enter__(self) -> "LookupClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- internals
    # the channel's reply rules (vLLM's store channel overrides both: connector_patch/store/client.py)
    _decode_reply = staticmethod(decode_reply)
    _fast_ok = True  # the AscendStore ok envelope is recognised by its bytes (see _canonical_ok_hit)

    @staticmethod
    def _value(decoded):  # what an ok reply gives the caller
        return decoded.hit_tokens

    def _exchange(self, frames: list[bytes], deadline: float, start: float, call: tuple | None,
                  token_len: int | None, admin: bool = False) -> int | None:
        """One request-reply within the deadline. Returns the hit (0 for admin ok) or None on failure."""
        if not (self._lock.acquire(False) or self._lock.acquire(timeout=max(0.0, deadline - time.monotonic()))):
            self._record("timeout", Code.TIMEOUT, "queue", start, call, recover=False)
            return None
        phase = "connect"
        try:
            if self._closed:
                raise _Failure("transport", Code.TRANSPORT)
            try:
                sock = self._sock or self._ensure_socket()
                phase = "send"
                try:  # a REQ socket is nearly always writable: try first, wait only on zmq.Again
                    _send_frames(sock, frames)
                except zmq.Again:
                    if not self._wait(sock, zmq.POLLOUT, deadline):
                        raise _Failure("timeout", Code.TIMEOUT) from None
                    _send_frames(sock, frames)
                phase = "recv"
                # A poll with the remaining time, then a non-blocking recv (not RCVTIMEO: pyzmq
                # restarts a blocking recv with its full timeout after EINTR; poll shortens it).
                # REQ_CORRELATE drops a stale reply (a duplicate of an earlier answer) inside
                # libzmq: the poll then says "readable" but the recv finds nothing; wait again.
                while True:
                    remaining_ms = (deadline - time.monotonic()) * 1000.0
                    if remaining_ms <= 0 or not self._poller.poll(int(remaining_ms) + 1):  # ms, rounded up
                        raise _Failure("timeout", Code.TIMEOUT)
                    try:
                        reply = sock.recv_multipart(_NB)
                        break
                    except zmq.Again:
                        continue
            except zmq.Again:
                raise _Failure("timeout", Code.TIMEOUT) from None
            except zmq.ZMQError:
                raise _Failure("transport", Code.TRANSPORT) from None
            phase = "validate"
            # The common case inline (see _canonical_ok_hit): one frame, the ok prefix, a
            # positive fixint hit. Anything else takes the general path below.
            hit = None
            if len(reply) == 1 and self._fast_ok:
                frame = reply[0]
                n = len(frame) - _PREFIX_LEN
                if frame.startswith(_OK_PREFIX):
                    if n == 1 and frame[-1] < 0x80:  # positive fixint
                        hit = frame[-1]
                    elif n == 3 and frame[-3] == 0xCD:  # uint 16
                        hit = (frame[-2] << 8) | frame[-1]
                    else:
                        hit = _canonical_ok_hit(reply, None)
                    if hit is not None and token_len is not None and hit > token_len:
                        hit = None
            if hit is not None:  # exactly what decode_reply would accept
                if time.monotonic() > deadline:  # the deadline covers validation too
                    raise _Failure("timeout", Code.TIMEOUT)
                self.last_outcome, self.last_code = "ok", ""
                if admin:
                    return 0
                self._counters.inc_unlocked("ok")  # under this client's lock
                return hit
            try:
                decoded = self._decode_reply(reply, token_len)
            except ProtocolError as exc:
                raise _Failure("protocol", exc.code) from None
            if time.monotonic() > deadline:  # the deadline covers validation too
                raise _Failure("timeout", Code.TIMEOUT)
            if not decoded.ok:
                raise _Failure("backend_error" if decoded.code in BACKEND_CODES else "server_error", decoded.code)
            if admin:
                self.last_outcome, self.last_code = "ok", ""
                return 0
            self._counters.inc("ok")
            self.last_outcome, self.last_code = "ok", ""
            return self._value(decoded)
        except _Failure as failure:
            self._record(failure.category, failure.code, phase, start, call, recover=True)
            return None
        except Exception:  # anything unforeseen still fails open and recovers
            self._record("transport", Code.TRANSPORT, phase, start, call, recover=True)
            return None
        finally:
            self._lock.release()

    def _wait(self, sock: zmq.Socket, event: int, deadline: float) -> bool:
        remaining_ms = (deadline - time.monotonic()) * 1000.0
        if remaining_ms <= 0:
            return False
        return bool(sock.poll(timeout=max(1, math.ceil(remaining_ms)), flags=event) & event)

    def _ensure_socket(self) -> zmq.Socket:
        if self._sock is None:
            sock = self._ctx.socket(zmq.REQ)
            sock.setsockopt(zmq.LINGER, 0)
            # Match each reply to its request: a duplicated or late reply to an earlier request is
            # dropped by libzmq instead of being taken as this request's answer. RELAXED is what
            # CORRELATE is meant to be used with; we still never send twice without a reply, since
            # every failure rebuilds the socket.
            sock.setsockopt(zmq.REQ_CORRELATE, 1)
            sock.setsockopt(zmq.REQ_RELAXED, 1)
            try:
                sock.connect(self.endpoint)
            except zmq.ZMQError:
                sock.close(linger=0)
                raise
            poller = zmq.Poller()
            poller.register(sock, zmq.POLLIN)
            self._sock, self._poller = sock, poller
        return self._sock

    def _drop_socket(self) -> None:
        self._poller = None
        if self._sock is not None:
            try:
                self._sock.close(linger=0)
            finally:
                self._sock = None

    @staticmethod
    def _counts(call: tuple | None) -> dict[str, int]:
        """token/hash/group counts of a call for the log line (never the hashes themselves)."""
        if call is None:
            return {}
        token_len, hashes, groups = call
        return {"token_len": token_len if isinstance(token_len, int) else -1,
                "hashes": len(hashes) if hasattr(hashes, "__len__") else -1,
                "groups": len(groups) if hasattr(groups, "__len__") else -1}

    def _record(self, category: str, code: str, phase: str, start: float, call: tuple | None, *,
                recover: bool) -> None:
        """Count, warn (rate-limited) and, for failures inside an exchange, rebuild the socket.
        Called with the lock held when ``recover`` is True."""
        self.last_outcome, self.last_code = category, code
        self._counters.inc(category)
        if recover:
            self._drop_socket()
            if not self._closed:
                try:
                    self._ensure_socket()
                    self._counters.inc("socket_rebuilds")
                except Exception:  # a bad endpoint now; the next call tries again
                    pass
        self._warner.warn(category, code, phase, (time.monotonic() - start) * 1000.0, **self._counts(call))
