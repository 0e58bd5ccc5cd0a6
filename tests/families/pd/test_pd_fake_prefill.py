"""The ``pd-fake-prefill`` node, the proxy's ``redirect`` hook and the ``fake_prefill_peer`` fault.

The fake runs as a real process on 127.0.0.1 and is driven by a hand-written D: it reads the
bootstrap ``/query`` and parses it as vLLM 0.32's ``_connect_to_prefiller_bootstrap`` does, then
pulls over a real ZMQ DEALER with a msgpack ``MooncakeXferMetadata`` and handles the reply as
``receive_kv_from_single_worker`` / ``process_pulling_result`` do (see :func:`d_pull`). When the
P/D node stack is installed, one test also encodes the pull and decodes every reply with vLLM's
own msgspec structs. The redirect hook is tested in the real proxy in front of small aiohttp
stand-ins for P and D, with the real fake as the redirect's bootstrap; the fault on a small real
topology (a proxy node and the fake node started through it).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import msgpack
import pytest
import requests
import zmq
from aiohttp import web

from nodekit.control import ControlError, control_call
from harness.procs import ProcHandle, node_command, start_node

pytestmark = pytest.mark.timeout(60)

MODES = ("garbage", "error", "unknown", "other", "silent", "bootstrap_500", "unknown_engine")
FINISH, CONTINUE, ERROR = 0, 1, 2
PULL_TIMEOUT_MS = 1500  # a silent fake: D's RCVTIMEO, shortened


def free_port() -> int:
    from harness.topology import free_tcp_port

    return free_tcp_port()


def two_ports() -> tuple[int, int]:
    a = free_port()
    b = free_port()
    while b == a:
        b = free_port()
    return a, b


def http() -> requests.Session:
    s = requests.Session()
    s.trust_env = False  # straight to 127.0.0.1, whatever HTTP_PROXY says
    return s


# --------------------------------------------------------------------------- a D, by hand


def d_query(bootstrap: str, peer_header: bool = False) -> tuple[int, dict[str, dict[int, dict[int, str]]]]:
    """D's bootstrap query: (HTTP status, {engine_id: {tp: {pp: addr}}}) as vLLM 0.32 builds
    ``_remote_agents`` from it (raise_for_status: nothing registered on an error status)."""
    headers = {"X-PDChaos-Peer": "proxy"} if peer_header else {}
    with http() as s:
        r = s.get(f"{bootstrap}/query", headers=headers, timeout=5)
    if r.status_code >= 400:
        return r.status_code, {}
    agents = {}
    for _, dp_entry in r.json().items():
        agents[dp_entry["engine_id"]] = {int(tp): {int(pp): addr for pp, addr in tp_entry.items()}
                                         for tp, tp_entry in dp_entry["worker_addr"].items()}
    return r.status_code, agents


def pull_metadata(req_ids: list[str], blocks: list[list[int]] | None = None) -> dict:
    """``MooncakeXferMetadata`` as msgspec encodes it (a map; defaults omitted)."""
    return {"remote_hostname": "127.0.0.1", "remote_port": 12345, "remote_tp_size": 1, "remote_tp_rank": 0,
            "req_blocks": {r: [uuid.uuid4().hex, blocks if blocks is not None else [[1, 2, 3]]] for r in req_ids},
            "kv_caches_base_addr": [140000000000000], "block_lens": [4096], "kv_block_lens": [2048],
            "registered_layer_names": ["model.layers.0.self_attn.attn"], "registered_layer_indices": [0],
            "registered_group_indices": [0], "registered_shared_group_ids": [[0]], "registered_row_offsets": [0]}


def decode_response(raw: bytes) -> dict:
    """``MooncakeXferResponse`` as D's msgspec decoder accepts it; raises ValueError otherwise."""
    msg = msgpack.unpackb(raw, raw=False)  # raises on garbage, as msgspec does
    if not isinstance(msg, dict) or set(msg) - {"status", "ok_reqs", "err_reqs", "err_msg"}:
        raise ValueError(f"not a MooncakeXferResponse: {msg!r}")
    if msg.get("status") not in (FINISH, CONTINUE, ERROR):
        raise ValueError("status: not a MooncakeXferResponseStatus")
    for key in ("ok_reqs", "err_reqs"):
        v = msg.get(key)
        if v is not None and (not isinstance(v, list) or not all(isinstance(x, str) for x in v)):
            raise ValueError(f"{key}: expected list[str] | None")
    if msg.get("err_msg") is not None and not isinstance(msg["err_msg"], str):
        raise ValueError("err_msg: expected str | None")
    return msg


