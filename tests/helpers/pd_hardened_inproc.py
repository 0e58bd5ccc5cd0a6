"""vLLM's real v1 Scheduler stepped in-process on CPU with the hardened Mooncake connector on both
sides, against stand-in prefill nodes on 127.0.0.1. Run by tests/test_pd_hardened_inproc.py with
the P/D node env's python (vLLM, torch and Mooncake live there, not in the harness's env).

argv: REPO. Prints many vLLM log lines, then one line ``PDCHAOS-INPROC-RESULT {json}``: for each
case, statuses, counts and times only (never prompt text or token ids). ``PD_INPROC_CASES=a,b``
runs only those cases.

Real here: vLLM 0.32.0's ``Scheduler`` (with its KV cache manager and block pool), the scheduler-side
connector that the Scheduler builds itself from ``kv_transfer_config`` (``HardenedMooncakeConnector``
registered by ``connector_patch.vllm_plugin.register()``, or vLLM's ``MooncakeConnector`` for
contrast), the worker-side connector built by vLLM's ``KVConnectorFactory`` as a worker builds it
(Mooncake TransferEngine over tcp on 127.0.0.1, KV cache tensors registered with it, its receiver
thread, its ZMQ DEALER pulls, its bootstrap queries), vLLM's ``KVConnectorModelRunnerMixin`` that
turns the worker-side results into the ``KVConnectorOutput`` of each step, vLLM's
``MooncakeBootstrapServer`` for each stand-in P, and every reply P sends (msgspec-encoded
``MooncakeXferResponse`` on a ZMQ ROUTER, as P's side channel sends them).

In ``late_write_after_deadline`` P is the REAL hardened connector too (a kv_producer worker with
its own side channel and TransferEngine); only P's scheduler is replaced by the metadata it would
hand P's worker.

Not real: there is no model. A step that schedules tokens gets a stand-in forward (one constant
sampled token per request that reached the end of its tokens; in the late-write case it also fills
a newly scheduled request's blocks with a marker, as a model writes a prompt's KV); a step that
schedules nothing goes through the mixin's real ``kv_connector_no_forward``. P is a stand-in
(except in the late-write case): its ROUTER answers D's pull from a script (ERROR, FINISH with
err_reqs, FINISH naming nothing, OK, silence) and writes no KV.
``torch.accelerator.current_device_index()`` is shimmed by the node env's own ``pdchaos_cpu_shim``
(vLLM plugins are off here, so it is called by hand), as on every CPU node.
"""

from __future__ import annotations

import faulthandler
import gc
import json
import os
import random
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import defaultdict

REPO = sys.argv[1]
sys.path.insert(0, REPO)
os.environ.update({
    "VLLM_PLUGINS": "",  # no platform/general plugins: the hardened connector is registered below
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_HOST_IP": "127.0.0.1",
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
})
faulthandler.dump_traceback_later(int(os.environ.get("PD_INPROC_WATCHDOG_S", "500")), exit=True)
T_START = time.monotonic()

import httpx  # noqa: E402
import msgspec  # noqa: E402
import torch  # noqa: E402
import zmq  # noqa: E402

import pdchaos_cpu_shim  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig,
    set_current_vllm_config)
from vllm.distributed.kv_transfer import kv_transfer_state  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake import mooncake_connector as mc  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_utils import (  # noqa: E402
    MooncakeBootstrapServer, RegisterWorkerPayload)
from vllm.distributed.parallel_state import (  # noqa: E402
    ensure_model_parallel_initialized, init_distributed_environment)
from vllm.forward_context import set_forward_context  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402
from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin  # noqa: E402

from connector_patch import vllm_plugin  # noqa: E402

MARKER = "PDCHAOS-INPROC-RESULT "
BLOCK = 32  # vLLM's CPU attention takes block sizes that are multiples of 32 only
NUM_BLOCKS = 64
LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
HEADS, HEAD_SIZE = 12, 64  # as the config.json below (OPT-125m-like)
LONG_MS = 20000  # cases 1-6: the outcome comes from P's answer, never from the deadline
DEADLINE_MS = 300  # case 7
STAND_IN_TOKEN = 7
Status = mc.MooncakeXferResponseStatus
Response = mc.MooncakeXferResponse

RNG = random.Random(20240601)
KEEP: list = []  # every DNode and FakePrefill, alive until os._exit
init_none_hash(sha256)
HASHER = get_request_block_hasher(BLOCK, sha256)
MODEL_DIR = tempfile.mkdtemp(prefix="pdc-inproc-model-")
with open(os.path.join(MODEL_DIR, "config.json"), "w") as f:
    json.dump({"architectures": ["OPTForCausalLM"], "model_type": "opt", "hidden_size": HEADS * HEAD_SIZE,
               "num_attention_heads": HEADS, "num_hidden_layers": len(LAYERS), "ffn_dim": 3072,
               "vocab_size": 50272, "max_position_embeddings": 2048, "word_embed_proj_dim": HEADS * HEAD_SIZE,
               "do_layer_norm_before": True, "torch_dtype": "float16"}, f)


