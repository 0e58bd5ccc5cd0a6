"""LookupClient over real ZMQ sockets (ipc and tcp): constructor validation, one deadline per
call, fail-open on every malformed reply, recovery, late replies, server restarts, counters."""

from __future__ import annotations

import threading
import time

import msgpack
import pytest

from connector_patch.lookup import DEFAULT_TIMEOUT_MS, Code, LookupClient
from connector_patch.lookup.protocol import encode_error, encode_ok
from rawpeers import (
    PROMPT_S,
    SHORT_DEADLINE_MS,
    TOLERANCE_S,
    Act,
    counter_delta,
    distinct_hashes,
    first_then_relay,
    reply_always,
)

pytestmark = [pytest.mark.usefixtures("log_guard"), pytest.mark.timeout(30)]

DEADLINE_S = SHORT_DEADLINE_MS / 1000.0
FAILURE_CATEGORIES = ("timeout", "transport", "protocol", "server_error", "backend_error", "bad_call")


def failures(counters: dict) -> dict:
    return {k: counters[k] for k in FAILURE_CATEGORIES if counters.get(k)}


def timed(fn):
    start = time.monotonic()
    result = fn()
    return result, time.monotonic() - start


# ---------------------------------------------------------------- constructor


@pytest.mark.parametrize("bad", [0, -1, -5000, True, False, 1.5, 200.0, "200", "5000", None, b"200"])
def test_timeout_ms_rejected(bad, ipc_endpoint):
    with pytest.raises(ValueError):
        LookupClient(ipc_endpoint(), bad)


def test_timeout_ms_default_and_positive(ipc_endpoint):
    c = LookupClient(ipc_endpoint())
    try:
        assert c.timeout_ms == DEFAULT_TIMEOUT_MS == 5000
    finally:
        c.close()
    c = LookupClient(ipc_endpoint(), 1)
    try:
        assert c.timeout_ms == 1
    finally:
        c.close()


@pytest.mark.parametrize("bad", ["", "inproc://x", "127.0.0.1:5555", None, 5])
def test_endpoint_rejected(bad):
    with pytest.raises(ValueError):
        LookupClient(bad, 200)


# ---------------------------------------------------------------- bounded return


def assert_bounded_timeout(client, elapsed, hit):
    assert hit == 0
    assert elapsed <= DEADLINE_S + TOLERANCE_S, f"returned after {elapsed:.3f} s"
    assert elapsed >= DEADLINE_S - 0.005, f"returned early ({elapsed:.3f} s): not a deadline"
    assert client.last_outcome == "timeout" and client.last_code == Code.TIMEOUT
    assert failures(client.counters) == {"timeout": 1}
    assert client.counters["socket_rebuilds"] == 1


def test_nothing_bound(make_endpoint, client_factory):
    c = client_factory(make_endpoint(), SHORT_DEADLINE_MS)
    hit, elapsed = timed(lambda: c.lookup(64, distinct_hashes(4, "nothing-bound")))
    assert_bounded_timeout(c, elapsed, hit)


def test_bound_but_silent(make_endpoint, client_factory, peer_factory):
    peer = peer_factory(make_endpoint(), silent=True)
    c = client_factory(peer.endpoint, SHORT_DEADLINE_MS)
    hit, elapsed = timed(lambda: c.lookup(64, distinct_hashes(4, "silent")))
    assert_bounded_timeout(c, elapsed, hit)


def test_reply_after_deadline(make_endpoint, client_factory, peer_factory):
    peer = peer_factory(make_endpoint(), reply_always([encode_ok(64)], delay_s=DEADLINE_S + 0.2))
    c = client_factory(peer.endpoint, SHORT_DEADLINE_MS)
    hit, elapsed = timed(lambda: c.lookup(64, distinct_hashes(4, "late")))
    assert_bounded_timeout(c, elapsed, hit)
    assert peer.request_count == 1  # the request did reach the peer: only the reply was late


def test_reset_bounded_against_silent_peer(make_endpoint, client_factory, peer_factory):
    peer = peer_factory(make_endpoint(), silent=True)
    c = client_factory(peer.endpoint, SHORT_DEADLINE_MS)
    ok, elapsed = timed(c.reset)
    assert ok is False
    assert elapsed <= DEADLINE_S + TOLERANCE_S
    assert c.counters["reset_failed"] == 1 and c.counters["timeout"] == 1


