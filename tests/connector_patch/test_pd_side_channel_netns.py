"""P's side-channel socket options (connector_patch/pd/pull.py: ``side_channel_options``) between
two real network namespaces this test creates (faults/netns.py: a veth, iptables):

- a link that starts refusing (REJECT, a TCP reset) right after D's pull connected, before D's
  first ping, is seen lost by P within one of its pings (P never writes for that connection's
  pulls after that: issue 30, item 4), well before D may read P as gone (its connection lost for
  D's heartbeat timeout, 1.5 s);
- a requester that merely goes silent (an upstream D frozen, which sends no pings) keeps its
  connection, and P's answer reaches it when it thaws (pd-mixed-upstream-decode).

P is a ROUTER with those options in namespace a, D a DEALER in namespace b, each its own process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from connector_patch.pd.pull import pull_socket_options, side_channel_options
from connector_patch.pd.settings import Settings
from faults import netns
from faults.netns import NetnsPair

_ok, _why = netns.availability()
if _ok:
    _ok, _why = netns.netns_supported()
pytestmark = [pytest.mark.skipif(not _ok, reason=f"isolated hosts unavailable: {_why}"), pytest.mark.timeout(60)]
PORT = 5571

P = textwrap.dedent("""
    import json, sys, time, zmq
    from zmq.utils.monitor import parse_monitor_message
    ctx = zmq.Context()
    r = ctx.socket(zmq.ROUTER); r.setsockopt(zmq.LINGER, 0)
    for name, value in json.loads(sys.argv[2]):
        r.setsockopt(getattr(zmq, name), value)
    mon = r.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
    r.bind(f"tcp://{sys.argv[1]}:%d")
    print(json.dumps({"ready": time.monotonic()}), flush=True)
    poller = zmq.Poller(); poller.register(r, zmq.POLLIN); poller.register(mon, zmq.POLLIN)
    end = time.monotonic() + 40
    due = []  # (when "P's prefill" ends, requester): answered then, events read meanwhile
    while time.monotonic() < end:
        ready = dict(poller.poll(20))
        if mon in ready:
            ev = parse_monitor_message(mon.recv_multipart())["event"]
            name = {zmq.EVENT_ACCEPTED: "accepted", zmq.EVENT_DISCONNECTED: "disconnected"}[ev]
            print(json.dumps({name: time.monotonic()}), flush=True)
        if r in ready:
            ident, msg = r.recv_multipart()
            print(json.dumps({"pull": time.monotonic()}), flush=True)
            due.append((time.monotonic() + float(msg.decode()), ident))
        for item in [d for d in due if d[0] <= time.monotonic()]:
            due.remove(item)
            r.send_multipart([item[1], b"answer"])
            print(json.dumps({"answered": time.monotonic()}), flush=True)
""" % PORT)

D = textwrap.dedent("""
    import json, sys, time, zmq
    s = zmq.Context().socket(zmq.DEALER)
    for name, value in json.loads(sys.argv[2]):
        s.setsockopt(getattr(zmq, name), value)
    s.connect(f"tcp://{sys.argv[1]}:%d")
    s.send(sys.argv[3].encode())
    if s.poll(30000):
        s.recv()
        print(json.dumps({"got_answer": time.monotonic()}), flush=True)
    time.sleep(30)
""" % PORT)


def _events(proc, until, timeout_s: float) -> dict:
    seen: dict = {}
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and not until(seen):
        line = proc.stdout.readline()
        if not line:
            break
        seen.update(json.loads(line))
    return seen


def _start(pair: NetnsPair, side: str, code: str, *args: str) -> subprocess.Popen:
    return pair.popen(side, [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)


def test_p_sees_a_refusing_link_in_one_ping_and_keeps_a_silent_requester() -> None:
    s = Settings.from_extra({})
    p_opts = json.dumps(side_channel_options())
    with NetnsPair() as pair:
        p = _start(pair, "a", P, pair.ip_a, p_opts)
        procs = [p]
        try:
            assert "ready" in _events(p, lambda e: "ready" in e, 10)
            # 1. a hardened D's pull; the link refuses (both ways) 0.1 s after P took it
            d = _start(pair, "b", D, pair.ip_a, json.dumps(pull_socket_options(s.heartbeat_ms, s.heartbeat_timeout_ms)), "5")
            procs.append(d)
            assert "pull" in _events(p, lambda e: "pull" in e, 10)
            time.sleep(0.1)
            rules = pair.partition("both", "reject")
            t_cut = time.monotonic()
            seen = _events(p, lambda e: "disconnected" in e, 5)
            pair.heal(rules)
            assert "disconnected" in seen, seen
            lost_after = seen["disconnected"] - t_cut
            print(f"P saw the refusing link lost after {lost_after:.3f} s")
            assert lost_after < s.heartbeat_timeout_ms / 1000 - 0.25, lost_after  # a keepalive probe (1 s), before D may read P gone (1.5 s)
            d.kill()
            # 2. an upstream D (no pings) stopped 3 s while P computes: its connection stays, the answer reaches it
            d2 = _start(pair, "b", D, pair.ip_a, json.dumps([["LINGER", 0]]), "1")
            procs.append(d2)
            assert "pull" in _events(p, lambda e: "pull" in e, 10)
            os.kill(d2.pid, signal.SIGSTOP)
            seen = _events(p, lambda e: "answered" in e, 5)
            time.sleep(3)
            os.kill(d2.pid, signal.SIGCONT)
            got = _events(d2, lambda e: "got_answer" in e, 5)
            assert "got_answer" in got, got
            # nothing of P's said the frozen requester was dropped (read what P printed meanwhile)
            p.send_signal(signal.SIGTERM)
            rest = p.stdout.read()
            assert "disconnected" not in rest and "disconnected" not in seen, rest
        finally:
            for proc in procs:
                proc.kill()
                proc.wait(5)
