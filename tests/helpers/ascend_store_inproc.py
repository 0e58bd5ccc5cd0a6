"""vLLM's real v1 Scheduler with vllm-ascend's real ``AscendStoreConnector`` (upstream) or
``HardenedAscendStoreConnector`` (connector_patch/lookup/ascend_store.py), driven in-process on CPU,
against lookup servers that are dead, frozen, malformed, legacy or healthy. Run by
tests/connector_patch/test_ascend_store_inproc.py with the conformance env's python (vLLM 0.23.0, vllm-ascend
0.23.0.post1, torch 2.11.0; the harness env has no vLLM).

argv: REPO OUTDIR. Prints vLLM's log lines, then one line ``PDCHAOS-ASCEND-RESULT {json}``:
statuses, counts, codes and times only (never prompt text, token ids, block hashes or keys). Every
block-hash hex this process hands a pool is written to OUTDIR/hashes.txt so that the test can prove
none of them reached a log line. ``ASCEND_INPROC_CASES=a,b`` runs only those groups.

Real here: vLLM's ``Scheduler`` (KV cache manager, block pool, its calls into the connector:
``get_num_new_matched_tokens``, ``update_state_after_alloc``, ``build_connector_meta``,
``reset_prefix_cache(reset_connector=True)`` -> ``reset_cache()``), the scheduler-side connector
that the Scheduler builds itself through vLLM's ``KVConnectorFactory`` from ``kv_transfer_config``
(vllm-ascend's ``AscendStoreConnector`` -> ``KVPoolScheduler`` -> ``LookupKeyClient``, or the
hardened one registered by ``connector_patch.vllm_plugin.register()``), upstream's
``LookupKeyServer`` and ``HardenedLookupKeyServer`` (the worker side), a worker-role
``HardenedAscendStoreConnector`` built by the factory (vllm-ascend's real ``KVPoolWorker`` on a
gloo process group), ZMQ REQ/REP over ipc in ``VLLM_RPC_BASE_PATH``, and processes: a real hardened
lookup server in a child process that is SIGSTOPped, and forked children whose exit status is the
measurement of ``close()``.

Not real: no model runs (a step that schedules tokens gets one constant sampled token per request
that reached its end); the NPU-only modules are pdchaos_npu_stubs (Mooncake's store included); the
pool behind the lookup servers is ``KnownSetPoolWorker``, a small object with upstream
``KVPoolWorker``'s ``lookup_scheduler`` signature answering from a known set of block hashes, with a
``kv_send_thread.request_queue`` of pending stores and ``clear_pool()`` /
``m_store.store.remove_all(force=True)``; bad servers are raw ZMQ REP sockets (tests/rawpeers.py).
``ASCEND_ENABLE_USE_FABRIC_MEM=1`` (an upstream setting, read only by its MooncakeBackend) makes the
Mooncake store clients (the scheduler's, and the worker-role connector's KVPoolWorker's) set up
without a TransferEngine: the stub engine's ``initialize()`` returns a MagicMock, which upstream's
GlobalTE rejects (``!= 0``). The scheduler's store client is used only in layerwise mode
(``batch_is_exist`` / ``batch_get_key_info``), never on the lookup path under test.
"""

from __future__ import annotations

import faulthandler
import json
import os
import queue
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from types import SimpleNamespace

REPO, OUTDIR = sys.argv[1], sys.argv[2]
sys.path.insert(0, REPO)
RPC_DIR = os.environ.get("VLLM_RPC_BASE_PATH") or tempfile.mkdtemp(prefix="pdc-as-rpc-")
os.makedirs(RPC_DIR, exist_ok=True)
MOONCAKE_JSON = os.path.join(OUTDIR, "mooncake.json")
with open(MOONCAKE_JSON, "w") as f:
    json.dump({"metadata_server": "P2PHANDSHAKE", "protocol": "ascend", "device_name": "",
               "master_server_address": "127.0.0.1:1", "global_segment_size": 0, "local_buffer_size": 0}, f)
os.environ.update({
    "VLLM_PLUGINS": "",  # no platform/general plugins: the connectors are registered below
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_RPC_BASE_PATH": RPC_DIR,
    "MOONCAKE_CONFIG_PATH": MOONCAKE_JSON,
    "ASCEND_ENABLE_USE_FABRIC_MEM": "1",  # see the module docstring
    "VLLM_HOST_IP": "127.0.0.1",
})
faulthandler.dump_traceback_later(int(os.environ.get("ASCEND_INPROC_WATCHDOG_S", "400")), exit=True)
T_START = time.monotonic()

import pdchaos_npu_stubs  # noqa: E402

pdchaos_npu_stubs.install()
import torch  # noqa: E402
import vllm_ascend  # noqa: E402,F401

pdchaos_npu_stubs.after_vllm_ascend()
import msgpack  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig,
    set_current_vllm_config)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.distributed.parallel_state import (  # noqa: E402
    ensure_model_parallel_initialized, init_distributed_environment)
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402
from vllm_ascend.distributed.kv_transfer import register_connector  # noqa: E402
from vllm_ascend.distributed.kv_transfer.kv_pool.ascend_store.ascend_store_connector import (  # noqa: E402
    LookupKeyServer)

