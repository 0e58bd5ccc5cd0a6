"""The ``pd-proxy`` node (families/pd/proxy.py) as a real process, over real HTTP on
127.0.0.1, in front of small aiohttp stand-ins for P, D and P's Mooncake bootstrap server that
play vLLM 0.32's API (no vLLM here: the real pair is covered elsewhere).

The stand-ins record every request they get (arrival, answer or disconnect times, the JSON
body) so the tests can check the protocol (kv_transfer_params, same transfer_id, the engine id
read from /query), the order of P and D, the bounded errors, and every phase hook.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterator

import pytest
import requests
from aiohttp import web

from nodekit.control import ControlError, control_call
from harness.procs import ProcHandle, node_command, start_node

pytestmark = pytest.mark.timeout(60)

TIMEOUT_S = 2.0  # the proxies' --timeout-s in this module
ENGINE = "engine-" + "a" * 8
D_TEXT = "decoded by the stand-in D"
P_KEYS = {"do_remote_decode": True, "do_remote_prefill": False}

_PROMPTS: list[str] = []  # every prompt sent in this module: none may appear in a proxy log


def free_port() -> int:
    from harness.topology import free_tcp_port

    return free_tcp_port()


def prompt(tag: str = "") -> str:
    p = f"secret prompt {tag} {uuid.uuid4().hex[:12]} about llamas"
    _PROMPTS.append(p)
    return p


# --------------------------------------------------------------------------- stand-ins


class StandIn:
    """One aiohttp server on 127.0.0.1 (its own loop in a thread) playing P, D or the bootstrap.

    ``mode``: ``ok``; ``status`` (answer ``self.status`` with a vLLM-like error body);
    ``bad_json``; ``hang`` (never answer; a disconnect is recorded); for the bootstrap also
    ``empty`` (``{}``: no worker registered). ``delay_s`` before answering. D behaves like vLLM
    0.32 for kv_transfer_params missing remote_engine_id / remote_bootstrap_addr / transfer_id:
    the request waits forever."""

    def __init__(self, role: str):
        self.role = role
        self.reset()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        self.url = f"http://127.0.0.1:{self.port}"

    def reset(self) -> None:
        self.mode = "ok"
        self.delay_s = 0.0
        self.status = 500
        self.engine_id = ENGINE
        self.kv_answer: dict | None = None  # kv_transfer_params in the answer (vllm-ascend's P does so)
        self.meta_extra: dict = {}  # more of what a layerwise D posts to the metaserver
        self.meta_twice = False  # post it twice
        self.meta_nowait = False  # answer without waiting for the POST's answer
        self.background: list = []
        self.requests: list[dict] = []

    async def _start(self) -> int:
        app = web.Application()
        if self.role == "bootstrap":
            app.router.add_get("/query", self._query)
        else:
            app.router.add_post("/v1/completions", self._completions)
        self.runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return site._server.sockets[0].getsockname()[1]

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    async def _misbehave(self) -> web.Response | None:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.mode == "hang":
            await asyncio.sleep(3600)
        if self.mode == "status":
            return web.json_response({"error": {"message": f"{self.role} failed", "type": "InternalError",
                                                "code": self.status}}, status=self.status)
        if self.mode == "bad_json":
            return web.Response(text="this is not json", content_type="application/json")
        return None

    async def _query(self, request: web.Request) -> web.Response:
        rec = {"t": time.monotonic(), "answered": None, "disconnected": None}
        self.requests.append(rec)
        try:
            bad = await self._misbehave()
            if bad is not None:
                return bad
            if self.mode == "empty":
                return web.json_response({})
            # vLLM 0.32 MooncakeBootstrapServer.query: dict[int, EngineEntry] as JSON
            return web.json_response({"0": {"engine_id": self.engine_id,
                                            "worker_addr": {"0": {"0": "127.0.0.1:1"}}}})
        except asyncio.CancelledError:
            rec["disconnected"] = time.monotonic()
            raise
        finally:
            rec["answered"] = rec["answered"] or time.monotonic()

    async def _completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        rec = {"t": time.monotonic(), "body": body, "answered": None, "disconnected": None,
               "request_id": request.headers.get("X-Request-Id")}
        self.requests.append(rec)
        try:
            kv = body.get("kv_transfer_params") or {}
            if self.role == "decode" and kv.get("metaserver"):
                # vllm-ascend's layerwise D: its scheduler POSTs its transfer params to the metaserver
                from aiohttp import ClientSession

                post = {"request_id": f"cmpl-{rec['request_id']}-0", "do_remote_decode": True,
                        "do_remote_prefill": False, "remote_host": "127.0.0.1", "remote_port": 30100,
                        **self.meta_extra}
                async def post_params() -> None:
                    async with ClientSession() as http:
                        for _ in range(2 if self.meta_twice else 1):
                            async with http.post(kv["metaserver"], json=post) as resp:
                                rec.setdefault("meta", []).append((resp.status, await resp.json()))

                if self.meta_nowait:  # as vllm-ascend's D does: the POST runs beside the request
                    self.background.append(asyncio.ensure_future(post_params()))
                    await asyncio.sleep(0.05)
                else:
                    await post_params()
            if self.role == "decode" and kv.get("do_remote_prefill") and not ({"remote_request_id", "metaserver"} & set(kv)) and not all(
                    k in kv for k in ("remote_engine_id", "remote_bootstrap_addr", "transfer_id")):
                await asyncio.sleep(3600)  # vLLM: "Got invalid KVTransferParams", then waits forever
            bad = await self._misbehave()
            if bad is not None:
                return bad
            text = D_TEXT if self.role == "decode" else "x"
            answer = {"id": f"cmpl-{self.role}", "object": "text_completion",
                      "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                      "usage": {"prompt_tokens": 7, "completion_tokens": body.get("max_tokens")}}
            if self.kv_answer is not None:
                answer["kv_transfer_params"] = self.kv_answer
            out = web.json_response(answer)
            rec["answered"] = time.monotonic()
            return out
        except asyncio.CancelledError:
            rec["disconnected"] = time.monotonic()
            raise

    def by_transfer(self, transfer_id: str) -> list[dict]:
        return [r for r in list(self.requests)
                if (r.get("body") or {}).get("kv_transfer_params", {}).get("transfer_id") == transfer_id]


@dataclass
class Proxy:
    handle: ProcHandle
    port: int
    control: str
    log: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def post(self, body: Any, timeout: float = 15.0) -> tuple[requests.Response, float]:
        """One completion through the proxy: (response, seconds it took)."""
        with requests.Session() as http:
            http.trust_env = False  # straight to 127.0.0.1, whatever HTTP_PROXY says
            t = time.monotonic()
            if isinstance(body, (dict, list)):
                r = http.post(f"{self.url}/v1/completions", json=body, timeout=timeout)
            else:
                r = http.post(f"{self.url}/v1/completions", data=body, timeout=timeout,
                              headers={"Content-Type": "application/json"})
            return r, time.monotonic() - t

    def ctl(self, cmd: str, **fields: Any) -> dict:
        return control_call(self.control, cmd, timeout_ms=5000, **fields)

    def stats(self) -> dict:
        """The proxy's counters, with its armed hooks under ``hooks``."""
        ans = self.ctl("stats")
        return {**ans["counters"], "hooks": ans["hooks"]}


