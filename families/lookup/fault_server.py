"""The lookup server's process faults: the generic process faults (faults/process.py) fixed on
the ``server`` role, under the names the lookup scenarios use. Each may cause client timeouts."""

from __future__ import annotations

from pydantic import Field

from faults.base import FaultParams, register
from faults.process import Down, Kill, Restart, Stop


class _Server:
    family = "lookup"
    fixed_node = "server"
    categories = ("timeout",)
    Params = FaultParams


@register
class ServerDown(_Server, Down):
    """Nothing bound on the endpoint: the server is stopped cleanly and started again at heal."""

    name = "server_down"


@register
class ServerKill(_Server, Kill):
    """The server process is killed with SIGKILL (mid-request when lookups are in flight); it is
    started again on the same endpoint at heal."""

    name = "server_kill"


@register
class ServerFreeze(_Server, Stop):
    """The server process is frozen with SIGSTOP (its sockets stay bound, nothing answers) and
    thawed with SIGCONT at heal."""

    name = "server_freeze"


class _RestartParams(FaultParams):
    kill: bool = Field(False, description="SIGKILL instead of a clean stop")


@register
class ServerRestart(_Server, Restart):
    """The server is stopped and started again at once, on the same endpoint (lookups in flight
    at that moment are lost). Nothing is left to heal."""

    name = "server_restart"
    Params = _RestartParams
