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
    ``transfer_check_status`` 0 pending, 1 completed, -1 failed (both free the batch: asking again
    would read freed memory, so it raises here), -2 timed out (not freed). Each descriptor's answers
    are scripted by its length: ``script[length]`` is the statuses it gives, poll by poll (the last
    one repeats). ``batch_transfer_sync_write`` (the fallback after a failed submit) answers
    ``sync_ret`` and records what it got."""

    def __init__(self, script: dict[int, list[int]], refuse: set[int] = frozenset(), sync_ret: int = -1) -> None:
        self.script, self.refuse, self.sync_ret = script, refuse, sync_ret
        self.submitted: list[tuple[int, int, int]] = []
        self.synced: list[list[int]] = []
        self.polls: dict[int, int] = {}
        self.freed: set[int] = set()
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
        assert bid not in self.freed, f"batch {bid} asked about after the engine freed it"
        n = self.polls.get(bid, 0)
        self.polls[bid] = n + 1
        answers = self.script[self._len[bid]]
        st = answers[min(n, len(answers) - 1)]
        if st in (1, -1):
            self.freed.add(bid)
        return st

    def batch_transfer_sync_write(self, session, src, dst, lengths):  # noqa: ANN001
        self.synced.append(list(lengths))
        return self.sync_ret


def _wait(engine, lengths, deadline_s=None):  # noqa: ANN001, ANN202
    from connector_patch.pd.write import submit_and_wait

    naps: list[float] = []
    now = [0.0]

    def sleep(s: float) -> None:
        naps.append(s)
        now[0] += s

    ret = submit_and_wait(engine, "d:1", [10 * i for i in range(len(lengths))],
                          [100 * i for i in range(len(lengths))], lengths, deadline_s=deadline_s,
                          sleep=sleep, clock=lambda: now[0])
    return ret, naps


def test_a_write_submits_each_descriptor_and_sleeps_between_polls() -> None:
    """One submit per descriptor (transfer_check_status reads a batch's first task only), polled
    until every one completed, with sleeps that double from POLL_FIRST_S to POLL_MAX_S: a write
    that waits long on a D taking no bytes polls about 200 times a second, never in a busy loop."""
    from connector_patch.pd.write import POLL_FIRST_S, POLL_MAX_S

    eng = ScriptedEngine({1: [0] * 400 + [1], 2: [1], 3: [1]})
    ret, naps = _wait(eng, [1, 2, 3])
    assert ret == 0 and eng.synced == []
    assert eng.submitted == [(0, 0, 1), (10, 100, 2), (20, 200, 3)]
    assert len(naps) == 400 and naps[0] == POLL_FIRST_S and max(naps) == POLL_MAX_S
    assert all(b == min(POLL_MAX_S, a * 2) for a, b in zip(naps, naps[1:]))
    assert sum(naps) > 1.9  # 400 polls of a D taking no bytes: ~2 s asleep, not ~2 s spinning
    assert eng.freed == {1000, 1001, 1002}


def test_only_the_oldest_pending_descriptor_is_polled_while_it_waits() -> None:
    """2000 descriptors to a stalled D cost one call a poll, not 2000: the oldest is asked until it
    ends, then the rest are swept at once (each asked once when it has completed meanwhile)."""
    n = 2000
    eng = ScriptedEngine({7: [0] * 50 + [1], 1: [1]})
    ret, naps = _wait(eng, [7] + [1] * (n - 1))
    assert ret == 0 and len(naps) == 50
    assert eng.polls[1000] == 51 and sum(eng.polls.values()) == 51 + n - 1


def test_a_failed_descriptor_fails_the_write_after_every_other_one_ended() -> None:
    """A descriptor that failed fails the chunk, but the write returns only once every descriptor
    it submitted has ended: their bytes read P's memory and land in D's blocks until then."""
    eng = ScriptedEngine({1: [0, -1], 2: [0] * 50 + [1]})
    ret, naps = _wait(eng, [1, 2])
    assert ret == -1 and eng.freed == {1000, 1001}


def test_a_slice_timeout_is_polled_on_until_the_engine_frees_the_batch() -> None:
    """-2 (an RDMA slice timeout) leaves the slices posted and the batch allocated: the write keeps
    asking until 1 or -1 (the engine frees it then), and fails with -2."""
    eng = ScriptedEngine({1: [0, -2, -2, -2, -1], 2: [1]})
    ret, _ = _wait(eng, [1, 2])
    assert ret == -2 and eng.polls[1000] == 5 and eng.freed == {1000, 1001}


def test_an_unknown_status_ends_that_descriptor_as_failed() -> None:
    eng = ScriptedEngine({1: [7], 2: [0, 1]})
    ret, _ = _wait(eng, [1, 2])
    assert ret == -1 and eng.polls[1000] == 1 and eng.polls[1001] == 2


def test_the_wait_has_the_sync_calls_bound() -> None:
    """A D that never takes the bytes: the write fails at the bound Mooncake's sync call has
    (MC_TRANSFER_TIMEOUT, 30 s unless set, at least 5, plus a nanosecond a byte), never waits on."""
    from connector_patch.pd.write import WAIT_TIMED_OUT, sync_deadline_s

    assert sync_deadline_s(0, {}) == 30 and sync_deadline_s(10**9, {}) == 31
    assert sync_deadline_s(0, {"MC_TRANSFER_TIMEOUT": "2"}) == 5 and sync_deadline_s(0, {"MC_TRANSFER_TIMEOUT": "60"}) == 60
    assert sync_deadline_s(0, {"MC_TRANSFER_TIMEOUT": "x"}) == 5  # atoi: 0, raised to the floor
    eng = ScriptedEngine({1: [0]})
    ret, naps = _wait(eng, [1, 1], deadline_s=3.0)
    assert ret == WAIT_TIMED_OUT and 3.0 < sum(naps) < 3.1 and eng.polls == {1000: len(naps) + 1}


@pytest.mark.parametrize("bad", [0, 2**64 - 1])
@pytest.mark.parametrize("sync_ret", [0, -1])
def test_a_refused_submit_hands_the_rest_to_the_sync_call(bad, sync_ret) -> None:
    """A submit that gave no batch (0, or -1 cast unsigned in older Mooncake): the descriptors from
    it on go through the sync call (it fails at once on a segment it cannot open and drops it from
    the engine's cache; or it writes them); what went before is waited for."""
    from connector_patch.pd.write import SUBMIT_FAILED

    eng = ScriptedEngine({1: [0, 0, 1], 3: [1]}, sync_ret=sync_ret)
    real = eng.transfer_submit_write
    eng.transfer_submit_write = lambda s, a, b, n: bad if n == 2 else real(s, a, b, n)
    ret, naps = _wait(eng, [1, 2, 3])
    assert [n for _, _, n in eng.submitted] == [1] and eng.synced == [[2, 3]] and eng.polls[1000] == 3
    assert ret == (0 if sync_ret == 0 else SUBMIT_FAILED)