# --------------------------------------------------------------------------- set-up

def setup_process() -> None:
    vllm_plugin.register()  # what the vllm.general_plugins entry point does in a node
    pdchaos_cpu_shim.register()  # the node env's CPU shim (plugins are off here)
    with set_current_vllm_config(make_config("HardenedMooncakeConnector", "fail", LONG_MS)):
        port = free_port()
        init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}",
                                     local_rank=0, backend="gloo")
        ensure_model_parallel_initialized(1, 1)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_config(connector: str, policy: str, timeout_ms: int, role: str = "kv_consumer",
                num_blocks: int = NUM_BLOCKS, extra: dict | None = None) -> VllmConfig:
    kv = KVTransferConfig(kv_connector=connector, kv_role=role, kv_load_failure_policy=policy,
                          kv_connector_extra_config={"mooncake_protocol": "tcp", "kv_load_timeout_ms": timeout_ms,
                                                     **(extra or {})})
    vc = VllmConfig(
        model_config=ModelConfig(model=MODEL_DIR, skip_tokenizer_init=True, max_model_len=1024, dtype="float16",
                                 seed=0),
        cache_config=CacheConfig(block_size=BLOCK),
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=1024, max_model_len=1024,
                                         async_scheduling=False, is_encoder_decoder=False),
        device_config=DeviceConfig("cpu"),
        kv_transfer_config=kv)
    vc.cache_config.num_gpu_blocks = num_blocks
    return vc


def make_kv_cache_config(num_blocks: int = NUM_BLOCKS) -> KVCacheConfig:
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD_SIZE, dtype=torch.float16)
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec(list(LAYERS), spec)])


# --------------------------------------------------------------------------- a stand-in P

def ERROR(asked):
    return [Response(status=Status.ERROR, err_msg="stand-in P: error")]


def FINISH_ERR(asked):
    return [Response(status=Status.FINISH, err_reqs=list(asked), err_msg="stand-in P: failed")]


def FINISH_NOTHING(asked):
    return [Response(status=Status.FINISH)]


def OK(asked):
    return [Response(status=Status.FINISH, ok_reqs=list(asked))]


def SILENT(asked):
    return []


GONE = "gone"  # a script that is no script: the ROUTER closes at once, nobody listens at that address


def after(rank: int, delay_s: float, then):
    """Answer with ``then`` once P rank ``rank`` has answered, ``delay_s`` later."""
    return lambda asked: [("after", rank), delay_s, *then(asked)]


class FakePrefill:
    """One P engine as D sees it: vLLM's own MooncakeBootstrapServer on 127.0.0.1 and one ZMQ
    ROUTER per P TP rank, registered there as P's workers register (POST /register). Each ROUTER
    answers D's pull with its script: msgspec-encoded MooncakeXferResponse messages, float sleeps,
    ("after", rank) waits. It counts pulls and the blocks asked for (counts only)."""

    def __init__(self, scripts):
        self.engine_id = f"stand-in-p-{uuid.uuid4().hex[:8]}"
        KEEP.append(self)
        self.server = MooncakeBootstrapServer("127.0.0.1", 0)
        self.server.start()
        self.bootstrap_addr = f"http://127.0.0.1:{self.server.port}"
        self.ctx = zmq.Context()
        self.stop = threading.Event()
        n = len(scripts)
        self.replied = [threading.Event() for _ in range(n)]
        self.reply_at: list[float | None] = [None] * n
        self.pulls = [0] * n
        self.asked_blocks: list[list[int]] = [[] for _ in range(n)]
        for rank, script in enumerate(scripts):
            ready: list = []
            bound = threading.Event()
            threading.Thread(target=self._serve, args=(rank, script, ready, bound), daemon=True).start()
            if not bound.wait(10) or not ready:
                raise RuntimeError("stand-in P: ROUTER did not bind")
            payload = RegisterWorkerPayload(engine_id=self.engine_id, dp_rank=0, tp_rank=rank, pp_rank=0,
                                            addr=f"tcp://127.0.0.1:{ready[0]}")
            httpx.post(self.bootstrap_addr + "/register", json=payload.model_dump(), timeout=10).raise_for_status()

    def params(self, transfer_id: str) -> dict:
        return {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": self.engine_id,
                "remote_bootstrap_addr": self.bootstrap_addr, "transfer_id": transfer_id}

    def _serve(self, rank, script, ready, bound) -> None:
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        ready.append(sock.bind_to_random_port("tcp://127.0.0.1"))
        if script == GONE:
            sock.close(linger=0)
            bound.set()
            return
        bound.set()
        enc = msgspec.msgpack.Encoder()
        dec = msgspec.msgpack.Decoder(mc.MooncakeXferMetadata)
        try:
            while not self.stop.is_set():
                if not sock.poll(50):
                    continue
                frames = sock.recv_multipart()
                meta = dec.decode(frames[-1])
                asked = list(meta.req_blocks)
                self.pulls[rank] += 1
                self.asked_blocks[rank].extend(sum(len(g) for g in blocks) for _, blocks in meta.req_blocks.values())
                sent = False
                for item in script(asked):
                    if isinstance(item, float):
                        time.sleep(item)
                    elif isinstance(item, tuple):
                        self.replied[item[1]].wait(10)
                    else:
                        sock.send_multipart([frames[0], enc.encode(item)])
                        sent = True
                if sent:
                    self.reply_at[rank] = time.monotonic()
                self.replied[rank].set()
        finally:
            sock.close(linger=0)

    def facts(self) -> dict:
        order = [r for r, _ in sorted(((r, t) for r, t in enumerate(self.reply_at) if t is not None),
                                      key=lambda x: x[1])]
        return {"pulls": list(self.pulls), "asked_blocks": [sorted(b) for b in self.asked_blocks],
                "reply_order": order}

    def close(self) -> None:
        self.stop.set()
        try:
            self.server.shutdown()
        except Exception:  # noqa: BLE001 - best effort at the end of a case
            pass