from connector_patch import vllm_plugin  # noqa: E402
from connector_patch.lookup.ascend_store import HardenedLookupKeyServer  # noqa: E402
from connector_patch.lookup import LookupClient  # noqa: E402
from tests.rawpeers import Act, RawRepPeer  # noqa: E402

register_connector()  # what vllm-ascend's platform does: AscendStoreConnector & co. in the factory
vllm_plugin.register()  # what the vllm.general_plugins entry point does: HardenedAscendStoreConnector
IMPORT_S = time.monotonic() - T_START

MARKER = "PDCHAOS-ASCEND-RESULT "
UPSTREAM, HARDENED = "AscendStoreConnector", "HardenedAscendStoreConnector"
BLOCK = 32
NUM_BLOCKS = 64
PROMPT_LEN = 200  # 6 full blocks; the lookup asks for 192 tokens (upstream floors to the chunk granularity)
POOL_BLOCKS = 4  # blocks the healthy pool holds: a 128-token hit
LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
HEADS, HEAD_SIZE = 12, 64
DEADLINE_MS = int(os.environ.get("ASCEND_INPROC_DEADLINE_MS", "300"))
STALL_S = float(os.environ.get("ASCEND_INPROC_STALL_S", "5"))
CLOSE_RUNS = int(os.environ.get("ASCEND_INPROC_CLOSE_RUNS", "5"))
RESET_DEADLINE_MS = 2000  # the scheduler's deadline in the reset cases: above the 0.5 s pending store
PENDING_STORE_S = 0.5
DEFAULT_RESET_PENDING_S = 1.5  # above the lookup deadline, below the server's 2 s drain budget
STAND_IN_TOKEN = 7

RNG = random.Random(20261201)
KEEP: list = []  # peers, servers, schedulers: alive until os._exit
HASHES_SEEN: set[str] = set()
init_none_hash(sha256)
HASHER = get_request_block_hasher(BLOCK, sha256)
MODEL_DIR = tempfile.mkdtemp(prefix="pdc-as-model-")
with open(os.path.join(MODEL_DIR, "config.json"), "w") as f:
    json.dump({"architectures": ["OPTForCausalLM"], "model_type": "opt", "hidden_size": HEADS * HEAD_SIZE,
               "num_attention_heads": HEADS, "num_hidden_layers": len(LAYERS), "ffn_dim": 3072,
               "vocab_size": 50272, "max_position_embeddings": 2048, "word_embed_proj_dim": HEADS * HEAD_SIZE,
               "do_layer_norm_before": True, "torch_dtype": "float16"}, f)

_PORTS = iter(range(41000, 42000))


def next_port() -> int:
    """A fresh ``lookup_rpc_port``: each case has its own ipc path (upstream never unlinks one)."""
    return next(_PORTS)


def endpoint(port: int) -> str:
    return f"ipc://{RPC_DIR}/lookup_rpc_port_{port}_dp_rank0"


def make_config(connector: str, port: int, timeout_ms: int = DEADLINE_MS, reset_ms: int | None = None) -> VllmConfig:
    """``reset_ms``: the admin reset's deadline (None: the same as ``timeout_ms``; 0: the plugin's
    default, lookup_reset_timeout_ms left out)."""
    extra = {"backend": "mooncake", "lookup_rpc_port": port, "lookup_rpc_timeout_ms": timeout_ms}
    if reset_ms != 0:
        extra["lookup_reset_timeout_ms"] = timeout_ms if reset_ms is None else reset_ms
    kv = KVTransferConfig(kv_connector=connector, kv_role="kv_both", kv_connector_extra_config=extra)
    vc = VllmConfig(
        model_config=ModelConfig(model=MODEL_DIR, skip_tokenizer_init=True, max_model_len=1024, dtype="float16",
                                 seed=0),
        cache_config=CacheConfig(block_size=BLOCK),
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=1024, max_model_len=1024,
                                         async_scheduling=False, is_encoder_decoder=False),
        device_config=DeviceConfig("cpu"),
        kv_transfer_config=kv)
    vc.cache_config.num_gpu_blocks = NUM_BLOCKS
    return vc


def make_kv_cache_config() -> KVCacheConfig:
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD_SIZE, dtype=torch.float16)
    return KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec(list(LAYERS), spec)])


def make_request(rid: str) -> Request:
    prompt = [RNG.randrange(1000, 50000) for _ in range(PROMPT_LEN)]
    req = Request(rid, prompt, SamplingParams(max_tokens=4), None, block_hasher=HASHER)
    HASHES_SEEN.update(h.hex() for h in req.block_hashes)
    return req


def err(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e)[:200]}"


# --------------------------------------------------------------------------- the worker side's pool

class _SendThread:
    """``kv_send_thread`` as the reset drains it: a ``request_queue`` of pending stores, applied
    by a thread (each after its delay), ``task_done()`` once it landed."""

    def __init__(self, pool: "KnownSetPoolWorker"):
        self.pool = pool
        self.request_queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._run, name="pool-send", daemon=True).start()

    def _run(self) -> None:
        while True:
            hex_hash, delay = self.request_queue.get()
            time.sleep(delay)
            with self.pool.lock:
                self.pool.present.add(hex_hash)
                self.pool.events.append(("store_landed", time.monotonic()))
            self.request_queue.task_done()


