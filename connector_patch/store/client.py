"""The scheduler's side of vLLM's store admin channel: the lookup package's client, store dialect.

Same deadline, fail-open, socket recovery, counters and rate-limited warnings as the AscendStore
client (``connector_patch.lookup.client.LookupClient``, DESIGN.md "Client state machine"); only the
request frames (upstream's tagged lookup) and the ok reply (hit plus tail boundaries) differ.
"""

from __future__ import annotations

import time
from typing import Sequence

from ..lookup.client import LookupClient
from ..lookup.protocol import Code
from .protocol import StoreResult, decode_reply, encode_request

MISS = StoreResult(0)


class StoreLookupClient(LookupClient):
    """``lookup(num_tokens, block_hashes) -> StoreResult`` (a miss on any failure, within the
    deadline) and ``reset() -> bool`` (True only when the server said the store was cleared)."""

    _decode_reply = staticmethod(decode_reply)
    _fast_ok = False

    @staticmethod
    def _value(decoded):
        return decoded.result

    def lookup(self, num_tokens: int, block_hashes: Sequence[bytes]) -> StoreResult:  # type: ignore[override]
        start = time.monotonic()
        call = (num_tokens, block_hashes, ())
        try:
            frames = encode_request(num_tokens, block_hashes)
        except Exception:  # a caller bug must not reach the scheduler either
            self._record("bad_call", Code.BAD_CALL, "encode", start, call, recover=False)
            return MISS
        result = self._exchange(frames, start + self._timeout_s, start, call, num_tokens)
        return MISS if result is None else result
