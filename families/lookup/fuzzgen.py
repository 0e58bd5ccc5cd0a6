"""Frame-list generators for ``pdchaos fuzz lookup``.

Each :class:`Case` is one request (a list of frames, never empty: ZMQ cannot carry a message of
zero frames) together with what a protocol-v1 server must answer:

- ``expect="ok"``: a valid lookup (or the admin ``b"reset"``): an ``ok`` envelope, with
  ``0 <= hit_tokens <= token_len``;
- ``expect="error"``: an error envelope, with ``code`` when the code is certain (the case makes
  exactly one mutation to a valid request, so the first failing rule of
  ``connector_patch/DESIGN.md`` "Request validation" is known);
- ``expect="any"``: random or corrupted bytes that may or may not still decode; only "exactly one
  well-formed reply" is required.

The stream depends only on the seed and the options (``groups``, ``allow_reset``), never on
timing, so a run is repeatable. ``tests/families/lookup/test_fuzz.py`` checks every expectation declared here
against ``connector_patch.lookup.protocol.decode_request`` so the oracle cannot drift from the
protocol.
"""

from __future__ import annotations

import math
import random
import struct
from dataclasses import dataclass
from typing import Any, Callable

import msgpack

from connector_patch.lookup.protocol import (
    MAX_GROUPS_IN_REQUEST,
    MAX_HASH_HEX_LEN,
    MAX_HASHES,
    MAX_TOKEN_LEN,
    RESET_FRAME,
    Code,
)

_U32 = struct.Struct(">I")
_BLOCK = 16  # only shapes the generated lengths; the server's block size does not matter


@dataclass(frozen=True)
class Case:
    kind: str
    frames: list[bytes]
    expect: str  # "ok" | "error" | "any"
    code: str | None = None
    token_len: int | None = None  # for an expected-ok lookup: the bound on hit_tokens


def _u32(v: int) -> bytes:
    return _U32.pack(v)


