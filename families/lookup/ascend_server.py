"""Node kind ``ascend-lookup-server``: worker rank 0's lookup server from real vllm-ascend code.

``pdchaos node ascend-lookup-server --impl upstream|hardened --endpoint ipc://DIR/lookup_rpc_port_N_dp_rank0
...`` (the harness's env) replaces itself with the conformance env's python running this module's
:func:`main` (harness/nodeenv/exec_node.py): same pid, same READY line, same control channel.

* ``--impl upstream``: vllm-ascend 0.23.0.post1's own ``LookupKeyServer(pool_worker, vllm_config)``
  (``kv_pool/ascend_store/ascend_store_connector.py``), unmodified.
* ``--impl hardened``: ``connector_patch.lookup.ascend_store.HardenedLookupKeyServer``, the server the
  plugin installs into ``AscendStoreConnector`` on rank 0.
* ``--impl patched``: vllm-ascend's own ``LookupKeyServer`` from ``--upstream-overlay DIR`` (a copy of
  the conformance env's vllm_ascend with connector_patch/upstream/vllm-ascend/ applied, put first on
  sys.path; no plugin): diffs 10-13 give it the v1 protocol, the backend deadline, the socket rebuild,
  a bounded close and the admin reset. Its settings come the way upstream's do, from
  ``kv_connector_extra_config`` (``lookup_rpc_timeout_ms`` = ``--deadline-ms``,
  ``lookup_backend_timeout_ms`` = ``--backend-timeout-ms``).

Both get the same ``vllm_config`` (vLLM's real ``ParallelConfig`` and ``KVTransferConfig`` with
``lookup_rpc_port``) and bind the path vllm-ascend derives from it (``get_zmq_rpc_path_lookup``,
with ``VLLM_RPC_BASE_PATH`` set to the endpoint's folder): the endpoint given must be that path.
Behind ``lookup_scheduler`` sits :class:`PoolWorkerModel`, a stand-in for vllm-ascend's
``KVPoolWorker`` (which needs an NPU and a Mooncake store): upstream's ``lookup_scheduler`` contract (a
backend exception is a miss, as upstream's own catches it, or raised with the patched release's
``raise_on_error``) over the preloaded :class:`MemoryBackend`, switchable at run time by ``backend_fault`` like every lookup
server node. Command ``close_server``: calls the server's ``close()`` while its thread waits in
``recv`` (upstream's aborts the process: a ZMQ assertion, exit 134).
"""

from __future__ import annotations

import argparse
import os
import re
import threading
import time
from typing import Any

IMPLS = ("upstream", "hardened", "patched")
MODEL_NAME = "pdchaos-tiny"  # the stand-in pool's keys are "<model>@...", as a Mooncake store's are
_PATH = re.compile(r"^ipc://(?P<base>/.+)/lookup_rpc_port_(?P<port>[0-9]+)_dp_rank0$")
READY_TIMEOUT_S = 180.0  # `import torch` + vllm + vllm_ascend: 10-60 s on a busy 2-core host


def lookup_path(base: str, port: int) -> str:
    """The endpoint vllm-ascend derives for data-parallel rank 0 (``get_zmq_rpc_path_lookup``)."""
    return f"ipc://{base}/lookup_rpc_port_{port}_dp_rank0"


def parse_path(endpoint: str) -> tuple[str, int] | None:
    m = _PATH.match(endpoint)
    return (m.group("base"), int(m.group("port"))) if m else None


# --------------------------------------------------------------------------- harness side

def add_node_arguments(p: argparse.ArgumentParser, kind: str) -> None:  # noqa: ARG001
    from .server_node import add_node_arguments as base

    base(p, "lookup-server")
    p.add_argument("--impl", required=True, choices=IMPLS, help="upstream: vllm-ascend's LookupKeyServer; "
                                                                 "hardened: the plugin's HardenedLookupKeyServer; "
                                                                 "patched: upstream's with the diffs (--upstream-overlay)")
    p.add_argument("--deadline-ms", type=int, default=1000,
                   help="patched: the client's deadline (lookup_rpc_timeout_ms), which bounds the backend's")
    p.add_argument("--upstream-overlay", default="", metavar="DIR",
                   help="patched: a copy of vllm-ascend with the upstream diffs applied, put first on sys.path "
                        "(harness/nodeenv/overlay.py)")


