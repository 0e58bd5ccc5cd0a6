"""A decode node (D) and a prefill node (P) of vllm-ascend's MooncakeLayerwiseConnector in one Python
process, on CPU, with the stand-ins a layerwise P/D pair needs around the connector:

* real: vllm-ascend's ``MooncakeLayerwiseConnector`` (worker and scheduler sides, built by their own
  ``__init__`` and ``register_kv_caches`` from a real ``VllmConfig``), its listener and sending threads,
  its ZMQ side channel (GET_META, DONE, FAILED) and its httpx POST to the metaserver; D's scheduler
  is vLLM's own v1 ``Scheduler``, which builds D's scheduler-side connector itself;
* the model: a two-layer llama ``config.json`` (no weights); the forward pass is a stand-in (no
  model runs: each of P's layers is "computed" and saved through the connector's ``save_kv_layer``);
* ``StandInEngine``: in the place of Mooncake's NPU transfer engine (``global_te``), which a CPU host
  has not: it records each write (which of D's layers, when) and can be made slow, raise or
  return -1, as a real engine does when its session breaks;
* ``StandInMetaserver``: the proxy's metaserver D POSTs each request to: it forwards the request to
  P (answers 200 at once), or drops it, holds the connection, or answers 500;
* ``Relay``: a TCP relay between P and D's listener (where a network fault sits): it can drop the
  bytes of one direction for a while, as a broken link does.

Log lines carry counts, codes and times only.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")  # get_ip(): the side channel binds loopback only
os.environ.setdefault("VLLM_PLUGINS", "")

import ut_stubs  # noqa: E402

ut_stubs.load()  # vllm-ascend's own tests/ut/conftest.py: torch_npu, acl, torch.npu, mooncake.engine

import torch  # noqa: E402
import vllm_ascend  # noqa: E402,F401

from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, ParallelConfig,  # noqa: E402
                         SchedulerConfig, VllmConfig, set_current_vllm_config)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor  # noqa: E402

CONNECTOR = "MooncakeLayerwiseConnector"
if CONNECTOR not in KVConnectorFactory._registry:
    from vllm_ascend.distributed.kv_transfer import register_connector

    register_connector()  # what vllm-ascend's platform plugin does at start-up

from vllm_ascend.ascend_config import init_ascend_config  # noqa: E402
from vllm_ascend.distributed.kv_transfer.kv_p2p import mooncake_layerwise_connector as lw  # noqa: E402
from vllm_ascend.distributed.kv_transfer.utils.mooncake_transfer_engine import global_te  # noqa: E402

LAYERS, BLOCK, BLOCKS, HEADS, HEAD = 2, 16, 32, 2, 32
T0 = time.monotonic()


def now() -> float:
    """Seconds since the script started."""
    return time.monotonic() - T0


def say(text: str) -> None:
    print(f"repro: {now():6.2f}s {text}", flush=True)


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def layer_names() -> list[str]:
    return [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]


def model_dir() -> str:
    folder = Path(tempfile.mkdtemp(prefix="lw-model-"))
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HEADS * HEAD,
        "intermediate_size": 128, "num_attention_heads": HEADS, "num_key_value_heads": HEADS,
        "num_hidden_layers": LAYERS, "vocab_size": 256, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
        "torch_dtype": "float32", "tie_word_embeddings": False}))
    return str(folder)


def vllm_config(role: str, kv_port: int, engine_id: str, extra: dict) -> VllmConfig:
    model = ModelConfig(model=model_dir(), tokenizer=None, skip_tokenizer_init=True, dtype=torch.float32,
                        max_model_len=512, seed=0)
    kv = KVTransferConfig(kv_connector=CONNECTOR, kv_role=role, kv_port=kv_port, engine_id=engine_id,
                          kv_connector_extra_config=dict(extra), kv_load_failure_policy="fail")
    cfg = VllmConfig(model_config=model, cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False),
                     parallel_config=ParallelConfig(), device_config=DeviceConfig("cpu"),
                     scheduler_config=SchedulerConfig(max_model_len=512, is_encoder_decoder=False,
                                                      async_scheduling=False),
                     kv_transfer_config=kv)
    cfg.cache_config.num_gpu_blocks = BLOCKS
    return cfg


def kv_cache_config() -> KVCacheConfig:
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.float32)
    names = layer_names()
    return KVCacheConfig(num_blocks=BLOCKS, kv_cache_groups=[KVCacheGroupSpec(names, spec)],
                         kv_cache_tensors=[KVCacheTensor(size=spec.page_size_bytes * BLOCKS, shared_by=[n])
                                           for n in names])


_dist_ready = False


def init_distributed() -> None:
    """vLLM's world and model-parallel groups of one CPU worker (gloo, world size 1), once."""
    global _dist_ready
    if _dist_ready:
        return
    from vllm.distributed.parallel_state import ensure_model_parallel_initialized, init_distributed_environment

    init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{free_port()}",
                                 local_rank=0, backend="gloo")
    ensure_model_parallel_initialized(1, 1)
    _dist_ready = True


