"""Faults of vLLM's store admin channel (``topology.stack: vllm-store``).

``malformed_store_requests``: :class:`fault_requests.MalformedRequests` with the store channel's
bad requests (upstream's tagged frames: a lookup short of frames, ints of the wrong width, hashes
that do not split, an unknown tag, a reset with a payload, ...) and its v1 replies. vLLM 0.32.0's
``LookupKeyServer`` validates nothing: ``[b"lookup"]`` kills its thread, and every later lookup of
the scheduler waits for ever. The hardened server answers each with one error envelope.

``stuck_puts``: the worker's send queue holds puts that do not land (``count`` puts, each landing
``hold`` after the fault starts, or at heal): a reset in the window must drain them first.
Upstream's reset waits on ``request_queue.join()`` with no bound; the hardened one drains within
its deadline and otherwise reports the reset failed.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from connector_patch.lookup.protocol import MAX_TOKEN_LEN, Code
from connector_patch.store.protocol import decode_reply as decode_store_reply

from faults.base import Duration, FaultParams, OnceFault, register

from .fault_requests import MalformedRequests

StoreRequestKind = Literal["frame_count", "int_width", "bad_hashes", "unknown_tag", "reset_payload",
                           "oversized_token_len", "too_many_hashes"]
STORE_REQUEST_KINDS: tuple[str, ...] = StoreRequestKind.__args__  # type: ignore[attr-defined]

EXPECTED_STORE_CODE = {
    "frame_count": Code.BAD_FRAME_COUNT,
    "int_width": Code.BAD_INT_FRAME,
    "bad_hashes": Code.BAD_HASHES,
    "unknown_tag": Code.BAD_ADMIN,
    "reset_payload": Code.BAD_ADMIN,
    "oversized_token_len": Code.BAD_TOKEN_LEN,
    "too_many_hashes": Code.TOO_MANY_HASHES,
}

_TAG, _N, _HL, _BLOB = b"lookup", (64).to_bytes(4, "big"), (32).to_bytes(2, "big"), b"\xab" * 64


def bad_store_requests(kind: str) -> list[list[bytes]]:
    """The frame lists of one kind; every other field is valid, so the hardened server's answer
    is EXPECTED_STORE_CODE[kind]."""
    if kind == "frame_count":
        return [[_TAG], [_TAG, _N], [_TAG, _N, _HL], [_TAG, _N, _HL, _BLOB, b""]]
    if kind == "int_width":
        return [[_TAG, _N[1:], _HL, _BLOB], [_TAG, b"\x00" + _N, _HL, _BLOB], [_TAG, _N, _HL[1:], _BLOB],
                [_TAG, _N, b"\x00" + _HL, _BLOB]]
    if kind == "bad_hashes":
        return [[_TAG, _N, _HL, _BLOB[:-1]], [_TAG, _N, (0).to_bytes(2, "big"), _BLOB],
                [_TAG, _N, _HL, b""], [_TAG, _N, (65).to_bytes(2, "big"), b"\xab" * 65]]
    if kind == "unknown_tag":
        return [[b"lookupx", _N, _HL, _BLOB], [b""], [b"LOOKUP", _N, _HL, _BLOB]]
    if kind == "reset_payload":  # upstream runs a reset for these: it reads frame 0 only
        return [[b"reset", b""], [b"reset", _N]]
    if kind == "oversized_token_len":
        return [[_TAG, (MAX_TOKEN_LEN + 1).to_bytes(4, "big"), _HL, _BLOB]]
    if kind == "too_many_hashes":
        return [[_TAG, _N, (1).to_bytes(2, "big"), b"\xab" * 70_000]]
    raise ValueError(f"unknown request kind {kind!r}")


@register
class MalformedStoreRequests(MalformedRequests):
    """Malformed requests of vLLM's store channel sent to the real server; each must get exactly
    one error envelope (event ``malformed_requests``, as its AscendStore sibling)."""

    name = "malformed_store_requests"

    class Params(MalformedRequests.Params):
        kinds: list[StoreRequestKind] = Field(  # type: ignore[assignment]
            default_factory=lambda: list(STORE_REQUEST_KINDS), min_length=1,
            description="which kinds of bad request (default: all, frame_count first)")

    @staticmethod
    def frames_of(kind: str) -> list[list[bytes]]:
        return bad_store_requests(kind)

    @staticmethod
    def decode(body: list[bytes]):
        return decode_store_reply(body, None)


@register
class StuckPuts(OnceFault):
    """Puts in the worker's send queue that do not land until ``hold`` has passed (or the heal)."""

    name = "stuck_puts"
    family = "lookup"
    categories = ("backend_error", "timeout")  # a reset in the window is refused (or times out)

    class Params(FaultParams):
        count: int = Field(3, ge=1, le=10_000, description="puts queued")
        hold: Duration = Field(60.0, description="each lands this long after the fault starts (or at heal)")

    def inject(self) -> None:
        self.ctx.server_control("queue_puts", count=self.params.count, delay_ms=max(0, round(self.params.hold * 1000)))

    def heal(self) -> None:
        self.ctx.server_control("release_puts")