# --------------------------------------------------------------------------- D: scheduler + worker

class DNode:
    """D: the real Scheduler (its scheduler-side connector built from kv_transfer_config) and a
    real worker-side connector, stepped as EngineCore.step() drives them: schedule(), the model
    runner's KV connector lifecycle (vLLM's mixin), update_from_output()."""

    def __init__(self, connector: str, policy: str, timeout_ms: int = LONG_MS, num_blocks: int = NUM_BLOCKS):
        self.vc = make_config(connector, policy, timeout_ms, num_blocks=num_blocks)
        self.kcc = make_kv_cache_config(num_blocks)
        self.sched = Scheduler(vllm_config=self.vc, kv_cache_config=self.kcc,
                               structured_output_manager=StructuredOutputManager(self.vc), block_size=BLOCK,
                               log_stats=True)
        with set_current_vllm_config(self.vc):
            self.worker = KVConnectorFactory.create_connector(config=self.vc, role=KVConnectorRole.WORKER,
                                                              kv_cache_config=self.kcc)
            self.kv_caches = {name: torch.zeros((num_blocks, 2, BLOCK, HEADS, HEAD_SIZE), dtype=torch.float16)
                              for name in LAYERS}
            self.worker.register_kv_caches(self.kv_caches)
        self.free0 = self.free_blocks()
        self.reqs: dict[str, Request] = {}
        self.blocks: dict[str, set[int]] = {}
        self.trace: dict[str, list[tuple[str, int, int]]] = defaultdict(list)  # status, scheduled, computed
        self.reports: dict[str, list[str]] = defaultdict(list)
        self.report_at: dict[str, list[float]] = defaultdict(list)
        self.finish_reasons: dict[str, str] = {}
        self.failed_recvs = 0
        self.stray_invalid_blocks = 0
        self.error: str | None = None
        self.steps = 0
        self.kv_marker: float | None = None  # the stand-in forward writes it into a prefilled request's blocks
        KEEP.append(self)  # never collected mid-run: a worker's __del__ joins its threads (see main)

    # ----------------------------------------------------------------- requests
    def add(self, rid: str, prompt: list[int], params: dict | None, max_tokens: int = 2) -> Request:
        extra = {"kv_transfer_params": params} if params is not None else None
        req = Request(rid, prompt, SamplingParams(max_tokens=max_tokens, extra_args=extra), None,
                      block_hasher=HASHER)
        self.sched.add_request(req)
        self.reqs[rid] = req
        return req

    def free_blocks(self) -> int:
        return self.sched.kv_cache_manager.block_pool.get_num_free_blocks()

    def usage(self) -> float:
        return float(self.sched.kv_cache_manager.usage)

    def status(self, rid: str) -> str:
        return self.reqs[rid].status.name

    def finished(self, rid: str) -> bool:
        return RequestStatus.is_finished(self.reqs[rid].status)

    # ----------------------------------------------------------------- one engine step
    def step(self) -> None:
        if self.error:
            return
        try:
            so = self.sched.schedule()
            for rid, req in self.reqs.items():
                if rid in self.sched.requests:
                    self.trace[rid].append((req.status.name, so.num_scheduled_tokens.get(rid, 0),
                                            req.num_computed_tokens))
                    if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS and rid not in self.blocks:
                        self.blocks[rid] = {b for g in self.sched.kv_cache_manager.get_block_ids(rid) for b in g}
            kv_transfer_state._KV_CONNECTOR_AGENT = self.worker  # this D's worker-side connector
            with set_forward_context(None, self.vc):
                if so.total_num_scheduled_tokens == 0:
                    mro = KVConnectorModelRunnerMixin.kv_connector_no_forward(so, self.vc)
                else:
                    with KVConnectorModelRunnerMixin._get_kv_connector_output(so) as kvo:
                        mro = self._stand_in_forward(so)
                    mro.kv_connector_output = kvo
            self._record(mro)
            outs = self.sched.update_from_output(so, mro)
            for eco in outs.values():
                for o in eco.outputs:
                    if o.finish_reason is not None:
                        self.finish_reasons[o.request_id] = o.finish_reason.name
            self.steps += 1
        except Exception as e:  # noqa: BLE001 - a scheduler assertion is a finding of the case
            self.error = f"{type(e).__name__}: {str(e)[:200]}"
            traceback.print_exc()

    def _stand_in_forward(self, so) -> ModelRunnerOutput:
        """No model: one constant token for each request whose scheduled tokens reach its end."""
        rids = list(so.num_scheduled_tokens)
        sampled = []
        if self.kv_marker is not None:  # a model writes the KV of the prompt it prefills
            for new in so.scheduled_new_reqs:
                ids = [b for g in new.block_ids for b in g]
                for t in self.kv_caches.values():
                    t[ids] = self.kv_marker
        for rid in rids:
            req = self.sched.requests[rid]
            sampled.append([STAND_IN_TOKEN] if req.num_computed_tokens >= req.num_tokens else [])
        return ModelRunnerOutput(req_ids=rids, req_id_to_index={r: i for i, r in enumerate(rids)},
                                 sampled_token_ids=sampled)

    def _record(self, mro: ModelRunnerOutput) -> None:
        kvo = mro.kv_connector_output
        if kvo is None:
            return
        now = time.monotonic()
        attributed: set[int] = set()
        for rid in kvo.finished_recving or ():
            blocks = self.blocks.get(rid, set())
            failed = rid in (kvo.failed_recving or ()) or bool(blocks & set(kvo.invalid_block_ids or ()))
            attributed |= blocks
            self.reports[rid].append("failed" if failed else "ok")
            self.report_at[rid].append(now)
        self.stray_invalid_blocks += len(set(kvo.invalid_block_ids or ()) - attributed)
        stats = kvo.kv_connector_stats
        if stats is not None:
            self.failed_recvs += len(stats.data.get("num_failed_recvs", []))

    def run_until(self, pred, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.error and time.monotonic() < deadline:
            if pred():
                return True
            self.step()
            if self.sched.get_num_unfinished_requests() == 0:
                time.sleep(0.005)  # an engine with nothing to do would block on its input queue
        return pred()

    def settle(self, seconds: float) -> None:
        """Keep stepping a while: a second report of the same request would show up here."""
        end = time.monotonic() + seconds
        while not self.error and time.monotonic() < end:
            self.step()
            if self.sched.get_num_unfinished_requests() == 0:
                time.sleep(0.005)

    # ----------------------------------------------------------------- facts
    def worker_failures(self) -> dict:
        w = self.worker.connector_worker
        return dict(getattr(getattr(w, "failures", None), "totals", {}) or {})

    def scheduler_failures(self) -> dict:
        s = self.sched.connector.connector_scheduler
        return dict(getattr(getattr(s, "failures", None), "totals", {}) or {})

    def req_facts(self, rid: str) -> dict:
        tr = self.trace.get(rid, [])
        runs: list[list] = []  # [status, steps in a row]
        for s, _, _ in tr:
            if runs and runs[-1][0] == s:
                runs[-1][1] += 1
            else:
                runs.append([s, 1])
        return {"first_status": tr[0][0] if tr else None,
                "first_scheduled": tr[0][1] if tr else None,
                "statuses": runs,
                "final_status": self.status(rid),
                "reports": list(self.reports.get(rid, [])),
                "finish_reason": self.finish_reasons.get(rid),
                "blocks": len(self.blocks.get(rid, ())),
                "prompt_tokens": self.reqs[rid].num_prompt_tokens}

    def facts(self) -> dict:
        return {"scheduler_error": self.error, "steps": self.steps, "free_blocks_start": self.free0,
                "free_blocks_end": self.free_blocks(), "usage_end": self.usage(),
                "unfinished_end": self.sched.get_num_unfinished_requests(),
                "failures": self.worker_failures(), "scheduler_failures": self.scheduler_failures(),
                "failed_recvs": self.failed_recvs,
                "stray_invalid_blocks": self.stray_invalid_blocks,
                "worker_class": type(self.worker.connector_worker).__name__,
                "scheduler_connector_class": type(self.sched.connector.connector_scheduler).__name__}


def prompt(n: int) -> list[int]:
    return [RNG.randrange(100, 40000) for _ in range(n)]


def rid(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:6]}"