def worker_side(cfg: VllmConfig, engine: "StandInEngine") -> tuple:
    """The connector's worker side for ``cfg`` (its own ``__init__`` and ``register_kv_caches`` over
    CPU KV tensors: D's listener or P's sending thread starts there), ``engine`` in the place of
    Mooncake's transfer engine. Returns (connector, caches)."""
    with set_current_vllm_config(cfg):
        init_ascend_config(cfg)
        init_distributed()
        global_te.transfer_engine = engine
        worker = lw.MooncakeLayerwiseConnector(cfg, KVConnectorRole.WORKER, kv_cache_config())
        shape = (BLOCKS, BLOCK, HEADS, HEAD)
        caches = {n: (torch.zeros(shape), torch.zeros(shape)) for n in layer_names()}
        worker.register_kv_caches(caches)
    return worker, caches


def bounds(recv_timeout_s: float) -> dict:
    """``kv_connector_extra_config``: the bounds a release with them reads (D's deadline
    ``recv_timeout_s``; the metadata query, the metaserver POST and the DONE/FAILED signal 1 s each;
    3 s of grace after the write-by time). A release without them ignores the keys."""
    return {"layerwise_recv_timeout_s": recv_timeout_s, "layerwise_meta_timeout_s": 1.0,
            "metaserver_timeout_s": 1.0, "layerwise_signal_timeout_s": 1.0, "layerwise_write_grace_s": 3.0}


def pair(recv_timeout_s: float, relay: bool = False) -> tuple:
    """D and P with one stand-in engine and a stand-in metaserver forwarding every request to P
    (through a ``Relay`` to D's listener when ``relay``). Returns (engine, D, P, relay or None)."""
    engine = StandInEngine()
    d = Decode(engine, bounds(recv_timeout_s))
    p = Prefill(engine, bounds(recv_timeout_s))
    r = Relay(d.port) if relay else None
    d.metaserver = StandInMetaserver(["forward"], p, rewrite_port=r.port if r else 0)
    return engine, d, p, r


class StandInEngine:
    """In the place of Mooncake's transfer engine (``global_te.transfer_engine``). ``mode``: ``ok``
    (a write succeeds), ``raise`` (it raises), ``fail`` (it returns -1); ``delay_s``: each write takes
    that much longer first. Records which of D's layers each write reached and when it ended."""

    def __init__(self) -> None:
        self.mode, self.delay_s = "ok", 0.0
        self.layer_of: list[tuple[int, int, int]] = []  # D's (base, end, layer), from its caches
        self.writes: list[tuple[float, int, str]] = []  # (end time, layer, outcome)
        self.lock = threading.Lock()

    def initialize(self, *args, **kwargs) -> int:
        return 0

    def get_rpc_port(self) -> int:
        return 17001

    def register_memory(self, ptr: int, size: int) -> int:
        return 0

    def know_decode_caches(self, caches: dict) -> None:
        for layer, (k, v) in enumerate(caches.values()):
            for t in (k, v):
                self.layer_of.append((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), layer))

    def batch_transfer_sync_write(self, session_id: str, src: list, dst: list, length: list) -> int:
        with self.lock:
            mode, delay = self.mode, self.delay_s
        if delay:
            time.sleep(delay)
        layer = next((lay for base, end, lay in self.layer_of if dst and base <= dst[0] < end), -1)
        with self.lock:
            self.writes.append((now(), layer, mode))
        if mode == "raise":
            raise RuntimeError("transfer engine: session broken")
        return -1 if mode == "fail" else 0


