"""Faults that replace the lookup server by a misbehaving fake peer (fake_peer.py).

``start()`` asks the topology to swap the server process for ``pdchaos node fake-peer`` on the
same endpoint; ``stop()`` restores the real server (once: :class:`faults.base.OnceFault`). The
fault passes only the mode-specific arguments (``--mode``, ``--delay-ms``, ``--reply``); the
topology appends ``--endpoint``, ``--control``, ``--preload``, ``--block-size`` and ``--groups``
itself, so the fake peer answers with the same keys as the real server would.

The swap is a restart: for a few hundred milliseconds at each end of the window (measured with the
runner: ~0.3 s from stopping one process to the next one's READY) nothing is bound, so every peer
fault may also cause ``timeout`` failures, whatever else it causes.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from faults.base import Duration, FaultParams, OnceFault, register

from .wire import REPLY_KINDS


def _positive_delay(v: float) -> float:
    if not 0 < v <= 3600:
        raise ValueError("must be above 0 and at most 1h")
    return v


class _SwapFault(OnceFault):
    """Swap the server for a fake peer while the fault is active. OnceFault marks the fault before
    the swap: if it fails half-way (real server stopped, fake peer not ready), stop() still asks
    the topology to restore the real server."""

    family = "lookup"

    def peer_args(self) -> list[str]:  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    def inject(self) -> None:
        self.ctx.swap_server("fake-peer", self.peer_args())

    def heal(self) -> None:
        self.ctx.restore_server()


@register
class SlowPeer(_SwapFault):
    """A peer that answers correctly, but only after a delay (below or above the deadline)."""

    name = "slow_peer"
    categories = ("timeout",)

    class Params(FaultParams):
        delay: Duration = Field(description='how long each answer waits, e.g. "300ms"')

        _check_delay = field_validator("delay")(_positive_delay)

    def peer_args(self) -> list[str]:
        # A slow peer speaks the protocol of the target under test: correct but late answers, so
        # only lateness is tested (today's clients, the legacy model and upstream's, would misread
        # a v1 envelope as a number).
        mode = "legacy" if getattr(self.ctx, "target", "hardened") in ("legacy", "upstream") else "slow"
        return ["--mode", mode, "--delay-ms", str(max(1, round(self.params.delay * 1000)))]



@register
class SilentPeer(_SwapFault):
    """A peer that is bound and receives every request, but never answers."""

    name = "silent_peer"
    categories = ("timeout",)

    def peer_args(self) -> list[str]:
        return ["--mode", "silent"]


ReplyKind = Literal[tuple(REPLY_KINDS)]  # type: ignore[valid-type] - the fake peer's kinds, one list


@register
class MalformedReply(_SwapFault):
    """A peer that answers every request with one kind of broken reply."""

    name = "malformed_reply"
    categories = ("protocol", "timeout")
    may_cause = ("raised",)  # a client without a versioned error protocol (today's) raises on some kinds

    class Params(FaultParams):
        kind: ReplyKind = Field(description="which broken reply (wire.py REPLY_KINDS)")

    def peer_args(self) -> list[str]:
        return ["--mode", "malformed", "--reply", self.params.kind]


@register
class LegacyPeer(_SwapFault):
    """A peer speaking today's upstream protocol: one raw 4-byte u32 reply with the right hit."""

    name = "legacy_peer"
    categories = ("protocol", "timeout")

    def peer_args(self) -> list[str]:
        return ["--mode", "legacy"]