# --------------------------------------------------------------------------- the cases

def case_fail_policy() -> dict:
    """1. policy fail: P answers ERROR (one request) or a FINISH naming nothing (another)."""
    node = DNode("HardenedMooncakeConnector", "fail")
    p_err, p_nothing = FakePrefill([ERROR]), FakePrefill([FINISH_NOTHING])
    a, b = rid("fail-error"), rid("fail-unnamed")
    node.add(a, prompt(80), p_err.params("x-" + a))
    node.add(b, prompt(80), p_nothing.params("x-" + b))
    t0 = time.monotonic()
    node.step()
    held = {"free_blocks_held": node.free_blocks(), "usage_held": node.usage()}
    node.run_until(lambda: node.finished(a) and node.finished(b), 20)
    elapsed = time.monotonic() - t0
    node.settle(0.5)
    out = {"node": node.facts(), **held, "elapsed_s": round(elapsed, 3),
           "reqs": {"error": node.req_facts(a), "unnamed": node.req_facts(b)},
           "p": {"error": p_err.facts(), "unnamed": p_nothing.facts()}}
    p_err.close(), p_nothing.close()
    return out


def case_recompute_policy() -> dict:
    """2. policy recompute: D holds the first 2 blocks of the prompt in its own prefix cache (a
    finished local request), pulls the rest from P, P answers FINISH with err_reqs: the request
    goes back to its valid prefix and recomputes the rest locally."""
    node = DNode("HardenedMooncakeConnector", "recompute")
    p = FakePrefill([FINISH_ERR])
    shared = prompt(2 * BLOCK)
    warm = rid("warm")
    node.add(warm, shared + prompt(8), None, max_tokens=1)
    node.run_until(lambda: node.finished(warm), 20)
    r = rid("recompute")
    node.add(r, shared + prompt(40), p.params("x-" + r))
    node.step()
    first = node.trace[r][0] if node.trace[r] else None
    held = {"free_blocks_held": node.free_blocks(), "usage_held": node.usage()}
    node.run_until(lambda: bool(node.reports[r]), 20)
    valid_prefix = node.reqs[r].num_computed_tokens  # set by the scheduler from the failed blocks
    n_before = len(node.trace[r])
    node.step()  # the next schedule(): the request leaves WAITING_FOR_REMOTE_KVS
    after_tr = node.trace[r][n_before] if len(node.trace[r]) > n_before else None
    node.run_until(lambda: node.finished(r), 20)
    node.settle(0.3)
    out = {"node": node.facts(), **held, "prefix_caching": bool(node.vc.cache_config.enable_prefix_caching),
           "shared_prefix_tokens": len(shared), "warm_final_status": node.status(warm),
           "first": {"status": first[0], "computed": first[2]} if first else None,
           "valid_prefix_after_failure": valid_prefix,
           "next": {"status": after_tr[0], "scheduled": after_tr[1]} if after_tr else None,
           "req": node.req_facts(r), "p": p.facts()}
    p.close()
    return out


