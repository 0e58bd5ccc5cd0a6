"""Backend faults injected into the real server process through its control channel.

``server_node.py`` wraps the server's MemoryBackend in a switchable FaultyBackend; the fault
sends ``backend_fault {mode, delay_ms}`` with mode raise | hang | slow | clear_fails, and ``none`` to heal
(once; which also releases a hung call at once).

On the hardened server a raising backend gives a BACKEND_ERROR envelope and a hung backend a
BACKEND_TIMEOUT envelope after ``backend_timeout_ms`` (both counted as ``backend_error`` by the
client) unless the client's own deadline expires first (``timeout``). The legacy server folds a
raising backend into a miss (0) and blocks on a hung one.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator

from faults.base import Duration, FaultParams, OnceFault, delay_categories, register


class _BackendFault(OnceFault):
    family = "lookup"
    mode: ClassVar[str]

    def delay_ms(self) -> int:
        return 0

    def inject(self) -> None:
        self.ctx.server_control("backend_fault", mode=self.mode, delay_ms=self.delay_ms())

    def heal(self) -> None:
        self.ctx.server_control("backend_fault", mode="none", delay_ms=0)


@register
class BackendRaise(_BackendFault):
    """Every backend call raises."""

    name = "backend_raise"
    mode = "raise"
    categories = ("backend_error",)


@register
class BackendHang(_BackendFault):
    """Every backend call blocks until the fault is healed (longer than any deadline)."""

    name = "backend_hang"
    mode = "hang"
    categories = ("timeout", "backend_error")


@register
class BackendClearFails(_BackendFault):
    """The backend's clear (the admin reset's remove) fails and removes nothing: on vLLM's store
    channel ``store.remove_all`` returns a negative code, as when the Mooncake master is gone.
    Lookups are not affected. The hardened server answers the reset RESET_FAILED; upstream's
    reports success without reading the code (seed 002's stale-cache hole)."""

    name = "backend_clear_fails"
    mode = "clear_fails"
    categories = ("backend_error",)


@register
class BackendSlow(_BackendFault):
    """Every backend call takes ``delay`` longer."""

    name = "backend_slow"
    mode = "slow"
    categories = ("timeout", "backend_error")

    class Params(FaultParams):
        delay: Duration = Field(description='added to every backend call, e.g. "150ms"')

        @field_validator("delay")
        @classmethod
        def _range(cls, v: float) -> float:
            if not 0 < v <= 600:
                raise ValueError("must be above 0 and at most 10m")
            return v

    def delay_ms(self) -> int:
        return max(1, round(self.params.delay * 1000))

    def expected_categories(self) -> tuple[str, ...]:
        return delay_categories(self.ctx, self.params.delay, over=self.categories)
