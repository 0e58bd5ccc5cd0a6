"""Node runtimes: a node is a **handle**, not a pid.

A run's topology starts each of its nodes through a :class:`Runtime` and keeps the
:class:`NodeHandle` it gets back. Faults, checks and the journal reach a node through that handle
(stop, kill, freeze/thaw, alive, logs) and its control channel (gauges), never through a process
id: the same scenarios then run on local processes (``runtimes/local``) or on Kubernetes pods
(``runtimes/k8s``), and the core names neither.

A runtime says what it can do (:attr:`Runtime.provides`: ``kill``, ``freeze``, ``netns``,
``toxiproxy``, ...). A scenario whose faults or topology need something the runtime of its launch
profile lacks, and that the runtime does not translate into a fault of its own
(:meth:`Runtime.translates`: Kubernetes turns ``kill`` into a Chaos Mesh ``PodChaos``), is left
out of the plan before anything starts, with the reason, like any other exclusion.

Runtimes are found by name: a folder of the top-level ``runtimes`` package, or an entry point of
the ``pdchaos.runtimes`` group (its object: a :class:`Runtime` subclass or instance).
"""

from __future__ import annotations

import abc
import importlib
import importlib.metadata
import importlib.util
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from .errors import HarnessError, UsageError

BUILTIN_PACKAGE = "runtimes"
ENTRY_POINT_GROUP = "pdchaos.runtimes"
DEFAULT = "local"

# What a node handle can be asked to do: the names faults and topologies put in ``requires``.
NODE_OPS = ("stop", "kill", "freeze", "restart")


@dataclass
class Launch:
    """How to start one node: ``pdchaos node KIND ARGS`` (``argv``), for ``role``."""

    role: str
    kind: str
    argv: list[str]
    name: str
    log_path: str | None = None
    ready_timeout_s: float | None = 10.0
    env: dict[str, str] = field(default_factory=dict)
    side: str = "b"  # with a harness-made network-namespace pair: which side (local runtime)
    endpoints: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None  # the run folder: paths under it are the run's files


class NodeHandle(abc.ABC):
    """A started node. Every method is idempotent, bounded in time, and never raises for a node
    that is already gone (``stop``/``kill`` return its exit code, or None where there is none)."""

    name: str
    log_path: str | None = None

    @property
    @abc.abstractmethod
    def instance(self) -> Any:
        """This start's identity (a new one per start of the same role): the journal's ``pid``
        field, which the node's own stats report too, so probes and events of one start join."""

    @property
    @abc.abstractmethod
    def alive(self) -> bool: ...

    @property
    def returncode(self) -> int | None:
        return None

    @abc.abstractmethod
    def stop(self, timeout_s: float = 5.0) -> int | None:
        """A clean stop (a frozen node is thawed first), then a kill after ``timeout_s``."""

    @abc.abstractmethod
    def kill(self) -> int | None:
        """Gone at once, no clean shutdown (crash scenarios)."""

    def freeze(self) -> bool | None:
        """Every process of the node stops running (its sockets stay open): whether it was then
        seen frozen (None: cannot tell). A runtime without it does not provide ``freeze``."""
        raise HarnessError(f"{self.name}: this runtime cannot freeze a node")

    def thaw(self) -> None:
        raise HarnessError(f"{self.name}: this runtime cannot thaw a node")

    def gone(self, wait_s: float = 2.0) -> bool:
        """Seen ended within ``wait_s`` (a kill is not instant)."""
        import time

        end = time.monotonic() + wait_s
        while self.alive and time.monotonic() < end:
            time.sleep(0.01)
        return not self.alive

    def identity(self) -> dict:
        """What the runtime knows this node as, for the journal (a pod's name, uid and container
        id as the kubelet reports it); nothing beyond ``instance`` locally."""
        return {}

    def proc_counts(self) -> dict | None:
        """The node's processes as its host sees them: ``threads``, ``fds``, ``processes`` and
        ``cpu_s`` (user + system seconds), summed, and ``started`` (when the node's first process
        started, in the runtime's own unit: another value is another start); None where the
        runtime cannot count them. Used
        for nodes the harness did not start and so has no control channel of its own in
        (attach mode): a node the harness started reports these on its control channel."""
        return None

    def log_tail(self, n_bytes: int = 2000) -> str:
        return ""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} instance={self.instance} alive={self.alive}>"