def case_multi_p() -> dict:
    """3. a load from 2 P workers (P TP 2 -> pull_tasks_count 2): rank 0 fails, then rank 1 says
    OK (and, for the other request, rank 0 says OK, then rank 1 fails)."""
    node = DNode("HardenedMooncakeConnector", "fail")
    p_fail_first = FakePrefill([ERROR, after(0, 0.3, OK)])
    p_ok_first = FakePrefill([OK, after(0, 0.3, ERROR)])
    a, b = rid("multi-fail-then-ok"), rid("multi-ok-then-fail")
    node.add(a, prompt(80), p_fail_first.params("x-" + a))
    node.add(b, prompt(80), p_ok_first.params("x-" + b))
    node.run_until(lambda: (node.finished(a) and node.finished(b) and p_fail_first.replied[1].is_set()
                            and p_ok_first.replied[1].is_set()), 20)
    node.settle(0.6)
    out = {"node": node.facts(), "reqs": {"fail_then_ok": node.req_facts(a), "ok_then_fail": node.req_facts(b)},
           "p": {"fail_then_ok": p_fail_first.facts(), "ok_then_fail": p_ok_first.facts()}}
    p_fail_first.close(), p_ok_first.close()
    return out


def case_empty_pull() -> dict:
    """4. two requests aborted before they were scheduled: D's pull only asks P to free its side
    (no local block); P answers OK for one and err_reqs for the other."""
    node = DNode("HardenedMooncakeConnector", "fail")

    def ok_one_err_other(asked):
        ok = [x for x in asked if x.startswith("empty-ok")]
        err = [x for x in asked if x not in ok]
        return [Response(status=Status.FINISH, ok_reqs=ok or None, err_reqs=err or None, err_msg="stand-in P")]

    p = FakePrefill([ok_one_err_other])
    a, b = rid("empty-ok"), rid("empty-err")
    node.add(a, prompt(80), p.params("x-" + a))
    node.add(b, prompt(80), p.params("x-" + b))
    node.sched.finish_requests([a, b], RequestStatus.FINISHED_ABORTED)
    statuses = {"ok": node.status(a), "err": node.status(b)}
    node.run_until(lambda: p.replied[0].is_set(), 20)
    node.settle(0.6)
    out = {"node": node.facts(), "aborted_statuses": statuses,
           "reports": {"ok": node.reports.get(a, []), "err": node.reports.get(b, [])},
           "ledger_pending": node.worker.connector_worker.ledger.pending(), "p": p.facts()}
    p.close()
    return out


