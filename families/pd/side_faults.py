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
hands back its counts as one JSON line. Where the runtime can keep a process running there
(``Placement.start_beside``: a cluster's exec with its stdin open) the sender is started in
:meth:`SideChannelGarbage.prepare`, before t0 (``--wait``: it asks P's bootstrap server and makes
its ZMTP session with P's ROUTER, says ``ready``, then waits for one line), and the injection only
signals it: the message goes at the window's start, as the local send does, not an exec's start
later (measured on k8s-local, 2026-12-07: 0.5 s, past the one request the window had). Because P may look healthy and
drained afterwards while its listener is gone, a P that did not answer is tainted: never lent to a
later scenario. A P that answered has a listener that took the message and went back to its loop
(the hardened one answers every message): it may be lent on, which spares the next scenario a cold
start of P (about 30 s here). Were it to die after answering, this run's recovery check and the next
scenario's requests would show it.
"""

from __future__ import annotations

import json
from typing import Any

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

    def _bootstrap(self) -> str:
        """P's bootstrap URL as peers reach it now (a cluster without DNS: its pod's address, known
        once it runs), not the endpoint named before it ran."""
        bootstrap = self.ctx.node("prefill:0").endpoints["bootstrap"]
        placement = getattr(self.ctx, "placement", None)
        host = placement.host("prefill:0") if placement is not None else None
        if host:
            from urllib.parse import urlsplit

            u = urlsplit(bootstrap)
            bootstrap = u._replace(netloc=f"{host}:{u.port}" if u.port else host).geturl()
        return bootstrap

    def prepare(self) -> None:
        """Where the send runs beside D and the runtime keeps a process running there, start the
        sender now (before t0): it finds P's side channel and makes its session, and
        :meth:`inject` only signals it. Locally nothing (the send takes milliseconds at inject)."""
        placement = getattr(self.ctx, "placement", None)
        start = getattr(placement, "start_beside", None)
        if start is None:
            return
        beside = start("decode:0", __name__, ["--wait", self._bootstrap(), str(self.params.frames)], BESIDE_EXEC_S)
        if beside is None:  # this machine reaches P's side channel: sent at inject
            return
        self._beside = beside
        line = beside.readline(BESIDE_EXEC_S)
        try:
            ready = json.loads(line)
        except ValueError:
            ready = {"error": f"the sender beside D said {line[:120]!r}, not its ready line"}
        if "error" in ready or not ready.get("ready"):
            self.release()
            # its state unknown (nothing sent yet, but the run will not say more): never lend it on
            self.ctx.taint("prefill:0", "a side_channel_garbage sender could not be made ready")
            raise RuntimeError(f"side_channel_garbage: {ready.get('error', 'its sender was not ready')}")

    def release(self) -> None:
        beside, self._beside = getattr(self, "_beside", None), None
        if beside is not None:
            beside.close()

    def inject(self) -> None:
        ctx = self.ctx
        got: dict = {}
        placement = getattr(ctx, "placement", None)
        try:
            beside = getattr(self, "_beside", None)
            if beside is not None:  # started in prepare beside D, its session made: the signal sends it
                try:
                    beside.write("go")
                    out = beside.readline(BESIDE_EXEC_S)
                finally:
                    self.release()
            else:
                # where the side channel P announces is reached: locally here; on a cluster from D's
                # pod (P binds it to its pod's address only, which this machine does not reach)
                out = placement.run_beside("decode:0", __name__, [self._bootstrap(), str(self.params.frames)],
                                           BESIDE_EXEC_S) if placement is not None else None
            if out is None:
                got = send(self._bootstrap(), self.params.frames)
            elif out.strip():
                got = json.loads(out.strip().splitlines()[-1])
            else:
                got = {"error": "the sender beside D ended without its counts"}
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


class Sender:
    """P's side channel found through its bootstrap server (``bootstrap``, its URL as peers reach
    it) and a ZMQ DEALER connected there; ``session``: the ZMTP handshake with P's ROUTER succeeded
    (a DEALER queues a message for a peer it never reached and says nothing, so nothing is sent
    without it). ``error``: the bootstrap server did not answer its /query."""

    def __init__(self, bootstrap: str) -> None:
        import zmq

        from .metrics import http_get

        self.error: str | None = None
        self.session = False
        self.zc = self.sock = None
        status, body = http_get(bootstrap + "/query", 5.0)
        if status != 200:
            self.error = f"P's bootstrap answered HTTP {status}"
            return
        entry = json.loads(body)["0"]["worker_addr"]["0"]["0"]
        self.zc = zmq.Context()
        s = self.sock = self.zc.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, LINGER_MS)
        s.setsockopt(zmq.RCVTIMEO, ANSWER_WAIT_MS)
        mon = s.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        try:
            s.connect(entry)
            if mon.poll(HANDSHAKE_WAIT_MS, zmq.POLLIN):
                from zmq.utils.monitor import recv_monitor_message

                self.session = recv_monitor_message(mon)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED
        finally:
            s.disable_monitor()
            mon.close(0)

    def fire(self, frames: int) -> dict:
        """Send one message of ``frames`` frames over the session (none without one), wait up to
        ANSWER_WAIT_MS for an answer, close; whether a session was made, P ``answered`` and the
        reply's size (counts only, never bytes)."""
        import zmq

        if self.error is not None:
            return {"error": self.error}
        answered, size = False, 0
        try:
            if self.session:
                self.sock.send_multipart([b"pdchaos-garbage"] * (frames - 1))
                try:
                    reply = self.sock.recv_multipart()
                    answered, size = True, sum(len(f) for f in reply)
                except zmq.Again:
                    pass
        finally:
            self.close()
        return {"session": self.session, "answered": answered, "reply_bytes": size}

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.zc is not None:
            self.zc.term()
            self.zc = None


