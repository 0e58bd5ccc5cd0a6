"""The pd family's nodes, for real: a prefill and a decode ``vllm`` node (real vLLM 0.32.0 CPU
servers of the tiny model with vLLM's MooncakeConnector over TCP, started through
``pdchaos node vllm`` exactly as the topology starts them), one disaggregated request driven
by hand the way the P/D proxy protocol goes (docs: /work/shared/pd-on-cpu.md, part A), and the
``pd-workload`` node against the real decode server.

Skipped (with the reason) only when the P/D node stack or the tiny model is not installed here
(``pdchaos setup --only pd-node-stack --only pd-tiny-model``). One module-scoped P/D pair (two
vLLM servers take ~4.5 GB RSS each and 20 s to minutes to start on 2 cores). Run with ``-s`` to
see the measurements (start-up times, RSS, request latency, the /metrics counters found).
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from nodekit.control import control_call
from families.pd import metrics as M
from families.pd.workload import make_prompts, post_json
from stacks.vllm_cpu.smoke import group_pids
from stacks.vllm_cpu.steps import PdStackStep, TinyModelStep
from harness.procs import ProcHandle, start_node


def _stack_missing() -> str | None:
    for step in (PdStackStep(), TinyModelStep()):
        if step.check() is None:
            return (f"the P/D node stack is not installed here ({step.name}): "
                    "run `pdchaos setup --only pd-node-stack --only pd-tiny-model`")
    return None


MISSING = _stack_missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")

READY_TIMEOUT_S = 400.0
REQUEST_TIMEOUT_S = 120.0
P_NOT_READY = "Timeout waiting for P side ready"  # vLLM 0.32.0 mooncake_connector.py, P's reply to a pull
EXPECTED_COUNTERS = (  # what vLLM 0.32.0 exports and the node must pass on (see families/pd/metrics.py)
    "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prompt_tokens_total",
    "prompt_tokens_by_source_total{source=external_kv_transfer}", "prompt_tokens_by_source_total{source=local_compute}",
    "request_success_total{finished_reason=length}", "request_success_total{finished_reason=error}",
    "generation_tokens_total", "e2e_request_latency_seconds_count", "cpu_s", "rss_mib", "metrics_ok")


def say(line: str) -> None:
    print(f"[pd-nodes] {line}", flush=True)


def free_port() -> int:
    from harness.topology import free_tcp_port

    return free_tcp_port()


class Server:
    def __init__(self, role: str, core: int, folder: Path):
        self.role, self.core = role, core
        self.port, self.bootstrap_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.bootstrap = f"http://127.0.0.1:{self.bootstrap_port}"
        self.control = f"ipc://{folder}/{role}-ctl.sock"
        self.server_log = folder / f"{role}-server.log"
        self.node_log = folder / f"{role}-node.log"
        self.handle: ProcHandle | None = None
        self.startup_s: float | None = None
        self.error: BaseException | None = None

    def start(self) -> None:
        t0 = time.monotonic()
        try:
            self.handle = start_node(
                "vllm", ["--role", self.role, "--port", str(self.port), "--bootstrap-port", str(self.bootstrap_port),
                         "--cpu-core", str(self.core), "--policy", "fail", "--abort-timeout-s", "30",
                         "--startup-timeout-s", "380", "--server-log", str(self.server_log),
                         "--control", self.control],
                log_path=str(self.node_log), ready_timeout_s=READY_TIMEOUT_S)
            self.startup_s = round(time.monotonic() - t0, 1)
        except BaseException as exc:  # noqa: BLE001 - reported by the fixture
            self.error = exc

    def stats(self) -> dict:
        return control_call(self.control, "stats", timeout_ms=3000)

    def counters(self) -> dict:
        return control_call(self.control, "metrics", timeout_ms=3000)["counters"]


@pytest.fixture(scope="module")
def pd_pair() -> Iterator[tuple[Server, Server]]:
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="pdn", dir="/tmp"))  # short: ipc paths max 107 bytes
    p, d = Server("prefill", 0, folder), Server("decode", 1, folder)
    threads = [threading.Thread(target=s.start, name=f"start-{s.role}") for s in (p, d)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    try:
        for s in (p, d):
            if s.error is not None:
                raise AssertionError(f"{s.role} node did not start: {s.error} (node log {s.node_log}, "
                                     f"server log {s.server_log})")
        say(f"start-up to READY: P {p.startup_s} s, D {d.startup_s} s (in parallel, cores 0 and 1)")
        warm_up(p, d)
        yield p, d
    finally:
        for s in (p, d):
            if s.handle is None:
                continue
            pgid = s.handle.pid
            t0 = time.monotonic()
            code = s.handle.stop(40.0)
            say(f"{s.role}: stopped with exit code {code} in {time.monotonic() - t0:.1f} s")
            left = group_pids(pgid)
            assert not left, f"{s.role}: processes {left} of the node's group outlived it"


def warm_up(p: Server, d: Server) -> None:
    """One plain completion of a ~200-token prompt on each server before any test.

    Why: on a host with AMX (this one: Sapphire Rapids), vLLM 0.32.0's CPU attention picks its
    "amx" kernels (``torch.cpu._is_amx_tile_supported()`` reads CPUID only), but nothing asks
    Linux for the AMX tile permission (``arch_prctl(ARCH_REQ_XCOMP_PERM)``, what
    ``torch._C._cpu._init_amx()`` does) unless oneDNN JITs an AMX GEMM first, which a forward
    step of many tokens does and a step of one or a few tokens does not. A server whose first
    step is small (D's first step after a KV pull, or a 1-token prompt) dies with SIGILL
    (Worker exit -4, "EngineCore encountered an issue"): measured here, and fixed by calling
    ``torch._C._cpu._init_amx()`` in every vLLM process (an environment fix for the CPU shim,
    stacks/vllm_cpu/pdchaos_cpu_shim). Until the shim does it, a big first step gets the permission."""
    prompt = one_prompt(d)
    for s in (p, d):
        status, data, took = completion(s.url, prompt, 1)
        assert status == 200, f"{s.role}: warm-up answered {status}: {data}"
        say(f"{s.role}: warm-up completion in {took * 1000:.0f} ms")


def completion(url: str, prompt: str, max_tokens: int, kv: dict | None = None) -> tuple[int, Any, float]:
    from stacks.vllm_cpu.tiny_model import model_dir

    body: dict[str, Any] = {"model": str(model_dir()), "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if kv is not None:
        body["kv_transfer_params"] = kv
    t0 = time.monotonic()
    status, data = post_json(url + "/v1/completions", body, REQUEST_TIMEOUT_S)
    return status, data, time.monotonic() - t0


def one_prompt(d: Server, tokens: int = 200) -> str:
    from stacks.vllm_cpu.tiny_model import model_dir

    cfg = {"seed": f"test-{uuid.uuid4().hex}", "prompt_tokens": tokens, "decode_url": d.url, "model": str(model_dir())}
    return make_prompts(cfg, 1, time.monotonic() + 60)[0][0]


# --------------------------------------------------------------------------- the vllm nodes

@pytest.mark.timeout(900)
def test_vllm_nodes_report_stats_and_metrics(pd_pair: tuple[Server, Server]) -> None:
    p, d = pd_pair
    for s in (p, d):
        st = s.stats()
        assert st["ok"] and st["alive"] is True and st["role"] == s.role
        # vLLM runs in the node's own process group: a SIGSTOP/SIGKILL of the group reaches it
        assert os.getpgid(st["server_pid"]) == s.handle.pid
        members = group_pids(s.handle.pid)
        assert len(members) >= 4, members  # node, vLLM's API server, EngineCore, Worker (+ resource tracker)
        c = st["counters"]
        missing = [k for k in EXPECTED_COUNTERS if k not in c]
        assert not missing, f"{s.role}: counters lack {missing}; have {sorted(c)}"
        assert c["metrics_ok"] == 1 and c["cpu_s"] > 0 and c["rss_mib"] > 1000
        assert st["cpu_s"] == c["cpu_s"] and st["rss_mib"] == c["rss_mib"]
        # the node's own process stats from the ControlServer
        assert st["pid"] == s.handle.pid and st["threads"] >= 2 and st["fds"] > 0
        say(f"{s.role}: {len(members)} processes, RSS {c['rss_mib']:.0f} MiB, CPU {c['cpu_s']:.1f} s so far, "
            f"{len(c)} counters")
        # the `metrics` command: the scrape alone
        m = s.counters()
        assert "num_requests_running" in m and "cpu_s" not in m
        # vLLM's own log is in --server-log, not in the node's log
        node_log = s.node_log.read_text()
        assert "READY" in node_log and "Application startup complete" not in node_log
        assert "Application startup complete" in s.server_log.read_text()
    # only a kv consumer reports KV fetches by stage
    assert "num_requests_kv_fetch_by_stage{stage=in_progress}" in d.counters()
    assert not any(k.startswith("num_requests_kv_fetch_by_stage") for k in p.counters())
    # P's engine id (random) as its bootstrap server tells it
    status, body = M.http_get(p.bootstrap + "/query", 5.0)
    assert status == 200 and json.loads(body)["0"]["engine_id"] == p.stats()["engine_id"]
    # prometheus_client's parser and the fallback read the live scrape alike
    status, raw = M.http_get(d.url + "/metrics", 5.0)
    text = raw.decode()
    assert status == 200 and M.parse_text(text) == M.parse_text_fallback(text)
    names = sorted({s.name for s in M.parse_text(text) if s.name.startswith("vllm:")
                    and not s.name.endswith(("_bucket", "_created"))})
    say(f"/metrics of D: {len(names)} vllm: sample names: {', '.join(n[5:] for n in names)}")
    say(f"D's counters: {', '.join(sorted(d.counters()))}")


@pytest.mark.timeout(900)
def test_one_disaggregated_request_pulls_kv_and_matches(pd_pair: tuple[Server, Server]) -> None:
    """The proxy protocol by hand: P's engine id from its bootstrap /query, P asked for one token
    with do_remote_decode and, at the same time, D with do_remote_prefill + P's bootstrap address
    + engine id + the same transfer id. D must pull the prompt's KV (its /metrics count prompt
    tokens from external_kv_transfer, none computed locally) and its text must equal D's own
    non-disaggregated output.

    One upstream fault is tolerated once, and reported: D's pull failing with "Timeout waiting
    for P side ready" although P answered its request. Seen in 2 of ~15 runs of this module on a
    loaded machine (both times in the second round, the first whose pull can reach P before P
    has scheduled the request); not reproduced in 450 further rounds, with or without CPU hogs.
    It is P's connector never marking the transfer ready, not this harness (P's HTTP answer is
    200 and D's error is P's own FINISH/err_reqs reply), so the test needs three good rounds and
    fails on a second such fault or on any other error."""
    p, d = pd_pair
    status, body = M.http_get(p.bootstrap + "/query", 5.0)
    assert status == 200
    engine_id = json.loads(body)["0"]["engine_id"]
    latencies: list[int] = []
    upstream_faults = 0
    while len(latencies) < 3:  # the first round also sets up D's connection to P
        round_ = len(latencies) + upstream_faults
        prompt = one_prompt(d)
        before_d, before_p = d.counters(), p.counters()
        transfer_id = f"xfer-{uuid.uuid4().hex}"
        results: dict[str, tuple[int, Any, float]] = {}

        def ask_p() -> None:
            results["p"] = completion(p.url, prompt, 1, {"do_remote_decode": True, "do_remote_prefill": False,
                                                         "transfer_id": transfer_id})

        def ask_d() -> None:
            results["d"] = completion(d.url, prompt, 16, {"do_remote_decode": False, "do_remote_prefill": True,
                                                          "remote_bootstrap_addr": p.bootstrap,
                                                          "remote_engine_id": engine_id,
                                                          "transfer_id": transfer_id})

        threads = [threading.Thread(target=ask_p), threading.Thread(target=ask_d)]
        t0 = time.monotonic()
        for th in threads:
            th.start()
        for th in threads:
            th.join(REQUEST_TIMEOUT_S + 10)
        pd_latency = time.monotonic() - t0
        assert not any(th.is_alive() for th in threads), "a request did not come back"
        (p_status, p_data, p_s), (d_status, d_data, d_s) = results["p"], results["d"]
        assert p_status == 200, p_data
        if d_status != 200 and upstream_faults == 0 and P_NOT_READY in d.server_log.read_text():
            upstream_faults += 1
            say(f"round {round_ + 1}: upstream fault tolerated once: D answered {d_status} after {d_s:.1f} s, "
                f"D's log says {P_NOT_READY!r}; P finished with {p_data['choices'][0].get('finish_reason')!r}")
            continue
        assert d_status == 200, (d_data, f"D's log: {d.server_log}")
        prompt_tokens = d_data["usage"]["prompt_tokens"]
        after_d, after_p = d.counters(), p.counters()
        ext = "prompt_tokens_by_source_total{source=external_kv_transfer}"
        local = "prompt_tokens_by_source_total{source=local_compute}"
        pulled = after_d[ext] - before_d[ext]
        computed = after_d[local] - before_d[local]
        assert pulled > 0, f"D pulled no KV: {ext} {before_d[ext]} -> {after_d[ext]}"
        assert computed == 0 and pulled == prompt_tokens, (pulled, computed, prompt_tokens)
        assert after_p[local] - before_p[local] == prompt_tokens  # P prefilled it
        # the same text as D alone (the non-disaggregated reference)
        r_status, r_data, r_s = completion(d.url, prompt, 16)
        assert r_status == 200
        assert d_data["choices"][0]["text"] == r_data["choices"][0]["text"]
        assert d.counters()[local] - before_d[local] == prompt_tokens  # that one D computed itself
        latencies.append(round(pd_latency * 1000))
        say(f"P/D request {round_ + 1} ({prompt_tokens} prompt tokens, 16 output): {pd_latency * 1000:.0f} ms "
            f"(P {p_s * 1000:.0f} ms, D {d_s * 1000:.0f} ms); D alone {r_s * 1000:.0f} ms; D pulled {pulled:g} "
            f"prompt tokens; texts equal")
    say(f"P/D latencies (ms): {latencies}")


# --------------------------------------------------------------------------- the workload node

def run_workload(cfg: dict, folder: Path, env: dict | None = None, go: bool = True) -> tuple[list[dict], str, int]:
    """Start a pd-workload node, start it with SIGUSR1, wait for it: (journal records, log, exit code)."""
    cfg_path, part, log = folder / "workload.json", folder / "client.part.jsonl", folder / "workload.log"
    cfg_path.write_text(json.dumps(cfg))
    for f in (part, log):
        f.unlink(missing_ok=True)
    t0 = time.monotonic()
    h = start_node("pd-workload", ["--config", str(cfg_path), "--journal", str(part)], log_path=str(log),
                   ready_timeout_s=300.0, env=env)
    ready_s = time.monotonic() - t0
    try:
        if go:
            os.kill(h.pid, signal.SIGUSR1)
        code = h.proc.wait(cfg["duration_s"] + cfg["request_timeout_s"] + 60)
    finally:
        h.stop()
    say(f"workload: READY after {ready_s:.1f} s, exit {code}")
    records = [json.loads(line) for line in part.read_text().splitlines()] if part.exists() else []
    return records, log.read_text(), code


def ops_of(records: list[dict]) -> tuple[dict[int, dict], dict[int, dict]]:
    inv = {r["id"]: r for r in records if r["type"] == "op" and r["phase"] == "invoke"}
    done = {r["id"]: r for r in records if r["type"] == "op" and r["phase"] != "invoke"}
    return inv, done


def base_config(d: Server, folder: Path, **over: Any) -> dict:
    from stacks.vllm_cpu.tiny_model import model_dir

    cfg = {"proxy_url": d.url, "decode_url": d.url, "duration_s": 2.0, "concurrency": 2, "rate": 4.0,
           "prompt_tokens": 200, "output_tokens": 16, "request_timeout_s": 30.0, "seed": 20261130,
           "model": str(model_dir()), "prompts_path": str(folder / "prompts.json"), "go_timeout_s": 30.0}
    cfg.update(over)
    return cfg


@pytest.mark.timeout(900)
def test_workload_computes_references_and_runs(pd_pair: tuple[Server, Server], tmp_path: Path) -> None:
    """References are computed on D (then cached: a second run computes none), written to
    prompts_path; a 2 s run with proxy_url pointed at D itself records ok ops whose value is the
    reference; baseline and final probes; no prompt or output in the node's log."""
    _, d = pd_pair
    cache = tmp_path / "xdg-cache"  # a fresh reference cache, so the first run computes them
    env = {"XDG_CACHE_HOME": str(cache)}
    cfg = base_config(d, tmp_path)
    records, log, code = run_workload(cfg, tmp_path, env)
    assert code == 0, log
    items = json.loads(Path(cfg["prompts_path"]).read_text())
    n = math.ceil(cfg["duration_s"] * cfg["rate"] * 1.2) + cfg["concurrency"]
    assert len(items) == n and len({i["prompt"] for i in items}) == n
    assert all(isinstance(i["expected"], str) and i["expected"] for i in items)
    assert all(180 <= i["prompt_tokens"] <= 200 for i in items), [i["prompt_tokens"] for i in items]
    assert len(list((cache / "pdchaos" / "reference").glob("*.json"))) == n
    assert f"reference_hits 0, reference_computed {n}" in log
    inv, done = ops_of(records)
    assert inv and set(inv) == set(done), "every invoke has its completion"
    assert all(o["phase"] == "ok" and o["outcome"] == "ok" and o["status"] == 200 for o in done.values())
    assert all(done[i]["value"] == inv[i]["expected"] for i in inv)
    assert all(inv[i]["expected"] == items[inv[i]["prompt_index"]]["expected"] for i in inv)
    # the output tokens' digest (vLLM's return_token_ids), never the ids: on both sides, equal
    assert all(isinstance(i["expected_ids"], str) and len(i["expected_ids"]) == 24 for i in items)
    assert all(done[i]["value_ids"] == inv[i]["expected_ids"] == items[inv[i]["prompt_index"]]["expected_ids"]
               for i in inv)
    assert 6 <= len(done) <= 10, len(done)  # 2 s at 4 requests/s
    probes = [r for r in records if r["type"] == "probe"]
    assert [p["when"] for p in probes] == ["baseline", "final"]
    assert probes[0]["kind"] == "pd-workload" and probes[1]["counters"]["ops_ok"] == len(done)
    assert probes[1]["stuck_workers"] == 0
    for item in items:  # log hygiene: counts and times only
        assert item["prompt"] not in log and item["expected"] not in log
    say(f"workload: {len(done)} ops, median {sorted(o['elapsed_ms'] for o in done.values())[len(done) // 2]:.0f} ms")
    # the same seed again: every reference from the cache
    records, log, code = run_workload(cfg, tmp_path, env)
    assert code == 0 and f"reference_hits {n}, reference_computed 0" in log, log
    assert json.loads(Path(cfg["prompts_path"]).read_text()) == items


