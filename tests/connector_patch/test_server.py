"""LookupServer over real ZMQ sockets (ipc and tcp): exactly one reply per request, strict request
validation with the documented codes, backend failures and hangs, admin reset, hit semantics."""

from __future__ import annotations

import time

import msgpack
import pytest

from connector_patch.lookup import Code, LookupServer
from connector_patch.lookup.protocol import MAX_HASHES, MAX_TOKEN_LEN, decode_reply, encode_u32
from rawpeers import PROMPT_S, SHORT_DEADLINE_MS, TOLERANCE_S, counter_delta, distinct_hashes, hexes

pytestmark = [pytest.mark.usefixtures("log_guard"), pytest.mark.timeout(30)]

PROBE = distinct_hashes(4, "server-probe")


def frames_for(token_len=64, groups=(0,), hbm=0, hashes=None):
    return [encode_u32(token_len), msgpack.packb(list(groups)), encode_u32(hbm),
            msgpack.packb(hexes(PROBE) if hashes is None else hashes)]


def envelope(reply, token_len=None):
    assert reply is not None, "no reply"
    return decode_reply(reply, token_len)  # raises if it is not a well-formed v1 envelope


def assert_then_serves(dealer, handle):
    """The next valid request on the same connection gets its own, correct answer (so the bad
    request got exactly one reply: a second one would be read here instead)."""
    handle.backend.put(hexes(PROBE))
    r = envelope(dealer.request(frames_for()), 64)
    assert r.ok and r.hit_tokens == 64


V = frames_for()
BAD_REQUESTS = {
    "0 frames (one empty frame)": ([b""], Code.BAD_FRAME_COUNT),
    "1 frame": ([b"lookup"], Code.BAD_FRAME_COUNT),
    "1 frame RESET uppercase": ([b"RESET"], Code.BAD_FRAME_COUNT),
    "2 frames": (V[:2], Code.BAD_FRAME_COUNT),
    "3 frames": (V[:3], Code.BAD_FRAME_COUNT),
    "5 frames": (V + [b"\x90"], Code.BAD_FRAME_COUNT),
    "3-byte token_len": ([b"\x00\x00\x40"] + V[1:], Code.BAD_INT_FRAME),
    "5-byte token_len": ([b"\x00\x00\x00\x00\x40"] + V[1:], Code.BAD_INT_FRAME),
    "3-byte hbm": (V[:2] + [b"\x00\x00\x00"] + V[3:], Code.BAD_INT_FRAME),
    "5-byte hbm": (V[:2] + [b"\x00" * 5] + V[3:], Code.BAD_INT_FRAME),
    "bad msgpack groups": (V[:1] + [b"\xc1"] + V[2:], Code.BAD_MSGPACK),
    "truncated msgpack groups": (V[:1] + [b"\x92\x00"] + V[2:], Code.BAD_MSGPACK),
    "bad msgpack hashes": (V[:3] + [b"\xc1\xc1"], Code.BAD_MSGPACK),
    "truncated msgpack hashes": (V[:3] + [V[3][:-3]], Code.BAD_MSGPACK),
    "groups not a list": (V[:1] + [msgpack.packb(0)] + V[2:], Code.BAD_GROUP_IDS),
    "groups empty": (frames_for(groups=()), Code.BAD_GROUP_IDS),
    "groups non-int": (frames_for(groups=("0",)), Code.BAD_GROUP_IDS),
    "groups bool": (frames_for(groups=(True,)), Code.BAD_GROUP_IDS),
    "groups duplicate": (frames_for(groups=(1, 1)), Code.BAD_GROUP_IDS),
    "groups out of range": (frames_for(groups=(0, 2)), Code.BAD_GROUP_IDS),
    "groups negative": (frames_for(groups=(-1,)), Code.BAD_GROUP_IDS),
    "hashes not a list": (V[:3] + [msgpack.packb(hexes(PROBE)[0])], Code.BAD_HASHES),
    "hashes non-str": (frames_for(hashes=[1, 2]), Code.BAD_HASHES),
    "hashes bytes": (V[:3] + [msgpack.packb([b"\xab"], use_bin_type=True)], Code.BAD_HASHES),
    "hashes non-hex": (frames_for(hashes=[hexes(PROBE)[0][:-2] + "zz"]), Code.BAD_HASHES),
    "hashes odd length": (frames_for(hashes=[hexes(PROBE)[0][:-1]]), Code.BAD_HASHES),
    "hashes empty string": (frames_for(hashes=[hexes(PROBE)[0], ""]), Code.BAD_HASHES),
    "bad hash beyond token_len": (frames_for(token_len=16, hashes=[hexes(PROBE)[0], "xy"]), Code.BAD_HASHES),
    "too many hashes": (frames_for(hashes=["00"] * (MAX_HASHES + 1)), Code.TOO_MANY_HASHES),
    "token_len above max": (frames_for(token_len=MAX_TOKEN_LEN + 1), Code.BAD_TOKEN_LEN),
    "token_len u32 max": (frames_for(token_len=2**32 - 1), Code.BAD_TOKEN_LEN),
    "hbm above token_len": (frames_for(token_len=64, hbm=65), Code.BAD_HBM_HIT_TOKENS),
}