def argv_of(args: argparse.Namespace) -> list[str]:
    out = ["--impl", args.impl, "--endpoint", args.endpoint, "--block-size", str(args.block_size),
           "--groups", str(args.groups), "--backend-timeout-ms", str(args.backend_timeout_ms),
           "--log-level", args.log_level]
    if args.preload:
        out += ["--preload", args.preload]
    if args.impl == "patched":
        out += ["--deadline-ms", str(args.deadline_ms), "--upstream-overlay", args.upstream_overlay]
    if args.control:
        out += ["--control", args.control]
    return out


def run_node(args: argparse.Namespace) -> int:
    from nodekit.nodeio import usage_exit

    if parse_path(args.endpoint) is None:
        return usage_exit("--endpoint: must be vllm-ascend's lookup path ipc://DIR/lookup_rpc_port_N_dp_rank0")
    from harness.nodeenv.overlay import overlay_arg_problem

    bad = overlay_arg_problem(args.impl == "patched", args.upstream_overlay, "vllm_ascend")
    if bad:
        return usage_exit(bad)
    from stacks.ascend_cpu.recipe import ascend_conf_env
    from harness.nodeenv.exec_node import exec_module

    exec_module(ascend_conf_env().python, __name__, argv_of(args))
    return 2  # not reached


# --------------------------------------------------------------------------- conformance-env side

class _PoolStoreModel:
    """The stand-in's ``m_store.store``: the one call the patched release's admin reset makes,
    ``remove_by_regex(pattern, force)`` (Mooncake's store: the number of keys removed). Every key of
    the stand-in's pool is ``<MODEL_NAME>@<hash>``: a pattern that matches that name removes them all
    (through the backend's ``clear``, so a ``clear_fails`` backend fault raises, nothing removed)."""

    def __init__(self, faulty: Any):
        self.faulty = faulty

    def remove_by_regex(self, pattern: str, force: bool = False) -> int:  # noqa: ARG002
        if re.match(pattern, f"{MODEL_NAME}@") is None:
            return 0
        n = len(self.faulty.inner)
        self.faulty.clear()
        return n


class PoolWorkerModel:
    """A stand-in for vllm-ascend's ``KVPoolWorker`` on rank 0 (the real one needs an NPU and a
    Mooncake store), with what the lookup servers read of it:

    * ``lookup_scheduler(token_len, hashes, group_ids, use_layerwise, hbm_hit_tokens,
      raise_on_error=False) -> int``: a backend exception is a miss (0), as in upstream's own
      ``KVPoolWorker.lookup_scheduler``, or raised when ``raise_on_error`` (the patched release's
      server asks for it, to answer BACKEND_ERROR); a hung backend hangs it;
    * ``kv_cache_config.kv_cache_groups``: one per group (the patched server's group limit);
    * ``kv_send_thread.request_queue``: the backend's queue of pending stores (what the admin reset
      drains); ``model_name``, ``tp_size``/``pp_size``/``pcp_size`` (1: one rank stores) and
      ``m_store.store.remove_by_regex`` (what the patched release's reset calls);
    * ``clear_pool()``: the hardened server's reset hook."""

    def __init__(self, faulty: Any, groups: int = 1):
        import types

        self.faulty = faulty
        self.kv_send_thread = types.SimpleNamespace(request_queue=faulty.inner._pending)
        self.kv_cache_config = types.SimpleNamespace(kv_cache_groups=[None] * groups)
        self.model_name = MODEL_NAME
        self.tp_size = self.pp_size = self.pcp_size = 1
        self.m_store = types.SimpleNamespace(store=_PoolStoreModel(faulty))

    def lookup_scheduler(self, token_len: int, block_hashes: list, kv_cache_group_ids: list[int] | None = None,
                         use_layerwise: bool = False, hbm_hit_tokens: int = 0,  # noqa: ARG002
                         raise_on_error: bool = False) -> int:
        from connector_patch.lookup.protocol import LookupRequest

        req = LookupRequest(int(token_len), tuple(kv_cache_group_ids or [0]), int(hbm_hit_tokens),
                            [str(h) for h in block_hashes])
        try:
            return int(self.faulty.hit_tokens(req))
        except Exception:
            if raise_on_error:
                raise
            return 0

    def clear_pool(self) -> None:
        self.faulty.clear()


