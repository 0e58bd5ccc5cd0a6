"""faults/interposer.py: the ZMQ man-in-the-middle, as a real node process, on ipc and tcp.

Topology per transport: hardened LookupClient(s) (in this process) -> interposer node process
(``pdchaos node interposer``) -> a real LookupServer with a MemoryBackend (in this process, on a
real socket). Rules are switched on the interposer's real control channel between tests.
Nothing is mocked. The named rewrites come from the lookup family's codec (``--codec``), as the
lookup topology starts it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import zmq

from connector_patch.lookup import LookupClient, LookupServer, MemoryBackend
from connector_patch.lookup.protocol import decode_reply, encode_request
from nodekit.control import ControlError, control_call
from nodes import Node, free_tcp_endpoint

CODEC = ["--codec", "families.lookup.wire"]

DEADLINE_MS = 200
TOLERANCE_S = 0.15  # bounded_return: deadline + this, on 2 noisy cores
BLOCK = 16
PRELOADED = [bytes([i]) * 32 for i in range(1, 9)]  # 8 blocks present in both groups
ABSENT = [bytes([0xF0 + i]) * 32 for i in range(8)]


# --------------------------------------------------------------------------- helpers


def expected_hit(hashes: list[bytes], token_len: int) -> int:
    n = 0
    for h in hashes[: -(-token_len // BLOCK)]:
        if h not in PRELOADED:
            break
        n += 1
    return min(n * BLOCK, token_len)


# Prompts with distinct expected hits: full (128), partial (48), miss (0).
FULL = (PRELOADED, 128)
PARTIAL = (PRELOADED[:3] + ABSENT[:5], 128)
MISS = (ABSENT, 128)


@pytest.fixture(scope="module", params=["ipc", "tcp"])
def link(request):
    workdir = tempfile.mkdtemp(prefix="pdc")
    transport = request.param
    if transport == "ipc":
        upstream, listen = f"ipc://{workdir}/srv", f"ipc://{workdir}/mitm"
    else:
        upstream, listen = free_tcp_endpoint(), free_tcp_endpoint()
    control = f"ipc://{workdir}/ctl"
    backend = MemoryBackend(block_size=BLOCK, groups=2)
    backend.put([h.hex() for h in PRELOADED])
    server = LookupServer(upstream, backend, groups=2).start()
    node = Node("interposer", ["--listen", listen, "--upstream", upstream, "--control", control, *CODEC], workdir)
    try:
        node.wait_ready()
        yield {"transport": transport, "listen": listen, "upstream": upstream, "control": control,
               "server": server, "node": node, "workdir": workdir}
    finally:
        rc = node.stop()
        server.close()
        backend.close()
        shutil.rmtree(workdir, ignore_errors=True)
    assert rc == 0


@pytest.fixture
def mitm(link):
    control_call(link["control"], "clear_rules")
    control_call(link["control"], "reset_stats")
    yield link


def ctl(link, cmd: str, **fields):
    return control_call(link["control"], cmd, **fields)


def set_rules(link, *rules: dict) -> None:
    assert ctl(link, "set_rules", rules=list(rules))["rules"] == len(rules)


def timed_lookup(client: LookupClient, prompt: tuple[list[bytes], int], groups=(0,)) -> tuple[int, float]:
    hashes, token_len = prompt
    t0 = time.monotonic()
    hit = client.lookup(token_len, hashes, groups)
    return hit, time.monotonic() - t0


@pytest.fixture
def client(mitm):
    c = LookupClient(mitm["listen"], timeout_ms=DEADLINE_MS)
    yield c
    c.close()


# --------------------------------------------------------------------------- pass-through


@pytest.mark.timeout(30)
def test_pass_through_is_exact_with_concurrent_clients(mitm):
    prompts = [FULL, PARTIAL, MISS, (PRELOADED[:5] + ABSENT[:1], 100)]
    n_clients, per_client = 6, 15
    errors: list[str] = []

    def worker(i: int) -> None:
        with LookupClient(mitm["listen"], timeout_ms=2000) as c:
            for j in range(per_client):
                hashes, token_len = prompts[(i + j) % len(prompts)]
                got = c.lookup(token_len, hashes, (0, 1))
                want = expected_hit(hashes, token_len)
                if got != want or c.last_outcome != "ok":
                    errors.append(f"client {i} op {j}: got {got} ({c.last_outcome}), want {want}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    s = ctl(mitm, "stats")
    total = n_clients * per_client
    assert s["request"] == {"seen": total, "forwarded": total, "dropped": 0, "delayed": 0, "duplicated": 0,
                            "truncated": 0, "rewritten": 0}
    assert s["reply"]["seen"] == s["reply"]["forwarded"] == total
    assert s["clients"] >= n_clients and s["unroutable"] == 0 and s["send_failed"] == 0


# --------------------------------------------------------------------------- delay / drop


@pytest.mark.timeout(20)
def test_reply_delay_below_deadline_is_correct_and_above_times_out(mitm, client):
    set_rules(mitm, {"direction": "reply", "action": "delay", "delay": "60ms"})
    hit, elapsed = timed_lookup(client, PARTIAL)
    assert (hit, client.last_outcome) == (48, "ok")
    assert elapsed >= 0.06

    set_rules(mitm, {"direction": "reply", "action": "delay", "delay": "500ms"})
    hit, elapsed = timed_lookup(client, FULL)
    assert (hit, client.last_outcome, client.last_code) == (0, "timeout", "TIMEOUT")
    assert DEADLINE_MS / 1000 - 0.01 <= elapsed <= DEADLINE_MS / 1000 + TOLERANCE_S
    assert ctl(mitm, "stats")["reply"]["delayed"] == 2

    ctl(mitm, "clear_rules")  # healed: the very next lookup succeeds (client recovery)
    hit, _ = timed_lookup(client, FULL)
    assert (hit, client.last_outcome) == (128, "ok")


@pytest.mark.timeout(20)
@pytest.mark.parametrize("direction", ["request", "reply"])
def test_drop_times_out_within_the_deadline(mitm, client, direction):
    set_rules(mitm, {"direction": direction, "action": "drop"})
    hit, elapsed = timed_lookup(client, FULL)
    assert (hit, client.last_outcome) == (0, "timeout")
    assert elapsed <= DEADLINE_MS / 1000 + TOLERANCE_S
    s = ctl(mitm, "stats")
    assert s[direction]["dropped"] == 1
    if direction == "request":
        assert s["reply"]["seen"] == 0  # the server never saw it
    ctl(mitm, "clear_rules")
    assert timed_lookup(client, PARTIAL)[0] == 48


# --------------------------------------------------------------------------- duplicate


def raw_exchange(endpoint: str, frames: list[bytes], wait_s: float = 0.15) -> list[list[bytes]]:
    """Send one request from a raw DEALER (with the REP delimiter) and collect every reply that
    arrives within ``wait_s``: unlike REQ, a DEALER shows duplicates."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send_multipart([b"", *frames])
        replies, deadline = [], time.monotonic() + wait_s
        while (left := deadline - time.monotonic()) > 0:
            if sock.poll(max(1, int(left * 1000)), zmq.POLLIN):
                replies.append(sock.recv_multipart())
        return replies
    finally:
        sock.close(linger=0)
        ctx.term()


