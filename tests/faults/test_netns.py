"""faults/netns.py and faults/partition.py: two real namespaces, a real veth, real iptables and tc.

A REP echo and a TCP sink run in namespace b, a client process in namespace a; all traffic stays
on the veth between the two namespaces this test creates. ``_Ctx`` stands in for the runner's
topology (it only carries ``netns`` and ``event``) so the fault classes can be driven directly.
"""

from __future__ import annotations

import ipaddress
import json
import os
import queue
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from faults import netns, partition  # noqa: F401  (registers partition, refuse, bandwidth_limit)
from faults.base import REGISTRY
from faults.netns import NetnsPair

_ok, _why = netns.availability()
if _ok:
    _ok, _why = netns.netns_supported()
pytestmark = pytest.mark.skipif(not _ok, reason=f"isolated hosts unavailable: {_why}")

ECHO_PORT, SINK_PORT = 5555, 5556

SERVER = textwrap.dedent("""
    import signal, socket, sys, threading, zmq
    host = sys.argv[1]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    ctx = zmq.Context()
    rep = ctx.socket(zmq.REP); rep.setsockopt(zmq.LINGER, 0); rep.bind(f"tcp://{host}:%d")
    sink = socket.socket(); sink.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sink.bind((host, %d)); sink.listen(8); sink.settimeout(0.1)
    def drain():
        while not stop.is_set():
            try:
                conn, _ = sink.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(10)
                want = int.from_bytes(conn.recv(8), "big"); got = 0
                while got < want:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    got += len(chunk)
                conn.sendall(b"k")
    threading.Thread(target=drain, daemon=True).start()
    print("READY", flush=True)
    while not stop.is_set():
        if rep.poll(50, zmq.POLLIN):
            rep.send(rep.recv())
    rep.close(linger=0); ctx.term()
""" % (ECHO_PORT, SINK_PORT))

CLIENT = textwrap.dedent("""
    import json, socket, sys, time, zmq
    from zmq.utils.monitor import recv_monitor_message
    ctx = zmq.Context()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line); t0 = time.monotonic(); out = {}
        if cmd["op"] == "req":
            s = ctx.socket(zmq.REQ); s.setsockopt(zmq.LINGER, 0); s.connect(cmd["endpoint"])
            s.send(b"ping")
            out["ok"] = bool(s.poll(cmd["timeout_ms"], zmq.POLLIN)) and s.recv() == b"ping"
            s.close(linger=0)
        elif cmd["op"] == "tcp":
            try:
                socket.create_connection((cmd["host"], cmd["port"]), timeout=cmd["timeout_s"]).close()
                out["result"] = "ok"
            except ConnectionRefusedError:
                out["result"] = "refused"
            except (socket.timeout, TimeoutError):
                out["result"] = "timeout"
            except OSError as exc:
                out["result"] = type(exc).__name__
        elif cmd["op"] == "zmq_events":
            s = ctx.socket(zmq.REQ); s.setsockopt(zmq.LINGER, 0)
            mon = s.get_monitor_socket(); s.connect(cmd["endpoint"]); seen = []
            end = time.monotonic() + cmd["timeout_ms"] / 1000
            while time.monotonic() < end and not {"CONNECTED", "CONNECT_RETRIED"} & set(seen):
                if mon.poll(20):
                    seen.append(zmq.Event(recv_monitor_message(mon)["event"]).name.removeprefix("EVENT_"))
            out["events"] = seen
            s.disable_monitor(); mon.close(linger=0); s.close(linger=0)
        elif cmd["op"] == "send":
            c = socket.create_connection((cmd["host"], cmd["port"]), timeout=10)
            c.sendall(cmd["nbytes"].to_bytes(8, "big")); c.sendall(b"x" * cmd["nbytes"])
            out["ack"] = c.recv(1) == b"k"; c.close()
        out["ms"] = (time.monotonic() - t0) * 1000
        print(json.dumps(out), flush=True)
""")


