"""The pd family's side-channel fault: a message P's Mooncake side channel cannot take.

``side_channel_garbage {frames}`` asks P's bootstrap server for its side-channel address (the
``/query`` D uses), connects a ZMQ DEALER there and sends one message of ``frames`` frames as P's
ROUTER receives them (the identity frame included), once the ZMTP handshake with P's ROUTER
succeeded (a socket monitor sees it: the message then went over a session P took part in; without
it nothing is sent and the fault shows no effect), then waits up to 1 s for an answer. vLLM
0.32.0's listener (``MooncakeConnectorWorker._mooncake_sender_listener``) unpacks exactly two
frames: any other count raises, and the listener thread exits for good, closing the side channel
(every later pull then waits D's receive timeout). The event ``side_channel_garbage`` records
whether an answer came (counts and a status only, never bytes). Where this machine does not reach
the address P announces (a cluster: P's pod address), the same send runs beside D, in its pod
(``python -m families.pd.side_faults BOOTSTRAP FRAMES`` through ``Placement.run_beside``), and
hands back its counts as one JSON line. Because P may look healthy and
drained afterwards while its listener is gone, a P that did not answer is tainted: never lent to a
later scenario. A P that answered has a listener that took the message and went back to its loop
(the hardened one answers every message): it may be lent on, which spares the next scenario a cold
start of P (about 30 s here). Were it to die after answering, this run's recovery check and the next
scenario's requests would show it.
"""

from __future__ import annotations

import json

from pydantic import Field

from faults.base import LASTING, FaultParams, OnceFault, register

ANSWER_WAIT_MS = 1000
HANDSHAKE_WAIT_MS = 5000  # the ZMTP handshake with P's ROUTER (from a pod: an exec on a loaded kubelet)
BESIDE_EXEC_S = 60.0  # the whole send run beside D (a cluster's exec: Python's start, the handshake, the answer)
LINGER_MS = 1000  # the message leaves the socket before it closes
ANSWERED_TAIL_S = 1.0  # a listener that answered: the default tail of a fault with no heal to wait for


class SideGarbageParams(FaultParams):
    frames: int = Field(3, ge=2, le=16, description="frames P's ROUTER receives, identity included (vLLM "
                                                    "expects 2)")


@register
class SideChannelGarbage(OnceFault):
    """One message of ``frames`` frames on P's Mooncake side channel."""

    name = "side_channel_garbage"
    proxy_protocols = ("bootstrap",)  # vLLM's side channel, found through P's bootstrap server
    # the side channel is where P's bootstrap answer says, and vLLM binds it there only (VLLM_HOST_IP):
    # a forward to P's pod (its loopback) does not deliver it (measured on k8s-local: no ZMTP session,
    # sent 0); a runtime whose nodes are elsewhere runs the send beside D (Placement.run_beside)
    requires = ("node_address",)
    family = "pd"
    Params = SideGarbageParams
    # upstream P's listener thread dies of it for good: every later request may stall or fail
    may_cause = ("http_502", "http_504", "stalled")
    tail_s = LASTING

    def inject(self) -> None:
        ctx = self.ctx
        got: dict = {}
        placement = getattr(ctx, "placement", None)
        try:
            bootstrap = ctx.node("prefill:0").endpoints["bootstrap"]
            host = placement.host("prefill:0") if placement is not None else None
            if host:  # where peers reach P now (a cluster without DNS: its pod's address, known once it runs)
                from urllib.parse import urlsplit

                u = urlsplit(bootstrap)
                bootstrap = u._replace(netloc=f"{host}:{u.port}" if u.port else host).geturl()
            # where the side channel P announces is reached: locally here; on a cluster from D's pod
            # (P binds it to its pod's address only, which this machine does not reach)
            out = placement.run_beside("decode:0", __name__, [bootstrap, str(self.params.frames)], BESIDE_EXEC_S) \
                if placement is not None else None
            got = json.loads(out.strip().splitlines()[-1]) if out is not None else send(bootstrap, self.params.frames)
            if "error" in got:
                raise RuntimeError(f"side_channel_garbage: {got['error']}")
        finally:
            if not got.get("answered"):  # no answer (or the send never happened): its listener may be gone
                ctx.taint("prefill:0", "a side_channel_garbage fault may have killed its listener")
        shaken, answered = bool(got.get("session")), bool(got.get("answered"))
        ctx.event("side_channel_garbage", frames=self.params.frames, session=int(shaken), answered=answered,
                  reply_bytes=int(got.get("reply_bytes") or 0))
        self._effect = {"sent": int(shaken), "answered": int(answered)}

    def effect(self) -> dict | None:
        return getattr(self, "_effect", None)

    def tail_after_heal(self) -> float | None:
        """P answered: its listener took the message and lives, so nothing lasts past the heal (the
        declared LASTING tail is for a listener that died: upstream's). A failure after the window
        and a second is then not this fault's doing."""
        return ANSWERED_TAIL_S if (self.effect() or {}).get("answered") else None

    def required_effect(self) -> dict[str, float]:
        return {"sent": 1}  # whether P answered is the system's part: judged by node_alive and the workload


def send(bootstrap: str, frames: int) -> dict:
    """Ask P's bootstrap server (``bootstrap``, its URL as peers reach it) for its side channel and
    send it one message of ``frames`` frames once a ZMTP session with P's ROUTER is up; whether a
    session was made (``session``), P ``answered`` and the reply's size (counts only, never bytes)."""
    import zmq

    from .metrics import http_get

    status, body = http_get(bootstrap + "/query", 5.0)
    if status != 200:
        return {"error": f"P's bootstrap answered HTTP {status}"}
    entry = json.loads(body)["0"]["worker_addr"]["0"]["0"]
    answered, size, shaken = False, 0, False
    zc = zmq.Context()
    try:
        s = zc.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, LINGER_MS)
        s.setsockopt(zmq.RCVTIMEO, ANSWER_WAIT_MS)
        # sent only over a ZMTP session P's ROUTER took part in: a DEALER queues a message for a
        # peer it never reached and says nothing
        mon = s.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        try:
            s.connect(entry)
            if mon.poll(HANDSHAKE_WAIT_MS, zmq.POLLIN):
                from zmq.utils.monitor import recv_monitor_message

                shaken = recv_monitor_message(mon)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED
        finally:
            s.disable_monitor()
            mon.close(0)
        if shaken:
            s.send_multipart([b"pdchaos-garbage"] * (frames - 1))
            try:
                reply = s.recv_multipart()
                answered, size = True, sum(len(f) for f in reply)
            except zmq.Again:
                pass
        s.close()
    finally:
        zc.term()
    return {"session": shaken, "answered": answered, "reply_bytes": size}


def main(argv: list[str] | None = None) -> int:
    """``python -m families.pd.side_faults BOOTSTRAP_URL FRAMES``: :func:`send` where a runtime runs
    it (a pod beside D), its result as one JSON line."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not args[1].isdigit():
        print(json.dumps({"error": "usage: BOOTSTRAP_URL FRAMES"}))
        return 2
    try:
        out = send(args[0], int(args[1]))
    except Exception as exc:  # noqa: BLE001 - one line back to the harness, never a traceback
        out = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
