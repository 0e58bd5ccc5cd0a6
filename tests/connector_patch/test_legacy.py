"""The legacy model (today's upstream, the "before") really has today's failures: a malformed
request kills its server thread and every later lookup blocks; a backend error looks like a miss.
And it answers exactly like the hardened path when nothing goes wrong."""

from __future__ import annotations

import threading
import time

import msgpack
import pytest
import zmq

from connector_patch.lookup import legacy
from connector_patch.lookup.legacy import LegacyLookupClient, LegacyLookupServer
from connector_patch.lookup import Code
from rawpeers import PROMPT_S, ControlledBackend, distinct_hashes, hexes, req_exchange

pytestmark = [pytest.mark.usefixtures("log_guard"), pytest.mark.timeout(30)]

BLOCKED_S = 0.5  # "has not returned after 0.5 s": a lookup that would block forever


@pytest.fixture
def legacy_server(make_endpoint):
    backend = ControlledBackend(groups=2)
    server = LegacyLookupServer(make_endpoint(), backend).start()
    try:
        yield server
    finally:
        server.close()
        backend.close()


def test_labelled_with_the_upstream_commit():
    assert legacy.UPSTREAM_COMMIT == "182b75ea"
    assert "182b75ea" in legacy.__doc__


def test_normal_path_matches_the_hardened_one(legacy_server, shared_server, client_factory):
    hs = distinct_hashes(4, "legacy-normal")
    for backend in (legacy_server.backend, shared_server.backend):
        backend.put(hexes(hs[:2]), groups=[0, 1])
        backend.put(hexes(hs[2:3]), groups=[0])
    c = LegacyLookupClient(legacy_server.endpoint)
    h = client_factory(shared_server.endpoint, 2000)
    try:
        for args in [(64, hs), (64, hs, (0,)), (64, hs, (0, 1)), (64, hs, (1,), 40), (20, hs), (0, hs),
                     (64, distinct_hashes(4, "legacy-miss"))]:
            assert c.lookup(*args) == h.lookup(*args), args
    finally:
        c.close()


def test_reply_is_a_raw_u32(legacy_server):
    hs = distinct_hashes(2, "legacy-raw")
    legacy_server.backend.put(hexes(hs))
    frames = [(32).to_bytes(4, "big"), msgpack.packb([0]), (0).to_bytes(4, "big"), msgpack.packb(hexes(hs))]
    assert req_exchange(legacy_server.endpoint, frames) == [(32).to_bytes(4, "big")]


def test_hardened_client_detects_a_legacy_server(legacy_server, client_factory):
    hs = distinct_hashes(2, "legacy-detect")
    legacy_server.backend.put(hexes(hs))
    c = client_factory(legacy_server.endpoint, 1000)
    assert c.lookup(32, hs) == 0  # fail open: no guessing at the raw number
    assert c.last_outcome == "protocol" and c.last_code == Code.LEGACY_REPLY
    assert legacy_server.alive  # and the legacy server was not hurt by a valid request


def test_backend_error_looks_like_a_miss(legacy_server):
    hs = distinct_hashes(2, "legacy-backend")
    legacy_server.backend.put(hexes(hs))
    c = LegacyLookupClient(legacy_server.endpoint)
    try:
        assert c.lookup(32, hs) == 32
        legacy_server.backend.set("raise")
        assert c.lookup(32, hs) == 0  # indistinguishable from a real miss
    finally:
        c.close()


def blocked_lookup(endpoint: str):
    """Run a legacy lookup on a daemon thread with its own context; returns (thread, results, ctx)."""
    ctx = zmq.Context()
    client = LegacyLookupClient(endpoint, context=ctx)
    results: list = []

    def run():
        try:
            results.append(client.lookup(16, distinct_hashes(1, "legacy-blocked")))
        except zmq.ContextTerminated:
            results.append("interrupted")
        finally:
            client.close()  # this thread owns the socket: close it here so ctx.term() completes

    t = threading.Thread(target=run, name="legacy-blocked-lookup", daemon=True)
    t.start()
    return t, results, ctx


MALFORMED = {
    "3 frames": [b"\x00\x00\x00\x10", b"\x91\x00", b"\x00\x00\x00\x00"],
    "1 frame": [b"lookup"],
    "bad msgpack": [b"\x00\x00\x00\x10", b"\xc1", b"\x00\x00\x00\x00", b"\x90"],
}


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_malformed_request_kills_the_server_and_later_lookups_block(kind, legacy_server, resources,
                                                                   assert_resources_back):
    hs = distinct_hashes(1, "legacy-kill")
    legacy_server.backend.put(hexes(hs))
    before = LegacyLookupClient(legacy_server.endpoint)
    try:
        assert before.lookup(16, hs) == 16  # healthy before
    finally:
        before.close()
    base = resources()
    assert req_exchange(legacy_server.endpoint, MALFORMED[kind], timeout_s=0.3) is None  # no reply
    legacy_server.thread.join(PROMPT_S)
    assert not legacy_server.alive  # the serving thread is dead: today's failure
    t, results, ctx = blocked_lookup(legacy_server.endpoint)
    t.join(BLOCKED_S)
    assert t.is_alive() and results == [], "the legacy lookup returned: the model lost today's hang"
    # clean up: close the legacy server (its context), then interrupt the blocked client
    legacy_server.close()
    terminator = threading.Thread(target=ctx.term, daemon=True)
    terminator.start()
    t.join(PROMPT_S)
    terminator.join(PROMPT_S)
    assert results == ["interrupted"] and not terminator.is_alive()
    assert_resources_back(base)


def test_close_is_safe_while_serving(make_endpoint, resources, assert_resources_back):
    """The model's close() (not upstream: the harness needs it) stops a thread blocked in recv
    without closing its socket from another thread (that crashes libzmq)."""
    base = resources()
    for i in range(20):
        b = ControlledBackend()
        s = LegacyLookupServer(make_endpoint(), b).start()
        if i % 2:
            hs = distinct_hashes(1, "legacy-close")
            b.put(hexes(hs))
            c = LegacyLookupClient(s.endpoint)
            assert c.lookup(16, hs) == 16
            c.close()
        start = time.monotonic()
        s.close()
        s.close()
        assert time.monotonic() - start < PROMPT_S and not s.alive
        b.close()
    assert_resources_back(base)