def start_proxy(tmp: str, name: str, *, prefill: str, bootstrap: str, decode: str, order: str = "parallel",
                timeout_s: float = TIMEOUT_S, protocol: str = "bootstrap") -> Proxy:
    port = free_port()
    control = f"ipc://{tmp}/{name}.ctl"
    log = os.path.join(tmp, f"{name}.log")
    handle = start_node("pd-proxy", ["--port", str(port), "--prefill", prefill, "--prefill-bootstrap", bootstrap,
                                     "--decode", decode, "--control", control, "--timeout-s", str(timeout_s),
                                     "--order", order, "--protocol", protocol], log_path=log, ready_timeout_s=30.0)
    return Proxy(handle, port, control, log)


@dataclass
class Rig:
    p: StandIn
    d: StandIn
    b: StandIn
    par: Proxy
    seq: Proxy
    tmp: str

    def proxy(self, order: str) -> Proxy:
        return self.par if order == "parallel" else self.seq


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    tmp = tempfile.mkdtemp(prefix="pdp", dir="/tmp")
    p, d, b = StandIn("prefill"), StandIn("decode"), StandIn("bootstrap")
    proxies: list[Proxy] = []
    try:
        for order in ("parallel", "sequential"):
            proxies.append(start_proxy(tmp, order, prefill=p.url, bootstrap=b.url, decode=d.url, order=order))
        yield Rig(p, d, b, proxies[0], proxies[1], tmp)
    finally:
        for px in proxies:
            px.handle.stop()
        for s in (p, d, b):
            s.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _protocol_proxy(rig: Rig, name: str, protocol: str) -> Iterator[Proxy]:
    """A proxy over the rig's stand-ins speaking ``protocol``, stopped after the module."""
    px = start_proxy(rig.tmp, name, prefill=rig.p.url, bootstrap=rig.b.url, decode=rig.d.url, protocol=protocol)
    try:
        yield px
    finally:
        px.handle.stop()


@pytest.fixture
def r(rig: Rig) -> Iterator[Rig]:
    for s in (rig.p, rig.d, rig.b):
        s.reset()
    yield rig
    for px in (rig.par, rig.seq):
        px.ctl("clear")
    for s in (rig.p, rig.d, rig.b):
        s.reset()  # a hung stand-in handler stays hung, but no later test looks at it


