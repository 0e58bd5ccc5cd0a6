"""Node kind ``ascend-workload``: the lookup workload with vllm-ascend's real scheduler-side client.

``pdchaos node ascend-workload --config F --journal J`` (the harness's env) replaces itself with the
conformance env's python running this module (harness/nodeenv/exec_node.py); the workload is the
family's own (families/lookup/workload.py: the same generator, pacing, journal and
scheduler rules), with the client of the target:

* ``upstream``: vllm-ascend 0.23.0.post1's ``LookupKeyClient(vllm_config)``
  (``kv_pool/ascend_store/pool_scheduler.py``), unmodified: no deadline, a raw 4-byte reply;
* ``hardened``: ``connector_patch.lookup.ascend_store.HardenedLookupKeyClient``, the client the plugin
  installs into ``KVPoolScheduler`` (deadline ``deadline`` of the scenario, fail-open);
* ``patched``: vllm-ascend's own ``LookupKeyClient`` from the config's ``upstream_overlay`` (vllm-ascend
  with connector_patch/upstream/vllm-ascend/ applied, first on sys.path; no plugin), its deadline
  ``lookup_rpc_timeout_ms`` = the scenario's ``deadline`` in ``kv_connector_extra_config``.

Both connect to the path vllm-ascend derives from the config (``VLLM_RPC_BASE_PATH`` = the
endpoint's folder, ``lookup_rpc_port`` = its port), which must be the endpoint the topology gives.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

READY_TIMEOUT_S = 180.0


def add_node_arguments(p: argparse.ArgumentParser, kind: str) -> None:  # noqa: ARG001
    from nodekit.workload import add_workload_arguments

    add_workload_arguments(p)


def run_node(args: argparse.Namespace) -> int:
    from stacks.ascend_cpu.recipe import ascend_conf_env
    from harness.nodeenv.exec_node import exec_module

    exec_module(ascend_conf_env().python, __name__,
                ["--config", args.config, "--journal", args.journal, "--log-level", args.log_level])
    return 2  # not reached


class _UpstreamClient:
    """vllm-ascend's client as the workload calls it (it has no counters and no outcome).

    ``close()`` is upstream's (it closes the socket) and then terminates the ZMQ context the client
    made: upstream's leaves it open (measured: 7 fds per client until the process exits), and
    nothing upstream closes a client before exit, so that is not a leak of the run's ops."""

    def __init__(self, config: Any):
        from vllm_ascend.distributed.kv_transfer.kv_pool.ascend_store.pool_scheduler import LookupKeyClient

        self.client = LookupKeyClient(config)

    def lookup(self, token_len: int, block_hashes: Any, kv_cache_group_ids: Any = (0,), hbm_hit_tokens: int = 0) -> int:
        return self.client.lookup(token_len, list(block_hashes), list(kv_cache_group_ids), hbm_hit_tokens)

    def close(self) -> None:
        self.client.close()
        self.client.ctx.term()


def main(argv: list[str] | None = None) -> int:
    from harness.errors import UsageError
    from nodekit.journal import JournalWriter
    from nodekit.nodeio import setup_logging
    from nodekit.workload import add_workload_arguments, block_start_signal, read_config

    from .ascend_server import import_stack, parse_path, patched_settings, vllm_config_for
    from .workload import Workload

    p = argparse.ArgumentParser(prog="pdchaos node ascend-workload")
    add_workload_arguments(p)
    args = p.parse_args(argv)
    try:
        cfg = read_config(args.config)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    parsed = parse_path(str(cfg.get("endpoint", "")))
    if parsed is None:
        print("error: workload endpoint: must be vllm-ascend's lookup path ipc://DIR/lookup_rpc_port_N_dp_rank0",
              file=sys.stderr)
        return 2
    os.environ["VLLM_RPC_BASE_PATH"] = parsed[0]
    target = cfg["target"]
    from harness.nodeenv.overlay import overlay_arg_problem

    overlay = str(cfg.get("upstream_overlay", ""))
    bad = overlay_arg_problem(target == "patched", overlay, "vllm_ascend", flag="workload upstream_overlay")
    if bad:
        print(f"error: {bad}", file=sys.stderr)
        return 2
    if overlay:  # patched: upstream's code with the diffs, before anything imports vllm_ascend
        sys.path.insert(0, overlay)
    setup_logging(args.log_level)
    block_start_signal()  # before any thread: none may take it
    import_stack()
    config = vllm_config_for(parsed[1], patched_settings(int(cfg["deadline_ms"]), int(cfg["backend_timeout_ms"]))
                             if target == "patched" else None)

    class AscendWorkload(Workload):
        def make_client(self) -> Any:
            if target == "upstream":
                return _UpstreamClient(config)
            if target == "patched":  # the same class, as diffs 11 and 13 change it
                from vllm_ascend.distributed.kv_transfer.kv_pool.ascend_store.pool_scheduler import (
                    LookupKeyClient)

                return LookupKeyClient(config)
            from connector_patch.lookup.ascend_store import HardenedLookupKeyClient

            return HardenedLookupKeyClient(config, int(cfg["deadline_ms"]))

    journal = JournalWriter(args.journal)
    return AscendWorkload(cfg, journal).run()


if __name__ == "__main__":
    from nodekit.nodeio import exit_now

    exit_now(main())
