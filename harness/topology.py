"""The generic part of every family's topology: nodes with roles, as OS processes.

A topology is the set of nodes of one scenario run (Jepsen's db, per node): each node has a
**role** (``server``, ``interposer``, later ``prefill:0``, ``decode:0``, ``proxy``), a kind (what
``pdchaos node KIND`` runs), its process, its log, and its control channel. Families subclass
:class:`BaseTopology`, say which nodes exist and how each role is (re)started
(:meth:`node_spec`), and start them in :meth:`start`. Everything else is here and works for any
family: process faults by role (kill, stop/cont, restart, swap), probes of threads, fds and
counters (baseline when a node starts, ``last`` before it is stopped, ``final`` at the end), links
through Toxiproxy or across two network namespaces, and a teardown that leaves nothing behind.

This object is the FaultContext of faults/base.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from nodekit.control import ControlClient, ControlError

from .errors import HarnessError
from .procs import node_command
from .runtime import Launch, NodeHandle, load_runtime

PROBE_TIMEOUT_MS = 1000
LAST_PROBE_TIMEOUT_MS = 300  # before a stop or kill: a frozen node must not hold the fault up


def sweep_stale_tmp() -> None:
    """Remove ipc folders of runners that no longer exist (killed before their teardown)."""
    for d in Path(tempfile.gettempdir()).glob("pdc-*-*"):
        pid = d.name.split("-")[1]
        if not pid.isdigit() or not d.is_dir():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:
            pass


_PORTS_GIVEN: dict[int, None] = {}  # the ports handed out lately, oldest first
_PORTS_LOCK = threading.Lock()
_PORTS_REMEMBERED = 4096
_PORT_LOW = 20000  # ports handed out lie in [_PORT_LOW, below the kernel's ephemeral range)
_PORT_MARGIN = 64  # room above a handed-out port for ports nodes derive from it (port + rank)
_PORT_RANDOM = random.SystemRandom()  # not the module's generator: runs seed that one


def _ephemeral_low() -> int:
    """The lowest port the kernel gives to outgoing connections and ``bind(0)`` (Linux reads it from
    /proc; elsewhere the IANA range's start, which macOS uses)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _given(port: int) -> int:
    _PORTS_GIVEN[port] = None
    while len(_PORTS_GIVEN) > _PORTS_REMEMBERED:
        del _PORTS_GIVEN[next(iter(_PORTS_GIVEN))]
    return port


PORT_SLICE_ENV = "PDCHAOS_PORT_SLICE"


def _port_slice(low: int, high: int) -> tuple[int, int]:
    """``PDCHAOS_PORT_SLICE=I/N``: this process (and the nodes it starts, which inherit it) hands
    out ports from the I-th of N equal parts of [low, high) only, so N harness processes on one
    machine (e.g. pytest's workers) never pick the same port. Unset: the whole range."""
    raw = os.environ.get(PORT_SLICE_ENV, "").strip()
    if not raw:
        return low, high
    try:
        i, n = (int(x) for x in raw.split("/"))
        if not 0 <= i < n:
            raise ValueError
    except ValueError:
        raise HarnessError(f"{PORT_SLICE_ENV}={raw!r}: expected I/N with 0 <= I < N") from None
    part = (high - low) // n
    return low + i * part, low + (i + 1) * part - _PORT_MARGIN


def free_tcp_port() -> int:
    """A TCP port on loopback that is free now and was not handed out lately by this process.

    Ports come from below the kernel's ephemeral range, picked at random: a port the kernel hands
    out (``bind(0)``) can be taken again by any process's outgoing connection before the node that
    was given it binds it (CI once saw a layerwise D fail with "Address already in use" on its
    listener port while its own torch.distributed store connected), and the kernel never gives a
    port outside that range to a connection. The memory of ports handed out keeps one topology,
    which asks for many before any node binds, from getting one twice. Where the ephemeral range
    starts too low to leave room, it falls back to ``bind(0)``."""
    low, high = _port_slice(_PORT_LOW, min(_ephemeral_low(), 65536) - _PORT_MARGIN)
    with _PORTS_LOCK:
        if high - low >= 1024:  # from a random start, the first port free and not given
            span = high - low
            start = _PORT_RANDOM.randrange(span)
            for i in range(span):
                port = low + (start + i) % span
                if port not in _PORTS_GIVEN and _port_free(port):
                    return _given(port)
        else:
            for _ in range(256):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind(("127.0.0.1", 0))
                    port = s.getsockname()[1]
                if port not in _PORTS_GIVEN:
                    return _given(port)
    raise HarnessError("no free TCP port on loopback that was not handed out lately")


@dataclass
class NodeSpec:
    """How to start the node of one role: ``pdchaos node KIND ARGS`` on ``side`` of the link."""

    kind: str
    args: list[str]
    side: str = "b"  # with a netns link: "a" (client side) or "b" (server side)
    control: bool = True  # answers the control channel (stats, and the node's own commands)
    ready_timeout_s: float = 10.0
    endpoints: dict[str, str] = field(default_factory=dict)  # name -> address, for faults and reports


@dataclass
class Node:
    """A running node: its role, kind, handle (harness/runtime.py: a process or a pod, and its
    log), control channel and endpoints."""

    role: str
    kind: str
    handle: NodeHandle
    control_ep: str | None
    client: ControlClient | None
    endpoints: dict[str, str] = field(default_factory=dict)
    baseline: dict | None = None
    frozen: bool = False
    pool_key: tuple | None = None  # set when the node may go back to the node pool at close
    pooled: Any = None  # the harness.pool.PooledNode it was taken from, if any

    @property
    def log(self) -> str | None:
        return self.handle.log_path


class BaseTopology:
    """Nodes by role; a family subclass implements :meth:`node_spec` and :meth:`start`."""

    workload_kind = "workload"
    workload_ready_timeout_s = 15.0  # a workload that prepares (e.g. reference outputs) takes longer
    fault_bound_s = 15.0  # the longest one fault start or heal may take (a heal may restart a node)

    def __init__(self, scenario: Any, target: str, run_dir: Path, record: Callable[[dict], None],
                 services: dict[str, Any] | None = None):
        self.scenario = scenario
        fam = scenario.family
        self.family_name = fam if isinstance(fam, str) else fam.name
        self.target = target
        self.run_dir = run_dir
        self.logs = run_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self._record = record
        self.services = services or {}
        self.rng = random.Random(scenario.seed)
        self.deadline = scenario.deadline  # seconds: faults judge what a delay should cause
        sweep_stale_tmp()
        # short (unix socket paths max 107 bytes), and named after the runner's pid so a folder
        # left by a runner that was killed outright can be recognised and swept by the next run
        self.tmp = Path(tempfile.mkdtemp(prefix=f"pdc-{os.getpid()}-"))
        self.nodes: dict[str, Node] = {}
        self._retired: list[NodeHandle] = []  # processes stopped, killed or replaced during the run
        self._clients: dict[str, ControlClient] = {}
        self._n = 0
        self._lock = threading.Lock()
        self.netns = None  # a faults.netns.NetnsPair when the family links two namespaces
        self.toxiproxy = self.services.get("toxiproxy")
        self.proxy_name: str | None = None  # the Toxiproxy proxy in the faulted link, if any
        self.pool = self.services.get("node_pool")  # a harness.pool.NodePool: warm nodes between runs
        self._kept: list[NodeHandle] = []  # processes given to the pool at close (alive on purpose)
        # where the nodes run (harness/runtime.py): the runner's choice for the family's launch
        # profile, local processes by default
        self.runtime = self.services.get("runtime") or load_runtime()
        # this run's part of it (a namespace on a cluster), named after the run folder
        self.run_id = "r" + hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:9]  # a DNS label, never a number
        self.placement = self.runtime.open(self.run_id, self.services.get("runtime_profile"), target)
        self.placement.cancel = self.services.get("interrupted")  # the runner's stop event, if any
        self._placement_left: list[str] = []

    # ------------------------------------------------------------------ family hooks
    def node_spec(self, role: str) -> NodeSpec:
        """How the node in ``role`` is started (and restarted after a fault)."""
        raise HarnessError(f"this topology has no role {role!r}")

    def start(self) -> None:
        """Start the nodes and links, then return (the workload is started by the runner)."""
        raise NotImplementedError

    def pool_key(self, role: str) -> tuple | None:
        """The key under which the node of ``role`` may be pooled (every start setting that
        matters), or None: never pooled (the default)."""
        return None

    def reusable(self, role: str, stats: dict) -> str | None:
        """None when the node of ``role`` (its stats just read) can serve another scenario; else
        why not. The default: alive."""
        return None if stats.get("alive", True) else "not alive"

    def journal_part(self, role: str) -> Path:
        """Where the node of ``role`` may write its own journal records (observations, state
        transitions; JSON lines with a ``t``): the runner merges every part by time at the end."""
        return self.run_dir / f"{role.replace(':', '-')}.part.jsonl"

    def phase_files(self) -> dict[str, Path]:
        """Where the nodes append their protocol phase events (harness/phases.py): role -> a
        JSON-lines file, asked again at every poll (a node started again may write a new one).
        Empty: this topology's nodes journal no phases (a fault keyed on one never starts)."""
        return {}

    def workload_args(self, config_path: Path, journal_part: Path) -> list[str]:
        return ["--config", str(config_path), "--journal", str(journal_part)]

    def workload_config(self) -> dict:
        """The workload node's configuration (written to workload.json)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ nodes
    def spawn(self, kind: str, args: list[str], *, side: str = "b", log_name: str | None = None,
              ready_timeout_s: float = 10.0, role: str = "", endpoints: dict | None = None,
              runtime: Any = None) -> NodeHandle:
        """Start a ``pdchaos node`` through the run's runtime; with a netns link inside its
        namespace (ipc control sockets live in the file system, so they work across namespaces)."""
        with self._lock:
            self._n += 1
            n = self._n
        launch = self.launch(kind, args, role=role, side=side, ready_timeout_s=ready_timeout_s, endpoints=endpoints,
                             log_path=str(self.logs / (log_name or f"{n:02d}-{kind}.log")))
        placement = self.placement if runtime is None else runtime.open(self.run_id)
        if placement is not self.placement:
            placement.cancel = self.placement.cancel  # the run's interrupt ends its wait too
        handle = placement.start(launch, self.netns)
        # the command as the harness started it (pdchaos repro shows it; never a prompt or a key)
        self.event("process_start", kind=kind, pid=handle.instance, role=launch.role, argv=list(launch.argv),
                   env=dict(launch.env), **handle.identity())
        return handle

    def launch(self, kind: str, args: list[str], *, role: str = "", side: str = "b", ready_timeout_s: float = 10.0,
               endpoints: dict | None = None, log_path: str | None = None) -> Launch:
        """How the runtime is to start ``pdchaos node KIND ARGS`` (``--dry-run`` asks it too)."""
        return Launch(role=role or kind, kind=kind, argv=node_command(kind, args), name=f"node {kind}",
                      log_path=log_path, ready_timeout_s=ready_timeout_s, side=side,
                      env={"PDCHAOS_FAMILY": self.family_name},  # where the node finds its kind
                      endpoints=dict(endpoints or {}), workdir=str(self.run_dir))

    def control_endpoint(self, role: str) -> str:
        placed = self.placement.control_endpoint(role)
        if placed is not None:  # a node that is not on this machine (a pod)
            return placed
        if self.pool is not None and self.pool_key(role) is not None:
            return self.pool.control_endpoint(role)  # outlives this run's ipc folder
        return f"ipc://{self.tmp}/{role.replace(':', '-')}-ctl.sock"

    def take_pooled(self, role: str) -> Any:
        """A warm node for ``role`` from the pool (harness.pool.PooledNode), or None. The caller
        adopts it with :meth:`adopt` (after using its ``extra``, e.g. its ports)."""
        key = self.pool_key(role)
        if self.pool is None or key is None:
            return None
        return self.pool.take(key)

    def adopt(self, role: str, pooled: Any) -> Node | None:
        """Make a pooled node this run's node of ``role``: a new control client, a fresh baseline
        probe. None (the node is stopped) when it does not answer or is not reusable."""
        client = ControlClient(pooled.control_ep) if pooled.control_ep else None
        node = Node(role, pooled.kind, pooled.handle, pooled.control_ep, client, dict(pooled.endpoints),
                    pool_key=pooled.key, pooled=pooled)
        stats = None
        if client is not None:
            try:
                stats = client.call("stats", timeout_ms=PROBE_TIMEOUT_MS * 3)
            except ControlError:
                stats = None
        why = "no answer" if client is not None and stats is None else (self.reusable(role, stats) if stats else None)
        if why:
            if client is not None:
                client.close()
            self.event("pool_reject", role=role, kind=pooled.kind, pid=pooled.handle.instance, why=why)
            self.pool.discard(pooled)
            return None
        if client is not None:
            old = self._clients.pop(role, None)
            if old is not None:
                old.close()
            self._clients[role] = client
        self.nodes[role] = node
        self.event("node_reused", role=role, kind=pooled.kind, pid=pooled.handle.instance, first_run=pooled.first_run,
                   reuses=pooled.reuses, log=pooled.handle.log_path)
        if client is not None:
            node.baseline = self.probe_node(node, "baseline", stats)
        return node

    def start_node(self, role: str, spec: NodeSpec | None = None) -> Node:
        """Start the node of ``role`` (no-op if it runs); record its baseline probe."""
        cur = self.nodes.get(role)
        if cur is not None and cur.handle.alive and spec is None:
            return cur
        spec_given = spec  # a swapped-in node (a fake peer) is never pooled
        spec = spec or self.node_spec(role)
        ctl = self.control_endpoint(role) if spec.control else None
        args = list(spec.args) + (["--control", ctl] if ctl else [])
        proc = self.spawn(spec.kind, args, side=spec.side, ready_timeout_s=spec.ready_timeout_s, role=role,
                          endpoints=spec.endpoints)
        client = None
        if ctl:
            # one kept-open client per role, reused across restarts: it reconnects to the new
            # process on the same endpoint (a new client per start would leave the old one
            # connected, and the node's fd count would grow with every restart)
            client = self._clients.get(role)
            if client is not None and client.endpoint != ctl:  # a pooled role gets a new endpoint per start
                client.close()
                client = None
            if client is None:
                client = self._clients[role] = ControlClient(ctl)
        node = Node(role, spec.kind, proc, ctl, client, dict(spec.endpoints),
                    pool_key=self.pool_key(role) if self.pool is not None and spec_given is None else None)
        self.nodes[role] = node
        if ctl:  # the first call also makes the connection (through the runtime: its grace)
            node.baseline = self.probe_node(node, "baseline",
                                            timeout_ms=PROBE_TIMEOUT_MS + int(self.placement.control_grace_s * 1000))
        return node

    def start_nodes(self, roles: list[str]) -> None:
        """Start several nodes at once (each in its own thread: slow starters such as vLLM servers
        then cost the slowest one, not the sum); the first failure is raised after all ended."""
        errors: list[BaseException] = []

        def one(role: str) -> None:
            try:
                self.start_node(role)
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(r,), name=f"start-{r}") for r in roles]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if errors:
            raise errors[0]

    def node(self, role: str) -> Node:
        n = self.nodes.get(role)
        if n is None:
            raise HarnessError(f"no node with role {role!r} (roles: {', '.join(self.nodes) or 'none'})")
        return n

    def roles(self, spec: str) -> list[str]:
        """A node spec (``server``, ``prefill:0``, ``prefill:*``, ``all``) -> roles, in order."""
        if spec == "all":
            return list(self.nodes)
        if spec.endswith(":*"):
            found = [r for r in self.nodes if r.startswith(spec[:-1])]
        else:
            found = [spec] if spec in self.nodes else []
        if not found:
            raise HarnessError(f"node {spec!r}: no such role (roles: {', '.join(self.nodes) or 'none'})")
        return found

    def stale_peers(self, role: str) -> list[str]:
        """Roles whose processes keep state about the node of ``role`` that its replacement
        invalidates (e.g. a connection pool to its endpoints): when it is stopped or killed they
        are tainted, never lent to a later scenario that would inherit the damage. Families say."""
        return []

    def _retire(self, role: str, how: str) -> Node | None:
        node = self.nodes.pop(role, None)
        if node is None:
            return None
        for peer in self.stale_peers(role):
            self.taint(peer, f"it holds state about {role}, which was {'killed' if how == 'kill' else 'stopped'}")
        if node.client is not None and node.handle.alive and not node.frozen:
            self.probe_node(node, "last", timeout_ms=LAST_PROBE_TIMEOUT_MS)
        self._retired.append(node.handle)
        if how == "kill":
            node.handle.kill()
            self.event("process_kill", kind=node.kind, role=role, pid=node.handle.instance)
        else:
            if node.frozen:  # a stopped process cannot handle SIGTERM until it runs again
                self._thaw(node, quiet=True)
            node.handle.stop(2.0)
            self.event("process_stop", kind=node.kind, role=role, pid=node.handle.instance,
                       returncode=node.handle.returncode)
        return node

    def stop_node(self, role: str) -> bool | None:
        """Stop the node; whether its process was seen gone after (None: no such node)."""
        node = self._retire(role, "stop")
        return None if node is None else node.handle.gone()

    def kill_node(self, role: str) -> bool | None:
        """SIGKILL the node; whether its process was seen gone after (None: no such node)."""
        node = self._retire(role, "kill")
        return None if node is None else node.handle.gone()

    def restart_node(self, role: str, *, kill: bool = False) -> bool | None:
        """Stop (or kill) the node and start it again; whether a new process replaced the old one."""
        old = self._retire(role, "kill" if kill else "stop")
        new = self.start_node(role)
        if old is None:
            return None
        return old.handle.gone() and new.handle.alive and new.handle.instance != old.handle.instance

    def swap_node(self, role: str, spec: NodeSpec) -> None:
        """Replace the node of ``role`` by another (e.g. a fake peer on the same endpoints);
        ``restore_node`` puts the real one back."""
        self._retire(role, "stop")
        self.start_node(role, spec)

    def restore_node(self, role: str) -> None:
        self._retire(role, "stop")
        self.start_node(role)

    def _thaw(self, node: Node, quiet: bool = False) -> None:
        """Thaw through the handle; ``quiet`` (teardown): a thaw that fails is journalled, not
        raised, so the rest of the teardown (the other nodes, the placement) still happens."""
        try:
            node.handle.thaw()
        except HarnessError as exc:
            self.event("thaw_failed", kind=node.kind, role=node.role, error=str(exc)[:300])
            if not quiet:
                raise
            return
        self.event("process_signal", kind=node.kind, role=node.role, pid=node.handle.instance, signal="SIGCONT")

    def freeze_node(self, role: str) -> bool | None:
        """Freeze every process of the node (through its handle: SIGSTOP to a local process
        group); whether it was then seen frozen (None: the runtime cannot tell)."""
        node = self.node(role)
        if not node.handle.alive:
            raise HarnessError(f"freeze: node {role!r} is not running")
        node.frozen = True  # first: a freeze that failed half-way is still thawed at heal and teardown
        self.event("process_signal", kind=node.kind, role=role, pid=node.handle.instance, signal="SIGSTOP")
        try:
            return node.handle.freeze()
        except HarnessError as exc:
            self.event("freeze_failed", kind=node.kind, role=role, error=str(exc)[:300])
            raise

    def thaw_node(self, role: str) -> None:
        node = self.node(role)
        if not node.handle.alive:
            raise HarnessError(f"thaw: node {role!r} is not running")
        self._thaw(node)
        node.frozen = False

    # ------------------------------------------------------------------ control and probes
    def control(self, role: str, cmd: str, timeout_ms: int = 2000, **fields: Any) -> dict:
        node = self.node(role)
        if node.client is None:
            raise HarnessError(f"node {role!r} has no control channel")
        return node.client.call(cmd, timeout_ms=timeout_ms, **fields)

    def node_stats(self, role: str, timeout_ms: int = PROBE_TIMEOUT_MS) -> dict | None:
        """Stats of the node in ``role``, or None if it is down, frozen or does not answer."""
        node = self.nodes.get(role)
        if node is None or node.client is None or not node.handle.alive or node.frozen:
            return None
        try:
            return node.client.call("stats", timeout_ms=timeout_ms)
        except ControlError:
            return None

    def probe_node(self, node: Node, when: str, stats: dict | None = None,
                   timeout_ms: int = PROBE_TIMEOUT_MS) -> dict | None:
        if stats is None and node.client is not None and node.handle.alive and not node.frozen:
            try:
                stats = node.client.call("stats", timeout_ms=timeout_ms)
            except ControlError:
                stats = None
        if stats is None:
            self.event("probe_silent", role=node.role, kind=node.kind, pid=node.handle.instance, when=when)
            return None
        # a node's counts read earlier than now (attach mode's stand-in reads a pod's /proc every
        # few seconds) carry their own time: a rate over two probes is over the time between readings
        t = stats.get("t_sampled")
        t = t if isinstance(t, (int, float)) and not isinstance(t, bool) and t <= time.monotonic() else time.monotonic()
        probe = {"type": "probe", "node": node.role, "kind": node.kind, "when": when, "t": t,
                 "pid": self._pid(node, stats), "threads": stats.get("threads"), "fds": stats.get("fds"),
                 "counters": stats.get("counters", {}), "alive": bool(stats.get("alive", True))}
        self._record(probe)
        return probe

    def _pid(self, node: Node, stats: dict) -> Any:
        """The process a probe saw, as the journal names it: its pid where pids are unique (this
        machine), else the handle's instance (a pod: its uid, as the node's events name it)."""
        return stats.get("pid") if self.placement.pids_unique else node.handle.instance

    def probe(self, role: str, when: str) -> dict | None:
        return self.probe_node(self.node(role), when)

    def final_probe(self, timeout_s: float = 1.0) -> None:
        """Record the final probe of every node with a control channel, once its threads and fds
        are back to its baseline (threads of a healed fault wind down for a moment) or
        ``timeout_s`` passed. A node that does not answer is recorded as ``probe_silent``."""
        deadline = time.monotonic() + timeout_s
        for role, node in list(self.nodes.items()):
            if node.client is None:
                continue
            base = node.baseline or {}
            stats = self.node_stats(role)
            while stats is not None and time.monotonic() < deadline and self._pid(node, stats) == base.get("pid") \
                    and (stats.get("threads", 0) > base.get("threads", 0) or stats.get("fds", 0) > base.get("fds", 0)):
                time.sleep(0.05)
                stats = self.node_stats(role)
            if stats is None:
                self.event("probe_silent", role=role, kind=node.kind, pid=node.handle.instance, when="final")
            else:
                self.probe_node(node, "final", stats)

    # ------------------------------------------------------------------ sampling
    sample_interval_s: float | None = None  # a family that wants node gauges over time sets it

    def start_sampling(self) -> None:
        """While the workload runs, probe every node with a control channel every
        ``sample_interval_s`` (``when: "sample"``): node gauges over time for checks and plots. A
        node that is down, frozen or silent is simply not sampled then."""
        if not self.sample_interval_s or getattr(self, "_sampler", None) is not None:
            return
        self._sampling = threading.Event()

        def loop() -> None:
            while not self._sampling.wait(self.sample_interval_s):
                for role in list(self.nodes):
                    stats = self.node_stats(role, timeout_ms=500)
                    node = self.nodes.get(role)
                    if stats is not None and node is not None:
                        self.probe_node(node, "sample", stats)

        self._sampler = threading.Thread(target=loop, name="sampler", daemon=True)
        self._sampler.start()

    def stop_sampling(self) -> None:
        sampler = getattr(self, "_sampler", None)
        if sampler is not None:
            self._sampling.set()
            sampler.join(5.0)
            self._sampler = None

    # ------------------------------------------------------------------ workload
    @property
    def horizon_path(self) -> Path:
        """The file through which the runner extends the workload's end (nodekit.workload.Horizon)."""
        return self.run_dir / "workload.horizon"

    def start_workload(self, journal_part: Path) -> NodeHandle:
        """The workload node (the client side), configured by :meth:`workload_config`."""
        cfg_path = self.run_dir / "workload.json"
        # the runner may move the workload's end later by writing this file (nodekit/workload.py)
        cfg_path.write_text(json.dumps({**self.workload_config(), "horizon_path": str(self.horizon_path)}))
        # the client runs beside the harness (the default runtime), whatever runtime the nodes use
        return self.spawn(self.workload_kind, self.workload_args(cfg_path, journal_part), side="a",
                          log_name="client-workload.log", ready_timeout_s=self.workload_ready_timeout_s,
                          role="workload", runtime=load_runtime())  # the default: local

    # ------------------------------------------------------------------ links
    def make_netns(self) -> Any:
        """A network-namespace pair for the run's nodes; None where the runtime's own network
        is the link (pods: each is a host of its own, and the runtime's faults cut between them)."""
        from faults.netns import NetnsPair

        if not self.placement.harness_links:
            self.event("link", kind="runtime", to=f"the {self.runtime.name} runtime's network")
            return None

        self.netns = NetnsPair().create()
        return self.netns

    def toxiproxy_link(self, name: str, upstream_hostport: str) -> str:
        """A Toxiproxy proxy in front of ``upstream_hostport``; returns the host:port to dial
        (``upstream_hostport`` itself where the runtime's network is the link: its faults act there)."""
        if not self.placement.harness_links:
            return upstream_hostport
        if self.toxiproxy is None:
            raise HarnessError("link toxiproxy: no toxiproxy-server running")
        listen = f"127.0.0.1:{free_tcp_port()}"
        self.toxiproxy.create_proxy(name, listen=listen, upstream=upstream_hostport)
        self.proxy_name = name
        return listen

    def taint(self, role: str, why: str) -> None:
        """A fault may have left the node of ``role`` broken in a way its stats cannot show (e.g. a
        listener thread that died): it is never lent to a later scenario."""
        node = self.nodes.get(role)
        if node is not None and node.pool_key is not None:
            node.pool_key = None
            self.event("node_tainted", role=role, why=why)

    # ------------------------------------------------------------------ teardown
    def pool_extra(self, role: str) -> dict[str, Any]:
        """Family data a pooled node keeps (e.g. its ports), given back by :meth:`take_pooled`."""
        return {}

    def _give_to_pool(self, role: str, node: Node) -> bool:
        if self.pool is None or node.pool_key is None or node.frozen or not node.handle.alive:
            return False
        try:
            stats = node.client.call("stats", timeout_ms=PROBE_TIMEOUT_MS * 3) if node.client is not None else {}
            why = self.reusable(role, stats)
        except ControlError as exc:
            why = str(exc)
        if why:
            self.event("not_pooled", role=role, kind=node.kind, pid=node.handle.instance, why=why)
            return False
        from .pool import PooledNode

        p = node.pooled or PooledNode(node.pool_key, node.kind, node.handle, node.control_ep, dict(node.endpoints),
                                      self.pool_extra(role), first_run=str(self.run_dir))
        self.pool.give(p)
        self._kept.append(node.handle)
        self.event("node_pooled", role=role, kind=node.kind, pid=node.handle.instance)
        return True

    def close(self) -> None:
        try:
            self._close_nodes()
        finally:  # whatever a node did, the run's placement (a cluster namespace) is removed
            self._placement_left = self.placement.close()

    def _close_nodes(self) -> None:
        for role in reversed(list(self.nodes)):
            node = self.nodes.pop(role)
            try:
                if self._give_to_pool(role, node):
                    continue
                if node.frozen:
                    self._thaw(node, quiet=True)
                self._retired.append(node.handle)
                node.handle.stop(2.0)
            except Exception as exc:  # noqa: BLE001 - one node must not keep the others (and the links) up
                self.event("close_failed", role=role, kind=node.kind, error=f"{type(exc).__name__}: {str(exc)[:200]}")
        if self.toxiproxy is not None and self.proxy_name is not None:
            try:
                self.toxiproxy.delete_proxy(self.proxy_name)
            except Exception:  # the server may be gone already; the run's teardown stops it
                pass
        for c in self._clients.values():
            c.close()
        if self.netns is not None:
            self.netns.cleanup()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def handles(self) -> list[NodeHandle]:
        """Every process this topology started or adopted (check them after close())."""
        return [n.handle for n in self.nodes.values()] + list(self._retired)

    def kept(self) -> list[NodeHandle]:
        """The processes close() gave to the node pool: alive on purpose."""
        return list(self._kept)

    def leftovers(self) -> list[str]:
        """What close() could not remove: the ipc folder."""
        return ([str(self.tmp)] if self.tmp.exists() else []) + list(self._placement_left)

    def event(self, what: str, **fields: Any) -> None:
        self._record({"type": "event", "what": what, "t": time.monotonic(), **fields})
