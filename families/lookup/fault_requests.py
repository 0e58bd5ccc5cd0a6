"""Fault ``malformed_requests``: bad frame lists sent straight to the real server.

During its window the fault sends malformed lookup requests to ``ctx.server_endpoint`` (the
server's own endpoint, past any interposer or proxy) from its own DEALER socket, on a background
thread, one at a time, and waits up to ``reply_timeout`` for each answer. The hardened server
must answer every one with exactly one v1 error envelope and keep serving; the legacy server's
thread dies on the first request it cannot parse, after which nothing is answered.

At ``stop()`` (once: :class:`faults.base.OnceFault`) the result is written as ``ctx.event("malformed_requests", sent=..,
answered=.., unanswered=.., by_code={CODE: n}, accepted=.., invalid=.., duplicates=.., by_kind={..})``:

- ``answered``: requests that got a reply within ``reply_timeout``;
- ``by_code``: error codes of the replies that were well-formed v1 error envelopes;
- ``accepted``: replies that were a v1 *ok* envelope (a bad request accepted);
- ``invalid``: replies that were not a v1 envelope at all (e.g. a raw 4-byte legacy reply);
- ``duplicates``: replies beyond the first for one request (must be 0).

"Each answered exactly once with an error envelope" is ``answered == sent`` and ``accepted ==
invalid == duplicates == 0``. The frames themselves are never logged or recorded.
"""

from __future__ import annotations

import threading
from typing import Any, Literal

import msgpack
import zmq
from pydantic import Field

from connector_patch.lookup.protocol import MAX_TOKEN_LEN, Code, ProtocolError, decode_reply, encode_u32

from faults.base import LASTING, Duration, FaultContext, FaultParams, OnceFault, register

RequestKind = Literal["frame_count", "int_width", "bad_msgpack", "bad_group_ids", "non_hex_hashes",
                      "oversized_token_len", "hbm_over_token_len", "too_many_hashes"]
REQUEST_KINDS: tuple[str, ...] = RequestKind.__args__  # type: ignore[attr-defined]

# The code the hardened server must answer each kind with.
EXPECTED_CODE = {
    "frame_count": Code.BAD_FRAME_COUNT,
    "int_width": Code.BAD_INT_FRAME,
    "bad_msgpack": Code.BAD_MSGPACK,
    "bad_group_ids": Code.BAD_GROUP_IDS,
    "non_hex_hashes": Code.BAD_HASHES,
    "oversized_token_len": Code.BAD_TOKEN_LEN,
    "hbm_over_token_len": Code.BAD_HBM_HIT_TOKENS,
    "too_many_hashes": Code.TOO_MANY_HASHES,
}

_HASH = "ab" * 32  # a well-formed 32-byte block hash, in hex


def _valid(token_len: int = 64, groups: object = (0,), hbm: int = 0, hashes: object = None) -> list[bytes]:
    hashes = [_HASH] * 4 if hashes is None else hashes
    return [encode_u32(token_len), msgpack.packb(list(groups) if isinstance(groups, tuple) else groups),
            encode_u32(hbm), msgpack.packb(hashes)]


def bad_requests(kind: str) -> list[list[bytes]]:
    """The frame lists of one kind. Every other field of each list is valid, so the hardened
    server's answer is EXPECTED_CODE[kind]."""
    v = _valid()
    if kind == "frame_count":
        return [v[:1], v[:2], v[:3], v + [msgpack.packb([])], v + v]
    if kind == "int_width":
        return [[b"\x00\x00\x40", *v[1:]], [b"\x00\x00\x00\x00\x40", *v[1:]],
                [*v[:2], b"\x00\x00\x00", v[3]], [*v[:2], b"\x00\x00\x00\x00\x00", v[3]]]
    if kind == "bad_msgpack":
        return [[v[0], b"\xc1", *v[2:]], [*v[:3], b"\xc1"], [*v[:3], b"\x92\xa2ab"], [v[0], b"", *v[2:]]]
    if kind == "bad_group_ids":
        return [_valid(groups=[]), _valid(groups=[-1]), _valid(groups=[0, 0]), _valid(groups=[1000]),
                _valid(groups=["0"]), _valid(groups=0), _valid(groups=[1.5])]
    if kind == "non_hex_hashes":
        return [_valid(hashes=["zz" * 32]), _valid(hashes=["abc"]), _valid(hashes=[""]), _valid(hashes=[7]),
                _valid(hashes=_HASH), _valid(hashes=[None])]
    if kind == "oversized_token_len":
        return [_valid(token_len=MAX_TOKEN_LEN + 1), _valid(token_len=0xFFFFFFFF)]
    if kind == "hbm_over_token_len":
        return [_valid(token_len=32, hbm=33), _valid(token_len=0, hbm=1)]
    if kind == "too_many_hashes":
        return [[*v[:3], b"\xdd" + (70_000).to_bytes(4, "big")]]  # array32 header, no elements
    raise ValueError(f"unknown request kind {kind!r}")