class _StubProxy(BaseHTTPRequestHandler):
    """Answers completions alternately with a 503 JSON error and with nothing for 3 s."""

    n = 0
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with _StubProxy.lock:
            _StubProxy.n += 1
            hang = _StubProxy.n % 2 == 0
        if hang:
            time.sleep(3.0)
            return
        body = json.dumps({"error": {"type": "PrefillUnavailable", "phase": "prefill", "message": "stub"}}).encode()
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.timeout(900)
def test_workload_records_errors_stalls_and_refusals(pd_pair: tuple[Server, Server], tmp_path: Path) -> None:
    _, d = pd_pair
    stub = ThreadingHTTPServer(("127.0.0.1", 0), _StubProxy)
    stub.daemon_threads = True
    threading.Thread(target=stub.serve_forever, daemon=True).start()
    try:
        cfg = base_config(d, tmp_path, proxy_url=f"http://127.0.0.1:{stub.server_address[1]}",
                          request_timeout_s=1.0, rate=2.0, grace_s=5.0)
        records, log, code = run_workload(cfg, tmp_path)
    finally:
        stub.shutdown()
        stub.server_close()
    assert code == 0, log
    inv, done = ops_of(records)
    assert set(inv) == set(done)
    failed = [o for o in done.values() if o["phase"] == "fail"]
    stalled = [o for o in done.values() if o["phase"] == "info"]
    assert failed and stalled and len(failed) + len(stalled) == len(done)
    assert all(o["outcome"] == "http_503" and o["code"] == "PrefillUnavailable" and o["status"] == 503
               and o["value"] is None and o["error_phase"] == "prefill" for o in failed)
    assert all(o["outcome"] == "stalled" and o["code"] == "timeout" and 950 <= o["elapsed_ms"] <= 1500
               for o in stalled), [o["elapsed_ms"] for o in stalled]
    # nobody listening: refused, a definite failure
    cfg = base_config(d, tmp_path, proxy_url=f"http://127.0.0.1:{free_port()}", request_timeout_s=2.0)
    records, log, code = run_workload(cfg, tmp_path)
    assert code == 0, log
    _, done = ops_of(records)
    assert done and all(o["phase"] == "fail" and o["outcome"] == "connect"
                        and o["code"] == "ConnectionRefusedError" for o in done.values())
    # no start signal: READY, then it leaves on its own after go_timeout_s, with no op
    cfg = base_config(d, tmp_path, go_timeout_s=1.0)
    records, log, code = run_workload(cfg, tmp_path, go=False)
    assert code == 0 and not ops_of(records)[0]