def body(tag: str = "", **extra: Any) -> dict:
    return {"model": "tiny-llama-v1", "prompt": prompt(tag), "max_tokens": 16, "temperature": 0, **extra}


def wait_for(pred, timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def err(resp: requests.Response) -> dict:
    data = resp.json()
    assert set(data) == {"error"}, data
    e = data["error"]
    assert {"type", "phase", "message"} <= set(e), e
    assert e["phase"] in ("bootstrap", "prefill", "decode", "proxy"), e
    return e


def delta(after: dict, before: dict, *path: str) -> int:
    a, b = after, before
    for k in path:
        a, b = a.get(k, {}), b.get(k, {})
    return (a or 0) - (b or 0)


# --------------------------------------------------------------------------- the protocol


@pytest.mark.parametrize("order", ["parallel", "sequential"])
def test_normal_path_carries_the_mooncake_params(r: Rig, order: str) -> None:
    px = r.proxy(order)
    before = px.stats()
    req = body("normal")
    resp, _ = px.post(req)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["id"] == "cmpl-decode" and out["choices"][0]["text"] == D_TEXT  # D's answer, as D sent it

    assert len(r.b.requests) == 1  # /query read for this request
    assert len(r.p.requests) == 1 and len(r.d.requests) == 1
    p_body, d_body = r.p.requests[0]["body"], r.d.requests[0]["body"]
    p_kv, d_kv = p_body.pop("kv_transfer_params"), d_body.pop("kv_transfer_params")
    tid = p_kv["transfer_id"]
    assert re.fullmatch(r"[0-9a-f]{32}", tid)
    assert p_kv == {**P_KEYS, "transfer_id": tid}
    assert d_kv == {"do_remote_decode": False, "do_remote_prefill": True, "remote_bootstrap_addr": r.b.url,
                    "remote_engine_id": ENGINE, "transfer_id": tid}
    assert p_body["max_tokens"] == 1 and p_body["stream"] is False
    assert {k: v for k, v in p_body.items() if k not in ("max_tokens", "stream")} == \
        {k: v for k, v in req.items() if k != "max_tokens"}
    assert d_body == req  # D gets the original request

    after = px.stats()
    assert delta(after, before, "requests") == 1 and delta(after, before, "ok") == 1
    assert after["in_flight"] == 0 and after["errors"] == before["errors"]


def test_every_request_gets_a_fresh_transfer_id_and_rereads_the_engine_id(r: Rig) -> None:
    before = r.par.stats()
    assert r.par.post(body())[0].status_code == 200
    r.b.engine_id = "engine-restarted-" + "b" * 6  # P restarted with a new engine id
    assert r.par.post(body())[0].status_code == 200
    d_kvs = [x["body"]["kv_transfer_params"] for x in r.d.requests]
    assert [k["remote_engine_id"] for k in d_kvs] == [ENGINE, r.b.engine_id]
    assert d_kvs[0]["transfer_id"] != d_kvs[1]["transfer_id"]
    assert len(r.b.requests) == 2
    assert delta(r.par.stats(), before, "engine_id_changes") == 1


def test_parallel_asks_d_before_p_answers_sequential_after(r: Rig) -> None:
    r.p.delay_s = 0.4
    assert r.par.post(body())[0].status_code == 200
    p_rec, d_rec = r.p.requests[-1], r.d.requests[-1]
    assert d_rec["t"] < p_rec["answered"], "parallel: D must be asked while P is still prefilling"
    assert d_rec["t"] - p_rec["t"] < 0.3

    assert r.seq.post(body())[0].status_code == 200
    p_rec, d_rec = r.p.requests[-1], r.d.requests[-1]
    assert d_rec["t"] >= p_rec["answered"], "sequential: D only after P answered"


# --------------------------------------------------------------------------- bounded errors


def test_prefill_refusing_connections(r: Rig) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    for order in ("parallel", "sequential"):
        px = start_proxy(r.tmp, f"deadp-{order}", prefill=dead, bootstrap=r.b.url, decode=r.d.url, order=order)
        try:
            resp, took = px.post(body("deadp"))
            assert resp.status_code == 502
            e = err(resp)
            assert (e["phase"], e["type"]) == ("prefill", "connect"), e
            assert took < TIMEOUT_S
            assert px.stats()["errors"] == {"prefill": {"connect": 1}}
        finally:
            assert px.handle.stop() == 0
    assert len(r.d.requests) <= 1  # parallel may have asked D; sequential never did


@pytest.mark.parametrize("order", ["parallel", "sequential"])
@pytest.mark.parametrize("who", ["prefill", "decode"])
def test_a_hanging_node_is_a_504_within_the_bound(r: Rig, order: str, who: str) -> None:
    stand_in = r.p if who == "prefill" else r.d
    stand_in.mode = "hang"
    px = r.proxy(order)
    before = px.stats()
    resp, took = px.post(body("hang"))
    assert resp.status_code == 504
    e = err(resp)
    assert (e["phase"], e["type"]) == (who, "timeout"), e
    assert TIMEOUT_S - 0.1 <= took < TIMEOUT_S + 1.0
    # the proxy closed its request to the hung node when it gave up
    wait_for(lambda: stand_in.requests and stand_in.requests[-1]["disconnected"], 3.0, "the disconnect")
    after = px.stats()
    assert delta(after, before, "errors", who, "timeout") == 1 and after["in_flight"] == 0


@pytest.mark.parametrize("who,mode,etype", [
    ("prefill", "status", "bad_status"), ("prefill", "bad_json", "bad_json"),
    ("decode", "status", "bad_status"), ("decode", "bad_json", "bad_json"),
])
def test_bad_upstream_answers_are_502_with_the_phase(r: Rig, who: str, mode: str, etype: str) -> None:
    (r.p if who == "prefill" else r.d).mode = mode
    for px in (r.par, r.seq):
        resp, took = px.post(body())
        assert resp.status_code == 502
        e = err(resp)
        assert (e["phase"], e["type"]) == (who, etype), e
        if etype == "bad_status":
            assert e["upstream_status"] == 500 and e["upstream_message"] == f"{who} failed"
        assert took < TIMEOUT_S
        # how long D had the request (fail_fast times a failed load from there): never more than
        # the whole request; absent when D was never asked
        if px is r.seq and who == "prefill":
            assert "decode_ms" not in e, e
        if who == "decode":
            assert isinstance(e["decode_ms"], float) and 0 <= e["decode_ms"] <= took * 1000 + 1, e


def test_bootstrap_500_and_unknown_engine_id(r: Rig) -> None:
    before = r.par.stats()
    r.b.mode = "status"
    resp, took = r.par.post(body())
    assert resp.status_code == 502 and took < TIMEOUT_S
    e = err(resp)
    assert (e["phase"], e["type"], e["upstream_status"]) == ("bootstrap", "bad_status", 500), e

    r.b.mode = "empty"  # P's bootstrap before its worker registered: no engine id for rank 0
    resp, _ = r.par.post(body())
    assert resp.status_code == 502
    e = err(resp)
    assert (e["phase"], e["type"]) == ("bootstrap", "no_engine"), e

    r.b.mode = "bad_json"
    resp, _ = r.par.post(body())
    assert resp.status_code == 502 and (err(resp)["phase"], err(resp)["type"]) == ("bootstrap", "bad_json")

    r.b.mode = "hang"
    resp, took = r.par.post(body())
    assert resp.status_code == 504 and (err(resp)["phase"], err(resp)["type"]) == ("bootstrap", "timeout")
    assert took < TIMEOUT_S + 1.0

    assert r.p.requests == [] and r.d.requests == []  # nobody is asked without an engine id
    after = r.par.stats()
    for etype in ("bad_status", "no_engine", "bad_json", "timeout"):
        assert delta(after, before, "errors", "bootstrap", etype) == 1


@pytest.mark.parametrize("payload,field", [
    (b"{not json", "body"), ([1, 2], "body"), ({"model": "m", "max_tokens": 4}, "prompt"),
    ({"prompt": 5}, "prompt"), ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "stream": True}, "stream"),
])
def test_a_bad_client_body_is_400_naming_the_field(r: Rig, payload: Any, field: str) -> None:
    before = r.par.stats()
    resp, _ = r.par.post(payload)
    assert resp.status_code == 400
    e = err(resp)
    assert (e["phase"], e["type"], e["field"]) == ("proxy", "bad_request", field), e
    assert e["message"].startswith(field)
    assert r.b.requests == [] and r.p.requests == [] and r.d.requests == []
    assert delta(r.par.stats(), before, "errors", "proxy", "bad_request") == 1