class Client:
    """The client process in namespace a: one JSON command in, one JSON line out, with a deadline."""

    def __init__(self, pair: NetnsPair):
        self.proc = pair.popen("a", [sys.executable, "-c", CLIENT], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        assert self.get(15) == {"ready": True}

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))

    def get(self, timeout: float) -> dict:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"client in namespace gave no answer within {timeout}s") from None

    def call(self, timeout: float = 10, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.get(timeout)


@pytest.fixture(scope="module")
def net():
    pair = NetnsPair().create()
    try:
        server = pair.popen("b", [sys.executable, "-c", SERVER, pair.ip_b], stdout=subprocess.PIPE, text=True)
        line = []
        reader = threading.Thread(target=lambda: line.append(server.stdout.readline()), daemon=True)
        reader.start()
        reader.join(15)
        assert line and line[0].strip() == "READY", f"server in namespace b did not start: {line}"
        client = Client(pair)
        yield pair, client
    finally:
        pair.cleanup()


@pytest.fixture
def link(net):
    pair, client = net
    try:
        yield pair, client
    finally:
        pair.heal()
        pair.clear_bandwidth()


def req(pair: NetnsPair, client: Client, timeout_ms: int = 2000) -> dict:
    return client.call(op="req", endpoint=f"tcp://{pair.ip_b}:{ECHO_PORT}", timeout_ms=timeout_ms)


class _Ctx:
    """What the runner gives a netns fault (faults/partition.py): stand-in for the runner's topology."""

    def __init__(self, pair: NetnsPair):
        self.netns = pair
        self.events: list[str] = []

    def event(self, what: str, **fields) -> None:
        self.events.append(what)


# --------------------------------------------------------------------------- layout


@pytest.mark.timeout(20)
def test_namespaces_veth_and_private_addresses(net):
    pair, _ = net
    names = netns.list_namespaces()
    assert pair.a in names and pair.b in names
    assert pair.a.startswith("pdc-") and pair.b.startswith("pdc-")
    assert pair.subnet.prefixlen == 30
    assert any(pair.subnet.subnet_of(ipaddress.ip_network(p)) for p in ("10.0.0.0/8", "172.16.0.0/12"))
    assert {pair.ip_a, pair.ip_b} == {str(h) for h in pair.subnet.hosts()}
    for side in ("a", "b"):
        out = pair.run(side, ["ip", "-o", "-4", "addr", "show", "dev", pair.veth[side]]).stdout
        assert f"{pair.ip[side]}/30" in out
    host_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=10).stdout
    assert pair.veth["a"] not in host_links and pair.veth["b"] not in host_links  # nothing in the host
    host_addrs = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, timeout=10).stdout
    assert pair.ip_a not in host_addrs and pair.ip_b not in host_addrs


@pytest.mark.timeout(20)
def test_zmq_req_rep_between_namespaces(link):
    pair, client = link
    for _ in range(3):
        assert req(pair, client)["ok"] is True
    assert client.call(op="tcp", host=pair.ip_b, port=SINK_PORT, timeout_s=2)["result"] == "ok"


# --------------------------------------------------------------------------- partitions


@pytest.mark.timeout(20)
def test_drop_times_out_then_heal_works(link):
    pair, client = link
    rules = pair.partition("a->b", "drop")
    assert len(pair.rules("b")) == 1 and pair.rules("a") == []
    r = req(pair, client, timeout_ms=300)
    assert r["ok"] is False and r["ms"] >= 290  # the packets vanished: only the deadline ends the wait
    t = client.call(op="tcp", host=pair.ip_b, port=SINK_PORT, timeout_s=0.4)
    assert t["result"] == "timeout" and t["ms"] >= 390
    pair.heal(rules)
    assert pair.rules("b") == []
    assert req(pair, client)["ok"] is True


@pytest.mark.timeout(20)
def test_reject_fails_fast_then_heal_works(link):
    pair, client = link
    pair.partition("a->b", "reject")
    t = client.call(op="tcp", host=pair.ip_b, port=SINK_PORT, timeout_s=3)
    assert t["result"] == "refused"
    assert t["ms"] < 1000  # refused at once, not after the 3 s connect timeout
    ev = client.call(op="zmq_events", endpoint=f"tcp://{pair.ip_b}:{ECHO_PORT}", timeout_ms=2000)
    assert "CONNECT_RETRIED" in ev["events"] and "CONNECTED" not in ev["events"]
    assert ev["ms"] < 1500
    pair.heal()
    assert req(pair, client)["ok"] is True
    ev = client.call(op="zmq_events", endpoint=f"tcp://{pair.ip_b}:{ECHO_PORT}", timeout_ms=2000)
    assert "CONNECTED" in ev["events"]


