"""Process faults on the nodes of any family, by role (Jepsen's db-nemesis: kill, pause, restart).

``node`` is a node spec: a role (``server``, ``prefill:0``), every role with a prefix
(``prefill:*``) or ``all``. Each fault acts through the topology (harness/topology.py), so it
works for every family whose nodes are processes; ``stop()`` heals what ``start()`` did, once.
A family may subclass one with a fixed node (the lookup family's ``server_kill`` is ``kill`` of
its ``server``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from .base import FaultParams, OnceFault, register

NODE_SPEC = r"^(all|[a-z][a-z0-9_-]*(:([0-9]+|\*))?)$"


class NodeParams(FaultParams):
    node: str = Field(..., pattern=NODE_SPEC, description="role, role prefix with :*, or all")


class _NodeFault(OnceFault):
    """Acts on every role of the node spec (``act``), and at heal undoes it (``undo``) for the
    roles it acted on, in the same order; a spec naming no role fails at start and heals nothing."""

    Params = NodeParams
    fixed_node: ClassVar[str | None] = None  # subclasses for one role set this and drop ``node``

    def targets(self) -> list[str]:
        return self.ctx.roles(self.fixed_node or self.params.node)

    def act(self, role: str) -> bool | None:
        """Act on one role; True when the topology saw the intended state after (the process
        gone, frozen, or replaced), False when it did not, None when it cannot tell."""
        raise NotImplementedError

    def undo(self, role: str) -> None:
        """Default: nothing to undo."""

    def inject(self) -> None:
        self._roles: list[str] = []
        self._seen: list[bool | None] = []
        for role in self.targets():
            self._seen.append(self.act(role))
            self._roles.append(role)

    def effect(self) -> dict[str, Any] | None:
        seen = getattr(self, "_seen", [])
        return {"acted": len(seen), "seen": sum(1 for x in seen if x), "unseen": sum(1 for x in seen if x is False)}

    def required_effect(self) -> dict[str, float]:
        return {"acted": 1, "seen": 1}

    def heal(self) -> None:
        while self._roles:  # each role leaves the list once undone: a retried heal resumes
            self.undo(self._roles[0])
            self._roles.pop(0)


@register
class Down(_NodeFault):
    """The node is stopped cleanly (nothing bound on its endpoints) and started again at heal."""

    name = "node_down"
    node_ops = ("stop",)

    def act(self, role: str) -> bool | None:
        return self.ctx.stop_node(role)

    def undo(self, role: str) -> None:
        self.ctx.start_node(role)


@register
class Kill(_NodeFault):
    """The node is killed with SIGKILL (mid-request when requests are in flight) and started again
    on the same endpoints at heal."""

    name = "kill"
    node_ops = ("kill",)

    def act(self, role: str) -> bool | None:
        return self.ctx.kill_node(role)

    def undo(self, role: str) -> None:
        self.ctx.start_node(role)


@register
class Stop(_NodeFault):
    """The node is frozen with SIGSTOP (its sockets stay bound, nothing answers) and thawed with
    SIGCONT at heal."""

    name = "stop"
    node_ops = ("freeze",)

    def act(self, role: str) -> bool | None:
        return self.ctx.freeze_node(role)

    def undo(self, role: str) -> None:
        self.ctx.thaw_node(role)


class RestartParams(NodeParams):
    kill: bool = Field(False, description="SIGKILL instead of a clean stop")


@register
class Restart(_NodeFault):
    """The node is stopped and started again at once on the same endpoints (requests in flight
    at that moment are lost). Nothing is left to heal."""

    name = "restart"
    node_ops = ("restart",)
    Params = RestartParams

    def act(self, role: str) -> bool | None:
        return self.ctx.restart_node(role, kill=self.params.kill)