@pytest.mark.parametrize("name", list(BAD_REQUESTS))
def test_malformed_request_one_error_then_serves(name, shared_server, dealer_factory):
    frames, code = BAD_REQUESTS[name]
    before = shared_server.server.counters
    d = dealer_factory(shared_server.endpoint)
    r = envelope(d.request(frames))
    assert not r.ok and r.code == code
    assert_then_serves(d, shared_server)
    assert counter_delta(before, shared_server.server.counters) == {"requests": 2, "replies": 2, "protocol": 1, "ok": 1}


def test_configured_hash_limit(make_endpoint, server_factory, dealer_factory):
    h = server_factory(make_endpoint(), max_hashes=8, max_token_len=1000)
    d = dealer_factory(h.endpoint)
    assert envelope(d.request(frames_for(hashes=["00"] * 9))).code == Code.TOO_MANY_HASHES
    assert envelope(d.request(frames_for(token_len=1001))).code == Code.BAD_TOKEN_LEN
    assert_then_serves(d, h)


def test_envelope_only_message_is_dropped_by_libzmq(shared_server, dealer_factory):
    """A ZMQ message always has at least one frame, so a REP application can never receive a
    0-frame request: a delimiter-only envelope is discarded by libzmq's REP before the server's
    loop sees it. The server must simply keep serving."""
    before = shared_server.server.counters
    d = dealer_factory(shared_server.endpoint)
    d.send_envelope_only()
    assert_then_serves(d, shared_server)
    assert counter_delta(before, shared_server.server.counters) == {"requests": 1, "replies": 1, "ok": 1}


def test_many_bad_requests_in_a_row(shared_server, dealer_factory):
    d = dealer_factory(shared_server.endpoint)
    for frames, _ in BAD_REQUESTS.values():
        d.send(frames)
    codes = [envelope(d.recv()).code for _ in BAD_REQUESTS]
    assert codes == [code for _, code in BAD_REQUESTS.values()]
    assert_then_serves(d, shared_server)


# ---------------------------------------------------------------- backend failures


def test_backend_raises(lookup_server, client_factory, dealer_factory):
    lookup_server.backend.set("raise")
    d = dealer_factory(lookup_server.endpoint)
    r = envelope(d.request(frames_for()))
    assert not r.ok and r.code == Code.BACKEND_ERROR
    c = client_factory(lookup_server.endpoint, 1000)
    assert c.lookup(64, PROBE) == 0
    assert c.last_outcome == "backend_error" and c.counters["backend_error"] == 1
    lookup_server.backend.set("none")
    assert_then_serves(d, lookup_server)
    assert c.lookup(64, PROBE) == 64
    sc = lookup_server.server.counters
    assert sc["backend_error"] == 2 and sc["ok"] == 2 and sc["requests"] == 4


