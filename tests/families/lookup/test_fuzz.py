"""``pdchaos fuzz lookup`` against real server processes, and the generator's oracle.

Real parts only: the servers are ``pdchaos node lookup-server`` / ``legacy-server`` processes on
ipc endpoints, the fuzzer runs as ``python -m harness.cli`` in its own process.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from collections import Counter

import pytest

from connector_patch.lookup.protocol import RESET_FRAME, Limits, ProtocolError, decode_request
from families.lookup.fuzzgen import FrameGen
from harness.procs import start_node

BLOCK = 16
N_PRELOAD = 8


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def _fuzz_json(endpoint: str, *extra: str) -> tuple[int, dict]:
    r = _cli("fuzz", "lookup", "--endpoint", endpoint, "--json", *extra)
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1, r.stdout  # one JSON object, nothing else on stdout
    return r.returncode, json.loads(lines[0])


@pytest.fixture
def workdir(short_tmp):
    """A short work folder (conftest short_tmp)."""
    return short_tmp


def _preload(workdir: str) -> str:
    path = os.path.join(workdir, "preload.txt")
    rng = random.Random(99)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(rng.randbytes(32).hex() for _ in range(N_PRELOAD)) + "\n")
    return path


@pytest.fixture
def server(workdir):
    """A hardened lookup server process holding N_PRELOAD preloaded hashes."""
    preload = _preload(workdir)
    ep = f"ipc://{workdir}/hardened"
    h = start_node("lookup-server", ["--endpoint", ep, "--preload", preload, "--block-size", str(BLOCK),
                                     "--log-level", "ERROR"], log_path=os.path.join(workdir, "server.log"))
    try:
        yield ep, preload, h
    finally:
        h.stop(5.0)


# --------------------------------------------------------------------------- live runs
@pytest.mark.timeout(60)
def test_every_request_answered_once_and_server_alive(server):
    ep, _, proc = server
    rc, s = _fuzz_json(ep, "--requests", "2000", "--seed", "7")
    assert rc == 0, s["reasons"]
    assert s["passed"] is True and s["reasons"] == []
    assert s["sent"] == s["answered"] == 2000
    assert s["unanswered"] == 0 and s["late"] == 0 and s["duplicates"] == 0 and s["unmatched"] == 0
    assert s["invalid_replies"] == 0 and s["mismatches"] == 0
    assert s["alive"] is True and s["alive_at_start"] is True
    assert s["checks"] == {"miss": True, "hbm": True}
    assert s["ok"] + s["errors"] == s["answered"]
    assert sum(s["errors_by_code"].values()) == s["errors"]
    # the mix really exercised the validator: many codes, valid requests and resets
    for code in ("BAD_FRAME_COUNT", "BAD_INT_FRAME", "BAD_MSGPACK", "BAD_GROUP_IDS", "BAD_HASHES",
                 "BAD_TOKEN_LEN", "BAD_HBM_HIT_TOKENS"):
        assert s["errors_by_code"].get(code, 0) > 0, code
    assert s["sent_by_kind"]["valid"] > 200 and s["resets_sent"] > 0
    assert sum(s["sent_by_kind"].values()) == s["sent"]
    assert proc.alive  # the server process too, not only its answers

    # same seed, same stream: the same kinds, codes and ok count again
    rc2, s2 = _fuzz_json(ep, "--requests", "2000", "--seed", "7")
    assert rc2 == 0
    for key in ("sent_by_kind", "errors_by_code", "ok", "resets_sent"):
        assert s2[key] == s[key], key
    rc3, s3 = _fuzz_json(ep, "--requests", "2000", "--seed", "8")
    assert rc3 == 0 and s3["sent_by_kind"] != s["sent_by_kind"]


@pytest.mark.timeout(60)
def test_preload_check_and_no_resets(server):
    ep, preload, _ = server
    ok_len = N_PRELOAD * BLOCK
    rc, s = _fuzz_json(ep, "--requests", "500", "--seed", "3", "--check-hashes-file", preload,
                       "--check-token-len", str(ok_len))
    assert rc == 0, s["reasons"]
    assert s["checks"] == {"miss": True, "hbm": True, "preload": True}
    assert s["reset_enabled"] is False and s["resets_sent"] == 0  # a reset would clear the preload

    # The check can fail: one block more than was preloaded cannot be a full hit.
    rc, s = _fuzz_json(ep, "--requests", "100", "--seed", "3", "--check-hashes-file", preload,
                       "--check-token-len", str(ok_len + BLOCK))
    assert rc == 1
    assert s["alive"] is False and s["checks"]["preload"] is False
    assert s["answered"] == s["sent"] == 100  # the server itself was fine
    assert "server not alive at the end" in s["reasons"]


@pytest.mark.timeout(60)
def test_text_output_is_a_table_and_quiet_without_a_tty(server):
    ep, _, _ = server
    r = _cli("fuzz", "lookup", "--endpoint", ep, "--requests", "300", "--seed", "1", "--no-reset")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stderr == ""  # no progress bar, no log lines when not a terminal
    out = r.stdout
    for label in ("sent", "answered", "unanswered", "duplicates", "ok replies", "errors by code:",
                  "alive at end", "result: PASS"):
        assert label in out, label
    assert re.search(r"^\s*resets sent\s+0$", out, re.M)  # --no-reset
    assert re.search(r"^\s*answered\s+300$", out, re.M)


@pytest.mark.timeout(60)
def test_detects_the_legacy_server_dying(workdir):
    """The legacy model's serving thread dies on the first malformed request: the fuzzer must see
    unanswered requests and a dead server, and exit 1."""
    ep = f"ipc://{workdir}/legacy"
    h = start_node("legacy-server", ["--endpoint", ep], log_path=os.path.join(workdir, "legacy.log"))
    try:
        rc, s = _fuzz_json(ep, "--requests", "2000", "--seed", "7", "--timeout-ms", "200")
    finally:
        h.stop(5.0)
    assert rc == 1
    assert s["unanswered"] > 0
    assert s["alive"] is False
    assert s["answered"] < s["sent"]
    assert s["stopped_early"] is True and s["sent"] + s["not_sent"] == 2000
    assert s["passed"] is False
    assert "server not alive at the end" in s["reasons"]


@pytest.mark.timeout(30)
def test_detects_a_silent_endpoint(workdir):
    rc, s = _fuzz_json(f"ipc://{workdir}/nobody", "--requests", "1000", "--timeout-ms", "150")
    assert rc == 1
    assert s["answered"] == 0 and s["unanswered"] == s["sent"] > 0
    assert s["alive"] is False and s["alive_at_start"] is False


@pytest.mark.timeout(60)
def test_detects_replies_that_disagree_with_the_request(workdir):
    """A server with 2 groups accepts group id 1, which the fuzzer (told --groups 1) sends as a
    bad id: those ok replies must be reported as mismatches and fail the run."""
    ep = f"ipc://{workdir}/two-groups"
    h = start_node("lookup-server", ["--endpoint", ep, "--groups", "2", "--log-level", "ERROR"],
                   log_path=os.path.join(workdir, "s.log"))
    try:
        rc, s = _fuzz_json(ep, "--requests", "1500", "--seed", "11", "--groups", "1")
    finally:
        h.stop(5.0)
    assert s["answered"] == s["sent"] == 1500 and s["alive"] is True
    assert s["mismatches_by_kind"].get("bad_group_ids", 0) > 0
    assert rc == 1 and s["passed"] is False


@pytest.mark.timeout(30)
@pytest.mark.parametrize("args, what", [
    (["--endpoint", "tcp://10.1.2.3:5555", "--requests", "10"], "--endpoint"),
    (["--endpoint", "ipc:///nonexistent-pdc-dir/s", "--requests", "10"], "--endpoint"),
    (["--endpoint", "ipc:///tmp/pdc-x", "--requests", "0"], "--requests"),
    (["--endpoint", "ipc:///tmp/pdc-x", "--requests", "10", "--timeout-ms", "-5"], "--timeout-ms"),
    (["--endpoint", "ipc:///tmp/pdc-x", "--requests", "10", "--window", "5000"], "--window"),
    (["--endpoint", "ipc:///tmp/pdc-x", "--requests", "10", "--check-token-len", "16"], "--check-hashes-file"),
    (["--endpoint", "ipc:///tmp/pdc-x", "--requests", "10", "--check-hashes-file", "/nonexistent-pdc/f",
      "--check-token-len", "16"], "--check-hashes-file"),
    (["--endpoint", "ipc:///tmp/pdc-x", "--requests", "ten"], "--requests"),
])
def test_bad_input_exits_2_with_one_line(args, what):
    r = _cli("fuzz", "lookup", *args)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and what in lines[0], r.stderr
    assert r.stdout == ""


@pytest.mark.timeout(30)
def test_unknown_family_exits_2():
    r = _cli("fuzz", "nothing", "--endpoint", "ipc:///tmp/pdc-x", "--requests", "1")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "unknown family 'nothing'" in r.stderr


# --------------------------------------------------------------------------- the generator
@pytest.mark.timeout(30)
@pytest.mark.parametrize("groups", [1, 3])
def test_generator_expectations_agree_with_the_protocol(groups):
    """Every case's declared expectation is what protocol v1's validator says: the fuzzer's oracle
    cannot drift from DESIGN.md's rules unnoticed."""
    gen = FrameGen(1234 + groups, groups=groups)
    limits = Limits(num_groups=groups)
    kinds: Counter = Counter()
    disagreements: Counter = Counter()
    for _ in range(5000):
        case = gen.next()
        kinds[case.kind] += 1
        assert case.frames and all(isinstance(f, bytes) for f in case.frames)
        assert case.expect in ("ok", "error", "any")
        if case.frames == [RESET_FRAME]:
            assert case.expect == "ok"
            continue
        try:
            req = decode_request(case.frames, limits)
            got = None
        except ProtocolError as exc:
            got = exc.code
        if case.expect == "ok":
            if got is not None:
                disagreements[(case.kind, "ok", got)] += 1
            else:
                assert case.token_len == req.token_len
        elif case.expect == "error" and (got is None or (case.code and got != case.code)):
            disagreements[(case.kind, case.code, got)] += 1
    assert not disagreements, disagreements
    assert set(kinds) == set(gen.kinds), set(gen.kinds) - set(kinds)  # every generator ran


@pytest.mark.timeout(30)
def test_generator_is_deterministic_per_seed():
    a, b, c = FrameGen(5), FrameGen(5), FrameGen(6)
    seq_a = [a.next() for _ in range(400)]
    assert seq_a == [b.next() for _ in range(400)]
    assert seq_a != [c.next() for _ in range(400)]
    no_reset = FrameGen(5, allow_reset=False)
    assert all(case.kind != "reset" for case in (no_reset.next() for _ in range(3000)))
