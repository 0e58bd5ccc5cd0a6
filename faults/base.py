"""One interface for every fault, one registry keyed by the name the YAML uses.

A fault is a small class::

    @register
    class SlowPeer(Fault):
        name = "slow_peer"

        class Params(FaultParams):
            delay: Duration

        def start(self) -> None: ...
        def stop(self) -> None: ...   # heal; must be idempotent

The runner builds it with validated params and a :class:`FaultContext`, calls ``start()`` at
``at`` and ``stop()`` after ``for`` (or at teardown: every fault is healed at the end, whatever
happened). ``requires`` names what the fault needs from the machine ("toxiproxy", "netns",
"root"); a missing requirement makes the scenario skipped with the reason, never passed.

Adding a generic fault = adding one module in ``faults/`` that defines and registers its class
(every module of the package is imported). A family's own faults set ``family = "<name>"`` and
live in the family's folder (families/<name>/), imported when the family is loaded.
"""

from __future__ import annotations

import abc
import importlib
import pkgutil
import random
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Protocol

from pydantic import BaseModel, BeforeValidator, ConfigDict

# --------------------------------------------------------------------------- durations

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s|m)\s*$")
_UNIT_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def parse_duration(value: Any) -> float:
    """'200ms', '1.5s', '2m', '50us' -> seconds. Bare numbers, negatives and other units are refused."""
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            return float(m.group(1)) * _UNIT_S[m.group(2)]
    raise ValueError('expected a duration like "1.5s" or "200ms"')


Duration = Annotated[float, BeforeValidator(parse_duration)]
"""A pydantic field type: YAML "200ms" -> 0.2 (seconds)."""


LASTING = 1e9  # a tail_s for damage that may last to the end of the run


class FaultParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- context


class FaultContext(Protocol):
    """What a fault may touch: the topology of the current scenario run (harness/topology.py,
    extended by the family's own topology for that family's faults)."""

    target: str  # the target under test, e.g. "hardened"
    rng: random.Random  # seeded by the scenario
    deadline: float  # the scenario's deadline, seconds (what a delay should cause)

    def event(self, what: str, **fields: Any) -> None: ...
    def roles(self, spec: str) -> list[str]: ...
    def start_node(self, role: str) -> Any: ...
    # each says whether the intended state was seen after (gone, replaced, stopped), None if unknown
    def stop_node(self, role: str) -> bool | None: ...
    def kill_node(self, role: str) -> bool | None: ...
    def restart_node(self, role: str, *, kill: bool = False) -> bool | None: ...
    def freeze_node(self, role: str) -> bool | None: ...
    def thaw_node(self, role: str) -> None: ...
    def control(self, role: str, cmd: str, timeout_ms: int = 2000, **fields: Any) -> dict: ...
    def node(self, role: str) -> Any: ...  # its endpoints, handle (harness/runtime.py) and control channel
    def taint(self, role: str, why: str) -> None: ...  # never lend this node to a later scenario


# --------------------------------------------------------------------------- faults


