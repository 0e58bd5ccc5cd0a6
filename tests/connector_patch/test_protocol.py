"""Protocol v1 rules and the hit rule, as pure functions (the socket tests exercise the same rules
end to end in test_client.py and test_server.py)."""

from __future__ import annotations

import msgpack
import pytest

from connector_patch.lookup import Code, Limits, MemoryBackend, prefix_hit_tokens, validate_timeout_ms
from connector_patch.lookup.protocol import (
    MAX_HASHES,
    MAX_TOKEN_LEN,
    PROTOCOL_VERSION,
    LookupRequest,
    ProtocolError,
    decode_reply,
    decode_request,
    encode_error,
    encode_ok,
    encode_request,
    encode_u32,
)
from rawpeers import distinct_hashes, hexes

pytestmark = [pytest.mark.usefixtures("log_guard"), pytest.mark.timeout(20)]

H = hexes(distinct_hashes(4, "protocol"))
LIM = Limits(num_groups=2)


def valid(token_len=64, groups=(0,), hbm=0, hashes=None):
    return [encode_u32(token_len), msgpack.packb(list(groups)), encode_u32(hbm),
            msgpack.packb(H if hashes is None else hashes)]


def test_request_round_trip_keeps_upstream_frames():
    frames = encode_request(64, H, (0, 1), 16)
    assert frames[0] == (64).to_bytes(4, "big") and frames[2] == (16).to_bytes(4, "big")
    assert msgpack.packb([0]) == b"\x91\x00"  # upstream's default group frame
    req = decode_request(frames, LIM)
    assert req == LookupRequest(64, (0, 1), 16, list(H))


def test_uppercase_hex_is_accepted_and_lowered():
    req = decode_request(valid(hashes=[h.upper() for h in H]), LIM)
    assert list(req.hashes) == list(H)


def test_hashes_beyond_token_len_are_allowed():
    req = decode_request(valid(token_len=16, hashes=H), LIM)  # 4 hashes for 1 block
    assert len(req.hashes) == 4


BAD_REQUESTS = {
    "no frames": ([], Code.BAD_FRAME_COUNT),
    "1 frame": ([b"x"], Code.BAD_FRAME_COUNT),
    "3 frames": (valid()[:3], Code.BAD_FRAME_COUNT),
    "5 frames": (valid() + [b""], Code.BAD_FRAME_COUNT),
    "3-byte token_len": ([b"\x00\x00\x10"] + valid()[1:], Code.BAD_INT_FRAME),
    "5-byte hbm": (valid()[:2] + [b"\x00" * 5] + valid()[3:], Code.BAD_INT_FRAME),
    "token_len above max": (valid(token_len=MAX_TOKEN_LEN + 1), Code.BAD_TOKEN_LEN),
    "hbm above token_len": (valid(token_len=16, hbm=17), Code.BAD_HBM_HIT_TOKENS),
    "groups not msgpack": (valid()[:1] + [b"\xc1"] + valid()[2:], Code.BAD_MSGPACK),
    "groups trailing bytes": (valid()[:1] + [b"\x91\x00\x00"] + valid()[2:], Code.BAD_MSGPACK),
    "groups a map": (valid()[:1] + [msgpack.packb({"a": 0})] + valid()[2:], Code.BAD_GROUP_IDS),
    "groups an int": (valid()[:1] + [msgpack.packb(0)] + valid()[2:], Code.BAD_GROUP_IDS),
    "groups empty": (valid(groups=()), Code.BAD_GROUP_IDS),
    "groups str": (valid(groups=("0",)), Code.BAD_GROUP_IDS),
    "groups bool": (valid(groups=(True,)), Code.BAD_GROUP_IDS),
    "groups duplicate": (valid(groups=(0, 0)), Code.BAD_GROUP_IDS),
    "groups out of range": (valid(groups=(2,)), Code.BAD_GROUP_IDS),
    "groups negative": (valid(groups=(-1,)), Code.BAD_GROUP_IDS),
    "hashes not msgpack": (valid()[:3] + [b"\x92\xa2"], Code.BAD_MSGPACK),
    "hashes a str": (valid()[:3] + [msgpack.packb("ab")], Code.BAD_HASHES),
    "hashes int elem": (valid(hashes=[1]), Code.BAD_HASHES),
    "hashes non-hex": (valid(hashes=["zz"]), Code.BAD_HASHES),
    "hashes odd length": (valid(hashes=["abc"]), Code.BAD_HASHES),
    "hashes empty str": (valid(hashes=[""]), Code.BAD_HASHES),
    "too many hashes": (valid(hashes=["00"] * 9), Code.TOO_MANY_HASHES),
}