class FrameGen:
    """``FrameGen(seed, groups=1, allow_reset=True).next() -> Case``.

    ``groups`` is the server's configured KV cache group count: valid requests use ids below it,
    "bad group" cases use ids at or above it."""

    def __init__(self, seed: int, groups: int = 1, allow_reset: bool = True):
        if groups <= 0:
            raise ValueError("groups must be positive")
        self.rng = random.Random(seed)
        self.groups = groups
        self.allow_reset = allow_reset
        table: list[tuple[str, float, Callable[[], Case]]] = [
            ("valid", 24.0, self._valid),
            ("reset", 0.5 if allow_reset else 0.0, self._reset),
            ("reset_variant", 1.0, self._reset_variant),
            ("frame_count", 8.0, self._frame_count),
            ("int_frame_len", 8.0, self._int_frame_len),
            ("int_frame_msgpack", 3.0, self._int_frame_msgpack),
            ("token_len_range", 4.0, self._token_len_range),
            ("hbm_above_token_len", 4.0, self._hbm_above),
            ("bad_group_ids", 10.0, self._bad_group_ids),
            ("bad_hashes", 10.0, self._bad_hashes),
            ("too_many_hashes", 0.6, self._too_many_hashes),
            ("corrupt_msgpack", 10.0, self._corrupt_msgpack),
            ("random_frames", 10.0, self._random_frames),
            ("empty_frames", 2.0, self._empty_frames),
            ("big_frame", 0.3, self._big_frame),
        ]
        table = [t for t in table if t[1] > 0]
        self.kinds = [t[0] for t in table]
        self._fns = [t[2] for t in table]
        self._cum = []
        acc = 0.0
        for _, w, _ in table:
            acc += w
            self._cum.append(acc)
        self._huge_hash_list: bytes | None = None

    # ------------------------------------------------------------------ api
    def next(self) -> Case:
        r = self.rng.random() * self._cum[-1]
        for i, c in enumerate(self._cum):
            if r < c:
                return self._fns[i]()
        return self._fns[-1]()  # pragma: no cover - float edge

    # ------------------------------------------------------------ pieces
    def _hash_hex(self) -> str:
        rng = self.rng
        n = rng.choice((32, 32, 32, 32, 16, 8, 64, 1))  # bytes; 64 bytes = 128 hex chars (the maximum)
        h = rng.getrandbits(8 * n).to_bytes(n, "big").hex()
        return h.upper() if rng.random() < 0.05 else h

    def _valid_parts(self) -> tuple[int, list[int], int, list[str]]:
        rng = self.rng
        roll = rng.random()
        if roll < 0.05:
            token_len = 0
        elif roll < 0.08:
            token_len = MAX_TOKEN_LEN
        else:
            token_len = rng.randint(1, 4096)
        need = math.ceil(min(token_len, 4096) / _BLOCK)
        n_hashes = rng.randint(0, min(need + 4, 260))
        hashes = [self._hash_hex() for _ in range(n_hashes)]
        k = rng.randint(1, min(self.groups, MAX_GROUPS_IN_REQUEST))
        groups = rng.sample(range(self.groups), k)
        hbm = rng.choice((0, 0, rng.randint(0, token_len), token_len))
        return token_len, groups, hbm, hashes

    def _valid_frames(self) -> tuple[list[bytes], int]:
        token_len, groups, hbm, hashes = self._valid_parts()
        return [_u32(token_len), msgpack.packb(groups), _u32(hbm), msgpack.packb(hashes)], token_len

    def _rand_bytes(self, lo: int, hi: int) -> bytes:
        n = self.rng.randint(lo, hi)
        return self.rng.getrandbits(8 * n).to_bytes(n, "big") if n else b""

    # ------------------------------------------------------------ generators
    def _valid(self) -> Case:
        frames, token_len = self._valid_frames()
        return Case("valid", frames, "ok", token_len=token_len)

    def _reset(self) -> Case:
        return Case("reset", [RESET_FRAME], "ok", token_len=0)

    def _reset_variant(self) -> Case:
        rng = self.rng
        variant = rng.choice((
            [RESET_FRAME, b""], [RESET_FRAME, RESET_FRAME], [b"RESET"], [b"rese"], [b"reset\x00"],
            [b" reset"], [RESET_FRAME, b"", b"", b""], [b"lookup"],
        ))
        code = Code.BAD_INT_FRAME if len(variant) == 4 else Code.BAD_FRAME_COUNT  # b"reset" is 5 bytes
        return Case("reset_variant", list(variant), "error", code)

    def _frame_count(self) -> Case:
        rng = self.rng
        frames, _ = self._valid_frames()
        if rng.random() < 0.5:
            keep = sorted(rng.sample(range(4), rng.randint(1, 3)))
            out = [frames[i] for i in keep]
        else:
            out = frames + [self._rand_bytes(0, 16) for _ in range(rng.randint(1, 8))]
            if rng.random() < 0.3:
                out = frames + frames[: rng.randint(1, 4)]
        return Case("frame_count", out, "error", Code.BAD_FRAME_COUNT)

    def _int_frame_len(self) -> Case:
        rng = self.rng
        frames, _ = self._valid_frames()
        i = rng.choice((0, 2))
        n = rng.choice((0, 1, 2, 3, 5, 6, 8, 16, 64))
        if n < 4:
            frames[i] = frames[i][4 - n:]  # truncated
        else:
            frames[i] = frames[i] + self._rand_bytes(n - 4, n - 4)  # extended
        return Case("int_frame_len", frames, "error", Code.BAD_INT_FRAME)

    def _int_frame_msgpack(self) -> Case:
        """An int frame holding msgpack instead of 4 raw bytes (the wrong-type mistake)."""
        rng = self.rng
        frames, token_len = self._valid_frames()
        i = rng.choice((0, 2))
        value = rng.choice((0, 1, 127, 300, 70000, -1, 2**40, 1.5, "16", None, [16]))
        frames[i] = msgpack.packb(value)
        if len(frames[i]) != 4:
            return Case("int_frame_msgpack", frames, "error", Code.BAD_INT_FRAME)
        return Case("int_frame_msgpack", frames, "any")

    def _token_len_range(self) -> Case:
        rng = self.rng
        frames, _ = self._valid_frames()
        frames[0] = _u32(rng.choice((MAX_TOKEN_LEN + 1, 0xFFFFFFFF, 0x80000000, rng.randint(MAX_TOKEN_LEN + 1, 0xFFFFFFFF))))
        return Case("token_len_range", frames, "error", Code.BAD_TOKEN_LEN)

    def _hbm_above(self) -> Case:
        rng = self.rng
        frames, token_len = self._valid_frames()
        frames[2] = _u32(rng.choice((token_len + 1, 0xFFFFFFFF, rng.randint(token_len + 1, 0xFFFFFFFF))))
        return Case("hbm_above_token_len", frames, "error", Code.BAD_HBM_HIT_TOKENS)

    def _bad_group_ids(self) -> Case:
        rng = self.rng
        frames, _ = self._valid_frames()
        g = self.groups
        too_many = list(range(MAX_GROUPS_IN_REQUEST + 1 + rng.randint(0, 200)))
        choices: list[tuple[Any, str]] = [
            ([], Code.BAD_GROUP_IDS),
            ([0, 0], Code.BAD_GROUP_IDS),
            ([-1], Code.BAD_GROUP_IDS),
            ([-(2**63)], Code.BAD_GROUP_IDS),
            ([g], Code.BAD_GROUP_IDS),
            ([g + rng.randint(0, 2**32)], Code.BAD_GROUP_IDS),
            ([2**64 - 1], Code.BAD_GROUP_IDS),
            ([0, 2**63], Code.BAD_GROUP_IDS),
            ([0.0], Code.BAD_GROUP_IDS),
            ([True], Code.BAD_GROUP_IDS),
            (["0"], Code.BAD_GROUP_IDS),
            ([[0]], Code.BAD_GROUP_IDS),
            ([None], Code.BAD_GROUP_IDS),
            (None, Code.BAD_GROUP_IDS),
            (0, Code.BAD_GROUP_IDS),
            ("0", Code.BAD_GROUP_IDS),
            ({"0": 0}, Code.BAD_GROUP_IDS),  # a map decodes, and is not an array
            (b"\x00", Code.BAD_GROUP_IDS),  # bin
            (too_many, Code.BAD_GROUP_IDS),  # more ids than groups: duplicates or out of range
        ]
        value, code = rng.choice(choices)
        frames[1] = msgpack.packb(value, use_bin_type=True)
        return Case("bad_group_ids", frames, "error", code)

    def _bad_hashes(self) -> Case:
        rng = self.rng
        token_len, groups, hbm, hashes = self._valid_parts()
        bad_items: list[tuple[Any, str]] = [
            ("zz", Code.BAD_HASHES),
            ("abc", Code.BAD_HASHES),  # odd length
            ("", Code.BAD_HASHES),
            ("0g", Code.BAD_HASHES),
            ("\u00e90", Code.BAD_HASHES),
            (" 00", Code.BAD_HASHES),
            ("0x00", Code.BAD_HASHES),
            (7, Code.BAD_HASHES),
            (None, Code.BAD_HASHES),
            (1.0, Code.BAD_HASHES),
            (["00"], Code.BAD_HASHES),
            ("00" * (MAX_HASH_HEX_LEN // 2 + 1), Code.BAD_HASHES),  # above the length limit
            (b"\x00" * 32, Code.BAD_HASHES),  # raw bytes instead of hex
        ]
        whole: list[tuple[Any, str]] = [
            ("00", Code.BAD_HASHES),  # a string, not an array
            (None, Code.BAD_HASHES),
            (5, Code.BAD_HASHES),
            ({"a": "00"}, Code.BAD_HASHES),
        ]
        if rng.random() < 0.8:
            item, code = rng.choice(bad_items)
            hashes.insert(rng.randint(0, len(hashes)), item)
            value: Any = hashes
        else:
            value, code = rng.choice(whole)
        frames = [_u32(token_len), msgpack.packb(groups), _u32(hbm), msgpack.packb(value, use_bin_type=True)]
        return Case("bad_hashes", frames, "error", code)

    def _too_many_hashes(self) -> Case:
        rng = self.rng
        frames, _ = self._valid_frames()
        if rng.random() < 0.3:
            if self._huge_hash_list is None:  # ~200 KB, built once
                self._huge_hash_list = msgpack.packb(["00"] * (MAX_HASHES + 1))
            frames[3] = self._huge_hash_list
        else:  # an array32 header announcing more than the limit, with little or no body
            n = rng.randint(MAX_HASHES + 1, 0xFFFFFFFF)
            frames[3] = b"\xdd" + _u32(n) + self._rand_bytes(0, 8)
        return Case("too_many_hashes", frames, "error", Code.TOO_MANY_HASHES)

    def _corrupt_msgpack(self) -> Case:
        rng = self.rng
        frames, _ = self._valid_frames()
        i = rng.choice((1, 3))
        b = bytearray(frames[i])
        how = rng.choice(("truncate", "flip", "insert", "trailing", "random"))
        if how == "trailing":  # always invalid: msgpack refuses extra data after the value
            frames[i] = bytes(b) + self._rand_bytes(1, 8)
            return Case("corrupt_msgpack", frames, "error", Code.BAD_MSGPACK)
        if how == "truncate" and len(b) > 1:
            del b[rng.randint(0, len(b) - 1):]
        elif how == "flip" and b:
            for _ in range(rng.randint(1, 3)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif how == "insert":
            b.insert(rng.randint(0, len(b)), rng.randrange(256))
        else:
            b = bytearray(self._rand_bytes(0, 48))
        frames[i] = bytes(b)
        return Case("corrupt_msgpack", frames, "any")

    def _random_frames(self) -> Case:
        rng = self.rng
        n = rng.choice((1, 2, 3, 4, 4, 4, 5, 6, rng.randint(7, 64)))
        frames = [self._rand_bytes(0, 48) for _ in range(n)]
        if n == 4:
            return Case("random_frames", frames, "any")
        if n == 1 and frames[0] == RESET_FRAME:  # pragma: no cover - 1 in 2**40
            return Case("random_frames", frames, "ok", token_len=0)
        return Case("random_frames", frames, "error", Code.BAD_FRAME_COUNT)

    def _empty_frames(self) -> Case:
        n = self.rng.randint(1, 6)
        frames = [b""] * n
        return Case("empty_frames", frames, "error", Code.BAD_INT_FRAME if n == 4 else Code.BAD_FRAME_COUNT)

    def _big_frame(self) -> Case:
        """One frame of 64 KiB..1 MiB of random bytes in place of a msgpack frame."""
        rng = self.rng
        frames, _ = self._valid_frames()
        i = rng.choice((1, 3))
        frames[i] = self._rand_bytes(64 * 1024, 1024 * 1024)
        return Case("big_frame", frames, "any")