class Fault(abc.ABC):
    name: ClassVar[str]
    # None: a generic fault any family may use; else the one family whose scenarios may use it
    family: ClassVar[str | None] = None
    Params: ClassVar[type[FaultParams]] = FaultParams
    requires: ClassVar[tuple[str, ...]] = ()
    # What it asks of the node handles (harness/runtime.py: "stop", "kill", "freeze", "restart"):
    # a runtime that cannot do one refuses the scenario before anything starts
    node_ops: ClassVar[tuple[str, ...]] = ()
    # Failure categories this fault is expected to cause in the hardened client's counters
    # (metrics_match); empty means "no expectation".
    categories: ClassVar[tuple[str, ...]] = ()
    # How long (s) healing may take on a busy machine before the window is recorded closed (a
    # node to stop, a proxy to re-arm): a schedule must leave the recovery check this much more
    # time after the window (harness/schema.py, validate_recovery_gaps).
    heal_allowance_s: ClassVar[float] = 0.0
    # How long after its heal a failure may still be this fault's doing (failures_explained); None:
    # the family's default (harness/family.py fault_tail_s). A fault whose damage can outlast the
    # heal for good (a listener thread it killed) says so with LASTING.
    tail_s: ClassVar[float | None] = None

    @classmethod
    def heal_allowance(cls, spec: Any) -> float:
        """``heal_allowance_s`` for one scheduled fault (``spec``: its YAML entry, params as
        attributes): a fault whose heal depends on its parameters says so here."""
        return float(cls.heal_allowance_s or 0.0)

    def __init__(self, params: FaultParams, ctx: FaultContext):
        self.params = params
        self.ctx = ctx

    def prepare(self) -> None:
        """Make ready, before the run's t0, what the injection needs and is slow to make (a helper
        process to start), so that :meth:`start` at ``at`` is quick and the window is the one the
        scenario asked for. Called once, after the topology is up and before the workload starts;
        an exception here is a harness error (the run's verdict is error). Default: nothing."""

    def release(self) -> None:
        """Undo :meth:`prepare` at teardown, after the heal: called for every fault whose
        ``prepare`` was called, started or not. Must be safe to repeat. Default: nothing."""

    @abc.abstractmethod
    def start(self) -> None:
        """Inject the fault."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Heal it. Idempotent: the runner may call it again at teardown."""

    # Categories this fault may cause without having to (e.g. a bandwidth limit times out only the
    # requests that queue long enough): they explain a failure, but their absence is no deviation.
    may_cause: ClassVar[tuple[str, ...]] = ()

    def expected_categories(self) -> tuple[str, ...]:
        return self.categories

    def effect(self) -> dict[str, Any] | None:
        """What this window did, as counts (requests held, pids signalled and the state seen
        after): read by the runner right after the heal and journalled (``fault_effect``). None:
        this fault cannot count what it did (a toxic). Counts, codes and phases only: no ids."""
        return None

    def tail_after_heal(self) -> float | None:
        """A shorter tail (s) than the declared one when what the window did shows its damage
        cannot outlast the heal (a listener that answered the message meant to kill it): written
        into the window's stop record, and failures_explained takes the shorter of the two. None:
        the declared tail (``tail_s``, or the family's default) stands."""
        return None

    def required_effect(self) -> dict[str, float]:
        """The least each count of :meth:`effect` must reach for the window to have done what its
        kind must do (``fault_effect`` fails the run as a harness error otherwise: a fault that
        did nothing tested nothing). Empty: nothing required."""
        return {}

    def possible_categories(self) -> tuple[str, ...]:
        """Every category that this fault explains: the expected ones and ``may_cause``."""
        return tuple(dict.fromkeys(self.expected_categories() + self.may_cause))


class OnceFault(Fault):
    """A fault whose heal runs only after its injection began, until it succeeds once: ``start()``
    marks it active, then calls :meth:`inject`; ``stop()`` calls :meth:`heal` if active, and
    clears the mark once the heal returned. Marked before injecting, so a fault that failed
    half-way is still healed at teardown; a heal that raised is tried again there (so ``heal``
    must be safe to call again after a partial run)."""

    def __init__(self, params: FaultParams, ctx: FaultContext):
        super().__init__(params, ctx)
        self._active = False

    @abc.abstractmethod
    def inject(self) -> None:
        """Inject the fault."""

    def heal(self) -> None:
        """Undo :meth:`inject` (default: nothing to undo)."""

    def start(self) -> None:
        self._active = True
        self.inject()

    def stop(self) -> None:
        if self._active:
            self.heal()
            self._active = False  # only once healed: a heal that raised is tried again at teardown


def delay_categories(ctx: FaultContext, delay_s: float, *, over: tuple[str, ...] = ("timeout",)) -> tuple[str, ...]:
    """What a delay of ``delay_s`` (backend or interposer; not a peer swap, see above) is expected
    to cause in the hardened client's counters.

    When the topology tells the client deadline (``ctx.deadline``, seconds; optional), a delay
    under half of it is expected to cause nothing (returns ``()``, "no expectation"); otherwise,
    or when the deadline is unknown, ``over``. Near the deadline the outcome depends on
    scheduling noise, so "may time out" is the honest expectation there.
    """
    deadline = getattr(ctx, "deadline", None)
    if isinstance(deadline, (int, float)) and deadline > 0 and delay_s < deadline / 2:
        return ()
    return over


REGISTRY: dict[str, type[Fault]] = {}

def _generic_modules() -> tuple[str, ...]:
    """Every module of this package: adding a generic fault is adding a module here."""
    pkg = __name__.rsplit(".", 1)[0]
    here = [str(Path(__file__).parent)]
    return tuple(f"{pkg}.{m.name}" for m in pkgutil.iter_modules(here) if not m.name.startswith("_"))


FAULT_MODULES = _generic_modules()


def register(cls: type[Fault]) -> type[Fault]:
    if not getattr(cls, "name", None):
        raise TypeError(f"{cls.__name__} has no name")
    if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
        raise TypeError(f"fault name {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls
    return cls


def load_registry(family: str | None = None) -> dict[str, type[Fault]]:
    """The generic faults, plus those of ``family`` when given (the family must be loaded: see
    harness/family.py); without a family, every fault registered so far."""
    for module in FAULT_MODULES:
        importlib.import_module(module)
    if family is None:
        return REGISTRY
    return {n: c for n, c in REGISTRY.items() if c.family in (None, family)}
