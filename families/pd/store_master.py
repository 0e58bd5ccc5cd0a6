"""Node kind ``mooncake-master``: a real Mooncake store master (``mooncake_master``), the KV pool's
metadata service that AscendStore's servers reach at ``master_server_address``, wrapped so it
answers the harness's control channel.

``pdchaos node mooncake-master --rpc-port N --metrics-port M --server-log PATH [--master-from
node-env|path|/abs/mooncake_master] [--startup-timeout-s S] [--control EP]`` runs
``mooncake_master -rpc_address 127.0.0.1 -rpc_port N -metrics_host 127.0.0.1 -metrics_port M
-enable_http_metadata_server=false -eviction_high_watermark_ratio 0.9 -eviction_ratio 0.1
-default_kv_lease_ttl 11000 -client_ttl 120`` (the eviction and lease settings of vllm-ascend's KV
pool guide; both listeners on loopback; no HTTP metadata server, which would bind every address:
the servers use ``P2PHANDSHAKE``). ``--master-from``: the P/D node env's (it ships with
``mooncake-transfer-engine``), the one beside this Python (a CI job's
``mooncake-transfer-engine-npu``), or a path.

``READY`` once the master's admin server answers ``GET /health`` with ``service_ready: true``,
within ``--startup-timeout-s``; otherwise one ``error:`` line (with where its log is), the master
is stopped, exit 2. The master is this node's child in its process group (a group signal reaches
both) with PR_SET_PDEATHSIG; its own output goes to ``--server-log`` (it may name keys). SIGTERM:
the master gets SIGTERM, 10 s, then SIGKILL; exit 0. The master exiting on its own: one
``error:`` line, exit 1.

Control ``stats``: ``alive`` (the process runs and ``/health`` answers ready) and ``counters``:
the master's unlabelled ``master_*`` gauges from ``/metrics`` (allocated and total bytes, keys,
clients...; numbers only) plus ``metrics_ok``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from nodekit.nodeio import NodeApp, NodeUsageError, run_node as run_node_process

log = logging.getLogger(__name__)

STOP_GRACE_S = 10.0
MAX_COUNTERS = 40


def add_node_arguments(p: argparse.ArgumentParser, kind: str) -> None:  # noqa: ARG001
    p.add_argument("--rpc-port", type=int, required=True, help="the master's RPC port (master_server_address)")
    p.add_argument("--metrics-port", type=int, required=True, help="the master's admin/metrics HTTP port")
    p.add_argument("--server-log", required=True, help="file for mooncake_master's own output")
    p.add_argument("--master-from", default="node-env",
                   help="node-env (the P/D node env), path (beside this Python) or an absolute path")
    p.add_argument("--startup-timeout-s", type=float, default=30.0)
    p.add_argument("--control", default=None, help="ipc endpoint of the harness control channel")
    p.add_argument("--log-level", default="INFO")


def master_binary(where: str) -> Path:
    if where == "node-env":
        from stacks.vllm_cpu.recipe import pd_node_env

        return pd_node_env(out=lambda line: None).bin / "mooncake_master"
    if where == "path":
        return Path(sys.executable).parent / "mooncake_master"
    return Path(where)


def _get(url: str, timeout: float) -> bytes:
    handler = urllib.request.ProxyHandler({})  # loopback, whatever HTTP_PROXY says
    with urllib.request.build_opener(handler).open(url, timeout=timeout) as resp:
        return resp.read(1 << 20)


def parse_gauges(text: str) -> dict[str, float]:
    """Unlabelled ``master_*`` samples of a Prometheus text page (numbers only, at most 40)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("master_") or "{" in line:
            continue
        name, _, value = line.partition(" ")
        try:
            out[name] = float(value.split()[0])
        except (ValueError, IndexError):
            continue
        if len(out) >= MAX_COUNTERS:
            break
    return out