class Placement(abc.ABC):
    """One run's nodes in a runtime (a namespace on a cluster; nothing locally): opened by the
    topology, closed at its end (everything it made goes, also after Ctrl-C)."""

    #: whether the harness makes the run's links itself (network-namespace pairs, Toxiproxy
    #: proxies in front of a node): locally yes; on a cluster the pods' network is the link and
    #: the runtime's own faults (Chaos Mesh) act on it
    harness_links = True
    #: whether the run's nodes share this machine (and its cores: a family may pin them)
    shared_host = True
    #: whether a node's own pid names its process in the journal: on one host pids are unique; in
    #: pods each numbers its own (P's and D's node are both pid 9), so the handle's instance does
    pids_unique = True
    #: how much longer than on this machine a node's first control call may take (its connection
    #: is made through the runtime, e.g. a port-forward over the API server)
    control_grace_s = 0.0
    #: whether a node may outlive its scenario run and serve the next (warm reuse, harness/pool.py):
    #: not where the run's end removes everything it made (a cluster's namespace)
    lends_nodes = True
    #: set when the run is interrupted (Ctrl-C): a placement's long waits end early on it
    cancel: Any = None

    @abc.abstractmethod
    def start(self, launch: Launch, netns: Any = None) -> NodeHandle:
        """Start the node and return once it is ready (``launch.ready_timeout_s``), or raise
        HarnessError naming it, with nothing of it left running."""

    def host(self, role: str) -> str | None:
        """The address other nodes reach ``role`` at, or None: the family's own (loopback)."""
        return None

    def control_endpoint(self, role: str) -> str | None:
        """Where the harness reaches the control channel of ``role``'s node, or None: the
        topology's own (an ipc socket in its folder)."""
        return None

    def bind_address(self, role: str) -> str | None:
        """The address ``role``'s node listens on inside its host, or None: the family's own
        (loopback, or its network namespace's veth address). The runtime contract: a node that
        is a host of its own (a pod) listens on every address of its host (its own, where peers
        reach it at :meth:`host`, and its loopback, where the runtime's forwards arrive);
        loopback alone is only for nodes that share this machine."""
        return None

    def advertise_address(self, role: str) -> str | None:
        """The address ``role``'s node announces to its peers itself (a transfer engine's host, a
        side channel in a bootstrap answer), or None: its listening address."""
        return None

    def existing(self, role: str) -> dict[str, int] | None:
        """A node that already runs, which the harness does not start (attach mode: a pod of the
        user's deployment): its serving ports by endpoint name (``{"http": 8000, "bootstrap":
        8998}``); None: the harness starts the node of ``role`` and picks its ports. A family
        addresses an existing node on these ports and reads its state from what the node serves
        itself (e.g. ``/metrics``), since it has no control channel of the harness's."""
        return None

    def reach(self, role: str, url: str) -> str:
        """``url`` (an endpoint of ``role``'s node, as peers reach it) as the harness's side
        reaches it: the workload beside the harness, probes, fault peers on this machine.
        Locally the same URL; a cluster's forwards it (never cluster DNS from this machine)."""
        return url

    def run_beside(self, role: str, module: str, args: list[str], timeout_s: float) -> str | None:
        """Run ``python -m MODULE ARGS`` (a module of pd-chaos's) beside ``role``'s node, where
        its peers are, so it reaches the addresses nodes announce to each other (a side channel a
        bootstrap answer names), and return its stdout, or raise HarnessError; None: nowhere else,
        the caller runs it itself (this machine reaches those addresses). A cluster runs it in the
        role's pod."""
        return None

    def start_beside(self, role: str, module: str, args: list[str], timeout_s: float) -> Any | None:
        """Start ``python -m MODULE ARGS`` beside ``role``'s node as :meth:`run_beside` runs it, and
        keep it running: a handle the caller speaks to line by line, so what it does at a fault's
        window (a message to send) is only signalled then, not started then (a cluster's exec
        takes 0.5 s on a loaded kubelet). The handle has ``readline(timeout_s) -> str`` (the next
        line of its stdout, without the newline; raises HarnessError when it ended or was silent that
        long), ``write(line)`` (one line to its stdin) and ``close()`` (ends it; safe to repeat);
        ``timeout_s`` bounds starting it. None: nowhere else (the caller does it itself)."""
        return None

    def wrap_fault(self, fault: Any, spec: Any, index: int = 0) -> Any:
        """The fault as this runtime carries it out (``spec``: its scenario entry, ``index`` its
        place in the schedule): the fault itself, or one of the runtime's own that does the same
        (a Chaos Mesh object)."""
        return fault

    def close(self) -> list[str]:
        """Remove what this run made; what could not be removed, one line each."""
        return []


