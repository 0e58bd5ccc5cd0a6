"""Nodes ``lookup-server`` (hardened) and ``legacy-server`` (today's upstream model).

Both hold a MemoryBackend, optionally preloaded (one block-hash hex per line, present in every
group). With ``--control`` the backend can be made to fail at run time (``backend_fault``), which
is how the runner injects backend faults into a real server process. The node's life (checks,
bind, control channel, READY, stop) is ``nodekit.nodeio.run_node``.
"""

from __future__ import annotations

import argparse
import threading
import time

from connector_patch.lookup.legacy import LegacyLookupServer
from connector_patch.lookup import LookupServer, MemoryBackend
from connector_patch.lookup.backend import Backend
from connector_patch.lookup.protocol import LookupRequest

from nodekit.nodeio import NodeApp, NodeUsageError, read_hashes, run_node as run_node_process


def read_preload(path: str, what: str = "--preload") -> list[str]:
    """One hex block hash per line; blank lines and '#' comments are skipped."""
    return read_hashes(path, what)


MODES = ("none", "raise", "hang", "slow", "clear_fails")


class FaultyBackend(Backend):
    """Wraps a backend; ``mode`` none | raise | hang | slow (its lookups) or clear_fails (its
    clear, the admin reset's remove: an error, nothing removed), switched at run time."""

    def __init__(self, inner: MemoryBackend):
        self.inner = inner
        self.groups = inner.groups
        self.mode = "none"
        self.delay_s = 0.0
        self._release = threading.Event()

    def set(self, mode: str, delay_ms: int = 0) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown backend fault mode {mode!r}")
        self.mode, self.delay_s = mode, delay_ms / 1000.0
        if mode == "hang":
            self._release.clear()
        else:
            self._release.set()  # heal: a hung call returns now

    def hit_tokens(self, request: LookupRequest) -> int:
        mode = self.mode
        if mode == "raise":
            raise RuntimeError("injected backend failure")
        if mode == "hang":
            self._release.wait(600.0)
        elif mode == "slow":
            time.sleep(self.delay_s)
        return self.inner.hit_tokens(request)

    def drain(self, timeout_s: float) -> bool:
        return self.inner.drain(timeout_s)

    def clear(self) -> None:
        if self.mode == "clear_fails":
            raise RuntimeError("injected clear failure")
        self.inner.clear()

    def close(self) -> None:
        self._release.set()
        self.inner.close()


def add_node_arguments(p: argparse.ArgumentParser, kind: str) -> None:
    p.add_argument("--endpoint", required=True, help="ipc:///path or tcp://127.0.0.1:PORT to bind")
    p.add_argument("--backend", default="memory", choices=["memory"], help="storage backend (default: memory)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per block (default 16)")
    p.add_argument("--groups", type=int, default=1, help="KV cache groups (default 1)")
    p.add_argument("--preload", help="file with one block-hash hex per line, present in every group")
    p.add_argument("--control", help="ipc endpoint of the harness control channel")
    p.add_argument("--log-level", default="INFO")
    if kind == "lookup-server":
        p.add_argument("--backend-timeout-ms", type=int, default=4000)


class ServerNode(NodeApp):
    """A lookup server (hardened or the legacy model) over a FaultyBackend, as one node."""

    def __init__(self, kind: str, endpoint: str, memory: MemoryBackend, *, groups: int, backend_timeout_ms: int):
        self.backend = FaultyBackend(memory)
        if kind == "lookup-server":
            self.server: LookupServer | LegacyLookupServer = LookupServer(
                endpoint, self.backend, groups=groups, backend_timeout_ms=backend_timeout_ms)
        else:
            self.server = LegacyLookupServer(endpoint, self.backend)

    def bind(self) -> None:
        self.server.start()  # binds (zmq.ZMQError when it cannot), then serves on its own thread

    def stats(self) -> dict:
        server = self.server
        if isinstance(server, LookupServer):
            return {"counters": server.counters, "alive": server._thread is not None and server._thread.is_alive()}
        return {"counters": {}, "alive": server.alive}

    def handlers(self) -> dict:
        backend = self.backend
        return {"backend_fault": lambda m: backend.set(m.get("mode", "none"), int(m.get("delay_ms", 0))) or {}}

    def close(self) -> None:
        self.backend.set("none")  # a hung backend call returns now, so the server closes at once
        self.server.close()
        self.backend.close()


def run_node(args: argparse.Namespace) -> int:
    def build() -> ServerNode:
        for name in ("block_size", "groups"):
            if getattr(args, name) <= 0:
                raise NodeUsageError(f"--{name.replace('_', '-')}: must be a positive integer")
        timeout_ms = getattr(args, "backend_timeout_ms", 4000)
        if timeout_ms <= 0:
            raise NodeUsageError("--backend-timeout-ms: must be a positive integer")
        preload = read_preload(args.preload) if args.preload else []
        memory = MemoryBackend(block_size=args.block_size, groups=args.groups)
        memory.put(preload)
        return ServerNode(args.kind, args.endpoint, memory, groups=args.groups, backend_timeout_ms=timeout_ms)

    return run_node_process(build, endpoints={"--endpoint": args.endpoint}, bind_flag="--endpoint",
                            control=args.control, log_level=args.log_level)
