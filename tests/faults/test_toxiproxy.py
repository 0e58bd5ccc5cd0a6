"""faults/toxiproxy.py and faults/toxics.py against the real toxiproxy-server (skipped only when absent).

Traffic: ZMQ REQ/REP on 127.0.0.1 through real proxies. The only stand-in is ``_Ctx`` below: the
two attributes and the ``event`` method the runner's topology gives a toxic fault (ctx.toxiproxy,
ctx.proxy_name), so the fault classes can be driven without a whole scenario run.
"""

from __future__ import annotations

import math
import os
import socket
import statistics
import threading
import time

import pytest
import zmq
from pydantic import ValidationError

from faults import toxics
from faults.base import REGISTRY
from faults.toxiproxy import (
    PINNED_VERSION, TOXIC_TYPES, Toxiproxy, ToxiproxyError, ToxiproxyServer, ToxicSpecError, binary_version,
    find_binary, measure_floor, validate_toxic,
)

BINARY = find_binary()
needs_server = pytest.mark.skipif(BINARY is None, reason="toxiproxy-server not found (PATH, ~/go/bin/server, "
                                  "$PDCHAOS_TOXIPROXY_SERVER): run .ci/install-toxiproxy.sh")


@pytest.fixture(scope="module")
def server():
    if BINARY is None:
        pytest.skip("toxiproxy-server not found: run .ci/install-toxiproxy.sh")
    srv = ToxiproxyServer()
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def api(server):
    server.api.reset()
    yield server.api
    for name in list(server.api.proxies()):
        server.api.delete_proxy(name, missing_ok=True)


@pytest.fixture(scope="module")
def echo():
    """A ZMQ REP echo on 127.0.0.1 in a thread; yields its port."""
    ctx = zmq.Context()
    rep = ctx.socket(zmq.REP)
    rep.setsockopt(zmq.LINGER, 0)
    port = rep.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            if rep.poll(20, zmq.POLLIN):
                rep.send(rep.recv())

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield port
    finally:
        stop.set()
        t.join(2)
        rep.close(linger=0)
        ctx.term()


@pytest.fixture
def zctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def round_trip(ctx: zmq.Context, endpoint: str, timeout_ms: int = 2000, sock=None) -> float | None:
    """Milliseconds for one REQ/REP echo, None on timeout (a fresh socket unless one is given)."""
    own = sock is None
    if own:
        sock = ctx.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
    try:
        t0 = time.perf_counter()
        sock.send(b"ping")
        if not sock.poll(timeout_ms, zmq.POLLIN):
            return None
        assert sock.recv() == b"ping"
        return (time.perf_counter() - t0) * 1000.0
    finally:
        if own:
            sock.close(linger=0)


class _Ctx:
    """What the runner's topology gives a toxic fault (see faults/toxics.py): stand-in for the runner."""

    def __init__(self, api: Toxiproxy, proxy_name: str):
        self.toxiproxy = api
        self.proxy_name = proxy_name
        self.events: list[tuple[str, dict]] = []

    def event(self, what: str, **fields) -> None:
        self.events.append((what, fields))


# --------------------------------------------------------------------------- lifecycle


@needs_server
@pytest.mark.timeout(20)
def test_lifecycle_free_port_version_and_stop():
    srv = ToxiproxyServer()
    with srv:
        assert srv.running
        assert srv.port and srv.port > 0
        assert srv.api.base_url == f"http://127.0.0.1:{srv.port}"
        assert srv.api.version() == srv.version == binary_version(srv.binary)
        assert srv.pinned == (srv.version == PINNED_VERSION)
        pid = srv.proc.pid
        api = srv.api
    assert not srv.running and srv.proc is None
    assert not api.ping(timeout=0.3)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    srv.stop()  # idempotent


@needs_server
@pytest.mark.timeout(20)
def test_explicit_port_and_restart():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    wanted = probe.getsockname()[1]
    probe.close()
    with ToxiproxyServer(port=wanted) as srv:
        assert srv.port == wanted and srv.api.ping()
    srv = ToxiproxyServer()
    srv.start()
    try:
        srv.stop()
        srv.start()  # a stopped server starts again, on a fresh port of its own choosing
        assert srv.running and srv.api.ping()
    finally:
        srv.stop()


