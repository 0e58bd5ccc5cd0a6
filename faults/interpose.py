"""Fault ``interpose``: one rule of the ZMQ interposer (faults/interposer.py) for a time window.

The fault's parameters are one interposer rule, flat in the scenario entry::

    - {type: interpose, at: 1s, for: 1s, direction: reply, action: delay, delay: 500ms}
    - {type: interpose, at: 2s, for: 1s, direction: reply, action: rewrite, rewrite: {named: version2},
       match: {probability: 0.3}}

``start()`` adds the rule on the interposer's control channel under this fault's own id, and
``stop()`` removes it (once, :class:`faults.base.OnceFault`), so overlapping interpose faults do
not undo each other. A probability
rule without a seed gets one drawn from the scenario's seeded ``ctx.rng``: runs repeat.
The scenario must run with the interposer in the link (``requires = ("interposer",)``).
"""

from __future__ import annotations

import itertools

from .base import FaultContext, FaultParams, OnceFault, delay_categories, register
from .interposer import Rule

_ids = itertools.count(1)


@register
class Interpose(OnceFault):
    """A ZMQ man-in-the-middle rule: delay, drop, duplicate, truncate or rewrite messages."""

    name = "interpose"
    requires = ("interposer",)

    class Params(Rule):
        pass

    def __init__(self, params: FaultParams, ctx: FaultContext):
        super().__init__(params, ctx)
        self.rule_id = f"interpose-{next(_ids)}"

    def wire_rule(self) -> dict:
        """The rule as sent on the control channel (durations as strings, a drawn seed if needed)."""
        rule = self.params.rule_fields()  # type: ignore[attr-defined]
        if self.params.match.probability is not None and self.params.seed is None:  # type: ignore[attr-defined]
            rule["seed"] = self.ctx.rng.randrange(2**32)
        return rule

    def inject(self) -> None:
        self.ctx.control("interposer", "add_rule", id=self.rule_id, rule=self.wire_rule())

    def heal(self) -> None:
        self.ctx.control("interposer", "remove_rule", id=self.rule_id)

    def expected_categories(self) -> tuple[str, ...]:
        p: Rule = self.params  # type: ignore[assignment]
        if p.action == "drop":
            return ("timeout",)
        if p.action == "delay":
            return delay_categories(self.ctx, p.delay)
        if p.action == "duplicate":
            return ()
        # truncate / rewrite: a broken reply is a protocol failure; a broken request makes the
        # server answer with an error envelope (server_error).
        out = []
        if p.direction in ("reply", "both"):
            out.append("protocol")
        if p.direction in ("request", "both"):
            out.append("server_error")
        return tuple(out)

    def possible_categories(self) -> tuple[str, ...]:
        p: Rule = self.params  # type: ignore[assignment]
        extra: tuple[str, ...] = ()
        if p.action in ("truncate", "rewrite") and p.direction in ("reply", "both"):
            extra = ("raised",)  # a client without a versioned error protocol (today's) raises on a broken reply
        return tuple(dict.fromkeys(super().possible_categories() + extra))
