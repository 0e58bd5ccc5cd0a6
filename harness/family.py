"""Families: one folder per system under test, plugged into a core that knows none of them.

A family brings everything that is specific to one system (Jepsen's db + client + generator +
the checkers only it needs): the ``topology:`` and ``workload:`` blocks of its scenario files, its
targets (the implementations compared, e.g. ``hardened`` and ``legacy``), its node kinds, its
topology (which nodes run, with which roles), its workload node, its checks and its faults. The
runner, the journal, the generic checks, the generic faults and the reports work through this
interface only.

Every scenario names its family with ``family:`` (there is no default).
The name is resolved, in this order, to

1. a folder of the top-level ``families`` package: ``families.<name>``;
2. an installed plugin: an entry point named ``<name>`` in the group ``pdchaos.families``;
3. an importable module path (``family: mypkg.myfamily``), e.g. a family kept in a test folder.

The module must define ``FAMILY``, an instance of a :class:`Family` subclass. Adding a family is
adding files: nothing in the core changes.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from faults.base import Duration

from .checks import CheckRegistry
from .errors import UsageError
from .triggers import TriggerRegistry

if TYPE_CHECKING:  # pragma: no cover
    from .topology import BaseTopology

ENTRY_POINT_GROUP = "pdchaos.families"
BUILTIN_PACKAGE = "families"  # the top-level folder of the families this project ships


class Spec(BaseModel):
    """Base of a family's ``topology:`` and ``workload:`` blocks: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


class WorkloadSpec(Spec):
    """Every workload runs for a duration; the fault schedule is validated against it."""

    duration: Duration = Field(3.0, description="how long the workload issues ops")

    def planned_ops(self) -> float:
        """About how many ops the workload means to issue (workload_ran wants a quarter of them);
        0 when the family cannot say. Paced workloads: rate x duration."""
        rate = getattr(self, "rate", None)
        return float(rate) * self.duration if isinstance(rate, (int, float)) else 0.0

    def op_bound(self) -> float:
        """The longest (s) the workload itself waits for one op before it records it as hung; the
        runner waits for the workload that long past its duration (0: the scenario's deadline +
        tolerance bound it)."""
        return 0.0

    def recovery_gap(self, within: int) -> float:
        """The least time (s) a fault schedule must leave after a window for the ``recovery``
        check to see ``within`` ops of every worker. Families with paced workers override it."""
        return 0.0


