"""Node kind ``store-lookup-server``: worker rank 0's admin-channel server of vLLM's MooncakeStoreConnector.

``pdchaos node store-lookup-server --impl upstream|hardened --endpoint ipc://DIR/NAME --engine-id ID
...`` (the harness's env) replaces itself with the P/D node env's python (vLLM 0.32.0) running this
module's :func:`main` (harness/nodeenv/exec_node.py): same pid, same READY line, same control channel.

* ``--impl upstream``: vLLM's own ``LookupKeyServer(store_worker, vllm_config)``
  (``kv_connector/v1/mooncake/store/worker.py``), unmodified;
* ``--impl hardened``: ``connector_patch.store.vllm_store.HardenedStoreLookupKeyServer``, the server
  the plugin installs into ``MooncakeStoreConnector`` on rank 0;
* ``--impl patched``: vLLM's own ``LookupKeyServer`` from ``--upstream-overlay DIR`` (a copy of the
  node env's vLLM with connector_patch/upstream/vllm/0.32.0/ applied), no plugin, with the hardened
  settings as its ``kv_connector_extra_config``.

Both get a ``vllm_config`` built from vLLM's own config classes (``KVTransferConfig`` with the
engine id; ``lookup_rpc_port`` left at its default, as a user leaves it) and bind the path they
derive from it with ``VLLM_RPC_BASE_PATH`` set to the endpoint's folder: the endpoint given must be
that path (upstream: ``lookup_rpc_port_0_host_<hostname>_dp_rank0``, the same for every engine on
the host; hardened: named by the engine id).

Behind the server sits :class:`StoreWorkerModel`, a **stand-in** for ``MooncakeStoreWorker`` with
the three things the server uses: ``lookup(num_tokens, block_hashes)`` over the preloaded
:class:`MemoryBackend` (switchable at run time by ``backend_fault``: raise, hang, slow;
``clear_fails``: the remove fails), ``kv_send_thread.request_queue`` (puts a reset must drain:
``queue_puts`` adds puts that land after a delay or at ``release_puts``), the key metadata of its
token databases (one model) and ``store.remove_all(force=True)`` / ``store.remove_by_regex``
returning Mooncake's count removed, or a negative error code with nothing removed
(``clear_fails``, as a dead master makes it). Command ``close_server`` calls the
server's ``close()`` while its thread waits in ``recv``.
"""

from __future__ import annotations

import argparse
import os
import queue
import re
import socket
import sys
import threading
import time
import types
from typing import Any

IMPLS = ("upstream", "hardened", "patched")
_PATH = re.compile(r"^ipc://(?P<base>/.+)/(?P<name>[A-Za-z0-9_.-]+)$")
READY_TIMEOUT_S = 180.0  # `import torch` + vllm: 10-60 s on a busy 2-core host
MAX_PUT_DELAY_S = 600.0


def upstream_path(base: str) -> str:
    """The path vLLM 0.32.0 derives with the default ``lookup_rpc_port`` on data-parallel rank 0."""
    return f"ipc://{base}/lookup_rpc_port_0_host_{socket.gethostname()}_dp_rank0"


def hardened_path(base: str, engine_id: str) -> str:
    from connector_patch.store.protocol import engine_lookup_path

    return engine_lookup_path(base, engine_id, 0)


def patched_path(base: str, engine_id: str) -> str:
    """The path vLLM with diff 33 (connector_patch/upstream/vllm/0.32.0/33-store-lookup-per-engine-path)
    derives for an engine with the default ``lookup_rpc_port``: named by the engine id. The node and
    the workload check that the code they run derives the same."""
    import hashlib

    return f"ipc://{base}/lookup_rpc_{hashlib.sha256(engine_id.encode()).hexdigest()[:20]}_dp_rank0"


def parse_path(endpoint: str) -> str | None:
    """The endpoint's folder (VLLM_RPC_BASE_PATH), or None when it is not an ipc path."""
    m = _PATH.match(endpoint)
    return m.group("base") if m else None


# --------------------------------------------------------------------------- harness side