@pytest.mark.timeout(20)
def test_reverse_and_both_directions(link):
    pair, client = link
    pair.partition("b->a", "drop")  # the request arrives, the reply vanishes
    assert pair.rules("a") and not pair.rules("b")
    assert req(pair, client, timeout_ms=300)["ok"] is False
    pair.heal()
    both = pair.partition("both", "drop")
    assert {side for side, _ in both} == {"a", "b"}
    assert req(pair, client, timeout_ms=300)["ok"] is False
    pair.heal()
    assert pair.rules("a") == [] and pair.rules("b") == []
    assert req(pair, client)["ok"] is True


@pytest.mark.timeout(30)
def test_one_port_only_each_way(link):
    """REJECT and DROP on one port of b: that port is cut as the direction says, b's other port
    works meanwhile, and the counters see the stopped packets."""
    pair, client = link
    rules = pair.partition("a->b", "reject", tag="one-port", ports=[SINK_PORT])
    assert all("--dport" in spec and str(SINK_PORT) in spec for _, spec in rules if "REJECT" in spec)
    t = client.call(op="tcp", host=pair.ip_b, port=SINK_PORT, timeout_s=3)
    assert t["result"] == "refused" and t["ms"] < 1000
    assert req(pair, client)["ok"] is True  # the other port of b answers
    assert pair.stopped("one-port") >= 1
    pair.heal(rules)
    assert client.call(op="tcp", host=pair.ip_b, port=SINK_PORT, timeout_s=3)["result"] == "ok"
    # b's answers from that port vanish (the rule sits in a, on the source port): a connect times out
    rules = pair.partition("b->a", "drop", tag="one-port-back", ports=[SINK_PORT])
    assert pair.rules("a") and not pair.rules("b")
    assert client.call(op="tcp", host=pair.ip_b, port=SINK_PORT, timeout_s=0.5)["result"] == "timeout"
    assert req(pair, client)["ok"] is True
    assert pair.stopped("one-port-back") >= 1
    pair.heal(rules)
    # both ways, refused: the other side's refusals pass (a RST from b's port is not swallowed in a)
    both = pair.partition("both", "reject", ports=[SINK_PORT])
    assert {side for side, _ in both} == {"a", "b"}
    assert client.call(op="tcp", host=pair.ip_b, port=SINK_PORT, timeout_s=3)["result"] == "refused"
    assert req(pair, client)["ok"] is True
    pair.heal(both)
    assert pair.rules("a") == [] and pair.rules("b") == []
    for bad in ([0], [70000], ["80"], [True]):
        with pytest.raises(ValueError, match="ports"):
            pair.partition("a->b", "drop", ports=bad)
    with pytest.raises(ValueError, match="port_side"):
        pair.partition("a->b", "drop", ports=[SINK_PORT], port_side="c")


@pytest.mark.timeout(20)
def test_heal_removes_only_the_given_rules(link):
    pair, client = link
    first = pair.partition("a->b", "drop")
    second = pair.partition("a->b", "reject")
    pair.heal(first)
    assert len(pair.rules("b")) == len(second) == 4  # the reject rules stay
    assert client.call(op="tcp", host=pair.ip_b, port=SINK_PORT, timeout_s=3)["result"] == "refused"
    pair.heal(first)  # idempotent
    pair.heal(second)
    assert pair.rules("b") == []
    with pytest.raises(ValueError, match="direction"):
        pair.partition("a<->b")
    with pytest.raises(ValueError, match="mode"):
        pair.partition("both", "blackhole")


# --------------------------------------------------------------------------- bandwidth


def _qdisc(pair: NetnsPair, side: str) -> str:
    return subprocess.run(["tc", "-n", pair.ns[side], "qdisc", "show", "dev", pair.veth[side]],
                          capture_output=True, text=True, timeout=10).stdout


@pytest.mark.timeout(30)
def test_tbf_limits_bandwidth(link):
    ok, why = netns.qdisc_available("tbf")
    if not ok:
        pytest.skip(why)
    pair, client = link
    nbytes = 300_000
    free = client.call(op="send", host=pair.ip_b, port=SINK_PORT, nbytes=nbytes)
    assert free["ack"]
    rate_kbit, burst = 8000, 16384  # 1 MB/s
    pair.set_bandwidth("a->b", rate_kbit, burst_bytes=burst)
    assert "tbf" in _qdisc(pair, "a") and "tbf" not in _qdisc(pair, "b")
    limited = client.call(op="send", host=pair.ip_b, port=SINK_PORT, nbytes=nbytes)
    assert limited["ack"]
    floor_ms = (nbytes - burst) * 8 / (rate_kbit * 1000) * 1000  # bytes beyond the bucket at the rate
    assert limited["ms"] >= 0.9 * floor_ms, (limited, floor_ms, free)
    pair.clear_bandwidth("a->b")
    assert "tbf" not in _qdisc(pair, "a")


