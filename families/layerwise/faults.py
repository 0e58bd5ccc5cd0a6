"""The layerwise family's faults (``family = "layerwise"``); the link faults are the generic
Toxiproxy ones (``down``, ``timeout``) with ``topology.link: toxiproxy``.

* ``listener_garbage``: malformed and unexpected messages sent to D's listener the way P's signal
  sender sends (a REQ socket, ``tries`` tries of ``try_timeout`` each, a new socket per try, the
  messages at once); one ``listener_probe`` event per message: answered or not, with what, after
  how many tries and how long. Never logs frames.
* ``transfer_error``: P's transfer engine fails every write while the window lasts (``raise``: the
  binding raises; ``ret``: it returns -1).
* ``transfer_slow``: every write of P's transfer engine takes ``delay`` longer while the window
  lasts (a congested or degraded link: the write succeeds, late).
* ``prefill_slow``: every layer of P's forward passes begun in the window takes ``delay``
  longer (a slow prefill: under the example proxy, D's POST waits for all of it).
* ``metaserver_fault``: the proxy's metaserver answers 500 (``error``), never answers (``hang``)
  or closes the connection unanswered (``drop``), or its forwards to P fail (``forward_fails``) while
  the window lasts.
"""

from __future__ import annotations

import threading
import time
from typing import Literal

from pydantic import Field

from faults.base import LASTING, Duration, Fault, FaultParams, OnceFault, register

# what each probe sends after the REQ envelope (never a real request id: "x")
PROBES: dict[str, list[bytes]] = {
    "not_msgpack": [b"\xc1\xc1"],
    "not_a_tuple": [b"\x07"],  # msgpack 7
    "unknown_type": [b"\x92\xc4\x09bogus_msg\xa1x"],  # (b"bogus_msg", "x")
    "missing_fields": [b"\x92\xc4\x10done_sending_msg\xa1x"],  # (DONE, "x"): no count, no sender
    "two_payloads": [b"\x92\xc4\x10done_sending_msg\xa1x", b"extra"],
}


@register
class ListenerGarbage(OnceFault):
    """Malformed and unexpected messages to D's listener; records whether and when each is answered."""

    family = "layerwise"
    name = "listener_garbage"
    # upstream D's listener thread may die of it for good: later loads then fail or never finish
    may_cause = ("failed_load",)
    tail_s = LASTING

    class Params(FaultParams):
        tries: int = Field(3, ge=1, le=5, description="tries per message (upstream's sender: 3)")
        try_timeout: Duration = Field(1.0, description="wait for an answer per try (upstream's sender: 1 s)")

    def _probe(self, endpoint: str, kind: str, frames: list[bytes]) -> None:
        import zmq

        p = self.params
        t0 = time.monotonic()
        answer, tries = None, 0
        for tries in range(1, p.tries + 1):
            ctx = zmq.Context()
            try:
                sock = ctx.socket(zmq.REQ)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SNDTIMEO, int(p.try_timeout * 1000))
                sock.connect(endpoint)
                sock.send_multipart(frames)
                if sock.poll(int(p.try_timeout * 1000), zmq.POLLIN):
                    answer = sock.recv()
                    break
            except zmq.ZMQError:
                pass
            finally:
                ctx.destroy(linger=0)
            time.sleep(0.1)
        code = None if answer is None else (answer.decode() if answer.startswith((b"NACK", b"ACK")) else "other")
        self.ctx.event("listener_probe", probe=kind, answered=answer is not None, reply=code, tries=tries,
                       elapsed_ms=round((time.monotonic() - t0) * 1000, 1))

    def inject(self) -> None:
        endpoint = self.ctx.node("decode").endpoints["listener"]
        threads = [threading.Thread(target=self._probe, args=(endpoint, k, f), name=f"probe-{k}", daemon=True)
                   for k, f in PROBES.items()]
        for th in threads:
            th.start()
        bound = self.params.tries * (self.params.try_timeout + 0.2) + 2.0
        for th in threads:
            th.join(bound)