def test_one_deadline_covers_queue_send_and_wait(make_endpoint, client_factory, peer_factory):
    """Two calls on one client: the second waits for the lock (the first call's slow exchange)
    and then meets a slow peer. Each phase alone is shorter than the deadline, together they are
    longer: with one deadline per call the second call still returns at its deadline (a client
    that gave each phase its own timeout would return a hit after ~0.3 s)."""
    step = 0.6 * DEADLINE_S  # 120 ms: below the deadline, two of them above it
    peer = peer_factory(make_endpoint(), reply_always([encode_ok(16)], delay_s=step))
    c = client_factory(peer.endpoint, SHORT_DEADLINE_MS)
    hashes = distinct_hashes(1, "one-deadline")
    first: list = []
    t = threading.Thread(target=lambda: first.append(c.lookup(16, hashes)))
    t.start()
    time.sleep(0.02)  # the first call holds the lock and is waiting for its reply
    hit, elapsed = timed(lambda: c.lookup(16, hashes))
    t.join(PROMPT_S)
    assert first == [16]  # the first call fitted in its deadline
    assert hit == 0 and c.last_code == Code.TIMEOUT
    assert elapsed <= DEADLINE_S + TOLERANCE_S, f"second call took {elapsed:.3f} s"


def test_one_deadline_with_late_server_and_slow_reply(make_endpoint, client_factory, peer_factory):
    """A server that binds late and then answers slowly: connect, send and wait share one budget."""
    step = 0.6 * DEADLINE_S
    peer = peer_factory(make_endpoint(), reply_always([encode_ok(16)], delay_s=step), bind_delay_s=step)
    c = client_factory(peer.endpoint, SHORT_DEADLINE_MS)
    hit, elapsed = timed(lambda: c.lookup(16, distinct_hashes(1, "late-bind")))
    assert hit == 0 and c.last_code == Code.TIMEOUT
    assert elapsed <= DEADLINE_S + TOLERANCE_S, f"took {elapsed:.3f} s"
    assert peer.wait_bound()


# ---------------------------------------------------------------- malformed replies

OK = {"version": 1, "status": "ok", "hit_tokens": 16}
MALFORMED = {
    "empty frame": ([b""], Code.EMPTY_REPLY),
    "two frames": ([encode_ok(16), b"x"], Code.EXTRA_FRAMES),
    "not msgpack": ([b"\xc1" * 5], Code.BAD_REPLY),
    "msgpack list": ([msgpack.packb([1, 16])], Code.BAD_REPLY),
    "msgpack str": ([msgpack.packb("ok")], Code.BAD_REPLY),
    "too large": ([msgpack.packb({**OK, "pad": "x" * 600})], Code.REPLY_TOO_LARGE),
    "missing key": ([msgpack.packb({"version": 1, "status": "ok"})], Code.BAD_FIELDS),
    "extra key": ([msgpack.packb({**OK, "extra": 0})], Code.BAD_FIELDS),
    "unknown status": ([msgpack.packb({**OK, "status": "fine"})], Code.BAD_FIELDS),
    "bool hit": ([msgpack.packb({**OK, "hit_tokens": True})], Code.BAD_TYPES),
    "str hit": ([msgpack.packb({**OK, "hit_tokens": "16"})], Code.BAD_TYPES),
    "str version": ([msgpack.packb({**OK, "version": "1"})], Code.BAD_TYPES),
    "version 2": ([msgpack.packb({**OK, "version": 2})], Code.UNSUPPORTED_VERSION),
    "hit above token_len": ([encode_ok(65)], Code.HIT_OUT_OF_RANGE),
    "negative hit": ([msgpack.packb({**OK, "hit_tokens": -16})], Code.HIT_OUT_OF_RANGE),
    "legacy 4-byte": ([(16).to_bytes(4, "big")], Code.LEGACY_REPLY),
}


