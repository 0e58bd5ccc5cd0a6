"""Node ``fake-peer``: a lookup server that misbehaves on purpose.

``pdchaos node fake-peer --endpoint EP --mode MODE [...]`` binds on EP where the real server
would, and answers the lookup RPC wrongly, one way per mode:

``slow``       the correct v1 answer (computed from a MemoryBackend holding ``--preload``), sent
               ``--delay-ms`` after the request arrived; a bad request gets the v1 error envelope
               and the admin ``reset`` clears the keys and answers ok, as the real server does.
``silent``     receives every request and never answers.
``malformed``  answers every request with one broken reply, ``--reply KIND`` (see REPLY_KINDS).
``legacy``     today's upstream reply: one raw 4-byte u32 big-endian frame holding the correct hit.

``--delay-ms`` delays the answer in every answering mode (it is what makes ``slow`` slow).

Wire behaviour: to the client it is exactly a REP socket (the envelope up to the empty delimiter
is echoed in front of the reply). It is built on a ROUTER, by hand, for one reason: the delay is
then per request, not queued behind the requests of other clients, so "slow but below the
deadline" stays below the deadline whatever the workload's concurrency; and a silent peer keeps
counting the requests it swallows (a REP could not receive a second one).

Control channel (``--control``): ``stats`` answers ``received`` / ``replied`` (also as
``counters.requests`` / ``counters.replies``), ``pending``, ``discarded``, ``bad_requests`` and the
current mode; ``set_mode {mode, reply, delay_ms}`` switches behaviour at run time.

When the runner swaps the real server for a fake peer (``ctx.swap_server("fake-peer", ARGS)``),
the topology appends ``--endpoint``, ``--control``, ``--preload``, ``--block-size`` and
``--groups`` itself; the fault passes only the mode-specific arguments.

This module also holds the few node helpers the ``faults`` nodes share (endpoint check, preload
reader, signal-driven stop): ``faults`` must not import ``harness`` (one-way dependencies), so
they are small local copies of the same rules, and bad input is reported the way the CLI does
(one ``error:`` line on stderr, exit 2).

Logs carry counts, modes and codes only: never a hash, a key or a frame.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import logging
import math
import os
import sys
import threading
import time
from typing import Sequence

import msgpack
import zmq

from connector_patch.lookup import MemoryBackend
from connector_patch.lookup.protocol import (
    PROTOCOL_VERSION,
    RESET_FRAME,
    Limits,
    ProtocolError,
    decode_request,
    encode_error,
    encode_ok,
)

from faults.nodeio import NodeUsageError, check_endpoint, read_hashes, stop_on_signals  # noqa: F401 - used by interposer too

logger = logging.getLogger("faults.fake_peer")

MODES = ("slow", "silent", "malformed", "legacy")

# Broken replies, and the client-side code the hardened client must report for each (category
# "protocol" for all of them). The interposer's named rewrites reuse these, plus "legacy4".
REPLY_KINDS: dict[str, str] = {
    "empty": "EMPTY_REPLY",  # one zero-length frame
    "two_frames": "EXTRA_FRAMES",  # a correct envelope, twice, as two frames of one message
    "not_msgpack": "BAD_REPLY",  # bytes that are not msgpack (and not 4 long)
    "not_map": "BAD_REPLY",  # msgpack, but an array
    "missing_key": "BAD_FIELDS",  # ok envelope without hit_tokens
    "extra_key": "BAD_FIELDS",  # ok envelope with one more key
    "wrong_type": "BAD_TYPES",  # hit_tokens as a string
    "version2": "UNSUPPORTED_VERSION",  # a correct envelope with version 2
    "hit_over": "HIT_OUT_OF_RANGE",  # hit_tokens = token_len + 1
    "hit_negative": "HIT_OUT_OF_RANGE",  # hit_tokens = -1
}
LEGACY4_CODE = "LEGACY_REPLY"

_POLL_MS = 50
_U32_MAX = 0xFFFFFFFF


# --------------------------------------------------------------------------- broken replies


def legacy_reply(hit: int) -> list[bytes]:
    """Today's upstream reply: the hit as u32 big-endian, one frame."""
    return [min(max(int(hit), 0), _U32_MAX).to_bytes(4, "big")]