def add_node_arguments(p: argparse.ArgumentParser, kind: str) -> None:  # noqa: ARG001
    from .server_node import add_node_arguments as base

    base(p, "lookup-server")
    p.add_argument("--impl", required=True, choices=IMPLS, help="upstream: vLLM's LookupKeyServer; "
                                                                 "hardened: the plugin's HardenedStoreLookupKeyServer")
    p.add_argument("--engine-id", required=True, help="kv_transfer_config.engine_id of the engine it serves")
    p.add_argument("--deadline-ms", type=int, default=1000,
                   help="the client's deadline: the hardened server drains a reset's puts within half of it")
    p.add_argument("--upstream-overlay", default="", metavar="DIR",
                   help="patched: a copy of vLLM with the upstream diffs applied, put first on sys.path")


def argv_of(args: argparse.Namespace) -> list[str]:
    out = ["--impl", args.impl, "--engine-id", args.engine_id, "--deadline-ms", str(args.deadline_ms),
           "--endpoint", args.endpoint,
           "--block-size", str(args.block_size), "--groups", str(args.groups),
           "--backend-timeout-ms", str(args.backend_timeout_ms), "--log-level", args.log_level]
    if args.upstream_overlay:
        out += ["--upstream-overlay", args.upstream_overlay]
    if args.preload:
        out += ["--preload", args.preload]
    if args.control:
        out += ["--control", args.control]
    return out


def run_node(args: argparse.Namespace) -> int:
    from nodekit.nodeio import usage_exit

    if parse_path(args.endpoint) is None:
        return usage_exit("--endpoint: must be an ipc path ipc:///DIR/NAME (vLLM's store admin channel is ipc)")
    from harness.nodeenv.overlay import overlay_arg_problem

    bad = overlay_arg_problem(args.impl == "patched", args.upstream_overlay, "vllm")
    if bad:
        return usage_exit(bad)
    from harness.nodeenv.exec_node import exec_module
    from stacks.vllm_cpu.recipe import pd_node_env

    exec_module(pd_node_env().python, __name__, argv_of(args))
    return 2  # not reached


# --------------------------------------------------------------------------- node-env side

class _Puts:
    """The worker's send queue: each queued put lands in the backend after its delay, or at once
    when released. ``request_queue`` is a ``queue.Queue`` with upstream's join()/task_done()."""

    def __init__(self, memory: Any):
        self.memory = memory
        self.request_queue: queue.Queue = queue.Queue()
        self.release = threading.Event()
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="store-model-puts", daemon=True)
        self.thread.start()

    def queue_puts(self, count: int, delay_s: float) -> None:
        import random

        self.release.clear()
        for _ in range(count):  # keys nobody asks for: the puts only have to be drained
            self.request_queue.put(([random.getrandbits(256).to_bytes(32, "big").hex()], time.monotonic() + delay_s))

    def _loop(self) -> None:
        while not self.closed.is_set():
            try:
                keys, due = self.request_queue.get(timeout=0.1)
            except queue.Empty:
                continue
            try:
                self.release.wait(max(0.0, due - time.monotonic()))
                self.memory.put(keys)
            finally:
                self.request_queue.task_done()


MODEL = "stand-in-model"  # every key of the stand-in pool is this model's


class _StoreModel:
    """Mooncake's ``remove_all(force)`` and ``remove_by_regex(pattern, force)`` (every key here is
    :data:`MODEL`'s: a pattern naming it removes them all): the count removed, or -1 (nothing
    removed) when the backend's clear fails, as Mooncake's store answers when its master is gone."""

    def __init__(self, faulty: Any):
        self.faulty = faulty

    def remove_by_regex(self, pattern: str, force: bool = False) -> int:
        import re

        return self.remove_all(force) if re.match(pattern, f"{MODEL}@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@x") else 0

    def remove_all(self, force: bool = False) -> int:  # noqa: ARG002
        n = len(self.faulty.inner)
        try:
            self.faulty.clear()
        except RuntimeError:
            return -1
        return n