class Recovery:
    """A raw peer answers the first request as ``first`` says and relays every later one to a
    real, healthy LookupServer (the module's shared server) holding the 4 blocks of ``hashes``."""

    def __init__(self, make_endpoint, healthy, peer_factory, client_factory, first: Act, tag: str,
                 timeout_ms: int = 1000):
        self.healthy = healthy
        self.hashes = healthy.preload(4, tag)
        self.peer = peer_factory(make_endpoint(), first_then_relay(first, healthy.endpoint))
        self.client = client_factory(self.peer.endpoint, timeout_ms)
        self.before = healthy.server.counters

    def assert_recovered(self, category, code):
        c = self.client
        assert c.last_outcome == category and c.last_code == code
        assert c.lookup(64, self.hashes) == 64  # the next call, on its first try
        assert c.last_outcome == "ok"
        assert failures(c.counters) == {category: 1}
        assert c.counters["ok"] == 1 and c.counters["socket_rebuilds"] == 1
        # exactly one request reached the real server: no retry
        assert counter_delta(self.before, self.healthy.server.counters) == {"requests": 1, "replies": 1, "ok": 1}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_reply_fails_open_then_recovers(name, make_endpoint, shared_server, peer_factory,
                                                  client_factory):
    frames, code = MALFORMED[name]
    r = Recovery(make_endpoint, shared_server, peer_factory, client_factory, Act(reply=frames), name)
    hit, elapsed = timed(lambda: r.client.lookup(64, r.hashes))
    assert hit == 0
    assert elapsed < 0.9  # answered, not timed out
    r.assert_recovered("protocol", code)


ENVELOPES = {
    Code.BACKEND_ERROR: "backend_error",
    Code.BACKEND_TIMEOUT: "backend_error",
    Code.RESET_FAILED: "backend_error",
    Code.BAD_HASHES: "server_error",
    Code.INTERNAL: "server_error",
    "A_CODE_FROM_THE_FUTURE": "server_error",
}


@pytest.mark.parametrize("code", list(ENVELOPES))
def test_error_envelope_category(code, make_endpoint, shared_server, peer_factory, client_factory):
    r = Recovery(make_endpoint, shared_server, peer_factory, client_factory,
                 Act(reply=[encode_error(code, "sanitized")]), f"envelope-{code}")
    assert r.client.lookup(64, r.hashes) == 0
    r.assert_recovered(ENVELOPES[code], code)


def test_timeout_then_recovers(make_endpoint, shared_server, peer_factory, client_factory):
    # The peer answers the first request 50 ms after the client's deadline: the client has given
    # up by then, and its next call (same client, same deadline) is answered by the real server.
    r = Recovery(make_endpoint, shared_server, peer_factory, client_factory,
                 Act(reply=[encode_ok(64)], delay_s=DEADLINE_S + 0.05), "timeout",
                 timeout_ms=SHORT_DEADLINE_MS)
    assert r.client.lookup(64, r.hashes) == 0
    r.assert_recovered("timeout", Code.TIMEOUT)


@pytest.mark.parametrize("frames", [[(1).to_bytes(4, "big")], [b""], [encode_ok(0), b""],
                                    [encode_error(Code.RESET_FAILED, "drain timed out")]],
                         ids=["legacy", "empty", "two frames", "RESET_FAILED"])
def test_reset_fails_open_on_a_bad_reply_then_recovers(frames, make_endpoint, shared_server, peer_factory,
                                                       client_factory):
    r = Recovery(make_endpoint, shared_server, peer_factory, client_factory, Act(reply=frames), "reset")
    assert r.client.reset() is False
    assert r.client.counters["reset_failed"] == 1
    assert r.client.lookup(64, r.hashes) == 64  # recovered: the next call is answered on its first try
    assert r.client.counters["socket_rebuilds"] == 1


# ---------------------------------------------------------------- late replies, EFSM, restarts


def test_late_reply_is_not_taken_for_the_next_one(make_endpoint, peer_factory, client_factory):
    """The peer answers each request with hit = token_len - 1, the first one too late. Without a
    socket rebuild the next call would read the first call's late answer (or raise EFSM)."""

    def respond(i, frames):
        token_len = int.from_bytes(frames[0], "big")
        return Act(reply=[encode_ok(token_len - 1)], delay_s=DEADLINE_S + 0.05 if i == 0 else 0.0)

    peer = peer_factory(make_endpoint(), respond)
    c = client_factory(peer.endpoint, SHORT_DEADLINE_MS)
    hashes = distinct_hashes(8, "late-reply")
    assert c.lookup(100, hashes) == 0 and c.last_code == Code.TIMEOUT
    # sent before the late reply leaves the peer; answered right after it
    assert c.lookup(50, hashes) == 49
    assert c.lookup(80, hashes) == 79
    assert failures(c.counters) == {"timeout": 1} and c.counters["transport"] == 0
    deadline = time.monotonic() + PROMPT_S
    while peer.replied < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert peer.replied == 3  # the late reply was sent; it went to the dead socket


