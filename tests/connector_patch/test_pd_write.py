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


class ScriptedEngine:
    """A stand-in for Mooncake's TransferEnginePy async calls, as its source answers them:
    ``transfer_submit_write`` gives a batch id (0 when it could not submit) and
    ``transfer_check_status`` 0 pending, 1 completed, -1 failed, -2 timed out. Each descriptor's
    answers are scripted by its length: ``script[length]`` is the statuses it gives, poll by poll
    (the last one repeats)."""

    def __init__(self, script: dict[int, list[int]], refuse: set[int] = frozenset()) -> None:
        self.script, self.refuse = script, refuse
        self.submitted: list[tuple[int, int, int]] = []
        self.polls: dict[int, int] = {}
        self._len: dict[int, int] = {}

    def transfer_submit_write(self, session, src, dst, length):  # noqa: ANN001
        assert session == "d:1"
        if length in self.refuse:
            return 0
        bid = 1000 + len(self.submitted)
        self.submitted.append((src, dst, length))
        self._len[bid] = length
        return bid

    def transfer_check_status(self, bid):  # noqa: ANN001
        n = self.polls.get(bid, 0)
        self.polls[bid] = n + 1
        answers = self.script[self._len[bid]]
        return answers[min(n, len(answers) - 1)]


def _wait(engine, lengths):  # noqa: ANN001, ANN202
    from connector_patch.pd.write import submit_and_wait

    naps: list[float] = []
    ret = submit_and_wait(engine, "d:1", [10 * i for i in range(len(lengths))],
                          [100 * i for i in range(len(lengths))], lengths, sleep=naps.append)
    return ret, naps


def test_a_write_submits_each_descriptor_and_sleeps_between_polls() -> None:
    """One submit per descriptor (transfer_check_status reads a batch's first task only), polled
    until every one completed, with sleeps that double from POLL_FIRST_S to POLL_MAX_S: a write
    that waits long on a D taking no bytes polls about 200 times a second, never in a busy loop."""
    from connector_patch.pd.write import POLL_FIRST_S, POLL_MAX_S

    eng = ScriptedEngine({1: [1], 2: [0] * 400 + [1], 3: [0, 0, 1]})
    ret, naps = _wait(eng, [1, 2, 3])
    assert ret == 0
    assert eng.submitted == [(0, 0, 1), (10, 100, 2), (20, 200, 3)]
    assert len(naps) == 400 and naps[0] == POLL_FIRST_S and max(naps) == POLL_MAX_S
    assert all(b == min(POLL_MAX_S, a * 2) for a, b in zip(naps, naps[1:]))
    assert sum(naps) > 1.9  # 400 polls of a D taking no bytes: ~2 s asleep, not ~2 s spinning
    assert eng.polls[1000] == 1 and eng.polls[1002] == 3  # a finished descriptor is not polled again


def test_a_failed_descriptor_fails_the_write_after_every_other_one_ended() -> None:
    """A descriptor that failed fails the chunk, but the write returns only once every descriptor
    it submitted has ended: their bytes read P's memory and land in D's blocks until then."""
    eng = ScriptedEngine({1: [0, -1], 2: [0] * 50 + [1]})
    ret, naps = _wait(eng, [1, 2])
    assert ret == -1 and eng.polls[1001] == 51 and len(naps) == 50


@pytest.mark.parametrize("code", [-2, 7])
def test_a_timed_out_or_unknown_status_ends_that_descriptor_as_failed(code) -> None:
    eng = ScriptedEngine({1: [code], 2: [0, 1]})
    ret, _ = _wait(eng, [1, 2])
    assert ret == (-2 if code == -2 else -1) and eng.polls[1001] == 2


@pytest.mark.parametrize("bad", [0, 2**64 - 1])
def test_a_refused_submit_submits_nothing_more_and_waits_for_what_went_out(bad) -> None:
    """A submit that gave no batch (0, or -1 cast unsigned in older Mooncake) fails the write:
    nothing after it goes out, what went before is waited for."""
    from connector_patch.pd.write import SUBMIT_FAILED

    eng = ScriptedEngine({1: [0, 0, 1], 3: [1]}, refuse={2})
    if bad:
        eng.transfer_submit_write = lambda s, a, b, n, f=eng.transfer_submit_write: bad if n == 2 else f(s, a, b, n)
    ret, naps = _wait(eng, [1, 2, 3])
    assert ret == SUBMIT_FAILED and [n for _, _, n in eng.submitted] == [1] and eng.polls[1000] == 3
