"""families/pd/port_faults.py: ``refuse_port`` and ``partition_port`` on one of P's ports, between
two real namespaces. P is the project's fake prefill peer (families/pd/fake_prefill.py: a real
HTTP bootstrap server answering ``/query`` in vLLM's format and a real ZMQ ROUTER side channel)
in namespace b, as ``link: netns`` places P; the client runs in namespace a, where D sits.
``_Ctx`` carries what the runner gives a fault (``netns``, ``node``, ``event``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from faults import netns
from faults.base import load_registry
from faults.netns import NetnsPair
from harness.family import get_family
from harness.procs import node_command

_ok, _why = netns.availability()
if _ok:
    _ok, _why = netns.netns_supported()
pytestmark = [pytest.mark.skipif(not _ok, reason=f"isolated hosts unavailable: {_why}"), pytest.mark.timeout(90)]

BOOTSTRAP, SIDE, OTHER = 18411, 18412, 18413

# in namespace a: connect to each port, say what happened (ok, refused, timeout)
PROBE = textwrap.dedent("""
    import json, socket, sys
    out = {}
    for port in sys.argv[2:]:
        try:
            socket.create_connection((sys.argv[1], int(port)), timeout=1.0).close()
            out[port] = "ok"
        except ConnectionRefusedError:
            out[port] = "refused"
        except (socket.timeout, TimeoutError):
            out[port] = "timeout"
    print(json.dumps(out))
""")


class _Ctx:
    def __init__(self, pair: NetnsPair):
        self.netns = pair
        self.events: list[tuple[str, dict]] = []
        eps = {"bootstrap": f"http://{pair.ip_b}:{BOOTSTRAP}", "http": f"http://{pair.ip_b}:{OTHER}"}
        self._node = SimpleNamespace(endpoints=eps)

    def node(self, role: str):
        assert role == "prefill:0"
        return self._node

    def event(self, what: str, **fields) -> None:
        self.events.append((what, fields))


@pytest.fixture(scope="module")
def p_in_b():
    get_family("pd").load()
    pair = NetnsPair().create()
    try:
        peer = pair.popen("b", node_command("pd-fake-prefill", ["--bootstrap-port", str(BOOTSTRAP), "--side-port",
                                                                 str(SIDE), "--mode", "error", "--host", pair.ip_b]),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "PDCHAOS_NETNS": pair.b})  # as the local runtime starts P there
        # OTHER stands for P's HTTP port: a plain listener beside it in b
        pair.popen("b", [sys.executable, "-c", "import socket,time; s=socket.socket(); s.bind((%r, %d)); "
                         "s.listen(64); time.sleep(600)" % (pair.ip_b, OTHER)])
        end = time.monotonic() + 30
        while time.monotonic() < end and probe(pair) != {str(BOOTSTRAP): "ok", str(SIDE): "ok", str(OTHER): "ok"}:
            assert peer.poll() is None, peer.stdout.read()[-2000:]
            time.sleep(0.3)
        assert probe(pair) == {str(BOOTSTRAP): "ok", str(SIDE): "ok", str(OTHER): "ok"}
        yield pair
    finally:
        pair.cleanup()


def probe(pair: NetnsPair) -> dict:
    res = pair.run("a", [sys.executable, "-c", PROBE, pair.ip_b, str(BOOTSTRAP), str(SIDE), str(OTHER)], timeout=20)
    return json.loads(res.stdout)


def _fault(name: str, ctx: _Ctx, **params):
    cls = load_registry("pd")[name]
    return cls(cls.Params(**params), ctx)


def test_refuse_the_side_channel_only(p_in_b):
    ctx = _Ctx(p_in_b)
    f = _fault("refuse_port", ctx, port="side_channel", direction="client->server")
    f.prepare()  # the side channel's port, read from P's /query inside D's namespace
    assert f._ports == [SIDE]
    f.start()
    try:
        assert probe(p_in_b) == {str(BOOTSTRAP): "ok", str(SIDE): "refused", str(OTHER): "ok"}
    finally:
        f.stop()
    assert f.effect()["refused"] >= 1 and f.required_effect() == {"refused": 1}
    assert probe(p_in_b) == {str(BOOTSTRAP): "ok", str(SIDE): "ok", str(OTHER): "ok"}
    f.stop()  # idempotent
    assert p_in_b.rules("a") == [] and p_in_b.rules("b") == []
    assert [w for w, _ in ctx.events] == ["partition", "healed"]
    assert ctx.events[0][1]["port"] == "side_channel" and ctx.events[0][1]["ports"] == 1


def test_drop_the_bootstrap_port_one_way(p_in_b):
    ctx = _Ctx(p_in_b)
    f = _fault("partition_port", ctx, port="bootstrap", direction="server->client")
    f.prepare()
    assert f._ports == [BOOTSTRAP]
    f.start()
    try:
        assert probe(p_in_b) == {str(BOOTSTRAP): "timeout", str(SIDE): "ok", str(OTHER): "ok"}
        assert p_in_b.rules("a") and not p_in_b.rules("b")  # P's answers vanish where D sits
    finally:
        f.stop()
    assert f.effect()["dropped"] >= 1
    assert probe(p_in_b)[str(BOOTSTRAP)] == "ok"


def test_http_port_both_ways_and_nothing_sent_is_no_effect(p_in_b):
    ctx = _Ctx(p_in_b)
    f = _fault("refuse_port", ctx, port="http", direction="both")
    f.prepare()
    f.start()
    f.stop()  # nobody sent to P's HTTP port meanwhile: the window stopped nothing
    assert f.effect() == {"refused": 0} and f.effect()["refused"] < f.required_effect()["refused"]
    g = _fault("refuse_port", ctx, port="http", direction="both")
    g.start()  # not prepared: the port is read at the start
    try:
        assert probe(p_in_b) == {str(BOOTSTRAP): "ok", str(SIDE): "ok", str(OTHER): "refused"}
    finally:
        g.stop()


def test_a_bootstrap_that_does_not_answer_is_one_clear_error(p_in_b):
    ctx = _Ctx(p_in_b)
    ctx._node.endpoints["bootstrap"] = f"http://{p_in_b.ip_b}:{OTHER}"  # a port that never answers HTTP
    f = _fault("refuse_port", ctx, port="side_channel", direction="both")
    with pytest.raises(RuntimeError, match="gave no worker address"):
        f.prepare()
    assert p_in_b.rules("a") == [] and p_in_b.rules("b") == []


def test_params_are_validated():
    get_family("pd").load()
    cls = load_registry("pd")["refuse_port"]
    with pytest.raises(ValidationError):
        cls.Params(port="transfer_engine", direction="both")
    with pytest.raises(ValidationError):
        cls.Params(direction="both")  # which port: required
    with pytest.raises(ValidationError):
        cls.Params(port="http", direction="up")
    assert cls.requires == ("netns", "root") and cls.family == "pd"
