"""Lifecycle of LookupClient and LookupServer: idempotent close from any thread, a bounded server
close with a request in flight and a stuck backend, threads and fds back to baseline, the ipc
file removed."""

from __future__ import annotations

import os
import threading
import time

import pytest
import zmq

from connector_patch.lookup import Code, LookupClient, LookupServer
from rawpeers import (
    PROMPT_S,
    SHORT_DEADLINE_MS,
    TOLERANCE_S,
    ControlledBackend,
    distinct_hashes,
    hexes,
)

pytestmark = [pytest.mark.usefixtures("log_guard"), pytest.mark.timeout(30)]

JOIN_LIMIT_S = 2.0  # the contract: server close() joins its thread within 2 s


def ipc_path(endpoint: str) -> str | None:
    return endpoint[len("ipc://"):] if endpoint.startswith("ipc://") else None


def test_client_close_twice_and_from_many_threads(make_endpoint):
    c = LookupClient(make_endpoint(), SHORT_DEADLINE_MS)
    c.close()
    c.close()
    c2 = LookupClient(make_endpoint(), SHORT_DEADLINE_MS)
    errors: list = []

    def closer():
        try:
            c2.close()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=closer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(PROMPT_S)
    assert not errors and not any(t.is_alive() for t in threads)


def test_server_close_twice_before_and_after_start(make_endpoint):
    b = ControlledBackend()
    try:
        never_started = LookupServer(make_endpoint(), b)
        never_started.close()
        never_started.close()
        with pytest.raises(RuntimeError):
            never_started.start()
        s = LookupServer(make_endpoint(), b).start()
        with pytest.raises(RuntimeError):
            s.start()
        s.close()
        s.close()
    finally:
        b.close()


def test_close_from_another_thread_while_lookup_in_flight(make_endpoint, peer_factory):
    peer = peer_factory(make_endpoint(), silent=True)
    c = LookupClient(peer.endpoint, 600)
    result: list = []
    t = threading.Thread(target=lambda: result.append(c.lookup(64, distinct_hashes(4, "in-flight"))))
    start = time.monotonic()
    t.start()
    time.sleep(0.1)  # the lookup is waiting for its reply
    c.close()  # raises nothing; waits at most for the in-flight call's deadline
    c.close()
    t.join(PROMPT_S)
    elapsed = time.monotonic() - start
    assert result == [0]
    assert elapsed <= 0.6 + TOLERANCE_S
    assert c.lookup(64, []) == 0 and c.last_outcome == "transport"  # closed: fails open at once


@pytest.mark.timeout(15)
def test_server_close_with_request_in_flight_and_stuck_backend(make_endpoint, peer_factory,
                                                               resources, assert_resources_back):
    """close() returns within 2 s while the serving side is stuck in a backend call, and the
    loop is over: the socket is closed (the endpoint can be bound again at once), the ipc file is
    gone. A thread stuck inside a backend call cannot be interrupted in Python; once the call
    returns, every thread and fd is back to where it started."""
    base = resources()
    b = ControlledBackend()
    ep = make_endpoint()
    s = LookupServer(ep, b, backend_timeout_ms=10_000).start()
    c = LookupClient(ep, 1000)
    try:
        b.set("hang")  # a backend call that would take far longer than the join limit
        result: list = []
        t = threading.Thread(target=lambda: result.append(c.lookup(64, distinct_hashes(4, "stuck"))))
        t.start()
        deadline = time.monotonic() + PROMPT_S
        while b.calls == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert b.calls == 1  # the request is inside the backend now
        start = time.monotonic()
        s.close()
        took = time.monotonic() - start
        assert took <= JOIN_LIMIT_S, f"close took {took:.3f} s"
        s.close()
        if ipc_path(ep):
            assert not os.path.exists(ipc_path(ep))
        peer = peer_factory(ep, silent=True)  # binds: the server's socket is really closed
        assert peer.wait_bound(0.5)
        # the client was not answered: it fails open at its own deadline
        t.join(PROMPT_S)
        assert result == [0] and c.last_code == Code.TIMEOUT
        peer.close()
    finally:
        c.close()
        b.close()  # releases the stuck call: whatever thread ran it can now exit
    assert_resources_back(base)


def test_ipc_file_removed_after_server_close(ipc_endpoint):
    ep = ipc_endpoint()
    b = ControlledBackend()
    try:
        s = LookupServer(ep, b).start()
        assert os.path.exists(ipc_path(ep))
        s.close()
        assert not os.path.exists(ipc_path(ep))
    finally:
        b.close()


def test_bind_failure_raises_and_leaves_nothing_running(tcp_endpoint, resources, assert_resources_back):
    ep = tcp_endpoint()
    b = ControlledBackend()
    first = LookupServer(ep, b).start()
    try:
        base = resources()
        second = LookupServer(ep, b)
        with pytest.raises(zmq.ZMQError):
            second.start()
        second.close()
        assert_resources_back(base)
    finally:
        first.close()
        b.close()


def test_resources_back_to_baseline_after_cycles(make_endpoint, resources, assert_resources_back):
    """Create, use (hits, misses, malformed requests, timeouts, a reset) and close, several times:
    threads and open fds end where they started (zmq I/O threads, backend workers, sockets)."""
    base = resources()
    base_threads = set(threading.enumerate())
    for i in range(3):
        b = ControlledBackend(groups=2)
        s = LookupServer(make_endpoint(), b, backend_timeout_ms=100).start()
        hs = distinct_hashes(4, f"cycle{i}")
        b.put(hexes(hs))
        c = LookupClient(s.endpoint, 1000)
        assert c.lookup(64, hs) == 64
        assert c.lookup(64, distinct_hashes(4, "cycle-miss")) == 0
        assert c.lookup(64, hs, (7,)) == 0 and c.last_code == Code.BAD_GROUP_IDS
        b.set("slow", slow_s=0.2)  # over backend_timeout_ms: abandons a worker thread
        assert c.lookup(64, hs) == 0 and c.last_code == Code.BACKEND_TIMEOUT
        b.set("none")
        assert c.reset() is True
        silent = LookupClient(make_endpoint(), 50)  # nothing bound: a timeout and a rebuild
        assert silent.lookup(64, hs) == 0
        silent.close()
        c.close()
        s.close()
        b.close()
    assert_resources_back(base)
    assert not [t for t in set(threading.enumerate()) - base_threads
                if t.name.startswith(("lookup-", "memory-backend"))]