class MasterNode(NodeApp):
    def __init__(self, args: argparse.Namespace):
        for flag, port in (("--rpc-port", args.rpc_port), ("--metrics-port", args.metrics_port)):
            if not 1 <= port <= 65535:
                raise NodeUsageError(f"{flag}: {port} is not a TCP port")
        if args.rpc_port == args.metrics_port:
            raise NodeUsageError("--rpc-port and --metrics-port must differ")
        if args.startup_timeout_s <= 0:
            raise NodeUsageError("--startup-timeout-s must be positive")
        if args.master_from not in ("node-env", "path") and not os.path.isabs(args.master_from):
            raise NodeUsageError(f"--master-from: {args.master_from!r} is not node-env, path or an absolute path")
        self.binary = master_binary(args.master_from)
        if not os.access(self.binary, os.X_OK) or self.binary.is_dir():
            raise NodeUsageError(f"--master-from {args.master_from}: no mooncake_master at {self.binary}")
        self.server_log = Path(args.server_log)
        if not self.server_log.parent.is_dir():
            raise NodeUsageError(f"--server-log: folder {str(self.server_log.parent)!r} does not exist")
        self.args = args
        self.admin = f"http://127.0.0.1:{args.metrics_port}"
        self.proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def command(self) -> list[str]:
        a = self.args
        return [str(self.binary), "-rpc_address", "127.0.0.1", "-rpc_port", str(a.rpc_port),
                "-metrics_host", "127.0.0.1", "-metrics_port", str(a.metrics_port),
                "-enable_http_metadata_server=false", "-eviction_high_watermark_ratio", "0.9",
                "-eviction_ratio", "0.1", "-default_kv_lease_ttl", "11000", "-client_ttl", "120"]

    def ready(self, timeout: float = 1.0) -> bool:
        try:
            data = json.loads(_get(f"{self.admin}/health", timeout))
        except (OSError, ValueError):
            return False
        return isinstance(data, dict) and data.get("service_ready") is True

    def bind(self) -> None:
        """Start the master (before any thread of this process) and wait until it is ready."""
        from .vllm_node import _pdeathsig_fn, log_tail

        with open(self.server_log, "ab") as out:
            self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, preexec_fn=_pdeathsig_fn())
        deadline = time.monotonic() + self.args.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._fail(f"mooncake_master exited with code {self.proc.returncode} while starting; "
                           f"{log_tail(self.server_log)}")
            if self.ready():
                log.info("mooncake_master pid %d ready in %.1f s", self.proc.pid,
                         self.args.startup_timeout_s - (deadline - time.monotonic()))
                return
            time.sleep(0.2)
        self._fail(f"mooncake_master not ready within {self.args.startup_timeout_s:g} s; its log: {self.server_log}")

    def _fail(self, message: str) -> None:
        self.close()
        print(f"error: {message}", file=sys.stderr, flush=True)
        raise SystemExit(2)

    def serve(self, stop: threading.Event) -> None:
        while not stop.wait(0.5):
            if self.proc is not None and self.proc.poll() is not None:
                log.error("mooncake_master exited on its own (code %s); its log: %s", self.proc.returncode,
                          self.server_log)
                raise SystemExit(1)

    def close(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def stats(self) -> dict:
        alive = self.proc is not None and self.proc.poll() is None and self.ready(0.4)
        counters: dict = {"metrics_ok": 0}
        try:
            counters = {**parse_gauges(_get(f"{self.admin}/metrics", 0.4).decode("utf-8", "replace")),
                        "metrics_ok": 1}
        except OSError:
            pass
        return {"alive": alive, "server_pid": self.proc.pid if self.proc else None, "counters": counters}

    def ready_message(self) -> str:
        return f"mooncake_master serving rpc port {self.args.rpc_port}, admin port {self.args.metrics_port}"


def run_node(args: argparse.Namespace) -> int:
    return run_node_process(lambda: MasterNode(args), endpoints={}, bind_flag="--rpc-port",
                            control=args.control, log_level=args.log_level)
