"""The layerwise family without the conformance env: its scenarios validate, its checks judge
hand-made histories, its metaserver (a real HTTP server and control channel) behaves per mode, and
bad input to its nodes is one clear error. tests/families/layerwise/test_layerwise_env.py runs the real connector."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness import checks as C
from harness.family import get_family
from harness.topology import free_tcp_port

ROOT = Path(__file__).resolve().parents[3]
FAM = get_family("layerwise")
CHECKS = C.checks_for(FAM)
T0 = 100.0
SCENARIOS = sorted((ROOT / "scenarios" / "ascend-cpu").glob("layerwise-*.yaml"))


def op(i: int, t: float, *, phase="ok", value="done", outcome="ok", elapsed_ms=50.0, blocks=4, reported=0) -> list:
    return [{"type": "op", "id": i, "process": 0, "f": "transfer", "phase": "invoke", "t": T0 + t,
             "expected": "done"},
            {"type": "op", "id": i, "process": 0, "f": "transfer", "phase": phase, "t": T0 + t + elapsed_ms / 1000,
             "value": value, "outcome": outcome, "elapsed_ms": elapsed_ms, "blocks": blocks,
             "blocks_reported": reported}]


def meta() -> dict:
    return {"type": "meta", "family": "layerwise", "target": "hardened", "deadline_ms": 3000.0,
            "tolerance_ms": 1000.0, "t0": T0, "primary_ops": ["transfer"]}


def run(name: str, records: list) -> C.CheckResult:
    return CHECKS[name](C.CheckInput([meta()] + records), {})


def test_the_scenarios_validate():
    assert len(SCENARIOS) >= 6
    for path in SCENARIOS:
        out = subprocess.run([sys.executable, "-m", "harness.cli", "validate", str(path)], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr


def test_left_waiting_passes_done_and_reported_failures():
    r = run("left_waiting", op(1, 0) + op(2, 1, phase="fail", value="failed", outcome="failed_load", reported=4))
    assert r.ok, r.message


def test_left_waiting_fails_a_request_still_waiting_and_says_blocks_were_reported():
    r = run("left_waiting", op(1, 0) + op(2, 1, phase="info", value="waiting", outcome="stalled", elapsed_ms=4500,
                                          reported=4))
    assert r.ok is False and "WAITING_FOR_REMOTE_KVS" in r.message and "blocks reported" in r.message


def test_left_waiting_fails_a_failure_with_blocks_unreported():
    r = run("left_waiting", op(1, 0, phase="fail", value="failed", outcome="failed_load", reported=1))
    assert r.ok is False and "unreported" in r.message


def test_left_waiting_fails_an_empty_history():
    assert run("left_waiting", []).ok is False


def probe(kind: str, answered: bool, tries: int, reply=None) -> dict:
    return {"type": "event", "what": "listener_probe", "t": T0 + 1, "probe": kind, "answered": answered,
            "tries": tries, "reply": reply, "elapsed_ms": 3.0 if answered else 3300.0}


def test_listener_answers():
    good = [probe("not_msgpack", True, 1, "NACK_MALFORMED"), probe("unknown_type", True, 1, "NACK_UNKNOWN_MSG")]
    assert run("listener_answers", good).ok
    bad = good + [probe("missing_fields", False, 3)]
    r = run("listener_answers", bad)
    assert r.ok is False and "missing_fields" in r.message and "never answered" in r.message
    assert run("listener_answers", []).ok is False


def test_no_leaks_is_not_applicable_and_listener_answers_only_with_its_fault():
    from harness.schema import load_scenario

    s = load_scenario(ROOT / "scenarios" / "ascend-cpu" / "layerwise-baseline.yaml")
    na = FAM.not_applicable(s, "upstream")
    assert "no_leaks" in na and "listener_answers" in na
    g = load_scenario(ROOT / "scenarios" / "ascend-cpu" / "layerwise-listener-garbage.yaml")
    assert "listener_answers" not in FAM.not_applicable(g, "hardened")


def test_unavailable_names_the_setup_step_when_the_env_is_missing(monkeypatch):
    from stacks.ascend_cpu import steps

    monkeypatch.setattr(steps.AscendStackStep, "check", lambda self: None)
    why = FAM.unavailable(None)
    assert why and "pdchaos setup" in why


def node(kind: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PDCHAOS_FAMILY="layerwise")
    return subprocess.run([sys.executable, "-m", "harness.cli", "node", kind, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("kind, args, what", [
    ("layerwise-decode", ["--impl", "upstream", "--kv-port", "80", "--dist-port", "30000",
                          "--metaserver", "http://127.0.0.1:1/x"], "--kv-port"),
    ("layerwise-decode", ["--impl", "upstream", "--kv-port", "30000", "--dist-port", "30001",
                          "--metaserver", "http://10.0.0.1:1/x"], "--metaserver"),
    ("layerwise-metaserver", ["--port", "30000", "--prefill-control", "tcp://127.0.0.1:1"], "--prefill-control"),
])
def test_bad_node_input_is_one_clear_error(kind, args, what):
    out = node(kind, *args)
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and what in lines[0], out.stderr
    assert "Traceback" not in out.stderr + out.stdout


class FakePrefill:
    """P's control channel as the metaserver sees it: records what it is given (no real P here)."""

    def __init__(self, endpoint: str):
        from nodekit.control import ControlServer

        self.got: list[dict] = []
        self.server = ControlServer(endpoint, handlers={"submit": self.submit}).start()

    def submit(self, m: dict) -> dict:
        self.got.append(m["params"])
        return {"queued": True}