def malformed_reply(kind: str, hit: int, token_len: int) -> list[bytes]:
    """The body frames of one broken reply of ``kind`` (a key of REPLY_KINDS, or "legacy4")."""
    ok = {"version": PROTOCOL_VERSION, "status": "ok", "hit_tokens": int(hit)}
    if kind == "empty":
        return [b""]
    if kind == "two_frames":
        return [encode_ok(hit), encode_ok(hit)]
    if kind == "not_msgpack":
        return [b"\xc1not-msgpack"]  # 0xc1 is the one byte msgpack never uses
    if kind == "not_map":
        return [msgpack.packb([PROTOCOL_VERSION, "ok", int(hit), 0])]
    if kind == "missing_key":
        return [msgpack.packb({"version": PROTOCOL_VERSION, "status": "ok"})]
    if kind == "extra_key":
        return [msgpack.packb({**ok, "extra": 1})]
    if kind == "wrong_type":
        return [msgpack.packb({**ok, "hit_tokens": str(int(hit))})]
    if kind == "version2":
        return [msgpack.packb({**ok, "version": PROTOCOL_VERSION + 1})]
    if kind == "hit_over":
        return [msgpack.packb({**ok, "hit_tokens": int(token_len) + 1})]
    if kind == "hit_negative":
        return [msgpack.packb({**ok, "hit_tokens": -1})]
    if kind == "legacy4":
        return legacy_reply(hit)
    raise ValueError(f"unknown reply kind {kind!r}")


def split_envelope(frames: Sequence[bytes]) -> tuple[list[bytes], list[bytes]] | None:
    """``frames`` without the ROUTER identity -> (envelope up to and including the empty delimiter,
    body). None when there is no delimiter (a REP socket would discard such a message)."""
    for i, f in enumerate(frames):
        if len(f) == 0:
            return list(frames[: i + 1]), list(frames[i + 1:])
    return None


def request_token_len(body: Sequence[bytes]) -> int:
    """token_len of a lookup request when frame 0 is a 4-byte int, else 0."""
    if len(body) == 4 and len(body[0]) == 4:
        return int.from_bytes(body[0], "big")
    return 0


# --------------------------------------------------------------------------- node helpers


def unlink_ipc(endpoint: str | None) -> None:
    if endpoint and endpoint.startswith("ipc://") and not endpoint.startswith("ipc://@"):
        try:
            os.unlink(endpoint[len("ipc://"):])
        except OSError:
            pass


def setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, str(level).upper(), logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def usage_exit(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


# --------------------------------------------------------------------------- the peer


class FakePeer:
    """The misbehaving server. ``bind()`` then ``serve(stop_event)`` on one thread; ``set_mode``
    and ``stats`` are safe from another thread (the control channel's)."""

    def __init__(self, endpoint: str, mode: str, *, backend: MemoryBackend, delay_ms: int = 0,
                 reply: str | None = None):
        self.endpoint = endpoint
        self.backend = backend
        self.limits = Limits(num_groups=backend.groups)
        self._lock = threading.Lock()
        self.mode = "silent"
        self.reply: str | None = None
        self.delay_s = 0.0
        self.set_mode(mode, reply=reply, delay_ms=delay_ms)
        self._ctx = zmq.Context()
        self._sock: zmq.Socket | None = None
        self._timers: list = []  # (due, seq, frames)
        self._seq = itertools.count()
        self.received = self.replied = self.discarded = self.bad_requests = self.send_failed = 0

    def set_mode(self, mode: str, reply: str | None = None, delay_ms: int = 0) -> dict:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}")
        if mode == "malformed" and reply not in REPLY_KINDS:
            raise ValueError(f"mode malformed needs reply, one of {', '.join(REPLY_KINDS)}")
        if isinstance(delay_ms, bool) or not isinstance(delay_ms, int) or not 0 <= delay_ms <= 3_600_000:
            raise ValueError("delay_ms must be an int in [0, 3600000]")
        with self._lock:
            self.mode, self.reply, self.delay_s = mode, (reply if mode == "malformed" else None), delay_ms / 1000.0
        return {}

    def stats(self) -> dict:
        with self._lock:
            return {
                "mode": self.mode, "reply": self.reply, "delay_ms": round(self.delay_s * 1000),
                "received": self.received, "replied": self.replied, "pending": len(self._timers),
                "discarded": self.discarded, "bad_requests": self.bad_requests,
                "send_failed": self.send_failed, "alive": True,
                "counters": {"requests": self.received, "replies": self.replied},
            }

    def bind(self) -> None:
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.bind(self.endpoint)
        except zmq.ZMQError:
            sock.close(linger=0)
            raise
        self._sock = sock

    def _answer(self, body: list[bytes], mode: str, reply: str | None) -> list[bytes]:
        if mode == "slow" and body == [RESET_FRAME]:  # admin reset, as the real server does it
            self.backend.clear()
            return [encode_ok(0)]
        token_len = request_token_len(body)
        try:
            request = decode_request(body, self.limits)
            hit = self.backend.hit_tokens(request)
        except ProtocolError as exc:
            self.bad_requests += 1
            if mode == "slow":
                return [encode_error(exc.code, exc.message)]
            hit = 0
        if mode == "legacy":
            return legacy_reply(hit)
        if mode == "malformed":
            return malformed_reply(reply or "empty", hit, token_len)
        return [encode_ok(hit)]

    def _on_request(self, frames: list[bytes], now: float) -> None:
        split = split_envelope(frames[1:])
        with self._lock:
            mode, reply, delay = self.mode, self.reply, self.delay_s
            if split is None:
                self.discarded += 1
                return
            self.received += 1
        if mode == "silent":
            return
        envelope, body = split
        out = [frames[0], *envelope, *self._answer(body, mode, reply)]
        if delay > 0:
            with self._lock:
                heapq.heappush(self._timers, (now + delay, next(self._seq), out))
        else:
            self._send(out)

    def _send(self, frames: list[bytes]) -> None:
        assert self._sock is not None
        with self._lock:  # counted before the send: a client may ask for stats as soon as it has the reply
            self.replied += 1
        try:
            self._sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=True)
        except zmq.ZMQError:  # full queue to a gone client: never block
            with self._lock:
                self.replied -= 1
                self.send_failed += 1

    def serve(self, stop: threading.Event) -> None:
        assert self._sock is not None, "bind() first"
        sock = self._sock
        while not stop.is_set():
            now = time.monotonic()
            timeout_ms = _POLL_MS
            if self._timers:
                timeout_ms = max(0, min(_POLL_MS, math.ceil((self._timers[0][0] - now) * 1000)))
            if sock.poll(timeout_ms, zmq.POLLIN):
                for _ in range(256):  # drain, bounded, so timers still fire
                    try:
                        frames = sock.recv_multipart(flags=zmq.NOBLOCK, copy=True)
                    except zmq.Again:
                        break
                    self._on_request(frames, time.monotonic())
            now = time.monotonic()
            while self._timers and self._timers[0][0] <= now:
                with self._lock:
                    _, _, out = heapq.heappop(self._timers)
                self._send(out)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        self._ctx.term()
        unlink_ipc(self.endpoint)