def test_health(r: Rig) -> None:
    with requests.Session() as http:
        http.trust_env = False
        resp = http.get(f"{r.par.url}/health", timeout=5)
    assert resp.status_code == 200


# --------------------------------------------------------------------------- phase hooks


@pytest.mark.parametrize("order", ["parallel", "sequential"])
def test_hold_after_prefill_until_release(r: Rig, order: str) -> None:
    px = r.proxy(order)
    before = px.stats()
    ans = px.ctl("hold", phase="after_prefill", count=1, seconds=30)
    assert ans["hooks"] == {"hold": {"count": 1, "seconds": 30.0}}
    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(px.post, body("held"))
        wait_for(lambda: px.stats()["holding"] == 1, 5.0, "the request to be held")
        assert len(r.p.requests) == 1 and r.p.requests[0]["answered"]  # P answered (held even in parallel)
        time.sleep(0.3)
        assert r.d.requests == []  # ...and D is not asked while held
        t_release = time.monotonic()
        assert px.ctl("release")["released"] == 1
        resp, _ = fut.result(10)
    assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == D_TEXT
    assert r.d.requests[0]["t"] >= t_release
    after = px.stats()
    assert delta(after, before, "held") == 1 and delta(after, before, "hold_released") == 1
    assert after["holding"] == 0 and after["hooks"] == {}
    # the hook was for one request: the next goes straight through
    resp, took = px.post(body())
    assert resp.status_code == 200 and took < 1.0 and delta(px.stats(), before, "held") == 1