def case_duplicates() -> dict:
    """5. one failure arriving twice: err_reqs in a CONTINUE then again in the FINISH; err_reqs then
    ERROR; both P workers of one load answering ERROR."""
    node = DNode("HardenedMooncakeConnector", "fail")

    def cont_err(asked):
        return [Response(status=Status.CONTINUE, err_reqs=list(asked), err_msg="stand-in P: failed")]

    p_twice = FakePrefill([lambda asked: cont_err(asked) + FINISH_ERR(asked)])
    p_then_error = FakePrefill([lambda asked: cont_err(asked) + [0.05] + ERROR(asked)])
    p_both = FakePrefill([ERROR, after(0, 0.1, ERROR)])
    ids = {"err_reqs_twice": rid("dup-twice"), "err_reqs_then_error": rid("dup-then-error"),
           "both_workers_error": rid("dup-both")}
    ps = {"err_reqs_twice": p_twice, "err_reqs_then_error": p_then_error, "both_workers_error": p_both}
    for k, r in ids.items():
        node.add(r, prompt(80), ps[k].params("x-" + r))
    node.run_until(lambda: all(node.finished(r) for r in ids.values())
                   and all(e.is_set() for p in ps.values() for e in p.replied), 20)
    node.settle(0.6)
    out = {"node": node.facts(), "reqs": {k: node.req_facts(r) for k, r in ids.items()},
           "p": {k: p.facts() for k, p in ps.items()}}
    for p in ps.values():
        p.close()
    return out


def _bad_params_run(connector: str, steps_s: float) -> dict:
    node = DNode(connector, "fail")
    p = FakePrefill([OK])
    a, b = rid("bad-no-transfer-id"), rid("bad-no-bootstrap")
    pa = p.params("x-" + a)
    del pa["transfer_id"]
    pb = p.params("x-" + b)
    del pb["remote_bootstrap_addr"]
    node.add(a, prompt(80), pa)
    node.add(b, prompt(80), pb)
    t0 = time.monotonic()
    node.step()
    held = {"free_blocks_held": node.free_blocks(), "usage_held": node.usage()}
    # several engine steps over steps_s (upstream has no timer for this state: time changes nothing)
    while time.monotonic() - t0 < steps_s and not (node.finished(a) and node.finished(b)) and not node.error:
        node.step()
        time.sleep(0.05)
    out = {"node": node.facts(), **held,
           "reqs": {"missing_transfer_id": node.req_facts(a), "missing_bootstrap_addr": node.req_facts(b)},
           "p": p.facts()}
    p.close()
    return out


def case_bad_params() -> dict:
    """6. kv_transfer_params without transfer_id / remote_bootstrap_addr: vLLM's own connector
    (contrast) and the hardened one, the same requests and steps."""
    return {"upstream": _bad_params_run("MooncakeConnector", 1.0),
            "hardened": _bad_params_run("HardenedMooncakeConnector", 5.0)}