def test_server_restarted_mid_run(make_endpoint, server_factory, client_factory):
    ep = make_endpoint()
    first = server_factory(ep)
    hashes = first.preload(4, "restart")
    c = client_factory(ep, 2000)
    assert c.lookup(64, hashes) == 64
    first.server.close()
    second = server_factory(ep)
    second.backend.put([h.hex() for h in hashes[:2]])
    assert c.lookup(64, hashes) == 32  # the restarted server's answer, on the first try
    assert second.server.counters["requests"] == 1
    assert failures(c.counters) == {}


def test_server_gone_mid_run_then_back(make_endpoint, server_factory, client_factory):
    ep = make_endpoint()
    first = server_factory(ep)
    hashes = first.preload(4, "gone")
    c = client_factory(ep, SHORT_DEADLINE_MS)
    assert c.lookup(64, hashes) == 64
    first.server.close()
    hit, elapsed = timed(lambda: c.lookup(64, hashes))
    assert hit == 0 and c.last_code == Code.TIMEOUT and elapsed <= DEADLINE_S + TOLERANCE_S
    second = server_factory(ep)
    second.backend.put([h.hex() for h in hashes])
    time.sleep(0.3)  # the next lookup comes a little later: the rebuilt socket has reconnected by then
    assert c.lookup(64, hashes) == 64  # on the first try, within the same short deadline
    assert second.server.counters["requests"] == 1


# ---------------------------------------------------------------- caller mistakes, counters


@pytest.mark.parametrize("args", [
    (-1, []), ("64", []), (2**32, []), (64, ["not bytes"]), (64, [b"\x01"], (object(),)), (64, None),
    (64, [b"\x01"], (0,), -1),
])
def test_bad_call_fails_open_without_rebuild(args, shared_server, client_factory):
    before = shared_server.server.counters
    c = client_factory(shared_server.endpoint, 1000)
    assert c.lookup(*args) == 0
    assert failures(c.counters) == {"bad_call": 1} and c.counters["socket_rebuilds"] == 0
    assert counter_delta(before, shared_server.server.counters) == {}  # nothing was sent
    hashes = shared_server.preload(2, "bad-call")
    assert c.lookup(32, hashes) == 32


def test_lookup_and_reset_after_close(shared_server, client_factory):
    c = client_factory(shared_server.endpoint, 1000)
    hashes = shared_server.preload(1, "after-close")
    assert c.lookup(16, hashes) == 16
    c.close()
    hit, elapsed = timed(lambda: c.lookup(16, hashes))
    assert hit == 0 and elapsed < 0.1 and c.last_outcome == "transport"
    assert c.reset() is False


def test_counters_are_dicts(lookup_server, client_factory):
    c = client_factory(lookup_server.endpoint, 1000)
    hashes = lookup_server.preload(2, "counters")
    assert c.lookup(32, hashes) == 32
    assert c.lookup(32, distinct_hashes(2, "counters-miss")) == 0  # a real miss is ok
    assert c.lookup(16, hashes, (5,)) == 0  # BAD_GROUP_IDS from the server
    assert c.reset() is True
    cc, sc = c.counters, lookup_server.server.counters
    assert isinstance(cc, dict) and all(isinstance(v, int) for v in cc.values())
    assert isinstance(sc, dict) and all(isinstance(v, int) for v in sc.values())
    assert cc["ok"] == 2 and cc["server_error"] == 1 and cc["reset_ok"] == 1
    assert sc["requests"] == 4 and sc["ok"] == 3 and sc["protocol"] == 1 and sc["resets"] == 1
    cc["ok"] = 999  # a snapshot, not the live counters
    assert c.counters["ok"] == 2


def test_prometheus_counters_increase(make_endpoint, client_factory, peer_factory, shared_server):
    prometheus_client = pytest.importorskip("prometheus_client")
    reg = prometheus_client.REGISTRY

    def value(side, category):
        return reg.get_sample_value(f"vllm_ascend_lookup_rpc_{side}_events_total", {"category": category}) or 0.0

    before = {k: value("client", k) for k in ("ok", "timeout", "protocol")}
    before_srv = value("server", "requests")
    c = client_factory(shared_server.endpoint, 1000)
    assert c.lookup(16, shared_server.preload(1, "prom")) == 16
    silent = client_factory(make_endpoint(), SHORT_DEADLINE_MS)
    assert silent.lookup(16, distinct_hashes(1, "prom")) == 0
    bad = peer_factory(make_endpoint(), reply_always([b"\x00\x00\x00\x10"]))
    assert client_factory(bad.endpoint, 1000).lookup(16, distinct_hashes(1, "prom")) == 0
    assert value("client", "ok") == before["ok"] + 1
    assert value("client", "timeout") == before["timeout"] + 1
    assert value("client", "protocol") == before["protocol"] + 1
    assert value("server", "requests") == before_srv + 1


