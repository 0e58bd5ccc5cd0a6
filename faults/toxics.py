"""Toxiproxy faults: one registered fault per toxic type, plus ``down`` (the proxy disabled).

YAML names: ``latency``, ``bandwidth``, ``slow_close``, ``timeout``, ``reset_peer``, ``slicer``,
``limit_data``, ``down``. Every toxic fault takes ``stream`` (upstream = client -> server,
downstream = server -> client; default downstream), ``toxicity`` (0..1, default 1) and the toxic's
own attributes, named as Toxiproxy names them; time attributes are Duration strings ("300ms")::

    - {type: latency, at: 1s, for: 2s, latency: 300ms, jitter: 20ms, stream: downstream}
    - {type: slicer, at: 1s, for: 1s, average_size: 8, size_variation: 4, delay: 500us}
    - {type: down, at: 1s, for: 500ms}

What the runner must provide (the FaultContext of faults/base.py, plus two attributes):

* ``ctx.toxiproxy``: the :class:`faults.toxiproxy.Toxiproxy` API wrapper of the running server;
* ``ctx.proxy_name``: the name (str) of the proxy in the faulted link (the family's topology names it).

``start()`` adds the toxic (or disables the proxy) and records the toxic as read back from the
server with ``ctx.event("toxic added", ...)``; ``stop()`` removes it (or re-enables) and is
idempotent: a toxic already gone (e.g. after ``reset()`` between scenarios) is not an error.
A toxic that cannot be added raises :class:`faults.toxiproxy.ToxiproxyError` from ``start()``.

Toxiproxy takes whole milliseconds (and whole microseconds for ``slicer.delay``): a Duration
that does not convert exactly is refused at validation time, with the attribute named.
"""

from __future__ import annotations

import itertools
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, Field

from .base import delay_categories
from .base import Duration, Fault, FaultParams, register
from .toxiproxy import TOXIC_TYPES

_UNIT_S = {"ms": 1e-3, "us": 1e-6}


def _whole(unit: str):
    def check(seconds: float) -> float:
        count = seconds / _UNIT_S[unit]
        if abs(count - round(count)) > 1e-6:
            raise ValueError(f"Toxiproxy takes whole {'milliseconds' if unit == 'ms' else 'microseconds'}; "
                             f"{seconds:g}s is not")
        return seconds
    return AfterValidator(check)


Millis = Annotated[Duration, _whole("ms")]
Micros = Annotated[Duration, _whole("us")]

_names = itertools.count(1)


class ToxicParams(FaultParams):
    stream: Literal["upstream", "downstream"] = Field(
        "downstream", description="upstream: client -> server; downstream: server -> client")
    toxicity: float = Field(1.0, ge=0.0, le=1.0, description="probability the toxic applies to a connection")


class ToxicFault(Fault):
    """Base of the toxic faults: ``toxic_type`` names the Toxiproxy toxic; the Params fields other
    than stream/toxicity are its attributes (durations converted to the unit of TOXIC_TYPES).

    Not a :class:`faults.base.OnceFault`, on purpose (so is :class:`Down`): the toxic is recorded
    only once the server created it (its name comes back from the server), and forgotten only
    once it was removed, so stop() called again after one that failed (Toxiproxy busy, a timeout)
    tries the removal again. OnceFault marks a fault before injecting and unmarks it before
    healing: a failed heal could never be retried."""

    toxic_type: ClassVar[str]
    requires = ("toxiproxy",)

    def __init__(self, params: FaultParams, ctx: Any):
        super().__init__(params, ctx)
        self._toxic: str | None = None

    def attributes(self) -> dict[str, int]:
        units = TOXIC_TYPES[self.toxic_type]
        out = {}
        for attr, unit in units.items():
            value = getattr(self.params, attr)
            out[attr] = int(round(value / _UNIT_S[unit])) if unit in _UNIT_S else int(value)
        return out

    def start(self) -> None:
        if self._toxic is not None:
            return
        p = self.params
        name = f"pdc_{self.name}_{p.stream}_{next(_names)}"
        toxic = self.ctx.toxiproxy.add_toxic(self.ctx.proxy_name, self.toxic_type, p.stream, p.toxicity,
                                             self.attributes(), name=name)
        self._toxic = toxic["name"]
        self.ctx.event("toxic added", proxy=self.ctx.proxy_name, toxic=toxic["name"], toxic_type=toxic["type"],
                       stream=toxic["stream"], toxicity=toxic["toxicity"], attributes=toxic["attributes"])

    def stop(self) -> None:
        if self._toxic is None:
            return
        name = self._toxic
        removed = self.ctx.toxiproxy.remove_toxic(self.ctx.proxy_name, name, missing_ok=True)
        self._toxic = None  # only once removed: a failed stop can be retried at teardown
        self.ctx.event("toxic removed", proxy=self.ctx.proxy_name, toxic=name, was_present=removed)


