"""Wire format of vLLM's MooncakeStoreConnector admin channel, hardened (protocol v1, store dialect).

Requests are upstream's, unchanged (vLLM 0.32.0 ``mooncake/store/protocol.py``), and validated:

    lookup  frame 0  b"lookup"
            frame 1  num_tokens  u32 big-endian, exactly 4 bytes
            frame 2  hash_len    u16 big-endian, exactly 2 bytes: bytes per block hash (0 iff no hashes)
            frame 3  the block hashes back to back (a multiple of hash_len bytes)
    reset   exactly one frame b"reset"

Replies are this project's v1 envelope (one frame, a msgpack map), as on the AscendStore channel:

    {"version": 1, "status": "ok", "hit_tokens": N, "tails": [[group_id, num_tokens], ...]}
    {"version": 1, "status": "ok", "hit_tokens": 0, "tails": []}          (a reset that cleared the store)
    {"version": 1, "status": "error", "code": CODE, "message": SANITIZED_MESSAGE}

Upstream's reply is a raw u32 hit (plus 8 bytes per tail boundary), and a reset's is one byte
(``b"\\x01"`` ok, ``b"\\x00"`` error): no error can be told from a miss. The error codes and the
error envelope are the lookup package's (``connector_patch.lookup.protocol``): one vocabulary for
both channels. Nothing here logs; no message names a hash or raw bytes, only counts and sizes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

import msgpack

from ..lookup.dialect import Dialect
from ..lookup.protocol import (
    MAX_REPLY_BYTES,
    MAX_TOKEN_LEN,
    PROTOCOL_VERSION,
    Code,
    Limits,
    ProtocolError,
    check_version,
    encode_error,
    error_code,
)

LOOKUP_TAG = b"lookup"
RESET_TAG = b"reset"
MAX_HASH_LEN = 64  # bytes per block hash (vLLM's are 32: sha256; 8 with the builtin hash)
MAX_TAILS = 64  # tail-key boundaries in one reply: one per KV cache group
MAX_STORE_REPLY_BYTES = MAX_REPLY_BYTES + MAX_TAILS * 12

_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")

__all__ = ["Code", "ProtocolError", "StoreRequest", "StoreResult", "decode_request", "decode_reply",
           "encode_error", "encode_ok", "encode_request", "encode_reset_ok", "is_reset"]


class StoreRequest(NamedTuple):
    """A validated lookup. ``hashes`` is a list of ``hash_len``-byte slices; the field names match
    the lookup package's request so the shared server counts and logs both alike."""

    token_len: int
    hashes: Sequence[bytes]
    hash_len: int
    group_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class StoreResult:
    """What a lookup found: the hit in tokens and upstream's tail-key boundaries ``(group, tokens)``."""

    hit_tokens: int
    tails: tuple[tuple[int, int], ...] = ()


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# --------------------------------------------------------------------------- requests

def encode_request(num_tokens: int, block_hashes: Sequence[bytes]) -> list[bytes]:
    """Upstream's four lookup frames. Raises ProtocolError(BAD_CALL) on what cannot be encoded:
    a token count outside u32, hashes that are not bytes of one length."""
    if type(num_tokens) is not int or not 0 <= num_tokens <= 0xFFFFFFFF:
        raise ProtocolError(Code.BAD_CALL, "num_tokens must be an int in u32 range")
    hashes = list(block_hashes)
    if not all(isinstance(h, (bytes, bytearray, memoryview)) for h in hashes):
        raise ProtocolError(Code.BAD_CALL, "block hashes must be bytes")
    lengths = {len(h) for h in hashes}
    if len(lengths) > 1 or (hashes and not 0 < len(hashes[0]) <= 0xFFFF):
        raise ProtocolError(Code.BAD_CALL, f"block hashes must share one length in [1, 65535] ({len(lengths)} lengths)")
    hash_len = len(hashes[0]) if hashes else 0
    return [LOOKUP_TAG, _U32.pack(num_tokens), _U16.pack(hash_len), b"".join(bytes(h) for h in hashes)]


