"""Faults on the server process itself: nothing bound, killed, frozen, restarted.

All of them act through the topology (FaultContext): the server is a separate OS process, as
worker rank 0 is in a deployment. Each ``stop()`` heals what its ``start()`` did, once.
"""

from __future__ import annotations

import signal

from pydantic import Field

from .base import Fault, FaultContext, FaultParams, register


class _OnceFault(Fault):
    def __init__(self, params: FaultParams, ctx: FaultContext):
        super().__init__(params, ctx)
        self._active = False


@register
class ServerDown(_OnceFault):
    """Nothing bound on the endpoint: the server is stopped cleanly and started again at heal."""

    name = "server_down"
    categories = ("timeout",)

    def start(self) -> None:
        self._active = True
        self.ctx.stop_server()

    def stop(self) -> None:
        if self._active:
            self._active = False
            self.ctx.start_server()


@register
class ServerKill(_OnceFault):
    """The server process is killed with SIGKILL (mid-request when lookups are in flight); it is
    started again on the same endpoint at heal."""

    name = "server_kill"
    categories = ("timeout",)

    def start(self) -> None:
        self._active = True
        self.ctx.kill_server()

    def stop(self) -> None:
        if self._active:
            self._active = False
            self.ctx.start_server()


@register
class ServerFreeze(_OnceFault):
    """The server process is frozen with SIGSTOP (its sockets stay bound, nothing answers) and
    thawed with SIGCONT at heal."""

    name = "server_freeze"
    categories = ("timeout",)

    def start(self) -> None:
        self._active = True
        self.ctx.signal_server(signal.SIGSTOP)

    def stop(self) -> None:
        if self._active:
            self._active = False
            self.ctx.signal_server(signal.SIGCONT)


@register
class ServerRestart(_OnceFault):
    """The server is stopped and started again at once, on the same endpoint (lookups in flight
    at that moment are lost). Nothing is left to heal: ``stop()`` does nothing."""

    name = "server_restart"
    categories = ("timeout",)

    class Params(FaultParams):
        kill: bool = Field(False, description="SIGKILL instead of a clean stop")

    def start(self) -> None:
        if self.params.kill:
            self.ctx.kill_server()
        else:
            self.ctx.stop_server()
        self.ctx.start_server()

    def stop(self) -> None:
        return None