def dealer(addr: str, timeout_ms: int = PULL_TIMEOUT_MS) -> zmq.Socket:
    """A DEALER connected to ``addr`` as D's is: no linger, a receive timeout."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
    sock.connect(addr)
    return sock


def d_pull(addr: str, req_ids: list[str], timeout_ms: int = PULL_TIMEOUT_MS) -> dict:
    """One pull the way vLLM 0.32's D does it, and what D makes of the answer:
    ``{"failed": [ids D reports failed], "done": [ids D marks received], "waiting": [ids D still
    waits for after the pull ended], "reason": ...}``."""
    sock = dealer(addr, timeout_ms)
    failed: list[str] = []
    done: list[str] = []
    reason = None
    try:
        sock.send(msgpack.packb(pull_metadata(req_ids)))
        while True:
            try:
                raw = sock.recv()
                resp = decode_response(raw)
                if resp["status"] == ERROR:
                    failed, reason = list(req_ids), resp.get("err_msg") or "transfer error"
                    break
                for r in resp.get("ok_reqs") or []:
                    if r not in req_ids:
                        raise KeyError("ok for a request not in this pull")  # pull_metas[req_id]
                    done.append(r)
                failed += [r for r in resp.get("err_reqs") or [] if r in req_ids and r not in failed]
                if resp["status"] == FINISH:
                    reason = resp.get("err_msg")
                    break
            except Exception as exc:  # noqa: BLE001 - D: "transfer failed: {e}" for every request
                failed = [r for r in req_ids if r not in done]
                reason = f"transfer failed: {type(exc).__name__}"
                break
    finally:
        sock.close(0)
    waiting = [r for r in req_ids if r not in failed and r not in done]
    return {"failed": failed, "done": done, "waiting": waiting, "reason": reason}


# --------------------------------------------------------------------------- the fake node


@dataclass
class Fake:
    handle: ProcHandle
    bootstrap_port: int
    side_port: int
    control: str
    log: str

    @property
    def bootstrap(self) -> str:
        return f"http://127.0.0.1:{self.bootstrap_port}"

    def ctl(self, cmd: str, **fields: Any) -> dict:
        return control_call(self.control, cmd, timeout_ms=5000, **fields)

    def counters(self) -> dict:
        return self.ctl("stats")["counters"]

    def engine_id(self) -> str:
        _, agents = d_query(self.bootstrap, peer_header=True)
        return next(iter(agents))

    def side_addr(self) -> str:
        _, agents = d_query(self.bootstrap, peer_header=True)
        return next(iter(agents.values()))[0][0]


def start_fake(tmp: str, name: str, mode: str) -> Fake:
    b, z = two_ports()
    control = f"ipc://{tmp}/{name}.ctl"
    log = os.path.join(tmp, f"{name}.log")
    handle = start_node("pd-fake-prefill", ["--bootstrap-port", str(b), "--side-port", str(z), "--mode", mode,
                                            "--control", control], log_path=log, ready_timeout_s=30.0)
    return Fake(handle, b, z, control, log)


@pytest.fixture(scope="module")
def tmpdir_short() -> Iterator[str]:
    tmp = tempfile.mkdtemp(prefix="pdf", dir="/tmp")
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def fake(tmpdir_short: str) -> Iterator[Fake]:
    f = start_fake(tmpdir_short, "fake", "error")
    try:
        yield f
    finally:
        f.handle.stop()


@pytest.fixture
def fk(fake: Fake) -> Iterator[Fake]:
    yield fake
    fake.ctl("mode", mode="error")


_IDS: list[str] = []  # every request id the hand-written D sent: none may appear in a node log


def req_ids(n: int = 1) -> list[str]:
    ids = [f"cmpl-{uuid.uuid4().hex}-0-{uuid.uuid4().hex[:8]}" for _ in range(n)]
    _IDS.extend(ids)
    return ids


def test_bootstrap_query_is_what_vllm_d_parses(fk: Fake) -> None:
    status, agents = d_query(fk.bootstrap)
    assert status == 200 and len(agents) == 1
    engine_id, workers = next(iter(agents.items()))
    uuid.UUID(engine_id)  # a uuid4, like vLLM's random engine id
    assert workers == {0: {0: f"tcp://127.0.0.1:{fk.side_port}"}}  # one tp rank: D's _tp_size = 1
    assert fk.engine_id() == engine_id  # the proxy's query gets the same entry
    with http() as s:
        assert s.get(f"{fk.bootstrap}/nope", timeout=5).status_code == 404
        assert s.post(f"{fk.bootstrap}/register", json={}, timeout=5).status_code == 404


@pytest.mark.parametrize("mode", ["garbage", "error", "other"])
def test_side_channel_modes_that_make_d_fail_the_pull(fk: Fake, mode: str) -> None:
    fk.ctl("mode", mode=mode)
    before = fk.counters()
    ids = req_ids(2)
    t = time.monotonic()
    out = d_pull(fk.side_addr(), ids)
    assert time.monotonic() - t < 1.0, "the fake answers at once"
    assert sorted(out["failed"]) == sorted(ids) and not out["done"] and not out["waiting"], out
    if mode == "garbage":
        assert out["reason"].startswith("transfer failed")  # D cannot decode it
    elif mode == "error":
        assert out["reason"] and "fake prefill" in out["reason"]
    else:
        assert out["reason"] == "transfer failed: KeyError"  # ok for a request D did not ask for
    after = fk.counters()
    assert after["pulls"] - before["pulls"] == 1 and after["pull_reqs"] - before["pull_reqs"] == 2
    assert after["answers"][mode] - before["answers"][mode] == 1


def test_other_names_the_request_of_an_earlier_pull(fk: Fake) -> None:
    fk.ctl("mode", mode="other")
    first, second = req_ids(), req_ids()
    d_pull(fk.side_addr(), first)
    sock = dealer(fk.side_addr())
    try:
        sock.send(msgpack.packb(pull_metadata(second)))
        resp = decode_response(sock.recv())
    finally:
        sock.close(0)
    assert resp == {"status": FINISH, "ok_reqs": first}


def test_unknown_finishes_the_pull_and_leaves_d_waiting(fk: Fake) -> None:
    fk.ctl("mode", mode="unknown")
    ids = req_ids(1)
    out = d_pull(fk.side_addr(), ids)
    # FINISH whose err_reqs name none of D's requests: D ends the pull and reports nothing, so its
    # request stays in WAITING_FOR_REMOTE_KVS
    assert out["waiting"] == ids and not out["failed"] and not out["done"], out
    assert fk.counters()["answers"]["unknown"] >= 1


def test_silent_never_answers(fk: Fake) -> None:
    fk.ctl("mode", mode="silent")
    before = fk.counters()
    ids = req_ids(1)
    t = time.monotonic()
    out = d_pull(fk.side_addr(), ids, timeout_ms=800)
    assert time.monotonic() - t >= 0.75
    assert out["failed"] == ids and out["reason"] == "transfer failed: Again"  # D's RCVTIMEO fired
    after = fk.counters()
    assert after["unanswered"] - before["unanswered"] == 1 and after["answers"] == before["answers"]


def test_bootstrap_modes(fk: Fake) -> None:
    engine = fk.engine_id()
    fk.ctl("mode", mode="bootstrap_500")
    assert d_query(fk.bootstrap) == (500, {})  # D: raise_for_status, nothing registered
    assert next(iter(d_query(fk.bootstrap, peer_header=True)[1])) == engine  # the proxy still gets E
    fk.ctl("mode", mode="unknown_engine")
    status, agents = d_query(fk.bootstrap)
    assert status == 200 and len(agents) == 1 and engine not in agents  # D: "engine_id ... not found"
    assert next(iter(agents.values())) == {0: {0: fk.side_addr()}}
    assert next(iter(d_query(fk.bootstrap, peer_header=True)[1])) == engine
    # the side channel, if D reached it anyway, answers ERROR
    out = d_pull(fk.side_addr(), req_ids())
    assert out["failed"] and out["reason"] and "fake prefill" in out["reason"]
    c = fk.counters()
    assert c["query_answers"]["http_500"] >= 1 and c["query_answers"]["unknown_engine"] >= 1
    assert c["query_answers"]["proxy"] >= 2


def test_malformed_pulls_are_counted_and_answered_error(fk: Fake) -> None:
    before = fk.counters()
    sock = dealer(fk.side_addr())
    try:
        for payload in ([b"\xc1 not msgpack"], [msgpack.packb([1, 2])], [msgpack.packb({"req_blocks": 3})],
                        [b"a", b"b"]):
            sock.send_multipart(payload)
            assert decode_response(sock.recv())["status"] == ERROR
    finally:
        sock.close(0)
    after = fk.counters()
    assert after["malformed_pulls"] - before["malformed_pulls"] == 4
    assert fk.handle.alive


def test_mode_command_and_stats(fk: Fake) -> None:
    before = fk.counters()["mode_changes"]
    assert fk.ctl("mode", mode="silent") == {"ok": True, "mode": "silent", "previous": "error"}
    st = fk.ctl("stats")
    assert st["mode"] == "silent" and st["engine_id_set"] is True
    assert st["counters"]["mode_changes"] == before + 1
    for bad in ("loud", None, 3):
        with pytest.raises(ControlError, match="mode: expected one of"):
            fk.ctl("mode", mode=bad)
    assert fk.ctl("stats")["mode"] == "silent"


def test_start_mode_and_clean_stop(tmpdir_short: str) -> None:
    f = start_fake(tmpdir_short, "start-silent", "silent")
    try:
        assert f.ctl("stats")["mode"] == "silent"
        out = d_pull(f.side_addr(), req_ids(), timeout_ms=300)
        assert out["reason"] == "transfer failed: Again"
    finally:
        f.handle.stop()
    assert f.handle.returncode == 0
    # both ports are free again (connections the fake closed may sit in TIME_WAIT)
    for port in (f.bootstrap_port, f.side_port):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen(1)


def test_logs_hold_counts_not_ids(fake: Fake) -> None:
    text = Path(fake.log).read_text()
    engine = fake.engine_id()
    assert "answered" in text
    assert engine not in text
    for rid in _IDS:
        assert rid not in text
    assert "\\xc1" not in text and "not msgpack" not in text


# --------------------------------------------------------------------------- bad input


def _node(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(node_command("pd-fake-prefill", args), capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("args,needle", [
    (["--bootstrap-port", "{b}", "--side-port", "{z}", "--mode", "loud"], "--mode: invalid choice: 'loud'"),
    (["--bootstrap-port", "{b}", "--side-port", "{z}"], "the following arguments are required: --mode"),
    (["--bootstrap-port", "{b}", "--side-port", "{b}", "--mode", "error"], "--side-port: {b} is also the --bootstrap-port"),
    (["--bootstrap-port", "70000", "--side-port", "{z}", "--mode", "error"], "--bootstrap-port: 70000 is not a TCP port"),
    (["--bootstrap-port", "x", "--side-port", "{z}", "--mode", "error"], "--bootstrap-port: invalid int value"),
    (["--bootstrap-port", "{b}", "--side-port", "{z}", "--mode", "error", "--control", "tcp://10.1.2.3:5"],
     "--control: 'tcp://10.1.2.3:5' is not on loopback"),
])
def test_bad_cli_input_is_one_error_line_exit_2(args: list[str], needle: str) -> None:
    b, z = two_ports()
    args = [a.format(b=b, z=z) for a in args]
    r = _node(args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("error: ") and needle.format(b=b) in lines[0], lines[0]
    assert "READY" not in r.stdout


@pytest.mark.parametrize("which", ["--bootstrap-port", "--side-port"])
def test_a_taken_port_is_one_error_line_exit_2(which: str) -> None:
    b, z = two_ports()
    taken = b if which == "--bootstrap-port" else z
    with socket.socket() as s:
        s.bind(("127.0.0.1", taken))
        s.listen(1)
        r = _node(["--bootstrap-port", str(b), "--side-port", str(z), "--mode", "error"])
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"error: {which}: cannot bind") and "in use" in lines[0], lines[0]


# --------------------------------------------------------------------------- vLLM's own structs


def _stack_missing() -> str | None:
    from stacks.vllm_cpu.steps import PdStackStep

    step = PdStackStep()
    if step.check() is None:
        return (f"the P/D node stack is not installed here ({step.name}): "
                "run `pdchaos setup --only pd-node-stack`")
    return None


_VLLM_WIRE = r"""
import json, os, sys
import msgspec, zmq
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector import (
    MooncakeXferMetadata, MooncakeXferResponse, MooncakeXferResponseStatus)