class _Result:
    def __init__(self) -> None:
        self.sent = self.answered = self.unanswered = self.accepted = self.invalid = self.duplicates = 0
        self.by_code: dict[str, int] = {}
        self.by_kind: dict[str, dict[str, int]] = {}

    def as_fields(self) -> dict:
        return {"sent": self.sent, "answered": self.answered, "unanswered": self.unanswered,
                "by_code": dict(self.by_code), "accepted": self.accepted, "invalid": self.invalid,
                "duplicates": self.duplicates, "by_kind": {k: dict(v) for k, v in self.by_kind.items()}}


@register
class MalformedRequests(OnceFault):
    """Malformed lookup requests sent to the real server; every one must get exactly one error envelope."""

    name = "malformed_requests"
    family = "lookup"
    categories = ()  # the workload's own lookups are not affected (the hardened server)
    # today's server thread may die of one (vllm-ascend's LookupKeyServer): every later lookup then
    # waits for ever, whatever comes after the window
    may_cause = ("timeout",)
    tail_s = LASTING

    class Params(FaultParams):
        kinds: list[RequestKind] = Field(default_factory=lambda: list(REQUEST_KINDS), min_length=1,
                                         description="which kinds of bad request (default: all)")
        count: int | None = Field(None, ge=1, le=100_000,
                                  description="requests to send, cycling through the kinds (default: each once)")
        interval: Duration = Field(0.005, description="pause between two requests")
        reply_timeout: Duration = Field(0.5, description="how long to wait for each answer")

    def __init__(self, params: FaultParams, ctx: FaultContext):
        super().__init__(params, ctx)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._result = _Result()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ fault
    def inject(self) -> None:
        if self._thread is not None:
            return
        endpoint = self.ctx.server_endpoint
        self._thread = threading.Thread(target=self._run, args=(endpoint,), name="pdchaos-malformed-requests",
                                        daemon=True)
        self._thread.start()

    def heal(self) -> None:
        if self._thread is None:  # never started: nothing sent, nothing to record
            return
        self._stop.set()
        self._thread.join(self.params.reply_timeout + 2.0)
        with self._lock:
            fields = self._result.as_fields()
        self.ctx.event("malformed_requests", **fields)

    def result(self) -> dict:
        with self._lock:
            return self._result.as_fields()

    # ------------------------------------------------------------------ sender
    @staticmethod
    def frames_of(kind: str) -> list[list[bytes]]:
        """The bad requests of one kind (this channel's protocol)."""
        return bad_requests(kind)

    @staticmethod
    def decode(body: list[bytes]) -> Any:
        """A reply's body as this channel's v1 client reads it (ProtocolError: not an envelope)."""
        return decode_reply(body, None)

    def _plan(self) -> list[tuple[str, list[bytes]]]:
        plan = [(k, frames) for k in self.params.kinds for frames in self.frames_of(k)]
        n = self.params.count or len(plan)
        return [plan[i % len(plan)] for i in range(n)]

    def _run(self, endpoint: str) -> None:
        ctx = zmq.Context()
        sock = None
        try:
            for kind, frames in self._plan():
                if self._stop.is_set():
                    break
                if sock is None:
                    sock = ctx.socket(zmq.DEALER)
                    sock.setsockopt(zmq.LINGER, 0)
                    sock.connect(endpoint)
                self._drain_duplicates(sock)
                answered = self._one(sock, kind, frames)
                if not answered:
                    # A late answer would be taken for the next request's: start afresh.
                    sock.close(linger=0)
                    sock = None
                if self._stop.wait(self.params.interval):
                    break
            if sock is not None:
                sock.poll(20, zmq.POLLIN)
                self._drain_duplicates(sock)
        finally:
            if sock is not None:
                sock.close(linger=0)
            ctx.term()

    def _one(self, sock: zmq.Socket, kind: str, frames: list[bytes]) -> bool:
        try:
            sock.send_multipart([b"", *frames], flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            sent_ok = False
        else:
            sent_ok = True
        with self._lock:
            self._result.sent += 1
            per = self._result.by_kind.setdefault(kind, {"sent": 0, "answered": 0})
            per["sent"] += 1
        timeout_ms = max(1, round(self.params.reply_timeout * 1000))
        if not sent_ok or not sock.poll(timeout_ms, zmq.POLLIN):
            with self._lock:
                self._result.unanswered += 1
            return False
        reply = sock.recv_multipart()
        with self._lock:
            self._result.answered += 1
            per["answered"] += 1
            self._classify(reply)
        return True

    def _classify(self, reply: list[bytes]) -> None:
        r = self._result
        if len(reply) < 2 or reply[0] != b"":
            r.invalid += 1
            return
        try:
            decoded = self.decode(reply[1:])
        except ProtocolError:
            r.invalid += 1
            return
        if decoded.ok:
            r.accepted += 1
        else:
            r.by_code[decoded.code] = r.by_code.get(decoded.code, 0) + 1

    def _drain_duplicates(self, sock: zmq.Socket) -> None:
        while True:
            try:
                sock.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            with self._lock:
                self._result.duplicates += 1