@pytest.mark.parametrize("value", [-1, 65, True, "16", None])
def test_backend_returns_out_of_range(value, shared_server, dealer_factory):
    shared_server.backend.set("bad_value", bad_value=value)
    try:
        d = dealer_factory(shared_server.endpoint)
        assert envelope(d.request(frames_for())).code == Code.BACKEND_ERROR
    finally:
        shared_server.backend.set("none")
    assert_then_serves(d, shared_server)


@pytest.mark.timeout(20)
def test_backend_hang_gives_backend_timeout_and_server_keeps_serving(make_endpoint, server_factory,
                                                                      client_factory, dealer_factory):
    h = server_factory(make_endpoint(), backend_timeout_ms=300)
    h.backend.put(hexes(PROBE))
    h.backend.set("hang")
    c = client_factory(h.endpoint, 2000)
    start = time.monotonic()
    assert c.lookup(64, PROBE) == 0
    elapsed = time.monotonic() - start
    assert c.last_outcome == "backend_error" and c.last_code == Code.BACKEND_TIMEOUT
    assert 0.3 - 0.01 <= elapsed <= 0.3 + TOLERANCE_S, f"BACKEND_TIMEOUT after {elapsed:.3f} s"
    # the first call is still stuck in the backend; a fresh worker answers the next ones
    h.backend.mode = "none"
    assert c.lookup(64, PROBE) == 64
    d = dealer_factory(h.endpoint)
    assert_then_serves(d, h)
    sc = h.server.counters
    assert sc["timeout"] == 1 and sc["ok"] == 2 and sc["requests"] == 3


def test_slow_backend_within_its_deadline_is_fine(make_endpoint, server_factory, client_factory):
    h = server_factory(make_endpoint(), backend_timeout_ms=1000)
    h.backend.put(hexes(PROBE))
    h.backend.set("slow", slow_s=0.1)
    assert client_factory(h.endpoint, 1000).lookup(64, PROBE) == 64


# ---------------------------------------------------------------- admin reset


def test_reset_drains_pending_stores_then_clears(lookup_server, client_factory):
    b = lookup_server.backend
    b.put(hexes(PROBE[:2]))
    b.put_async(hexes(PROBE), delay_s=0.3)  # an in-flight store that lands in 0.3 s
    c = client_factory(lookup_server.endpoint, 2000)
    assert c.lookup(64, PROBE) == 32  # not landed yet
    start = time.monotonic()
    assert c.reset() is True
    assert time.monotonic() - start >= 0.2  # it waited for the pending store
    assert c.lookup(64, PROBE) == 0
    time.sleep(0.1)
    assert c.lookup(64, PROBE) == 0  # nothing accepted before the reset lands after it
    assert len(b) == 0
    assert c.counters["reset_ok"] == 1 and lookup_server.server.counters["resets"] == 1


def test_pending_store_lands_without_reset(lookup_server, client_factory):
    """Control for the test above: put_async really stores, after its delay."""
    lookup_server.backend.put_async(hexes(PROBE), delay_s=0.05)
    assert lookup_server.backend.drain(PROMPT_S)
    assert client_factory(lookup_server.endpoint, 1000).lookup(64, PROBE) == 64


def test_reset_fails_when_drain_times_out(make_endpoint, server_factory, client_factory):
    h = server_factory(make_endpoint(), reset_drain_timeout_ms=100)
    h.backend.put_async(hexes(PROBE), delay_s=0.4)
    c = client_factory(h.endpoint, 2000)
    assert c.reset() is False
    assert c.last_code == Code.RESET_FAILED and c.counters["backend_error"] == 1
    assert c.counters["reset_failed"] == 1
    h.backend.drain(PROMPT_S)
    assert c.lookup(64, PROBE) == 64  # nothing was cleared