def is_reset(frames: Sequence[bytes]) -> bool:
    return len(frames) == 1 and frames[0] == RESET_TAG


def decode_request(frames: Sequence[bytes], limits: Limits) -> StoreRequest:
    """Validate a lookup strictly, in this order (the first broken rule is the reply's code):
    tag, frame count, num_tokens, hash_len, blob length, hash count. A reset with payload frames,
    and any unknown tag, is BAD_ADMIN (upstream answers an unknown tag with a bare error byte and
    dies on a short lookup)."""
    if not frames:
        raise ProtocolError(Code.BAD_FRAME_COUNT, "no frames")
    tag = frames[0]
    if tag == RESET_TAG:
        raise ProtocolError(Code.BAD_ADMIN, f"reset takes no payload ({len(frames) - 1} extra frames)")
    if tag != LOOKUP_TAG:
        raise ProtocolError(Code.BAD_ADMIN, f"unknown message tag ({len(tag)} bytes)")
    if len(frames) != 4:
        raise ProtocolError(Code.BAD_FRAME_COUNT, f"lookup: expected 4 frames, got {len(frames)}")
    _, f_tokens, f_len, blob = frames
    if len(f_tokens) != 4:
        raise ProtocolError(Code.BAD_INT_FRAME, f"num_tokens: expected 4 bytes, got {len(f_tokens)}")
    if len(f_len) != 2:
        raise ProtocolError(Code.BAD_INT_FRAME, f"hash_len: expected 2 bytes, got {len(f_len)}")
    token_len = _U32.unpack(f_tokens)[0]
    if token_len > limits.max_token_len:
        raise ProtocolError(Code.BAD_TOKEN_LEN, f"num_tokens {token_len} above the limit {limits.max_token_len}")
    hash_len = _U16.unpack(f_len)[0]
    if hash_len > MAX_HASH_LEN or (hash_len == 0) != (len(blob) == 0):
        raise ProtocolError(Code.BAD_HASHES, f"hash_len {hash_len} with {len(blob)} bytes of hashes "
                                             f"(0 iff none, at most {MAX_HASH_LEN})")
    if hash_len and len(blob) % hash_len:
        raise ProtocolError(Code.BAD_HASHES, f"{len(blob)} bytes of hashes are not a multiple of {hash_len}")
    count = len(blob) // hash_len if hash_len else 0
    if count > limits.max_hashes:
        raise ProtocolError(Code.TOO_MANY_HASHES, f"block hashes: {count} above the limit {limits.max_hashes}")
    blob = bytes(blob)
    hashes = [blob[i:i + hash_len] for i in range(0, len(blob), hash_len)] if hash_len else []
    return StoreRequest(token_len, hashes, hash_len)


# --------------------------------------------------------------------------- replies

def valid_result(result: Any, request: StoreRequest) -> bool:
    """A backend's answer the server may send: ints in range, at most MAX_TAILS boundaries."""
    if not isinstance(result, StoreResult) or not _is_int(result.hit_tokens):
        return False
    if not 0 <= result.hit_tokens <= request.token_len or len(result.tails) > MAX_TAILS:
        return False
    return all(len(t) == 2 and _is_int(t[0]) and _is_int(t[1]) and 0 <= t[0] <= 0xFFFFFFFF
               and 0 <= t[1] <= request.token_len for t in result.tails)


def encode_ok(result: StoreResult) -> bytes:
    return msgpack.packb({"version": PROTOCOL_VERSION, "status": "ok", "hit_tokens": int(result.hit_tokens),
                          "tails": [[int(g), int(n)] for g, n in result.tails]})


def encode_reset_ok() -> bytes:
    return encode_ok(StoreResult(0))


_OK_KEYS = frozenset({"version", "status", "hit_tokens", "tails"})


@dataclass(frozen=True)
class StoreReply:
    ok: bool
    result: StoreResult = StoreResult(0)
    code: str = ""


