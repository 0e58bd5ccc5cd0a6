"""The hardened admin channel of vLLM's MooncakeStoreConnector (connector_patch/store) over real ZMQ
sockets: upstream's tagged requests validated with the documented codes, exactly one reply per
request, the lookup package's server and client reused (deadline, fail-open, socket rebuild), a
reset that reports success only when the backend cleared, upstream's raw replies refused."""

from __future__ import annotations

import threading
import time

import msgpack
import pytest
import zmq
from hypothesis import given, settings, strategies as st

from connector_patch.lookup.backend import Backend
from connector_patch.lookup.protocol import Code, Limits, ProtocolError
from connector_patch.lookup.server import LookupServer
from connector_patch.store import STORE, StoreLookupClient, StoreResult
from connector_patch.store.protocol import (
    MAX_HASH_LEN,
    decode_reply,
    decode_request,
    encode_ok,
    encode_request,
)

pytestmark = [pytest.mark.timeout(30)]

H = [bytes([i]) * 32 for i in range(1, 5)]
BLOCK = 16


class PrefixBackend(Backend):
    """Keys in a set; the hit is the longest stored prefix of blocks; ``mode`` breaks it."""

    groups = 1

    def __init__(self) -> None:
        self.keys: set[bytes] = set()
        self.mode = "ok"  # ok | raise | hang | bad_hit | clear_fails
        self.release = threading.Event()

    def hit_tokens(self, request):
        if self.mode == "raise":
            raise RuntimeError("store down")
        if self.mode == "hang":
            self.release.wait(10)
        if self.mode == "bad_hit":
            return StoreResult(request.token_len + 1)
        n = 0
        for h in request.hashes:
            if h not in self.keys:
                break
            n += 1
        hit = min(n * BLOCK, request.token_len)
        return StoreResult(hit, ((0, hit),) if hit else ())

    def drain(self, timeout_s):
        return True

    def clear(self):
        if self.mode == "clear_fails":
            raise RuntimeError("remove_all returned -1")
        self.keys.clear()


@pytest.fixture
def channel(tmp_path):
    backend = PrefixBackend()
    endpoint = f"ipc://{tmp_path}/store-lookup"
    server = LookupServer(endpoint, backend, dialect=STORE, backend_timeout_ms=300).start()
    client = StoreLookupClient(endpoint, timeout_ms=1000)
    yield backend, server, client, endpoint
    backend.release.set()
    client.close()
    server.close()


def raw(endpoint, frames, timeout_ms=2000):
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.REQ)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    try:
        s.send_multipart(frames)
        assert s.poll(timeout_ms), "no reply"
        return s.recv_multipart()
    finally:
        s.close()


V = encode_request(64, H)
BAD = {
    "no payload": ([b"lookup"], Code.BAD_FRAME_COUNT),
    "one short frame": ([b"lookup", b"\x00"], Code.BAD_FRAME_COUNT),
    "two short frames": ([b"lookup", b"\x00", b"\x00"], Code.BAD_FRAME_COUNT),
    "5 frames": (V + [b""], Code.BAD_FRAME_COUNT),
    "3-byte num_tokens": ([V[0], b"\x00\x00\x40", V[2], V[3]], Code.BAD_INT_FRAME),
    "1-byte hash_len": ([V[0], V[1], b"\x20", V[3]], Code.BAD_INT_FRAME),
    "hash_len 0 with hashes": ([V[0], V[1], b"\x00\x00", V[3]], Code.BAD_HASHES),
    "hash_len over the limit": ([V[0], V[1], (MAX_HASH_LEN + 1).to_bytes(2, "big"), V[3]], Code.BAD_HASHES),
    "blob not a multiple": ([V[0], V[1], V[2], V[3][:-1]], Code.BAD_HASHES),
    "num_tokens over the limit": ([V[0], (1 << 30).to_bytes(4, "big"), V[2], V[3]], Code.BAD_TOKEN_LEN),
    "reset with payload": ([b"reset", b"x"], Code.BAD_ADMIN),
    "unknown tag": ([b"dump"], Code.BAD_ADMIN),
    "empty tag": ([b""], Code.BAD_ADMIN),
}


def test_lookup_hit_tails_and_miss(channel):
    backend, _, client, _ = channel
    backend.keys = {H[0], H[1]}
    assert client.lookup(64, H) == StoreResult(32, ((0, 32),))
    assert client.lookup(64, H[2:]) == StoreResult(0)
    assert client.lookup(0, []) == StoreResult(0)
    assert client.counters["ok"] == 3


@pytest.mark.parametrize("name", sorted(BAD))
def test_malformed_request_gets_its_code_then_the_channel_serves(channel, name):
    backend, server, client, endpoint = channel
    frames, code = BAD[name]
    reply = decode_reply(raw(endpoint, frames), None)
    assert not reply.ok and reply.code == code
    backend.keys = {H[0]}
    assert client.lookup(64, H) == StoreResult(16, ((0, 16),))
    assert server.counters["protocol"] == 1 and server.counters["replies"] == server.counters["requests"]