# --------------------------------------------------------------------------- node


def add_node_arguments(p: argparse.ArgumentParser, kind: str) -> None:  # noqa: ARG001
    p.add_argument("--endpoint", required=True, help="ipc:///path or tcp://127.0.0.1:PORT to bind")
    p.add_argument("--mode", required=True, choices=MODES, help="how to misbehave")
    p.add_argument("--delay-ms", type=int, default=0, help="answer this long after the request (default 0)")
    p.add_argument("--reply", choices=tuple(REPLY_KINDS), help="mode malformed: which broken reply")
    p.add_argument("--preload", help="file with one block-hash hex per line, present in every group")
    p.add_argument("--block-size", type=int, default=16, help="tokens per block (default 16)")
    p.add_argument("--groups", type=int, default=1, help="KV cache groups (default 1)")
    p.add_argument("--control", help="ipc endpoint of the harness control channel")
    p.add_argument("--log-level", default="INFO")


def run_node(args: argparse.Namespace) -> int:
    try:
        check_endpoint(args.endpoint, "--endpoint")
        if args.control:
            check_endpoint(args.control, "--control")
        for name in ("block_size", "groups"):
            if getattr(args, name) <= 0:
                raise NodeUsageError(f"--{name.replace('_', '-')}: must be a positive integer")
        if args.mode == "malformed" and not args.reply:
            raise NodeUsageError("--reply: required with --mode malformed")
        if args.mode != "malformed" and args.reply:
            raise NodeUsageError(f"--reply: only used with --mode malformed, not {args.mode}")
        if not 0 <= args.delay_ms <= 3_600_000:
            raise NodeUsageError("--delay-ms: must be in [0, 3600000]")
        preload = read_hashes(args.preload) if args.preload else []
    except NodeUsageError as exc:
        return usage_exit(str(exc))
    setup_logging(args.log_level)
    backend = MemoryBackend(block_size=args.block_size, groups=args.groups)
    backend.put(preload)
    peer = FakePeer(args.endpoint, args.mode, backend=backend, delay_ms=args.delay_ms, reply=args.reply)
    stop = stop_on_signals()
    control = None
    try:
        try:
            peer.bind()
        except zmq.ZMQError as exc:
            return usage_exit(f"--endpoint: cannot bind {args.endpoint!r}: {exc.strerror}")
        if args.control:
            from faults.control import ControlServer

            try:
                control = ControlServer(args.control, stats=peer.stats)
            except zmq.ZMQError as exc:
                return usage_exit(f"--control: cannot bind {args.control!r}: {exc.strerror}")
            control.add("set_mode", lambda m: peer.set_mode(m.get("mode", ""), m.get("reply"),
                                                            m.get("delay_ms", 0)))
            control.start()
        logger.info("fake peer ready: mode=%s delay_ms=%d preload=%d", args.mode, args.delay_ms, len(preload))
        print("READY", flush=True)
        peer.serve(stop)
        s = peer.stats()
        logger.info("fake peer stopping: received=%d replied=%d", s["received"], s["replied"])
    finally:
        if control is not None:
            control.close()
        peer.close()
        backend.close()
    return 0