def post(port: int, body: dict, timeout: float = 3.0) -> tuple[int | None, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/metaserver", body=json.dumps(body), headers={"content-type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    except (TimeoutError, OSError, http.client.HTTPException) as exc:
        return None, type(exc).__name__
    finally:
        conn.close()


@pytest.mark.timeout(60)
def test_metaserver_forwards_and_fails_per_mode(tmp_path):
    from families.layerwise.metaserver import Metaserver

    fake = FakePrefill(f"ipc://{tmp_path}/p.sock")
    port = free_tcp_port()
    ms = Metaserver(port, f"ipc://{tmp_path}/p.sock", "127.0.0.1:4242")
    ms.bind()
    try:
        assert post(port, {"request_id": "r1", "remote_port": 1})[0] == 200
        assert fake.got == [{"request_id": "r1", "remote_port": 4242, "remote_host": "127.0.0.1"}]
        ms.set_mode("error")
        assert post(port, {"request_id": "r2"})[0] == 500
        ms.set_mode("drop")
        assert post(port, {"request_id": "r3"})[0] is None
        ms.set_mode("hang")
        t0 = time.monotonic()
        assert post(port, {"request_id": "r4"}, timeout=0.5) == (None, "TimeoutError")
        assert 0.4 < time.monotonic() - t0 < 2.0
        healed = threading.Timer(0.3, ms.set_mode, args=("ok",))
        healed.start()
        assert post(port, {"request_id": "r5"}, timeout=3.0)[0] is None  # held, then closed unanswered
        assert post(port, {"request_id": "r6"})[0] == 200
        assert [p["request_id"] for p in fake.got] == ["r1", "r6"]
        assert ms.counters["answered_500"] == 1 and ms.counters["hung"] == 2 and ms.counters["dropped"] == 1
        assert ms.counters["repeat_posts"] == 0
        assert post(port, {"request_id": "r4"})[0] == 200  # D POSTs r4 again: counted (post_once)
        assert ms.counters["repeat_posts"] == 1 and ms.counters["posts"] == 7
    finally:
        ms.close()
        fake.server.close()


class TicketPrefill(FakePrefill):
    """P's control channel with tickets: a request is done ``done_after_s`` after it was queued;
    ``refuse`` makes every submit fail (queued: False)."""

    def __init__(self, endpoint: str, done_after_s: float):
        from nodekit.control import ControlServer

        self.got, self.refuse, self.done_after_s, self.queued_at = [], False, done_after_s, {}
        self.server = ControlServer(endpoint, handlers={"submit": self.submit, "forwarded": self.forwarded}).start()

    def submit(self, m: dict) -> dict:
        self.got.append(m["params"])
        if self.refuse:
            return {"queued": False}
        self.queued_at[len(self.got)] = time.monotonic()
        return {"queued": True, "ticket": len(self.got)}

    def forwarded(self, m: dict) -> dict:
        done = time.monotonic() - self.queued_at[int(m["ticket"])] >= self.done_after_s
        return {"done": done, "sent": done}


@pytest.mark.timeout(60)
def test_metaserver_as_the_example_proxy_waits_for_p_resends_and_always_answers_200(tmp_path):
    """vllm-ascend 0.23.0's example proxy: the POST's answer waits for P's completion; a failed
    forward is sent again (3 tries, 0.2 s then 0.4 s apart) and the answer is 200 anyway."""
    from families.layerwise.metaserver import Metaserver

    fake = TicketPrefill(f"ipc://{tmp_path}/p.sock", done_after_s=0.5)
    port = free_tcp_port()
    ms = Metaserver(port, f"ipc://{tmp_path}/p.sock", "", behaviour="upstream-example")
    ms.bind()
    try:
        t0 = time.monotonic()
        assert post(port, {"request_id": "r1"})[0] == 200
        assert 0.45 <= time.monotonic() - t0 < 2.0  # answered when P was done, not when it queued
        fake.refuse = True
        t0 = time.monotonic()
        assert post(port, {"request_id": "r2"}) == (200, "null")  # nothing reached P: still 200
        assert 0.55 <= time.monotonic() - t0 < 2.5
        assert [p["request_id"] for p in fake.got] == ["r1", "r2", "r2", "r2"]  # sent three times
        ms.set_mode("forward_fails")
        assert post(port, {"request_id": "r3"}) == (200, "null")
        assert len(fake.got) == 4  # never reached P
        c = ms.counters
        assert c["resent"] == 4 and c["ok_after_failed_forward"] == 2 and c["forwarded"] == 1
    finally:
        ms.close()
        fake.server.close()


@pytest.mark.timeout(60)
def test_metaserver_answers_a_failed_forward_502_by_default(tmp_path):
    from families.layerwise.metaserver import Metaserver

    fake = TicketPrefill(f"ipc://{tmp_path}/p.sock", done_after_s=0.0)
    port = free_tcp_port()
    ms = Metaserver(port, f"ipc://{tmp_path}/p.sock", "")
    ms.bind()
    try:
        ms.set_mode("forward_fails")
        assert post(port, {"request_id": "r1"})[0] == 502
        assert fake.got == []
        ms.set_mode("ok")
        fake.refuse = True
        assert post(port, {"request_id": "r2"})[0] == 502 and len(fake.got) == 1  # tried once
    finally:
        ms.close()
        fake.server.close()


def _final(node: str, counters: dict) -> dict:
    return {"type": "probe", "node": node, "when": "final", "t": T0 + 9, "pid": 1, "counters": counters}


@pytest.mark.parametrize("counters, ok, says", [
    ({"posts": 12, "repeat_posts": 0}, True, "none repeated"),
    ({"posts": 13, "repeat_posts": 1}, False, "1 of 13 POSTs repeated"),
    ({"posts": 12}, False, "no consistent post counters"),
    (None, False, "no final probe of the metaserver"),
])
def test_post_once_judges_the_metaservers_repeat_count(counters, ok, says):
    r = run("post_once", op(1, 0.1) + ([_final("metaserver", counters)] if counters is not None else []))
    assert r.ok is ok and says in r.message, r.message


@pytest.mark.parametrize("counters, ok, says", [
    ({"free_blocks": 31, "blocks_initial": 31, "blocks_live": 0}, True, "every block back"),
    ({"free_blocks": 27, "blocks_initial": 31, "blocks_live": 4}, True, "every block back"),
    ({"free_blocks": 27, "blocks_initial": 31, "blocks_live": 0, "blocks_held_finished": 4}, False,
     "4 of 31 KV blocks"),
    ({"free_blocks": 31}, False, "no block-pool counters"),
])
def test_blocks_returned_counts_blocks_neither_free_nor_held_by_a_live_request(counters, ok, says):
    base = dict(_final("decode", {"blocks_initial": 31, "free_blocks": 31, "blocks_live": 0}), when="baseline", t=T0)
    r = run("blocks_returned", op(1, 0.1) + [base, _final("decode", counters)])
    assert r.ok is ok and says in r.message, r.message


def test_the_launch_profile_takes_only_a_hardened_class_and_a_plugin_folder(tmp_path):
    from harness.errors import UsageError

    p = FAM.load_profile(None, [])
    assert p.name == "cpu" and p.hardened_class is None and p.plugin_path is None
    m = FAM.load_profile("cpu", ["hardened_class=pkg.mod:Cls", f"plugin_path={tmp_path}"])
    assert (m.hardened_class, m.plugin_path) == ("pkg.mod:Cls", str(tmp_path))
    for bad, what in ((["nosuch=1"], "takes KEY=VALUE"), (["hardened_class=nocolon"], "not module:Class"),
                      (["plugin_path=relative"], "not an absolute path"),
                      ([f"plugin_path={tmp_path / 'missing'}"], "not an absolute path")):
        with pytest.raises(UsageError, match=what):
            FAM.load_profile(None, bad)
    with pytest.raises(UsageError, match="one launch profile, cpu"):
        FAM.load_profile("ascend", [])


def test_a_mutant_class_reaches_only_the_hardened_nodes_and_their_pool_key(tmp_path):
    from harness.schema import load_all
    from families.layerwise.topology import LayerwiseTopology

    sc = load_all([str(ROOT / "scenarios" / "ascend-cpu" / "layerwise-baseline.yaml")])[0]
    prof = FAM.load_profile(None, ["hardened_class=pkg.mod:Cls", f"plugin_path={tmp_path}"])
    plain = LayerwiseTopology(sc, "hardened", tmp_path, lambda r: None, {})
    mut = LayerwiseTopology(sc, "hardened", tmp_path, lambda r: None, {}, prof)
    up = LayerwiseTopology(sc, "upstream", tmp_path, lambda r: None, {}, prof)
    args = mut._connector_args("decode")
    assert args[args.index("--hardened-class") + 1] == "pkg.mod:Cls" and str(tmp_path) in args
    assert "--hardened-class" not in plain._connector_args("decode") + up._connector_args("prefill")
    assert mut.pool_key("decode") != plain.pool_key("decode")  # a mutant node is never lent to a hardened run


def test_a_builtin_profile_name_goes_to_the_families_that_have_it():
    from harness.errors import UsageError
    from harness.plan import choose_profiles
    from harness.schema import load_all

    scs = load_all([str(ROOT / "scenarios" / "ascend-cpu" / "layerwise-baseline.yaml"),
                    str(ROOT / "scenarios" / "pd" / "baseline.yaml")])
    chosen = choose_profiles(scs, "cpu-store", [])
    assert set(chosen) == {"pd"} and chosen["pd"].name == "cpu-store"  # layerwise runs its default
    assert set(choose_profiles(scs, "cpu", [])) == {"pd", "layerwise"}  # both have a "cpu"
    with pytest.raises(UsageError, match="no such profile|one launch profile"):
        choose_profiles(scs, "nosuch", [])


def test_the_fake_engine_copies_a_write_into_the_file_d_published(tmp_path):
    import ctypes

    from families.layerwise.fake_engine import FakeTransferEngine

    mem, shm = tmp_path / "mem", tmp_path / "d-0-k"
    shm.write_bytes(bytes(64))
    base = 0x7F00_0000_0000  # an address in D's process: only the map translates it
    d = FakeTransferEngine(rpc_port=23456, memdir=str(mem))
    d.publish_memory([(base, 64, str(shm))])
    p = FakeTransferEngine(rpc_port=17001, memdir=str(mem))
    src = ctypes.create_string_buffer(b"abcdefgh", 8)
    addr = ctypes.addressof(src)
    try:
        assert p.batch_transfer_sync_write("127.0.0.1:23456", [addr], [base + 16], [8]) == 0
        assert shm.read_bytes()[16:24] == b"abcdefgh" and p.counters["copied_bytes"] == 8
        assert p.batch_transfer_sync_write("127.0.0.1:23456", [addr], [base + 60], [8]) == 0  # past the region
        assert p.batch_transfer_sync_write("127.0.0.1:9", [addr], [base], [8]) == 0  # no D published port 9
        assert p.counters["unmapped_writes"] == 2 and shm.read_bytes()[56:64] == bytes(8)
        p.set("ret")
        assert p.batch_transfer_sync_write("127.0.0.1:23456", [addr], [base], [8]) == -1
        assert shm.read_bytes()[:8] == bytes(8)  # a failed write copies nothing
    finally:
        p.close()
        d.close()
    assert not (mem / "23456.json").exists()  # D's map goes with D


def _aimed(decode: str = "decode2") -> list:
    m = dict(meta(), topology={"decodes": 2}, faults=[{"id": 0, "type": "transfer_error", "params": {"mode": "ret", "decode": decode},
                              "explains": ["failed_load"], "tail_s": 1.0}])
    return [m, {"type": "fault", "id": 0, "name": "transfer_error", "phase": "start", "t": T0 + 1.0},
            {"type": "fault", "id": 0, "name": "transfer_error", "phase": "stop", "t": T0 + 2.0}]


def _on(records: list, decode: str) -> list:
    for r in records:
        r["decode"] = decode
    return records


def test_failed_where_faulted_refuses_a_failure_on_a_d_the_fault_was_not_aimed_at():
    """Issue 21: upstream's sender told another D's request FAILED (a leftover loop variable)."""
    check = CHECKS["failed_where_faulted"]
    fail = dict(phase="fail", value="failed", outcome="failed_load", reported=4)
    good = _aimed() + _on(op(1, 1.2, **fail), "decode2") + _on(op(2, 1.3), "decode") + _on(op(3, 5.0), "decode")
    r = check(C.CheckInput(good), {})
    assert r.ok is True and "1 failed requests" in r.message, r.message
    wrong = _aimed() + _on(op(1, 1.2, **fail), "decode2") + _on(op(2, 1.3, **fail), "decode")
    r = check(C.CheckInput(wrong), {})
    assert r.ok is False and "op 2 on decode" in r.message, r.message
    r = check(C.CheckInput(_aimed("all") + _on(op(2, 1.3, **fail), "decode")), {})
    assert r.ok is False and r.message.startswith(C.UNDECIDED), r.message  # nothing aimed: cannot judge
    # an aimed fault that showed nothing: no op of the spared D ran during it, or none of its own D failed
    for recs in (_aimed() + _on(op(1, 1.2, **fail), "decode2"), _aimed() + _on(op(2, 1.3), "decode")):
        r = check(C.CheckInput(recs), {})
        assert r.ok is False and r.message.startswith(C.UNDECIDED) and "nothing to judge" in r.message, r.message
    # a failed op on no known D, or a window of no scheduled fault
    r = check(C.CheckInput(_aimed() + op(1, 1.2, **fail) + _on(op(2, 1.3), "decode")), {})
    assert r.message.startswith(C.UNDECIDED) and "no D of this topology" in r.message, r.message
    stray = [{"type": "fault", "id": 7, "name": "x", "phase": p, "t": T0 + t} for p, t in (("start", 1.0), ("stop", 2.0))]
    r = check(C.CheckInput(good + stray), {})
    assert r.message.startswith(C.UNDECIDED) and "no fault the run scheduled" in r.message, r.message


def test_the_d_checks_read_every_d_and_refuse_what_they_cannot_judge():
    two = dict(meta(), topology={"decodes": 2})

    def probes(node: str, base: dict, final: dict, pid: int = 7) -> list:
        return [{"type": "probe", "node": node, "when": w, "t": T0 + t, "pid": pid, "counters": c}
                for w, t, c in (("baseline", -1, base), ("final", 9, final))]

    def judge(name: str, records: list, m: dict = two) -> C.CheckResult:
        return CHECKS[name](C.CheckInput([m] + records), {})

    ok_c = {"free_blocks": 31, "blocks_initial": 31, "blocks_live": 0, "content_checked": 1, "content_bad": 0,
            "freed_after_failure": 0, "writes_after_free": 0}
    on1, on2 = _on(op(1, 0.1), "decode"), _on(op(2, 0.2), "decode2")
    both = on1 + on2 + probes("decode", ok_c, dict(ok_c, content_checked=2))
    leak = dict(ok_c, free_blocks=27, blocks_held_finished=4, content_checked=2)
    r = judge("blocks_returned", both + probes("decode2", ok_c, leak))
    assert r.ok is False and "decode2: 4 of 31" in r.message, r.message
    bad = dict(ok_c, content_checked=2, content_bad=1)
    r = judge("kv_content", both + probes("decode2", ok_c, bad))
    assert r.ok is False and "1 of 2" in r.message, r.message
    refused = {
        "a D of the topology never probed": both,
        "probes of one D from two processes": both + probes("decode2", ok_c, ok_c) + probes("decode2", ok_c, ok_c, 8),
        "a D the topology does not have": (on1 + probes("decode", ok_c, dict(ok_c, content_checked=2))
                                           + probes("decode2", ok_c, ok_c)),
        "a pool that changed size": both + probes("decode2", ok_c, dict(ok_c, blocks_initial=20, free_blocks=20)),
        "more blocks free than the pool has": both + probes("decode2", ok_c, dict(ok_c, free_blocks=40)),
    }
    for why, recs in refused.items():
        m = dict(meta(), topology={"decodes": 1}) if "does not have" in why else two
        for name in ("blocks_returned", "kv_content", "no_write_after_free"):
            r = judge(name, recs, m)
            if name == "blocks_returned" or "pool" not in why and "free than" not in why:
                assert r.ok is False and r.message.startswith(C.UNDECIDED), (why, name, r.message)
    # per D: one D's checks cannot be made up by another's
    r = judge("kv_content", on1 + on2 + probes("decode", ok_c, dict(ok_c, content_checked=3)) + probes("decode2", ok_c, ok_c))
    assert r.ok is False and r.message.startswith(C.UNDECIDED) and "decode2" in r.message, r.message
    r = judge("kv_content", both + probes("decode2", ok_c, dict(ok_c, content_checked=2, content_bad=5)))
    assert r.message.startswith(C.UNDECIDED), r.message
    r = judge("no_write_after_free", both + probes("decode2", ok_c, dict(ok_c, content_checked=2, writes_after_free=1)))
    assert r.message.startswith(C.UNDECIDED) and "inconsistent" in r.message, r.message
    # a failed request whose blocks came back must have been watched after the free
    failed = on1 + _on(op(2, 0.2, phase="fail", value="failed", outcome="failed_load", reported=4), "decode2")
    recs = failed + probes("decode", ok_c, dict(ok_c, content_checked=2)) + probes("decode2", ok_c, ok_c)
    r = judge("no_write_after_free", recs)
    assert r.message.startswith(C.UNDECIDED) and "watched 0 of them" in r.message, r.message


# --------------------------------------------------------------------------- the family's triggers (issue 43, item 6)

def _acted(fid: int = 0, t: float = 1.001) -> dict:
    return {"type": "event", "what": "fault_started", "id": fid, "t": T0 + t}


def test_requests_on_decode_counts_only_that_ds_requests_while_the_fault_acted():
    from harness.triggers import registry_for

    fire = registry_for(FAM).predicates["requests_on_decode"]
    recs = _aimed() + [_acted()] + _on(op(1, 1.2), "decode2") + _on(op(2, 0.2), "decode") + _on(op(3, 5.0), "decode")
    inp = C.CheckInput(recs)
    got = fire(inp, {"fault": 0, "decode": "decode2", "min": 1})
    assert got.fired and "1 requests on decode2 in flight" in got.evidence, got.evidence
    # decode's requests ended before the fault acted, or began after its heal: none met it
    got = fire(inp, {"fault": 0, "decode": "decode", "min": 1})
    assert not got.fired and "0 requests on decode in flight" in got.evidence, got.evidence
    assert not fire(inp, {"fault": 0, "decode": "decode2", "min": 2}).fired
    got = fire(inp, {"fault": 0, "decode": "decode3", "min": 1})
    assert not got.fired and "no D 'decode3'" in got.evidence
    # no record of when the fault acted: it cannot be said that anything met it
    assert not fire(C.CheckInput(_aimed() + _on(op(1, 1.2), "decode2")), {"fault": 0, "decode": "decode2"}).fired


def test_listener_probed_counts_the_messages_sent_in_the_window():
    from harness.triggers import registry_for

    fire = registry_for(FAM).predicates["listener_probed"]
    window = [{"type": "fault", "id": 0, "name": "listener_garbage", "phase": "start", "t": T0 + 1.0},
              {"type": "fault", "id": 0, "name": "listener_garbage", "phase": "stop", "t": T0 + 4.0}]
    sent = [dict(probe("not_msgpack", True, 1), t=T0 + 1.01), dict(probe("unknown_type", False, 3), t=T0 + 1.02)]
    got = fire(C.CheckInput([meta(), *window, *sent]), {"fault": 0, "min": 2})
    assert got.fired and "2 messages sent" in got.evidence, got.evidence  # answered or not: listener_answers judges
    assert not fire(C.CheckInput([meta(), *window, *sent]), {"fault": 0, "min": 3}).fired
    outside = [dict(e, t=T0 + 5.0) for e in sent]
    assert not fire(C.CheckInput([meta(), *window, *outside]), {"fault": 0, "min": 1}).fired
    assert not fire(C.CheckInput([meta(), *sent]), {"fault": 0, "min": 1}).fired  # the fault never ran