def test_hold_expires_after_its_seconds(r: Rig) -> None:
    before = r.par.stats()
    r.par.ctl("hold", phase="after_prefill", count=2, seconds=0.5)
    for _ in range(2):
        resp, took = r.par.post(body())
        assert resp.status_code == 200 and 0.5 <= took < TIMEOUT_S
        assert r.d.requests[-1]["t"] - r.p.requests[-1]["answered"] >= 0.45
    after = r.par.stats()
    assert delta(after, before, "held") == 2 and delta(after, before, "hold_expired") == 2
    assert after["hooks"] == {}


def test_hold_longer_than_the_timeout_still_answers(r: Rig) -> None:
    r.seq.ctl("hold", phase="after_prefill", count=1, seconds=30)
    resp, took = r.seq.post(body())
    assert resp.status_code == 504 and took < TIMEOUT_S + 1.0
    e = err(resp)
    assert (e["phase"], e["type"]) == ("proxy", "timeout"), e
    assert r.d.requests == []
    s = r.seq.stats()
    assert s["holding"] == 0 and s["in_flight"] == 0


@pytest.mark.parametrize("order", ["parallel", "sequential"])
def test_abort_decode_wait_closes_the_d_request(r: Rig, order: str) -> None:
    px = r.proxy(order)
    before = px.stats()
    r.d.mode = "hang"  # D waiting for KV
    px.ctl("abort", phase="decode_wait", count=1, after_ms=300)
    resp, took = px.post(body("abort"))
    assert resp.status_code == 502
    e = err(resp)
    assert (e["phase"], e["type"], e["hook"]) == ("decode", "aborted", "decode_wait"), e
    assert 0.3 <= took < 1.5
    rec = r.d.requests[-1]
    wait_for(lambda: rec["disconnected"], 3.0, "D to see the disconnect")
    assert 0.25 <= rec["disconnected"] - rec["t"] < 1.0
    after = px.stats()
    assert delta(after, before, "aborted") == 1 and delta(after, before, "aborted_by", "decode_wait") == 1
    assert delta(after, before, "errors", "decode", "aborted") == 1
    assert after["hooks"] == {} and after["in_flight"] == 0


@pytest.mark.parametrize("order", ["parallel", "sequential"])
def test_abort_after_prefill_never_asks_d(r: Rig, order: str) -> None:
    px = r.proxy(order)
    before = px.stats()
    px.ctl("abort", phase="after_prefill", count=1)
    resp, took = px.post(body())
    assert resp.status_code == 502 and took < 1.0
    e = err(resp)
    assert (e["type"], e["hook"]) == ("aborted", "after_prefill"), e
    assert len(r.p.requests) == 1 and r.p.requests[0]["answered"]
    time.sleep(0.2)
    assert r.d.requests == []
    after = px.stats()
    assert delta(after, before, "aborted_by", "after_prefill") == 1 and delta(after, before, "aborted") == 1
    assert px.post(body())[0].status_code == 200  # one request only


def test_bad_params_drop_keys_and_the_timeout_still_answers(r: Rig) -> None:
    before = r.par.stats()
    r.par.ctl("bad_params", count=1, drop=["transfer_id", "remote_bootstrap_addr"])
    resp, took = r.par.post(body())
    assert resp.status_code == 504 and TIMEOUT_S - 0.1 <= took < TIMEOUT_S + 1.0
    e = err(resp)
    assert (e["phase"], e["type"]) == ("decode", "timeout"), e
    d_kv = r.d.requests[-1]["body"]["kv_transfer_params"]
    assert d_kv == {"do_remote_decode": False, "do_remote_prefill": True, "remote_engine_id": ENGINE}
    assert "transfer_id" in r.p.requests[-1]["body"]["kv_transfer_params"]  # P's params stay whole
    after = r.par.stats()
    assert delta(after, before, "bad_params") == 1 and after["hooks"] == {}
    assert r.par.post(body())[0].status_code == 200


def test_clear_disarms_every_hook(r: Rig) -> None:
    px = r.par
    px.ctl("hold", phase="after_prefill", count=5, seconds=30)
    px.ctl("abort", phase="decode_wait", count=5, after_ms=10)
    px.ctl("abort", phase="after_prefill", count=5)
    ans = px.ctl("bad_params", count=5, drop=["transfer_id"])
    assert set(ans["hooks"]) == {"hold", "abort_decode_wait", "abort_after_prefill", "bad_params"}
    assert px.ctl("clear")["hooks"] == {}
    resp, took = px.post(body())
    assert resp.status_code == 200 and took < 1.0


