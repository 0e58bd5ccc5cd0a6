"""Wire format of the AscendStore lookup RPC, protocol version 1.

Request (scheduler -> worker rank 0), one multipart message, unchanged from upstream:

    frame 0  token_len           u32 big-endian, exactly 4 bytes
    frame 1  kv_cache_group_ids  msgpack array of ints
    frame 2  hbm_hit_tokens      u32 big-endian, exactly 4 bytes
    frame 3  block hashes        msgpack array of lowercase-or-uppercase hex strings

Admin request: exactly one frame ``b"reset"``.

Reply (worker -> scheduler), one frame holding a msgpack map:

    {"version": 1, "status": "ok", "hit_tokens": N}
    {"version": 1, "status": "error", "code": CODE, "message": SANITIZED_MESSAGE}

Every validation rule is listed in ``connector_patch/DESIGN.md`` ("Request validation") and is
implemented here, in one place, so the client and the server cannot drift apart.

Nothing in this module logs, and no error message built here ever contains a hash, a key or raw
frame bytes: only counts, sizes and field names.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

import msgpack

PROTOCOL_VERSION = 1
RESET_FRAME = b"reset"

# Documented limits (DESIGN.md, "Request validation").
MAX_TOKEN_LEN = 1 << 24  # 16,777,216 tokens: far above any context length served today
MAX_HASHES = 1 << 16  # 65,536 block hashes in one request
MAX_HASH_HEX_LEN = 128  # a 64-byte digest; upstream hashes are 32 bytes (64 hex chars)
MAX_GROUPS_IN_REQUEST = 64  # more ids than any deployment has groups (the fuzzer sends more)
MAX_REPLY_BYTES = 512  # a v1 envelope is < 200 bytes; anything bigger is not ours
MAX_MESSAGE_LEN = 200  # characters in an error envelope's message

_U32 = struct.Struct(">I")
_HEX = frozenset("0123456789abcdefABCDEF")


class Code:
    """Error codes carried in the ``code`` field of an error envelope (server side) and used
    as the ``code`` of a client-side failure. Strings, so logs and dashboards read well."""

    # request validation (server answers with these)
    BAD_FRAME_COUNT = "BAD_FRAME_COUNT"
    BAD_INT_FRAME = "BAD_INT_FRAME"
    BAD_TOKEN_LEN = "BAD_TOKEN_LEN"
    BAD_HBM_HIT_TOKENS = "BAD_HBM_HIT_TOKENS"
    BAD_MSGPACK = "BAD_MSGPACK"
    BAD_GROUP_IDS = "BAD_GROUP_IDS"
    BAD_HASHES = "BAD_HASHES"
    TOO_MANY_HASHES = "TOO_MANY_HASHES"
    BAD_ADMIN = "BAD_ADMIN"
    # server side failures
    BACKEND_ERROR = "BACKEND_ERROR"
    BACKEND_TIMEOUT = "BACKEND_TIMEOUT"
    RESET_FAILED = "RESET_FAILED"
    INTERNAL = "INTERNAL"
    # client side only (never on the wire)
    TIMEOUT = "TIMEOUT"
    TRANSPORT = "TRANSPORT"
    EMPTY_REPLY = "EMPTY_REPLY"
    EXTRA_FRAMES = "EXTRA_FRAMES"
    LEGACY_REPLY = "LEGACY_REPLY"
    REPLY_TOO_LARGE = "REPLY_TOO_LARGE"
    BAD_REPLY = "BAD_REPLY"
    UNSUPPORTED_VERSION = "UNSUPPORTED_VERSION"
    BAD_FIELDS = "BAD_FIELDS"
    BAD_TYPES = "BAD_TYPES"
    HIT_OUT_OF_RANGE = "HIT_OUT_OF_RANGE"
    BAD_CALL = "BAD_CALL"


# Error codes a server may send, by the failure category the client counts them under.
BACKEND_CODES = frozenset({Code.BACKEND_ERROR, Code.BACKEND_TIMEOUT, Code.RESET_FAILED})
REQUEST_CODES = frozenset(
    {
        Code.BAD_FRAME_COUNT,
        Code.BAD_INT_FRAME,
        Code.BAD_TOKEN_LEN,
        Code.BAD_HBM_HIT_TOKENS,
        Code.BAD_MSGPACK,
        Code.BAD_GROUP_IDS,
        Code.BAD_HASHES,
        Code.TOO_MANY_HASHES,
        Code.BAD_ADMIN,
    }
)


class ProtocolError(Exception):
    """A frame list or a reply broke protocol v1. ``code`` is one of :class:`Code`; the message is
    safe to log (counts and field names only)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message[:MAX_MESSAGE_LEN]