class _Store:
    """Mooncake's store as the worker holds it: ``remove_all(force)`` and, unless ``regex`` is
    False, ``remove_by_regex(pattern, force)`` (every key here is the model's: a match clears)."""

    def __init__(self, pool: "KnownSetPoolWorker", rc: int = 0, regex: bool = True):
        self.pool, self.rc = pool, rc
        self.remove_all_calls: list[dict] = []
        self.remove_by_regex_calls: list[tuple] = []
        if regex:
            self.remove_by_regex = self._remove_by_regex

    def _clear(self) -> int:
        if self.rc >= 0:
            with self.pool.lock:
                self.pool.present.clear()
        self.pool.events.append(("clear", time.monotonic()))
        return self.rc

    def remove_all(self, **kwargs) -> int:
        self.remove_all_calls.append(kwargs)
        return self._clear()

    def _remove_by_regex(self, pattern: str, force: bool = False) -> int:
        self.remove_by_regex_calls.append((pattern, force))
        return self._clear()


class KnownSetPoolWorker:
    """Upstream ``KVPoolWorker.lookup_scheduler(token_len, block_hashes, kv_cache_group_ids,
    use_layerwise, hbm_hit_tokens)`` over a known set of block-hash hex strings: the hit is the
    longest prefix of blocks present (or within ``hbm_hit_tokens``), in tokens. ``clear``:
    "pool" gives it ``clear_pool()``, "store" ``m_store.store.remove_all(force=True)`` returning
    ``store_rc``; ``clear_raises`` makes the clear fail."""

    def __init__(self, present=(), clear: str = "pool", store_rc: int = 0, clear_raises: bool = False,
                 regex: bool = True, tp_size: int = 1):
        self.model_name = "tiny-model"  # upstream's: the model path's last part; keys are "<model>@..."
        self.tp_size, self.pp_size = tp_size, 1
        self.lock = threading.Lock()
        self.present: set[str] = set(present)
        self.calls = 0
        self.events: list[tuple[str, float]] = []
        self.kv_send_thread = _SendThread(self)
        self.clear_raises = clear_raises
        if clear == "pool":
            self.clear_pool = self._clear_pool
        else:
            self.m_store = SimpleNamespace(store=_Store(self, store_rc, regex))

    def lookup_scheduler(self, token_len, block_hashes, kv_cache_group_ids=None, use_layerwise=False,
                         hbm_hit_tokens=0) -> int:
        with self.lock:
            self.calls += 1
            hit = 0
            for i in range(min(len(block_hashes), token_len // BLOCK)):
                if (i + 1) * BLOCK <= hbm_hit_tokens or block_hashes[i] in self.present:
                    hit += 1
                else:
                    break
            return min(hit * BLOCK, token_len)

    def _clear_pool(self) -> None:
        if self.clear_raises:
            self.events.append(("clear_failed", time.monotonic()))
            raise RuntimeError("stand-in pool: clear failed")
        with self.lock:
            self.present.clear()
            self.events.append(("clear", time.monotonic()))

    def store_later(self, hex_hash: str, delay_s: float) -> None:
        HASHES_SEEN.add(hex_hash)
        self.kv_send_thread.request_queue.put((hex_hash, delay_s))

    def size(self) -> int:
        with self.lock:
            return len(self.present)


# --------------------------------------------------------------------------- a scheduler

class Engine:
    """vLLM's Scheduler with the connector it builds from ``kv_transfer_config``, stepped with a
    stand-in forward (no model)."""

    def __init__(self, connector: str, port: int, timeout_ms: int = DEADLINE_MS, reset_ms: int | None = None):
        self.vc = make_config(connector, port, timeout_ms, reset_ms)
        self.sched = Scheduler(vllm_config=self.vc, kv_cache_config=make_kv_cache_config(),
                               structured_output_manager=StructuredOutputManager(self.vc), block_size=BLOCK,
                               log_stats=True)
        KEEP.append(self)
        self.connector = self.sched.connector
        self.pool_sched = self.connector.connector_scheduler  # vllm-ascend's KVPoolScheduler

    def client_state(self) -> dict:
        client = self.pool_sched.client
        return {"client_class": type(client).__name__ if client is not None else None,
                "outcome": getattr(client, "last_outcome", None), "code": getattr(client, "last_code", None)}

    def matched(self, req: Request) -> dict:
        """The connector call the Scheduler makes for a waiting request (num_computed_tokens 0:
        nothing cached locally), timed."""
        t = time.monotonic()
        try:
            result = self.connector.get_num_new_matched_tokens(req, 0)
            out = {"result": list(result), "error": None}
        except Exception as e:  # noqa: BLE001
            out = {"result": None, "error": err(e)}
        out["elapsed_s"] = round(time.monotonic() - t, 4)
        spec = self.pool_sched.load_specs.get(req.request_id)
        out["load_spec"] = None if spec is None else {"vllm_cached": spec.vllm_cached_tokens,
                                                      "kvpool_cached": spec.kvpool_cached_tokens}
        out.update(self.client_state())
        return out

    def step(self, rids: list[str]) -> dict:
        """schedule() -> a stand-in forward -> update_from_output(): one engine step, timed."""
        t = time.monotonic()
        so = self.sched.schedule()
        schedule_s = time.monotonic() - t
        meta = so.kv_connector_metadata
        meta_specs = {r.req_id: (None if r.load_spec is None else
                                 {"kvpool_cached": r.load_spec.kvpool_cached_tokens, "can_load": r.load_spec.can_load})
                      for r in getattr(meta, "requests", [])}
        scheduled = dict(so.num_scheduled_tokens)
        computed = {r: self.sched.requests[r].num_computed_tokens for r in rids if r in self.sched.requests}
        ids = list(scheduled)
        sampled = []
        for rid in ids:
            req = self.sched.requests[rid]
            sampled.append([STAND_IN_TOKEN] if req.num_computed_tokens >= req.num_tokens else [])
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=sampled)
        self.sched.update_from_output(so, mro)
        return {"schedule_s": round(schedule_s, 4), "scheduled": {r: scheduled.get(r, 0) for r in rids},
                "computed_after_schedule": computed, "meta_load_specs": {r: meta_specs.get(r, "absent") for r in rids},
                "status": {r: self.sched.requests[r].status.name for r in rids if r in self.sched.requests},
                "output_tokens": {r: self.sched.requests[r].num_output_tokens for r in rids
                                  if r in self.sched.requests},
                "load_specs_left": sorted(self.pool_sched.load_specs)}


# --------------------------------------------------------------------------- bad servers

def garbage(i, f):  # 5 bytes that are not msgpack (0xc1 is msgpack's "never used" byte)
    return Act(reply=[b"\xc1\xc1\xc1\xc1\xc1"])


MALFORMED = {
    "not_msgpack": garbage,
    "empty_frame": lambda i, f: Act(reply=[b""]),
    "two_frames": lambda i, f: Act(reply=[b"\x00", b"\x00"]),
    "hit_out_of_range": lambda i, f: Act(reply=[msgpack.packb({"version": 1, "status": "ok", "hit_tokens": 1 << 20})]),
    "version_2": lambda i, f: Act(reply=[msgpack.packb({"version": 2, "status": "ok", "hit_tokens": 0})]),
}

PEER_CODE = r"""
import ctypes, signal, sys, time
ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG: stopped or not, it dies with the driver
sys.path.insert(0, sys.argv[1])
from connector_patch.lookup import LookupServer, MemoryBackend
server = LookupServer(sys.argv[2], MemoryBackend(block_size=32)).start()
print("ready", flush=True)
time.sleep(600)
"""


class PeerProcess:
    """A real hardened lookup server (connector_patch.lookup, empty pool) in a child process:
    healthy until :meth:`freeze` SIGSTOPs it (bound, its kernel socket accepting, never answering)."""

    def __init__(self, ep: str):
        self.proc = subprocess.Popen([sys.executable, "-c", PEER_CODE, REPO, ep], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        KEEP.append(self)
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError("peer process did not start")
        probe = LookupClient(ep, 5000)
        probe.lookup(64, [b"\x01" * 32, b"\x02" * 32])
        self.probe_outcome = probe.last_outcome  # "ok": it answers before the freeze
        probe.close()

    def freeze(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # SIGKILL ends a stopped process too
            self.proc.wait(5)


def make_server(kind: str, port: int) -> dict:
    """Start the lookup server of a case. Returns what the case records about it."""
    ep = endpoint(port)
    if kind == "dead":
        return {"peer": "nothing bound"}
    if kind == "frozen_rep":  # reads the request, never replies
        KEEP.append(RawRepPeer(ep, lambda i, f: Act(reply=None)))
        return {"peer": "REP socket that reads and never replies"}
    if kind == "frozen_silent":  # bound, never reads
        KEEP.append(RawRepPeer(ep, silent=True))
        return {"peer": "REP socket bound, never reading"}
    if kind == "frozen_process":
        peer = PeerProcess(ep)
        peer.freeze()
        return {"peer": "real hardened lookup server process, SIGSTOPped", "probe_before_freeze": peer.probe_outcome,
                "_process": peer}
    if kind.startswith("malformed_"):
        KEEP.append(RawRepPeer(ep, MALFORMED[kind[len("malformed_"):]]))
        return {"peer": "REP socket with a malformed reply"}
    if kind == "legacy_raw":  # a raw 4-byte u32 reply, as upstream's server answers
        KEEP.append(RawRepPeer(ep, lambda i, f: Act(reply=[(POOL_BLOCKS * BLOCK).to_bytes(4, "big")])))
        return {"peer": "REP socket replying a 4-byte u32"}
    raise ValueError(kind)


# --------------------------------------------------------------------------- case groups

def hardened_faults() -> dict:
    """HardenedAscendStoreConnector against each bad server: the connector call, then two engine
    steps (a second request arrives between them)."""
    out = {}
    kinds = ["dead", "frozen_rep", "frozen_silent", "frozen_process", *("malformed_" + m for m in MALFORMED),
             "legacy_raw", "legacy_upstream_server"]
    for kind in kinds:
        case: dict = {"error": None}
        out[kind] = case
        try:
            port = next_port()
            if kind == "legacy_upstream_server":  # vllm-ascend's own LookupKeyServer, holding the hit
                eng = Engine(HARDENED, port)
                r1 = make_request("r1")
                pool = KnownSetPoolWorker(h.hex() for h in r1.block_hashes[:POOL_BLOCKS])
                KEEP.append(LookupKeyServer(pool, eng.vc))
                case["peer"] = "upstream LookupKeyServer over a pool holding 4 of the prompt's blocks"
            else:
                case.update(make_server(kind, port))
                eng = Engine(HARDENED, port)
                r1 = make_request("r1")
                pool = None
            case["connector_class"] = type(eng.connector).__name__
            case["matched"] = eng.matched(r1)
            eng.sched.add_request(r1)
            case["step1"] = eng.step(["r1"])
            eng.sched.add_request(make_request("r2"))
            case["step2"] = eng.step(["r1", "r2"])
            case["pool_calls"] = None if pool is None else pool.calls
            peer = case.pop("_process", None)
            if peer is not None:  # the frozen server wakes up: the next lookup is answered again
                peer.thaw()
                case["after_thaw"] = eng.matched(make_request("r3"))
        except Exception as e:  # noqa: BLE001
            case.pop("_process", None)
            case["error"] = err(e)
            traceback.print_exc()
    return out


def upstream_stalls() -> dict:
    """AscendStoreConnector against the same bad servers: one schedule() per case on its own
    thread, all started together, watched for STALL_S; a step still running then is a stall."""
    kinds = ["dead", "frozen_rep", "frozen_process", "malformed_not_msgpack", "malformed_hit_out_of_range",
             "malformed_empty_frame", "hardened_server"]
    out: dict = {}
    threads = {}
    for kind in kinds:
        case: dict = {"error": None, "returned": False, "raised": None}
        out[kind] = case
        try:
            port = next_port()
            if kind == "hardened_server":  # a version-skewed pair: hardened worker, upstream scheduler
                eng = Engine(UPSTREAM, port)
                r1 = make_request("r1")
                KEEP.append(HardenedLookupKeyServer(KnownSetPoolWorker(h.hex() for h in r1.block_hashes[:POOL_BLOCKS]),
                                                    eng.vc))
                case["peer"] = "HardenedLookupKeyServer over a pool holding 4 of the prompt's blocks"
            else:
                case.update(make_server(kind, port))
                case.pop("_process", None)  # stays frozen: killed at the end
                eng = Engine(UPSTREAM, port)
                r1 = make_request("r1")
            case["connector_class"] = type(eng.connector).__name__
            eng.sched.add_request(r1)
        except Exception as e:  # noqa: BLE001
            case["error"] = err(e)
            traceback.print_exc()
            continue

        def run(eng=eng, case=case):
            t = time.monotonic()
            try:
                so = eng.sched.schedule()
                case["returned"] = True
                case["scheduled"] = dict(so.num_scheduled_tokens)
                spec = eng.pool_sched.load_specs.get("r1")
                case["load_spec"] = None if spec is None else {"kvpool_cached": spec.kvpool_cached_tokens}
            except BaseException as e:  # noqa: BLE001 - what upstream does is the finding
                case["raised"] = err(e)
                tb = traceback.extract_tb(e.__traceback__)
                case["raised_at"] = "/".join(tb[-1].filename.split("/")[-5:]) if tb else None
                case["raised_line"] = (tb[-1].line or "")[:120] if tb else None
            case["step_s"] = round(time.monotonic() - t, 4)

        th = threading.Thread(target=run, name=f"upstream-{kind}", daemon=True)
        threads[kind] = th
    t0 = time.monotonic()
    for th in threads.values():
        th.start()
    for kind, th in threads.items():
        th.join(max(0.0, t0 + STALL_S - time.monotonic()))
    watched = time.monotonic() - t0
    for kind, th in threads.items():
        out[kind]["still_blocked"] = th.is_alive()
        out[kind]["watched_s"] = round(watched, 3)
    return out


def healthy() -> dict:
    """A healthy worker side holding 4 of the prompt's 6 blocks: the hardened pair and upstream's."""
    out = {}
    for name, connector, server_cls in (("hardened", HARDENED, HardenedLookupKeyServer),
                                        ("upstream", UPSTREAM, LookupKeyServer)):
        case: dict = {"error": None}
        out[name] = case
        try:
            port = next_port()
            eng = Engine(connector, port)
            r1 = make_request("r1")
            pool = KnownSetPoolWorker(h.hex() for h in r1.block_hashes[:POOL_BLOCKS])
            KEEP.append(server_cls(pool, eng.vc))
            case["server_class"] = server_cls.__name__
            case["connector_class"] = type(eng.connector).__name__
            case["matched"] = eng.matched(r1)
            eng.sched.add_request(r1)
            case["step1"] = eng.step(["r1"])
            case["pool_calls"] = pool.calls
        except Exception as e:  # noqa: BLE001
            case["error"] = err(e)
            traceback.print_exc()
    return out


def real_worker_role() -> dict:
    """A worker-role HardenedAscendStoreConnector built by vLLM's factory (vllm-ascend's real
    KVPoolWorker, the HardenedLookupKeyServer it starts on rank 0), and the scheduler side's
    reset reaching it: drained (no send thread yet) and cleared through the worker's Mooncake
    store (pdchaos_npu_stubs' store, a MagicMock: its remove_by_regex is replaced by one that
    records its calls and answers 0, as Mooncake answers a count)."""
    case: dict = {"error": None}
    try:
        port = next_port()
        vc = make_config(HARDENED, port, RESET_DEADLINE_MS)
        with set_current_vllm_config(vc):
            worker = KVConnectorFactory.create_connector(config=vc, role=KVConnectorRole.WORKER,
                                                         kv_cache_config=make_kv_cache_config())
        KEEP.append(worker)
        case["worker_class"] = type(worker.connector_worker).__name__
        case["server_class"] = type(worker.lookup_server).__name__
        t = time.monotonic()
        case["worker_reset"] = worker.reset_cache()
        case["worker_reset_s"] = round(time.monotonic() - t, 4)
        eng = Engine(HARDENED, port, RESET_DEADLINE_MS)
        m_store = worker.connector_worker.m_store
        case["store_class"] = f"{type(m_store).__name__}/{type(getattr(m_store, 'store', None)).__name__}"
        calls: list = []

        def remove_by_regex(pattern, force=False):  # the stub store's, answering as Mooncake does: a count
            calls.append([[pattern], {"force": force}])
            return 0

        m_store.store.remove_by_regex = remove_by_regex
        t = time.monotonic()
        case["scheduler_reset"] = eng.connector.reset_cache()
        case["remove_by_regex_calls"] = list(calls)
        case["model_name"] = worker.connector_worker.model_name
        try:
            worker.lookup_server.backend.clear()
            case["clear_error"] = None
        except Exception as e:  # noqa: BLE001 - what a refused clear says
            case["clear_error"] = str(e)
        case["scheduler_reset_s"] = round(time.monotonic() - t, 4)
        case["server_counters"] = {k: v for k, v in worker.lookup_server.counters.items()
                                   if k in ("requests", "resets", "ok", "backend_error")}
    except Exception as e:  # noqa: BLE001
        case["error"] = err(e)
        traceback.print_exc()
    return case


def resets() -> dict:
    """HardenedAscendStoreConnector.reset_cache() (directly, and through the real Scheduler's
    reset_prefix_cache(reset_connector=True)) against HardenedLookupKeyServer over the pool."""
    out = {}

    def setup(pool_kwargs: dict | None, connector: str = HARDENED, timeout_ms: int = RESET_DEADLINE_MS,
              server: str = "hardened", reset_ms: int | None = None):
        port = next_port()
        eng = Engine(connector, port, timeout_ms, reset_ms)
        r1 = make_request("r1")
        pool = None
        if pool_kwargs is not None:
            pool = KnownSetPoolWorker((h.hex() for h in r1.block_hashes[:POOL_BLOCKS]), **pool_kwargs)
            cls = HardenedLookupKeyServer if server == "hardened" else LookupKeyServer
            KEEP.append(cls(pool, eng.vc))
        elif server == "frozen":
            KEEP.append(RawRepPeer(endpoint(port), lambda i, f: Act(reply=None)))
        return eng, r1, pool

    def timed(fn):
        t = time.monotonic()
        try:
            return fn(), None, round(time.monotonic() - t, 4)
        except BaseException as e:  # noqa: BLE001 - "never raises" is asserted on this
            return None, err(e), round(time.monotonic() - t, 4)

    # drain first, then clear: a store pending in the worker's queue lands before the clear
    case: dict = {"error": None}
    out["drain_then_clear"] = case
    try:
        eng, r1, pool = setup({"clear": "pool"})
        case["matched_before"] = eng.matched(r1)
        extra = make_request("x").block_hashes[0].hex()
        t0 = time.monotonic()
        pool.store_later(extra, PENDING_STORE_S)
        case["result"], case["raised"], case["elapsed_s"] = timed(
            lambda: eng.sched.reset_prefix_cache(reset_connector=True))
        case["events"] = [(name, round(t - t0, 4)) for name, t in pool.events]
        case["pool_size_after"] = pool.size()
        case["queue_unfinished_after"] = pool.kv_send_thread.request_queue.unfinished_tasks
        case["load_specs_after"] = sorted(eng.pool_sched.load_specs)
        case["matched_after"] = eng.matched(make_request_same(r1))
    except Exception as e:  # noqa: BLE001
        case["error"] = err(e)
        traceback.print_exc()

    # the store's remove_by_regex("^<model>@", force=True) when the worker has no clear_pool; refused
    # when the store has only remove_all (it would wipe every instance's pool) or other ranks store too
    for name, kwargs in (("remove_all", {"clear": "store", "store_rc": 0}),
                         ("remove_all_fails", {"clear": "store", "store_rc": -1}),
                         ("clear_raises", {"clear": "pool", "clear_raises": True}),
                         ("store_without_regex", {"clear": "store", "regex": False}),
                         ("two_ranks", {"clear": "store", "tp_size": 2})):
        case = {"error": None}
        out[name] = case
        try:
            eng, r1, pool = setup(kwargs)
            case["result"], case["raised"], case["elapsed_s"] = timed(eng.connector.reset_cache)
            case["events"] = [n for n, _ in pool.events]
            case["pool_size_after"] = pool.size()
            store = getattr(getattr(pool, "m_store", None), "store", None)
            case["remove_all_calls"] = None if store is None else store.remove_all_calls
            case["remove_by_regex_calls"] = None if store is None else store.remove_by_regex_calls
        except Exception as e:  # noqa: BLE001
            case["error"] = err(e)
            traceback.print_exc()

    # a pending store that does not land within the server's drain budget: no clear, False
    case = {"error": None}
    out["drain_times_out"] = case
    try:
        eng, r1, pool = setup({"clear": "pool"}, timeout_ms=4000)
        pool.store_later(make_request("y").block_hashes[0].hex(), 3.5)
        case["result"], case["raised"], case["elapsed_s"] = timed(eng.connector.reset_cache)
        case["events"] = [n for n, _ in pool.events]
        case["pool_size_after"] = pool.size()
    except Exception as e:  # noqa: BLE001
        case["error"] = err(e)
        traceback.print_exc()

    # the drain outlasts the client's deadline: False at the deadline; the worker finishes anyway
    case = {"error": None, "deadline_ms": DEADLINE_MS}
    out["drain_outlasts_client_deadline"] = case
    try:
        eng, r1, pool = setup({"clear": "pool"}, timeout_ms=DEADLINE_MS)
        pool.store_later(make_request("z").block_hashes[0].hex(), PENDING_STORE_S)
        case["result"], case["raised"], case["elapsed_s"] = timed(eng.connector.reset_cache)
        case["pool_size_at_return"] = pool.size()
        time.sleep(PENDING_STORE_S + 0.5)
        case["events_later"] = [n for n, _ in pool.events]
        case["pool_size_later"] = pool.size()
        case["matched_later"] = eng.matched(make_request_same(r1))
    except Exception as e:  # noqa: BLE001
        case["error"] = err(e)
        traceback.print_exc()

    # the plugin's default reset deadline (lookup_reset_timeout_ms 3000) outlasts the server's drain
    # budget: a store pending longer than the lookup deadline is waited for, and the reset confirmed
    case = {"error": None, "deadline_ms": DEADLINE_MS}
    out["drain_within_default_reset_deadline"] = case
    try:
        eng, r1, pool = setup({"clear": "pool"}, timeout_ms=DEADLINE_MS, reset_ms=0)
        pool.store_later(make_request("w").block_hashes[0].hex(), DEFAULT_RESET_PENDING_S)
        case["result"], case["raised"], case["elapsed_s"] = timed(eng.connector.reset_cache)
        case["events"] = [n for n, _ in pool.events]
        case["pool_size_after"] = pool.size()
    except Exception as e:  # noqa: BLE001
        case["error"] = err(e)
        traceback.print_exc()

    # nobody answers: nothing bound, a REP that never replies
    for name, server in (("dead", "dead"), ("frozen", "frozen")):
        case = {"error": None, "deadline_ms": DEADLINE_MS}
        out[name] = case
        try:
            eng, r1, pool = setup(None, timeout_ms=DEADLINE_MS, server=server)
            case["result"], case["raised"], case["elapsed_s"] = timed(eng.connector.reset_cache)
            case["scheduler_result"], case["scheduler_raised"], case["scheduler_elapsed_s"] = timed(
                lambda: eng.sched.reset_prefix_cache(reset_connector=True))
        except Exception as e:  # noqa: BLE001
            case["error"] = err(e)
            traceback.print_exc()

    # upstream: AscendStoreConnector has no reset_cache of its own (vLLM's base returns None)
    case = {"error": None}
    out["upstream"] = case
    try:
        eng, r1, pool = setup({"clear": "pool"}, connector=UPSTREAM, server="upstream")
        case["result"], case["raised"], case["elapsed_s"] = timed(eng.connector.reset_cache)
        case["scheduler_result"], case["scheduler_raised"], _ = timed(
            lambda: eng.sched.reset_prefix_cache(reset_connector=True))
        case["events"] = [n for n, _ in pool.events]
        case["pool_size_after"] = pool.size()
    except Exception as e:  # noqa: BLE001
        case["error"] = err(e)
        traceback.print_exc()
    return out


def make_request_same(req: Request) -> Request:
    """A new request with the same prompt (same block hashes)."""
    return Request(req.request_id + "-again", list(req.prompt_token_ids), SamplingParams(max_tokens=4), None,
                   block_hasher=HASHER)


# --------------------------------------------------------------------------- close() in a child

def close_children() -> dict:
    """``close()`` while the server thread waits in recv, in forked children (forked before this
    process made any ZMQ context or thread of its own): construct the server, let its thread sit in
    recv, close(), give the thread a second, exit 0. The child's exit status is the measurement."""
    vc = make_config(HARDENED, 0)
    out: dict = {}
    for name, cls in (("upstream", LookupKeyServer), ("hardened", HardenedLookupKeyServer)):
        runs = []
        for i in range(CLOSE_RUNS):
            port = next_port()
            vc.kv_transfer_config.kv_connector_extra_config["lookup_rpc_port"] = port
            errfile = os.path.join(OUTDIR, f"close-{name}-{i}.stderr")
            t0 = time.monotonic()
            pid = os.fork()
            if pid == 0:  # the child
                code = 0
                try:
                    fd = os.open(errfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    os.dup2(fd, 2)
                    server = cls(KnownSetPoolWorker(), vc)
                    time.sleep(0.3)  # its thread is in recv now
                    server.close()
                    os.write(2, b"pdchaos: close() returned\n")
                    time.sleep(0.5)  # the thread wakes up on the closed socket meanwhile
                    thread = getattr(server, "thread", None) or server.server._thread
                    os.write(2, b"pdchaos: server thread alive=%d\n" % thread.is_alive())
                except BaseException:  # noqa: BLE001
                    traceback.print_exc()
                    code = 3
                os._exit(code)
            status = None
            while time.monotonic() - t0 < 20:
                done, st = os.waitpid(pid, os.WNOHANG)
                if done:
                    status = st
                    break
                time.sleep(0.05)
            if status is None:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                run = {"exit": "timeout"}
            elif os.WIFSIGNALED(status):
                sig = os.WTERMSIG(status)
                run = {"exit": 128 + sig, "signal": signal.Signals(sig).name}
            else:
                run = {"exit": os.WEXITSTATUS(status)}
            with open(errfile, errors="replace") as fh:
                text = fh.read()
            run["close_returned"] = "pdchaos: close() returned" in text
            run["thread_alive_after"] = ("alive=1" in text) if "alive=" in text else None
            # a thread that ended with an unhandled exception (threading's excepthook prints "Exception
            # in thread ..." and the traceback): the exception's type only (its message is an errno text)
            died = text.split("Exception in thread", 1)[1].splitlines()[1:] if "Exception in thread" in text else []
            last = [ln for ln in died if ln and not ln.startswith((" ", "Traceback", "pdchaos:"))]
            run["thread_exception"] = last[-1].split(":", 1)[0].strip()[:80] if last else None
            # libzmq's own assertion line: "Assertion failed: pfd.revents & POLLIN (src/signaler.cpp:238)",
            # or an errno assertion, "<strerror> (src/<file>.cpp:<line>)"
            asserts = [ln.strip() for ln in text.splitlines() if re.search(r"\(src/[\w./-]+\.cpp:\d+\)", ln)]
            run["zmq_assertion"] = asserts[0][:120] if asserts else None
            if run["exit"] != 0 and not asserts:  # what else it said (the pool is empty: no hash can be here)
                run["stderr_tail"] = [ln[:160] for ln in text.strip().splitlines()[-3:]]
            run["signaler_assertion"] = "signaler.cpp" in text
            run["seconds"] = round(time.monotonic() - t0, 3)
            runs.append(run)
        out[name] = runs
    return out


# --------------------------------------------------------------------------- main

GROUPS = {"close": close_children, "hardened_faults": hardened_faults, "upstream_stalls": upstream_stalls,
          "healthy": healthy, "resets": resets, "real_worker_role": real_worker_role}


def main() -> None:
    wanted = [g for g in os.environ.get("ASCEND_INPROC_CASES", "").split(",") if g] or list(GROUPS)
    result: dict = {"timing": {"import_s": round(IMPORT_S, 2)}, "deadline_ms": DEADLINE_MS, "stall_s": STALL_S,
                    "groups": {}}
    # close() first: its children are forked before anything here opens a ZMQ context or a thread
    order = [g for g in GROUPS if g in wanted]
    for name in order:
        if name != "close" and not getattr(main, "_dist", False):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                dist_port = s.getsockname()[1]
            with set_current_vllm_config(make_config(HARDENED, 0)):
                init_distributed_environment(world_size=1, rank=0,
                                             distributed_init_method=f"tcp://127.0.0.1:{dist_port}",
                                             local_rank=0, backend="gloo")
                ensure_model_parallel_initialized(1, 1)
            main._dist = True
        t = time.monotonic()
        try:
            result["groups"][name] = GROUPS[name]()
        except Exception as e:  # noqa: BLE001
            result["groups"][name] = {"error": err(e)}
            traceback.print_exc()
        result["timing"][name + "_s"] = round(time.monotonic() - t, 2)
    result["timing"]["total_s"] = round(time.monotonic() - T_START, 2)
    with open(os.path.join(OUTDIR, "hashes.txt"), "w") as fh:
        fh.write("".join(h + "\n" for h in sorted(HASHES_SEEN)))
    for obj in KEEP:
        if isinstance(obj, PeerProcess):
            obj.kill()
    sys.stdout.write("\n" + MARKER + json.dumps(result) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # blocked upstream steps, server threads and peers end with the process


if __name__ == "__main__":
    main()
