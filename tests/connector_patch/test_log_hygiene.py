"""Log policy: every failure path logs a line with code, phase, elapsed ms and counts, and never a
block hash, a key list or raw frames; warnings are rate-limited per category with a suppressed
count. (Every other lookup test module also runs under the ``log_guard`` fixture.)"""

from __future__ import annotations

import logging
import re
import time

import msgpack
import pytest
import zmq

from connector_patch.lookup.legacy import LegacyLookupServer
from connector_patch.lookup import Code, LookupClient
from connector_patch.lookup.metrics import RateLimitedWarner
from connector_patch.lookup.protocol import encode_error, encode_ok, encode_u32
from rawpeers import (
    SHORT_DEADLINE_MS,
    Act,
    distinct_hashes,
    hash_leaks,
    hexes,
    reply_always,
)

pytestmark = [pytest.mark.timeout(30)]

LINE = re.compile(r"lookup rpc (\w+): code=(\w+) phase=(\w+) elapsed_ms=[0-9.]+ .*suppressed=\d+$")

# Distinctive hashes: any of them in a log record fails the test.
HS = distinct_hashes(8, "log-hygiene")
HX = hexes(HS)

BAD_REPLIES = [
    [b""], [encode_ok(16), b"x"], [b"\xc1" * 5], [msgpack.packb([1])],
    [msgpack.packb({"version": 1, "status": "ok"})],
    [msgpack.packb({"version": 1, "status": "ok", "hit_tokens": 16, "extra": HX[0]})],
    [msgpack.packb({"version": 1, "status": "ok", "hit_tokens": True})],
    [msgpack.packb({"version": 2, "status": "ok", "hit_tokens": 16})],
    [encode_ok(10_000)], [(16).to_bytes(4, "big")],
    [encode_error(Code.BACKEND_ERROR, "backend raised")],
    [encode_error(Code.BAD_HASHES, f"echoing {HX[1]}")],  # a hostile server's message is not logged
]

BAD_REQUESTS = [
    [b""], [HX[0].encode()], [encode_u32(64), msgpack.packb([0])],
    [b"\x00\x00\x40", msgpack.packb([0]), encode_u32(0), msgpack.packb(HX)],
    [encode_u32(64), b"\xc1" + HX[0].encode(), encode_u32(0), msgpack.packb(HX)],
    [encode_u32(64), msgpack.packb([9]), encode_u32(0), msgpack.packb(HX)],
    [encode_u32(64), msgpack.packb([0]), encode_u32(0), msgpack.packb(HX[:2] + [HX[2][:-1]])],
    [encode_u32(64), msgpack.packb([0]), encode_u32(0), msgpack.packb([HX[0] + "zz"])],
    [encode_u32(64), msgpack.packb([0]), encode_u32(0), msgpack.packb(HX)[:-5]],
    [encode_u32(64), msgpack.packb([0]), encode_u32(99), msgpack.packb(HX)],
]


def lines(caplog, logger_name):
    return [r for r in caplog.records if r.name == logger_name and r.levelno >= logging.WARNING]


def test_every_failure_logs_counts_and_codes_never_hashes(caplog, make_endpoint, server_factory,
                                                          peer_factory, dealer_factory):
    caplog.set_level(logging.DEBUG, logger="connector_patch")
    # client side: timeout, every malformed reply, error envelopes, bad calls, reset failure
    with LookupClient(make_endpoint(), SHORT_DEADLINE_MS, warn_interval_s=0) as c:
        assert c.lookup(128, HS) == 0
        assert c.reset() is False
    for frames in BAD_REPLIES:
        peer = peer_factory(make_endpoint(), reply_always(frames))
        with LookupClient(peer.endpoint, 1000, warn_interval_s=0) as c:
            assert c.lookup(128, HS) == 0
    peer = peer_factory(make_endpoint(), lambda i, f: Act(reply=f))  # echoes the request back
    with LookupClient(peer.endpoint, 1000, warn_interval_s=0) as c:
        assert c.lookup(128, HS) == 0 and c.last_code == Code.EXTRA_FRAMES
        assert c.lookup(-1, HS) == 0 and c.lookup(128, HX) == 0  # bad calls
    # server side: every kind of bad request, backend raise and timeout, failed reset
    h = server_factory(make_endpoint(), backend_timeout_ms=100, reset_drain_timeout_ms=50,
                       warn_interval_s=0)
    d = dealer_factory(h.endpoint)
    for frames in BAD_REQUESTS:
        assert d.request(frames) is not None
    with LookupClient(h.endpoint, 1000, warn_interval_s=0) as c:
        h.backend.set("raise")
        assert c.lookup(128, HS) == 0 and c.last_code == Code.BACKEND_ERROR
        h.backend.set("slow", slow_s=0.3)
        assert c.lookup(128, HS) == 0 and c.last_code == Code.BACKEND_TIMEOUT
        h.backend.set("none")
        h.backend.put_async(HX, delay_s=0.3)
        assert c.reset() is False and c.last_code == Code.RESET_FAILED
    # the legacy model's dying thread logs too
    legacy = LegacyLookupServer(make_endpoint(), h.backend).start()
    try:
        ctx = zmq.Context()
        s = ctx.socket(zmq.REQ)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(legacy.endpoint)
        s.send_multipart([HX[0].encode()])
        legacy.thread.join(2.0)
        s.close()
        ctx.term()
    finally:
        legacy.close()

    client_lines = lines(caplog, "connector_patch.lookup.client")
    server_lines = lines(caplog, "connector_patch.lookup.server")
    legacy_lines = lines(caplog, "connector_patch.lookup.legacy")
    # non-vacuous: every failure above produced its line
    assert len(client_lines) == 2 + len(BAD_REPLIES) + 3 + 3
    assert len(server_lines) == len(BAD_REQUESTS) + 3
    assert len(legacy_lines) == 1
    for r in client_lines + server_lines:
        assert LINE.search(r.getMessage()), r.getMessage()
    codes = {LINE.search(r.getMessage()).group(2) for r in client_lines + server_lines}
    assert {Code.TIMEOUT, Code.LEGACY_REPLY, Code.BACKEND_ERROR, Code.BACKEND_TIMEOUT, Code.BAD_HASHES,
            Code.BAD_FRAME_COUNT, Code.BAD_MSGPACK, Code.RESET_FAILED, Code.BAD_CALL} <= codes
    assert hash_leaks(caplog.records) == []


