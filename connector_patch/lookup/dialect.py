"""What the shared lookup server needs to know about one channel's wire format.

Two channels speak through :class:`~connector_patch.lookup.server.LookupServer`: vllm-ascend's
AscendStore lookup RPC (:data:`ASCEND`, the default) and vLLM's MooncakeStoreConnector admin
channel (``connector_patch.store.protocol.STORE``). They differ only in how a request looks and
what an ok reply carries; the deadline, the per-request boundary, the watchdog, the socket
rebuild, the counters and the error envelope are the same code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .protocol import RESET_FRAME, Limits, decode_request, encode_ok


@dataclass(frozen=True)
class Dialect:
    name: str
    is_reset: Callable[[Sequence[bytes]], bool]  # the admin reset request?
    decode_request: Callable[[Sequence[bytes], Limits], Any]  # validated request, or raises ProtocolError
    valid_result: Callable[[Any, Any], bool]  # may the backend's answer to this request be sent?
    encode_ok: Callable[[Any], bytes]  # the ok envelope of a backend's answer
    reset_ok: bytes  # the ok envelope of a reset that cleared the store


def _ascend_reset(frames: Sequence[bytes]) -> bool:
    return len(frames) == 1 and frames[0] == RESET_FRAME


def _ascend_valid(hit: Any, request: Any) -> bool:
    return type(hit) is int and 0 <= hit <= request.token_len


ASCEND = Dialect("ascend", _ascend_reset, decode_request, _ascend_valid, encode_ok, encode_ok(0))