class Decode:
    """D: vLLM's v1 Scheduler (it builds D's scheduler-side connector) and D's worker-side connector,
    stepped as vLLM's engine core steps them: ``schedule()``, the step's connector metadata to the
    worker's ``start_load_kv``, the worker's ``get_finished`` and ``get_block_ids_with_load_errors``
    into the step's output, ``update_from_output``. The forward pass is a stand-in (one token, no
    model; every request has ``max_tokens=1``)."""

    def __init__(self, engine: StandInEngine, extra: dict, step_s: float = 0.02):
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.structured_output import StructuredOutputManager

        self.port = free_port()
        self.cfg = vllm_config("kv_consumer", self.port, "decode-0", extra)
        self.worker, self.caches = worker_side(self.cfg, engine)
        engine.know_decode_caches(self.caches)
        with set_current_vllm_config(self.cfg):
            self.sched = Scheduler(vllm_config=self.cfg, kv_cache_config=kv_cache_config(),
                                   structured_output_manager=StructuredOutputManager(self.cfg), block_size=BLOCK,
                                   log_stats=False)
        self.blocks_initial = self.free_blocks()
        self.metaserver: StandInMetaserver | None = None
        self.state: dict[str, str] = {}  # request id -> waiting | done | error
        self.ended: dict[str, float] = {}
        self.started: dict[str, float] = {}
        self.lock = threading.Lock()
        self.pending: list = []
        self.step_s = step_s
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="decode-steps", daemon=True)
        self.thread.start()

    def free_blocks(self) -> int:
        return int(self.sched.kv_cache_manager.block_pool.get_num_free_blocks())

    def admit(self, metaserver: str = "", tokens: int = 64) -> str:
        """A request whose KV P computes (``do_remote_prefill``): D's scheduler gives it blocks and
        POSTs it to ``metaserver`` (default: ``self.metaserver``'s URL). Returns its request id."""
        from vllm import SamplingParams
        from vllm.v1.request import Request

        rid = f"req-{len(self.state) + 1}-{uuid.uuid4().hex[:8]}"  # vLLM's 9-character suffix
        req = Request(rid, [1 + i % 250 for i in range(tokens)], SamplingParams(max_tokens=1), None)
        req.kv_transfer_params = {"do_remote_prefill": True, "metaserver": metaserver or self.metaserver.url}
        with self.lock:
            self.state[rid] = "waiting"
            self.started[rid] = now()
            self.pending.append(req)
        return rid

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._step()
            time.sleep(self.step_s)

    def _step(self) -> None:
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

        with self.lock:
            pending, self.pending = self.pending, []
        for req in pending:
            self.sched.add_request(req)
        so = self.sched.schedule()
        if so.kv_connector_metadata is not None:
            self.worker.bind_connector_metadata(so.kv_connector_metadata)
            try:
                self.worker.start_load_kv(None)
            finally:
                self.worker.clear_connector_metadata()
        sending, recving = self.worker.get_finished(set(so.finished_req_ids))
        invalid = set(self.worker.get_block_ids_with_load_errors() or ())
        ids = list(so.num_scheduled_tokens)
        sampled = [[7] if self.sched.requests[r].num_computed_tokens >= self.sched.requests[r].num_tokens else []
                   for r in ids]
        out = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=sampled,
                                kv_connector_output=KVConnectorOutput(finished_sending=sending or None,
                                                                      finished_recving=recving or None,
                                                                      invalid_block_ids=invalid))
        for eco in self.sched.update_from_output(so, out).values():
            for o in eco.outputs:
                if o.finish_reason is not None and self.state.get(o.request_id) == "waiting":
                    error = str(o.finish_reason).lower().endswith("error")
                    with self.lock:
                        self.state[o.request_id] = "error" if error else "done"
                        self.ended[o.request_id] = now()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(5)