class Family:
    """The interface a family implements. Class attributes describe it; methods build its parts."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    targets: ClassVar[tuple[str, ...]]
    # The targets a scenario runs when it names none (default: every target). A target that needs
    # an optional node stack can stay out of it, so older scenario files keep their meaning.
    default_targets: ClassVar[tuple[str, ...] | None] = None
    # The target whose verdicts are the "before" in reports (today's upstream code, or a model of it).
    baseline_target: ClassVar[str | None] = None
    # Targets that claim what another target claims (``{"patched": "hardened"}``: upstream's code with
    # the upstream diffs applied must give the hardened verdicts). A scenario runs one only when it is
    # asked for by name (``--target patched``) and the scenario runs its base target; where the
    # scenario gives it no expectation of its own, the base target's is its expectation.
    derived_targets: ClassVar[dict[str, str]] = {}
    Topology: ClassVar[type[Spec]] = Spec
    Workload: ClassVar[type[WorkloadSpec]] = WorkloadSpec
    # Modules that register this family's faults (``faults.base.register`` with ``family = name``)
    # and its checks (on :attr:`checks`); imported when the family is loaded.
    fault_modules: ClassVar[tuple[str, ...]] = ()
    check_modules: ClassVar[tuple[str, ...]] = ()
    # Generic checks (harness/checks.py) that do not apply to this family at all.
    skip_generic_checks: ClassVar[tuple[str, ...]] = ()
    # op ``f`` values that are the workload's main operation (recovery and bounded_return look at
    # these; other ops, e.g. admin calls, are still checked for stalls)
    primary_ops: ClassVar[tuple[str, ...]] = ()
    # every op ``f`` its workload writes (main and others); empty: ``primary_ops``. An op of another
    # kind in a history is one no workload of the family wrote (harness_integrity refuses it)
    op_kinds: ClassVar[tuple[str, ...]] = ()
    # ``pdchaos node KIND``: kind -> (module with add_node_arguments/run_node, help); also in the
    # family's light ``nodes`` module as NODE_KINDS, which node processes read (harness/cli/node.py)
    node_kinds: ClassVar[dict[str, tuple[str, str]]] = {}
    # ``pdchaos bench NAME`` / ``pdchaos fuzz NAME``: module with add_arguments/run, or None
    bench_module: ClassVar[str | None] = None
    # ``pdchaos explore --family NAME``: module with draw/render/MIN_WINDOW_S (harness/explore.py), or None
    explore_module: ClassVar[str | None] = None
    fuzz_module: ClassVar[str | None] = None
    # Protocol phases its nodes journal (harness/phases.py): name -> what is seen, and where. A
    # fault entry may be keyed on one (``upon: {phase: NAME, offset: 0ms}``); its topology's
    # ``phase_files()`` says where the live events are. Empty: no fault can be keyed on a phase.
    phases: ClassVar[dict[str, str]] = {}
    # Phases seen only on some targets (name -> those targets); a phase not named here is seen on
    # every target. A scenario that keys a fault on one and runs another target is refused.
    phase_targets: ClassVar[dict[str, tuple[str, ...]]] = {}
    # extra top-level commands: name -> (module with add_arguments/run, help)
    commands: ClassVar[dict[str, tuple[str, str]]] = {}
    setup_default: ClassVar[bool] = False
    """``pdchaos setup`` without ``--family`` installs this family's steps (the README's main job
    needs them); the others' when named (``--family NAME``) or with ``--all``."""
    failed_words: ClassVar[tuple[str, str]] = ("failed", "failed (the client was told)")
    """What an op of phase ``fail`` is in this family's language (reports/data.py's class
    ``fail-open``): (a table column's word, the plots' legend): a client that returns 0 fails open,
    a request that gets an HTTP error fails fast. Written into each journal's meta line, so the
    reports never import a family."""
    gauges: ClassVar[tuple[tuple[str, str], ...]] = ()
    """Node gauges the reports plot over time from ``sample`` probes, one panel each, one line per
    node role: (counter, axis label). The counter is a key of a probe's ``counters``, matched
    without a ``prefix:`` (a name without ``{labels}`` sums its labelled variants; see
    reports/gauges.py), or ``rate(NAME)``: the per-second rate of a cumulative counter between two
    samples of one process (``rate(cpu_s)``: CPU as a fraction of one core)."""

    def __init__(self) -> None:
        self.checks: CheckRegistry = CheckRegistry(owner=f"family {self.name!r}")
        # events a scenario's claim may rest on (harness/triggers.py), registered by the check modules
        self.triggers: TriggerRegistry = TriggerRegistry(owner=f"family {self.name!r}")
        self._loaded = False

    # ------------------------------------------------------------------ loading
    def load(self) -> "Family":
        """Import the family's fault and check modules (once)."""
        if not self._loaded:
            self._loaded = True
            for module in self.fault_modules + self.check_modules:
                importlib.import_module(module)
        return self

    # ------------------------------------------------------------------ scenario rules
    def validate(self, scenario: Any) -> None:
        """Rules across blocks (raise ValueError with a message naming the field)."""

    def requirements(self, scenario: Any) -> set[str]:
        """What this scenario needs from the machine beyond its faults' ``requires``
        ("toxiproxy", "netns", "root", ...), given its topology."""
        return set()

    def unmet(self, scenario: Any, needs: set[str]) -> str | None:
        """A reason the scenario cannot run with this topology whatever the machine (e.g. a fault
        needs a link the topology does not have), or None: a validation error."""
        return None

    def unavailable(self, scenario: Any, profile: Any = None) -> str | None:
        """A reason this machine cannot run the scenario under the launch ``profile`` (None: the
        family's default; e.g. a node stack is not installed), or None: the scenario is then
        skipped with that reason, never passed."""
        return None

    def roles(self, scenario: Any, profile: Any = None) -> list[str] | None:
        """The node roles this scenario's topology has under the launch ``profile`` (None: the
        default; ``node:`` of a fault must name them), or None when the family does not say."""
        return None

    def not_applicable(self, scenario: Any, target: str) -> dict[str, str]:
        """Checks that do not apply to this scenario and target, with the reason (they are not
        run, and reported as not applicable — never as passing)."""
        return {}

    # Options of checks this family's scenarios get unless they set them ({check: {option: value}}).
    check_defaults: ClassVar[dict[str, dict[str, Any]]] = {}
    # The failure categories generic faults (faults/) may cause in this family's workload, in the
    # family's own vocabulary (a killed node is an HTTP 502 to the pd family's client), by fault name.
    generic_explains: ClassVar[dict[str, tuple[str, ...]]] = {}

    def fault_explains(self, fault: Any) -> tuple[str, ...]:
        """The op failure categories (``outcome``, or ``outcome@error_phase``) a fault instance may
        cause in this family's workload: what ``failures_explained`` accepts in its window. What
        the fault class declares (``possible_categories``) and ``generic_explains`` for it."""
        own = tuple(fault.possible_categories())
        return tuple(dict.fromkeys(own + tuple(self.generic_explains.get(fault.name, ()))))

    def fault_tail_s(self, fault: Any, scenario: Any) -> float:
        """How long after a fault's window closed a failure may still be its doing (a peer that
        needs a moment to be found again): the fault's own ``tail_s``, else its heal allowance plus
        one second."""
        if getattr(fault, "tail_s", None) is not None:
            return float(fault.tail_s)
        return float(getattr(fault, "heal_allowance_s", 0.0) or 0.0) + 1.0

    def excluded(self, scenario: Any, target: str, profile: Any = None) -> str | None:
        """(``scenario``: the loaded scenario, ``.faults`` with its random faults drawn, the
        model's blocks as attributes.) Why this target of this scenario does not apply under the launch ``profile`` (a
        fault that acts on a protocol the profile's connector does not speak), or None. Such runs
        are left out of the plan and listed as not run, with the reason: never run for nothing,
        never counted as passing."""
        return None

    def reuse_group(self, scenario: Any) -> Any:
        """A hashable value shared by the scenarios whose nodes start with the same settings:
        ``pdchaos run`` runs each group's scenarios one after another (file order otherwise), so
        warm nodes kept in the node pool (harness/pool.py) serve them. Default: one group."""
        return None

    # ------------------------------------------------------------------ running
    def topology(self, scenario: Any, target: str, run_dir: Path, record: Callable[[dict], None],
                 services: dict[str, Any], profile: Any = None) -> "BaseTopology":
        """The nodes of one run: ``scenario`` against ``target`` under the launch ``profile``
        (None: the family's default), journal records through ``record``, run-wide services (the
        node pool, toxiproxy) in ``services``. Everything the topology needs comes in here: a
        family object holds no run state."""
        raise NotImplementedError

    def log_secrets(self, run_dir: Path) -> list[str]:
        """Strings that must never appear in a log of this run (keys, prompts); log_hygiene."""
        return []

    def saved_inputs(self, run_dir: Path) -> dict | None:
        """What the run's checks judge the history against besides the journal (e.g. the
        workload's prompts and reference outputs), read from the run folder; None: nothing."""
        return None

    client_tally: ClassVar[bool] = False
    """The family's workload counts its primary ops in its final probe (``ops``,
    ``ops_<outcome>``): harness_integrity then requires that probe and holds the history to it."""

    log_pattern: ClassVar[str | None] = None
    """A regex for text that must never appear in a log whatever the run (e.g. a long hex run)."""

    def setup_steps(self) -> list[Any]:
        """What ``pdchaos setup`` installs for this family (harness/setup.py steps)."""
        return []

    def repro_steps(self, scenario: Any, target: str, run_dir: Path) -> list[tuple[str, str]]:
        """``pdchaos repro``'s steps a user could follow without pd-chaos, as (what, shell command
        or "") pairs in the family's words: e.g. the requests its workload sent (never the prompts
        themselves), and its own faults' effects as commands where one exists. ``run_dir`` is the
        finished run's ``<scenario>/<target>`` folder. Default: the ``repro`` module beside the
        family's module, if it has one (``repro_steps(scenario, target, run_dir)``), else none."""
        package = type(self).__module__.rpartition(".")[0]
        name = f"{package}.repro" if package else "repro"
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                return []
            raise
        fn = getattr(mod, "repro_steps", None)
        return [(str(a), str(b)) for a, b in fn(scenario, target, run_dir)] if callable(fn) else []

    def upstream_projects(self) -> list[Any]:
        """The upstream releases this family's nodes run and whose fixes are kept as diffs against them
        (:class:`harness.upstream.UpstreamProject`): ``pdchaos upstream check`` proves each series."""
        return []

    # ------------------------------------------------------------------ launch profiles
    def profile_names(self) -> list[str]:
        """The built-in launch profiles (where and how the family's nodes start: device, node
        stack, model...); empty: the family has none, and ``--profile`` does not apply to it."""
        return []

    def load_profile(self, spec: str | None, sets: list[str]) -> Any:
        """The launch profile ``spec`` (a built-in name or a file; None: the default) with
        ``KEY=VALUE`` changes, as data the plan hands to :meth:`topology` and the other methods
        that take ``profile``; raise UsageError naming what is wrong. Families with profiles
        override it."""
        raise UsageError(f"--profile: family {self.name!r} has no launch profiles")