@pytest.mark.timeout(30)
def test_netem_detection_gives_a_reason():
    ok, why = netns.netem_available()
    assert isinstance(ok, bool) and why
    assert ("available" in why) if ok else ("netem" in why)


# --------------------------------------------------------------------------- the fault classes


@pytest.mark.timeout(30)
def test_partition_refuse_bandwidth_faults(link):
    pair, client = link
    ctx = _Ctx(pair)
    for name in ("partition", "refuse", "bandwidth_limit"):
        assert REGISTRY[name].requires == ("netns", "root")
    part = REGISTRY["partition"](REGISTRY["partition"].Params(direction="client->server"), ctx)
    part.start()
    assert len(pair.rules("b")) == 1
    assert req(pair, client, timeout_ms=300)["ok"] is False
    part.stop()
    part.stop()
    assert pair.rules("b") == [] and req(pair, client)["ok"] is True
    assert part.effect()["dropped"] >= 1 and part.required_effect() == {"dropped": 1}  # the client's SYNs

    quiet = REGISTRY["partition"](REGISTRY["partition"].Params(direction="server->client"), ctx)
    quiet.start()
    quiet.stop()  # nothing crossed while it lasted: it stopped nothing, and says so
    assert quiet.effect() == {"dropped": 0}

    refuse = REGISTRY["refuse"](REGISTRY["refuse"].Params(direction="both"), ctx)
    refuse.start()
    assert client.call(op="tcp", host=pair.ip_b, port=SINK_PORT, timeout_s=3)["result"] == "refused"
    refuse.stop()
    assert client.call(op="tcp", host=pair.ip_b, port=SINK_PORT, timeout_s=3)["result"] == "ok"
    assert refuse.effect()["refused"] >= 1  # the refused SYN (the RST coming back is let through, not counted)

    ok, _ = netns.qdisc_available("tbf")
    if ok:
        bw = REGISTRY["bandwidth_limit"](REGISTRY["bandwidth_limit"].Params(rate_kbit=512,
                                                                            direction="server->client"), ctx)
        bw.start()
        assert "rate 512Kbit" in _qdisc(pair, "b")
        bw.stop()
        bw.stop()
        assert "tbf" not in _qdisc(pair, "b")
    assert ctx.events[:6] == ["partition", "healed", "partition", "healed", "partition", "healed"]


def test_fault_params_are_validated():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="direction"):
        REGISTRY["partition"].Params(direction="a->b")
    with pytest.raises(ValidationError, match="rate_kbit"):
        REGISTRY["bandwidth_limit"].Params()
    with pytest.raises(ValidationError, match="mode"):
        REGISTRY["refuse"].Params(mode="drop")


# --------------------------------------------------------------------------- cleanup


@pytest.mark.timeout(30)
def test_cleanup_removes_namespaces_and_processes():
    with NetnsPair() as pair:
        sleeper = pair.popen("b", ["sleep", "60"])
        pair.partition("both", "drop")
        assert pair.exists()
    assert sleeper.poll() is not None
    assert pair.a not in netns.list_namespaces() and pair.b not in netns.list_namespaces()
    pair.cleanup()  # idempotent


@pytest.mark.timeout(30)
def test_atexit_cleanup_in_a_child_process(tmp_path):
    # A process that exits without cleaning up: the atexit hook removes its namespaces.
    code = ("import json; from faults.netns import NetnsPair; p = NetnsPair().create(); "
            "print(json.dumps([p.a, p.b]), flush=True)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20,
                         cwd=str(Path(__file__).resolve().parents[2]))
    assert out.returncode == 0, out.stderr
    names = json.loads(out.stdout)
    left = netns.list_namespaces()
    assert not set(names) & set(left)


def test_availability_names_what_is_missing(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("ip", "tc"):
        os.symlink(shutil.which(tool), bindir / tool)
    monkeypatch.setenv("PATH", str(bindir))
    ok, why = netns.availability()
    assert not ok and "iptables" in why and "ip," not in why


def test_pick_subnet_avoids_given_networks():
    import random

    rng = random.Random(1)
    taken = [ipaddress.ip_network("10.0.0.0/8")]
    for _ in range(50):
        net = netns.pick_subnet(rng, avoid=taken)
        assert net.subnet_of(ipaddress.ip_network("172.16.0.0/12")) and net.prefixlen == 30
