"""The hardened P/D connector's pure logic (connector_patch/pd/): D's load ledger and P's terminal
records, with property tests (Hypothesis) for their bounds, deadlines and idempotence."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connector_patch.pd.ledger import LoadLedger, flatten_blocks, validate_kv_load_timeout_ms
from connector_patch.pd.terminal import MIN_TTL_S, TerminalRecords, ttl_for


# --------------------------------------------------------------------------- the ledger

@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3000", None])
def test_kv_load_timeout_must_be_a_positive_int(bad) -> None:
    with pytest.raises(ValueError, match="kv_load_timeout_ms must be a positive int"):
        validate_kv_load_timeout_ms(bad)
    with pytest.raises(ValueError, match="kv_load_timeout_ms"):
        LoadLedger(bad)
    assert validate_kv_load_timeout_ms(2000) == 2000


def test_blocks_are_flattened_across_groups_and_empty_loads_are_not_tracked() -> None:
    assert flatten_blocks([[1, 2], [], [2, 7]]) == {1, 2, 7}
    led = LoadLedger(1000)
    assert led.start("free-only", [[], []], now=0.0) is False  # a pull that only frees P's side
    assert led.start("r", [[1, 2], [9]], now=0.0) is True
    assert led.start("r", [[3]], now=0.0) is False  # tracked once
    led.fail("free-only", "peer_error")
    rep = led.collect(now=0.1)
    assert rep.finished == set() and led.pending() == 1  # never reported: the scheduler may not know it
    led.fail("r", "peer_error")
    rep = led.collect(now=0.2)
    assert rep.finished == {"r"} and rep.failed_blocks == {1, 2, 9} and rep.failures == {"peer_error": 1}


def test_a_load_past_its_deadline_fails_once_and_a_late_ok_is_ignored() -> None:
    led = LoadLedger(2000)
    led.start("r", [[4, 5]], now=10.0)
    assert led.next_deadline() == pytest.approx(12.0)
    assert led.collect(now=11.9).finished == set()
    rep = led.collect(now=12.0)
    assert rep.finished == {"r"} and rep.failed_blocks == {4, 5} and rep.failures == {"timeout": 1}
    led.ok("r")
    assert led.collect(now=12.1).finished == set() and led.pending() == 0


def test_a_load_failed_on_one_p_is_never_completed_by_another_ps_ok() -> None:
    led = LoadLedger(5000)
    led.start("r", [[1]], now=0.0, expect=2)  # pulls from two P ranks
    led.ok("r")
    assert led.collect(now=0.1).finished == set()  # one of two
    led.fail("r", "unreachable")
    led.ok("r")  # the other P's OK, after the failure
    rep = led.collect(now=0.2)
    assert rep.finished == {"r"} and rep.failed_blocks == {1} and rep.failures == {"unreachable": 1}


def test_a_final_reply_that_does_not_name_an_asked_request_fails_it() -> None:
    """Upstream leaves such a request waiting forever (scenario pd-fake-prefill-unknown-reqs)."""
    led = LoadLedger(5000)
    for rid in ("a", "b", "c"):
        led.start(rid, [[ord(rid)]], now=0.0)
    foreign = led.reply(asked=["a", "b", "c"], ok=["a", "zzz"], failed=["yyy"], final=False)
    assert foreign == 2
    assert led.collect(now=0.1).finished == {"a"}  # b and c: P said CONTINUE, still waiting
    led.reply(asked=["b", "c"], ok=["b"], final=True)
    rep = led.collect(now=0.2)
    assert rep.finished == {"b", "c"} and rep.failed_blocks == {ord("c")} and rep.failures == {"unanswered": 1}


def test_outcomes_from_many_threads_are_each_applied_once() -> None:
    led = LoadLedger(60000)
    ids = [f"r{i}" for i in range(400)]
    for i, rid in enumerate(ids):
        led.start(rid, [[i]], now=0.0)

    def report(part: list[str]) -> None:
        for rid in part:
            (led.fail if int(rid[1:]) % 3 == 0 else led.ok)(rid, *(["peer_error"] if int(rid[1:]) % 3 == 0 else []))
            led.ok(rid)  # a duplicate, late OK

    threads = [threading.Thread(target=report, args=(ids[k::4],)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(10)
    rep = led.collect(now=1.0)
    assert rep.finished == set(ids) and led.pending() == 0
    assert rep.failed_blocks == {i for i in range(400) if i % 3 == 0}


EVENT = st.tuples(st.sampled_from(["ok", "fail", "tick"]), st.integers(0, 7), st.floats(0.0, 1.5))


@settings(max_examples=200, deadline=None)
@given(expect=st.lists(st.integers(1, 3), min_size=8, max_size=8),
       blocks=st.lists(st.lists(st.integers(0, 3), max_size=3), min_size=8, max_size=8),
       events=st.lists(EVENT, max_size=60))
def test_every_tracked_load_is_reported_exactly_once(expect, blocks, events) -> None:
    """Whatever the order of OKs, failures and time: each tracked load is reported once, with all
    of its blocks or none; a failure that came before the load completed always wins (a later OK
    never completes it); a load reported OK had its ``expect`` OKs; all are done by the deadline."""
    led = LoadLedger(1000)
    tracked = {}
    for i in range(8):
        groups = [[i * 10 + b for b in blocks[i]]]
        if led.start(f"r{i}", groups, now=0.0, expect=expect[i]):
            tracked[f"r{i}"] = set(groups[0])
    oks = {r: 0 for r in tracked}
    failed_before: set[str] = set()
    reported: dict[str, bool] = {}  # id -> failed?
    now = 0.0
    failed_blocks: set[int] = set()
    for kind, i, dt in events:
        rid = f"r{i}"
        if kind == "ok":
            led.ok(rid)
            if rid in oks and rid not in reported and rid not in failed_before:
                oks[rid] += 1
        elif kind == "fail":
            led.fail(rid, "peer_error")
            if rid in tracked and rid not in reported and oks[rid] < expect[i]:  # before it completed
                failed_before.add(rid)
        else:
            now += dt
            rep = led.collect(now)
            assert not (rep.finished & set(reported)), "reported twice"
            for r in rep.finished:
                reported[r] = bool(tracked[r] & rep.failed_blocks) or not tracked[r]
            failed_blocks |= rep.failed_blocks
    rep = led.collect(now + 1.0)  # past every deadline
    for r in rep.finished:
        assert r not in reported
        reported[r] = bool(tracked[r] & rep.failed_blocks)
    failed_blocks |= rep.failed_blocks
    assert set(reported) == set(tracked) and led.pending() == 0
    need = {f"r{j}": e for j, e in enumerate(expect)}
    for r, blocks_r in tracked.items():
        assert (blocks_r <= failed_blocks) or not (blocks_r & failed_blocks)  # all or none of a load
        if r in failed_before:
            assert reported[r], f"{r}: a failure before its report must win"
        if not reported[r]:
            assert oks[r] >= need[r], f"{r}: reported OK after {oks[r]} of {need[r]} pulls"


# --------------------------------------------------------------------------- terminal records

def test_ttl_is_the_abort_timeout_but_never_under_300_s() -> None:
    assert ttl_for(10) == MIN_TTL_S and ttl_for(480) == 480.0


def test_a_late_pull_finds_the_answer_until_the_ttl() -> None:
    rec = TerminalRecords(abort_timeout_s=480)
    rec.record("t1", "aborted", now=0.0)
    rec.record("t1", "send_failed", now=100.0)  # idempotent: the first status stays, the time refreshes
    assert rec.lookup("t1", now=579.0) == "aborted"
    assert rec.lookup("t1", now=580.0) is None and len(rec) == 0


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 40), st.floats(0.0, 200.0)), max_size=200),
       capacity=st.integers(1, 16))
def test_terminal_records_stay_bounded_and_expire(ops, capacity) -> None:
    rec = TerminalRecords(abort_timeout_s=10, capacity=capacity)  # ttl 300 s
    now = 0.0
    last: dict[str, float] = {}
    first: dict[str, str] = {}
    for n, dt in ops:
        now += dt
        tid = f"t{n}"
        rec.record(tid, f"s{n % 3}", now)
        if tid not in first or now - last[tid] >= rec.ttl_s:
            first[tid] = f"s{n % 3}"
        last[tid] = now
        assert len(rec) <= capacity
    for tid, at in last.items():
        got = rec.lookup(tid, now)
        if now - at >= rec.ttl_s:
            assert got is None
        elif got is not None:
            assert got in (first[tid], f"s{int(tid[1:]) % 3}")
    assert rec.lookup("never", now) is None


def test_the_newest_records_survive_the_bound() -> None:
    rec = TerminalRecords(abort_timeout_s=0, capacity=3)
    for i in range(5):
        rec.record(f"t{i}", "aborted", now=float(i))
    assert [rec.lookup(f"t{i}", 5.0) for i in range(5)] == [None, None, "aborted", "aborted", "aborted"]
    assert rec.evicted == 2


# --------------------------------------------------------------------------- P's abort drain

def test_abort_drain_releases_only_what_is_drained_on_this_rank() -> None:
    from connector_patch.pd.drain import AbortDrain

    d = AbortDrain()
    d.transfer_started("a")
    d.transfer_started("a")
    d.abort("a")
    d.abort("b")
    assert d.agree(["a", "b"]) == ["b"]
    d.transfer_done("a")
    assert d.agree(["a"]) == []  # one transfer still in flight
    d.transfer_done("a")  # the second one failed: a failed send drains too
    assert d.agree(["a"]) == ["a"] and d.aborted() == []
    assert d.agree(["c"]) == []  # never aborted: never released


def test_abort_drain_refuses_a_malformed_agreement() -> None:
    from connector_patch.pd.drain import AbortDrain

    d = AbortDrain(lambda flags: flags[:-1])
    d.abort("a")
    with pytest.raises(RuntimeError, match="1 requests"):
        d.agree(["a"])


@pytest.mark.timeout(180)
def test_two_ranks_agree_by_a_min_all_reduce_over_real_gloo(tmp_path) -> None:
    """Two processes, real torch.distributed Gloo on loopback: one rank drained, the other not ->
    neither releases; once both drained, both release in the same round."""
    import json
    import socket
    import subprocess
    from pathlib import Path

    from stacks.vllm_cpu.recipe import pd_node_env

    env = pd_node_env(out=lambda line: None)
    if not env.installed():
        pytest.skip("the P/D node stack (torch) is not installed here: run `pdchaos setup --only pd-node-stack`")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    repo = Path(__file__).resolve().parents[2]
    script = repo / "tests" / "helpers" / "drain_gloo.py"
    procs = [subprocess.Popen([str(env.python), str(script), str(rank), str(port), str(repo)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=150)
            assert p.returncode == 0, err[-2000:]
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for o in outs:
        assert o["rounds"] == [["r3"], ["r1", "r2"], []], o
        assert o["left"] == []


def test_a_terminal_record_lost_while_a_pull_waited_is_known() -> None:
    """Issue 30, item 10: a pull P received at t and serves later cannot trust a missing record
    when one made since t may be gone: expired (t + TTL passed) or evicted for room."""
    from connector_patch.pd.terminal import TerminalRecords

    t = TerminalRecords(abort_timeout_s=10, capacity=2)  # TTL 300 s
    t.record("a", "cancelled", 100.0)
    assert not t.lost_since(50.0, 120.0)
    assert t.lost_since(50.0, 350.0)  # anything recorded since 50 may have expired by 350
    t.record("b", "cancelled", 101.0)
    t.record("c", "cancelled", 102.0)  # pushes "a" (recorded at 100) out
    assert t.evicted == 1
    assert t.lost_since(99.0, 103.0) and not t.lost_since(100.5, 103.0)