def test_the_hash_check_can_fail():
    """The check above is not vacuous: a record with a hash, a hex run or raw bytes is caught."""
    def rec(msg, *args):
        return logging.LogRecord("connector_patch.x", logging.WARNING, __file__, 1, msg, args, None)

    assert hash_leaks([rec("hash %s", HX[3])])
    assert hash_leaks([rec("hash %s", HX[3].upper())])
    assert hash_leaks([rec("frames %r", [b"\x91\x00"])])
    assert hash_leaks([rec("keys %s", "ab" * 16)])
    assert not hash_leaks([rec("lookup rpc timeout: code=TIMEOUT phase=recv elapsed_ms=1.0 hashes=8")])


def test_rate_limit_one_line_per_interval_with_suppressed_count(caplog, make_endpoint, peer_factory):
    caplog.set_level(logging.DEBUG, logger="connector_patch")
    peer = peer_factory(make_endpoint(), reply_always([b"\x00\x00\x00\x10"]))
    interval = 0.5
    with LookupClient(peer.endpoint, 1000, warn_interval_s=interval) as c:
        start = time.monotonic()
        for _ in range(10):
            assert c.lookup(128, HS) == 0
        assert time.monotonic() - start < interval  # all ten inside one interval
        silent = LookupClient(make_endpoint(), 50, warn_interval_s=interval)
        assert silent.lookup(128, HS) == 0  # another client, another category: its own line
        silent.close()
        first = [r.getMessage() for r in lines(caplog, "connector_patch.lookup.client")]
        assert len(first) == 2
        assert "lookup rpc protocol: code=LEGACY_REPLY" in first[0] and first[0].endswith("suppressed=0")
        assert "lookup rpc timeout: code=TIMEOUT" in first[1]
        time.sleep(interval - (time.monotonic() - start) + 0.05)
        assert c.lookup(128, HS) == 0
    after = [r.getMessage() for r in lines(caplog, "connector_patch.lookup.client")]
    assert len(after) == 3
    assert "lookup rpc protocol: code=LEGACY_REPLY" in after[2] and after[2].endswith("suppressed=9")
    assert c.counters["protocol"] == 11  # counters count everything the log held back
    assert hash_leaks(caplog.records) == []


def test_rate_limiter_per_category():
    """The same rules with a controlled clock: per category, per interval, suppressed count."""
    records = []

    class H(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = logging.getLogger("connector_patch.test.ratelimit")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    handler = H()
    logger.addHandler(handler)
    now = [100.0]
    try:
        w = RateLimitedWarner(logger, 10.0, clock=lambda: now[0])
        assert w.warn("timeout", "TIMEOUT", "recv", 1.0, hashes=3) is True
        assert [w.warn("timeout", "TIMEOUT", "recv", 1.0) for _ in range(4)] == [False] * 4
        assert w.warn("protocol", "BAD_REPLY", "validate", 1.0) is True  # other category
        now[0] += 9.9
        assert w.warn("timeout", "TIMEOUT", "recv", 1.0) is False
        now[0] += 0.2
        assert w.warn("timeout", "TIMEOUT", "recv", 2.0) is True
    finally:
        logger.removeHandler(handler)
    assert len(records) == 3
    assert records[0].endswith("hashes=3 suppressed=0")
    assert records[2].startswith("lookup rpc timeout: code=TIMEOUT phase=recv elapsed_ms=2.0")
    assert records[2].endswith("suppressed=5")
