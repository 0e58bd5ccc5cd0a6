"""A model of today's upstream lookup RPC: the "before" in every comparison.

Models vllm-ascend main at commit 182b75ea (2026-08-22; same lookup code as the PyPI release
0.23.0.post1), ``ascend_store/pool_scheduler.py`` ``LookupKeyClient`` and
``ascend_store_connector.py`` ``LookupKeyServer`` (both under
``vllm_ascend/distributed/kv_transfer/kv_pool/ascend_store/``), read at that commit:

- reply: one frame, the hit count as u32 big-endian; a backend exception is folded into 0;
- client: REQ, created lazily, no SNDTIMEO/RCVTIMEO/poller: ``recv`` blocks forever;
- server: REP, one daemon thread, strictly serial, no per-request exception boundary: a wrong
  frame count, a msgpack error or a ``to_bytes`` overflow ends the thread, after which every lookup
  hangs;
- a REQ socket left mid-exchange raises on the next call (EFSM) and is never rebuilt.

This is deliberately faithful, bugs included. It is written from those facts, not copied.
"""

from __future__ import annotations

import logging
import threading
from typing import Sequence

import msgpack
import zmq

from .backend import Backend
from .protocol import LookupRequest

UPSTREAM_COMMIT = "182b75ea"
logger = logging.getLogger("connector_patch.lookup.legacy")


class LegacyLookupClient:
    def __init__(self, endpoint: str, context: zmq.Context | None = None):
        self.endpoint = endpoint
        self._ctx = context or zmq.Context()
        self._own_ctx = context is None
        self._sock: zmq.Socket | None = None

    def lookup(self, token_len: int, block_hashes: Sequence[bytes],
               kv_cache_group_ids: Sequence[int] = (0,), hbm_hit_tokens: int = 0) -> int:
        if self._sock is None:
            self._sock = self._ctx.socket(zmq.REQ)
            self._sock.connect(self.endpoint)
        frames = [
            token_len.to_bytes(4, "big"),
            msgpack.packb(list(kv_cache_group_ids)),
            hbm_hit_tokens.to_bytes(4, "big"),
            msgpack.packb([h.hex() for h in block_hashes]),
        ]
        self._sock.send_multipart(frames, copy=False)
        resp = self._sock.recv()  # no timeout: blocks forever on a silent or dead server
        return int.from_bytes(resp, "big")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        if self._own_ctx:
            self._ctx.term()
            self._own_ctx = False


class LegacyLookupServer:
    def __init__(self, endpoint: str, backend: Backend, context: zmq.Context | None = None):
        self.endpoint = endpoint
        self.backend = backend
        self._ctx = context or zmq.Context()
        self._own_ctx = context is None
        self._sock = self._ctx.socket(zmq.REP)
        self.running = True
        self.thread = threading.Thread(target=self._serve, name="legacy-lookup-server", daemon=True)

    def start(self) -> "LegacyLookupServer":
        self._sock.bind(self.endpoint)
        self.thread.start()
        return self

    def _lookup_scheduler(self, token_len: int, hashes: list, group_ids: list, hbm_hit_tokens: int) -> int:
        try:
            return self.backend.hit_tokens(LookupRequest(token_len, tuple(group_ids), hbm_hit_tokens, tuple(hashes)))
        except Exception:  # upstream folds every backend failure into a miss
            return 0

    def _serve(self) -> None:
        try:
            while self.running:
                frames = self._sock.recv_multipart(copy=False)
                token_len = int.from_bytes(frames[0].bytes, "big")
                group_ids = msgpack.unpackb(frames[1].bytes)
                hbm_hit_tokens = int.from_bytes(frames[2].bytes, "big")
                hashes = msgpack.unpackb(frames[3].bytes)
                hit = self._lookup_scheduler(token_len, hashes, group_ids, hbm_hit_tokens)
                self._sock.send(hit.to_bytes(4, "big"))
        except zmq.ContextTerminated:  # close(): this thread owns the socket, so it closes it
            self._sock.close(linger=0)
            return
        except Exception as exc:  # upstream has no handler: the thread dies here, socket left bound
            logger.error("legacy lookup server thread died: %s", type(exc).__name__)

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    def close(self) -> None:
        """Not upstream (nothing calls close there); the harness needs to stop the model.

        A zmq socket must only be closed by the thread using it (``Context.destroy`` from here,
        while the serving thread is blocked in recv, crashes libzmq: signaler.cpp assertion). So:
        ``term()`` runs on a helper thread and wakes the serving thread with ETERM, which closes
        its own socket; a socket left behind by a serving thread that already died (or never
        started) is closed here, once that thread is known to be gone."""
        self.running = False
        if not self._own_ctx:
            return
        self._own_ctx = False
        terminator = threading.Thread(target=self._ctx.term, name="legacy-lookup-term", daemon=True)
        terminator.start()
        if self.thread.ident is not None:
            self.thread.join(2.0)
        if not self.thread.is_alive() and not self._sock.closed:
            self._sock.close(linger=0)
        terminator.join(2.0)