def test_backend_raise_and_hang_are_errors_not_misses_and_bounded(channel):
    backend, server, client, _ = channel
    backend.keys = {H[0]}
    backend.mode = "raise"
    assert client.lookup(64, H) == StoreResult(0)
    assert client.last_code == Code.BACKEND_ERROR
    backend.mode = "hang"
    t0 = time.monotonic()
    assert client.lookup(64, H) == StoreResult(0)
    assert time.monotonic() - t0 < 1.0 and client.last_code == Code.BACKEND_TIMEOUT
    backend.mode = "bad_hit"
    assert client.lookup(64, H) == StoreResult(0) and client.last_code == Code.BACKEND_ERROR
    backend.mode = "ok"
    backend.release.set()
    assert client.lookup(64, H) == StoreResult(16, ((0, 16),))


def test_reset_reports_success_only_when_the_backend_cleared(channel):
    backend, _, client, _ = channel
    backend.keys = {H[0], H[1]}
    backend.mode = "clear_fails"
    assert client.reset() is False and client.last_code == Code.RESET_FAILED and backend.keys
    backend.mode = "ok"
    assert client.reset() is True and not backend.keys
    assert client.lookup(64, H) == StoreResult(0)
    assert client.counters["reset_ok"] == 1 and client.counters["reset_failed"] == 1


def _upstream_like_server(endpoint: str, replies: list[bytes], stop: threading.Event) -> threading.Thread:
    """A REP peer answering each request with the next raw reply: upstream's formats."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.REP)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(endpoint)

    def serve():
        i = 0
        while not stop.is_set():
            if sock.poll(50):
                sock.recv_multipart()
                sock.send(replies[min(i, len(replies) - 1)])
                i += 1
        sock.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


def test_upstream_raw_replies_are_legacy_and_fail_open(tmp_path):
    endpoint = f"ipc://{tmp_path}/legacy"
    stop = threading.Event()
    t = _upstream_like_server(endpoint, [(32).to_bytes(4, "big"), (32).to_bytes(4, "big") + bytes(8), b"\x01"], stop)
    client = StoreLookupClient(endpoint, timeout_ms=1000)
    try:
        assert client.lookup(64, H) == StoreResult(0) and client.last_code == Code.LEGACY_REPLY
        assert client.lookup(64, H) == StoreResult(0) and client.last_code == Code.LEGACY_REPLY
        assert client.reset() is False and client.last_code == Code.LEGACY_REPLY  # b"\x01" is not our ack
    finally:
        client.close()
        stop.set()
        t.join(2)


def test_silent_server_bounded_and_socket_rebuilt(tmp_path):
    endpoint = f"ipc://{tmp_path}/silent"
    ctx = zmq.Context.instance()
    mute = ctx.socket(zmq.REP)
    mute.setsockopt(zmq.LINGER, 0)
    mute.bind(endpoint)
    client = StoreLookupClient(endpoint, timeout_ms=200)
    try:
        for _ in range(3):
            t0 = time.monotonic()
            assert client.lookup(64, H) == StoreResult(0)
            assert time.monotonic() - t0 < 0.6 and client.last_code == Code.TIMEOUT
        assert client.reset() is False
        assert client.counters["socket_rebuilds"] == 4
    finally:
        client.close()
        mute.close()


def test_ascend_envelope_is_not_a_store_reply():
    """An AscendStore ok envelope (no tails) must not pass as a store answer (the client's byte
    fast path is off for the store dialect)."""
    asc = msgpack.packb({"version": 1, "status": "ok", "hit_tokens": 16})
    with pytest.raises(ProtocolError) as e:
        decode_reply([asc], 64)
    assert e.value.code == Code.BAD_FIELDS


def test_reply_rules():
    assert decode_reply([encode_ok(StoreResult(16, ((0, 16),)))], 64).result == StoreResult(16, ((0, 16),))
    for result, token_len, code in ((StoreResult(65), 64, Code.HIT_OUT_OF_RANGE),
                                    (StoreResult(16, ((0, 65),)), 64, Code.HIT_OUT_OF_RANGE),
                                    (StoreResult(16), None, Code.HIT_OUT_OF_RANGE)):
        with pytest.raises(ProtocolError) as e:
            decode_reply([encode_ok(result)], token_len)
        assert e.value.code == code
    ok = msgpack.packb({"version": 1, "status": "ok", "hit_tokens": 0, "tails": [["0", 1]]})
    with pytest.raises(ProtocolError) as e:
        decode_reply([ok], 64)
    assert e.value.code == Code.BAD_TYPES
    with pytest.raises(ProtocolError) as e:
        decode_reply([b"\x01\x02\x03"], 64)
    assert e.value.code == Code.BAD_REPLY


def test_encode_request_refuses_what_upstream_would_send_wrong():
    for args in ((-1, H), (1 << 32, H), (64, [b"a", b"bb"]), (64, ["ab"])):
        with pytest.raises(ProtocolError) as e:
            encode_request(*args)
        assert e.value.code == Code.BAD_CALL


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=80), max_size=6))
def test_decode_request_raises_only_protocol_errors(frames):
    try:
        req = decode_request(frames, Limits())
    except ProtocolError as exc:
        assert exc.code in {Code.BAD_FRAME_COUNT, Code.BAD_INT_FRAME, Code.BAD_TOKEN_LEN, Code.BAD_HASHES,
                            Code.TOO_MANY_HASHES, Code.BAD_ADMIN}
        return
    assert frames[0] == b"lookup" and len(frames) == 4
    assert b"".join(req.hashes) == frames[3] and all(len(h) == req.hash_len for h in req.hashes)