addr, ctl = sys.argv[1], sys.argv[2]
enc = msgspec.msgpack.Encoder()
dec = msgspec.msgpack.Decoder(MooncakeXferResponse)
ctx = zmq.Context()
out = {}
def ctl_call(mode):
    import msgpack
    s = ctx.socket(zmq.REQ); s.setsockopt(zmq.LINGER, 0); s.setsockopt(zmq.RCVTIMEO, 5000); s.connect(ctl)
    s.send(msgpack.packb({"cmd": "mode", "mode": mode})); s.recv(); s.close()
for mode in ("garbage", "error", "unknown", "other", "silent"):
    ctl_call(mode)
    meta = MooncakeXferMetadata(remote_hostname="127.0.0.1", remote_port=1, remote_tp_size=1, remote_tp_rank=0,
        req_blocks={"r-" + mode: ("t-" + mode, [[1, 2]])}, kv_caches_base_addr=[1], block_lens=[1], kv_block_lens=[1])
    s = ctx.socket(zmq.DEALER); s.setsockopt(zmq.LINGER, 0); s.setsockopt(zmq.RCVTIMEO, 1000); s.connect(addr)
    s.send(enc.encode(meta))
    try:
        r = dec.decode(s.recv())
        out[mode] = {"status": int(r.status), "ok_reqs": r.ok_reqs, "err_reqs": r.err_reqs, "err_msg": r.err_msg}
    except zmq.Again:
        out[mode] = "timeout"
    except msgspec.DecodeError as e:
        out[mode] = "decode_error"
    s.close()
