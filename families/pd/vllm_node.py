"""Node kind ``vllm``: one real vLLM server (prefill or decode) from the P/D node env, wrapped so
it answers the harness's control channel.

``pdchaos node vllm --role prefill|decode --port N --bootstrap-port N --server-log PATH
[--control EP] ...`` runs the node env's ``vllm serve DIR --host 127.0.0.1 --port N --dtype
bfloat16 --max-model-len 512 --max-num-seqs 8 --enforce-eager --no-enable-prefix-caching
--kv-transfer-config '{"kv_connector": "MooncakeConnector", "kv_role": "kv_producer" (prefill) |
"kv_consumer" (decode), "kv_load_failure_policy": "fail"|"recompute", "kv_connector_extra_config":
{"mooncake_protocol": "tcp"}}'`` (vLLM 0.32.0 takes ``kv_load_failure_policy`` as a field of
``KVTransferConfig``, vllm/config/kv_transfer.py; its scheduler reads it in
vllm/v1/core/sched/scheduler.py) with ``HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
VLLM_CPU_KVCACHE_SPACE=1 VLLM_HOST_IP=<host> VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
VLLM_MOONCAKE_BOOTSTRAP_PORT=<bootstrap> VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT=<abort>
VLLM_CPU_OMP_THREADS_BIND=<core>``. The engine id is left random, so a restarted P is a new
engine that a proxy re-reading P's bootstrap ``/query`` finds.

Process life:

* vLLM is this node's child in this node's process group (the runner starts every node in its
  own session and signals the whole group, so a SIGSTOP or SIGKILL of the node reaches vLLM and
  its EngineCore and Worker processes), with PR_SET_PDEATHSIG (it dies with this node). It is
  started before this process has any thread (``preexec_fn`` is unsafe with threads), from the
  main thread (the death signal follows the thread that forked). The death signal reaches
  vLLM's API server only: killed alone, this node leaves vLLM's EngineCore and Worker running
  (measured: still there after 20 s), in its group. Signal the group, as the runner does.
* vLLM's stdout and stderr go to ``--server-log``, never to this node's log: they are vLLM's
  logs and may hold prompt text. This node logs only states, pids, times and counts.
* ``READY`` is printed once ``/health`` answers 200 (and, for a prefill node with the Mooncake
  connector, its bootstrap ``/query`` names an engine) and one warm-up completion of a fixed
  prompt came back 200 (``--no-warm-up`` skips it), within ``--startup-timeout-s``; then one
  ``/metrics`` scrape and the group's thread and fd counts at READY (the floor of the ``stats``
  counts, see below). When vLLM exits first or the time runs out: one ``error:`` line with the
  tail of vLLM's start-up log (no request has been served yet, so it holds no prompt), vLLM is
  stopped, exit 2.
* SIGTERM/SIGINT (or the runner's death): SIGTERM to every other process of the group (vLLM and
  its children), up to 30 s for them to end, then SIGKILL; exit 0.
* vLLM exiting on its own after READY: one ``error:`` line (exit code and where its log is), the
  rest of the group is stopped, exit 1.

Known, on hosts with AMX (measured here): vLLM 0.32.0's CPU attention uses its AMX kernels, but
nothing asks Linux for the AMX tile permission unless oneDNN happened to JIT an AMX GEMM first (a
forward step of many tokens); a server whose first step is small (D right after a KV pull, or a
1-token prompt) dies with SIGILL. ``torch._C._cpu._init_amx()`` in every vLLM process (the CPU
shim's job) fixes it; tests/families/pd/test_pd_nodes.py warms each server up with one big prompt meanwhile.
This node does not hide it: it serves vLLM as it is.

Control channel (``--control``): ``stats`` = ``pid`` (this wrapper's) + ``alive`` (vLLM's process
runs and ``/health`` answers 200) + what vLLM's processes (every process of the group but this
wrapper) hold, from /proc, counted after the answer's ``/metrics`` scrape: ``group_threads``,
``group_fds``, ``sockets``, ``processes``, and ``threads``/``fds``, the counts the runner's leak
probes and ``no_leaks`` compare: the group's, floored at the counts measured at READY plus what
the connector's lazy pools add with the first KV transfers (``lazy_threads``/``lazy_fds``, see
``lazy_allowance``: measured, bounded, for the node's life), so a healthy node's first scenario
reads as no growth and any growth beyond that shows. They replace the ControlServer's numbers of
this wrapper (kept as ``wrapper_threads`` and ``wrapper_fds``): the leak probes must see the
system under test, not its 3-thread wrapper. -1 where /proc cannot be read or no vLLM process is
left. ``cpu_s`` and ``rss_mib`` (user+sys CPU seconds, including reaped children, and resident
memory) + ``counters``: vLLM's ``/metrics`` flattened (families/pd/metrics.py:
running/waiting requests, KV fetches by stage, KV cache usage, prompt tokens by source incl.
``external_kv_transfer``, request outcomes by finish reason, ...) plus ``cpu_s``, ``rss_mib``,
the counts above (the probe records keep only ``counters`` besides ``threads``/``fds``) and
``metrics_ok`` (1 when the scrape worked, 0 when it failed or timed out: then the counters hold
only the node's own numbers). ``role``, ``engine_id`` (prefill), ``server_pid``, ``ready_threads``
and ``ready_fds`` too.
``metrics`` = the scrape alone (``counters``). Every answer is bounded (~0.8 s): the runner
probes with a 1 s deadline.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from nodekit.nodeio import NodeUsageError, announce_ready, check_endpoint, setup_logging, usage_exit, watch_parent

from .metrics import MetricsError, http_get, scrape

log = logging.getLogger(__name__)

ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}
HARDENED = "HardenedMooncakeConnector"  # connector_patch/pd/vllm_connector.py, registered by its vLLM plugin
MOONCAKE = ("MooncakeConnector", HARDENED)


# The patched target's vLLM settings: the opt-in switches of connector_patch/upstream/vllm/0.32.0/ that the
# scenarios' claims for it rest on (no_busy_wait, latency), as hardened's rest on quiet waiting. vLLM's
# defaults keep them off (upstream's behaviour): 02's adaptive shared-memory spin; 01/04/18's engine wake.
PATCHED_VLLM_ENV = {"VLLM_SHM_READER_ADAPTIVE_SPIN": "1", "VLLM_ENGINE_KV_WAKE": "1"}


def patched_env(overlay: str | None) -> dict[str, str]:
    """What a node started on ``overlay`` (the patched target's package copy) adds to vLLM's environment:
    the switches above where the copy is vLLM's (not for a vllm-ascend copy)."""
    return dict(PATCHED_VLLM_ENV) if overlay and os.path.isdir(os.path.join(overlay, "vllm")) else {}


def is_hardened(conn: str) -> bool:
    """The hardened connector, or a mutant of it (``HardenedMooncakeConnectorMutant...``, registered
    only on a mutation run's nodes: tests/mutants/system/)."""
    return conn.startswith(HARDENED)


def is_mooncake(conn: str) -> bool:
    return conn in MOONCAKE or is_hardened(conn)


WARM_UP_PROMPT = " ".join(["the quick brown fox jumps over the lazy dog"] * 8)  # 200 tokens of the tiny model, fixed
STOP_GRACE_S = 30.0
HEALTH_POLL_S = 0.5
SCRAPE_BUDGET_S = 0.8  # the runner's probes wait 1 s for a stats answer
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE_KB = (os.sysconf("SC_PAGE_SIZE") // 1024) if hasattr(os, "sysconf") else 4


def add_node_arguments(p: argparse.ArgumentParser, kind: str) -> None:  # noqa: ARG001
    p.add_argument("--role", required=True, choices=sorted(ROLES), help="prefill (kv_producer) or decode (kv_consumer)")
    p.add_argument("--port", required=True, type=int, help="vLLM's HTTP port")
    p.add_argument("--host", default="127.0.0.1",
                   help="address vLLM listens on and VLLM_HOST_IP (loopback; a private address inside a run's netns)")
    p.add_argument("--advertise-host", default=None,
                   help="VLLM_HOST_IP, the address peers reach this node's bootstrap server and transfer engine at, "
                        "when it differs from --host (a pod: --host 0.0.0.0, so a port-forward reaches it on the "
                        "pod's loopback, and the pod's own address here)")
    p.add_argument("--bootstrap-port", required=True, type=int,
                   help="VLLM_MOONCAKE_BOOTSTRAP_PORT (P's bootstrap server, which D and the proxy ask)")
    p.add_argument("--model", default=None, help="model folder (default: the tiny model of stacks.vllm_cpu.tiny_model)")
    p.add_argument("--policy", choices=("fail", "recompute"), default="fail", help="kv_load_failure_policy")
    p.add_argument("--abort-timeout-s", type=int, default=None,
                   help="VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT (vLLM's default when not given: 480)")
    p.add_argument("--engine-id", default=None,
                   help="engine_id of --kv-transfer-config (vLLM makes up a random one when not given)")
    p.add_argument("--kv-load-timeout-ms", type=int, default=None,
                   help="HardenedMooncakeConnector's kv_load_timeout_ms (its default: 30000)")
    p.add_argument("--kv-connector", default="MooncakeConnector",
                   help="kv_connector of --kv-transfer-config; 'none' serves without one")
    p.add_argument("--kv-extra", default=None,
                   help="kv_connector_extra_config as a JSON object (default for a Mooncake connector: "
                        '{"mooncake_protocol": "tcp"})')
    p.add_argument("--kv-port", type=int, default=None, help="kv_transfer_config.kv_port (vllm-ascend's connectors)")
    p.add_argument("--cpu-core", type=int, default=None, help="VLLM_CPU_OMP_THREADS_BIND (one core; device cpu)")
    p.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="vLLM's --tensor-parallel-size (1 or 2; on CPU one rank per core: 0|1)")
    p.add_argument("--device", choices=("cpu", "npu"), default="cpu",
                   help="cpu: the CPU settings (VLLM_CPU_*); npu: one NPU, --visible-devices")
    p.add_argument("--visible-devices", default=None, help="ASCEND_RT_VISIBLE_DEVICES (device npu)")
    p.add_argument("--vllm-from", default="node-env",
                   help="node-env: the P/D node env of `pdchaos setup`; path: the vllm beside this Python; or "
                        "the absolute path of a vllm command")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32", "auto"))
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="more environment for vLLM (repeatable)")
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--startup-timeout-s", type=float, default=300.0, help="/health must answer within this")
    p.add_argument("--server-log", required=True,
                   help="file for vLLM's own stdout/stderr (kept apart from this node's log: it may hold prompts)")
    p.add_argument("--control", default=None, help="ipc endpoint of the harness control channel")
    p.add_argument("--no-warm-up", action="store_true",
                   help="print READY without the warm-up completion (a fixed ~200-token prompt)")
    p.add_argument("--upstream-overlay", default=None,
                   help="a folder put first on vLLM's PYTHONPATH: its package copy with the upstream diffs applied "
                        "(the patched target, connector_patch/upstream/)")
    p.add_argument("--plugin-path", default=None,
                   help="a folder put on vLLM's PYTHONPATH after the hardened plugin's (a mutation run's plugin site)")
    p.add_argument("--log-level", default="INFO")