@register
class Latency(ToxicFault):
    """Delay every chunk of data by latency +- jitter."""

    name = "latency"
    toxic_type = "latency"

    class Params(ToxicParams):
        latency: Millis = Field(..., description="added delay")
        jitter: Millis = Field(0.0, description="+- random variation")

    def expected_categories(self) -> tuple[str, ...]:
        if self.params.toxicity < 1.0:
            return ()
        return delay_categories(self.ctx, self.params.latency + self.params.jitter)

    def possible_categories(self) -> tuple[str, ...]:
        return delay_categories(self.ctx, self.params.latency + self.params.jitter)


@register
class Bandwidth(ToxicFault):
    """Limit the stream to rate KB/s."""

    name = "bandwidth"
    toxic_type = "bandwidth"
    may_cause = ("timeout",)  # only requests that queue past the deadline

    class Params(ToxicParams):
        rate: int = Field(..., ge=0, description="KB/s")


@register
class SlowClose(ToxicFault):
    """Delay the TCP close (FIN) by delay."""

    name = "slow_close"
    toxic_type = "slow_close"

    class Params(ToxicParams):
        delay: Millis = Field(..., description="how long the close is delayed")


@register
class Timeout(ToxicFault):
    """Stop all data; close the connection after timeout (0ms: never, until the toxic is removed)."""

    name = "timeout"
    toxic_type = "timeout"

    def expected_categories(self) -> tuple[str, ...]:
        # the REQ client never sees the cut connection (ZMQ reconnects quietly): it times out
        return ("timeout",) if self.params.toxicity >= 1.0 else ()

    may_cause = ("timeout",)  # with toxicity < 1, on the connections it hits

    class Params(ToxicParams):
        timeout: Millis = Field(..., description="0ms: hold the connection open without data")


@register
class ResetPeer(ToxicFault):
    """Reset the connection (TCP RST) after timeout (0ms: at once)."""

    name = "reset_peer"
    toxic_type = "reset_peer"

    def expected_categories(self) -> tuple[str, ...]:
        # the REQ client never sees the cut connection (ZMQ reconnects quietly): it times out
        return ("timeout",) if self.params.toxicity >= 1.0 else ()

    may_cause = ("timeout",)  # with toxicity < 1, on the connections it hits

    class Params(ToxicParams):
        timeout: Millis = Field(0.0, description="delay before the reset")


@register
class Slicer(ToxicFault):
    """Slice data into small packets of average_size +- size_variation bytes, delay between them."""

    name = "slicer"
    toxic_type = "slicer"

    class Params(ToxicParams):
        average_size: int = Field(..., ge=1, description="bytes per slice on average")
        size_variation: int = Field(0, ge=0, description="bytes of +- variation")
        delay: Micros = Field(0.0, description="delay between slices (whole microseconds)")


@register
class LimitData(ToxicFault):
    """Close the connection once bytes bytes have passed."""

    name = "limit_data"
    toxic_type = "limit_data"

    def expected_categories(self) -> tuple[str, ...]:
        # the REQ client never sees the cut connection (ZMQ reconnects quietly): it times out
        return ("timeout",) if self.params.toxicity >= 1.0 else ()

    may_cause = ("timeout",)  # with toxicity < 1, on the connections it hits

    class Params(ToxicParams):
        bytes: int = Field(..., ge=0, description="bytes transmitted before the close")


@register
class Down(Fault):
    """Disable the proxy: its listener closes and live connections are cut; re-enabled on stop."""

    # Not a OnceFault (see ToxicFault): ``_down`` is cleared only once the proxy is enabled again,
    # so stop() called again after a failed one retries.

    name = "down"
    requires = ("toxiproxy",)
    categories = ("timeout",)

    def __init__(self, params: FaultParams, ctx: Any):
        super().__init__(params, ctx)
        self._down = False

    def start(self) -> None:
        if self._down:
            return
        self.ctx.toxiproxy.set_enabled(self.ctx.proxy_name, False)
        self._down = True
        self.ctx.event("proxy disabled", proxy=self.ctx.proxy_name)

    def stop(self) -> None:
        if not self._down:
            return
        self.ctx.toxiproxy.set_enabled(self.ctx.proxy_name, True)
        self._down = False
        self.ctx.event("proxy enabled", proxy=self.ctx.proxy_name)


TOXIC_FAULTS: dict[str, type[ToxicFault]] = {
    cls.toxic_type: cls for cls in (Latency, Bandwidth, SlowClose, Timeout, ResetPeer, Slicer, LimitData)
}
if set(TOXIC_FAULTS) != set(TOXIC_TYPES):  # every toxic type of the table has a fault
    raise RuntimeError(f"toxic faults {sorted(TOXIC_FAULTS)} != TOXIC_TYPES {sorted(TOXIC_TYPES)}")
for _cls in TOXIC_FAULTS.values():  # and its Params fields are exactly the table's attributes
    if set(_cls.Params.model_fields) - {"stream", "toxicity"} != set(TOXIC_TYPES[_cls.toxic_type]):
        raise RuntimeError(f"{_cls.__name__}.Params does not match TOXIC_TYPES[{_cls.toxic_type!r}]")
