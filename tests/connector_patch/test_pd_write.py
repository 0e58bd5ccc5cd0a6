"""P's chunked write (connector_patch/pd/write.py, issue 43, 7a): every byte of the descriptors
goes out exactly once, in order, in chunks sized to the measured speed; the guard that cuts a
write between chunks is shared by threads."""

from __future__ import annotations

import threading

import pytest

from connector_patch.pd.write import ChunkSizer, GuardedPtrs, WriteGuard, chunks

pytestmark = pytest.mark.timeout(30)


def _bytes(src, dst, lengths):
    """(source byte, destination byte) for every byte a list of descriptors copies."""
    return [(s + i, d + i) for s, d, n in zip(src, dst, lengths) for i in range(n)]


@pytest.mark.parametrize("first", [1, 3, 7, 64, 1000])
def test_every_byte_goes_out_once_in_order(first) -> None:
    src, dst, lengths = [1000, 5000, 9000], [20000, 30000, 40000], [10, 1, 25]
    sizer = ChunkSizer(chunk_s=0.1, first=first, maximum=first)
    out = list(chunks(src, dst, lengths, sizer))
    assert all(sum(c[2]) <= first for c in out)
    flat = [b for c in out for b in _bytes(*c)]
    assert flat == _bytes(src, dst, lengths)
    assert len(out) == -(-36 // first)  # as few chunks as the size allows


def test_a_chunk_is_sized_to_the_measured_speed() -> None:
    sizer = ChunkSizer(chunk_s=0.1, first=64 * 1024, maximum=64 * 1024 * 1024)
    assert sizer.next_bytes() == 64 * 1024  # nothing measured yet
    sizer.wrote(64 * 1024, 0.5)  # 128 KiB/s: a chunk of 0.1 s is ~13 KiB
    assert sizer.next_bytes() == int(64 * 1024 / 0.5 * 0.1)
    sizer.wrote(10**9, 0.5)  # ~1 GB/s now: capped
    assert sizer.next_bytes() == 64 * 1024 * 1024
    slow = ChunkSizer(chunk_s=0.1, first=64 * 1024)
    slow.wrote(100, 10.0)  # 10 B/s: never below a sixteenth of the first chunk
    assert slow.next_bytes() == 4 * 1024


def test_the_size_is_asked_before_each_chunk() -> None:
    """A slower link makes the next chunk smaller: chunks() asks the sizer each time."""
    sizer = ChunkSizer(chunk_s=1.0, first=8, maximum=8)
    seen = []
    for c in chunks([0], [0], [40], sizer):
        seen.append(sum(c[2]))
        sizer.maximum = sizer.first = 4  # from now on at most 4 bytes
    assert seen[0] == 8 and all(n == 4 for n in seen[1:]) and sum(seen) == 40


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError):
        list(chunks([1, 2], [1], [1, 1], ChunkSizer()))
    with pytest.raises(ValueError):
        ChunkSizer(chunk_s=0)
    with pytest.raises(ValueError):
        ChunkSizer(first=10, maximum=5)


def test_the_guard_cuts_once_and_is_seen_from_another_thread() -> None:
    guard = WriteGuard(("fd", 1), ["m"])
    ptrs = GuardedPtrs([1, 2])
    ptrs.guard = guard
    assert ptrs == [1, 2] and ptrs and not guard.is_cut()
    seen = threading.Event()

    def writer() -> None:  # as the executor: stops before its next chunk once cut
        while not guard.is_cut():
            guard._cut.wait(0.01)
        seen.set()

    t = threading.Thread(target=writer)
    t.start()
    assert guard.cut("requester_lost") and not guard.cut("shutdown")
    t.join(5)
    assert seen.is_set() and guard.reason == "requester_lost"