# --------------------------------------------------------------------------- /proc helpers

def group_members(pgid: int, exclude: frozenset[int] = frozenset()) -> list[int]:
    """Live (non-zombie) processes of the process group ``pgid``, but those in ``exclude``."""
    from stacks.vllm_cpu.smoke import group_pids

    return [p for p in group_pids(pgid) if p not in exclude]


def ancestors() -> frozenset[int]:
    """This process and its ancestors (from /proc)."""
    out, pid = set(), os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                pid = int(fh.read().decode(errors="replace").rsplit(")", 1)[-1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return frozenset(out)


def cpu_rss(pids: list[int]) -> tuple[float, float]:
    """(user+sys CPU seconds incl. reaped children, RSS MiB) summed over ``pids``."""
    ticks = 0
    pages = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                fields = fh.read().decode(errors="replace").rsplit(")", 1)[-1].split()
            # after the name: state(0) ... utime(11) stime(12) cutime(13) cstime(14) ... rss(21)
            ticks += sum(int(x) for x in fields[11:15])
            pages += int(fields[21])
        except (OSError, ValueError, IndexError):
            continue
    return round(ticks / _CLK_TCK, 2), round(pages * _PAGE_KB / 1024, 1)


def proc_counts(pids: list[int]) -> dict[str, int]:
    """What the processes ``pids`` hold, from /proc: ``processes`` (how many were counted),
    ``threads`` (sum of /proc/PID/status ``Threads``), ``fds`` (entries of /proc/PID/fd) and
    ``sockets`` (those fds that are sockets).

    A pid that is gone (or a zombie, which holds no fds) by the time it is read is skipped:
    the count is of the processes that are there. A value that cannot be read (no /proc, no
    permission) is -1 for the whole sum, and so are all three when no process was counted: a
    probe without the value cannot show the processes are back to their baseline (the
    ``no_leaks`` check fails on it, as it should)."""
    n = threads = fds = sockets = 0
    no_threads = no_fds = False
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status", "rb") as fh:
                status = fh.read().decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError):
            continue  # gone
        except OSError:
            status = None
        if status is not None and re.search(r"^State:\s*[ZX]", status, re.M):
            continue  # a zombie (or dead): nothing held any more
        m = re.search(r"^Threads:\s*(\d+)", status or "", re.M)
        t = int(m.group(1)) if m else None
        if t is None:
            try:
                t = len(os.listdir(f"/proc/{pid}/task"))
            except (FileNotFoundError, ProcessLookupError):
                continue
            except OSError:
                t = None
        fd_dir = f"/proc/{pid}/fd"
        try:
            names = os.listdir(fd_dir)
        except (FileNotFoundError, ProcessLookupError):
            continue  # gone between the two reads
        except OSError:
            names = None
        socks = 0
        for name in names or ():
            try:
                if os.readlink(f"{fd_dir}/{name}").startswith("socket:"):
                    socks += 1
            except OSError:  # closed meanwhile (still counted in fds: it was open when listed)
                pass
        n += 1
        if t is None:
            no_threads = True
        else:
            threads += t
        if names is None:
            no_fds = True
        else:
            fds += len(names)
            sockets += socks
    if n == 0:
        return {"processes": 0, "threads": -1, "fds": -1, "sockets": -1}
    return {"processes": n, "threads": -1 if no_threads else threads,
            "fds": -1 if no_fds else fds, "sockets": -1 if no_fds else sockets}


# What a vLLM 0.32.0 server with vLLM's MooncakeConnector (or the hardened one, which keeps its
# pools) starts on its first disaggregated requests, after READY, and keeps for its life: bounded
# pools, not leaks (measured on CPU with the tiny model, concurrency 1 to 8, 100 requests; py-spy
# for the Python threads, /proc/PID/net/tcp for the sockets):
# * prefill: the sender pool, ThreadPoolExecutor(max_workers=kv_connector_extra_config
#   "num_workers", 10 by default, "vllm-mooncake-sender"), one thread per send while none is idle
#   (1 after one request, 4 after 100 at concurrency 8), plus one native thread with the first
#   send; and the Mooncake TCP transport's connection pool to D's transfer port (4 connections,
#   the same at concurrency 1 and 8; idle ones are closed only when a later transfer asks).
# * decode: the worker's zmq.asyncio.Context starts its I/O and reaper threads (2) and their 4
#   eventfd/epoll fds at the first pull; P's pooled transfer connections end on D (4 sockets).
LAZY_SENDER_WORKERS = 10  # vLLM 0.32.0 mooncake_connector.py: kv_connector_extra_config.get("num_workers", 10)
LAZY_PREFILL = (1, 4)  # (threads, fds) besides the sender pool
LAZY_DECODE = (2, 8)


def lazy_allowance(role: str, connector: str, extra: dict | None) -> tuple[int, int]:
    """(threads, fds) a server of ``role`` with ``connector`` may start after READY and keep (see
    above); 0 for a connector not measured here."""
    if not is_mooncake(connector):
        return 0, 0
    if role == "decode":
        return LAZY_DECODE
    workers = (extra or {}).get("num_workers", LAZY_SENDER_WORKERS)
    workers = workers if isinstance(workers, int) and not isinstance(workers, bool) and workers > 0 \
        else LAZY_SENDER_WORKERS
    return LAZY_PREFILL[0] + workers, LAZY_PREFILL[1]


def floored(now: int, ready: int, lazy: int) -> int:
    """The leak probes' count: ``now``, but never below the count at READY plus the allowance
    (a server settles there once its lazy pools started); -1 stays -1 (unknown), and an unknown
    READY count leaves ``now`` as it is."""
    if now < 0 or ready < 0:
        return now
    return max(now, ready + lazy)


def _pdeathsig_fn():
    """A preexec function setting PR_SET_PDEATHSIG=SIGKILL; libc is looked up here, in the parent."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    return preexec


_ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception|Interrupt)\b|\b(ERROR|CRITICAL)\b")


def log_tail(path: Path, n: int = 3, limit: int = 600) -> str:
    """One line from the end of a start-up log: its last error lines (an exception line with the
    line after it, which often carries the message), else its last lines."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            lines = [ln.strip() for ln in fh.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    idx = [i for i, ln in enumerate(lines) if _ERROR_LINE.search(ln)]
    if idx:
        last = idx[-1]
        picked = [lines[i] for i in idx[-n:]] + lines[last + 1:last + 2]
    else:
        picked = lines[-n:]
    return " | ".join(picked)[-limit:] or "(empty log)"


# --------------------------------------------------------------------------- the node


def started_ticks(pid: int | str = "self") -> int:
    """When process ``pid`` started, in clock ticks since boot (/proc's stat field 22); -1 unread."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return -1

class VllmNode:
    waf_file: Path | None = None  # the write-after-free watcher's counts file (decode nodes on CPU)
    phase_file: Path | None = None  # the phase journal (node_instruments/pdchaos_waf/phases.py)

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.role = args.role
        for flag, port in (("--port", args.port), ("--bootstrap-port", args.bootstrap_port)):
            if not 1 <= port <= 65535:
                raise NodeUsageError(f"{flag}: {port} is not a TCP port")
        if args.port == args.bootstrap_port:
            raise NodeUsageError("--port and --bootstrap-port must differ")
        check_endpoint(f"tcp://{args.host}:{args.port}", "--host")
        self.advertise = args.advertise_host or args.host
        check_endpoint(f"tcp://{self.advertise}:{args.bootstrap_port}", "--advertise-host")
        if args.control:
            check_endpoint(args.control, "--control")
        if args.startup_timeout_s <= 0:
            raise NodeUsageError("--startup-timeout-s must be positive")
        if args.abort_timeout_s is not None and args.abort_timeout_s < 1:
            raise NodeUsageError("--abort-timeout-s must be at least 1")
        if args.cpu_core is not None and not 0 <= args.cpu_core < (os.cpu_count() or 1):
            raise NodeUsageError(f"--cpu-core: {args.cpu_core} is not a core of this machine "
                                 f"(0..{(os.cpu_count() or 1) - 1})")
        if args.engine_id is not None and not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", args.engine_id):
            raise NodeUsageError("--engine-id: 1 to 64 letters, digits, '.', '_' or '-'")
        if args.tensor_parallel_size not in (1, 2):
            raise NodeUsageError("--tensor-parallel-size must be 1 or 2")
        if args.tensor_parallel_size > 1 and args.cpu_core is not None:
            raise NodeUsageError("--cpu-core: only with --tensor-parallel-size 1 (two ranks bind to cores 0|1)")
        if not 1 <= args.max_num_seqs <= 256:
            raise NodeUsageError("--max-num-seqs must be 1..256")
        if args.upstream_overlay is not None and not (os.path.isabs(args.upstream_overlay)
                                                      and os.path.isdir(args.upstream_overlay)):
            raise NodeUsageError(f"--upstream-overlay: {args.upstream_overlay!r} is not an absolute path of a folder")
        if args.kv_load_timeout_ms is not None:
            if not (is_hardened(args.kv_connector) or args.upstream_overlay) \
                    and "$KV_LOAD_TIMEOUT_MS" not in (args.kv_extra or ""):
                raise NodeUsageError(f"--kv-load-timeout-ms: only {HARDENED} (or upstream's with the upstream "
                                     "diffs, --upstream-overlay) has a load deadline (or a --kv-extra that names "
                                     "$KV_LOAD_TIMEOUT_MS)")
            if args.kv_load_timeout_ms <= 0:
                raise NodeUsageError("--kv-load-timeout-ms must be a positive number of milliseconds")
        self.kv_extra = self._kv_extra(args)
        if args.kv_port is not None and not 1 <= args.kv_port <= 65535:
            raise NodeUsageError(f"--kv-port: {args.kv_port} is not a TCP port")
        if args.device == "npu":
            if args.cpu_core is not None:
                raise NodeUsageError("--cpu-core: only with --device cpu")
            if not (args.visible_devices or "").isdigit():
                raise NodeUsageError("--visible-devices: the NPU number this server runs on (device npu)")
        elif args.visible_devices is not None:
            raise NodeUsageError("--visible-devices: only with --device npu")
        if not 64 <= args.max_model_len <= 131072:
            raise NodeUsageError("--max-model-len must be 64..131072")
        self.extra_env: dict[str, str] = {}
        for item in args.env:
            key, sep, value = item.partition("=")
            if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise NodeUsageError(f"--env {key or item!r}: expected NAME=VALUE")
            self.extra_env[key] = value
        from stacks.vllm_cpu.tiny_model import model_dir

        self.model = Path(args.model) if args.model else model_dir()
        if not (self.model / "config.json").is_file():
            raise NodeUsageError(f"--model: {str(self.model)!r} holds no config.json (build the tiny model with "
                                 "`pdchaos setup --only pd-tiny-model`)")
        if args.vllm_from == "path":
            self.vllm_bin = Path(sys.executable).parent / "vllm"
            if not self.vllm_bin.exists():
                raise NodeUsageError(f"--vllm-from path: no vllm beside this Python ({self.vllm_bin})")
        elif args.vllm_from != "node-env":
            self.vllm_bin = Path(args.vllm_from)
            if not self.vllm_bin.is_absolute() or not os.access(self.vllm_bin, os.X_OK) or self.vllm_bin.is_dir():
                raise NodeUsageError(f"--vllm-from: {args.vllm_from!r} is not node-env, path or the absolute path "
                                     "of a vllm command")
        else:
            from stacks.vllm_cpu.recipe import pd_node_env

            env = pd_node_env(out=lambda line: None)
            self.vllm_bin = env.bin / "vllm"
            if not env.installed() or not self.vllm_bin.exists():
                raise NodeUsageError(f"the P/D node stack is not installed ({env.path}): "
                                     "run `pdchaos setup --only pd-node-stack`")
        self.server_log = Path(args.server_log)
        if not self.server_log.parent.is_dir():
            raise NodeUsageError(f"--server-log: folder {str(self.server_log.parent)!r} does not exist")
        # the write-after-free watcher (node_instruments/pdchaos_waf) in a CPU decode node's one worker
        if (args.role == "decode" and args.device == "cpu" and args.tensor_parallel_size == 1
                and "Store" not in args.kv_connector and is_mooncake(args.kv_connector)):
            self.waf_file = self.server_log.with_name(self.server_log.name + ".waf.json")
        # the phase journal (node_instruments/pdchaos_waf/phases.py) in every Mooncake node on CPU,
        # P and D: the nemesis keys faults on its events (harness/phases.py)
        if args.device == "cpu" and "Store" not in args.kv_connector and is_mooncake(args.kv_connector):
            self.phase_file = self.server_log.with_name(self.server_log.name + ".phases.jsonl")
        self.base = f"http://{args.host}:{args.port}"
        self.bootstrap = f"http://{self.advertise}:{args.bootstrap_port}"
        self.proc: subprocess.Popen | None = None
        self.engine_id: str | None = None
        self.t_start = 0.0
        self.ancestors = ancestors()
        self.ready_counts: dict[str, int] = {"threads": -1, "fds": -1}  # set by measure_ready()

    @staticmethod
    def _kv_extra(args: argparse.Namespace) -> dict | None:
        """``--kv-extra`` with its placeholders filled in, wherever they stand (a MultiConnector
        nests its connectors' configs): ``$KV_PORT`` (``--kv-port``), ``$KV_ROLE`` (kv_producer or
        kv_consumer), ``$LOOKUP_RPC_PORT`` (AscendStore's ipc suffix, one per server on a
        host: its HTTP port) and ``$KV_LOAD_TIMEOUT_MS`` (``--kv-load-timeout-ms``)."""
        if args.kv_extra is None:
            return None
        try:
            extra = json.loads(args.kv_extra)
        except ValueError:
            raise NodeUsageError("--kv-extra: not JSON") from None
        if not isinstance(extra, dict):
            raise NodeUsageError("--kv-extra: expected a JSON object")
        # $LOOKUP_RPC_PORT names AscendStore's ipc path on this host: the HTTP port makes it unique
        values = {"$KV_ROLE": ROLES[args.role], "$LOOKUP_RPC_PORT": str(args.port)}
        if args.kv_port is not None:
            values["$KV_PORT"] = args.kv_port
        if args.kv_load_timeout_ms is not None:
            values["$KV_LOAD_TIMEOUT_MS"] = args.kv_load_timeout_ms
        left: list[str] = []

        def fill(x: Any) -> Any:
            if isinstance(x, dict):
                return {k: fill(v) for k, v in x.items()}
            if isinstance(x, list):
                return [fill(v) for v in x]
            if isinstance(x, str) and re.fullmatch(r"\$[A-Z][A-Z_]*", x):
                if x not in values:
                    left.append(x)
                return values.get(x, x)
            return x

        extra = fill(extra)
        if left:
            raise NodeUsageError(f"--kv-extra: {left[0]} has no value here (known: {', '.join(sorted(values))}; "
                                 "$KV_PORT needs --kv-port, $KV_LOAD_TIMEOUT_MS --kv-load-timeout-ms)")
        return extra

    # ------------------------------------------------------------------ command
    def kv_transfer_config(self) -> dict | None:
        conn = self.args.kv_connector
        if conn.lower() == "none":
            return None
        cfg: dict[str, Any] = {"kv_connector": conn, "kv_role": ROLES[self.role],
                               "kv_load_failure_policy": self.args.policy}
        if self.args.engine_id:
            cfg["engine_id"] = self.args.engine_id
        if self.args.kv_port is not None:
            cfg["kv_port"] = self.args.kv_port
        extra = dict(self.kv_extra) if self.kv_extra is not None else (
            {"mooncake_protocol": "tcp"} if is_mooncake(conn) else None)
        if (is_hardened(conn) or self.args.upstream_overlay) and self.args.kv_load_timeout_ms is not None:
            extra = {**(extra or {}), "kv_load_timeout_ms": self.args.kv_load_timeout_ms}
        if extra is not None:
            cfg["kv_connector_extra_config"] = extra
        if conn == "NixlConnector":
            cfg["kv_buffer_device"] = "cpu"
        return cfg

    def command(self) -> list[str]:
        a = self.args
        cmd = [str(self.vllm_bin), "serve", str(self.model), "--host", a.host, "--port", str(a.port),
               "--dtype", a.dtype, "--max-model-len", str(a.max_model_len), "--max-num-seqs", str(a.max_num_seqs),
               "--enforce-eager", "--no-enable-prefix-caching"]
        if a.tensor_parallel_size > 1:
            cmd += ["--tensor-parallel-size", str(a.tensor_parallel_size)]
        kv = self.kv_transfer_config()
        if kv is not None:
            cmd += ["--kv-transfer-config", json.dumps(kv, separators=(",", ":"))]
        return cmd

    def environment(self) -> dict[str, str]:
        from harness.nodeenv.venv import child_env

        a = self.args
        extra = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                 "VLLM_HOST_IP": a.advertise_host or a.host, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                 "VLLM_MOONCAKE_BOOTSTRAP_PORT": str(a.bootstrap_port),
                 "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
        if a.vllm_from == "node-env":  # the node env is self-contained; a job's Python may use its user site
            extra["PYTHONNOUSERSITE"] = "1"
        if a.device == "cpu":
            extra["VLLM_CPU_KVCACHE_SPACE"] = "1"
        else:
            extra["ASCEND_RT_VISIBLE_DEVICES"] = a.visible_devices
        if a.abort_timeout_s is not None:
            extra["VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT"] = str(a.abort_timeout_s)
        if a.cpu_core is not None:
            extra["VLLM_CPU_OMP_THREADS_BIND"] = str(a.cpu_core)
        elif a.device == "cpu" and a.tensor_parallel_size > 1:
            extra["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i % (os.cpu_count() or 1))
                                                          for i in range(a.tensor_parallel_size))
        extra.update(patched_env(a.upstream_overlay))
        extra.update(self.extra_env)
        env = child_env(extra)
        for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
            env.pop(k, None)
        env["PATH"] = f"{self.vllm_bin.parent}{os.pathsep}{env.get('PATH', '')}"
        # the node env is self-contained; a job's Python keeps what its environment put on the path
        # (CANN's set_env.sh adds the toolkit's Python packages, which torch_npu and vllm-ascend need)
        inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p] \
            if a.vllm_from != "node-env" else []
        sites: list[str] = []
        if "Hardened" in json.dumps(self.kv_transfer_config() or {}):  # a hardened connector, or one nested
            # in a MultiConnector: vLLM finds the plugin's entry point there (plugin_site.py)
            from .plugin_site import plugin_site

            sites = [str(plugin_site())] + ([a.plugin_path] if a.plugin_path else [])
        if self.waf_file is not None:  # the write-after-free watcher (node_instruments/pdchaos_waf)
            from .plugin_site import instrument_site

            sites.append(str(instrument_site()))
            env["PDCHAOS_WAF_FILE"] = str(self.waf_file)
        if self.phase_file is not None:
            from .plugin_site import instrument_site

            if str(instrument_site()) not in sites:
                sites.append(str(instrument_site()))
            env["PDCHAOS_PHASE_FILE"] = str(self.phase_file)
        if a.upstream_overlay:  # first: its package copy shadows the node env's installed one
            sites.insert(0, a.upstream_overlay)
        if sites or inherited:
            env["PYTHONPATH"] = os.pathsep.join(sites + inherited)
        else:
            env.pop("PYTHONPATH", None)
        return env

    # ------------------------------------------------------------------ life
    def start(self) -> None:
        """Start vLLM (call before this process starts any thread)."""
        with open(self.server_log, "ab") as out:
            self.t_start = time.monotonic()
            self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self.environment(),
                                         preexec_fn=_pdeathsig_fn(), close_fds=True)

    def server_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self, timeout: float = 2.0) -> bool:
        try:
            status, _ = http_get(self.base + "/health", timeout)
        except Exception:  # noqa: BLE001 - any failure is "not healthy"
            return False
        return status == 200

    def read_engine_id(self, timeout: float = 2.0) -> str | None:
        try:
            status, body = http_get(self.bootstrap + "/query", timeout)
            data = json.loads(body) if status == 200 else None
            eid = data["0"]["engine_id"] if isinstance(data, dict) else None
        except Exception:  # noqa: BLE001 - not up yet, or not a Mooncake producer
            return None
        return eid if isinstance(eid, str) and eid else None

    def wait_ready(self, stop: threading.Event) -> str | None:
        """None once ready; else why not (an error line) or "" when asked to stop."""
        deadline = self.t_start + self.args.startup_timeout_s
        need_engine = self.role == "prefill" and is_mooncake(self.args.kv_connector)
        while True:
            if stop.is_set():
                return ""
            if not self.server_alive():
                code = self.proc.returncode if self.proc else None
                return (f"vLLM ({self.role}) exited with code {code} before /health answered: "
                        f"{log_tail(self.server_log)} (log {self.server_log})")
            if self.healthy():
                if need_engine:
                    self.engine_id = self.read_engine_id()
                if not need_engine or self.engine_id:
                    return self.warm_up(deadline)
            if time.monotonic() >= deadline:
                what = "/health" if not need_engine or not self.healthy() else "the bootstrap /query"
                return (f"vLLM ({self.role}): {what} did not answer within {self.args.startup_timeout_s:g} s: "
                        f"{log_tail(self.server_log)} (log {self.server_log})")
            stop.wait(HEALTH_POLL_S)

    def warm_up(self, deadline: float) -> str | None:
        """One plain completion of a fixed ~200-token prompt before READY (none with
        ``--no-warm-up``): a fresh server's first forward step costs seconds (kernel set-up), which
        would land in the first op of a scenario and vary with the machine's load. The prompt is
        fixed text, never a workload's. None when done; else why not."""
        if self.args.no_warm_up:
            return None
        body = {"model": str(self.model), "prompt": WARM_UP_PROMPT, "max_tokens": 2, "temperature": 0}
        t0 = time.monotonic()
        rest = max(5.0, deadline - t0)
        try:
            from .workload import post_json

            status, _ = post_json(self.base + "/v1/completions", body, min(rest, 120.0))
        except Exception as exc:  # noqa: BLE001 - reported as the reason the node is not ready
            return f"vLLM ({self.role}): the warm-up completion failed: {type(exc).__name__} (log {self.server_log})"
        if status != 200:
            return f"vLLM ({self.role}): the warm-up completion answered HTTP {status} (log {self.server_log})"
        log.info("vllm %s: warm-up completion in %.1f s", self.role, time.monotonic() - t0)
        return None

    def others(self) -> list[int]:
        """vLLM's processes: every member of our process group but us and our ancestors (the
        runner makes each node its group's leader; started from a shell or ``timeout``, the
        group also holds whoever started us)."""
        return group_members(os.getpgrp(), exclude=self.ancestors)

    def measure_ready(self, samples: int = 3, gap_s: float = 0.2) -> dict[str, int]:
        """The group's thread and fd counts at READY (the floor of the leak probes' counts, with
        the allowance): after one ``/metrics`` scrape, as every ``stats`` answer makes one (the
        first scrape starts an AnyIO worker thread in vLLM's API server, which stays: measured),
        the lowest of a few readings (a start-up file or thread may still be closing)."""
        try:
            scrape(self.base, timeout=2.0)
        except MetricsError:
            pass
        seen = []
        for i in range(samples):
            if i:
                time.sleep(gap_s)
            seen.append(proc_counts(self.others()))
        out = {}
        for k in ("threads", "fds"):
            vals = [c[k] for c in seen]
            out[k] = -1 if min(vals) < 0 else min(vals)
        self.ready_counts = out
        return out

    def allowance(self) -> tuple[int, int]:
        threads, fds = lazy_allowance(self.role, self.args.kv_connector, self.kv_extra)
        ranks = getattr(self.args, "tensor_parallel_size", 1)  # every rank's worker opens its own pools
        return threads * ranks, fds * ranks

    def stop_server(self) -> str:
        """SIGTERM vLLM's processes, SIGKILL what is left after the grace; returns how it ended."""
        how = "not running"
        pids = self.others()
        if pids:
            how = "SIGTERM"
            for pid in pids:
                _kill(pid, signal.SIGCONT)  # a frozen server must run to exit
                _kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            while time.monotonic() < deadline:
                self._reap()
                if not self.others():
                    break
                time.sleep(0.1)
            left = self.others()
            if left:
                how = "SIGKILL"
                for pid in left:
                    _kill(pid, signal.SIGKILL)
                end = time.monotonic() + 10.0
                while self.others() and time.monotonic() < end:
                    self._reap()
                    time.sleep(0.05)
        if self.proc is not None:
            try:  # a multi-threaded process shows as a zombie before all its threads are gone
                self.proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                pass
        return how

    def _reap(self) -> None:
        if self.proc is not None:
            self.proc.poll()

    # ------------------------------------------------------------------ control
    def stats(self) -> dict:
        """The answer to ``stats``, merged over the ControlServer's own ``pid``/``threads``/``fds``
        of this wrapper, so the runner's leak probes (``threads`` and ``fds``, which ``no_leaks``
        compares) see vLLM, not this 3-thread wrapper: its processes (every process of the group
        but this wrapper), counted from /proc after the ``/metrics`` scrape (which may start a
        thread in vLLM's API server, see :meth:`measure_ready`). ``group_threads``/``group_fds``
        are the sums now; ``threads``/``fds`` the same, floored at the counts at READY plus what
        the connector's lazy pools add with the first transfers (:func:`lazy_allowance`), so a
        healthy node's first scenario does not read as a leak and growth beyond that shows.
        ``sockets`` and ``processes`` too; this wrapper's own counts under ``wrapper_threads``
        and ``wrapper_fds``. ``pid`` stays this wrapper's (the probes match a final probe to its
        baseline by it)."""
        alive = self.server_alive() and self.healthy(timeout=SCRAPE_BUDGET_S / 2)
        scraped: dict = {}
        if alive:
            try:
                scraped = scrape(self.base, timeout=SCRAPE_BUDGET_S / 2)
            except MetricsError:
                pass
        pids = self.others()
        cpu_s, rss_mib = cpu_rss(pids)
        held = proc_counts(pids)
        mine = proc_counts([os.getpid()])
        lazy_t, lazy_f = self.allowance()
        ready = getattr(self, "ready_counts", None) or {"threads": -1, "fds": -1}
        counts = {"threads": floored(held["threads"], ready["threads"], lazy_t),
                  "fds": floored(held["fds"], ready["fds"], lazy_f),
                  "group_threads": held["threads"], "group_fds": held["fds"],
                  "sockets": held["sockets"], "processes": held["processes"],
                  "wrapper_threads": mine["threads"], "wrapper_fds": mine["fds"]}
        # the probe records keep ``counters`` (and threads/fds): the counts go there too, for the journal
        # ``started``: when this wrapper started (clock ticks since boot): a pod's container the
        # kubelet started again keeps its pod (the journal's pid), and no_busy_wait then splits the
        # node's series there instead of reading its CPU time as going backwards
        counters = {**scraped, "cpu_s": cpu_s, "rss_mib": rss_mib, "metrics_ok": int(bool(scraped)), **counts,
                    "started": started_ticks(), **self.waf_counts()}
        return {"alive": alive, "role": self.role, "server_pid": self.proc.pid if self.proc else None,
                "engine_id": self.engine_id, "cpu_s": cpu_s, "rss_mib": rss_mib, **counts,
                "ready_threads": ready["threads"], "ready_fds": ready["fds"],
                "lazy_threads": lazy_t, "lazy_fds": lazy_f, "counters": counters}

    def waf_counts(self) -> dict:
        """The write-after-free watcher's counts (``waf_*``; ``waf_watching`` 1 when this node runs
        it, ``waf_ok`` 1 when its file was read: counts only), {} when it does not run here."""
        if self.waf_file is None:
            return {}
        try:
            data = json.loads(self.waf_file.read_text())
        except (OSError, ValueError):
            return {"waf_watching": 1, "waf_ok": 0}
        out = {"waf_watching": 1, "waf_ok": 1}
        for k, v in data.items() if isinstance(data, dict) else ():
            if isinstance(v, int) and not isinstance(v, bool):
                out[f"waf_{k}"] = v
        return out

    def metrics(self, msg: dict) -> dict:  # noqa: ARG002
        return {"counters": scrape(self.base, timeout=SCRAPE_BUDGET_S)}

    def rank_signal(self, msg: dict) -> dict:
        """``rank_signal {rank, signal: STOP|CONT}``: signal the worker process of one tensor-parallel
        rank (vLLM names it ``VLLM::Worker_TP<rank>``); ``pids`` it signalled, ``stopped`` 1 when every
        one was then seen stopped (state T)."""
        rank, sig = msg.get("rank"), {"STOP": signal.SIGSTOP, "CONT": signal.SIGCONT}.get(msg.get("signal"))
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0 or sig is None:
            raise ValueError("expected an int rank >= 0 and signal STOP or CONT")
        pids = rank_pids(self.others(), rank)
        if not pids:
            raise ValueError(f"no worker process of rank {rank} (tensor_parallel_size {self.args.tensor_parallel_size})")
        for pid in pids:
            _kill(pid, sig)
        stopped = sig == signal.SIGSTOP and all(_state(pid) == "T" for pid in pids)
        return {"pids": pids, "stopped": int(stopped)}


def rank_pids(pids: list[int], rank: int) -> list[int]:
    """Those of ``pids`` whose process title names tensor-parallel rank ``rank`` (``Worker_TP<rank>``)."""
    want = re.compile(rf"Worker_TP{rank}(\b|_)")
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                title = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if want.search(title):
            found.append(pid)
    return found


def _state(pid: int) -> str:
    try:
        for _ in range(20):
            with open(f"/proc/{pid}/stat", "rb") as fh:
                state = fh.read().decode(errors="replace").rsplit(")", 1)[-1].split()[0]
            if state == "T":
                return state
            time.sleep(0.01)
        return state
    except (OSError, IndexError):
        return "?"


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_node(args: argparse.Namespace) -> int:
    """The node's life (see the module docstring). Written here rather than with
    nodekit.nodeio.run_node: that lifecycle binds in an instant and maps only a ZMQ bind error to
    exit 2, while this node waits minutes for a child it must be able to stop meanwhile."""
    import zmq

    try:
        node = VllmNode(args)
    except NodeUsageError as exc:
        return usage_exit(str(exc))
    setup_logging(args.log_level)
    stop = threading.Event()

    def on_signal(signum, frame):  # noqa: ARG001
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        node.start()  # before any thread of ours exists
    except OSError as exc:
        return usage_exit(f"cannot start {node.vllm_bin}: {exc.strerror or exc}")
    log.info("vllm %s: started pid %d on %s (bootstrap port %d, policy %s, core %s), its log in %s",
             node.role, node.proc.pid, node.base, args.bootstrap_port, args.policy, args.cpu_core, node.server_log)

    watch_parent(stop)  # the runner died (SIGKILL): stop like on SIGTERM
    server = None
    code = 0
    try:
        if args.control:
            from nodekit.control import ControlServer

            try:
                server = ControlServer(args.control, handlers={"metrics": node.metrics, "rank_signal": node.rank_signal},
                                       stats=node.stats)
            except zmq.ZMQError as exc:
                return usage_exit(f"--control: cannot bind {args.control!r}: {exc.strerror}")
            server.start()
        why = node.wait_ready(stop)
        if why:
            print(f"error: {why}", file=sys.stderr, flush=True)
            return 2
        if why == "":
            return 0
        took = time.monotonic() - node.t_start
        _, rss = cpu_rss(node.others())
        ready = node.measure_ready()
        log.info("vllm %s: healthy after %.1f s (%d processes, RSS %.0f MiB, %d threads, %d fds; allowance %d/%d)%s",
                 node.role, took, len(node.others()), rss, ready["threads"], ready["fds"], *node.allowance(),
                 " engine known" if node.engine_id else "")
        announce_ready()
        while not stop.wait(0.5):
            if not node.server_alive():
                print(f"error: vLLM ({node.role}, pid {node.proc.pid}) exited with code {node.proc.returncode} "
                      f"while serving (its log: {node.server_log})", file=sys.stderr, flush=True)
                code = 1
                break
    finally:
        how = node.stop_server()
        log.info("vllm %s: stopped (%s)", node.role, how)
        if server is not None:
            server.close()
    return code