class Runtime(abc.ABC):
    """Where nodes run. One instance serves a whole ``pdchaos run``; each scenario run opens a
    :class:`Placement` of its own."""

    name: str = ""
    provides: frozenset[str] = frozenset()
    setup_default = False  # set up by a plain `pdchaos setup` (what the README's main job needs)
    #: whether the nodes run on this machine (so this machine's node stacks and model files matter)
    runs_here = True
    #: extra top-level commands, as a family's: name -> (module with add_arguments/run, help)
    commands: dict[str, tuple[str, str]] = {}

    @abc.abstractmethod
    def open(self, run_id: str, profile: Any = None, target: str | None = None) -> Placement:
        """A placement for one scenario run (``run_id``: unique per run and scenario) of
        ``target`` under the family's launch ``profile``."""

    def translates(self, fault_type: str) -> bool:
        """Whether this runtime carries out faults of ``fault_type`` itself (a Chaos Mesh object
        on Kubernetes), whatever the fault's own ``requires`` say."""
        return False

    def refuses(self, fault_types: Sequence[str], needs: Mapping[str, Sequence[str]], profile: Any = None,
                scenario: Any = None) -> str | None:
        """Why a scenario with these faults cannot run here under the launch ``profile``, or None.
        ``needs``: per fault type (and ``"topology"``), what it requires; ``scenario``: the loaded
        scenario itself (its faults' parameters, its family's roles), when the runtime needs more."""
        for what, req in needs.items():
            if what != "topology" and self.translates(what):
                continue
            lacking = [r for r in req if r in self.knows and r not in self.provides]
            if lacking:
                who = "the topology" if what == "topology" else f"fault {what!r}"
                return f"runtime {self.name}: {who} needs {', '.join(lacking)}, which this runtime cannot do"
        return None

    #: the requirement names this runtime judges (others, e.g. "root", stay the machine's to judge)
    knows: frozenset[str] = frozenset(NODE_OPS + ("netns", "toxiproxy", "interposer", "node_address"))

    def settings(self, data: Any) -> Any:
        """This runtime's block of a launch profile (its ``cluster`` field), checked: raises
        ValueError naming the field when it is wrong. The default: a runtime with no settings."""
        if data:
            raise ValueError(f"cluster: runtime {self.name} takes no settings (a cluster profile has them, "
                             "and --attach needs one)")
        return None

    def setup_steps(self) -> list[Any]:
        """``pdchaos setup`` steps of this runtime (harness/setup.py's step protocol)."""
        return []

    def doctor(self, profile: Any = None) -> list[tuple[str, bool, str, str]]:
        """``pdchaos doctor --profile ...``: this runtime's checks, one per line: (name, ok,
        detail, what its absence disables). Read-only, each bounded in time."""
        return []

    def clean(self, profile: Any = None) -> tuple[list[str], list[str]]:
        """``pdchaos clean``: remove what runs of this runtime left (a killed run's namespace);
        (what was removed, what could not be), one line each."""
        return [], []

    def describe(self, run_id: str, target: str, launches: list[Launch], faults: list[tuple[str, dict]],
                  profile: Any = None) -> str | None:
        """``pdchaos run --dry-run``: what this runtime would create for one planned run (its
        nodes' ``launches``, its faults as ``(type, params)``, ``params["for"]`` its window in
        seconds), or None: nothing beyond the node commands the dry run prints anyway."""
        return None


# --------------------------------------------------------------------------- registry

def builtin_runtimes() -> list[str]:
    spec = importlib.util.find_spec(BUILTIN_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return []
    from pathlib import Path

    return sorted(p.name for loc in spec.submodule_search_locations for p in Path(loc).iterdir()
                  if (p / "__init__.py").is_file())


def runtime_names() -> list[str]:
    names = set(builtin_runtimes())
    names |= {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    return sorted(names)


_LOADED: dict[str, Runtime] = {}


def load_runtime(name: str | None = None) -> Runtime:
    """The runtime called ``name`` (None: ``local``), one instance per process."""
    name = name or DEFAULT
    if name in _LOADED:
        return _LOADED[name]
    obj: Any = None
    if name in builtin_runtimes():
        obj = getattr(importlib.import_module(f"{BUILTIN_PACKAGE}.{name}"), "RUNTIME", None)
    else:
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if ep.name == name:
                obj = ep.load()
                break
        else:
            raise UsageError(f"runtime {name!r}: no such runtime; runtimes: {', '.join(runtime_names())}")
    if isinstance(obj, type) and issubclass(obj, Runtime):
        obj = obj()
    if not isinstance(obj, Runtime):
        raise HarnessError(f"runtime {name!r} does not provide a harness.runtime.Runtime (its RUNTIME)")
    _LOADED[name] = obj
    return obj


def runtime_of(profile: Any) -> Runtime:
    """The runtime a family's launch profile names (its ``runtime`` field; none: local)."""
    return load_runtime(getattr(profile, "runtime", None) or DEFAULT)
