"""The pd family's fake-peer fault: D is sent to a prefill peer that answers it wrongly.

``fake_prefill_peer {mode, count}`` starts a ``pd-fake-prefill`` node (harness/families/pd/
fake_prefill.py) in its own role, ``fake-prefill:0``, on two free loopback ports (its Mooncake
bootstrap and its side channel), then arms the proxy's ``redirect`` hook (harness/families/pd/
proxy.py) so the next ``count`` requests skip the real P and reach D with
``remote_bootstrap_addr`` = the fake's bootstrap and the fake's engine id. What D then finds is
the fake's ``mode``: a reply that is not msgpack, an ERROR reply, a FINISH naming other requests,
no reply at all, a bootstrap that answers 500, or a bootstrap that names another engine. The
real P is never asked for those requests, so it holds nothing for them.

Heal disarms only the redirect hook (``clear {hooks: [redirect]}``) and stops the fake node;
both are safe to repeat. D may still be waiting on the fake (mode ``silent``) after the heal:
that wait is what the scenario measures.
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
    family = "pd"
    Params = FakePrefillParams
    may_cause = ("http_502", "http_504")

    def inject(self) -> None:
        from harness.topology import NodeSpec, free_tcp_port

        bootstrap_port = free_tcp_port()
        side_port = free_tcp_port()
        while side_port == bootstrap_port:
            side_port = free_tcp_port()
        bootstrap = f"http://127.0.0.1:{bootstrap_port}"
        spec = NodeSpec("pd-fake-prefill", ["--bootstrap-port", str(bootstrap_port), "--side-port", str(side_port),
                                            "--mode", self.params.mode],
                        ready_timeout_s=READY_TIMEOUT_S,
                        endpoints={"bootstrap": bootstrap, "side": f"tcp://127.0.0.1:{side_port}"})
        self.ctx.start_node(ROLE, spec)
        self.ctx.control("proxy", "redirect", count=self.params.count, bootstrap=bootstrap)

    def heal(self) -> None:
        error: Exception | None = None
        try:
            self.ctx.control("proxy", "clear", hooks=["redirect"])
        except Exception as exc:  # noqa: BLE001 - the fake node is stopped anyway; raised below
            error = exc
        self.ctx.stop_node(ROLE)  # a no-op once it is stopped
        if error is not None:
            raise error