@pytest.mark.parametrize("cmd,fields", [
    ("hold", {"phase": "decode_wait", "count": 1, "seconds": 1}),
    ("hold", {"phase": "after_prefill", "count": 0, "seconds": 1}),
    ("hold", {"phase": "after_prefill", "count": 1}),
    ("abort", {"phase": "somewhere", "count": 1}),
    ("abort", {"phase": "decode_wait", "count": 1}),
    ("abort", {"phase": "after_prefill", "count": True}),
    ("bad_params", {"count": 1, "drop": ["prompt"]}),
    ("bad_params", {"count": 1, "drop": []}),
])
def test_bad_hook_commands_are_refused(r: Rig, cmd: str, fields: dict) -> None:
    with pytest.raises(ControlError):
        r.par.ctl(cmd, **fields)
    assert r.par.stats()["hooks"] == {}


# --------------------------------------------------------------------------- the node's life


@pytest.mark.parametrize("argv,needle", [
    (["--prefill", "http://10.1.2.3:8000"], "--prefill"),
    (["--decode", "https://127.0.0.1:8000"], "--decode"),
    (["--prefill-bootstrap", "http://127.0.0.1"], "--prefill-bootstrap"),
    (["--decode", "http://127.0.0.1:8000/v1"], "--decode"),
    (["--timeout-s", "0"], "--timeout-s"),
    (["--port", "0"], "--port"),
    (["--order", "random"], "--order"),
])
def test_bad_arguments_are_one_error_line_and_exit_2(argv: list[str], needle: str) -> None:
    base = {"--port": "18999", "--prefill": "http://127.0.0.1:1", "--prefill-bootstrap": "http://127.0.0.1:2",
            "--decode": "http://127.0.0.1:3"}
    base.update(dict(zip(argv[::2], argv[1::2])))
    args = [x for kv in base.items() for x in kv]
    out = subprocess.run(node_command("pd-proxy", args), capture_output=True, text=True, timeout=30)
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], out.stderr
    assert "READY" not in out.stdout


def test_a_taken_port_is_one_error_line(r: Rig) -> None:
    out = subprocess.run(node_command("pd-proxy", ["--port", str(r.par.port), "--prefill", r.p.url,
                                                   "--prefill-bootstrap", r.b.url, "--decode", r.d.url]),
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert lines[-1].startswith("error: --port: cannot bind"), out.stderr


def test_sigterm_with_a_request_in_flight_exits_0_and_leaves_nothing(r: Rig) -> None:
    px = start_proxy(r.tmp, "term", prefill=r.p.url, bootstrap=r.b.url, decode=r.d.url, timeout_s=30)
    px.ctl("hold", phase="after_prefill", count=1, seconds=30)
    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(lambda: px.post(body("term")))
        wait_for(lambda: px.stats()["holding"] == 1, 5.0, "the request to be held")
        t = time.monotonic()
        px.handle.proc.send_signal(signal.SIGTERM)
        code = px.handle.proc.wait(timeout=10)
        assert code == 0 and time.monotonic() - t < 5.0
        try:  # the held client is answered (503) or its connection closed; it never hangs
            resp, _ = fut.result(10)
            assert resp.status_code == 503 and err(resp)["type"] == "shutting_down"
        except requests.ConnectionError:
            pass
    with pytest.raises(ProcessLookupError):
        os.killpg(px.handle.pid, 0)  # no process left in the node's group
    assert px.handle.stop() == 0
    assert not os.path.exists(px.control[len("ipc://"):])
    log = open(px.log).read()
    assert "pd-proxy stopping" in log and "Traceback" not in log


def test_no_prompt_text_or_ids_in_the_proxy_logs(r: Rig) -> None:
    assert r.par.post(body("log"))[0].status_code == 200
    tid = r.d.requests[-1]["body"]["kv_transfer_params"]["transfer_id"]
    logs = {name: open(os.path.join(r.tmp, f"{name}.log")).read() for name in ("parallel", "sequential")}
    logs.update({n[:-4]: open(os.path.join(r.tmp, n)).read() for n in os.listdir(r.tmp) if n.endswith(".log")})
    assert "req " in logs["parallel"]  # it does log, one line per request
    for name, text in logs.items():
        for p in _PROMPTS:
            assert p not in text and "llamas" not in text, f"prompt text in the {name} log"
        assert tid not in text and ENGINE not in text and D_TEXT not in text, f"an id or a body in the {name} log"
        assert not re.search(r"[0-9a-f]{32}", text), f"a long hex run in the {name} log"


# --------------------------------------------------------------------------- --protocol kv-params
# vllm-ascend's MooncakeConnectorV1: P answers first with the kv_transfer_params D needs.

V1_ANSWER = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[3, 4, 5]],
             "remote_engine_id": "eng-v1", "remote_request_id": "cmpl-p-0", "remote_host": "127.0.0.1",
             "remote_port": 30001, "remote_ptp_size": 1, "last_token_id": 17, "num_prompt_blocks": 3}