# --------------------------------------------------------------------------- registry

_FAMILIES: dict[str, Family] = {}


def _import_family_module(name: str) -> Any:
    builtin = f"{BUILTIN_PACKAGE}.{name}"
    if "." not in name:
        try:
            return importlib.import_module(builtin)
        except ModuleNotFoundError as exc:
            if exc.name != builtin:
                raise
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return ep.load()
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            return None
        raise


def get_family(name: str) -> Family:
    """The loaded family called ``name``; UsageError naming the known ones otherwise."""
    if name in _FAMILIES:
        return _FAMILIES[name]
    if not isinstance(name, str) or not name or name.startswith(".") or ".." in name:
        raise UsageError(f"family {name!r}: not a family name")
    mod = _import_family_module(name)
    fam = getattr(mod, "FAMILY", None) if mod is not None else None
    if mod is None:
        raise UsageError(f"unknown family {name!r}; known: {', '.join(known_families())}")
    if not isinstance(fam, Family):
        raise UsageError(f"family {name!r}: module {mod.__name__} defines no FAMILY (a harness.family.Family)")
    _FAMILIES[name] = fam.load()
    return fam


def builtin_families() -> list[str]:
    """The family folders of this package (no import)."""
    spec = importlib.util.find_spec(BUILTIN_PACKAGE)
    folders = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    return sorted(p.name for d in folders for p in d.iterdir() if p.is_dir() and (p / "__init__.py").exists())


def known_families() -> list[str]:
    """Built-in family folders and installed plugins (module-path families are listed once loaded)."""
    names = set(builtin_families())
    names |= {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    names |= set(_FAMILIES)
    return sorted(names)


def all_families() -> list[Family]:
    return [get_family(n) for n in known_families()]


def installed_families() -> list[Family]:
    """The built-in families and the installed plugins: what the generated docs describe. A family
    loaded by module path in this process (a test's toy family) is not among them."""
    names = set(builtin_families()) | {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    return [get_family(n) for n in sorted(names)]