def send(bootstrap: str, frames: int) -> dict:
    """Ask P's bootstrap server (``bootstrap``, its URL as peers reach it) for its side channel and
    send it one message of ``frames`` frames once a ZMTP session with P's ROUTER is up; whether a
    session was made (``session``), P ``answered`` and the reply's size (counts only, never bytes)."""
    sender = Sender(bootstrap)
    try:
        return sender.fire(frames)
    finally:
        sender.close()


def wait_and_send(bootstrap: str, frames: int, lines: Any, out: Any) -> int:
    """``--wait``: make the session now, say so (``{"ready": true, "session": ...}`` or an error), then
    send at the first line read from ``lines`` (the harness's signal) and hand back the counts; at
    end of input without a signal nothing is sent (``{"cancelled": true}``)."""
    try:
        sender = Sender(bootstrap)
    except Exception as exc:  # noqa: BLE001 - one line back to the harness, never a traceback
        print(json.dumps({"error": f"{type(exc).__name__}: {str(exc)[:200]}"}), file=out, flush=True)
        return 0
    try:
        if sender.error is not None:
            print(json.dumps({"error": sender.error}), file=out, flush=True)
            return 0
        print(json.dumps({"ready": True, "session": sender.session}), file=out, flush=True)
        if not lines.readline():
            print(json.dumps({"cancelled": True}), file=out, flush=True)
            return 0
        try:
            got = sender.fire(frames)
        except Exception as exc:  # noqa: BLE001
            got = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        print(json.dumps(got), file=out, flush=True)
        return 0
    finally:
        sender.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m families.pd.side_faults BOOTSTRAP_URL FRAMES``: :func:`send` where a runtime runs
    it (a pod beside D), its result as one JSON line; ``--wait BOOTSTRAP_URL FRAMES``:
    :func:`wait_and_send` (the session first, the send at the harness's signal on stdin)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) == 3 and args[0] == "--wait" and args[2].isdigit():
        return wait_and_send(args[1], int(args[2]), sys.stdin, sys.stdout)
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