def test_reset_via_raw_frame(lookup_server, dealer_factory):
    lookup_server.backend.put(hexes(PROBE))
    d = dealer_factory(lookup_server.endpoint)
    r = envelope(d.request([b"reset"]))
    assert r.ok and r.hit_tokens == 0
    assert envelope(d.request(frames_for()), 64).hit_tokens == 0
    assert_then_serves(d, lookup_server)


def test_reset_against_silent_peer_is_false_within_deadline(make_endpoint, peer_factory, client_factory):
    peer = peer_factory(make_endpoint(), silent=True)
    c = client_factory(peer.endpoint, SHORT_DEADLINE_MS)
    start = time.monotonic()
    assert c.reset() is False
    assert time.monotonic() - start <= SHORT_DEADLINE_MS / 1000 + TOLERANCE_S


# ---------------------------------------------------------------- hit semantics over sockets


@pytest.fixture
def hit_setup(request, shared_server, client_factory):
    hs = distinct_hashes(6, f"hits-{request.node.name}")  # fresh hashes: the shared backend keeps its keys
    return shared_server, client_factory(shared_server.endpoint, 2000), hs


def test_hits_zero_partial_full(hit_setup):
    h, c, hs = hit_setup
    assert c.lookup(64, hs[:4]) == 0
    h.backend.put(hexes(hs[:2]))
    assert c.lookup(64, hs[:4]) == 32
    h.backend.put(hexes(hs[2:4]))
    assert c.lookup(64, hs[:4]) == 64
    assert c.lookup(60, hs[:4]) == 60  # capped at token_len
    assert c.lookup(0, hs[:4]) == 0


def test_hits_multi_group(hit_setup):
    h, c, hs = hit_setup
    h.backend.put(hexes(hs[:4]), groups=[0])
    h.backend.put(hexes(hs[:2]), groups=[1])
    assert c.lookup(64, hs[:4], (0,)) == 64
    assert c.lookup(64, hs[:4], (1,)) == 32
    assert c.lookup(64, hs[:4], (0, 1)) == 32
    assert c.lookup(64, hs[:4], (1, 0)) == 32


def test_hits_hbm_and_beyond_token_len(hit_setup):
    h, c, hs = hit_setup
    h.backend.put(hexes(hs[2:6]))  # blocks 2.. in the pool, 0 and 1 only in HBM
    assert c.lookup(64, hs[:4]) == 0
    assert c.lookup(64, hs[:4], hbm_hit_tokens=32) == 64
    assert c.lookup(64, hs[:4], hbm_hit_tokens=20) == 16
    assert c.lookup(48, hs, hbm_hit_tokens=32) == 48  # 6 hashes, 3 blocks: the rest ignored
    assert c.lookup(64, hs[:4], hbm_hit_tokens=65) == 0 and c.last_code == Code.BAD_HBM_HIT_TOKENS


def test_server_counters_and_bound_endpoint(lookup_server):
    assert lookup_server.server.bound_endpoint.startswith(lookup_server.endpoint.split(":")[0])
    sc = lookup_server.server.counters
    assert isinstance(sc, dict) and sc["requests"] == 0


def test_tcp_port_zero_resolves_to_a_real_port(server_factory, client_factory):
    h = server_factory("tcp://127.0.0.1:0")
    ep = h.server.bound_endpoint
    assert ep.startswith("tcp://127.0.0.1:") and not ep.endswith(":0")
    hs = distinct_hashes(1, "port-zero")
    h.backend.put(hexes(hs))
    assert client_factory(ep, 1000).lookup(16, hs) == 16


def test_server_constructor_validation(ipc_endpoint):
    from rawpeers import ControlledBackend

    b = ControlledBackend()
    try:
        for bad in (0, -1, True, 1.5, "100"):
            with pytest.raises(ValueError):
                LookupServer(ipc_endpoint(), b, backend_timeout_ms=bad)
        with pytest.raises(ValueError):
            LookupServer("udp://x", b)
        with pytest.raises(ValueError):
            LookupServer(ipc_endpoint(), b, groups=0)
    finally:
        b.close()