print("RESULT " + json.dumps(out))
"""


@pytest.mark.timeout(300)
def test_replies_decode_with_vllms_own_structs(tmpdir_short: str) -> None:
    missing = _stack_missing()
    if missing:
        pytest.skip(missing)
    from stacks.vllm_cpu.recipe import pd_node_env

    f = start_fake(tmpdir_short, "vllm-wire", "error")
    try:
        env = {**os.environ, "VLLM_PLUGINS": "", "HF_HUB_OFFLINE": "1"}
        r = subprocess.run([str(pd_node_env(out=lambda *_: None).python), "-c", _VLLM_WIRE, f.side_addr(), f.control],
                           capture_output=True, text=True, timeout=280, env=env)
        line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
        assert line, r.stderr[-2000:]
        out = json.loads(line[len("RESULT "):])
        c = f.counters()
    finally:
        f.handle.stop()
    assert out["garbage"] == "decode_error"
    assert out["error"]["status"] == ERROR and out["error"]["err_msg"]
    assert out["unknown"]["status"] == FINISH and out["unknown"]["err_reqs"] and out["unknown"]["ok_reqs"] is None
    assert "r-unknown" not in out["unknown"]["err_reqs"]
    assert out["other"]["status"] == FINISH and out["other"]["ok_reqs"] == ["r-unknown"]  # the earlier pull's id
    assert out["silent"] == "timeout"
    assert c["malformed_pulls"] == 0 and c["pulls"] == 5 and c["pull_reqs"] == 5  # vLLM's encoding is understood


# --------------------------------------------------------------------------- the proxy's redirect hook


class StandIn:
    """An aiohttp server on 127.0.0.1 in its own loop thread playing P (``/v1/completions``) or D
    (records the bodies; ``hang`` never answers)."""

    def __init__(self, role: str):
        self.role = role
        self.requests: list[dict] = []
        self.hang = False
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        self.url = f"http://127.0.0.1:{self.port}"

    async def _start(self) -> int:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        self.runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return site._server.sockets[0].getsockname()[1]

    async def _completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        if self.hang:
            await asyncio.sleep(3600)
        return web.json_response({"id": f"cmpl-{self.role}", "object": "text_completion",
                                  "choices": [{"index": 0, "text": self.role, "finish_reason": "length"}]})

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@dataclass
class ProxyRig:
    p: StandIn
    d: StandIn
    real_bootstrap: Fake  # the real P's bootstrap (a fake in mode error: only its /query matters)
    fake: Fake  # the redirect's target
    proxy: ProcHandle
    port: int
    control: str
    log: str

    def post(self, timeout: float = 15.0) -> tuple[requests.Response, float]:
        body = {"model": "m", "prompt": f"secret prompt {uuid.uuid4().hex}", "max_tokens": 4}
        with http() as s:
            t = time.monotonic()
            r = s.post(f"http://127.0.0.1:{self.port}/v1/completions", json=body, timeout=timeout)
            return r, time.monotonic() - t

    def ctl(self, cmd: str, **fields: Any) -> dict:
        return control_call(self.control, cmd, timeout_ms=5000, **fields)


PROXY_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def rig(tmpdir_short: str) -> Iterator[ProxyRig]:
    p, d = StandIn("prefill"), StandIn("decode")
    real = start_fake(tmpdir_short, "real-bootstrap", "error")
    fake = start_fake(tmpdir_short, "redirect-target", "garbage")
    port = free_port()
    control = f"ipc://{tmpdir_short}/proxy.ctl"
    log = os.path.join(tmpdir_short, "proxy.log")
    proxy = None
    try:
        proxy = start_node("pd-proxy", ["--port", str(port), "--prefill", p.url, "--prefill-bootstrap", real.bootstrap,
                                        "--decode", d.url, "--control", control, "--timeout-s", str(PROXY_TIMEOUT_S)],
                           log_path=log, ready_timeout_s=30.0)
        yield ProxyRig(p, d, real, fake, proxy, port, control, log)
    finally:
        if proxy is not None:
            proxy.stop()
        for f in (real, fake):
            f.handle.stop()
        p.close()
        d.close()


@pytest.fixture
def pr(rig: ProxyRig) -> Iterator[ProxyRig]:
    rig.p.requests.clear()
    rig.d.requests.clear()
    rig.d.hang = False
    yield rig
    rig.ctl("clear")
    rig.d.hang = False
    rig.fake.ctl("mode", mode="garbage")


def test_redirect_skips_p_and_sends_d_to_the_fake(pr: ProxyRig) -> None:
    before = pr.ctl("stats")["counters"]
    fake_engine, real_engine = pr.fake.engine_id(), pr.real_bootstrap.engine_id()
    ans = pr.ctl("redirect", count=2, bootstrap=pr.fake.bootstrap + "/")
    assert ans["hooks"]["redirect"] == {"count": 2, "bootstrap": pr.fake.bootstrap}
    q0 = pr.fake.counters()["query_answers"]["proxy"]
    for _ in range(2):
        r, _ = pr.post()
        assert r.status_code == 200, r.text
    assert pr.p.requests == [], "a redirected request never reaches the real P"
    assert len(pr.d.requests) == 2
    tids = set()
    for body in pr.d.requests:
        kv = body["kv_transfer_params"]
        assert kv == {"do_remote_decode": False, "do_remote_prefill": True, "remote_bootstrap_addr": pr.fake.bootstrap,
                      "remote_engine_id": fake_engine, "transfer_id": kv["transfer_id"]}
        tids.add(kv["transfer_id"])
    assert len(tids) == 2
    assert pr.fake.counters()["query_answers"]["proxy"] - q0 == 2  # the proxy asked the fake, as the proxy
    # the hook is used up: the next request is a normal one
    r, _ = pr.post()
    assert r.status_code == 200 and len(pr.p.requests) == 1
    assert pr.d.requests[-1]["kv_transfer_params"]["remote_engine_id"] == real_engine
    assert pr.d.requests[-1]["kv_transfer_params"]["remote_bootstrap_addr"] == pr.real_bootstrap.bootstrap
    after = pr.ctl("stats")
    assert after["counters"]["redirected"] - before["redirected"] == 2 and "redirect" not in after["hooks"]
    assert after["counters"]["engine_id_changes"] == before["engine_id_changes"]  # the fake is not P


def test_redirect_gives_d_the_engine_the_proxy_read_whatever_d_will_find(pr: ProxyRig) -> None:
    pr.fake.ctl("mode", mode="unknown_engine")
    engine = pr.fake.engine_id()
    pr.ctl("redirect", count=1, bootstrap=pr.fake.bootstrap)
    r, _ = pr.post()
    assert r.status_code == 200
    assert pr.d.requests[-1]["kv_transfer_params"]["remote_engine_id"] == engine
    assert engine not in d_query(pr.fake.bootstrap)[1]  # what D finds there: another engine


def test_redirect_to_a_failing_bootstrap_is_a_bounded_502(pr: ProxyRig) -> None:
    before = pr.ctl("stats")["counters"]
    dead = f"http://127.0.0.1:{free_port()}"
    pr.ctl("redirect", count=1, bootstrap=dead)
    r, took = pr.post()
    assert r.status_code == 502 and took < PROXY_TIMEOUT_S + 1.0
    assert r.json()["error"]["phase"] == "bootstrap" and r.json()["error"]["type"] == "connect"
    assert pr.p.requests == [] and pr.d.requests == []
    after = pr.ctl("stats")["counters"]
    assert after["redirected"] - before["redirected"] == 1  # used up by the failed request
    assert "redirect" not in pr.ctl("stats")["hooks"]


def test_redirected_request_to_a_hanging_d_is_answered_within_the_timeout(pr: ProxyRig) -> None:
    pr.d.hang = True
    pr.ctl("redirect", count=1, bootstrap=pr.fake.bootstrap)
    r, took = pr.post()
    assert r.status_code == 504 and PROXY_TIMEOUT_S - 0.2 < took < PROXY_TIMEOUT_S + 1.0
    assert r.json()["error"]["phase"] == "decode"


def test_redirect_keeps_decode_side_hooks_and_leaves_prefill_hooks_armed(pr: ProxyRig) -> None:
    pr.ctl("bad_params", count=1, drop=["transfer_id"])
    pr.ctl("abort", phase="after_prefill", count=1)
    pr.ctl("redirect", count=1, bootstrap=pr.fake.bootstrap)
    r, _ = pr.post()
    assert r.status_code == 200
    kv = pr.d.requests[-1]["kv_transfer_params"]
    assert "transfer_id" not in kv and kv["remote_bootstrap_addr"] == pr.fake.bootstrap
    hooks = pr.ctl("stats")["hooks"]
    assert "bad_params" not in hooks and hooks["abort_after_prefill"] == {"count": 1}


def test_clear_named_hooks_only(pr: ProxyRig) -> None:
    pr.ctl("redirect", count=3, bootstrap=pr.fake.bootstrap)
    pr.ctl("bad_params", count=1, drop=["transfer_id"])
    ans = pr.ctl("clear", hooks=["redirect"])
    assert set(ans["hooks"]) == {"bad_params"}
    with pytest.raises(ControlError, match="hooks: expected a non-empty list"):
        pr.ctl("clear", hooks=["nope"])
    with pytest.raises(ControlError, match="hooks: expected a non-empty list"):
        pr.ctl("clear", hooks=[])
    assert pr.ctl("clear") == {"ok": True, "released": 0, "hooks": {}}


@pytest.mark.parametrize("fields,needle", [
    ({"count": 1, "bootstrap": "http://10.0.0.1:80"}, "bootstrap: 'http://10.0.0.1:80' is not on loopback"),
    ({"count": 1, "bootstrap": "http://127.0.0.1:80/query"}, "give only http://HOST:PORT"),
    ({"count": 1}, "bootstrap: expected a URL"),
    ({"count": 0, "bootstrap": "http://127.0.0.1:80"}, "count: expected an integer"),
    ({"count": True, "bootstrap": "http://127.0.0.1:80"}, "count: expected an integer"),
])
def test_bad_redirect_commands(pr: ProxyRig, fields: dict, needle: str) -> None:
    with pytest.raises(ControlError, match="redirect: ") as exc:
        pr.ctl("redirect", **fields)
    assert needle in str(exc.value)
    assert "redirect" not in pr.ctl("stats")["hooks"]


def test_proxy_log_holds_no_redirect_address_or_engine(rig: ProxyRig) -> None:
    text = Path(rig.log).read_text()
    assert rig.fake.engine_id() not in text and rig.fake.bootstrap not in text
    assert "secret prompt" not in text


# --------------------------------------------------------------------------- the fault on a real topology


def test_fault_injects_and_heals_idempotently(rig: ProxyRig, tmp_path: Path) -> None:
    from faults.base import load_registry
    from harness.family import get_family
    from harness.topology import BaseTopology, NodeSpec

    fam = get_family("pd")  # loads its fault modules (fault_modules)

    cls = load_registry("pd")["fake_prefill_peer"]
    assert cls.family == "pd"

    class Topo(BaseTopology):
        def node_spec(self, role: str) -> NodeSpec:
            if role == "proxy":
                return NodeSpec("pd-proxy", ["--port", str(self.proxy_port), "--prefill", rig.p.url,
                                             "--prefill-bootstrap", rig.real_bootstrap.bootstrap,
                                             "--decode", rig.d.url, "--timeout-s", "2"])
            return super().node_spec(role)

        def start(self) -> None:
            self.start_node("proxy")

    records: list[dict] = []
    scenario = SimpleNamespace(family=fam.name, seed=120, deadline=10.0)
    topo = Topo(scenario, "upstream", tmp_path, records.append)
    topo.proxy_port = free_port()
    try:
        topo.start()
        fault = cls(cls.Params(mode="error", count=2), topo)
        fault.prepare()  # the runner's step before t0: the fake is up, nothing is redirected yet
        node = topo.node("fake-prefill:0")
        assert node.handle.alive and "redirect" not in topo.control("proxy", "stats")["hooks"]
        t_start = time.monotonic()
        fault.start()  # only arms the hook: no process start inside the window
        assert time.monotonic() - t_start < 1.0
        assert topo.node("fake-prefill:0") is node
        assert node.kind == "pd-fake-prefill" and node.handle.alive
        hooks = topo.control("proxy", "stats")["hooks"]
        assert hooks["redirect"] == {"count": 2, "bootstrap": node.endpoints["bootstrap"]}
        assert topo.control("fake-prefill:0", "stats")["mode"] == "error"
        rig.d.requests.clear()
        with http() as s:
            r = s.post(f"http://127.0.0.1:{topo.proxy_port}/v1/completions",
                       json={"prompt": "secret prompt x", "max_tokens": 2}, timeout=10)
        assert r.status_code == 200
        assert rig.d.requests[-1]["kv_transfer_params"]["remote_bootstrap_addr"] == node.endpoints["bootstrap"]
        proc = node.handle
        fault.stop()
        assert "fake-prefill:0" not in topo.nodes and not proc.alive
        assert "redirect" not in topo.control("proxy", "stats")["hooks"]
        fault.stop()  # healed already: nothing to do
        fault.heal()  # and the heal itself is safe to repeat
        fault.release()  # the runner's teardown step: nothing left to release
        assert "fake-prefill:0" not in topo.nodes
        events = [r.get("what") for r in records if r.get("type") == "event"]
        assert events.count("process_start") == 2 and events.count("process_stop") == 1
        report = next(r for r in records if r.get("what") == "fake_prefill_peer")
        assert report["redirected"] == 1 and report["mode"] == "error" and report["pulls"] == 0
        assert report["queries"]["proxy"] == 1  # counts only: no id, no address

        # a window in which no request came: the heal cleans up, and its effect says nothing was
        # tested (fault_effect then makes the run a harness error, never a verdict)
        idle = cls(cls.Params(mode="silent", count=1), topo)
        idle.start()
        proc = topo.node("fake-prefill:0").handle
        idle.stop()
        assert idle.effect()["redirected"] == 0 < idle.required_effect()["redirected"]
        assert not proc.alive and "redirect" not in topo.control("proxy", "stats")["hooks"]
        idle.stop()  # the runner's teardown heal: quiet now
        assert [r["redirected"] for r in records if r.get("what") == "fake_prefill_peer"] == [1, 0]

        # prepared, never started (the run ended before its window): released at teardown
        unused = cls(cls.Params(mode="garbage", count=1), topo)
        unused.prepare()
        proc = topo.node("fake-prefill:0").handle
        unused.stop()  # never injected: no heal, no report
        assert proc.alive
        unused.release()
        unused.release()
        assert not proc.alive and "fake-prefill:0" not in topo.nodes
        assert len([r for r in records if r.get("what") == "fake_prefill_peer"]) == 2
    finally:
        topo.close()
    assert all(not h.alive for h in topo.handles())


def test_schedule_leaves_time_for_the_fakes_heal(tmp_path: Path) -> None:
    """fake_prefill_peer's heal stops a node: a schedule that leaves only one op's time after the
    window is refused (on a busy CI machine, the heal once ate that time and the run had no op
    after the window); one second more than the heal allowance is accepted."""
    from harness.errors import UsageError
    from families.pd.fake_faults import FakePrefillPeer
    from harness.schema import load_scenario

    assert FakePrefillPeer.heal_allowance_s >= 1.0
    body = ("name: t\nfamily: pd\nworkload: {{duration: {d}s, concurrency: 1, rate: 1}}\n"
            "faults:\n  - {{type: fake_prefill_peer, at: 1s, for: 5s, mode: error}}\n"
            "triggers: [{{type: ops_in_window, fault: 0}}]\n"
            "expect: {{upstream: pass, hardened: pass}}\n")
    tight = tmp_path / "tight.yaml"
    tight.write_text(body.format(d=8))
    with pytest.raises(UsageError, match=r"leaves 2s .* plus 2s its heal may take"):
        load_scenario(tight)
    roomy = tmp_path / "roomy.yaml"
    roomy.write_text(body.format(d=9))
    assert load_scenario(roomy).model.workload.duration == 9


def test_an_earlier_ending_fault_with_a_longer_heal_counts(tmp_path: Path) -> None:
    """Overlapping windows: the fake peer (2-6 s, up to 2 s to heal) inside a stop of P (3-6.5 s):
    the window may still be healing at 8 s, so an op needs until 9 s, not 7.5 s."""
    from harness.errors import UsageError
    from harness.schema import load_scenario

    body = ("name: t\nfamily: pd\nworkload: {{duration: {d}s, concurrency: 1, rate: 1}}\nfaults:\n"
            "  - {{type: fake_prefill_peer, at: 2s, for: 4s, mode: error}}\n"
            "  - {{type: stop, at: 3s, for: 3.5s, node: 'prefill:0'}}\n"
            "triggers: [{{type: ops_in_window, fault: 0}}]\n"
            "expect: {{upstream: pass, hardened: pass}}\n")
    f = tmp_path / "s.yaml"
    f.write_text(body.format(d=8.5))
    with pytest.raises(UsageError, match=r"ending at 6.5s leaves 2s .* plus 1.5s its heal may take"):
        load_scenario(f)
    f.write_text(body.format(d=9))
    assert load_scenario(f).model.workload.duration == 9
