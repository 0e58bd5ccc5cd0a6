"""The lookup RPC's wire knowledge for the nodes that break it: the fake peer and the interposer.

Broken replies (one per kind, each with the client-side code the hardened client must report),
today's upstream 4-byte reply (``legacy4``), and the two things a rewrite needs to read from the
traffic: a request's ``token_len`` and a reply's hit.

This module is also the interposer's codec (``pdchaos node interposer --codec
families.lookup.wire``; see faults/interposer.py): it provides ``NAMED_REWRITES`` (name
-> ``rewrite(reply_body, token_len) -> new body``) and ``request_info(request_body)`` (what the
interposer keeps of each client's last request for those rewrites: its token_len).

Light on purpose: node processes import it at start (msgpack and the protocol constants only).
"""

from __future__ import annotations

from typing import Callable, Sequence

import msgpack

from connector_patch.lookup.protocol import PROTOCOL_VERSION, encode_ok

# Broken replies, and the client-side code the hardened client must report for each (category
# "protocol" for all of them).
REPLY_KINDS: dict[str, str] = {
    "empty": "EMPTY_REPLY",  # one zero-length frame
    "two_frames": "EXTRA_FRAMES",  # a correct envelope, twice, as two frames of one message
    "not_msgpack": "BAD_REPLY",  # bytes that are not msgpack (and not 4 long)
    "not_map": "BAD_REPLY",  # msgpack, but an array
    "missing_key": "BAD_FIELDS",  # ok envelope without hit_tokens
    "extra_key": "BAD_FIELDS",  # ok envelope with one more key
    "wrong_type": "BAD_TYPES",  # hit_tokens as a string
    "version2": "UNSUPPORTED_VERSION",  # a correct envelope with version 2
    "hit_over": "HIT_OUT_OF_RANGE",  # hit_tokens = token_len + 1
    "hit_negative": "HIT_OUT_OF_RANGE",  # hit_tokens = -1
}
LEGACY4 = "legacy4"  # today's upstream reply: a raw u32, with the right hit
LEGACY4_CODE = "LEGACY_REPLY"

_U32_MAX = 0xFFFFFFFF


def legacy_reply(hit: int) -> list[bytes]:
    """Today's upstream reply: the hit as u32 big-endian, one frame."""
    return [min(max(int(hit), 0), _U32_MAX).to_bytes(4, "big")]


def malformed_reply(kind: str, hit: int, token_len: int) -> list[bytes]:
    """The body frames of one broken reply of ``kind`` (a key of REPLY_KINDS, or "legacy4")."""
    ok = {"version": PROTOCOL_VERSION, "status": "ok", "hit_tokens": int(hit)}
    if kind == "empty":
        return [b""]
    if kind == "two_frames":
        return [encode_ok(hit), encode_ok(hit)]
    if kind == "not_msgpack":
        return [b"\xc1not-msgpack"]  # 0xc1 is the one byte msgpack never uses
    if kind == "not_map":
        return [msgpack.packb([PROTOCOL_VERSION, "ok", int(hit), 0])]
    if kind == "missing_key":
        return [msgpack.packb({"version": PROTOCOL_VERSION, "status": "ok"})]
    if kind == "extra_key":
        return [msgpack.packb({**ok, "extra": 1})]
    if kind == "wrong_type":
        return [msgpack.packb({**ok, "hit_tokens": str(int(hit))})]
    if kind == "version2":
        return [msgpack.packb({**ok, "version": PROTOCOL_VERSION + 1})]
    if kind == "hit_over":
        return [msgpack.packb({**ok, "hit_tokens": int(token_len) + 1})]
    if kind == "hit_negative":
        return [msgpack.packb({**ok, "hit_tokens": -1})]
    if kind == LEGACY4:
        return legacy_reply(hit)
    raise ValueError(f"unknown reply kind {kind!r}")


def request_token_len(body: Sequence[bytes]) -> int:
    """token_len of a lookup request when frame 0 is a 4-byte int, else 0."""
    if len(body) == 4 and len(body[0]) == 4:
        return int.from_bytes(body[0], "big")
    return 0


def reply_hit(body: Sequence[bytes]) -> int:
    """The hit of a v1 ok reply (or a 4-byte legacy reply); 0 for anything else."""
    if len(body) == 1:
        if len(body[0]) == 4:
            try:
                msgpack.unpackb(body[0])
            except Exception:
                return int.from_bytes(body[0], "big")
        try:
            obj = msgpack.unpackb(body[0], raw=False)
        except Exception:
            return 0
        if isinstance(obj, dict) and isinstance(obj.get("hit_tokens"), int):
            return max(0, obj["hit_tokens"])
    return 0


# --------------------------------------------------------------------------- the interposer codec

request_info = request_token_len


def _named(kind: str) -> Callable[[list[bytes], int], list[bytes]]:
    def rewrite(body: list[bytes], token_len: int) -> list[bytes]:
        return malformed_reply(kind, reply_hit(body), token_len or 0)

    rewrite.__name__ = f"rewrite_{kind}"
    return rewrite


NAMED_REWRITES: dict[str, Callable[[list[bytes], int], list[bytes]]] = {
    kind: _named(kind) for kind in (*REPLY_KINDS, LEGACY4)
}