@pytest.mark.parametrize("name", list(BAD_REQUESTS))
def test_decode_request_rejects(name):
    frames, code = BAD_REQUESTS[name]
    with pytest.raises(ProtocolError) as ei:
        decode_request(frames, Limits(num_groups=2, max_hashes=8))
    assert ei.value.code == code
    assert all(h not in ei.value.message.lower() for h in H)


def test_default_hash_limit():
    assert MAX_HASHES == 65536
    with pytest.raises(ProtocolError) as ei:
        decode_request(valid(hashes=["00"] * (MAX_HASHES + 1)), LIM)
    assert ei.value.code == Code.TOO_MANY_HASHES
    assert len(decode_request(valid(hashes=["00"] * MAX_HASHES), LIM).hashes) == MAX_HASHES


OK = {"version": 1, "status": "ok", "hit_tokens": 16}
BAD_REPLIES = {
    "no frames": ([], Code.EMPTY_REPLY),
    "empty frame": ([b""], Code.EMPTY_REPLY),
    "two frames": ([encode_ok(16), b""], Code.EXTRA_FRAMES),
    "not msgpack": ([b"\xc1" * 5], Code.BAD_REPLY),
    "msgpack list": ([msgpack.packb([1, 16])], Code.BAD_REPLY),
    "msgpack int": ([msgpack.packb(16)], Code.BAD_REPLY),
    "too large": ([msgpack.packb({**OK, "pad": "x" * 600})], Code.REPLY_TOO_LARGE),
    "legacy u32": ([(16).to_bytes(4, "big")], Code.LEGACY_REPLY),
    "legacy u32 zero": ([b"\x00\x00\x00\x00"], Code.LEGACY_REPLY),
    "missing hit": ([msgpack.packb({"version": 1, "status": "ok"})], Code.BAD_FIELDS),
    "missing version": ([msgpack.packb({"status": "ok", "hit_tokens": 1})], Code.BAD_FIELDS),
    "extra key": ([msgpack.packb({**OK, "extra": 1})], Code.BAD_FIELDS),
    "unknown status": ([msgpack.packb({**OK, "status": "maybe"})], Code.BAD_FIELDS),
    "bool hit": ([msgpack.packb({**OK, "hit_tokens": True})], Code.BAD_TYPES),
    "str hit": ([msgpack.packb({**OK, "hit_tokens": "16"})], Code.BAD_TYPES),
    "float hit": ([msgpack.packb({**OK, "hit_tokens": 16.0})], Code.BAD_TYPES),
    "str version": ([msgpack.packb({**OK, "version": "1"})], Code.BAD_TYPES),
    "bool version": ([msgpack.packb({**OK, "version": True})], Code.BAD_TYPES),
    "int status": ([msgpack.packb({**OK, "status": 1})], Code.BAD_TYPES),
    "int code": ([msgpack.packb({"version": 1, "status": "error", "code": 1, "message": ""})], Code.BAD_TYPES),
    "version 2": ([msgpack.packb({**OK, "version": 2})], Code.UNSUPPORTED_VERSION),
    "version 0": ([msgpack.packb({**OK, "version": 0})], Code.UNSUPPORTED_VERSION),
    "hit above token_len": ([encode_ok(65)], Code.HIT_OUT_OF_RANGE),
    "negative hit": ([msgpack.packb({**OK, "hit_tokens": -1})], Code.HIT_OUT_OF_RANGE),
}


@pytest.mark.parametrize("name", list(BAD_REPLIES))
def test_decode_reply_rejects(name):
    frames, code = BAD_REPLIES[name]
    with pytest.raises(ProtocolError) as ei:
        decode_reply(frames, 64)
    assert ei.value.code == code


