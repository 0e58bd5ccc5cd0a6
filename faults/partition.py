"""Faults between isolated hosts (faults/netns.py): ``partition``, ``refuse``, ``bandwidth_limit``.

::

    - {type: partition, at: 1s, for: 2s, direction: both}               # iptables DROP: the client times out
    - {type: refuse, at: 1s, for: 1s, direction: client->server}        # REJECT: connection refused
    - {type: bandwidth_limit, at: 1s, for: 2s, rate_kbit: 512, direction: server->client}   # tc tbf

What the runner must provide: ``ctx.netns``, a created :class:`faults.netns.NetnsPair` whose side
``a`` holds the client (the workload) and side ``b`` the server. ``client->server`` is then
"a->b" (packets from the client vanish or are refused at the server's namespace), and
``server->client`` is "b->a". Each fault removes exactly the rules/qdiscs it added on
``stop()`` (idempotent), so overlapping faults heal independently. Needs root, ip, iptables and tc
(``requires = ("netns", "root")``); the runner skips the scenario with the reason otherwise.
"""

from __future__ import annotations

import itertools
from typing import Any, ClassVar, Literal

from pydantic import Field

from .base import Duration, Fault, FaultParams, register

DIRECTIONS = {"client->server": "a->b", "server->client": "b->a", "both": "both"}
DirectionName = Literal["client->server", "server->client", "both"]


class LinkParams(FaultParams):
    direction: DirectionName = Field("both", description="which packets are stopped: client->server, "
                                                         "server->client or both")


class _IptablesFault(Fault):
    # Not a faults.base.OnceFault, on purpose (nor BandwidthLimit): the rules are known only once
    # partition() returned them, and forgotten only once heal() removed them, so stop() called
    # again after one that failed (an iptables call timing out) tries again. OnceFault unmarks a
    # fault before healing it: a failed heal could never be retried.
    mode: str = "drop"
    count_name: ClassVar[str] = "dropped"  # the effect: packets the rules stopped (iptables counters)
    requires = ("netns", "root")
    _tags = itertools.count(1)

    def __init__(self, params: FaultParams, ctx: Any):
        super().__init__(params, ctx)
        self._rules: list | None = None
        self._tag = f"pdchaos-{self.name}-{next(self._tags)}"
        self._stopped: int | None = None  # packets counted at the heal, before the rules went

    def start(self) -> None:
        if self._rules is not None:
            return
        direction = DIRECTIONS[self.params.direction]
        self._rules = self.ctx.netns.partition(direction, self.mode, tag=self._tag)
        self.ctx.event("partition", mode=self.mode, direction=self.params.direction, rules=len(self._rules))

    def stop(self) -> None:
        if self._rules is None:
            return
        try:
            self._stopped = self.ctx.netns.stopped(self._tag)
        except Exception:  # noqa: BLE001 - the heal matters more than the count: fault_effect fails instead
            self._stopped = -1
        self.ctx.netns.heal(self._rules)
        self._rules = None
        self.ctx.event("healed", mode=self.mode, direction=self.params.direction)

    def effect(self) -> dict[str, Any] | None:
        return None if self._stopped is None else {self.count_name: self._stopped}

    def required_effect(self) -> dict[str, float]:
        # every scenario sends requests across the cut while it lasts: a rule that stopped
        # nothing cut nothing (an unreadable counter, -1, fails too)
        return {self.count_name: 1}


@register
class Partition(_IptablesFault):
    """iptables DROP between the two namespaces: packets vanish, the client must time out."""

    name = "partition"
    mode = "drop"
    categories = ("timeout",)
    Params = LinkParams


@register
class Refuse(_IptablesFault):
    """iptables REJECT (tcp-reset): connections are refused at once."""

    name = "refuse"
    mode = "reject"
    count_name = "refused"
    # ZMQ reconnects silently after a refused connect, so a REQ client sees a timeout, not an error.
    categories = ("timeout",)
    Params = LinkParams


@register
class BandwidthLimit(Fault):
    """tc tbf on the sender's end of the veth: at most rate_kbit kbit/s in that direction."""

    name = "bandwidth_limit"
    requires = ("netns", "root")
    may_cause = ("timeout",)  # only requests that queue past the deadline

    class Params(LinkParams):
        rate_kbit: int = Field(..., ge=8, le=100_000_000, description="kbit/s")
        burst: int = Field(16384, ge=1600, description="bucket size in bytes (at least one MTU)")
        queue_latency: Duration = Field(0.05, description="longest a packet may wait in the tbf queue")

    def __init__(self, params: FaultParams, ctx: Any):
        super().__init__(params, ctx)
        self._on = False  # cleared only once the qdisc is gone: a failed stop() can be retried (see above)

    def start(self) -> None:
        if self._on:
            return
        p = self.params
        self.ctx.netns.set_bandwidth(DIRECTIONS[p.direction], p.rate_kbit, burst_bytes=p.burst,
                                     latency_ms=max(1, round(p.queue_latency * 1000)))
        self._on = True
        self.ctx.event("bandwidth limited", direction=p.direction, rate_kbit=p.rate_kbit)

    def stop(self) -> None:
        if not self._on:
            return
        self.ctx.netns.clear_bandwidth(DIRECTIONS[self.params.direction])
        self._on = False
        self.ctx.event("bandwidth restored", direction=self.params.direction)