@register
class TransferError(Fault):
    """P's transfer engine fails every write during the window."""

    family = "layerwise"
    name = "transfer_error"
    may_cause = ("failed_load",)

    class Params(FaultParams):
        mode: Literal["raise", "ret"] = Field("raise", description="raise: the engine raises; ret: it returns -1")
        decode: Literal["all", "decode", "decode2"] = Field(
            "all", description="whose writes fail: every D's, or one D's session only (decodes: 2)")

    def start(self) -> None:
        port = 0
        if self.params.decode != "all":
            port = int(self.ctx.node(self.params.decode).endpoints["listener"].rpartition(":")[2])
        self.ctx.control("prefill", "engine_fault", mode=self.params.mode, port=port)

    def stop(self) -> None:
        self.ctx.control("prefill", "engine_fault", mode="ok")


def _heal_when_idle(ctx, bound_s: float, cmd: str, busy: str, **fields) -> None:  # noqa: ANN001
    """Send P the healing ``cmd`` until its answer says no slowed work (``busy``) is left in
    flight, for ``bound_s`` at most."""
    bound = time.monotonic() + bound_s
    while ctx.control("prefill", cmd, **fields).get(busy, 0) and time.monotonic() < bound:
        time.sleep(0.05)


@register
class TransferSlow(Fault):
    """Every write of P's transfer engine started in the window takes ``delay`` longer (it
    succeeds): P's layers reach D late, past D's deadline when ``delay`` exceeds it."""

    family = "layerwise"
    name = "transfer_slow"
    may_cause = ("failed_load",)
    heal_allowance_s = 10.0  # the heal waits out the slow writes in flight: at most ``delay`` (<= 10 s)

    @classmethod
    def heal_allowance(cls, spec) -> float:  # noqa: ANN001
        return float(getattr(spec, "delay", cls.heal_allowance_s)) + 0.5

    class Params(FaultParams):
        delay: Duration = Field(2.0, gt=0, le=10.0, description="added to every write (milliseconds resolution)")

    def start(self) -> None:
        self.ctx.control("prefill", "engine_fault", mode="ok", delay_ms=int(float(self.params.delay) * 1000))

    def stop(self) -> None:
        """Healed once no slow write is in flight any more (the last one started in the window
        ends up to ``delay`` after it)."""
        _heal_when_idle(self.ctx, float(self.params.delay) + 2.0, "engine_fault", "delayed_in_flight", mode="ok")


@register
class PrefillSlow(Fault):
    """P's forward passes begun in the window take ``delay`` longer per layer (its KV still
    correct): a prefill longer than D's POST bound under the example proxy, which answers D's
    POST only once P completed."""

    family = "layerwise"
    name = "prefill_slow"
    may_cause = ("failed_load",)
    heal_allowance_s = 10.0  # the heal waits out a slow forward pass in flight (layers x delay)

    @classmethod
    def heal_allowance(cls, spec) -> float:  # noqa: ANN001
        return 2 * float(getattr(spec, "delay", 5.0)) + 0.5

    class Params(FaultParams):
        delay: Duration = Field(0.5, gt=0, le=5.0, description="added to every layer of a forward pass")
        within_deadline: bool = Field(False, description="the slowed prefill still ends within D's deadline "
                                      "(the scenario makes sure: no queue behind it): the fault then explains no "
                                      "failure, a request it slowed must complete")

    def possible_categories(self) -> tuple[str, ...]:
        return () if self.params.within_deadline else super().possible_categories()

    def start(self) -> None:
        self.ctx.control("prefill", "prefill_delay", layer_s=float(self.params.delay))

    def stop(self) -> None:
        """Healed once no slow forward pass runs any more."""
        _heal_when_idle(self.ctx, 2 * float(self.params.delay) + 2.0, "prefill_delay", "slow_forwards", layer_s=0.0)


@register
class MetaserverFault(Fault):
    """The proxy's metaserver fails D's POSTs during the window."""

    family = "layerwise"
    name = "metaserver_fault"
    may_cause = ("failed_load", "refused")

    class Params(FaultParams):
        mode: Literal["error", "hang", "drop", "forward_fails"] = Field(
            "hang", description="error: HTTP 500; hang: never answers; drop: closes unanswered; forward_fails: "
                                "every forward to P fails (answered as topology.metaserver answers a failed forward)")

    def start(self) -> None:
        self.ctx.control("metaserver", "metaserver_fault", mode=self.params.mode)

    def stop(self) -> None:
        self.ctx.control("metaserver", "metaserver_fault", mode="ok")