@needs_server
@pytest.mark.timeout(20)
def test_two_servers_do_not_share_an_address():
    # toxiproxy-python keeps one global host/port; the wrapper must not.
    with ToxiproxyServer() as one, ToxiproxyServer() as two:
        assert one.port != two.port
        one.api.create_proxy("only-on-one", upstream="127.0.0.1:9")
        assert "only-on-one" in one.api.proxies()
        assert "only-on-one" not in two.api.proxies()


@needs_server
@pytest.mark.timeout(20)
def test_start_failure_is_reported(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        srv = ToxiproxyServer(port=taken.getsockname()[1], start_timeout=5.0)
        t0 = time.monotonic()
        with pytest.raises(ToxiproxyError, match="address already in use"):
            srv.start()
        assert time.monotonic() - t0 < 4.0  # seen in its log, not by waiting out the start timeout
        assert srv.proc is None
    finally:
        taken.close()


def test_missing_binary_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PDCHAOS_TOXIPROXY_SERVER", "/nonexistent/toxiproxy-server")
    assert find_binary() is None
    srv = ToxiproxyServer()
    assert not srv.available
    with pytest.raises(ToxiproxyError, match="not found"):
        srv.start()


# --------------------------------------------------------------------------- API


@needs_server
@pytest.mark.timeout(20)
def test_proxy_creation_and_traffic(api, echo, zctx):
    proxy = api.create_proxy("link", "127.0.0.1:0", upstream=f"127.0.0.1:{echo}")
    host, port = proxy["listen"].rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0  # the real port, read back
    assert proxy["enabled"] is True and proxy["upstream"] == f"127.0.0.1:{echo}"
    assert api.get_proxy("link")["listen"] == proxy["listen"]
    assert round_trip(zctx, f"tcp://{proxy['listen']}") is not None
    assert api.delete_proxy("link") is True
    assert api.delete_proxy("link", missing_ok=True) is False
    with pytest.raises(ToxiproxyError) as err:
        api.delete_proxy("link")
    assert err.value.status == 404


@needs_server
@pytest.mark.timeout(20)
def test_toxic_add_read_back_remove(api):
    api.create_proxy("p", upstream="127.0.0.1:9")
    toxic = api.add_toxic("p", "latency", "upstream", 0.5, {"latency": 123, "jitter": 7}, name="lat1")
    assert toxic == {"name": "lat1", "type": "latency", "stream": "upstream", "toxicity": 0.5,
                     "attributes": {"latency": 123, "jitter": 7}}
    assert api.toxics("p") == [toxic]
    unnamed = api.add_toxic("p", "limit_data", attributes={"bytes": 10})
    assert unnamed["name"].startswith("limit_data_downstream") and unnamed["attributes"] == {"bytes": 10}
    assert api.remove_toxic("p", "lat1") is True
    assert api.remove_toxic("p", "lat1") is False
    with pytest.raises(ToxiproxyError) as err:
        api.remove_toxic("p", "lat1", missing_ok=False)
    assert err.value.status == 404
    assert [t["name"] for t in api.toxics("p")] == [unnamed["name"]]


@needs_server
@pytest.mark.timeout(20)
def test_server_errors_raise_with_status(api):
    api.create_proxy("p", upstream="127.0.0.1:9")
    cases = [
        (lambda: api.add_toxic("p", "no_such_toxic", validate=False), 400, "invalid toxic type"),
        (lambda: api.add_toxic("p", "latency", "sideways", validate=False), 400, "stream"),
        (lambda: api.add_toxic("nope", "latency", attributes={"latency": 1}), 404, "proxy not found"),
        (lambda: api.create_proxy("p", upstream="127.0.0.1:9"), 409, "already exists"),
    ]
    api.add_toxic("p", "latency", attributes={"latency": 1}, name="dup")
    cases.append((lambda: api.add_toxic("p", "latency", attributes={"latency": 1}, name="dup"), 409, "exists"))
    for call, status, text in cases:
        with pytest.raises(ToxiproxyError) as err:
            call()
        assert err.value.status == status, err.value
        assert text in str(err.value)


@needs_server
@pytest.mark.timeout(20)
def test_5xx_is_not_swallowed(api):
    # toxiproxy-python's validate_response lets 500 through as if it succeeded. The real server
    # answers 500 when a proxy's listen address is taken.
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        with pytest.raises(ToxiproxyError) as err:
            api.create_proxy("p", f"127.0.0.1:{taken.getsockname()[1]}", upstream="127.0.0.1:9")
        assert err.value.status == 500
        assert "address already in use" in err.value.message
    finally:
        taken.close()


@pytest.mark.timeout(10)
def test_every_call_has_a_timeout():
    # A listener that never accepts: the TCP connect succeeds (backlog), no HTTP answer ever comes.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        api = Toxiproxy(silent.getsockname()[1], timeout=0.3)
        t0 = time.monotonic()
        with pytest.raises(ToxiproxyError) as err:
            api.proxies()
        assert time.monotonic() - t0 < 3.0
        assert err.value.status is None and "no answer within 0.3s" in str(err.value)
    finally:
        silent.close()


def test_no_unreachable_error_is_swallowed():
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    free = port.getsockname()[1]
    port.close()
    with pytest.raises(ToxiproxyError, match="cannot reach"):
        Toxiproxy(free, timeout=1.0).reset()


def test_addresses_stay_on_loopback():
    with pytest.raises(ValueError, match="loopback"):
        Toxiproxy(8474, host="10.1.2.3")
    api = Toxiproxy(1)  # no call is made: the address checks come first
    with pytest.raises(ValueError, match="listen.*loopback"):
        api.create_proxy("p", "0.0.0.0:0", upstream="127.0.0.1:9")
    with pytest.raises(ValueError, match="upstream.*loopback"):
        api.create_proxy("p", upstream="192.168.1.1:80")


def test_validation_table():
    assert set(TOXIC_TYPES) == {"latency", "bandwidth", "slow_close", "timeout", "reset_peer", "slicer", "limit_data"}
    assert validate_toxic("slicer", attributes={"average_size": 8, "delay": 10}).attributes["delay"] == 10
    with pytest.raises(ToxicSpecError, match="unknown toxic type 'lag'"):
        validate_toxic("lag")
    with pytest.raises(ToxicSpecError, match="toxic 'latency': unknown attribute 'rate'; known: latency, jitter"):
        validate_toxic("latency", attributes={"rate": 1})
    with pytest.raises(ToxicSpecError, match="must be >= 0"):
        validate_toxic("latency", attributes={"latency": -5})
    with pytest.raises(ToxicSpecError, match="toxicity"):
        validate_toxic("latency", toxicity=1.5)
    with pytest.raises(ToxicSpecError, match="stream"):
        validate_toxic("latency", stream="sideways")


# --------------------------------------------------------------------------- effects on traffic


@needs_server
@pytest.mark.timeout(30)
def test_latency_toxic_delays_a_zmq_round_trip(api, echo, zctx):
    proxy = api.create_proxy("lat", upstream=f"127.0.0.1:{echo}")
    sock = zctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://{proxy['listen']}")
    base = [round_trip(zctx, "", sock=sock) for _ in range(10)]
    assert None not in base
    toxic = api.add_toxic("lat", "latency", "downstream", 1.0, {"latency": 100, "jitter": 0})
    delayed = [round_trip(zctx, "", sock=sock) for _ in range(5)]
    assert None not in delayed
    # Lower bound only: every reply crossed the 100 ms toxic (an upper bound would flake on a busy box).
    assert min(delayed) >= 99.0, delayed
    assert statistics.median(delayed) - statistics.median(base) >= 95.0
    api.remove_toxic("lat", toxic["name"])
    after = [round_trip(zctx, "", sock=sock) for _ in range(5)]
    assert None not in after and statistics.median(after) < 100.0
    sock.close(linger=0)


@needs_server
@pytest.mark.timeout(30)
def test_down_breaks_then_restores(api, echo, zctx):
    proxy = api.create_proxy("lookup", upstream=f"127.0.0.1:{echo}")
    endpoint = f"tcp://{proxy['listen']}"
    assert round_trip(zctx, endpoint) is not None
    ctx = _Ctx(api, "lookup")
    fault = REGISTRY["down"](REGISTRY["down"].Params(), ctx)
    fault.start()
    assert api.get_proxy("lookup")["enabled"] is False
    assert round_trip(zctx, endpoint, timeout_ms=300) is None
    fault.stop()
    fault.stop()  # idempotent
    assert api.get_proxy("lookup")["enabled"] is True
    assert api.get_proxy("lookup")["listen"] == proxy["listen"]  # same port after re-enable
    assert round_trip(zctx, endpoint) is not None
    assert [e[0] for e in ctx.events] == ["proxy disabled", "proxy enabled"]


@needs_server
@pytest.mark.timeout(20)
def test_set_enabled_and_reset(api):
    api.create_proxy("p", upstream="127.0.0.1:9")
    api.add_toxic("p", "timeout", attributes={"timeout": 0})
    assert api.set_enabled("p", False)["enabled"] is False
    api.reset()
    assert api.get_proxy("p")["enabled"] is True
    assert api.toxics("p") == []


# --------------------------------------------------------------------------- the fault classes

SAMPLES = {
    "latency": ({"latency": "300ms", "jitter": "20ms"}, {"latency": 300, "jitter": 20}),
    "bandwidth": ({"rate": 64}, {"rate": 64}),
    "slow_close": ({"delay": "1.5s"}, {"delay": 1500}),
    "timeout": ({"timeout": "0ms"}, {"timeout": 0}),
    "reset_peer": ({"timeout": "250ms"}, {"timeout": 250}),
    "slicer": ({"average_size": 8, "size_variation": 3, "delay": "500us"},
               {"average_size": 8, "size_variation": 3, "delay": 500}),
    "limit_data": ({"bytes": 1024}, {"bytes": 1024}),
}


@needs_server
@pytest.mark.timeout(20)
def test_every_toxic_fault_adds_and_removes_its_toxic(api):
    assert set(SAMPLES) == set(toxics.TOXIC_FAULTS)
    api.create_proxy("lookup", upstream="127.0.0.1:9")
    ctx = _Ctx(api, "lookup")
    for name, (yaml_params, wire) in SAMPLES.items():
        cls = REGISTRY[name]
        assert cls.requires == ("toxiproxy",)
        fault = cls(cls.Params(stream="upstream", toxicity=0.75, **yaml_params), ctx)
        fault.start()
        (toxic,) = api.toxics("lookup")
        assert (toxic["type"], toxic["stream"], toxic["toxicity"], toxic["attributes"]) == \
            (name, "upstream", 0.75, wire), name
        fault.stop()
        assert api.toxics("lookup") == []
        fault.stop()  # idempotent
    added = [f for what, f in ctx.events if what == "toxic added"]
    assert [a["toxic_type"] for a in added] == list(SAMPLES)


@needs_server
@pytest.mark.timeout(20)
def test_fault_stop_after_reset_is_not_an_error(api):
    api.create_proxy("lookup", upstream="127.0.0.1:9")
    ctx = _Ctx(api, "lookup")
    fault = REGISTRY["latency"](REGISTRY["latency"].Params(latency="10ms"), ctx)
    fault.start()
    api.reset()  # between scenarios the runner resets everything
    fault.stop()
    assert ctx.events[-1] == ("toxic removed", {"proxy": "lookup", "toxic": ctx.events[0][1]["toxic"],
                                                "was_present": False})


def test_fault_params_errors_are_precise():
    def err(cls_name, **kw):
        with pytest.raises(ValidationError) as exc:
            REGISTRY[cls_name].Params(**kw)
        e = exc.value.errors()[0]
        return ".".join(map(str, e["loc"])), e["msg"]

    assert err("latency", latency="1s", rate=5) == ("rate", "Extra inputs are not permitted")
    loc, msg = err("latency", latency="0.5ms")
    assert loc == "latency" and "whole milliseconds" in msg
    loc, msg = err("slicer", average_size=8, delay="0.5us")
    assert loc == "delay" and "whole microseconds" in msg
    assert err("latency")[0] == "latency"  # required
    assert err("bandwidth", rate=-1)[0] == "rate"
    assert err("limit_data", bytes=10, stream="both")[0] == "stream"
    assert err("timeout", timeout="1s", toxicity=1.5)[0] == "toxicity"
    assert err("down", latency="1s")[0] == "latency"
    for name in list(SAMPLES) + ["down"]:
        assert name in REGISTRY


# --------------------------------------------------------------------------- the floor


@needs_server
@pytest.mark.timeout(30)
def test_measure_floor(api):
    floor = measure_floor(api, n=60, latency_ms=20, n_latency=10)
    for key in ("direct_median_ms", "proxied_median_ms", "added_median_ms", "latency_measured_ms"):
        assert math.isfinite(floor[key])
    assert floor["direct_median_ms"] > 0 and floor["proxied_median_ms"] > 0
    assert floor["latency_configured_ms"] == 20
    assert floor["latency_min_ms"] >= 19.0  # every sample crossed the toxic
    assert floor["latency_measured_ms"] >= 18.0
    assert api.proxies() == {}  # its proxy is gone
