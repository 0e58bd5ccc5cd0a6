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

Adding a fault = adding one module in ``faults/`` that defines and registers its class; the
module list in :data:`FAULT_MODULES` makes the registry import it.
"""

from __future__ import annotations

import abc
import importlib
import random
import re
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


class FaultParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- context


class FaultContext(Protocol):
    """What a fault may touch: the topology of the current scenario run (harness/topology.py)."""

    target: str  # "hardened" | "legacy"
    server_endpoint: str  # where the server binds
    client_endpoint: str  # where the client connects (differs with an interposer or a proxy)
    rng: random.Random  # seeded by the scenario
    deadline: float  # the hardened client's lookup deadline, seconds (what a delay should cause)

    def event(self, what: str, **fields: Any) -> None: ...
    def start_server(self) -> None: ...
    def stop_server(self) -> None: ...
    def kill_server(self) -> None: ...
    def signal_server(self, sig: int) -> None: ...
    def swap_server(self, kind: str, args: list[str]) -> None: ...
    def restore_server(self) -> None: ...
    def server_control(self, cmd: str, **fields: Any) -> dict: ...
    def interposer_control(self, cmd: str, **fields: Any) -> dict: ...


# --------------------------------------------------------------------------- faults


class Fault(abc.ABC):
    name: ClassVar[str]
    Params: ClassVar[type[FaultParams]] = FaultParams
    requires: ClassVar[tuple[str, ...]] = ()
    # Failure categories this fault is expected to cause in the hardened client's counters
    # (metrics_match); empty means "no expectation".
    categories: ClassVar[tuple[str, ...]] = ()

    def __init__(self, params: FaultParams, ctx: FaultContext):
        self.params = params
        self.ctx = ctx

    @abc.abstractmethod
    def start(self) -> None:
        """Inject the fault."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Heal it. Idempotent: the runner may call it again at teardown."""

    def expected_categories(self) -> tuple[str, ...]:
        return self.categories


REGISTRY: dict[str, type[Fault]] = {}

FAULT_MODULES = (
    "faults.peers",
    "faults.process",
    "faults.backend",
    "faults.requests",
    "faults.interpose",
    "faults.toxics",
    "faults.partition",
)


def register(cls: type[Fault]) -> type[Fault]:
    if not getattr(cls, "name", None):
        raise TypeError(f"{cls.__name__} has no name")
    if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
        raise TypeError(f"fault name {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls
    return cls


def load_registry() -> dict[str, type[Fault]]:
    for module in FAULT_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
    return REGISTRY