def case_deadline() -> dict:
    """7. kv_load_timeout_ms=300 and a P that takes the pull and never answers."""
    node = DNode("HardenedMooncakeConnector", "fail", timeout_ms=DEADLINE_MS)
    p = FakePrefill([SILENT])
    r = rid("deadline")
    node.add(r, prompt(80), p.params("x-" + r))
    t0 = time.monotonic()
    node.step()  # schedule() -> WAITING_FOR_REMOTE_KVS; start_load_kv() starts the load's clock
    node.run_until(lambda: bool(node.reports[r]), 10)
    reported_after = node.report_at[r][0] - t0 if node.report_at[r] else None
    # past the receiver's own end of the pull (deadline + 0.25 s): no second report
    node.run_until(lambda: node.finished(r), 5)
    node.settle(max(0.0, t0 + DEADLINE_MS / 1000 + 0.25 + 0.6 - time.monotonic()))
    out = {"node": node.facts(), "deadline_s": DEADLINE_MS / 1000,
           "reported_after_s": None if reported_after is None else round(reported_after, 3),
           "req": node.req_facts(r), "p": p.facts()}
    p.close()
    return out


def case_abort_while_waiting() -> dict:
    """(beyond the list) the client aborts while D waits for a P that never answers: vLLM's
    Scheduler keeps the request's blocks until the connector reports the load, so they come back
    at the load deadline (upstream: at its DEALER's 540 s receive timeout)."""
    node = DNode("HardenedMooncakeConnector", "fail", timeout_ms=DEADLINE_MS)
    p = FakePrefill([SILENT])
    r = rid("abort-waiting")
    node.add(r, prompt(80), p.params("x-" + r))
    t0 = time.monotonic()
    node.step()
    node.run_until(lambda: p.pulls[0] > 0, 5)
    node.sched.finish_requests([r], RequestStatus.FINISHED_ABORTED)
    held = {"status_after_abort": node.status(r), "free_blocks_after_abort": node.free_blocks(),
            "in_scheduler_after_abort": r in node.sched.requests}
    node.run_until(lambda: bool(node.reports[r]) and r not in node.sched.requests, 10)
    freed_after = time.monotonic() - t0
    node.settle(max(0.0, t0 + DEADLINE_MS / 1000 + 0.25 + 0.6 - time.monotonic()))
    out = {"node": node.facts(), **held, "deadline_s": DEADLINE_MS / 1000,
           "freed_after_s": round(freed_after, 3), "req": node.req_facts(r), "p": p.facts()}
    p.close()
    return out


def case_unreachable() -> dict:
    """(beyond the list) P's registered address has nobody listening: the pull fails when the
    connection is refused, long before kv_load_timeout_ms (20 s here)."""
    node = DNode("HardenedMooncakeConnector", "fail")
    p = FakePrefill([GONE])
    r = rid("unreachable")
    node.add(r, prompt(80), p.params("x-" + r))
    t0 = time.monotonic()
    node.step()
    node.run_until(lambda: bool(node.reports[r]), 15)
    reported_after = node.report_at[r][0] - t0 if node.report_at[r] else None
    node.run_until(lambda: node.finished(r), 5)
    node.settle(0.5)
    out = {"node": node.facts(), "timeout_s": LONG_MS / 1000,
           "reported_after_s": None if reported_after is None else round(reported_after, 3),
           "req": node.req_facts(r), "p": p.facts()}
    p.close()
    return out