@pytest.fixture(scope="module")
def kvp(rig: Rig) -> Iterator[Proxy]:
    yield from _protocol_proxy(rig, "kvparams", "kv-params")


def test_kv_params_d_gets_what_p_answered(r: Rig, kvp: Proxy) -> None:
    r.p.kv_answer = dict(V1_ANSWER)
    req = body("v1")
    resp, _ = kvp.post(req)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["text"] == D_TEXT
    assert r.b.requests == []  # no bootstrap in this protocol
    (p_rec,), (d_rec,) = r.p.requests, r.d.requests
    assert p_rec["body"]["kv_transfer_params"] == {"do_remote_decode": True, "do_remote_prefill": False,
                                                   "remote_engine_id": None, "remote_block_ids": None,
                                                   "remote_host": None, "remote_port": None}
    assert p_rec["body"]["max_tokens"] == 1
    d_body = dict(d_rec["body"])
    assert d_body.pop("kv_transfer_params") == V1_ANSWER and d_body == req
    assert d_rec["t"] >= p_rec["answered"]  # sequential: D only after P answered


def test_kv_params_p_answer_without_params_is_502_and_d_is_not_asked(r: Rig, kvp: Proxy) -> None:
    resp, _ = kvp.post(body("v1-none"))  # the stand-in P answers no kv_transfer_params
    assert resp.status_code == 502
    e = err(resp)
    assert e["type"] == "no_kv_params" and e["phase"] == "prefill"
    assert r.d.requests == []


def test_kv_params_hooks_apply_but_redirect_is_refused(r: Rig, kvp: Proxy) -> None:
    r.p.kv_answer = dict(V1_ANSWER)
    kvp.ctl("bad_params", count=1, drop=["remote_host", "remote_port"])
    resp, _ = kvp.post(body("v1-drop"))
    assert resp.status_code == 200, resp.text
    sent = r.d.requests[0]["body"]["kv_transfer_params"]
    assert "remote_host" not in sent and "remote_port" not in sent and sent["remote_engine_id"] == "eng-v1"
    with pytest.raises(ControlError, match="redirect: needs --protocol bootstrap"):
        kvp.ctl("redirect", count=1, bootstrap=r.b.url)


# --------------------------------------------------------------------------- --protocol store
# vLLM's MooncakeStoreConnector: P and D meet in the KV pool; nothing passes between them.


@pytest.fixture(scope="module")
def st(rig: Rig) -> Iterator[Proxy]:
    yield from _protocol_proxy(rig, "store", "store")


def test_store_p_first_then_d_and_neither_gets_kv_params(r: Rig, st: Proxy) -> None:
    req = body("st")
    req["kv_transfer_params"] = {"do_remote_prefill": True}  # a client's params never reach P or D
    resp, _ = st.post(req)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["text"] == D_TEXT
    assert r.b.requests == []  # no bootstrap in this protocol
    (p_rec,), (d_rec,) = r.p.requests, r.d.requests
    assert "kv_transfer_params" not in p_rec["body"] and p_rec["body"]["max_tokens"] == 1
    assert "kv_transfer_params" not in d_rec["body"]
    assert d_rec["body"]["prompt"] == req["prompt"] and d_rec["body"]["max_tokens"] == req["max_tokens"]
    assert d_rec["t"] >= p_rec["answered"]  # sequential: D only after P answered


def test_store_hooks_apply_but_bad_params_and_redirect_are_refused(r: Rig, st: Proxy) -> None:
    st.ctl("abort", phase="after_prefill", count=1)
    resp, _ = st.post(body("st-abort"))
    assert resp.status_code == 502 and err(resp)["type"] == "aborted"
    assert len(r.p.requests) == 1 and r.d.requests == []
    with pytest.raises(ControlError, match="D gets no kv_transfer_params under --protocol store"):
        st.ctl("bad_params", count=1, drop=["transfer_id"])
    with pytest.raises(ControlError, match="redirect: needs --protocol bootstrap"):
        st.ctl("redirect", count=1, bootstrap=r.b.url)


# --------------------------------------------------------------------------- --protocol layerwise
# vllm-ascend's decoder-first MooncakeLayerwiseConnector: D first; D's POST to the metaserver asks P.


@pytest.fixture(scope="module")
def lw(rig: Rig) -> Iterator[Proxy]:
    yield from _protocol_proxy(rig, "layerwise", "layerwise")