class StoreWorkerModel:
    """Stand-in for vLLM's ``MooncakeStoreWorker`` as ``LookupKeyServer`` uses it (module docstring).
    A raising backend raises out of ``lookup``, as a worker whose lookup raises does."""

    def __init__(self, faulty: Any):
        self.faulty = faulty
        self.kv_send_thread = _Puts(faulty.inner)
        self.store = _StoreModel(faulty)
        # the key metadata upstream's worker keeps per token database (vLLM's KeyMetadata fields)
        self.token_dbs = [types.SimpleNamespace(metadata=types.SimpleNamespace(
            model_name=MODEL, cache_prefix="", store_namespace=""))]

    def lookup(self, num_tokens: int, block_hashes: Any) -> Any:
        from connector_patch.lookup.protocol import LookupRequest
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.data import MooncakeLookupResult

        hexes = [bytes(h).hex() for h in block_hashes]
        return MooncakeLookupResult(int(self.faulty.hit_tokens(LookupRequest(int(num_tokens), (0,), 0, hexes))))


def client_settings(deadline_ms: int, backend_timeout_ms: int) -> dict[str, int]:
    """The hardened deadlines both sides are configured with: lookups and resets within the
    scenario's deadline, the worker's drain within half of it; the server's backend deadline as the
    topology sets it when it is below the client's (the connector refuses one that is not), else
    the connector's default (three quarters of the client's)."""
    out = {"lookup_rpc_timeout_ms": deadline_ms, "lookup_reset_timeout_ms": deadline_ms,
           "lookup_reset_drain_ms": max(1, deadline_ms // 2)}
    if backend_timeout_ms < deadline_ms:
        out["lookup_backend_timeout_ms"] = backend_timeout_ms
    return out


def vllm_config_for(engine_id: str, extra: dict[str, int]) -> Any:
    """A VllmConfig with the store connector's transfer config (no model: the lookup path reads
    only the parallel and transfer configs); ``extra`` is ``kv_connector_extra_config``."""
    from vllm.config import KVTransferConfig, ParallelConfig, VllmConfig

    kv = KVTransferConfig(kv_connector="MooncakeStoreConnector", kv_role="kv_both", engine_id=engine_id,
                          kv_connector_extra_config=dict(extra))
    return VllmConfig(parallel_config=ParallelConfig(), kv_transfer_config=kv)


def derived_path(impl: str, config: Any) -> str:
    if impl in ("upstream", "patched"):  # patched: the same function, as the diffs change it
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.worker import get_zmq_rpc_path_lookup

        return get_zmq_rpc_path_lookup(config)
    from connector_patch.store.vllm_store import lookup_path

    return lookup_path(config)


class StoreServerNode:
    def __init__(self, impl: str, endpoint: str, engine_id: str, faulty: Any, extra: dict[str, int]):
        self.impl, self.endpoint, self.faulty = impl, endpoint, faulty
        self.worker = StoreWorkerModel(faulty)
        self.config = vllm_config_for(engine_id, extra)
        self.server: Any = None
        self.retired: list[Any] = []  # servers closed by close_server, still referenced
        self.close_requests: list[Any] = []  # close_server asks; the main thread closes
        self.close_ms: float | None = None
        self.closed_at: float | None = None

    def make_server(self) -> Any:
        if self.impl in ("upstream", "patched"):
            from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.worker import LookupKeyServer

            return LookupKeyServer(self.worker, self.config)
        from connector_patch.store.vllm_store import HardenedStoreLookupKeyServer

        return HardenedStoreLookupKeyServer(self.worker, self.config)


def _app(node: StoreServerNode):
    from nodekit.nodeio import NodeApp

    class App(NodeApp):
        def bind(self) -> None:
            path = derived_path(node.impl, node.config)
            if path != node.endpoint:
                import zmq

                raise zmq.ZMQError(22, f"the {node.impl} server derives another path than the endpoint given")
            node.server = node.make_server()

        def serve(self, stop: threading.Event) -> None:
            while not stop.wait(0.02):
                while node.close_requests:
                    done = node.close_requests.pop(0)
                    s, node.server = node.server, None
                    t0 = time.monotonic()
                    if s is not None:
                        node.retired.append(s)  # still referenced, as by the connector that owns it
                        s.close()  # upstream's may abort this process when its thread waits in recv
                    node.closed_at = time.monotonic()
                    node.close_ms = round((node.closed_at - t0) * 1000, 3)
                    done.set()

        def stats(self) -> dict:
            s = node.server
            base = {"keys": len(node.faulty.inner), "pending_puts": node.worker.kv_send_thread.request_queue.qsize()}
            if s is None:
                return {**base, "counters": {}, "alive": False, "closed": node.closed_at is not None}
            if node.impl == "upstream":
                return {**base, "counters": {}, "alive": s.thread.is_alive()}
            if node.impl == "patched":  # diff 31's server keeps the hardened one's counters, by name
                return {**base, "counters": dict(s.counters), "alive": s.thread.is_alive()}
            thread = s.server._thread
            return {**base, "counters": s.counters, "alive": thread is not None and thread.is_alive()}

        def handlers(self) -> dict:
            def backend_fault(m: dict) -> dict:
                node.faulty.set(m.get("mode", "none"), int(m.get("delay_ms", 0)))
                return {}

            def queue_puts(m: dict) -> dict:
                count, delay_ms = m.get("count", 1), m.get("delay_ms", 0)
                if not isinstance(count, int) or not 1 <= count <= 10_000:
                    raise ValueError("queue_puts: count must be an int in [1, 10000]")
                if not isinstance(delay_ms, int) or not 0 <= delay_ms <= MAX_PUT_DELAY_S * 1000:
                    raise ValueError("queue_puts: delay_ms must be an int in [0, 600000]")
                node.worker.kv_send_thread.queue_puts(count, delay_ms / 1000.0)
                return {"queued": count}

            def release_puts(m: dict) -> dict:  # noqa: ARG001
                node.worker.kv_send_thread.release.set()
                return {}

            def close_server(m: dict) -> dict:  # noqa: ARG001
                done = threading.Event()
                node.close_requests.append(done)
                if not done.wait(5.0):
                    raise RuntimeError("close_server: the main thread did not close the server within 5 s")
                return {"closed": True, "close_ms": node.close_ms}

            def reopen_server(m: dict) -> dict:  # noqa: ARG001
                if node.server is None:
                    node.server = node.make_server()
                    node.closed_at = None
                return {"open": True}

            return {"backend_fault": backend_fault, "queue_puts": queue_puts, "release_puts": release_puts,
                    "close_server": close_server, "reopen_server": reopen_server}

        def close(self) -> None:
            node.faulty.set("none")
            node.worker.kv_send_thread.release.set()
            node.worker.kv_send_thread.closed.set()
            s, node.server = node.server, None
            if s is not None and node.impl in ("hardened", "patched"):  # patched: diff 31's close() is safe
                s.close()
            # upstream's close() may abort the process when its thread waits in recv: at a normal
            # stop the node leaves it to process exit (vLLM's shutdown does not call it either)
            node.faulty.close()

        def ready_message(self) -> str:
            return f"{node.impl} store lookup server of vLLM serving"

    return App()


def main(argv: list[str] | None = None) -> int:
    from nodekit.nodeio import NodeUsageError, run_node as run_node_process

    p = argparse.ArgumentParser(prog="pdchaos node store-lookup-server")
    add_node_arguments(p, "store-lookup-server")
    args = p.parse_args(argv)
    if args.upstream_overlay:  # patched: vLLM with the diffs, before anything imports vllm
        sys.path.insert(0, args.upstream_overlay)
    base = parse_path(args.endpoint)
    if base is not None:
        os.environ["VLLM_RPC_BASE_PATH"] = base

    def build():
        from connector_patch.lookup import MemoryBackend

        from .server_node import FaultyBackend, read_preload

        if args.block_size <= 0:
            raise NodeUsageError("--block-size: must be a positive integer")
        for name in ("backend_timeout_ms", "deadline_ms"):
            if getattr(args, name) <= 0:
                raise NodeUsageError(f"--{name.replace('_', '-')}: must be a positive integer")
        if base is None:
            raise NodeUsageError("--endpoint: must be an ipc path ipc:///DIR/NAME")
        memory = MemoryBackend(block_size=args.block_size, groups=1)
        memory.put(read_preload(args.preload) if args.preload else [])
        node = StoreServerNode(args.impl, args.endpoint, args.engine_id, FaultyBackend(memory),
                               client_settings(args.deadline_ms, args.backend_timeout_ms))
        return _app(node)

    return run_node_process(build, endpoints={"--endpoint": args.endpoint}, bind_flag="--endpoint",
                            control=args.control, log_level=args.log_level)


if __name__ == "__main__":
    from nodekit.nodeio import exit_now

    exit_now(main())