def vllm_config_for(port: int, extra: dict | None = None) -> Any:
    """The part of a VllmConfig that vllm-ascend's lookup path reads, from vLLM's own config classes;
    ``extra``: more of ``kv_connector_extra_config`` (the patched release's lookup settings)."""
    from vllm.config import KVTransferConfig, ParallelConfig

    kv = KVTransferConfig(kv_connector="AscendStoreConnector", kv_role="kv_both",
                          kv_connector_extra_config={"lookup_rpc_port": port, "backend": "mooncake", **(extra or {})})
    try:
        from vllm.config import VllmConfig

        return VllmConfig(parallel_config=ParallelConfig(), kv_transfer_config=kv)
    except Exception:  # a VllmConfig that insists on a model: the two parts the path needs
        import types

        return types.SimpleNamespace(parallel_config=ParallelConfig(), kv_transfer_config=kv)


def patched_settings(deadline_ms: int, backend_timeout_ms: int) -> dict:
    """The patched release's lookup settings, as a deployment would write them."""
    return {"lookup_rpc_timeout_ms": int(deadline_ms), "lookup_backend_timeout_ms": int(backend_timeout_ms)}


def import_stack() -> None:
    import pdchaos_npu_stubs  # the conformance env's NPU stubs (stacks/ascend_cpu/pdchaos_npu_stubs)

    pdchaos_npu_stubs.install()
    import vllm_ascend  # noqa: F401

    pdchaos_npu_stubs.after_vllm_ascend()


class AscendServerNode:
    def __init__(self, impl: str, endpoint: str, faulty: Any, groups: int, backend_timeout_ms: int,
                 deadline_ms: int = 1000):
        self.impl, self.endpoint, self.faulty = impl, endpoint, faulty
        self.groups, self.backend_timeout_ms = groups, backend_timeout_ms
        self.worker = PoolWorkerModel(faulty, groups)
        base, port = parse_path(endpoint)  # type: ignore[misc]
        self.config = vllm_config_for(port, patched_settings(deadline_ms, backend_timeout_ms)
                                      if impl == "patched" else None)
        self.server: Any = None
        self.retired: list[Any] = []  # servers closed by close_server, still referenced
        self.close_requests: list[Any] = []  # close_server asks; the main thread closes
        self.close_ms: float | None = None
        self.closed_at: float | None = None

    def make_server(self) -> Any:
        if self.impl in ("upstream", "patched"):  # patched: the same class, as the diffs change it
            from vllm_ascend.distributed.kv_transfer.kv_pool.ascend_store.ascend_store_connector import (
                LookupKeyServer)

            return LookupKeyServer(self.worker, self.config)
        from connector_patch.lookup.ascend_store import HardenedLookupKeyServer

        return HardenedLookupKeyServer(self.worker, self.config, groups=self.groups,
                                       backend_timeout_ms=self.backend_timeout_ms)