@pytest.mark.timeout(20)
@pytest.mark.parametrize("direction", ["request", "reply"])
def test_duplicate_delivers_two_identical_answers(mitm, direction):
    set_rules(mitm, {"direction": direction, "action": "duplicate", "gap": "20ms"})
    server_before = mitm["server"].counters["requests"]
    replies = raw_exchange(mitm["listen"], encode_request(128, [h.hex() for h in PARTIAL[0]]))
    assert len(replies) == 2
    for r in replies:
        assert r[0] == b"" and decode_reply(r[1:], 128).hit_tokens == 48
    s = ctl(mitm, "stats")
    assert s[direction]["duplicated"] == 1
    # a duplicated request is answered twice by the server; a duplicated reply once
    assert mitm["server"].counters["requests"] - server_before == (2 if direction == "request" else 1)
    assert s["reply"]["seen"] == (2 if direction == "request" else 1)


# Regression test for a defect this interposer found in the hardened client: a plain REQ socket
# only drops stale replies already queued when it sends, so a duplicate arriving after the next
# send was taken as that call's answer and the client stayed one answer behind (444-476 of 500
# wrong with every message duplicated). Fixed with REQ_CORRELATE + REQ_RELAXED and a re-poll when
# libzmq discards a stale reply. The timing below is forced by the rules: deterministic.
@pytest.mark.timeout(20)
@pytest.mark.parametrize("direction", ["request", "reply"])
def test_late_duplicate_is_never_taken_for_the_next_answer(mitm, direction):
    """A second answer to call 1 that arrives while call 2 is waiting must not be returned as
    call 2's answer. Message 1 is duplicated with a 100 ms gap (a duplicated request makes the
    server answer twice); the second reply the interposer sees (call 2's own) is held 250 ms, so
    the stale answer reaches the client first."""
    set_rules(mitm,
              {"direction": direction, "action": "duplicate", "gap": "100ms", "match": {"nth": 1}},
              {"direction": "reply", "action": "delay", "delay": "250ms", "match": {"nth": 2}})
    with LookupClient(mitm["listen"], timeout_ms=1000) as c:
        first = timed_lookup(c, FULL)[0]
        second = timed_lookup(c, PARTIAL)[0]
        outcome = c.last_outcome
    assert first == 128
    assert ctl(mitm, "stats")[direction]["duplicated"] == 1
    assert (second, outcome) == (48, "ok"), f"got {second} ({outcome}); 128 is the stale duplicate"