def test_decode_reply_accepts_envelopes():
    assert decode_reply([encode_ok(64)], 64).hit_tokens == 64
    assert decode_reply([encode_ok(0)], 0).ok
    err = decode_reply([encode_error(Code.BACKEND_ERROR, "backend raised RuntimeError")], 64)
    assert not err.ok and err.code == Code.BACKEND_ERROR
    assert decode_reply([encode_ok(10**6)], None).hit_tokens == 10**6  # admin: no range check
    assert msgpack.unpackb(encode_ok(3)) == {"version": PROTOCOL_VERSION, "status": "ok", "hit_tokens": 3}


def test_error_message_is_truncated():
    obj = msgpack.unpackb(encode_error("X", "m" * 1000))
    assert len(obj["message"]) == 200


@pytest.mark.parametrize("bad", [0, -1, True, False, 1.0, 200.5, "200", None, b"1", [200]])
def test_validate_timeout_ms_rejects(bad):
    with pytest.raises(ValueError):
        validate_timeout_ms(bad)


def test_validate_timeout_ms_accepts_positive_int():
    assert validate_timeout_ms(1) == 1 and validate_timeout_ms(5000) == 5000


@pytest.mark.parametrize("kw", [{"num_groups": 0}, {"max_hashes": -1}, {"max_token_len": True}])
def test_limits_reject_non_positive(kw):
    with pytest.raises(ValueError):
        Limits(**kw)


# ---------------------------------------------------------------- the hit rule

def hit(token_len, present_blocks, n_hashes=None, groups=(0,), hbm=0, per_group=None, bs=16):
    """Run prefix_hit_tokens with block i present iff i in present_blocks (or per_group[g])."""
    hashes = [f"{i:02x}" for i in range(n_hashes if n_hashes is not None else 8)]

    def present(h, g):
        blocks = per_group[g] if per_group is not None else present_blocks
        return int(h, 16) in blocks

    return prefix_hit_tokens(token_len, hashes, groups, hbm, bs, present)


def test_hit_zero_partial_full():
    assert hit(64, set()) == 0
    assert hit(64, {0, 1}) == 32
    assert hit(64, {0, 2, 3}) == 16  # a hole ends the prefix
    assert hit(64, {0, 1, 2, 3}) == 64


def test_hit_capped_at_token_len():
    assert hit(60, {0, 1, 2, 3}) == 60  # last block partial: 4 blocks, 60 tokens
    assert hit(0, {0, 1}) == 0


def test_hit_ignores_hashes_beyond_token_len():
    assert hit(32, {0, 1, 2, 3, 4, 5, 6, 7}) == 32
    assert hit(64, {0, 1, 2, 3}, n_hashes=2) == 32  # fewer hashes than blocks


def test_hit_multi_group_needs_every_group():
    per = {0: {0, 1, 2, 3}, 1: {0, 1}}
    assert hit(64, None, groups=(0,), per_group=per) == 64
    assert hit(64, None, groups=(1,), per_group=per) == 32
    assert hit(64, None, groups=(0, 1), per_group=per) == 32


def test_hit_hbm_tokens_count_as_present():
    assert hit(64, {2}, hbm=32) == 48  # blocks 0,1 in HBM, block 2 in the pool
    assert hit(64, {1}, hbm=20) == 32  # block 0 ends at 16 <= 20; block 1 present
    assert hit(64, set(), hbm=20) == 16  # block 1 ends at 32 > 20 and is absent
    assert hit(64, set(), hbm=64) == 64


def test_memory_backend_hit_and_clear():
    b = MemoryBackend(block_size=16, groups=2)
    try:
        b.put(H[:2], groups=[0])
        b.put(H, groups=[1])
        assert b.hit_tokens(LookupRequest(64, (1,), 0, tuple(H))) == 64
        assert b.hit_tokens(LookupRequest(64, (0, 1), 0, tuple(H))) == 32
        assert b.hit_tokens(LookupRequest(64, (0,), 48, tuple(H))) == 48
        b.clear()
        assert len(b) == 0 and b.hit_tokens(LookupRequest(64, (1,), 0, tuple(H))) == 0
    finally:
        b.close()