def case_late_write_after_deadline() -> dict:
    """(beyond the list) P is slow, not dead: D's load deadline fails the load and frees its
    blocks, vLLM gives them to the next request, then P's prefill completes and P writes the
    prompt's KV into those blocks. Both sides are the REAL hardened connector (P: kv_producer worker,
    its own sender listener, TransferEngine write over tcp); only P's scheduler is replaced by the
    metadata it would send its worker (reqs_to_send: first without blocks, as update_state_after_alloc
    gives it; then with blocks, as request_finished gives it)."""
    bootstrap = MooncakeBootstrapServer("127.0.0.1", 0)
    bootstrap.start()
    KEEP.append(bootstrap)
    pvc = make_config("HardenedMooncakeConnector", "fail", LONG_MS, role="kv_producer", num_blocks=8,
                      extra={"bootstrap_server_address": f"127.0.0.1:{bootstrap.port}"})
    pkcc = make_kv_cache_config(8)
    with set_current_vllm_config(pvc):
        p = KVConnectorFactory.create_connector(config=pvc, role=KVConnectorRole.WORKER, kv_cache_config=pkcc)
        p_kv = {name: torch.full((8, 2, BLOCK, HEADS, HEAD_SIZE), 3.0, dtype=torch.float16) for name in LAYERS}
        p.register_kv_caches(p_kv)  # starts P's side channel and registers it with the bootstrap server
    KEEP.append((p, p_kv))
    p_worker = p.connector_worker

    # D: 3 usable blocks (+ vLLM's null block): the next request must reuse the failed load's blocks
    node = DNode("HardenedMooncakeConnector", "fail", timeout_ms=DEADLINE_MS, num_blocks=4)
    node.kv_marker = 1.0
    x, y = rid("late-x"), rid("late-y")
    tid = "x-" + x
    node.add(x, prompt(80), {"do_remote_prefill": True, "do_remote_decode": False,
                             "remote_engine_id": pvc.kv_transfer_config.engine_id,
                             "remote_bootstrap_addr": f"http://127.0.0.1:{bootstrap.port}", "transfer_id": tid})
    p_meta = mc.MooncakeConnectorMetadata()
    p_meta.reqs_to_send["p-" + x] = (tid, [])  # P scheduled the prefill (update_state_after_alloc)
    p.bind_connector_metadata(p_meta)
    p.start_load_kv(None)  # as P's model runner does with its scheduler's metadata
    node.run_until(lambda: node.finished(x), 10)  # D's deadline fails the load; the blocks go back
    x_blocks = sorted(node.blocks.get(x, ()))
    node.add(y, prompt(80), None, max_tokens=8)
    node.run_until(lambda: y in node.sched.requests and node.status(y) == "RUNNING"
                   and node.reqs[y].num_output_tokens >= 1, 10)
    y_blocks = sorted(b for g in node.sched.kv_cache_manager.get_block_ids(y) for b in g)
    intact_before = sum(all(bool(torch.all(t[b] == 1.0)) for t in node.kv_caches.values()) for b in y_blocks)

    p_meta2 = mc.MooncakeConnectorMetadata()
    p_meta2.reqs_to_send["p-" + x] = (tid, [[1, 2, 3]])  # P's prefill ends (request_finished): P sends
    p.bind_connector_metadata(p_meta2)
    p.start_load_kv(None)
    sent = {"bytes": 0, "transfers": 0}
    end = time.monotonic() + 5
    while time.monotonic() < end:
        st = p_worker.get_kv_connector_stats()
        if st is not None:
            sent["bytes"] += int(sum(st.data.get("bytes_transferred", [])))
            sent["transfers"] += len(st.data.get("transfer_duration", []))
            sent["failed"] = sent.get("failed", 0) + len(st.data.get("num_failed_transfers", []))
        if sent["transfers"] or sent.get("failed"):
            break
        time.sleep(0.05)
    time.sleep(0.2)
    intact_after = sum(all(bool(torch.all(t[b] == 1.0)) for t in node.kv_caches.values()) for b in y_blocks)
    overwritten_by_p = sum(all(bool(torch.all(t[b] == 3.0)) for t in node.kv_caches.values()) for b in y_blocks)
    return {"node": node.facts(), "x": node.req_facts(x), "y_status": node.status(y),
            "x_blocks": len(x_blocks), "y_blocks": len(y_blocks),
            "y_reuses_x_blocks": len(set(x_blocks) & set(y_blocks)),
            "y_blocks_intact_before_p_write": intact_before, "y_blocks_intact_after": intact_after,
            "y_blocks_overwritten_by_p": overwritten_by_p, "p_sent": sent,
            "p_failures": dict(p_worker.failures.totals)}


CASES = {
    "fail_policy": case_fail_policy,
    "recompute_policy": case_recompute_policy,
    "multi_p": case_multi_p,
    "empty_pull": case_empty_pull,
    "duplicates": case_duplicates,
    "bad_params": case_bad_params,
    "deadline": case_deadline,
    "abort_while_waiting": case_abort_while_waiting,
    "unreachable": case_unreachable,
    "late_write_after_deadline": case_late_write_after_deadline,
}


def main() -> None:
    only = [c for c in os.environ.get("PD_INPROC_CASES", "").split(",") if c]
    result: dict = {"cases": {}, "timing": {}}
    setup_process()
    result["timing"]["setup_s"] = round(time.monotonic() - T_START, 2)
    for name, fn in CASES.items():
        if only and name not in only:
            continue
        # Earlier cases' nodes stay referenced (KEEP): vLLM's worker __del__ terminates its ZMQ
        # context and joins its receiver thread, which, run by the cyclic GC in the middle of a
        # later case's step, adds up to a second to that step (measured: it skewed the deadline
        # case). Collect what is garbage now, outside any timed part.
        gc.collect()
        t = time.monotonic()
        try:
            facts = fn()
            facts["error"] = None
        except Exception:  # noqa: BLE001 - one broken case must not hide the others
            facts = {"error": traceback.format_exc()[-2000:]}
        result["cases"][name] = facts
        result["timing"][name] = round(time.monotonic() - t, 2)
    result["timing"]["total_s"] = round(time.monotonic() - T_START, 2)
    sys.stdout.write("\n" + MARKER + json.dumps(result) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # receiver threads, engines and event loops of every case end with the process


if __name__ == "__main__":
    main()
