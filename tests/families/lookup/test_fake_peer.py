"""families/lookup/fake_peer.py: each misbehaviour, as a real ``pdchaos node fake-peer``
process, against the real hardened LookupClient (and the legacy model's client for the legacy
mode), over ipc and tcp.
Nothing is mocked.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import zmq

from connector_patch.lookup.legacy import LegacyLookupClient
from connector_patch.lookup import LookupClient
from nodekit.control import control_call
from families.lookup.wire import REPLY_KINDS
from nodes import Node, free_tcp_endpoint

DEADLINE_MS = 200
TOLERANCE_S = 0.15  # bounded_return: deadline + this, on 2 noisy cores
BLOCK = 16
PRELOADED = [bytes([i]) * 32 for i in range(1, 9)]
ABSENT = [bytes([0xF0 + i]) * 32 for i in range(8)]
PARTIAL = PRELOADED[:5] + ABSENT[:3]  # 5 blocks present: 80 of 128 tokens


@pytest.fixture(scope="module")
def workdir():
    d = tempfile.mkdtemp(prefix="pdc")
    with open(os.path.join(d, "preload.txt"), "w") as fh:
        fh.write("# preloaded blocks\n" + "".join(h.hex() + "\n" for h in PRELOADED))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def peers(workdir):
    """One fake peer per mode, started together (a node takes ~0.3 s to import)."""
    specs = {
        "slow": (["--mode", "slow", "--delay-ms", "60", "--groups", "2"], "ipc"),
        "slow_tcp": (["--mode", "slow", "--delay-ms", "500"], "tcp"),
        "silent": (["--mode", "silent"], "ipc"),
        "malformed": (["--mode", "malformed", "--reply", "empty"], "tcp"),
        "legacy": (["--mode", "legacy"], "ipc"),
    }
    nodes: dict[str, dict] = {}
    try:
        for name, (args, transport) in specs.items():
            ep = f"ipc://{workdir}/{name}" if transport == "ipc" else free_tcp_endpoint()
            control = f"ipc://{workdir}/{name}.ctl"
            node = Node("fake-peer", [*args, "--endpoint", ep, "--control", control,
                                      "--preload", os.path.join(workdir, "preload.txt")], workdir)
            nodes[name] = {"endpoint": ep, "control": control, "node": node}
        for entry in nodes.values():
            entry["node"].wait_ready()
        yield nodes
    finally:
        for entry in nodes.values():  # signal all first: they stop in parallel
            entry["node"].send(signal.SIGTERM)
        codes = {name: entry["node"].stop() for name, entry in nodes.items()}
    assert codes == {name: 0 for name in nodes}, codes


def lookup_timed(client, hashes, token_len=128, groups=(0,)):
    t0 = time.monotonic()
    hit = client.lookup(token_len, hashes, groups)
    return hit, time.monotonic() - t0


# --------------------------------------------------------------------------- slow


@pytest.mark.timeout(20)
def test_slow_below_deadline_returns_the_right_hits(peers):
    with LookupClient(peers["slow"]["endpoint"], timeout_ms=1000) as c:
        for hashes, groups, want in [(PRELOADED, (0, 1), 128), (PARTIAL, (0,), 80), (PARTIAL, (1,), 80),
                                     (ABSENT, (0,), 0)]:
            hit, elapsed = lookup_timed(c, hashes, groups=groups)
            assert (hit, c.last_outcome) == (want, "ok")
            assert 0.06 <= elapsed < 1.0
        # a bad request gets the v1 error envelope, like the real server (group 5 of 2)
        assert c.lookup(128, PRELOADED, (5,)) == 0
        assert (c.last_outcome, c.last_code) == ("server_error", "BAD_GROUP_IDS")
    s = control_call(peers["slow"]["control"], "stats")
    assert s["mode"] == "slow" and s["delay_ms"] == 60
    assert s["received"] >= 5 and s["bad_requests"] >= 1


@pytest.mark.timeout(20)
def test_slow_delays_each_request_not_a_queue(peers):
    """Four clients at once against a 60 ms peer: each answer takes ~60 ms, not 60 ms per client."""
    results: list[tuple[int, float]] = []

    def one() -> None:
        with LookupClient(peers["slow"]["endpoint"], timeout_ms=1000) as c:
            results.append(lookup_timed(c, PARTIAL))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert [hit for hit, _ in results] == [80] * 4
    assert max(e for _, e in results) < 0.06 + 0.15


@pytest.mark.timeout(20)
def test_slow_above_deadline_times_out_bounded_then_recovers(peers):
    p = peers["slow_tcp"]
    with LookupClient(p["endpoint"], timeout_ms=DEADLINE_MS) as c:
        hit, elapsed = lookup_timed(c, PRELOADED)
        assert (hit, c.last_outcome, c.last_code) == (0, "timeout", "TIMEOUT")
        assert DEADLINE_MS / 1000 - 0.01 <= elapsed <= DEADLINE_MS / 1000 + TOLERANCE_S
        control_call(p["control"], "set_mode", mode="slow", delay_ms=0)
        try:
            hit, _ = lookup_timed(c, PARTIAL)  # first call after the heal
            assert (hit, c.last_outcome) == (80, "ok")
        finally:
            control_call(p["control"], "set_mode", mode="slow", delay_ms=500)


# --------------------------------------------------------------------------- silent


@pytest.mark.timeout(20)
def test_silent_times_out_bounded_and_counts_what_it_swallows(peers):
    p = peers["silent"]
    before = control_call(p["control"], "stats")
    with LookupClient(p["endpoint"], timeout_ms=DEADLINE_MS) as c:
        for _ in range(2):
            hit, elapsed = lookup_timed(c, PRELOADED)
            assert (hit, c.last_outcome, c.last_code) == (0, "timeout", "TIMEOUT")
            assert elapsed <= DEADLINE_MS / 1000 + TOLERANCE_S
    after = control_call(p["control"], "stats")
    assert after["received"] - before["received"] == 2
    assert after["replied"] == 0


# --------------------------------------------------------------------------- malformed


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", list(REPLY_KINDS))
def test_malformed_reply_fails_open_fast_with_its_code(peers, kind):
    p = peers["malformed"]
    if kind != "empty":  # "empty" is the one the node was started with (--reply)
        control_call(p["control"], "set_mode", mode="malformed", reply=kind)
    try:
        with LookupClient(p["endpoint"], timeout_ms=DEADLINE_MS) as c:
            hit, elapsed = lookup_timed(c, PARTIAL)
            assert (hit, c.last_outcome, c.last_code) == (0, "protocol", REPLY_KINDS[kind])
            assert elapsed < DEADLINE_MS / 1000 + TOLERANCE_S  # bounded; "protocol" shows it was not waited out
            assert c.counters["socket_rebuilds"] == 1
    finally:
        control_call(p["control"], "set_mode", mode="malformed", reply="empty")


def test_set_mode_refuses_bad_values(peers):
    from nodekit.control import ControlError

    p = peers["malformed"]
    with pytest.raises(ControlError, match="mode malformed needs reply"):
        control_call(p["control"], "set_mode", mode="malformed", reply="nope")
    with pytest.raises(ControlError, match="mode must be one of"):
        control_call(p["control"], "set_mode", mode="flaky")
    assert control_call(p["control"], "stats")["reply"] == "empty"


# --------------------------------------------------------------------------- legacy


@pytest.mark.timeout(20)
def test_legacy_peer_is_detected_by_the_hardened_client(peers):
    with LookupClient(peers["legacy"]["endpoint"], timeout_ms=DEADLINE_MS) as c:
        hit, elapsed = lookup_timed(c, PARTIAL)
        # "protocol", not "timeout", is what shows the reply was recognised before the deadline
        # (the client turns any answer it validates after the deadline into TIMEOUT). The wall
        # time is bounded_return's claim, with its tolerance: CI saw 0.21 s once, on a loaded
        # machine, for an exchange the client itself timed at 1.2 ms.
        assert (hit, c.last_outcome, c.last_code) == (0, "protocol", "LEGACY_REPLY")
        assert elapsed < DEADLINE_MS / 1000 + TOLERANCE_S


@pytest.mark.timeout(20)
def test_legacy_peer_answers_the_legacy_client_correctly(peers):
    ctx = zmq.Context()
    client = LegacyLookupClient(peers["legacy"]["endpoint"], context=ctx)
    results: list[int] = []

    def run() -> None:  # the legacy client has no timeout: run it where a hang cannot block the test
        for hashes in (PRELOADED, PARTIAL, ABSENT):
            results.append(client.lookup(128, hashes))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(5)
    try:
        assert not t.is_alive(), "legacy client stalled"
        assert results == [128, 80, 0]
    finally:
        ctx.destroy(linger=0)


# --------------------------------------------------------------------------- lifecycle and bad input


@pytest.mark.timeout(30)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stops_cleanly_on_signal_and_removes_its_ipc_files(workdir, sig):
    ep, control = f"ipc://{workdir}/life{sig}", f"ipc://{workdir}/life{sig}.ctl"
    node = Node("fake-peer", ["--mode", "malformed", "--reply", "two_frames", "--endpoint", ep,
                              "--control", control, "--delay-ms", "10"], workdir).wait_ready()
    try:
        with LookupClient(ep, timeout_ms=500) as c:
            for _ in range(3):
                assert c.lookup(128, PRELOADED) == 0 and c.last_code == "EXTRA_FRAMES"
        s = control_call(control, "stats")
        assert (s["received"], s["replied"], s["counters"]) == (3, 3, {"requests": 3, "replies": 3})
        assert os.path.exists(ep[len("ipc://"):]) and os.path.exists(control[len("ipc://"):])
        t0 = time.monotonic()
        assert node.stop(sig) == 0
        assert time.monotonic() - t0 < 2.0
        assert not os.path.exists(ep[len("ipc://"):]) and not os.path.exists(control[len("ipc://"):])
        assert "fake peer stopping: received=3 replied=3" in node.log()
    finally:
        if node.proc.poll() is None:
            node.proc.kill()
        node.stop()


@pytest.mark.timeout(30)
def test_bad_input_is_one_line_exit_2(workdir):
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    busy = f"tcp://127.0.0.1:{held.getsockname()[1]}"
    bad_preload = os.path.join(workdir, "bad-preload.txt")
    with open(bad_preload, "w") as fh:
        fh.write("abcd\nnot-hex\n")
    ep = f"ipc://{workdir}/bad"
    cases = [
        (["--endpoint", ep, "--mode", "flaky"], "argument --mode: invalid choice: 'flaky'"),
        (["--endpoint", ep, "--mode", "malformed"], "--reply: required with --mode malformed"),
        (["--endpoint", ep, "--mode", "slow", "--reply", "empty"], "--reply: only used with --mode malformed"),
        (["--endpoint", ep, "--mode", "slow", "--preload", "/nonexistent/x"], "--preload: cannot read"),
        (["--endpoint", ep, "--mode", "slow", "--preload", bad_preload], "bad-preload.txt:2: expected one hex"),
        (["--endpoint", "tcp://192.0.2.1:5555", "--mode", "silent"], "is not on loopback"),
        (["--endpoint", busy, "--mode", "silent"], "--endpoint: cannot bind"),
        (["--endpoint", ep, "--mode", "slow", "--delay-ms", "-5"], "--delay-ms: must be in"),
    ]
    procs = [subprocess.Popen([sys.executable, "-m", "harness.cli", "node", "fake-peer", *args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for args, _ in cases]
    try:
        for proc, (args, message) in zip(procs, cases):
            out, err = proc.communicate(timeout=30)
            assert proc.returncode == 2, (args, err)
            assert err.startswith("error: ") and message in err, (args, err)
            assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
            assert "READY" not in out
    finally:
        held.close()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
    assert not os.path.exists(ep[len("ipc://"):])