def decode_reply(frames: Sequence[bytes], token_len: int | None) -> StoreReply:
    """Validate one reply strictly (``token_len`` None: a reset's reply). Raises ProtocolError with
    a client-side code for anything that is not a well-formed v1 store envelope; upstream's raw
    replies (a 4-byte hit, a 4+8k-byte hit with boundaries, a 1-byte reset status) are
    LEGACY_REPLY."""
    if not frames:
        raise ProtocolError(Code.EMPTY_REPLY, "no frames")
    if len(frames) != 1:
        raise ProtocolError(Code.EXTRA_FRAMES, f"expected 1 frame, got {len(frames)}")
    frame = frames[0]
    if not frame:
        raise ProtocolError(Code.EMPTY_REPLY, "empty frame")
    if len(frame) > MAX_STORE_REPLY_BYTES:
        raise ProtocolError(Code.REPLY_TOO_LARGE, f"{len(frame)} bytes above {MAX_STORE_REPLY_BYTES}")
    legacy = (len(frame) == 1 and token_len is None) or (len(frame) >= 4 and (len(frame) - 4) % 8 == 0)
    try:
        obj = msgpack.unpackb(frame, raw=False, strict_map_key=True, max_map_len=8,
                              max_array_len=MAX_TAILS, max_str_len=MAX_REPLY_BYTES)
    except Exception as exc:
        if legacy:
            raise ProtocolError(Code.LEGACY_REPLY, f"{len(frame)}-byte raw reply: upstream's protocol") from None
        raise ProtocolError(Code.BAD_REPLY, f"not msgpack ({type(exc).__name__}, {len(frame)} bytes)") from None
    if not isinstance(obj, dict):
        if legacy:
            raise ProtocolError(Code.LEGACY_REPLY, f"{len(frame)}-byte raw reply: upstream's protocol")
        raise ProtocolError(Code.BAD_REPLY, f"reply is a {type(obj).__name__}, not a map")
    check_version(obj)
    keys = frozenset(obj)
    status = obj.get("status")
    if status == "ok":
        if keys != _OK_KEYS:
            raise ProtocolError(Code.BAD_FIELDS, f"ok reply with {len(keys)} keys, expected {len(_OK_KEYS)}")
        hit, tails = obj["hit_tokens"], obj["tails"]
        if not _is_int(hit) or not isinstance(tails, list):
            raise ProtocolError(Code.BAD_TYPES, "hit_tokens must be an int and tails an array")
        limit = MAX_TOKEN_LEN if token_len is None else token_len
        if not 0 <= hit <= limit or (token_len is None and (hit or tails)):
            raise ProtocolError(Code.HIT_OUT_OF_RANGE, "hit_tokens outside [0, num_tokens]")
        out = []
        for t in tails:
            if not isinstance(t, list) or len(t) != 2 or not all(_is_int(x) for x in t):
                raise ProtocolError(Code.BAD_TYPES, "a tail is not a pair of ints")
            if not 0 <= t[0] <= 0xFFFFFFFF or not 0 <= t[1] <= limit:
                raise ProtocolError(Code.HIT_OUT_OF_RANGE, "a tail boundary outside [0, num_tokens]")
            out.append((t[0], t[1]))
        return StoreReply(True, StoreResult(hit, tuple(out)))
    return StoreReply(False, code=error_code(obj))


def engine_lookup_path(base: str, engine_id: str, dp_rank: int) -> str:
    """``ipc://<base>/pdchaos_store_<engine digest>_dp<rank>``: one engine's admin channel. (Upstream's
    is ``lookup_rpc_port_<port>_host_<hostname>_dp_rank<rank>``: two engines on one host with the
    default port share it.) The digest keeps the path well inside the 107 bytes an ipc path may have."""
    import hashlib

    digest = hashlib.sha256(str(engine_id).encode()).hexdigest()[:20]
    return f"ipc://{base}/pdchaos_store_{digest}_dp{int(dp_rank)}"


__all__ += ["engine_lookup_path", "LOOKUP_TAG", "RESET_TAG", "MAX_HASH_LEN", "MAX_TAILS", "STORE", "StoreReply", "valid_result"]

STORE = Dialect("store", is_reset, decode_request, valid_result, encode_ok, encode_reset_ok())