class Prefill:
    """P: the worker-side connector (its sending thread over ``engine``) and a stand-in forward pass:
    a request forwarded with D's transfer params gets P's blocks and its entry in the connector
    metadata (``add_new_req``, as P's scheduler side builds it), then each layer is saved through
    ``save_kv_layer`` (P's connector queries D's metadata and queues the layer for its sending
    thread, which writes it and, after the last layer, tells D DONE or FAILED)."""

    def __init__(self, engine: StandInEngine, extra: dict):
        self.cfg = vllm_config("kv_producer", free_port(), "prefill-0", extra)
        self.worker, self.caches = worker_side(self.cfg, engine)
        self.forwards: list[tuple[float, float]] = []  # (start, seconds) of each forward pass
        self.lock = threading.Lock()

    def forward(self, params: dict) -> None:
        remote = params.get("remote_block_ids") or [[]]
        n = len(remote[0])
        meta = lw.MooncakeLayerwiseConnectorMetadata()
        rid = str(params.get("request_id", "")) + "-" + uuid.uuid4().hex[:8]
        meta.add_new_req(request_id=rid, local_block_ids=[list(range(1, n + 1))],
                         kv_transfer_params=dict(params, remote_cached_tokens=params.get("remote_cached_tokens", 0)),
                         token_ids=[], chunk_finish=True, prompt_len=n * BLOCK, remote_cache_tokens=0,
                         local_computed_tokens=n * BLOCK, local_transed_tokens=0)
        with self.lock:  # one forward pass at a time, as one engine runs them
            t0 = now()
            self.worker.bind_connector_metadata(meta)
            try:
                self.worker.start_load_kv(None)
                for name in layer_names():
                    time.sleep(0.01)  # the layer's compute
                    self.worker.save_kv_layer(name, self.caches[name], None)
            finally:
                self.worker.clear_connector_metadata()
            self.forwards.append((t0, now() - t0))


class StandInMetaserver:
    """The proxy's metaserver: D's scheduler POSTs each request's transfer params here. Each POST
    takes the next of ``plan`` (the last one repeats): ``forward`` (answer 200, hand the request to
    P), ``drop`` (answer 200, never forward), ``hang:S`` (hold the connection S seconds, then close
    it unanswered), ``500`` (answer 500, never forward). ``posts``: (time, request id, what)."""

    def __init__(self, plan: list[str], prefill: Prefill | None = None, rewrite_port: int = 0):
        self.plan, self.prefill, self.rewrite_port = plan, prefill, rewrite_port
        self.posts: list[tuple[float, str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                what = outer.plan[min(len(outer.posts), len(outer.plan) - 1)]
                outer.posts.append((now(), str(body.get("request_id", "")), what))
                if what.startswith("hang:"):
                    time.sleep(float(what.split(":", 1)[1]))
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                code = 500 if what == "500" else 200
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")
                if what == "forward" and outer.prefill is not None:
                    if outer.rewrite_port:  # P reaches D's listener through the relay
                        body["remote_port"] = outer.rewrite_port
                    threading.Thread(target=outer.prefill.forward, args=(body,), daemon=True).start()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.handle_error = lambda request, address: None  # a held connection the client dropped
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/metaserver"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


class Relay:
    """A TCP relay 127.0.0.1:``port`` -> ``target``. ``drop_up`` / ``drop_down``: while set, the bytes
    from the dialling side (P) / from the target (D) are read and thrown away (the connection stays
    open, as on a link that loses every packet)."""

    def __init__(self, target_port: int):
        self.target = ("127.0.0.1", target_port)
        self.drop_up = threading.Event()
        self.drop_down = threading.Event()
        self.dropped = {"up": 0, "down": 0}  # bytes thrown away
        self.srv = socket.socket()
        self.srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(64)
        self.port = self.srv.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            conn, _ = self.srv.accept()
            try:
                up = socket.create_connection(self.target)
            except OSError:
                conn.close()
                continue
            threading.Thread(target=self._pipe, args=(conn, up, self.drop_up, "up"), daemon=True).start()
            threading.Thread(target=self._pipe, args=(up, conn, self.drop_down, "down"), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket, drop: threading.Event, name: str) -> None:
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                if drop.is_set():
                    self.dropped[name] += len(data)
                    continue
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def wait_until(cond, timeout_s: float, poll_s: float = 0.05) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(poll_s)
    return cond()


def run(main) -> None:
    """Exit with ``main()``'s code at once: a POST thread of D's scheduler or a sending thread may
    still wait on a peer, and nothing they hold needs closing."""
    code = main()
    sys.stdout.flush()
    os._exit(code)
