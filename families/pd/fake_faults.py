"""The pd family's fake-peer fault: D is sent to a prefill peer that answers it wrongly.

``fake_prefill_peer {mode, count}`` starts a ``pd-fake-prefill`` node (families/pd/
fake_prefill.py) in its own role, ``fake-prefill:0``, on two free loopback ports (its Mooncake
bootstrap and its side channel). It starts it in ``prepare``, before t0, since a Python process may
take seconds to be READY on a busy machine (once over 5 s on CI: longer than the window). At ``at``
it only arms the proxy's ``redirect`` hook (families/pd/proxy.py), so the next ``count``
requests skip the real P and reach D with ``remote_bootstrap_addr`` = the fake's bootstrap and the
fake's engine id. What D then finds is the fake's ``mode``: a reply that is not msgpack, an ERROR
reply, a FINISH naming other requests, no reply at all, a bootstrap that answers 500, or a bootstrap
that names another engine. The real P is never asked for those requests, so it holds nothing for
them.

Heal records what happened in the journal (event ``fake_prefill_peer``: how many requests the proxy
redirected during the window, what the fake was asked and answered: counts only), disarms only the
redirect hook (``clear {hooks: [redirect]}``) and stops the fake node; both are safe to repeat. When
no request at all was redirected (no request came in the window), the heal raises once after
cleaning up (a ``fault_error``: harness_integrity fails) rather than let the scenario pass with
nothing tested. D may still be waiting on the fake (mode ``silent``) after the heal: that wait is
what the scenario measures.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from faults.base import FaultParams, OnceFault, register

from .fake_prefill import MODES

ROLE = "fake-prefill:0"
READY_TIMEOUT_S = 30.0  # a small Python process, but the machine may be busy with two vLLM servers

Mode = Literal[MODES]  # type: ignore[valid-type]


class FakePrefillParams(FaultParams):
    mode: Mode = Field(..., description="how the fake prefill answers D: " + ", ".join(MODES))
    count: int = Field(1, ge=1, le=1000, description="how many requests the proxy sends D to the fake")


@register
class FakePrefillPeer(OnceFault):
    """D pulls the next ``count`` requests from a fake prefill peer that answers by ``mode``."""

    name = "fake_prefill_peer"
    proxy_protocols = ("bootstrap",)  # the proxy's redirect sends D to a fake bootstrap server
    family = "pd"
    Params = FakePrefillParams
    may_cause = ("http_502", "http_504")
    # the heal stops the fake node: 0.4 s on a quiet machine, over 1 s once on CI with both vLLM
    # servers busy (a rate-1 run then had no op after the window)
    heal_allowance_s = 2.0

    def __init__(self, params: FakePrefillParams, ctx):  # noqa: ANN001 - a FaultContext
        super().__init__(params, ctx)
        self._redirected0: int | None = None  # the proxy's redirected counter when the hook was armed
        self._reported = False
        self._bootstrap: str | None = None  # the fake's bootstrap URL once it is started

    def prepare(self) -> None:
        """Start the fake before t0: a Python process that took over 5 s to be READY once on a busy
        CI machine, longer than the window it was started in (so no request was redirected)."""
        self._start_fake()

    def release(self) -> None:
        self.ctx.stop_node(ROLE)  # a no-op once it is stopped (the heal stops it)

    def inject(self) -> None:
        if self._bootstrap is None:  # not prepared (a direct start): start it now
            self._start_fake()
        self._redirected0 = _redirected(self.ctx)
        self.ctx.control("proxy", "redirect", count=self.params.count, bootstrap=self._bootstrap)

    def _start_fake(self) -> None:
        from harness.topology import NodeSpec, free_tcp_port

        from .topology import host_args

        bootstrap_port = free_tcp_port()
        side_port = free_tcp_port()
        while side_port == bootstrap_port:
            side_port = free_tcp_port()
        # where the proxy and D reach it: loopback, or on a cluster its pod's Service (its own pod)
        placement = getattr(self.ctx, "placement", None)
        host = (placement.host(ROLE) if placement is not None else None) or "127.0.0.1"
        bootstrap = f"http://{host}:{bootstrap_port}"
        args = ["--bootstrap-port", str(bootstrap_port), "--side-port", str(side_port), "--mode", self.params.mode]
        args += host_args(placement, ROLE)
        spec = NodeSpec("pd-fake-prefill", args, ready_timeout_s=READY_TIMEOUT_S,
                        endpoints={"bootstrap": bootstrap, "side": f"tcp://{host}:{side_port}"})
        self.ctx.start_node(ROLE, spec)
        # where it runs now (a runtime that names nodes by their address knows it only once started)
        started = (placement.host(ROLE) if placement is not None else None) or "127.0.0.1"
        self._bootstrap = f"http://{started}:{bootstrap_port}"

    def _report(self) -> int | None:
        """Journal what the window did (counts only); the number of redirected requests, or None
        when unknown."""
        now = _redirected(self.ctx)
        n = now - self._redirected0 if now is not None and self._redirected0 is not None else None
        fake: dict = {}
        try:
            fake = self.ctx.control(ROLE, "stats", timeout_ms=1000).get("counters") or {}
        except Exception:  # noqa: BLE001 - the fake may be gone already; the event says so
            pass
        self.ctx.event("fake_prefill_peer", mode=self.params.mode, redirected=n,
                       queries=fake.get("query_answers"), pulls=fake.get("pulls"), answers=fake.get("answers"),
                       unanswered=fake.get("unanswered"), malformed_pulls=fake.get("malformed_pulls"))
        answers = fake.get("query_answers") if isinstance(fake.get("query_answers"), dict) else {}
        d_queries = sum(int(v or 0) for k, v in answers.items() if k != "proxy") if answers else None
        self._effect = {"redirected": n, "d_queries": d_queries, "pulls": fake.get("pulls")}
        return n

    def effect(self) -> dict | None:
        return getattr(self, "_effect", None)

    def required_effect(self) -> dict[str, float]:
        # a redirected request reached the fake: D asked its bootstrap (not counting the proxy's
        # own query; the modes that fail the bootstrap end there, the others are pulled from)
        return {"redirected": 1, "d_queries": 1}

    def heal(self) -> None:
        redirected = None
        if not self._reported:
            redirected = self._report()
            self._reported = True
        error: Exception | None = None
        try:
            self.ctx.control("proxy", "clear", hooks=["redirect"])
        except Exception as exc:  # noqa: BLE001 - the fake node is stopped anyway; raised below
            error = exc
        self.ctx.stop_node(ROLE)  # a no-op once it is stopped
        if error is not None:
            raise error
        del redirected  # fault_effect judges it (no redirect: the window tested nothing, a harness error)


def _redirected(ctx) -> int | None:  # noqa: ANN001 - a FaultContext
    try:
        return int(ctx.control("proxy", "stats")["counters"]["redirected"])
    except Exception:  # noqa: BLE001 - a proxy that does not answer: unknown
        return None
