"""The pd family's faults on one port of P (``topology.link: netns``): iptables between D's
namespace and P's, on one of P's TCP ports only, every other port of P left working.

::

    - {type: refuse_port, port: side_channel, direction: client->server, at: 2s, for: 4s}  # REJECT
    - {type: partition_port, port: bootstrap, direction: both, at: 2s, for: 4s}            # DROP

``port``: ``side_channel`` (P's Mooncake side channel, the ZMQ ROUTER D's pulls go to: vLLM binds
it on a random port, so it is read from P's bootstrap server's ``/query``, ``worker_addr``, every
rank's), ``bootstrap`` (P's Mooncake bootstrap server: the proxy asks it on every request, D only
for an engine it has not met) or ``http`` (P's OpenAI server, which the proxy asks to prefill).
While P's side channel refuses, the KV transfer itself (the transfer engine's own connections) and
everything else still get through: D's pull cannot reach P, or P's answer cannot reach D, while
P may be writing (issue 43, 7a).

``direction`` as for ``partition``: ``client->server`` stops what D's namespace sends to that
port of P (D, the proxy and the workload sit there), ``server->client`` what P sends from it,
``both`` both. The port numbers are read once, in ``prepare`` (before the run's start, off the
window): a schedule that restarts P (a kill) would move its side channel, so the generator never
puts one beside a kill. Effect: packets the rules stopped (``refused`` or ``dropped``, their
iptables counters), at least one: a window nobody sent to that port in tested nothing. Needs root,
ip and iptables (``requires = ("netns", "root")``).
"""

from __future__ import annotations

import itertools
import json
import sys
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import Field

from faults.base import Fault, register
from faults.partition import DIRECTIONS, LinkParams

PORTS = ("side_channel", "bootstrap", "http")
QUERY_TIMEOUT_S = 10.0

# run inside D's namespace (the harness's own cannot reach P's veth address): the ports of every
# rank's side channel, from P's bootstrap server's /query (vLLM's EngineEntry: worker_addr tp -> pp -> addr)
_QUERY = """
import json, sys, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
with opener.open(sys.argv[1] + "/query", timeout=float(sys.argv[2])) as r:
    data = json.loads(r.read(1 << 20))
ports = sorted({int(a.rsplit(":", 1)[1]) for e in data.values() for pp in e["worker_addr"].values()
                for a in pp.values()})
print(json.dumps(ports))
"""


class PortParams(LinkParams):
    port: Literal["side_channel", "bootstrap", "http"] = Field(
        ..., description="which of P's ports: side_channel (Mooncake's ZMQ side channel, D's pulls), "
                         "bootstrap (Mooncake's bootstrap server) or http (P's OpenAI server)")


def side_channel_ports(ctx: Any) -> list[int]:
    """P's side-channel ports, asked of its bootstrap server from D's namespace."""
    url = ctx.node("prefill:0").endpoints["bootstrap"]
    res = ctx.netns.run("a", [sys.executable, "-c", _QUERY, url, str(QUERY_TIMEOUT_S)],
                        timeout=QUERY_TIMEOUT_S + 5.0, check=False)
    try:
        ports = json.loads(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 else None
    except (ValueError, IndexError):
        ports = None
    if not ports:
        raise RuntimeError(f"P's side channel: its bootstrap server's /query gave no worker address "
                           f"(exit {res.returncode})")
    return [int(p) for p in ports]


def resolve(ctx: Any, which: str) -> list[int]:
    if which == "side_channel":
        return side_channel_ports(ctx)
    port = urlsplit(ctx.node("prefill:0").endpoints[which]).port
    if port is None:
        raise RuntimeError(f"P's {which} endpoint names no port")
    return [port]


class _PortFault(Fault):
    """iptables on one port of P; like faults/partition.py's, the rules are forgotten only once
    removed, so a heal that failed is tried again at teardown."""

    family = "pd"
    mode: ClassVar[str] = "drop"
    count_name: ClassVar[str] = "dropped"
    requires = ("netns", "root")
    Params = PortParams
    # the proxy answers a request whose P or bootstrap cannot be reached 502/504; a pull that cannot
    # reach P fails at D's load deadline (hardened: HTTP 500) or waits (upstream: stalled)
    may_cause = ("http_500", "http_502", "http_503", "http_504", "connect", "stalled")
    _tags = itertools.count(1)

    def __init__(self, params: Any, ctx: Any):
        super().__init__(params, ctx)
        self._ports: list[int] | None = None
        self._rules: list | None = None
        self._tag = f"pdchaos-{self.name.replace('_', '-')}-{next(self._tags)}"
        self._stopped: int | None = None

    def prepare(self) -> None:
        self._ports = resolve(self.ctx, self.params.port)

    def start(self) -> None:
        if self._rules is not None:
            return
        if self._ports is None:
            self._ports = resolve(self.ctx, self.params.port)
        self._rules = self.ctx.netns.partition(DIRECTIONS[self.params.direction], self.mode, tag=self._tag,
                                               ports=self._ports, port_side="b")
        self.ctx.event("partition", mode=self.mode, direction=self.params.direction, port=self.params.port,
                       ports=len(self._ports), rules=len(self._rules))

    def stop(self) -> None:
        if self._rules is None:
            return
        try:
            self._stopped = self.ctx.netns.stopped(self._tag)
        except Exception:  # noqa: BLE001 - the heal matters more than the count: fault_effect fails instead
            self._stopped = -1
        self.ctx.netns.heal(self._rules)
        self._rules = None
        self.ctx.event("healed", mode=self.mode, direction=self.params.direction, port=self.params.port)

    def effect(self) -> dict[str, Any] | None:
        return None if self._stopped is None else {self.count_name: self._stopped}

    def required_effect(self) -> dict[str, float]:
        return {self.count_name: 1}


@register
class RefusePort(_PortFault):
    """iptables REJECT (tcp-reset) on one port of P: connections to it are refused at once, and
    those open are reset by their next packet."""

    name = "refuse_port"
    mode = "reject"
    count_name = "refused"


@register
class PartitionPort(_PortFault):
    """iptables DROP on one port of P: its packets vanish, every other port works."""

    name = "partition_port"
    mode = "drop"