class LookupRequest(NamedTuple):
    """A validated request (a NamedTuple: built on every request, ~1 us cheaper than a frozen
    dataclass)."""

    token_len: int
    group_ids: tuple[int, ...]
    hbm_hit_tokens: int
    hashes: Sequence[str]  # the decoded list itself (no copy on the hot path); treat as read-only


@dataclass(frozen=True)
class Limits:
    """Server-side limits; ``num_groups`` is the configured KV cache group count."""

    num_groups: int = 1
    max_token_len: int = MAX_TOKEN_LEN
    max_hashes: int = MAX_HASHES

    def __post_init__(self) -> None:
        for name in ("num_groups", "max_token_len", "max_hashes"):
            v = getattr(self, name)
            if not _is_int(v) or v <= 0:
                raise ValueError(f"Limits.{name} must be a positive int, got {type(v).__name__}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# --------------------------------------------------------------------------- requests


def encode_u32(value: int) -> bytes:
    return _U32.pack(value)


def encode_request(
    token_len: int,
    hashes_hex: Sequence[str],
    group_ids: Sequence[int] = (0,),
    hbm_hit_tokens: int = 0,
) -> list[bytes]:
    """Build the 4 frames of a lookup request. Raises ProtocolError(BAD_CALL) on values that
    cannot be encoded (the client turns that into a fail-open 0, never an exception)."""
    if type(token_len) is not int or not 0 <= token_len <= 0xFFFFFFFF:
        raise ProtocolError(Code.BAD_CALL, "token_len must be an int in u32 range")
    if type(hbm_hit_tokens) is not int or not 0 <= hbm_hit_tokens <= 0xFFFFFFFF:
        raise ProtocolError(Code.BAD_CALL, "hbm_hit_tokens must be an int in u32 range")
    try:  # msgpack packs lists and tuples as arrays; other sequences are copied into a list
        groups_frame = msgpack.packb(group_ids if type(group_ids) in (list, tuple) else list(group_ids))
        hashes_frame = msgpack.packb(hashes_hex if type(hashes_hex) in (list, tuple) else list(hashes_hex))
    except (TypeError, ValueError, OverflowError) as exc:
        raise ProtocolError(Code.BAD_CALL, f"cannot encode request: {type(exc).__name__}") from None
    return [_U32.pack(token_len), groups_frame, _U32.pack(hbm_hit_tokens), hashes_frame]


def _unpack(frame: bytes, field: str) -> Any:
    """Decode one msgpack frame. msgpack (>= 1.0) bounds every container and string by the size of
    the buffer, so a frame cannot make the decoder allocate more than it carries; the hash count
    is checked from the array header before this. Types are checked by the field's rules."""
    try:
        return msgpack.unpackb(frame)
    except Exception as exc:  # msgpack raises many types (ExtraData, ValueError, UnicodeDecodeError, ...)
        raise ProtocolError(
            Code.BAD_MSGPACK, f"{field}: not a valid msgpack value ({type(exc).__name__}, {len(frame)} bytes)"
        ) from None


def _array_header(frame: bytes) -> int | None:
    """The element count of a msgpack array header, or None when the frame is not an array.

    Read by hand from the msgpack spec's three array headers (fixarray 0x90-0x9f, array 16 0xdc,
    array 32 0xdd) so the count is known before anything is decoded: cheaper than building an
    Unpacker for every request (~2 us) on the lookup hot path."""
    if not frame:
        return None
    b0 = frame[0]
    if 0x90 <= b0 <= 0x9F:
        return b0 & 0x0F
    if b0 == 0xDC and len(frame) >= 3:
        return int.from_bytes(frame[1:3], "big")
    if b0 == 0xDD and len(frame) >= 5:
        return int.from_bytes(frame[1:5], "big")
    return None


_LOWER_HEX = b"0123456789abcdef"


def _hex_fast(hashes: list) -> bool:
    """Fast path of the hash rules, at C speed on one joined copy: True when every element is a
    non-empty, even-length, lowercase hex string (what ``bytes.hex()`` produces). ``join`` raises
    TypeError unless every element is a str, the ASCII encode fails on anything else, and
    ``translate`` deletes every lowercase hex digit, so anything left over is not one. A False
    sends the request to the per-element rules (uppercase hex is valid there, just slower)."""
    try:
        joined = "".join(hashes).encode("ascii")
    except (TypeError, ValueError):
        return False
    if joined.translate(None, _LOWER_HEX):
        return False
    lengths = set(map(len, hashes))
    if len(lengths) == 1:  # the usual case: every hash the same length
        (n,) = lengths
        return 0 < n <= MAX_HASH_HEX_LEN and not n % 2
    return all(n and not n % 2 and n <= MAX_HASH_HEX_LEN for n in lengths)


def _decode_u32(frame: bytes, field: str) -> int:
    if len(frame) != 4:
        raise ProtocolError(Code.BAD_INT_FRAME, f"{field}: expected 4 bytes, got {len(frame)}")
    return _U32.unpack(frame)[0]


def _validate_group_ids(frame: bytes, num_groups: int) -> tuple[int, ...]:
    groups = _unpack(frame, "kv_cache_group_ids")
    if not isinstance(groups, list) or not groups:
        raise ProtocolError(Code.BAD_GROUP_IDS, "kv_cache_group_ids: expected a non-empty array")
    if not all(_is_int(g) for g in groups):
        raise ProtocolError(Code.BAD_GROUP_IDS, "kv_cache_group_ids: every element must be an int")
    if len(set(groups)) != len(groups):
        raise ProtocolError(Code.BAD_GROUP_IDS, f"kv_cache_group_ids: {len(groups)} ids, not unique")
    if not all(0 <= g < num_groups for g in groups):
        raise ProtocolError(Code.BAD_GROUP_IDS, f"kv_cache_group_ids: ids must be in [0, {num_groups})")
    return tuple(groups)


_GROUPS_CACHE: dict[tuple[bytes, int], tuple[int, ...]] = {}
_GROUPS_CACHE_MAX = 256


def _group_ids(frame: bytes, limits: Limits) -> tuple[int, ...]:
    """Validated group ids. A scheduler sends the same few group frames over and over (``[0]`` is
    ``b"\\x91\\x00"``), so valid ones are remembered by their bytes: validation is a pure function
    of (frame, num_groups). Invalid frames are never cached; the cache is bounded."""
    key = (frame, limits.num_groups)
    cached = _GROUPS_CACHE.get(key)
    if cached is not None:
        return cached
    groups = _validate_group_ids(frame, limits.num_groups)
    if len(frame) <= 64 and len(_GROUPS_CACHE) < _GROUPS_CACHE_MAX:
        _GROUPS_CACHE[key] = groups
    return groups


def decode_request(frames: Sequence[bytes], limits: Limits) -> LookupRequest:
    """Validate a 4-frame lookup request strictly. Raises ProtocolError with a request code."""
    if len(frames) != 4:
        raise ProtocolError(Code.BAD_FRAME_COUNT, f"expected 4 frames, got {len(frames)}")
    f0, f1, f2, f3 = frames
    if len(f0) != 4 or len(f2) != 4:
        _decode_u32(f0, "token_len")  # raises, naming the frame
        _decode_u32(f2, "hbm_hit_tokens")
    token_len = int.from_bytes(f0, "big")
    hbm_hit_tokens = int.from_bytes(f2, "big")
    if token_len > limits.max_token_len:
        raise ProtocolError(Code.BAD_TOKEN_LEN, f"token_len {token_len} above the limit {limits.max_token_len}")
    if hbm_hit_tokens > token_len:
        raise ProtocolError(Code.BAD_HBM_HIT_TOKENS, "hbm_hit_tokens above token_len")

    group_ids = _group_ids(frames[1], limits)
    n_hashes = _array_header(frames[3])
    if n_hashes is not None and n_hashes > limits.max_hashes:
        raise ProtocolError(Code.TOO_MANY_HASHES, f"block_hashes: {n_hashes} above the limit {limits.max_hashes}")
    hashes = _unpack(frames[3], "block_hashes")
    if not isinstance(hashes, list):
        raise ProtocolError(Code.BAD_HASHES, "block_hashes: expected an array")
    # Fast path first; only a request that fails it walks the list to name the first bad element.
    lower = _hex_fast(hashes)
    if not lower:
        for i, h in enumerate(hashes):
            if not isinstance(h, str) or not h or len(h) % 2 or len(h) > MAX_HASH_HEX_LEN \
                    or not _HEX.issuperset(h):
                raise ProtocolError(Code.BAD_HASHES, f"block_hashes[{i}]: expected a non-empty even-length "
                                                     f"hex string of at most {MAX_HASH_HEX_LEN} characters")
    # .hex() produces lowercase, so lowering is nearly always a no-op: skip the per-hash work then
    lowered = hashes if lower else [h.lower() for h in hashes]
    return LookupRequest(token_len, group_ids, hbm_hit_tokens, lowered)


# --------------------------------------------------------------------------- replies


OK_PREFIX = msgpack.packb({"version": PROTOCOL_VERSION, "status": "ok", "hit_tokens": 0})[:-1]


_OK_CACHE: dict[int, bytes] = {}


def encode_ok(hit_tokens: int) -> bytes:
    """The ok envelope: a fixed map prefix plus the packed int (same bytes as packing the dict).
    Hits repeat (multiples of the block size): the first 4096 distinct ones are kept."""
    out = _OK_CACHE.get(hit_tokens)
    if out is None:
        out = OK_PREFIX + msgpack.packb(int(hit_tokens))
        if len(_OK_CACHE) < 4096 and type(hit_tokens) is int:
            _OK_CACHE[hit_tokens] = out
    return out


def encode_error(code: str, message: str) -> bytes:
    return msgpack.packb(
        {"version": PROTOCOL_VERSION, "status": "error", "code": code, "message": message[:MAX_MESSAGE_LEN]}
    )


_OK_KEYS = frozenset({"version", "status", "hit_tokens"})
_ERR_KEYS = frozenset({"version", "status", "code", "message"})


@dataclass(frozen=True)
class Reply:
    """A validated v1 reply: either ``ok`` with ``hit_tokens``, or an error with ``code``."""

    ok: bool
    hit_tokens: int = 0
    code: str = ""


def decode_reply(frames: Sequence[bytes], token_len: int | None) -> Reply:
    """Validate one reply strictly. ``token_len`` None skips the hit range check (admin replies).

    Raises ProtocolError with a client-side code for anything that is not a well-formed v1
    envelope; a well-formed error envelope is returned as ``Reply(ok=False, code=...)``.
    """
    if len(frames) == 0:
        raise ProtocolError(Code.EMPTY_REPLY, "no frames")
    if len(frames) != 1:
        raise ProtocolError(Code.EXTRA_FRAMES, f"expected 1 frame, got {len(frames)}")
    frame = frames[0]
    if len(frame) == 0:
        raise ProtocolError(Code.EMPTY_REPLY, "empty frame")
    if len(frame) > MAX_REPLY_BYTES:
        raise ProtocolError(Code.REPLY_TOO_LARGE, f"{len(frame)} bytes above {MAX_REPLY_BYTES}")
    try:
        obj = msgpack.unpackb(
            frame, raw=False, strict_map_key=True, max_map_len=8,
            max_array_len=8, max_str_len=MAX_REPLY_BYTES,
        )
    except Exception as exc:
        if len(frame) == 4:
            raise ProtocolError(Code.LEGACY_REPLY, "4-byte reply: a peer speaking the raw u32 protocol") from None
        raise ProtocolError(Code.BAD_REPLY, f"not msgpack ({type(exc).__name__}, {len(frame)} bytes)") from None
    if not isinstance(obj, dict):
        if len(frame) == 4:
            raise ProtocolError(Code.LEGACY_REPLY, "4-byte reply: a peer speaking the raw u32 protocol")
        raise ProtocolError(Code.BAD_REPLY, f"reply is a {type(obj).__name__}, not a map")
    check_version(obj)
    status = obj.get("status")
    keys = frozenset(obj)
    if status == "ok":
        if keys != _OK_KEYS:
            raise ProtocolError(Code.BAD_FIELDS, f"ok reply with {len(keys)} keys, expected {len(_OK_KEYS)}")
        hit = obj["hit_tokens"]
        if not _is_int(hit):
            raise ProtocolError(Code.BAD_TYPES, "hit_tokens is not an int")
        if hit < 0 or (token_len is not None and hit > token_len):
            raise ProtocolError(Code.HIT_OUT_OF_RANGE, "hit_tokens outside [0, token_len]")
        return Reply(ok=True, hit_tokens=hit)
    return Reply(ok=False, code=error_code(obj))


def check_version(obj: dict) -> None:
    """A v1 envelope's version field, checked (shared by every channel's reply rules)."""
    version = obj.get("version")
    if not _is_int(version):
        raise ProtocolError(Code.BAD_FIELDS if "version" not in obj else Code.BAD_TYPES, "version missing or not an int")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(Code.UNSUPPORTED_VERSION, f"version {version} is not supported")


def error_code(obj: dict) -> str:
    """The code of a well-formed v1 error envelope (a map whose status is not "ok"); ProtocolError
    for anything else. Shared by every channel's reply rules."""
    status = obj.get("status")
    if status == "error":
        keys = frozenset(obj)
        if keys != _ERR_KEYS:
            raise ProtocolError(Code.BAD_FIELDS, f"error reply with {len(keys)} keys, expected {len(_ERR_KEYS)}")
        if not isinstance(obj["code"], str) or not isinstance(obj["message"], str):
            raise ProtocolError(Code.BAD_TYPES, "code and message must be strings")
        return obj["code"][:64]
    if not isinstance(status, str):
        raise ProtocolError(Code.BAD_TYPES if "status" in obj else Code.BAD_FIELDS, "status missing or not a string")
    raise ProtocolError(Code.BAD_FIELDS, "status is neither 'ok' nor 'error'")