@pytest.mark.timeout(10)
def test_close_does_not_wait_forever_for_a_lock_left_held(tmp_path):
    """A KeyboardInterrupt between a call's acquire and its ``try`` leaves the client's lock held by
    nobody; close() then still closes, within the deadline + 1 s, and raises nothing."""
    client = LookupClient(f"ipc://{tmp_path}/nobody.sock", 200)
    t = threading.Thread(target=client._lock.acquire)  # the holder goes away without releasing
    t.start()
    t.join()
    t0 = time.monotonic()
    client.close()
    took = time.monotonic() - t0
    assert 1.1 <= took <= 3.0, took
    # the lock is still held by nobody: a later call fails open at its deadline, without raising
    assert client.lookup(32, [b"\x01" * 32]) == 0 and client.last_outcome == "timeout"
    client.close()  # idempotent


def test_the_backend_deadline_lies_below_the_clients() -> None:
    """Issue 30, item 11: a server that gives up on its backend after the client gave up on the
    server answers nobody. Unset: three quarters of the client's deadline; set at or above it: refused."""
    from connector_patch.lookup.client import backend_timeout_for

    assert backend_timeout_for(1000) == 750 and backend_timeout_for(1) == 1
    assert backend_timeout_for(1000, 150) == 150
    for bad in (1000, 4000):
        with pytest.raises(ValueError, match=r"lookup_backend_timeout_ms \(\d+\) must be less than 1000"):
            backend_timeout_for(1000, bad)
    with pytest.raises(ValueError, match="positive int"):
        backend_timeout_for(1000, 0)


@pytest.mark.parametrize("backend_ms, answered_by", [(150, "server"), (400, "client")])
def test_a_hung_master_costs_a_few_lookups_not_every_one(backend_ms, answered_by, make_endpoint, server_factory,
                                                         client_factory) -> None:
    """Issue 30, item 11's second half ("no circuit breaker on the client"), measured: the server
    has the breaker. While the backend (the master) hangs, each of the first MAX_ABANDONED
    lookups leaves one serving thread stuck; from then on the server answers BACKEND_TIMEOUT at
    once without calling the backend, so the scheduler's engine thread stops waiting. With the
    backend deadline below the client's (the fix, 150 < 200 ms) those first lookups end with the
    server's BACKEND_TIMEOUT at 150 ms; with it above (the old default, 400 > 200 ms here, 4000 >
    1000 in the issue) they end with the client's own TIMEOUT at 200 ms, and the server's answer
    comes after the client's timeout, so stuck threads pile up for longer before the fast answers."""
    from connector_patch.lookup.server import MAX_ABANDONED

    ep = make_endpoint()
    srv = server_factory(ep, backend_timeout_ms=backend_ms)
    hashes = srv.preload(4, "hung-master")
    c = client_factory(ep, SHORT_DEADLINE_MS)
    assert c.lookup(64, hashes) == 64
    srv.backend.set("hang")
    calls = []
    t_all = time.monotonic()
    while len(calls) < 30 and time.monotonic() - t_all < 10:
        hit, elapsed = timed(lambda: c.lookup(64, hashes))
        calls.append((hit, elapsed, c.last_code))
    assert len(calls) == 30 and all(hit == 0 for hit, _, _ in calls)
    print(f"backend {backend_ms} ms: {sum(e > 0.1 for _, e, _ in calls)} slow of 30, "
          f"{sum(e for _, e, _ in calls):.2f} s in all")
    slow = [e for _, e, _ in calls if e > 0.1]
    assert len(slow) <= 2 * MAX_ABANDONED, [round(e, 3) for _, e, _ in calls]  # a few, then fast
    assert all(e < 0.05 for _, e, _ in calls[-10:]), [round(e, 3) for _, e, _ in calls]
    assert {code for _, _, code in calls[-10:]} == {Code.BACKEND_TIMEOUT}  # the server's breaker answering
    first = calls[0]
    if answered_by == "server":
        assert first[2] == Code.BACKEND_TIMEOUT and 0.14 <= first[1] <= 0.15 + TOLERANCE_S, first
    else:
        assert first[2] == Code.TIMEOUT and first[1] >= DEADLINE_S - 0.01, first
    srv.backend.set("none")