def test_layerwise_d_first_then_p_through_the_metaserver(r: Rig, lw: Proxy) -> None:
    before = lw.stats()
    req = body("lw")
    resp, _ = lw.post(req)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["text"] == D_TEXT and r.b.requests == []
    (d_rec,), (p_rec,) = r.d.requests, r.p.requests
    rid = d_rec["request_id"]
    assert re.fullmatch(r"[0-9a-f]{32}", rid) and p_rec["request_id"] == rid
    assert d_rec["body"]["kv_transfer_params"] == {
        "do_remote_decode": False, "do_remote_prefill": True, "metaserver": f"{lw.url}/v1/metaserver"}
    assert d_rec["meta"] == [(200, {})]
    p_kv = p_rec["body"]["kv_transfer_params"]
    assert p_kv["request_id"] == f"cmpl-{rid}-0" and p_kv["do_remote_decode"] is True  # what D posted
    assert p_rec["body"]["max_tokens"] == 1 and p_rec["body"]["min_tokens"] == 1 and p_rec["t"] < d_rec["answered"]
    after = lw.stats()
    assert delta(after, before, "metaserver_posts") == 1 and delta(after, before, "ok") == 1


def test_layerwise_p_failure_is_the_clients_answer_and_counted_once(r: Rig, lw: Proxy) -> None:
    r.p.mode = "status"
    before = lw.stats()
    resp, took = lw.post(body("lw-p500"))
    assert resp.status_code == 502 and took < TIMEOUT_S  # not D's timeout
    e = err(resp)
    assert e["phase"] == "prefill" and e["type"] == "bad_status" and e["upstream_status"] == 500, e
    assert len(r.p.requests) == 1
    after = lw.stats()
    assert delta(after, before, "errors", "prefill", "bad_status") == 1 and delta(after, before, "ok") == 0


def test_layerwise_a_second_post_is_refused_and_p_asked_once(r: Rig, lw: Proxy) -> None:
    r.d.meta_twice = True
    resp, _ = lw.post(body("lw-twice"))
    assert resp.status_code == 200, resp.text
    assert [st for st, _ in r.d.requests[0]["meta"]] == [200, 409] and len(r.p.requests) == 1


def test_layerwise_metaserver_refuses_unknown_ids_and_bad_bodies(r: Rig, lw: Proxy) -> None:
    before = lw.stats()
    with requests.Session() as http:
        http.trust_env = False
        gone = http.post(f"{lw.url}/v1/metaserver", json={"request_id": "cmpl-nope-0"}, timeout=5)
        bad = http.post(f"{lw.url}/v1/metaserver", data=b"not json", timeout=5)
    assert gone.status_code == 404 and gone.json()["error"]["type"] == "unknown_request"
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "bad_request"
    after = lw.stats()
    assert delta(after, before, "metaserver_unknown") == 1 and delta(after, before, "metaserver_bad") == 1
    assert r.p.requests == []


def test_hooks_a_protocol_cannot_take_are_refused(r: Rig, lw: Proxy, kvp: Proxy) -> None:
    for cmd, fields in (("hold", {"phase": "after_prefill", "count": 1, "seconds": 1}),
                        ("abort", {"phase": "after_prefill", "count": 1})):
        with pytest.raises(ControlError, match="this proxy speaks layerwise"):
            lw.ctl(cmd, **fields)
    with pytest.raises(ControlError, match="under --protocol kv-params"):
        kvp.ctl("bad_params", count=1, drop=["transfer_id"])
    with pytest.raises(ControlError, match="under --protocol layerwise"):
        lw.ctl("bad_params", count=1, drop=["remote_host"])
    try:
        lw.ctl("bad_params", count=1, drop=["metaserver"])
        kvp.ctl("hold", phase="after_prefill", count=1, seconds=1)  # kv-params has that phase
        assert lw.stats()["hooks"]["bad_params"]["drop"] == ["metaserver"]
    finally:
        for px in (lw, kvp):
            px.ctl("clear")  # armed hooks would reach the next test's request


def test_layerwise_p_is_not_cancelled_when_d_answers_first(r: Rig, lw: Proxy) -> None:
    """D answers before P did (its POST to the metaserver runs beside its request): the client
    gets D's answer, and P's request still runs to its end rather than being cut off."""
    r.d.meta_nowait = True
    r.p.delay_s = 0.5
    resp, _ = lw.post(body("lw-d-first"))
    assert resp.status_code == 200, resp.text
    wait_for(lambda: r.p.requests and r.p.requests[0]["answered"], timeout=5, what="P's answer")
    assert r.p.requests[0]["disconnected"] is None
    wait_for(lambda: r.d.requests[0].get("meta"), timeout=5, what="the metaserver's answer to D")
    assert r.d.requests[0]["meta"] == [(200, {})]
