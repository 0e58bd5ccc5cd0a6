"""Node ``fake-peer``: a lookup server that misbehaves on purpose.

``pdchaos node fake-peer --endpoint EP --mode MODE [...]`` binds on EP where the real server
would, and answers the lookup RPC wrongly, one way per mode:

``slow``       the correct v1 answer (computed from a MemoryBackend holding ``--preload``), sent
               ``--delay-ms`` after the request arrived; a bad request gets the v1 error envelope
               and the admin ``reset`` clears the keys and answers ok, as the real server does.
``silent``     receives every request and never answers.
``malformed``  answers every request with one broken reply, ``--reply KIND`` (wire.REPLY_KINDS).
``legacy``     today's upstream reply: one raw 4-byte u32 big-endian frame holding the correct hit.

With ``--dialect store`` it speaks vLLM's store admin channel instead (tagged requests):
``slow`` answers as the hardened server does (v1 store envelopes), ``legacy`` as vLLM 0.32.0's
(a raw 4-byte hit; ``b"\\x01"`` for a reset); ``malformed`` is AscendStore's only.

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

The broken replies themselves are in ``wire.py`` (shared with the interposer, whose codec it
is); the node's life (checks, bind, control channel, READY, stop) is ``nodekit.nodeio.run_node``.
Bad input is reported the way the CLI does (one ``error:`` line on stderr, exit 2).

Logs carry counts, modes and codes only: never a hash, a key or a frame.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import math
import threading
import time

import zmq

from connector_patch.lookup import MemoryBackend
from connector_patch.lookup.protocol import (
    RESET_FRAME,
    Limits,
    ProtocolError,
    decode_request,
    encode_error,
    encode_ok,
)

from nodekit.nodeio import NodeApp, NodeUsageError, read_hashes, run_node as run_node_process, split_envelope, unlink_ipc

from .wire import REPLY_KINDS, legacy_reply, malformed_reply, request_token_len

MODES = ("slow", "silent", "malformed", "legacy")
DIALECTS = ("ascend", "store")

_POLL_MS = 50


# --------------------------------------------------------------------------- the peer


class FakePeer(NodeApp):
    """The misbehaving server. ``bind()`` then ``serve(stop_event)`` on one thread; ``set_mode``
    and ``stats`` are safe from another thread (the control channel's). ``close()`` also closes
    the backend it was given."""

    def __init__(self, endpoint: str, mode: str, *, backend: MemoryBackend, delay_ms: int = 0,
                 reply: str | None = None, dialect: str = "ascend"):
        self.endpoint = endpoint
        self.dialect = dialect
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
        self.preloaded = 0  # keys the backend was loaded with (logged at start: a count, never a key)

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

    def _answer_store(self, body: list[bytes], mode: str) -> list[bytes]:
        """vLLM's store channel: ``slow`` answers as the hardened server does (v1 envelopes),
        ``legacy`` as upstream's (a raw 4-byte hit, one status byte for a reset)."""
        from connector_patch.lookup.protocol import LookupRequest
        from connector_patch.store import protocol as store

        if store.is_reset(body):
            self.backend.clear()
            return [store.encode_reset_ok() if mode == "slow" else b"\x01"]
        try:
            request = store.decode_request(body, self.limits)
            hit = self.backend.hit_tokens(LookupRequest(request.token_len, (0,), 0, [h.hex() for h in request.hashes]))
        except store.ProtocolError as exc:
            self.bad_requests += 1
            if mode == "slow":
                return [store.encode_error(exc.code, exc.message)]
            hit = 0
        return [store.encode_ok(store.StoreResult(hit))] if mode == "slow" else [hit.to_bytes(4, "big")]

    def _answer(self, body: list[bytes], mode: str, reply: str | None) -> list[bytes]:
        if self.dialect == "store":
            return self._answer_store(body, mode)
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
        self.backend.close()

    def handlers(self) -> dict:
        return {"set_mode": lambda m: self.set_mode(m.get("mode", ""), m.get("reply"), m.get("delay_ms", 0))}

    def ready_message(self) -> str:
        return (f"fake peer ready: mode={self.mode} delay_ms={round(self.delay_s * 1000)} "
                f"preload={self.preloaded}")

    def stop_message(self) -> str:
        s = self.stats()
        return f"fake peer stopping: received={s['received']} replied={s['replied']}"


# --------------------------------------------------------------------------- node


def add_node_arguments(p: argparse.ArgumentParser, kind: str) -> None:  # noqa: ARG001
    p.add_argument("--endpoint", required=True, help="ipc:///path or tcp://127.0.0.1:PORT to bind")
    p.add_argument("--mode", required=True, choices=MODES, help="how to misbehave")
    p.add_argument("--delay-ms", type=int, default=0, help="answer this long after the request (default 0)")
    p.add_argument("--reply", choices=tuple(REPLY_KINDS), help="mode malformed: which broken reply")
    p.add_argument("--preload", help="file with one block-hash hex per line, present in every group")
    p.add_argument("--block-size", type=int, default=16, help="tokens per block (default 16)")
    p.add_argument("--groups", type=int, default=1, help="KV cache groups (default 1)")
    p.add_argument("--dialect", choices=DIALECTS, default="ascend",
                   help="ascend: AscendStore's lookup RPC (default); store: vLLM's store admin channel")
    p.add_argument("--control", help="ipc endpoint of the harness control channel")
    p.add_argument("--log-level", default="INFO")


def run_node(args: argparse.Namespace) -> int:
    def build() -> FakePeer:
        for name in ("block_size", "groups"):
            if getattr(args, name) <= 0:
                raise NodeUsageError(f"--{name.replace('_', '-')}: must be a positive integer")
        if args.dialect == "store" and args.mode == "malformed":
            raise NodeUsageError("--mode malformed: AscendStore's broken replies only (not with --dialect store)")
        if args.mode == "malformed" and not args.reply:
            raise NodeUsageError("--reply: required with --mode malformed")
        if args.mode != "malformed" and args.reply:
            raise NodeUsageError(f"--reply: only used with --mode malformed, not {args.mode}")
        if not 0 <= args.delay_ms <= 3_600_000:
            raise NodeUsageError("--delay-ms: must be in [0, 3600000]")
        preload = read_hashes(args.preload) if args.preload else []
        backend = MemoryBackend(block_size=args.block_size, groups=args.groups)
        backend.put(preload)
        peer = FakePeer(args.endpoint, args.mode, backend=backend, delay_ms=args.delay_ms, reply=args.reply,
                        dialect=args.dialect)
        peer.preloaded = len(preload)
        return peer

    return run_node_process(build, endpoints={"--endpoint": args.endpoint}, bind_flag="--endpoint",
                            control=args.control, log_level=args.log_level)