# --------------------------------------------------------------------------- truncate / rewrite


@pytest.mark.timeout(20)
@pytest.mark.parametrize("rule, outcome, code", [
    ({"direction": "reply", "action": "truncate", "truncate_bytes": 3}, "protocol", "BAD_REPLY"),
    ({"direction": "reply", "action": "truncate", "truncate_bytes": 0}, "protocol", "EMPTY_REPLY"),
    ({"direction": "request", "action": "truncate", "truncate_bytes": 2}, "server_error", "BAD_MSGPACK"),
    ({"direction": "request", "action": "truncate", "truncate_bytes": 3, "truncate_frame": 0},
     "server_error", "BAD_INT_FRAME"),
    ({"direction": "reply", "action": "rewrite", "rewrite": {"named": "version2"}}, "protocol", "UNSUPPORTED_VERSION"),
    ({"direction": "reply", "action": "rewrite", "rewrite": {"named": "hit_over"}}, "protocol", "HIT_OUT_OF_RANGE"),
    ({"direction": "reply", "action": "rewrite", "rewrite": {"named": "legacy4"}}, "protocol", "LEGACY_REPLY"),
    ({"direction": "reply", "action": "rewrite", "rewrite": {"named": "two_frames"}}, "protocol", "EXTRA_FRAMES"),
    ({"direction": "reply", "action": "rewrite", "rewrite": {"bytes_hex": "c1c1c1c1c1"}}, "protocol", "BAD_REPLY"),
    ({"direction": "request", "action": "rewrite", "rewrite": {"frame": 1, "bytes_hex": "9105"}},
     "server_error", "BAD_GROUP_IDS"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_truncate_and_rewrite_fail_open_fast(mitm, client, rule, outcome, code):
    hit, elapsed = timed_lookup(client, FULL)
    assert hit == 128  # no rule yet
    set_rules(mitm, rule)
    hit, elapsed = timed_lookup(client, FULL)
    assert (hit, client.last_outcome, client.last_code) == (0, outcome, code)
    assert elapsed < DEADLINE_MS / 1000 + TOLERANCE_S  # bounded; "protocol" shows it was not waited out
    s = ctl(mitm, "stats")
    key = "truncated" if rule["action"] == "truncate" else "rewritten"
    assert s[rule["direction"]][key] == 1
    ctl(mitm, "clear_rules")
    assert timed_lookup(client, PARTIAL)[0] == 48


# --------------------------------------------------------------------------- matching


VERSION2 = {"direction": "reply", "action": "rewrite", "rewrite": {"named": "version2"}}


def outcomes(client: LookupClient, n: int) -> list[str]:
    out = []
    for _ in range(n):
        hit, _ = timed_lookup(client, FULL)
        out.append(client.last_outcome)
        assert hit == (128 if client.last_outcome == "ok" else 0)
    return out


@pytest.mark.timeout(20)
def test_nth_and_every_nth_match_exactly_those_messages(mitm, client):
    set_rules(mitm, {**VERSION2, "match": {"nth": 3}})
    assert outcomes(client, 6) == ["ok", "ok", "protocol", "ok", "ok", "ok"]
    set_rules(mitm, {**VERSION2, "match": {"every_nth": 2}})
    assert outcomes(client, 6) == ["ok", "protocol"] * 3
    rules = ctl(mitm, "stats")["rules"]
    assert [(r["seen"], r["matched"]) for r in rules] == [(6, 3)]


@pytest.mark.timeout(20)
def test_probability_is_seeded_and_repeatable(mitm, client):
    n, p, seed = 30, 0.4, 11
    rng = random.Random(seed)  # documented: one draw per message the rule sees
    want = ["protocol" if rng.random() < p else "ok" for _ in range(n)]
    assert 0 < want.count("protocol") < n  # the seed gives a real mix
    set_rules(mitm, {**VERSION2, "match": {"probability": p}, "seed": seed})
    first = outcomes(client, n)
    set_rules(mitm, {**VERSION2, "match": {"probability": p}, "seed": seed})  # resets the draws
    second = outcomes(client, n)
    assert first == want and second == want
    assert ctl(mitm, "stats")["reply"]["rewritten"] == 2 * want.count("protocol")


@pytest.mark.timeout(20)
def test_rules_compose_in_order_and_add_remove_by_id(mitm, client):
    # delay then rewrite on the same message: slow AND broken.
    set_rules(mitm, {"direction": "reply", "action": "delay", "delay": "50ms"}, VERSION2)
    hit, elapsed = timed_lookup(client, FULL)
    assert (hit, client.last_code) == (0, "UNSUPPORTED_VERSION") and elapsed >= 0.05
    # rules owned by id: removing one leaves the other
    ctl(mitm, "clear_rules")
    ctl(mitm, "add_rule", id="a", rule={"direction": "reply", "action": "delay", "delay": "50ms"})
    ctl(mitm, "add_rule", id="b", rule=VERSION2)
    assert ctl(mitm, "remove_rule", id="b") == {"ok": True, "removed": True, "rules": 1}
    hit, elapsed = timed_lookup(client, FULL)
    assert (hit, client.last_outcome) == (128, "ok") and elapsed >= 0.05
    assert ctl(mitm, "remove_rule", id="b")["removed"] is False


@pytest.mark.timeout(20)
def test_bad_rules_on_control_are_refused_precisely_and_change_nothing(mitm, client):
    set_rules(mitm, VERSION2)
    with pytest.raises(ControlError, match=r"rules\[1\]: match.nth: Input should be greater than or equal to 1"):
        ctl(mitm, "set_rules", rules=[VERSION2, {**VERSION2, "match": {"nth": 0}}])
    with pytest.raises(ControlError, match=r"rules\[0\]: delay: only used with action 'delay', not 'drop'"):
        ctl(mitm, "set_rules", rules=[{"direction": "reply", "action": "drop", "delay": "1s"}])
    with pytest.raises(ControlError, match=r"rule: rewrite.named: only for direction 'reply'"):
        ctl(mitm, "add_rule", id="x", rule={"direction": "request", "action": "rewrite",
                                           "rewrite": {"named": "legacy4"}})
    # a name the codec does not have: refused with the known ones, on set_rules and add_rule
    with pytest.raises(ControlError, match=r"rules\[1\]: rewrite.named: unknown named rewrite 'v3' "
                                           r"\(codec families.lookup.wire knows: empty, two_frames, "):
        ctl(mitm, "set_rules", rules=[VERSION2, {**VERSION2, "rewrite": {"named": "v3"}}])
    with pytest.raises(ControlError, match=r"rule: rewrite.named: unknown named rewrite 'v3' .*legacy4\)"):
        ctl(mitm, "add_rule", id="x", rule={**VERSION2, "rewrite": {"named": "v3"}})
    with pytest.raises(ControlError, match=r"rule: rewrite.named: String should match pattern"):
        ctl(mitm, "add_rule", id="x", rule={**VERSION2, "rewrite": {"named": "not a name"}})
    assert len(ctl(mitm, "stats")["rules"]) == 1
    timed_lookup(client, FULL)
    assert client.last_code == "UNSUPPORTED_VERSION"  # the old rule is still the one in force


@pytest.mark.timeout(30)
def test_without_a_codec_named_rewrites_are_refused_and_the_rest_works():
    """The interposer knows no protocol: without --codec a named rewrite is refused (at start and
    on the control channel), while byte-level rules still work."""
    workdir = tempfile.mkdtemp(prefix="pdc")
    upstream, listen, control = f"ipc://{workdir}/srv", f"ipc://{workdir}/mitm", f"ipc://{workdir}/ctl"
    backend = MemoryBackend(block_size=BLOCK, groups=1)
    backend.put([h.hex() for h in PRELOADED])
    server = LookupServer(upstream, backend).start()
    node = None
    try:
        bad = subprocess.run([sys.executable, "-m", "harness.cli", "node", "interposer", "--listen",
                              f"ipc://{workdir}/bad", "--upstream", upstream, "--rules", json.dumps([VERSION2])],
                             capture_output=True, text=True, timeout=30)
        assert bad.returncode == 2
        assert bad.stderr.strip() == ("error: --rules: rules[0]: rewrite.named: 'version2' needs a codec; "
                                      "this interposer was started without --codec MODULE")
        bad = subprocess.run([sys.executable, "-m", "harness.cli", "node", "interposer", "--listen",
                              f"ipc://{workdir}/bad", "--upstream", upstream, "--codec", "no_such_codec_mod"],
                             capture_output=True, text=True, timeout=30)
        assert bad.returncode == 2 and bad.stderr.startswith("error: --codec: cannot import 'no_such_codec_mod'")
        assert "Traceback" not in bad.stderr
        node = Node("interposer", ["--listen", listen, "--upstream", upstream, "--control", control], workdir)
        node.wait_ready()
        with pytest.raises(ControlError, match=r"rule: rewrite.named: 'version2' needs a codec"):
            control_call(control, "add_rule", id="x", rule=VERSION2)
        assert control_call(control, "stats")["rules"] == []
        control_call(control, "add_rule", id="y", rule={"direction": "reply", "action": "rewrite",
                                                       "rewrite": {"bytes_hex": "c1"}})
        with LookupClient(listen, timeout_ms=DEADLINE_MS) as c:
            assert c.lookup(128, PRELOADED) == 0 and c.last_code == "BAD_REPLY"
            control_call(control, "remove_rule", id="y")
            assert c.lookup(128, PRELOADED) == 128
    finally:
        if node is not None:
            assert node.stop() == 0
        server.close()
        backend.close()
        shutil.rmtree(workdir, ignore_errors=True)


# --------------------------------------------------------------------------- node lifecycle


@pytest.mark.timeout(30)
def test_node_rules_at_start_sigterm_and_bad_input():
    workdir = tempfile.mkdtemp(prefix="pdc")
    upstream, listen = f"ipc://{workdir}/srv", f"ipc://{workdir}/mitm"
    backend = MemoryBackend(block_size=BLOCK, groups=1)
    backend.put([h.hex() for h in PRELOADED])
    server = LookupServer(upstream, backend).start()
    rules_file = os.path.join(workdir, "rules.json")
    with open(rules_file, "w") as fh:
        json.dump({"rules": [VERSION2 | {"match": {"nth": 1}}]}, fh)
    bad = [
        (["--rules", '[{"direction": "reply", "action": "delay"}]'],
         "--rules: rules[0]: action delay needs delay > 0"),
        (["--rules", "[1"], "--rules: not JSON (line 1, column 3"),
        (["--rules", '[{"direction": "sideways", "action": "drop"}]'], "rules[0]: direction: Input should be"),
        (["--upstream", "tcp://192.0.2.1:5555"], "--upstream: 'tcp://192.0.2.1:5555' is not on loopback"),
        ([*CODEC, "--rules", json.dumps([{**VERSION2, "rewrite": {"named": "v3"}}])],
         "--rules: rules[0]: rewrite.named: unknown named rewrite 'v3' (codec families.lookup.wire knows: "),
    ]
    procs = []
    node = None
    try:
        for extra, _ in bad:
            args = {"--listen": f"ipc://{workdir}/bad{len(procs)}", "--upstream": upstream}
            for i in range(0, len(extra), 2):
                args[extra[i]] = extra[i + 1]
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "harness.cli", "node", "interposer", *sum(args.items(), ())],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        node = Node("interposer", ["--listen", listen, "--upstream", upstream, "--rules", "@" + rules_file, *CODEC],
                    workdir)
        node.wait_ready()
        with LookupClient(listen, timeout_ms=DEADLINE_MS) as c:
            assert c.lookup(128, PRELOADED) == 0 and c.last_code == "UNSUPPORTED_VERSION"
            assert c.lookup(128, PRELOADED) == 128
        assert os.path.exists(f"{workdir}/mitm")
        assert node.stop(signal.SIGTERM) == 0
        assert not os.path.exists(f"{workdir}/mitm")  # its ipc file is removed
        for proc, (_, message) in zip(procs, bad):
            out, err = proc.communicate(timeout=30)
            assert proc.returncode == 2, err
            assert err.startswith("error: ") and message in err, err
            assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
        if node is not None:
            node.stop(signal.SIGKILL)
        server.close()
        backend.close()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.timeout(30)
def test_upstream_connections_follow_the_clients():
    """Every failed lookup rebuilds the client's REQ socket (a new identity). When a client closes,
    the interposer closes its upstream socket too, so the server's open fds return to their
    baseline (what the no_leaks check measures) long before the idle timeout; and at most
    --max-clients upstream sockets are kept."""
    workdir = tempfile.mkdtemp(prefix="pdc")
    upstream, listen = f"ipc://{workdir}/srv", f"ipc://{workdir}/mitm"
    srv_ctl, mitm_ctl = f"ipc://{workdir}/srv.ctl", f"ipc://{workdir}/mitm.ctl"
    preload = os.path.join(workdir, "preload.txt")
    with open(preload, "w") as fh:
        fh.write("".join(h.hex() + "\n" for h in PRELOADED))
    server = Node("lookup-server", ["--endpoint", upstream, "--control", srv_ctl, "--preload", preload], workdir)
    node = Node("interposer", ["--listen", listen, "--upstream", upstream, "--control", mitm_ctl,
                               "--max-clients", "3", "--idle-timeout-ms", "60000"], workdir)
    clients: list[LookupClient] = []
    try:
        server.wait_ready()
        node.wait_ready()
        baseline = control_call(srv_ctl, "stats")["fds"]
        # 10 clients one after the other, each closed after its lookup (as a rebuild does)
        for _ in range(10):
            with LookupClient(listen, timeout_ms=1000) as c:
                assert c.lookup(128, PRELOADED) == 128
        deadline = time.monotonic() + 3
        while control_call(mitm_ctl, "stats")["clients"] and time.monotonic() < deadline:
            time.sleep(0.05)
        s = control_call(mitm_ctl, "stats")
        assert s["clients"] == 0 and s["clients_gone"] + s["clients_evicted"] == 10
        assert control_call(srv_ctl, "stats")["fds"] == baseline
        # 5 clients open at once: only 3 upstream sockets are kept, and every answer stays right
        clients = [LookupClient(listen, timeout_ms=1000) for _ in range(5)]
        for i, c in enumerate(clients):
            assert c.lookup(128, PRELOADED[: i + 1]) == 16 * (i + 1)
        s = control_call(mitm_ctl, "stats")
        assert s["clients"] == 3 and s["clients_evicted"] >= 2
    finally:
        for c in clients:
            c.close()
        assert node.stop() == 0
        assert server.stop() == 0
        shutil.rmtree(workdir, ignore_errors=True)
