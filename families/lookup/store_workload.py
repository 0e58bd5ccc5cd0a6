"""Node kind ``store-workload``: the lookup workload with vLLM's real store-connector client.

``pdchaos node store-workload --config F --journal J`` (the harness's env) replaces itself with the
P/D node env's python (vLLM 0.32.0) running this module (harness/nodeenv/exec_node.py); the
workload is the family's own (families/lookup/workload.py: generator, pacing, journal), with the
client of the target, called as the store scheduler calls it (``lookup(req_id, num_tokens,
block_hashes)``, blocking: ``lookup_async`` is off by default; the answer's ``hit_length`` is the
op's value) and ``reset()`` as ``MooncakeStoreConnector.reset_cache`` calls it:

* ``upstream``: vLLM 0.32.0's ``LookupKeyClient(vllm_config)`` (``mooncake/store/worker.py``),
  unmodified: no deadline, one executor thread, a raw reply;
* ``hardened``: ``connector_patch.store.vllm_store.HardenedStoreLookupKeyClient``, the client the
  plugin installs into ``MooncakeStoreScheduler``, with the scenario's deadline as
  ``lookup_rpc_timeout_ms`` and ``lookup_reset_timeout_ms``;
* ``patched``: vLLM's own ``LookupKeyClient`` from the config's ``upstream_overlay`` (vLLM with
  connector_patch/upstream/vllm/0.32.0/ applied), with the same settings, no plugin.

Both connect to the path they derive from the config (``VLLM_RPC_BASE_PATH`` = the endpoint's
folder), which must be the endpoint the topology gives.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

READY_TIMEOUT_S = 180.0
CLOSE_JOIN_S = 5.0  # an idle executor thread ends in milliseconds


def add_node_arguments(p: argparse.ArgumentParser, kind: str) -> None:  # noqa: ARG001
    from nodekit.workload import add_workload_arguments

    add_workload_arguments(p)


def run_node(args: argparse.Namespace) -> int:
    from harness.nodeenv.exec_node import exec_module
    from stacks.vllm_cpu.recipe import pd_node_env

    exec_module(pd_node_env().python, __name__,
                ["--config", args.config, "--journal", args.journal, "--log-level", args.log_level])
    return 2  # not reached


class _Client:
    """A store client as the workload calls it: ``lookup(token_len, hashes, groups, hbm) -> hit``
    (groups and hbm are the AscendStore workload's: the store connector has neither) and
    ``reset() -> bool``. For the hardened client, ``last_outcome``/``last_code``/``counters`` are
    those of the call it made last (lookups and resets have their own sockets)."""

    def __init__(self, target: str, config: Any):
        self.target = target
        self._ids = iter(range(1, 1 << 62))
        if target in ("upstream", "patched"):
            from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.worker import LookupKeyClient

            self.client = LookupKeyClient(config)
        else:
            from connector_patch.store.vllm_store import HardenedStoreLookupKeyClient

            self.client = HardenedStoreLookupKeyClient(config)
        self._last: Any = None

    def lookup(self, token_len: int, block_hashes: Any, kv_cache_group_ids: Any = (0,),
               hbm_hit_tokens: int = 0) -> int:  # noqa: ARG002
        if self.target == "hardened":
            self._last = self.client.client
        elif self.target == "patched":  # diff 30: a channel per call kind, with the hardened outcome names
            self._last = self.client._lookup_rpc
        result = self.client.lookup(f"op-{next(self._ids)}", token_len, list(block_hashes))
        return int(result.hit_length)

    def reset(self) -> bool:
        if self.target == "hardened":
            self._last = self.client._admin
        elif self.target == "patched":
            self._last = self.client._admin_rpc
        return bool(self.client.reset())

    @property
    def last_outcome(self) -> str:
        return self._last.last_outcome if self._last is not None else "ok"

    @property
    def last_code(self) -> str:
        return self._last.last_code if self._last is not None else ""

    @property
    def counters(self) -> dict[str, int]:
        if self.target == "patched":
            return dict(self.client.counters)
        if self.target != "hardened":
            return {}
        out = dict(self.client.client.counters)
        for k, v in self.client._admin.counters.items():
            out[k] = out.get(k, 0) + v
        return out

    def close(self) -> None:
        if self.target in ("hardened", "patched"):
            self.client.close()
            return
        # upstream's client has no close(): its socket and context live until the process exits.
        # Its executor thread (started at the first lookup) is joined before the final probe, which
        # counts this process's threads: shutdown(wait=False) alone left it alive at the probe once
        # (CI: no_leaks "threads 2 -> 3" on store-reset). Only a client whose worker is not stuck
        # is closed, so the thread is idle; the join is bounded all the same.
        executor = self.client.executor
        executor.shutdown(wait=False, cancel_futures=True)
        for t in list(getattr(executor, "_threads", ())):  # ThreadPoolExecutor's own set of its threads
            t.join(CLOSE_JOIN_S)
        self.client.socket.close(linger=0)
        self.client.ctx.term()


def main(argv: list[str] | None = None) -> int:
    from harness.errors import UsageError
    from nodekit.journal import JournalWriter
    from nodekit.nodeio import setup_logging
    from nodekit.workload import add_workload_arguments, block_start_signal, read_config

    from .store_server import parse_path
    from .workload import Workload

    p = argparse.ArgumentParser(prog="pdchaos node store-workload")
    add_workload_arguments(p)
    args = p.parse_args(argv)
    try:
        cfg = read_config(args.config)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    base = parse_path(str(cfg.get("endpoint", "")))
    if base is None or not cfg.get("engine_id"):
        print("error: workload endpoint: must be an ipc path ipc:///DIR/NAME, with an engine_id", file=sys.stderr)
        return 2
    os.environ["VLLM_RPC_BASE_PATH"] = base
    from harness.nodeenv.overlay import overlay_arg_problem

    overlay = str(cfg.get("upstream_overlay") or "")
    bad = overlay_arg_problem(cfg.get("target") == "patched", overlay, "vllm", flag="workload upstream_overlay")
    if bad:
        print(f"error: {bad}", file=sys.stderr)
        return 2
    if overlay:  # patched: vLLM with the diffs, before anything imports vllm
        sys.path.insert(0, overlay)
    setup_logging(args.log_level)
    block_start_signal()  # before any thread: none may take it
    from vllm.config import KVTransferConfig, ParallelConfig, VllmConfig

    from .store_server import client_settings, derived_path

    target = cfg["target"]
    extra = client_settings(int(cfg["deadline_ms"]), int(cfg["backend_timeout_ms"]))
    config = VllmConfig(parallel_config=ParallelConfig(), kv_transfer_config=KVTransferConfig(
        kv_connector="MooncakeStoreConnector", kv_role="kv_both", engine_id=str(cfg["engine_id"]),
        kv_connector_extra_config=extra))
    if derived_path(target, config) != cfg["endpoint"]:
        print(f"error: the {target} client derives another path than the workload endpoint", file=sys.stderr)
        return 2

    class StoreWorkload(Workload):
        def make_client(self) -> Any:
            return _Client(target, config)

        def lookup_op(self, client: Any, spec: Any, op_id: int) -> tuple[Any, int]:  # noqa: ARG002
            hit = client.lookup(spec.token_len, spec.hashes)
            return hit, hit  # the store scheduler loads the whole hit (no tokens computed before)

    journal = JournalWriter(args.journal)
    return StoreWorkload(cfg, journal).run()


if __name__ == "__main__":
    from nodekit.nodeio import exit_now

    exit_now(main())