def _app(node: AscendServerNode):
    from nodekit.nodeio import NodeApp

    class App(NodeApp):
        def bind(self) -> None:
            from vllm_ascend.distributed.kv_transfer.kv_pool.ascend_store.pool_scheduler import (
                get_zmq_rpc_path_lookup)

            path = get_zmq_rpc_path_lookup(node.config)
            if path != node.endpoint:
                import zmq

                raise zmq.ZMQError(22, f"vllm-ascend derives {path}, not the endpoint given")
            node.server = node.make_server()

        def serve(self, stop: threading.Event) -> None:
            while not stop.wait(0.02):
                while node.close_requests:
                    done = node.close_requests.pop(0)
                    s, node.server = node.server, None
                    t0 = time.monotonic()
                    if s is not None:
                        node.retired.append(s)  # still referenced, as by the connector that owns it
                        s.close()  # upstream's aborts this process when its thread waits in recv
                    node.closed_at = time.monotonic()
                    node.close_ms = round((node.closed_at - t0) * 1000, 3)
                    done.set()

        def stats(self) -> dict:
            s = node.server
            if s is None:
                return {"counters": {}, "alive": False, "closed": node.closed_at is not None}
            if node.impl == "upstream":
                return {"counters": {}, "alive": s.thread.is_alive()}
            return {"counters": s.counters, "alive": s.alive}  # patched: diff 12 keeps both, by name

        def handlers(self) -> dict:
            def backend_fault(m: dict) -> dict:
                node.faulty.set(m.get("mode", "none"), int(m.get("delay_ms", 0)))
                return {}

            def close_server(m: dict) -> dict:  # noqa: ARG001
                # closed by the main thread (serve), as an engine shutting down closes it
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

            return {"backend_fault": backend_fault, "close_server": close_server, "reopen_server": reopen_server}

        def close(self) -> None:
            node.faulty.set("none")
            s, node.server = node.server, None
            if s is not None and node.impl in ("hardened", "patched"):  # patched: diff 12's close() is bounded
                s.close()
            # upstream's close() aborts the process when its thread waits in recv: at a normal
            # stop the node leaves it to process exit (as vLLM does: nothing upstream calls it)
            node.faulty.close()

        def ready_message(self) -> str:
            return f"{node.impl} lookup server of vllm-ascend serving, {node.groups} group(s)"

    return App()


def main(argv: list[str] | None = None) -> int:
    from nodekit.nodeio import NodeUsageError, run_node as run_node_process

    p = argparse.ArgumentParser(prog="pdchaos node ascend-lookup-server")
    add_node_arguments(p, "ascend-lookup-server")
    args = p.parse_args(argv)
    parsed = parse_path(args.endpoint)
    if parsed is not None:
        os.environ["VLLM_RPC_BASE_PATH"] = parsed[0]
    if args.upstream_overlay:  # patched: upstream's code with the diffs, before anything imports vllm_ascend
        import sys

        sys.path.insert(0, args.upstream_overlay)

    def build():
        from connector_patch.lookup import MemoryBackend

        from .server_node import FaultyBackend, read_preload

        for name in ("block_size", "groups", "deadline_ms"):
            if getattr(args, name) <= 0:
                raise NodeUsageError(f"--{name.replace('_', '-')}: must be a positive integer")
        if args.impl == "patched" and args.backend_timeout_ms >= args.deadline_ms:
            raise NodeUsageError(f"--backend-timeout-ms ({args.backend_timeout_ms}): the patched release needs it "
                                 f"below --deadline-ms ({args.deadline_ms}) (lookup_backend_timeout_ms < "
                                 f"lookup_rpc_timeout_ms)")
        if parsed is None:
            raise NodeUsageError("--endpoint: must be vllm-ascend's lookup path ipc://DIR/lookup_rpc_port_N_dp_rank0")
        import_stack()
        memory = MemoryBackend(block_size=args.block_size, groups=args.groups)
        memory.put(read_preload(args.preload) if args.preload else [])
        node = AscendServerNode(args.impl, args.endpoint, FaultyBackend(memory), args.groups, args.backend_timeout_ms,
                                args.deadline_ms)
        return _app(node)

    return run_node_process(build, endpoints={"--endpoint": args.endpoint}, bind_flag="--endpoint",
                            control=args.control, log_level=args.log_level)


if __name__ == "__main__":
    from nodekit.nodeio import exit_now

    exit_now(main())
