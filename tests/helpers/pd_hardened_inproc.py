"""vLLM's real v1 Scheduler stepped in-process on CPU with the hardened Mooncake connector on both
sides, against stand-in prefill nodes on 127.0.0.1 (and, in the late-write case, a real hardened
P worker). Run by tests/connector_patch/test_pd_hardened_inproc.py with the P/D node env's python (vLLM, torch and
Mooncake live there, not in the harness's env).

argv: REPO. Prints many vLLM log lines, then one line ``PDCHAOS-INPROC-RESULT {json}``: for each
case, statuses, counts and times only (never prompt text, token ids or block lists). What each
step's KVConnectorOutput carried for a request is recorded as one of ``REPORT_KINDS`` (a failure, a
failure with its release, a release alone, an OK load), with what vLLM did with the request's
blocks in that step (still held, or all given back: counted from vLLM's block pool).
``PD_INPROC_CASES=a,b`` runs only those cases.

Real here: vLLM 0.32.0's ``Scheduler`` (with its KV cache manager and block pool), the scheduler-side
connector that the Scheduler builds itself from ``kv_transfer_config`` (``HardenedMooncakeConnector``
registered by ``connector_patch.vllm_plugin.register()``, or vLLM's ``MooncakeConnector`` for
contrast), the worker-side connector built by vLLM's ``KVConnectorFactory`` as a worker builds it
(Mooncake TransferEngine over tcp on 127.0.0.1, KV cache tensors registered with it, its receiver
thread, its ZMQ DEALER pulls and cancel messages, its bootstrap queries), vLLM's
``KVConnectorModelRunnerMixin`` that turns the worker-side results into the ``KVConnectorOutput`` of
each step, vLLM's ``MooncakeBootstrapServer`` for each P, and every reply P sends
(msgspec-encoded ``MooncakeXferResponse`` on a ZMQ ROUTER, as P's side channel sends them).

In ``late_write_after_deadline`` P is the REAL hardened connector too (``RealPrefill``: a
kv_producer worker with its own side channel, sender loop and TransferEngine, which answers D's
cancel with its own ``_on_cancel`` and writes D's blocks for real); only P's scheduler is replaced
by the metadata it would hand P's worker.

Not real: there is no model. A step that schedules tokens gets a stand-in forward (one constant
sampled token per request that reached the end of its tokens; in the cases that set
``kv_marker`` it also fills a newly scheduled request's blocks with a marker, as a model writes a
prompt's KV); a step that schedules nothing goes through the mixin's real
``kv_connector_no_forward``. Elsewhere P is a stand-in (``FakePrefill``): its ROUTER answers D's pull
from a script (ERROR, FINISH with err_reqs, FINISH naming nothing, OK, silence, or an answer held
until the case opens a gate) and writes no KV; D's cancel message gets no answer, ERROR (as
upstream's sender answers a payload that is not a pull) or the hardened P's answer (the pending
pull answered FINISH err_reqs, then ``{"cancelled": [...]}``); its ROUTER can be closed mid-case
(its port then refuses). ``torch.accelerator.current_device_index()`` is shimmed by the node env's
own ``pdchaos_cpu_shim`` (vLLM plugins are off here, so it is called by hand), as on every CPU node.
"""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import json
import os
import queue
import random
import socket
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import defaultdict
from types import SimpleNamespace

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
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator  # noqa: E402
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
LONG_MS = 20000  # the outcome comes from P (its answer, its refused port, D's cancel), never from the deadline
DEADLINE_MS = 300  # case 7 and the cases of a P that may still write after D's deadline
# the cases whose claim needs the stand-in P to hold the pull at D's deadline: a pull that has not
# connected by then is settled at once (P never got it, issue 43 item 7f), and on a starved machine
# (load average 20 on 2 cores, D at nice 10) a loopback connection once took longer than 300 ms
HELD_DEADLINE_MS = 1000
STAND_IN_TOKEN = 7
# How D's scheduler sees a request in one step's KVConnectorOutput (DNode._record / _resolve):
#   "failed"           its invalid blocks (or failed_recving) without finished_recving: the load
#                      failed; with policy fail vLLM fails the request and keeps its blocks
#   "failed+released"  both in one output, and vLLM finished the request (policy fail): the
#                      client's error and its blocks back in one step
#   "failed+recv"      both in one output, the request goes on (policy recompute)
#   "released"         finished_recving alone for a request already finished (failed or aborted):
#                      vLLM gives its blocks back
#   "ok"               finished_recving alone for a request still waiting: its load succeeded
REPORT_KINDS = ("failed", "failed+released", "failed+recv", "released", "ok")
RELEASES = ("failed+released", "released")
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


def gated(gate: threading.Event, then):
    """Answer with ``then`` once the case opens ``gate`` (P's prefill ends when the case says so)."""
    return lambda asked: [gate, *then(asked)]


CANCEL_KEY = "pdchaos_cancel"  # D -> P on P's side channel: {"pdchaos_cancel": [transfer ids]}
STAND_IN_ABORTED = "pdchaos-aborted: stand-in P cancelled the transfer"


class FakePrefill:
    """One P engine as D sees it: vLLM's own MooncakeBootstrapServer on 127.0.0.1 and one ZMQ
    ROUTER per P TP rank, registered there as P's workers register (POST /register). Each ROUTER
    answers D's pull with its script (run in its own thread, so the ROUTER keeps reading while a
    pull waits): msgspec-encoded MooncakeXferResponse messages, float sleeps, ("after", rank)
    waits, threading.Event gates. A pull is answered once: after a FINISH or ERROR for it, later
    script replies for it are dropped.

    D's cancel (``{"pdchaos_cancel": [transfer ids]}``, one frame on its own DEALER) is handled as
    ``on_cancel`` says, once ``ignore_cancels`` cancels went unanswered: None: no reply (a frozen
    P); "error": ERROR at once (what upstream's ``_sender_worker`` answers a payload that is not a
    pull); "ack": as the hardened P's ``_on_cancel`` (every pending pull naming a cancelled
    transfer is answered FINISH err_reqs at once, then ``{"cancelled": [transfer ids]}``). It counts
    pulls, blocks asked for, cancels, and records times (counts and times only)."""

    def __init__(self, scripts, on_cancel: str | None = None, ignore_cancels: int = 0):
        assert on_cancel in (None, "error", "ack")
        self.engine_id = f"stand-in-p-{uuid.uuid4().hex[:8]}"
        KEEP.append(self)
        self.server = MooncakeBootstrapServer("127.0.0.1", 0)
        self.server.start()
        self.bootstrap_addr = f"http://127.0.0.1:{self.server.port}"
        self.ctx = zmq.Context()
        self.stop = threading.Event()
        self.on_cancel, self.ignore_cancels = on_cancel, ignore_cancels
        n = len(scripts)
        self.replied = [threading.Event() for _ in range(n)]
        self.reply_at: list[float | None] = [None] * n  # last reply sent by the script
        self.sent_at: list[float | None] = [None] * n  # when its last reply went out (just before the send)
        self.pulls = [0] * n
        self.asked_blocks: list[list[int]] = [[] for _ in range(n)]
        self.cancels = [0] * n  # cancel messages received
        self.cancel_sizes: list[list[int]] = [[] for _ in range(n)]  # transfer ids each cancel named
        self.cancel_at: list[list[float]] = [[] for _ in range(n)]
        self.cancel_answered_at: list[float | None] = [None] * n  # first cancel answered (error/ack)
        self.cancel_answered_pulls = [0] * n  # pulls answered because of a cancel
        self.dropped_replies = [0] * n  # script replies for a pull already answered
        self.closing = [threading.Event() for _ in range(n)]
        self.closed_at: list[float | None] = [None] * n
        self._closed = [threading.Event() for _ in range(n)]
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

    def close_rank(self, rank: int) -> float:
        """Close rank ``rank``'s ROUTER (the P process is gone: its port refuses); when it closed."""
        self.closing[rank].set()
        if not self._closed[rank].wait(5):
            raise RuntimeError("stand-in P: ROUTER did not close")
        return self.closed_at[rank]

    def _run(self, rank, script, asked, pull_no, outbox) -> None:
        give_up = time.monotonic() + 30  # a gate never opened ends the script, never the process
        for item in script(asked):
            if isinstance(item, float):
                time.sleep(item)
            elif isinstance(item, tuple):
                self.replied[item[1]].wait(10)
            elif isinstance(item, threading.Event):
                while not item.wait(0.05) and not self.stop.is_set() and time.monotonic() < give_up:
                    pass
            else:
                outbox.put(("send", pull_no, item))
        outbox.put(("done", pull_no, None))

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
        outbox: queue.SimpleQueue = queue.SimpleQueue()
        pulls: list[dict] = []  # identity, {d_req_id: transfer id}, answered
        sent_by_script: set[int] = set()
        try:
            while not self.stop.is_set() and not self.closing[rank].is_set():
                while True:
                    try:
                        kind, pull_no, resp = outbox.get_nowait()
                    except queue.Empty:
                        break
                    pull = pulls[pull_no]
                    if kind == "done":
                        if pull_no in sent_by_script:
                            self.reply_at[rank] = time.monotonic()
                        self.replied[rank].set()
                    elif pull["answered"]:
                        self.dropped_replies[rank] += 1
                    else:
                        self.sent_at[rank] = time.monotonic()
                        sock.send_multipart([pull["identity"], enc.encode(resp)])
                        sent_by_script.add(pull_no)
                        pull["answered"] = resp.status in (Status.FINISH, Status.ERROR)
                if not sock.poll(10):
                    continue
                frames = sock.recv_multipart()
                try:
                    msg = msgspec.msgpack.decode(frames[-1])
                except Exception:  # noqa: BLE001 - not msgpack: the pull decoder below says why
                    msg = None
                if isinstance(msg, dict) and CANCEL_KEY in msg:
                    self._cancel(rank, sock, enc, frames[0], msg[CANCEL_KEY], pulls)
                    continue
                meta = dec.decode(frames[-1])
                asked = list(meta.req_blocks)
                self.pulls[rank] += 1
                self.asked_blocks[rank].extend(sum(len(g) for g in blocks) for _, blocks in meta.req_blocks.values())
                pulls.append({"identity": frames[0], "reqs": {d: t for d, (t, _) in meta.req_blocks.items()},
                              "answered": False})
                threading.Thread(target=self._run, args=(rank, script, asked, len(pulls) - 1, outbox),
                                 daemon=True).start()
        finally:
            sock.close(linger=0)
            self.closed_at[rank] = time.monotonic()
            self._closed[rank].set()

    def _cancel(self, rank, sock, enc, identity, tids, pulls) -> None:
        self.cancels[rank] += 1
        self.cancel_sizes[rank].append(len(tids) if isinstance(tids, list) else -1)
        self.cancel_at[rank].append(time.monotonic())
        if self.on_cancel is None or self.cancels[rank] <= self.ignore_cancels:
            return
        if self.cancel_answered_at[rank] is None:
            self.cancel_answered_at[rank] = time.monotonic()
        if self.on_cancel == "error":
            sock.send_multipart([identity, enc.encode(Response(status=Status.ERROR, err_msg="stand-in P: not a pull"))])
            return
        tids = [t for t in tids if isinstance(t, str)]
        for pull in pulls:
            hit = [d for d, t in pull["reqs"].items() if t in tids]
            if hit and not pull["answered"]:
                rest = len(pull["reqs"]) > len(hit)
                resp = Response(status=Status.CONTINUE if rest else Status.FINISH, err_reqs=hit,
                                err_msg=STAND_IN_ABORTED)
                sock.send_multipart([pull["identity"], enc.encode(resp)])
                pull["answered"] = not rest
                self.cancel_answered_pulls[rank] += 1
        sock.send_multipart([identity, enc.encode({"cancelled": tids})])

    def last_word_at(self) -> float | None:
        """When the last script reply of any rank went out (P's last word on D's pulls)."""
        times = [t for t in self.sent_at if t is not None]
        return max(times) if times else None

    def facts(self) -> dict:
        order = [r for r, _ in sorted(((r, t) for r, t in enumerate(self.reply_at) if t is not None),
                                      key=lambda x: x[1])]
        return {"pulls": list(self.pulls), "asked_blocks": [sorted(b) for b in self.asked_blocks],
                "reply_order": order, "cancels": list(self.cancels),
                "cancel_sizes": [list(x) for x in self.cancel_sizes],
                "cancel_answered_pulls": list(self.cancel_answered_pulls),
                "dropped_replies": list(self.dropped_replies)}

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

    def __init__(self, connector: str, policy: str, timeout_ms: int = LONG_MS, num_blocks: int = NUM_BLOCKS,
                 workers: int = 1, aggregate=None, extra: dict | None = None):
        self.vc = make_config(connector, policy, timeout_ms, num_blocks=num_blocks, extra=extra)
        # workers > 1: each step's output goes through vLLM's own KVOutputAggregator (``aggregate``:
        # its method, patched or not), as a TP engine's executor does; the other workers are a
        # stand-in that reports exactly what this one does (the same P, the same deadline)
        self.workers, self.aggregate = workers, aggregate
        self.aggregator = KVOutputAggregator(workers) if workers > 1 else None
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
        # what the connector reported for a request, one label per step output naming it (REPORT_KINDS)
        self.reports: dict[str, list[str]] = defaultdict(list)
        self.report_at: dict[str, list[float]] = defaultdict(list)
        # per report: what vLLM did with the request's blocks in that step (held or given back)
        self.report_effects: dict[str, list[dict]] = defaultdict(list)
        self.released_at: dict[str, list[float]] = defaultdict(list)  # release reports (blocks given back)
        self.finished_sending = 0  # finished_sending on D: none any more (D never delay-frees)
        self.first_sched_at: dict[str, float] = {}  # when a request was first given tokens to compute
        self.finish_at: dict[str, float] = {}  # when the client got the request's final output
        self.freed_at: dict[str, float] = {}  # when vLLM freed its blocks (the request left the scheduler)
        self._present: set[str] = set()
        # called (kind, rid): "recv" as a report carrying a load's outcome (failed, or finished for a
        # request still waiting) reaches the scheduler, "release" after the step of a release report,
        # "freed" after the step in which the request left the scheduler
        self.on_report = None
        self.on_sched = None  # called (rid) when a request is first given tokens to compute
        self.finish_reasons: dict[str, str] = {}
        self.failed_recvs = 0
        self.stray_invalid_blocks = 0
        self.error: str | None = None
        self.steps = 0
        self.kv_marker: float | None = None  # the stand-in forward writes it into a prefilled request's blocks
        self.watcher = None  # the P/D write-after-free watcher (pdchaos_waf.Watcher), stepped as the worker steps it
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
            if self.watcher is not None:  # where the worker's _update_states hook calls it
                self.watcher.step_start(so)
            for rid, req in self.reqs.items():
                if rid in self.sched.requests:
                    self.trace[rid].append((req.status.name, so.num_scheduled_tokens.get(rid, 0),
                                            req.num_computed_tokens))
                    if so.num_scheduled_tokens.get(rid, 0) and rid not in self.first_sched_at:
                        self.first_sched_at[rid] = time.monotonic()
                        if self.on_sched is not None:
                            self.on_sched(rid)
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
            if self.watcher is not None:  # where the worker's _get_kv_connector_output hook calls it
                self.watcher.step_end(mro.kv_connector_output or SimpleNamespace(
                    finished_recving=None, invalid_block_ids=None, failed_recving=None))
            if self.aggregator is not None:
                mro = self._aggregated(mro)
            pending = self._record(mro)
            held_before = {r: self._block_ids(r) for r in self.sched.requests}
            free_before = self.free_blocks()
            outs = self.sched.update_from_output(so, mro)
            now = time.monotonic()  # the step's end: releases and freed requests share it
            self._resolve(pending, held_before, free_before, now)
            for eco in outs.values():
                for o in eco.outputs:
                    if o.finish_reason is not None:
                        self.finish_reasons[o.request_id] = o.finish_reason.name
                        self.finish_at.setdefault(o.request_id, now)
            present = {r for r in self.reqs if r in self.sched.requests}
            for r in self._present - present:
                self.freed_at.setdefault(r, now)
                if self.on_report is not None:
                    self.on_report("freed", r)
            self._present = present
            self.steps += 1
        except Exception as e:  # noqa: BLE001 - a scheduler assertion is a finding of the case
            self.error = f"{type(e).__name__}: {str(e)[:200]}"
            traceback.print_exc()

    def _aggregated(self, mro: ModelRunnerOutput) -> ModelRunnerOutput:
        import copy

        outs = [mro]
        for _ in range(self.workers - 1):
            twin = copy.copy(mro)
            kvo = mro.kv_connector_output
            if kvo is not None:
                twin.kv_connector_output = copy.copy(kvo)
                for f in ("finished_sending", "finished_recving", "failed_recving", "invalid_block_ids"):
                    v = getattr(kvo, f)
                    setattr(twin.kv_connector_output, f, set(v) if v is not None else None)
            outs.append(twin)
        fn = self.aggregate or KVOutputAggregator.aggregate  # None: the class's, as the node installed it
        return fn(self.aggregator, outs, 0)

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

    def _record(self, mro: ModelRunnerOutput) -> list[tuple[str, str, bool]]:
        """The reports of this step's output, before the scheduler applies it: (request, what the
        output carries for it, whether the request was already finished). What the output
        carries: "failed" (its invalid blocks, or failed_recving, without finished_recving),
        "failed+recv" (both), "recv" (finished_recving alone). :meth:`_resolve` names them."""
        kvo = mro.kv_connector_output
        if kvo is None:
            return []
        now = time.monotonic()
        invalid = set(kvo.invalid_block_ids or ())
        failed_recving = set(kvo.failed_recving or ())
        recving = set(kvo.finished_recving or ())
        self.finished_sending += len(kvo.finished_sending or ())
        pending: list[tuple[str, str, bool]] = []
        attributed: set[int] = set()
        for rid, req in self.reqs.items():
            blocks = self.blocks.get(rid, set())
            # invalid blocks fail a request waiting for remote KV that holds them (vLLM's
            # _handle_invalid_blocks); any other invalid id is stray
            failed = rid in failed_recving or (req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
                                               and bool(blocks & invalid))
            if failed:
                attributed |= blocks
            if not failed and rid not in recving:
                continue
            content = "failed+recv" if failed and rid in recving else "failed" if failed else "recv"
            was_finished = RequestStatus.is_finished(req.status)
            pending.append((rid, content, was_finished))
            self.report_at[rid].append(now)
            if self.on_report is not None and not (content == "recv" and was_finished):
                self.on_report("recv", rid)
        self.stray_invalid_blocks += len(invalid - attributed)
        stats = kvo.kv_connector_stats
        if stats is not None:
            self.failed_recvs += len(stats.data.get("num_failed_recvs", []))
        return pending

    def _resolve(self, pending, held_before: dict, free_before: int, now: float) -> None:
        """Name each report of this step by what vLLM made of it (REPORT_KINDS) and record what
        happened to the request's blocks in the step: still held, or given back to the pool
        (``own_freed``: the free blocks gained, less those of other requests that left in the
        same step)."""
        if not pending:
            return
        present = set(self.sched.requests)
        still = set().union(*(self._block_ids(r) for r in present))
        gained = self.free_blocks() - free_before
        for rid, content, was_finished in pending:
            if content == "failed+recv":
                label = "failed+released" if self.finished(rid) else "failed+recv"
            elif content == "recv":
                label = "released" if was_finished else "ok"
            else:
                label = "failed"
            own = held_before.get(rid, set())
            others = set().union(*(b for r, b in held_before.items() if r not in present and r != rid))
            others_freed = len(others - still - own)
            self.reports[rid].append(label)
            self.report_effects[rid].append({"report": label, "in_scheduler_after": rid in present,
                                             "own_blocks": len(own), "own_freed": gained - others_freed})
            if label in RELEASES:
                self.released_at[rid].append(now)
                if self.on_report is not None:
                    self.on_report("release", rid)

    def _block_ids(self, rid: str) -> set[int]:
        return {b for g in self.sched.kv_cache_manager.get_block_ids(rid) for b in g}

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

    def reports_against_blocks(self) -> int:
        """Reports whose step did not do with the request's blocks what the report means: a
        failure alone ("failed") must leave them held (P may still write), a release must give all
        of them back in that step. 0 when every report did."""
        bad = 0
        for effects in self.report_effects.values():
            for e in effects:
                if e["report"] == "failed":
                    bad += (not e["in_scheduler_after"]) or e["own_freed"] != 0
                elif e["report"] in RELEASES:
                    bad += e["in_scheduler_after"] or e["own_blocks"] == 0 or e["own_freed"] != e["own_blocks"]
        return bad

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
                "report_effects": list(self.report_effects.get(rid, [])),
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
                "finished_sending": self.finished_sending,
                "reports_against_blocks": self.reports_against_blocks(),
                "bound_s": getattr(self.worker.connector_worker, "bound_s", None),
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
           "released_after_last_word_s": {"error": _release_after_last_word(node, a, p_err),
                                          "unnamed": _release_after_last_word(node, b, p_nothing)},
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


def _release_after_last_word(node: "DNode", r: str, p: "FakePrefill") -> float | None:
    """Seconds from P's last word on the pulls (its last reply sent) to the request's first
    release report (negative: released before P had said it)."""
    t = p.last_word_at()
    return None if t is None or not node.released_at[r] else round(node.released_at[r][0] - t, 3)


def _step_opening_gates(node: "DNode", gates: dict, ids: dict, done, timeout_s: float) -> None:
    """Step ``node`` until ``done()`` or ``timeout_s``; the gate ``gates[k]`` opens (P's next word
    on request ``ids[k]`` goes out) once the scheduler got the request's first report."""
    end = time.monotonic() + timeout_s
    while not node.error and time.monotonic() < end and not done():
        for k, g in gates.items():
            if node.reports[ids[k]] and not g.is_set():
                g.set()
        node.step()
        if node.sched.get_num_unfinished_requests() == 0:
            time.sleep(0.005)


def _last_word_after_failure(node: "DNode", r: str, p: "FakePrefill") -> float | None:
    """Seconds from the request's first report to P's last word on its pulls (positive: P could
    still write when the failure was reported)."""
    t = p.last_word_at()
    return None if t is None or not node.report_at[r] else round(t - node.report_at[r][0], 3)


def case_multi_p() -> dict:
    """3. a load from 2 P workers (P TP 2 -> pull_tasks_count 2): rank 0 fails, then rank 1 says
    OK once D's scheduler got the failure (and, for the other request, rank 0 says OK, then 0.3 s
    later rank 1 fails). Stepped until both requests left the scheduler (their blocks given back),
    then 0.6 s more."""
    node = DNode("HardenedMooncakeConnector", "fail")
    gate = threading.Event()
    p_fail_first = FakePrefill([ERROR, gated(gate, OK)])
    p_ok_first = FakePrefill([OK, after(0, 0.3, ERROR)])
    a, b = rid("multi-fail-then-ok"), rid("multi-ok-then-fail")
    node.add(a, prompt(80), p_fail_first.params("x-" + a))
    node.add(b, prompt(80), p_ok_first.params("x-" + b))
    _step_opening_gates(node, {"a": gate}, {"a": a}, lambda: (
        node.finished(a) and node.finished(b) and p_fail_first.replied[1].is_set()
        and p_ok_first.replied[1].is_set() and a not in node.sched.requests and b not in node.sched.requests), 20)
    node.settle(0.6)
    out = {"node": node.facts(), "reqs": {"fail_then_ok": node.req_facts(a), "ok_then_fail": node.req_facts(b)},
           "last_word_after_failure_s": {"fail_then_ok": _last_word_after_failure(node, a, p_fail_first),
                                         "ok_then_fail": _last_word_after_failure(node, b, p_ok_first)},
           "released_after_last_word_s": {"fail_then_ok": _release_after_last_word(node, a, p_fail_first),
                                          "ok_then_fail": _release_after_last_word(node, b, p_ok_first)},
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
    """5. one failure arriving twice: err_reqs in a CONTINUE then again in the FINISH; err_reqs in
    a CONTINUE then ERROR; both P workers of one load answering ERROR. P's second word goes out
    once D's scheduler got the first (P could still write then). Stepped until every request left
    the scheduler, then 0.6 s more."""
    node = DNode("HardenedMooncakeConnector", "fail")

    def cont_err(asked):
        return [Response(status=Status.CONTINUE, err_reqs=list(asked), err_msg="stand-in P: failed")]

    gates = {k: threading.Event() for k in ("err_reqs_twice", "err_reqs_then_error", "both_workers_error")}
    p_twice = FakePrefill([lambda asked: cont_err(asked) + [gates["err_reqs_twice"]] + FINISH_ERR(asked)])
    p_then_error = FakePrefill([lambda asked: cont_err(asked) + [gates["err_reqs_then_error"]] + ERROR(asked)])
    p_both = FakePrefill([ERROR, gated(gates["both_workers_error"], ERROR)])
    ids = {"err_reqs_twice": rid("dup-twice"), "err_reqs_then_error": rid("dup-then-error"),
           "both_workers_error": rid("dup-both")}
    ps = {"err_reqs_twice": p_twice, "err_reqs_then_error": p_then_error, "both_workers_error": p_both}
    for k, r in ids.items():
        node.add(r, prompt(80), ps[k].params("x-" + r))
    _step_opening_gates(node, gates, ids, lambda: (
        all(node.finished(r) and r not in node.sched.requests for r in ids.values())
        and all(e.is_set() for p in ps.values() for e in p.replied)), 20)
    node.settle(0.6)
    out = {"node": node.facts(), "reqs": {k: node.req_facts(r) for k, r in ids.items()},
           "last_word_after_failure_s": {k: _last_word_after_failure(node, r, ps[k]) for k, r in ids.items()},
           "released_after_last_word_s": {k: _release_after_last_word(node, r, ps[k]) for k, r in ids.items()},
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
    """7. kv_load_timeout_ms=300 and a P that takes the pull and never answers it (a hardened P whose
    prefill has not ended: it answers only D's cancel, at once). The failure at the deadline, the
    release once P acknowledged D's cancel."""
    node = DNode("HardenedMooncakeConnector", "fail", timeout_ms=DEADLINE_MS)
    p = FakePrefill([SILENT], on_cancel="ack")
    r = rid("deadline")
    node.add(r, prompt(80), p.params("x-" + r))
    t0 = time.monotonic()
    node.step()  # schedule() -> WAITING_FOR_REMOTE_KVS; start_load_kv() starts the load's clock
    node.run_until(lambda: bool(node.reports[r]), 10)
    reported_after = node.report_at[r][0] - t0 if node.report_at[r] else None
    node.run_until(lambda: node.finished(r) and node.free_blocks() == node.free0, 5)
    released_after = node.released_at[r][0] - t0 if node.released_at[r] else None
    # past the receiver's own end of the pull (deadline + 0.25 s): no second report
    node.settle(max(0.3, t0 + DEADLINE_MS / 1000 + 0.25 + 0.6 - time.monotonic()))
    out = {"node": node.facts(), "deadline_s": DEADLINE_MS / 1000,
           "reported_after_s": None if reported_after is None else round(reported_after, 3),
           "released_after_s": None if released_after is None else round(released_after, 3),
           "cancel_answered_after_s": (None if p.cancel_answered_at[0] is None
                                       else round(p.cancel_answered_at[0] - t0, 3)),
           "req": node.req_facts(r), "p": p.facts()}
    p.close()
    return out


async def _requery(w, addr: str) -> None:
    """Ask P's bootstrap server again, as upstream's handle_new_engine_id does."""
    w._pending_bootstrap_queries[addr] = asyncio.Event()
    await w._connect_to_prefiller_bootstrap(addr)


def case_abort_while_waiting() -> dict:
    """(beyond the list) the client aborts while D waits (kv_load_timeout_ms 20 s) for a P that
    does not answer the pull: vLLM's Scheduler keeps an aborted WAITING_FOR_REMOTE_KVS request's
    blocks until the connector reports it in finished_recving. One P answers D's cancel as a hardened
    P does (the blocks come back at once); the other answers it ERROR (as upstream) and then its
    port closes (they come back once D sees it refused)."""
    node = DNode("HardenedMooncakeConnector", "fail", timeout_ms=LONG_MS)
    p_ack = FakePrefill([SILENT], on_cancel="ack")
    p_gone = FakePrefill([SILENT], on_cancel="error")
    a, b = rid("abort-ack"), rid("abort-refused")
    node.add(a, prompt(80), p_ack.params("x-" + a))
    node.add(b, prompt(80), p_gone.params("x-" + b))
    node.step()
    node.run_until(lambda: p_ack.pulls[0] > 0 and p_gone.pulls[0] > 0, 5)
    t_abort = time.monotonic()
    node.sched.finish_requests([a, b], RequestStatus.FINISHED_ABORTED)
    held = {"statuses_after_abort": [node.status(a), node.status(b)],
            "free_blocks_after_abort": node.free_blocks(),
            "in_scheduler_after_abort": [a in node.sched.requests, b in node.sched.requests]}
    node.run_until(lambda: bool(node.reports[a]) and a not in node.sched.requests, 10)
    # the other P got D's cancel (answered ERROR); its blocks are still held; then P goes away
    node.run_until(lambda: p_gone.cancels[0] > 0, 10)
    b_held_before_close = {"reports": len(node.reports[b]), "in_scheduler": b in node.sched.requests}
    t_close = p_gone.close_rank(0)
    node.run_until(lambda: bool(node.reports[b]) and b not in node.sched.requests, 10)
    node.settle(0.5)
    w = node.worker.connector_worker
    # an abort says nothing about P: its cached addresses stay fresh; a refused port marks them
    # stale (kept, re-queried by the next pull), and P's bootstrap answering makes them fresh again
    engines = {"ack_stale": p_ack.engine_id in w._stale_engines,
               "refused_stale": p_gone.engine_id in w._stale_engines,
               "refused_cached": p_gone.engine_id in w._remote_agents}
    asyncio.run_coroutine_threadsafe(_requery(w, p_gone.bootstrap_addr), w.receiver_loop).result(10)
    engines["refused_stale_after_query"] = p_gone.engine_id in w._stale_engines

    def since(times, t):
        return round(times[0] - t, 3) if times else None

    out = {"node": node.facts(), **held, "deadline_s": LONG_MS / 1000, "engines": engines,
           "ack": {"req": node.req_facts(a), "freed_after_abort_s": since(node.report_at[a], t_abort),
                   "p": p_ack.facts()},
           "refused": {"req": node.req_facts(b), "held_before_close": b_held_before_close,
                       "freed_after_abort_s": since(node.report_at[b], t_abort),
                       "freed_after_close_s": since(node.report_at[b], t_close), "p": p_gone.facts()}}
    p_ack.close(), p_gone.close()
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


HOLD_S = 2.0  # how long past the deadline a load an upstream-like P leaves open is watched


def case_upstream_p_holds_blocks() -> dict:
    """(beyond the list) loads failed at their deadline (1 s) against P engines that behave as
    upstream's: they answer neither the pull (P's prefill is slow) nor D's cancel (one answers it
    ERROR, as upstream's _sender_worker does with a payload that is not a pull; the other sends
    nothing). Such a P may still write, so D keeps the blocks (a third request waits for them)
    while watched HOLD_S past the deadline (the bound, abort timeout + 60 s, is far later); each
    P's late answer (FINISH err_reqs, at the end of its prefill) settles its pull and frees them."""
    # 6 usable blocks (+ vLLM's null block): the two failed loads hold them all, Y needs 3
    node = DNode("HardenedMooncakeConnector", "fail", timeout_ms=HELD_DEADLINE_MS, num_blocks=7)
    node.kv_marker = 1.0
    gates = {"error": threading.Event(), "mute": threading.Event()}
    ps = {"error": FakePrefill([gated(gates["error"], FINISH_ERR)], on_cancel="error"),
          "mute": FakePrefill([gated(gates["mute"], FINISH_ERR)], on_cancel=None)}
    xs = {k: rid("upstream-" + k) for k in ps}
    y = rid("upstream-y")
    for k, x in xs.items():
        node.add(x, prompt(80), ps[k].params("x-" + x))
    t0 = time.monotonic()
    node.step()
    node.add(y, prompt(80), None, max_tokens=4)
    node.run_until(lambda: all(node.finished(x) for x in xs.values()), 5)  # the clients' errors
    failed_at = {k: round(node.finish_at[x] - t0, 3) if x in node.finish_at else None for k, x in xs.items()}
    # watched HOLD_S past the deadline: nothing freed, Y never scheduled
    watch_end = t0 + HELD_DEADLINE_MS / 1000 + HOLD_S
    free_seen, y_statuses, in_sched = set(), set(), True
    while time.monotonic() < watch_end and not node.error:
        node.step()
        free_seen.add(node.free_blocks())
        y_statuses.add(node.status(y))
        in_sched = in_sched and all(x in node.sched.requests for x in xs.values())
        time.sleep(0.005)
    held = {"watched_past_deadline_s": round(time.monotonic() - t0 - HELD_DEADLINE_MS / 1000, 3),
            "free_blocks_seen": sorted(free_seen), "y_statuses": sorted(y_statuses),
            "x_in_scheduler": in_sched, "releases": {k: len(node.released_at[x]) for k, x in xs.items()},
            "y_scheduled": y in node.first_sched_at}
    cancels_while_held = {k: p.cancels[0] for k, p in ps.items()}
    x_blocks = {k: sorted(node.blocks.get(x, ())) for k, x in xs.items()}
    t_gate, released_after, y_blocks = {}, {}, []
    for k in ("error", "mute"):  # P's prefill ends: its pull's late answer settles it
        t_gate[k] = time.monotonic()
        gates[k].set()
        node.run_until(lambda: xs[k] not in node.sched.requests, 3)
        freed = node.freed_at.get(xs[k])
        released_after[k] = None if freed is None else round(freed - t_gate[k], 3)
        if k == "error":  # Y gets the first freed blocks
            node.run_until(lambda: node.status(y) == "RUNNING" and node.reqs[y].num_output_tokens >= 1, 3)
            if y in node.sched.requests:
                y_blocks = sorted(b for g in node.sched.kv_cache_manager.get_block_ids(y) for b in g)
    y_first = node.first_sched_at.get(y)
    node.run_until(lambda: node.finished(y), 10)
    node.settle(0.3)
    answered = {k: p.reply_at[0] is not None and p.reply_at[0] >= t_gate[k] for k, p in ps.items()}
    out = {"node": node.facts(), "deadline_s": HELD_DEADLINE_MS / 1000, "hold_s": HOLD_S, "failed_at_s": failed_at,
           "held": held, "cancels_while_held": cancels_while_held,
           "x": {k: node.req_facts(x) for k, x in xs.items()}, "y": node.req_facts(y),
           "late_answer_sent": answered, "freed_after_answer_s": released_after,
           "y_scheduled_after_release": (y_first is not None and xs["error"] in node.freed_at
                                         and y_first >= node.freed_at[xs["error"]]),
           "y_reuses_x_blocks": {k: len(set(b) & set(y_blocks)) for k, b in x_blocks.items()},
           "y_blocks": len(y_blocks), "p": {k: p.facts() for k, p in ps.items()}}
    for p in ps.values():
        p.close()
    return out


def case_recompute_settles() -> dict:
    """(beyond the list) policy recompute (the failed blocks are refilled in place): a load failed at
    its deadline (300 ms) is reported only once P cannot write any more. P takes the pull, never
    answers it, ignores D's first cancel and acknowledges the second (2 s later): the request stays
    in WAITING_FOR_REMOTE_KVS, unreported, until then, then recomputes its whole prompt."""
    node = DNode("HardenedMooncakeConnector", "recompute", timeout_ms=DEADLINE_MS)
    node.kv_marker = 1.0
    p = FakePrefill([SILENT], on_cancel="ack", ignore_cancels=1)
    r = rid("recompute-settles")
    node.add(r, prompt(80), p.params("x-" + r))
    t0 = time.monotonic()
    node.step()
    seen = {"in_report": None}

    def on_report(kind, rq):  # what P had done when the failure reached the scheduler
        if kind == "recv" and rq == r and seen["in_report"] is None:
            seen["in_report"] = {"cancels": p.cancels[0], "cancel_answered": p.cancel_answered_at[0] is not None}

    node.on_report = on_report
    node.run_until(lambda: bool(node.reports[r]), 15)
    n_before = len(node.trace[r])
    node.step()  # the next schedule(): the request leaves WAITING_FOR_REMOTE_KVS
    nxt = node.trace[r][n_before] if len(node.trace[r]) > n_before else None
    blocks = sorted(b for g in node.sched.kv_cache_manager.get_block_ids(r) for b in g)
    refilled = _intact(node, blocks, 1.0)
    node.run_until(lambda: node.finished(r), 10)
    node.settle(0.3)

    def rel(t):
        return None if t is None else round(t - t0, 3)

    out = {"node": node.facts(), "deadline_s": DEADLINE_MS / 1000, "req": node.req_facts(r), "p": p.facts(),
           "reported_after_s": rel(node.report_at[r][0] if node.report_at[r] else None),
           "cancel_at_s": [rel(t) for t in p.cancel_at[0]], "cancel_answered_after_s": rel(p.cancel_answered_at[0]),
           "at_report": seen["in_report"], "next": {"status": nxt[0], "scheduled": nxt[1]} if nxt else None,
           "blocks": len(blocks), "blocks_refilled": refilled}
    p.close()
    return out


class RealPrefill:
    """A REAL hardened P worker (kv_producer: its own side channel, TransferEngine, sender loop)
    registered with vLLM's MooncakeBootstrapServer; only P's scheduler is replaced by the metadata
    it would hand its worker (reqs_to_send: first without blocks, as update_state_after_alloc gives
    it; then with blocks, as request_finished gives it), bound and started as P's model runner does."""

    def __init__(self, extra: dict | None = None):
        self.bootstrap = MooncakeBootstrapServer("127.0.0.1", 0)
        self.bootstrap.start()
        self.vc = make_config("HardenedMooncakeConnector", "fail", LONG_MS, role="kv_producer", num_blocks=8,
                              extra={"bootstrap_server_address": f"127.0.0.1:{self.bootstrap.port}", **(extra or {})})
        kcc = make_kv_cache_config(8)
        with set_current_vllm_config(self.vc):
            self.conn = KVConnectorFactory.create_connector(config=self.vc, role=KVConnectorRole.WORKER,
                                                            kv_cache_config=kcc)
            self.kv = {name: torch.full((8, 2, BLOCK, HEADS, HEAD_SIZE), 3.0, dtype=torch.float16)
                       for name in LAYERS}
            self.conn.register_kv_caches(self.kv)  # starts P's side channel, registers it
        self.worker = self.conn.connector_worker
        KEEP.append(self)

    def params(self, transfer_id: str) -> dict:
        return {"do_remote_prefill": True, "do_remote_decode": False,
                "remote_engine_id": self.vc.kv_transfer_config.engine_id,
                "remote_bootstrap_addr": f"http://127.0.0.1:{self.bootstrap.port}", "transfer_id": transfer_id}

    def metadata(self, p_req_id: str, tid: str, blocks: list) -> None:
        meta = mc.MooncakeConnectorMetadata()
        meta.reqs_to_send[p_req_id] = (tid, blocks)
        self.conn.bind_connector_metadata(meta)
        self.conn.start_load_kv(None)

    def cancelled(self, tid: str) -> bool:
        return self.worker.terminal.lookup(tid, time.monotonic()) == "cancelled"

    def may_write(self, tid: str) -> bool:
        """P still has the transfer and has not recorded it as never to be sent."""
        return tid in self.worker.reqs_need_send and self.worker.terminal.lookup(tid, time.monotonic()) is None

    def after_prefill(self, p_req_id: str, tid: str, wait_s: float = 5.0) -> dict:
        """P's prefill ends (request_finished hands the worker the blocks): step P's worker as its
        model runner does until it frees the request's blocks, a transfer is counted, or wait_s;
        then 0.3 s more. Counts only."""
        self.metadata(p_req_id, tid, [[1, 2, 3]])
        sent = {"bytes": 0, "transfers": 0, "failed": 0, "p_freed": False}

        def poll() -> None:
            st = self.conn.get_kv_connector_stats()
            if st is not None:
                sent["bytes"] += int(sum(st.data.get("bytes_transferred", [])))
                sent["transfers"] += len(st.data.get("transfer_duration", []))
                sent["failed"] += len(st.data.get("num_failed_transfers", []))
            res = self.conn.get_transfer_results(set())
            sent["p_freed"] = sent["p_freed"] or p_req_id in (res.finished_sending or ())

        end = time.monotonic() + wait_s
        while time.monotonic() < end and not (sent["p_freed"] or sent["transfers"] or sent["failed"]):
            poll()
            time.sleep(0.05)
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            poll()
            time.sleep(0.05)
        return sent


def _cut_then_reuse(node: "DNode", link, x: str, y: str) -> tuple:
    """Cut P's side channel while D's pull of ``x`` is out, wait until D settled ``x``, then start
    ``y`` (on ``x``'s blocks, the only ones): (seconds from the cut to x's end, x's blocks, whether
    every block was free again, y's blocks)."""
    t_cut = time.monotonic()
    link.enabled(False)
    node.run_until(lambda: node.finished(x) and x not in node.sched.requests, 10)
    x_done_after_s = round(time.monotonic() - t_cut, 2)
    x_blocks = sorted(node.blocks.get(x, ()))
    x_freed = x not in node.sched.requests and node.free_blocks() == node.free0
    node.add(y, prompt(80), None, max_tokens=8)  # Y runs on X's blocks (the only ones)
    node.run_until(lambda: node.status(y) == "RUNNING" and node.reqs[y].num_output_tokens >= 1, 5)
    y_blocks = sorted(b for g in node.sched.kv_cache_manager.get_block_ids(y) for b in g)
    return x_done_after_s, x_blocks, x_freed, y_blocks


def _intact(node: "DNode", blocks, value: float) -> int:
    return sum(all(bool(torch.all(t[b] == value)) for t in node.kv_caches.values()) for b in blocks)


def case_late_write_after_deadline() -> dict:
    """(beyond the list) P is slow, not dead: D's load deadline (300 ms) fails the load while P
    still waits for its own prefill, after which it would write the prompt's KV into D's blocks.
    Both sides are the REAL hardened connector (RealPrefill). Policy fail: the client's error comes
    at the deadline, X's blocks stay held (Y, needing them, waits) until P acknowledged D's cancel,
    then Y gets them; P's prefill then ends and P writes nothing. Policy recompute (a second D, the
    same P): the failure is reported once P acknowledged, the prompt is recomputed in place, and
    P's prefill ending writes nothing over it."""
    p = RealPrefill()
    # ---- policy fail. D: 3 usable blocks (+ vLLM's null block): Y needs exactly X's blocks
    node = DNode("HardenedMooncakeConnector", "fail", timeout_ms=DEADLINE_MS, num_blocks=4)
    node.kv_marker = 1.0
    x, y = rid("late-x"), rid("late-y")
    tid = "x-" + x
    node.add(x, prompt(80), p.params(tid))
    p.metadata("p-" + x, tid, [])  # P scheduled the prefill (update_state_after_alloc)
    seen: dict = {}

    def on_report(kind, rq):  # P's state when X's report reaches D's scheduler / X's blocks are freed
        if rq == x:
            seen.setdefault(kind, {"p_may_write": p.may_write(tid), "p_cancelled": p.cancelled(tid),
                                   "free_blocks": node.free_blocks()})

    def on_sched(rq):  # P's state when Y is first given tokens (it runs on X's blocks)
        if rq == y:
            seen.setdefault("y_scheduled", {"p_may_write": p.may_write(tid), "p_cancelled": p.cancelled(tid)})

    node.on_report, node.on_sched = on_report, on_sched
    t0 = time.monotonic()
    node.step()
    node.add(y, prompt(80), None, max_tokens=8)
    node.run_until(lambda: node.finished(x), 5)  # D's deadline fails the load: the client's error
    x_blocks = sorted(node.blocks.get(x, ()))
    at_failure = {"free_blocks": node.free_blocks(), "x_in_scheduler": x in node.sched.requests,
                  "y_status": node.status(y)}
    # Y runs once it has blocks: X's, the only ones (after X's release, if they are held)
    node.run_until(lambda: node.status(y) == "RUNNING" and node.reqs[y].num_output_tokens >= 1, 5)
    y_blocks = sorted(b for g in node.sched.kv_cache_manager.get_block_ids(y) for b in g)
    intact_before = _intact(node, y_blocks, 1.0)
    sent = p.after_prefill("p-" + x, tid)  # P's prefill ends now: a P not cancelled writes X's KV
    intact_after, overwritten = _intact(node, y_blocks, 1.0), _intact(node, y_blocks, 3.0)
    node.run_until(lambda: node.finished(y), 10)
    node.settle(0.3)

    def rel(t):
        return None if t is None else round(t - t0, 3)

    fail = {"node": node.facts(), "deadline_s": DEADLINE_MS / 1000, "x": node.req_facts(x), "y": node.req_facts(y),
            "x_error_after_s": rel(node.finish_at.get(x)),
            "x_freed_after_s": rel(node.freed_at.get(x)),
            "x_released_after_s": rel(node.released_at[x][0] if node.released_at[x] else None),
            "y_first_scheduled_after_s": rel(node.first_sched_at.get(y)), "at_failure": at_failure,
            "at_report": seen.get("recv"), "at_release": seen.get("release"), "at_freed": seen.get("freed"),
            "at_y_scheduled": seen.get("y_scheduled"),
            "x_blocks": len(x_blocks), "y_blocks": len(y_blocks),
            "y_reuses_x_blocks": len(set(x_blocks) & set(y_blocks)),
            "y_blocks_intact_before_p_prefill_end": intact_before, "y_blocks_intact_after": intact_after,
            "y_blocks_overwritten_by_p": overwritten, "p_sent": sent,
            "p_failures": dict(p.worker.failures.totals)}

    # ---- policy recompute, the same P
    p_failures_before = dict(p.worker.failures.totals)
    node2 = DNode("HardenedMooncakeConnector", "recompute", timeout_ms=DEADLINE_MS, num_blocks=4)
    node2.kv_marker = 1.0
    z = rid("late-z")
    tid2 = "x-" + z
    node2.add(z, prompt(80), p.params(tid2), max_tokens=8)
    p.metadata("p-" + z, tid2, [])
    seen2: dict = {}
    node2.on_report = lambda kind, rq: seen2.setdefault(kind, {"p_may_write": p.may_write(tid2),
                                                                "p_cancelled": p.cancelled(tid2)})
    t0 = time.monotonic()
    node2.step()
    node2.run_until(lambda: bool(node2.reports[z]), 10)
    node2.run_until(lambda: node2.status(z) == "RUNNING" and node2.reqs[z].num_output_tokens >= 1, 10)
    z_blocks = sorted(b for g in node2.sched.kv_cache_manager.get_block_ids(z) for b in g)
    refilled = _intact(node2, z_blocks, 1.0)
    sent2 = p.after_prefill("p-" + z, tid2)
    z_intact, z_overwritten = _intact(node2, z_blocks, 1.0), _intact(node2, z_blocks, 3.0)
    node2.run_until(lambda: node2.finished(z), 10)
    node2.settle(0.3)
    recompute = {"node": node2.facts(), "z": node2.req_facts(z),
                 "z_reported_after_s": rel(node2.report_at[z][0] if node2.report_at[z] else None),
                 "at_report": seen2.get("recv"), "z_blocks": len(z_blocks), "z_blocks_refilled": refilled,
                 "z_blocks_intact_after": z_intact, "z_blocks_overwritten_by_p": z_overwritten, "p_sent": sent2,
                 "p_failures": {k: v - p_failures_before.get(k, 0) for k, v in p.worker.failures.totals.items()
                                if v - p_failures_before.get(k, 0)}}
    return {"fail": fail, "recompute": recompute}


def case_cancel_as_prefill_ends() -> dict:
    """(found by pd-abort-all-under-load on CI: P kept one block after the run) D's pull waits at
    the REAL hardened P for a request P is still computing; P's prefill ends (its worker records
    the blocks and wakes the pull) and, in the same turn of P's sender loop, before the woken pull
    runs, D's cancel for that transfer arrives. The pull answers the request aborted and sends
    nothing; P must then free the request's blocks (finished_sending), as for any cancel: nobody
    will pull them, and with the transfer forgotten P's abort timeout would never free them."""
    p = RealPrefill()
    node = DNode("HardenedMooncakeConnector", "fail", timeout_ms=LONG_MS, num_blocks=8)
    x = rid("cancel-end")
    tid, p_req = "x-" + x, "p-" + x
    node.add(x, prompt(80), p.params(tid))
    p.metadata(p_req, tid, [])  # P scheduled the prefill (update_state_after_alloc)
    t0 = time.monotonic()
    node.step()  # D's pull goes to P and waits there: P is not ready
    waiting = False
    while time.monotonic() - t0 < 10 and not waiting:
        node.step()
        waiting = bool(p.worker._waiters.get(tid))
        time.sleep(0.01)
    payload = msgspec.msgpack.encode({CANCEL_KEY: [tid]})

    async def prefill_ends_then_cancel():
        meta = mc.MooncakeConnectorMetadata()
        meta.reqs_to_send[p_req] = (tid, [[1, 2, 3]])  # request_finished hands the worker its blocks
        await p.worker.record_send_reqs(meta)  # sets ready: the pull is woken, has not run yet
        return p.worker._on_cancel(payload)  # no await in between: the same loop turn

    acked = asyncio.run_coroutine_threadsafe(prefill_ends_then_cancel(), p.worker.sender_loop).result(5)
    freed, end = False, time.monotonic() + 5
    while time.monotonic() < end and not freed:
        node.step()
        res = p.conn.get_transfer_results(set())
        freed = p_req in (res.finished_sending or ())
        time.sleep(0.02)
    node.run_until(lambda: node.finished(x), 5)
    node.settle(0.3)
    st = p.conn.get_kv_connector_stats()
    return {"pull_was_waiting": waiting, "acked": acked == [tid], "p_freed": freed,
            "p_still_tracks": tid in p.worker.reqs_need_send, "x": node.req_facts(x), "node": node.facts(),
            "p_transfers": len(st.data.get("transfer_duration", [])) if st is not None else 0,
            "p_failures": dict(p.worker.failures.totals)}


def case_cancel_record_gone() -> dict:
    """(found by review) D cancels a transfer while the REAL hardened P still computes it (P drops
    its entry; nothing to free yet), then 4096 other transfers end as terminal (an abort storm)
    and push that cancel's record out, and only then does P's prefill end. P must free the
    request's blocks at once and answer a late pull aborted; and the rest of that batch (another
    request's blocks, pulled normally) must go on. Upstream's record_send_reqs would raise
    KeyError on the forgotten entry: its blocks, and the rest of the batch, held for good."""
    p = RealPrefill()
    x, y = rid("gone-x"), rid("gone-y")
    tid_x, tid_y = "x-" + x, "x-" + y
    p.metadata("p-" + x, tid_x, [])  # P scheduled both prefills
    p.metadata("p-" + y, tid_y, [])
    loop = p.worker.sender_loop

    def on_loop(fn):
        async def run():
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), loop).result(5)

    acked = on_loop(lambda: p.worker._on_cancel(msgspec.msgpack.encode({CANCEL_KEY: [tid_x]})))
    tracked_after_cancel = on_loop(lambda: tid_x in p.worker.reqs_need_send)
    now = time.monotonic()
    for i in range(4096):
        p.worker.terminal.record(f"storm-{i}", "aborted", now)
    record_gone = p.worker.terminal.lookup(tid_x, time.monotonic()) is None
    meta = mc.MooncakeConnectorMetadata()  # both prefills end in one step
    meta.reqs_to_send["p-" + x] = (tid_x, [[1, 2, 3]])
    meta.reqs_to_send["p-" + y] = (tid_y, [[4, 5]])
    p.conn.bind_connector_metadata(meta)
    p.conn.start_load_kv(None)
    freed, end = set(), time.monotonic() + 5
    while time.monotonic() < end and "p-" + x not in freed:
        freed |= set(p.conn.get_transfer_results(set()).finished_sending or ())
        time.sleep(0.02)
    y_ready = on_loop(lambda: tid_y in p.worker.reqs_need_send and p.worker.reqs_need_send[tid_y].ready.is_set())
    x_answer = p.worker.terminal.lookup(tid_x, time.monotonic())
    time.sleep(0.3)
    freed |= set(p.conn.get_transfer_results(set()).finished_sending or ())

    # a transfer one pull sent (and P forgot) while another pull for it is still counted (a
    # reused transfer id: more pulls than P expects): a cancel is not acknowledged until it ends
    def busy_cancel():
        p.worker._waiters["z-busy"] += 1
        try:
            return p.worker._on_cancel(msgspec.msgpack.encode({CANCEL_KEY: ["z-busy"]}))
        finally:
            p.worker._waiters["z-busy"] -= 1
            del p.worker._waiters["z-busy"]

    busy_acked = on_loop(busy_cancel)
    idle_acked = on_loop(lambda: p.worker._on_cancel(msgspec.msgpack.encode({CANCEL_KEY: ["z-busy"]})))
    return {"busy_acked": busy_acked, "idle_acked": idle_acked, "acked": acked == [tid_x], "tracked_after_cancel": tracked_after_cancel, "record_gone": record_gone,
            "x_freed": "p-" + x in freed, "y_freed": "p-" + y in freed, "y_ready": y_ready,
            "x_late_pull_answer": x_answer, "p_failures": dict(p.worker.failures.totals)}


class SlowBootstrap:
    """A stand-in for P's bootstrap server that answers ``/query`` only once ``gate`` opens (then
    with the real bootstrap server's answer): D's bootstrap query is out as long as the case wants
    (upstream waits up to VLLM_MOONCAKE_CONNECTOR_TIMEOUT, 3 tries, for a slow one). ``rewrite``
    replaces text of the answer (a side-channel port by a proxy's, to put a link between D and P)."""

    def __init__(self, real: str, gate: threading.Event, rewrite: dict | None = None):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        outer = self
        self.queries = 0
        self.answered = 0

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                outer.queries += 1
                gate.wait(30)
                body = httpx.get(real + self.path, timeout=10).content
                for a, b in (rewrite or {}).items():
                    body = body.replace(a.encode(), b.encode())
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                outer.answered += 1

            def log_message(self, *args):  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.addr = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        KEEP.append(self)


def _bootstrap_gap(timeout_ms: int, abort: bool) -> dict:
    """A load whose P engine D does not know yet: its pull waits for the bootstrap query, which
    answers only once the load was given up (aborted, or failed at its deadline) and its blocks
    freed. P (a stand-in answering OK) must then get no pull naming those blocks."""
    node = DNode("HardenedMooncakeConnector", "fail", timeout_ms=timeout_ms)
    p = FakePrefill([OK], on_cancel="ack")
    gate = threading.Event()
    slow = SlowBootstrap(p.bootstrap_addr, gate)
    r = rid("bootstrap-gap")
    node.add(r, prompt(80), {**p.params("x-" + r), "remote_bootstrap_addr": slow.addr})
    node.step()
    node.run_until(lambda: slow.queries > 0, 5)
    if abort:
        node.sched.finish_requests([r], RequestStatus.FINISHED_ABORTED)
    node.run_until(lambda: r not in node.sched.requests, 5)
    freed_while_query_out = r not in node.sched.requests and node.free_blocks() == node.free0
    gate.set()
    node.run_until(lambda: slow.answered > 0, 5)
    node.settle(1.0)  # a pull, if any, reaches P in milliseconds
    out = {"node": node.facts(), "req": node.req_facts(r), "freed_while_query_out": freed_while_query_out,
           "queries": slow.queries, "p": p.facts()}
    p.close()
    return out


def case_bootstrap_gap() -> dict:
    """(issue 30, item 1) aborted, and failed at its 300 ms deadline, while the bootstrap query is out."""
    return {"abort": _bootstrap_gap(LONG_MS, abort=True), "deadline": _bootstrap_gap(DEADLINE_MS, abort=False)}


def case_abort_one_of_a_pull() -> dict:
    """(issue 30, item 2) two requests of one step for the same P travel in one pull; the client
    aborts one while P has not answered. D cancels that one at P; P (acknowledging as a hardened P
    does) then answers the other OK: it must complete, not fail or wait for its deadline."""
    node = DNode("HardenedMooncakeConnector", "fail", timeout_ms=LONG_MS)
    gate = threading.Event()
    p = FakePrefill([gated(gate, OK)], on_cancel="ack")
    a, b = rid("pull-aborted"), rid("pull-sibling")
    node.add(a, prompt(80), p.params("x-" + a))
    node.add(b, prompt(80), p.params("x-" + b))
    node.step()
    node.run_until(lambda: p.pulls[0] > 0, 5)
    node.sched.finish_requests([a], RequestStatus.FINISHED_ABORTED)
    node.run_until(lambda: a not in node.sched.requests, 5)
    a_freed = a not in node.sched.requests
    gate.set()  # P's prefill of the other ends: it answers the pull
    node.run_until(lambda: node.finished(b) and b not in node.sched.requests, 10)
    node.settle(0.5)
    out = {"node": node.facts(), "aborted": node.req_facts(a), "sibling": node.req_facts(b), "a_freed": a_freed,
           "p": p.facts()}
    p.close()
    return out


def case_queued_pull_after_record_gone() -> dict:
    """(issue 30, item 10) D's pull reaches the REAL hardened P while every sender task is busy (the
    pull waits in P's queue: here P's tasks wait on a queue the listener no longer feeds), the
    client aborts, D cancels, P acknowledges (P still computes the request: nothing of it held)
    and D frees the blocks; 4096 later terminal transfers push that record out; then a sender task
    serves the queued pull, and P's prefill ends. P must not write into the blocks D freed."""
    p = RealPrefill()
    node = DNode("HardenedMooncakeConnector", "fail", timeout_ms=LONG_MS)
    x = rid("queued-x")
    tid = "x-" + x
    p.metadata("p-" + x, tid, [])  # P schedules X's prefill
    loop = p.worker.sender_loop

    def on_loop(fn):
        async def run():
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), loop).result(5)

    busy_q = p.worker.sender_worker_queue  # the sender tasks wait on it
    parked = on_loop(asyncio.Queue)
    on_loop(lambda: setattr(p.worker, "sender_worker_queue", parked))  # every task busy: pulls queue up
    node.add(x, prompt(80), p.params(tid))
    node.step()
    queued = node.run_until(lambda: on_loop(parked.qsize) == 1, 5)
    node.sched.finish_requests([x], RequestStatus.FINISHED_ABORTED)
    freed = node.run_until(lambda: x not in node.sched.requests, 10)  # D's cancel acknowledged: freed
    acked = p.cancelled(tid)
    now = time.monotonic()
    for i in range(4096):
        p.worker.terminal.record(f"storm-{i}", "aborted", now)
    record_gone = p.worker.terminal.lookup(tid, time.monotonic()) is None

    def release():  # a sender task frees up and takes the queued pull
        item = parked.get_nowait()
        p.worker.sender_worker_queue = busy_q
        busy_q.put_nowait(item)
    on_loop(release)
    time.sleep(0.3)
    sent = p.after_prefill("p-" + x, tid, wait_s=3.0)  # then P's prefill of X ends
    return {"queued": queued, "freed_on_ack": freed, "acked": acked, "record_gone": record_gone, "sent": sent,
            "p_failures": dict(p.worker.failures.totals), "node": node.facts()}


class Toxiproxy:
    """The real toxiproxy-server (``PD_INPROC_TOXIPROXY``, found by the test as the harness finds
    it) on loopback: one proxy, the link between D and P's side channel. Disabling a proxy closes
    its connections and its listener: D's connection is lost and every reconnect is refused, as
    under a REJECT rule; enabling it again heals the link."""

    def __init__(self, upstream_port: int):
        import subprocess

        binary = os.environ.get("PD_INPROC_TOXIPROXY", "")
        if not binary:
            raise RuntimeError("toxiproxy-server not found (PD_INPROC_TOXIPROXY unset)")
        api_port = free_port()
        self.api = f"http://127.0.0.1:{api_port}"
        self.proc = subprocess.Popen([binary, "-host", "127.0.0.1", "-port", str(api_port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        KEEP.append(self)
        end = time.monotonic() + 10
        while True:
            try:
                httpx.get(self.api + "/version", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > end or self.proc.poll() is not None:
                    self.close()
                    raise RuntimeError("toxiproxy-server did not start within 10 s") from None
                time.sleep(0.05)
        self.port = free_port()
        httpx.post(self.api + "/proxies", timeout=5, json={
            "name": "side", "listen": f"127.0.0.1:{self.port}", "upstream": f"127.0.0.1:{upstream_port}",
            "enabled": True}).raise_for_status()

    def enabled(self, on: bool) -> None:
        httpx.post(self.api + "/proxies/side", timeout=5, json={"enabled": on}).raise_for_status()

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(5)


def _hma_tp2(early: bool, ack: bool = False) -> dict:
    """A TP 2 engine (its two workers' outputs aggregated by vLLM's KVOutputAggregator) of a model
    whose failed loads are reported by request (HMA: several KV cache groups; here the worker is
    told so, the scheduler keeps one group), pulling from a frozen P (takes the pull, never answers,
    never acknowledges a cancel: D's pull settles only at upstream's bound, 540 s). The load's
    deadline is 1 s: when does the client get its error, and are the blocks still held then?"""
    original = KVOutputAggregator.aggregate
    original = getattr(original, "__pdchaos_original__", original)
    node = DNode("HardenedMooncakeConnector", "fail", timeout_ms=HELD_DEADLINE_MS, workers=2,
                 aggregate=None if early else original, extra={"aggregate_failed_early": early})
    node.worker.connector_worker._is_hma_required = True  # stand-in: report failed loads by request
    p = FakePrefill([SILENT], on_cancel="ack" if ack else None)
    r = rid("hma-tp2")
    node.add(r, prompt(80), p.params("x-" + r))
    t0 = time.monotonic()
    node.step()
    node.run_until(lambda: node.finished(r), 5)
    error_after = None if r not in node.finish_at else round(node.finish_at[r] - t0, 2)
    held = r in node.sched.requests and node.free_blocks() < node.free0
    if ack:  # P acknowledges D's cancel (its first comes 2 s after the failure): the blocks go back
        node.run_until(lambda: r not in node.sched.requests, 10)
        node.settle(0.3)
    out = {"error_after_s": error_after, "deadline_s": HELD_DEADLINE_MS / 1000, "blocks_held_at_error": held,
           "req": node.req_facts(r),
           "freed_at_end": r not in node.sched.requests and node.free_blocks() == node.free0,
           "patched": getattr(KVOutputAggregator.aggregate, "__pdchaos_patch__", None) is not None}
    p.close()
    return out


def case_hma_tp2() -> dict:
    """(issue 30, item 6) upstream's aggregator (the patch off) and the patched one, side by side."""
    return {"upstream_aggregator": _hma_tp2(False), "patched_aggregator": _hma_tp2(True),
            "patched_then_acknowledged": _hma_tp2(True, ack=True)}


def case_requester_lost() -> dict:
    """(issue 30, item 4) D's pull reaches the REAL hardened P through a link (toxiproxy) while P
    still computes the prompt; the link goes down as under a REJECT rule (the connection lost, every
    reconnect refused) for longer than D's heartbeat timeout, so D reads P as gone: the client gets
    its error and D frees the blocks (Y, needing them, runs on them). The link heals, then P's
    prefill ends. P must not write for the pull whose connection it lost: D's blocks are Y's now."""
    p = RealPrefill()
    link = Toxiproxy(p.worker.side_channel_port)
    try:
        gate = threading.Event()
        gate.set()
        boot = SlowBootstrap(f"http://127.0.0.1:{p.bootstrap.port}", gate, rewrite={f":{p.worker.side_channel_port}": f":{link.port}"})
        node = DNode("HardenedMooncakeConnector", "fail", timeout_ms=LONG_MS, num_blocks=4)
        node.kv_marker = 1.0
        x, y = rid("lost-x"), rid("lost-y")
        tid = "x-" + x
        p.metadata("p-" + x, tid, [])  # P is computing X's prompt
        loop = p.worker.sender_loop

        def on_loop(fn):
            async def run():
                return fn()
            return asyncio.run_coroutine_threadsafe(run(), loop).result(5)

        node.add(x, prompt(80), {**p.params(tid), "remote_bootstrap_addr": boot.addr})
        node.step()
        waiting = node.run_until(lambda: on_loop(lambda: p.worker._waiters.get(tid, 0)) > 0, 10)  # P holds the pull
        x_done_after_s, x_blocks, x_freed, y_blocks = _cut_then_reuse(node, link, x, y)
        link.enabled(True)  # the blip heals
        time.sleep(0.5)
        sent = p.after_prefill("p-" + x, tid, wait_s=3.0)  # then P's prefill of X ends
        intact, overwritten = _intact(node, y_blocks, 1.0), _intact(node, y_blocks, 3.0)
        node.run_until(lambda: node.finished(y), 10)
        node.settle(0.3)
        return {"waiting": waiting, "x_done_after_s": x_done_after_s, "x_freed": x_freed, "x": node.req_facts(x),
                "y_reuses_x_blocks": len(set(x_blocks) & set(y_blocks)), "y_blocks": len(y_blocks),
                "y_blocks_intact": intact, "y_blocks_overwritten_by_p": overwritten, "sent": sent,
                "p_may_write": p.may_write(tid), "p_failures": dict(p.worker.failures.totals), "node": node.facts()}
    finally:
        link.close()  # also when the case fails: no toxiproxy-server outlives it


def case_eos_hold() -> dict:
    """(issue 30, item 9) P's one token is EOS (FINISHED_STOPPED) and no D pulls the prompt (a
    proxy that answers from P, a client that left). The REAL hardened P, both sides: its scheduler
    connector's request_finished and build_connector_meta, then its worker, stepped as P's model
    runner does. P keeps the blocks for eos_hold_ms (1 s here), not the abort timeout, then frees
    them; a D pulling after that gets its answer at once. A LENGTH_CAPPED prompt of the same step
    keeps upstream's hold (the abort timeout)."""
    hold_ms = 1000
    p = RealPrefill(extra={"eos_hold_ms": hold_ms})
    with set_current_vllm_config(p.vc):
        sched = KVConnectorFactory.create_connector(config=p.vc, role=KVConnectorRole.SCHEDULER,
                                                    kv_cache_config=make_kv_cache_config(8))
    out = {}
    reqs = {}
    for name, status, blocks in (("eos", RequestStatus.FINISHED_STOPPED, [1, 2, 3]),
                                 ("capped", RequestStatus.FINISHED_LENGTH_CAPPED, [4, 5])):
        r = rid("hold-" + name)
        tid = "x-" + r
        params = {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": tid}
        req = Request(r, prompt(48), SamplingParams(max_tokens=1, extra_args={"kv_transfer_params": params}),
                      None, block_hasher=HASHER)
        p.metadata(r, tid, [])  # P scheduled the prefill (update_state_after_alloc's entry)
        req.status = status
        delay, _ = sched.request_finished(req, (blocks,))
        out[name + "_delayed"] = delay
        reqs[name] = (r, tid)
    meta = sched.build_connector_meta(None)  # one step: both prefills end
    t0 = time.monotonic()
    p.conn.bind_connector_metadata(meta)
    p.conn.start_load_kv(None)
    freed: dict[str, float] = {}
    end = t0 + 10 * hold_ms / 1000
    while time.monotonic() < end and reqs["eos"][0] not in freed:
        for r in p.conn.get_transfer_results(set()).finished_sending or ():
            freed.setdefault(r, round(time.monotonic() - t0, 2))
        time.sleep(0.05)
    out["eos_freed_after_s"] = freed.get(reqs["eos"][0])
    out["capped_freed"] = reqs["capped"][0] in freed
    out["capped_may_write"] = p.may_write(reqs["capped"][1])
    out["eos_record"] = p.worker.terminal.lookup(reqs["eos"][1], time.monotonic())
    node = DNode("HardenedMooncakeConnector", "fail", timeout_ms=LONG_MS)  # a D that pulls too late
    x = rid("hold-late-d")
    node.add(x, prompt(48), p.params(reqs["eos"][1]))
    t1 = time.monotonic()
    node.run_until(lambda: node.finished(x), 10)
    out["late_pull_s"] = round(time.monotonic() - t1, 2)
    out["late_req"] = node.req_facts(x)
    out["node"] = node.facts()
    out["hold_ms"] = hold_ms
    return out


# --------------------------------------------------------------------------- issue 43, item 7

def REPEATED_OK(asked):
    """One P rank says OK twice for the same requests (a CONTINUE, then the FINISH)."""
    return [Response(status=Status.CONTINUE, ok_reqs=list(asked)), Response(status=Status.FINISH, ok_reqs=list(asked))]


def case_repeated_ok() -> dict:
    """(issue 43, 7e) a load pulled from 2 P ranks (pull_tasks_count 2): rank 0 says OK twice, rank 1
    has not written yet (its prefill ends when the case opens the gate). The load must not complete
    (reported OK: the request scheduled on blocks rank 1 has not written) before rank 1's OK."""
    node = DNode("HardenedMooncakeConnector", "fail")
    gate = threading.Event()
    p = FakePrefill([REPEATED_OK, gated(gate, OK)])
    r = rid("repeat-ok")
    node.add(r, prompt(80), p.params("x-" + r))
    node.step()
    node.run_until(lambda: p.replied[0].is_set(), 5)
    node.settle(0.5)
    before = {"reports": list(node.reports.get(r, [])), "status": node.status(r),
              "scheduled": r in node.first_sched_at}
    gate.set()
    node.run_until(lambda: node.finished(r) and r not in node.sched.requests, 10)
    node.settle(0.3)
    out = {"before_rank1": before, "req": node.req_facts(r), "p": p.facts(), "node": node.facts()}
    p.close()
    return out


def case_ok_sibling_cancels() -> dict:
    """(issue 43, 7d) two requests in one pull; P answers the first OK (a CONTINUE) and the second
    only when the case opens the gate. The first runs and finishes meanwhile: D must not ask P to
    cancel a load that succeeded (before: cancel rounds at 0, 2, 6 s ... for it, each on a new
    connection, while the sibling waits). P here leaves a cancel unanswered, as a hardened P does
    for a transfer it already sent while the pull that sent it goes on."""
    node = DNode("HardenedMooncakeConnector", "fail")
    gate = threading.Event()

    def first_then_rest(asked):
        first = [x for x in asked if x.startswith("sib-first")]
        rest = [x for x in asked if x not in first]
        return [Response(status=Status.CONTINUE, ok_reqs=first), gate, Response(status=Status.FINISH, ok_reqs=rest)]

    p = FakePrefill([first_then_rest])
    a, b = rid("sib-first"), rid("sib-later")
    node.add(a, prompt(80), p.params("x-" + a))
    node.add(b, prompt(80), p.params("x-" + b))
    node.step()
    a_done = node.run_until(lambda: node.finished(a) and a not in node.sched.requests, 10)
    node.settle(2.5)  # cancel rounds at 0 and 2 s, before the fix
    cancels_while_sibling_waits = p.cancels[0]
    gate.set()
    node.run_until(lambda: node.finished(b) and b not in node.sched.requests, 10)
    node.settle(0.3)
    out = {"a_done": a_done, "cancels_while_sibling_waits": cancels_while_sibling_waits,
           "first": node.req_facts(a), "sibling": node.req_facts(b), "p": p.facts(), "node": node.facts()}
    p.close()
    return out


class Blackhole:
    """A TCP port that drops every new connection's SYN (a listener whose accept queue is full and
    never accepted): a connect neither completes nor is refused, as behind a DROP rule."""

    def __init__(self):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(0)
        self.port = self.listener.getsockname()[1]
        self.fill = []
        for _ in range(3):
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", self.port))
            except BlockingIOError:
                pass
            self.fill.append(s)
        time.sleep(0.2)
        KEEP.append(self)

    def close(self) -> None:
        for s in self.fill + [self.listener]:
            s.close()


def case_never_connected() -> dict:
    """(issue 43, 7f) P's registered side channel is blackholed: D's pull never connects (no
    refusal ever comes either). At the load's deadline (300 ms) P provably never got the pull: D
    must give the blocks back then, not hold them to the bound (abort timeout + 60 s)."""
    bh = Blackhole()
    server = MooncakeBootstrapServer("127.0.0.1", 0)
    server.start()
    engine = f"blackholed-p-{uuid.uuid4().hex[:8]}"
    payload = RegisterWorkerPayload(engine_id=engine, dp_rank=0, tp_rank=0, pp_rank=0, addr=f"tcp://127.0.0.1:{bh.port}")
    httpx.post(f"http://127.0.0.1:{server.port}/register", json=payload.model_dump(), timeout=10).raise_for_status()
    node = DNode("HardenedMooncakeConnector", "fail", timeout_ms=DEADLINE_MS)
    r = rid("blackholed")
    node.add(r, prompt(80), {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": engine,
                             "remote_bootstrap_addr": f"http://127.0.0.1:{server.port}", "transfer_id": "x-" + r})
    t0 = time.monotonic()
    node.step()
    node.run_until(lambda: r not in node.sched.requests, 4.0)
    out = {"deadline_s": DEADLINE_MS / 1000, "watched_s": 4.0,
           "error_after_s": None if r not in node.finish_at else round(node.finish_at[r] - t0, 2),
           "freed_after_s": None if r not in node.freed_at else round(node.freed_at[r] - t0, 2),
           "req": node.req_facts(r), "failures": node.worker_failures()}
    try:
        server.shutdown()
    except Exception:  # noqa: BLE001
        pass
    return out


def case_monitor_backlog() -> dict:
    """(issue 43, 7c) 1200 connections open and close on the REAL hardened P's side channel and
    send nothing (D's cancel rounds each use a new connection; a port scan; a load balancer's
    health check). Then D sends a cancel: P must still answer it. Its side-channel monitor (two
    events per connection) was read only when a pull arrived: ~1000 unread events block libzmq's
    I/O thread, P accepts and receives nothing more, and the pull that would drain them never comes."""
    p = RealPrefill()
    port = p.worker.side_channel_port
    made, timeouts, in_a_row, t0 = 0, 0, 0, time.monotonic()
    while made < 1200 and in_a_row < 5:  # a connect loop this tight sees a dropped SYN now and then
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=1.0)
            s.close()
            made, in_a_row = made + 1, 0
        except OSError:
            timeouts, in_a_row = timeouts + 1, in_a_row + 1
    ctx = zmq.Context.instance()
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(f"tcp://127.0.0.1:{port}")
    d.send(msgspec.msgpack.encode({CANCEL_KEY: ["x-nobody"]}))
    answered = bool(d.poll(3000))
    reply = msgspec.msgpack.decode(d.recv()) if answered else None
    d.close(linger=0)
    return {"connections": made, "connect_timeouts": timeouts, "connect_s": round(time.monotonic() - t0, 2),
            "answered": answered,
            "reply": reply}


WRITE_S = 3.0  # how long the real P's whole write of the write_in_flight case takes


class _SlowWrites:
    """The real P's transfer engine slowed as a slow link slows it: each batch write takes its share
    of WRITE_S (its bytes over the write's), then writes for real. Records each write P hands its
    executor (``_send_blocks``): when it started and ended, its bytes, the bytes written, its result.
    ``hold``: every batch write waits (at most HOLD_S) until ``release`` is set, so a case can place
    the bytes after a step of D however slowly a loaded machine reaches that step."""

    HOLD_S = 30.0

    def __init__(self, worker, hold: bool = False) -> None:
        self.real, self.worker = worker.engine, worker
        self.release = threading.Event()
        if not hold:
            self.release.set()
        self.started, self.ended = threading.Event(), threading.Event()
        self.total = 0
        self.written = 0
        self.calls = 0
        self._sizes: dict[int, int] = {}
        self.ret = None
        self.t_start = self.t_end = None
        send = worker._send_blocks

        def send_blocks(session, src, dst, lengths):
            self.total, self.t_start = sum(lengths), time.monotonic()
            self.started.set()
            try:
                self.ret = send(session, src, dst, lengths)
                return self.ret
            finally:
                self.t_end = time.monotonic()
                self.ended.set()

        worker._send_blocks = send_blocks  # upstream calls self._send_blocks: the instance's wins
        worker.engine = self

    def __getattr__(self, name):
        return getattr(self.real, name)

    def batch_transfer_sync_write(self, session, src, dst, lengths):
        n = sum(lengths)
        self.release.wait(self.HOLD_S)
        time.sleep(WRITE_S * n / max(1, self.total))
        self.calls += 1
        ret = self.real.batch_transfer_sync_write(session, src, dst, lengths)
        if ret == 0:
            self.written += n
        return ret

    # the hardened P submits each descriptor and polls it (write.submit_and_wait): the same
    # slowness, taken at the submit; the bytes count as written once the real engine says so
    def transfer_submit_write(self, session, src, dst, length):
        self.release.wait(self.HOLD_S)
        time.sleep(WRITE_S * length / max(1, self.total))
        self.calls += 1
        bid = self.real.transfer_submit_write(session, src, dst, length)
        self._sizes[bid] = length
        return bid

    def transfer_check_status(self, bid):
        st = self.real.transfer_check_status(bid)
        if st in (1, -1):  # the engine freed the batch: its id may be handed out again
            n = self._sizes.pop(bid, 0)
            self.written += n if st == 1 else 0
        return st


def case_write_in_flight(unfixed: bool = False) -> dict:
    """(issue 43, 7a) The REAL hardened P has X's KV ready; D's pull reaches it through a link on the
    side channel only (toxiproxy; the transfer engine's own connection is direct), P checks the
    link and starts its write, which takes WRITE_S (a slow link: the bytes land as they go). Right
    after the write started the side-channel link goes down as under a REJECT rule on that port
    only: D reads the connection as lost (X's error to the client), and later P as gone; P's
    keepalive sees the reset. Measured: when X got its error, when D freed its blocks (Y then runs
    on them), when P's write ended and how much of it was written. Y's blocks must not be
    overwritten, nor X's blocks freed before the write ended. ``unfixed``: both halves of the fix
    switched off for the case (P's write never cut, D's fence 0: the defect as it was), so the
    write-after-free watcher has a late write to see."""
    from connector_patch.pd import vllm_connector as hc
    from connector_patch.pd.write import WriteGuard

    saved = (WriteGuard.is_cut, hc.GONE_FENCE_S)
    if unfixed:
        WriteGuard.is_cut, hc.GONE_FENCE_S = (lambda self: False), 0.0
    p = RealPrefill()
    link = Toxiproxy(p.worker.side_channel_port)
    try:
        gate = threading.Event()
        gate.set()
        boot = SlowBootstrap(f"http://127.0.0.1:{p.bootstrap.port}", gate,
                             rewrite={f":{p.worker.side_channel_port}": f":{link.port}"})
        node = DNode("HardenedMooncakeConnector", "fail", timeout_ms=LONG_MS, num_blocks=4)
        node.kv_marker = 1.0
        sys.path.insert(0, os.path.join(REPO, "families", "pd", "node_instruments"))
        from pdchaos_waf import Watcher  # the real node's watcher, on this D's KV tensors

        waf_file = tempfile.mktemp(prefix="pdc-waf-", suffix=".json")
        node.watcher = Watcher(waf_file)
        node.watcher.set_caches(node.kv_caches, 4)
        x, y = rid("inflight-x"), rid("inflight-y")
        tid = "x-" + x
        # unfixed: P's bytes wait until Y holds X's blocks (else a loaded machine may land some
        # before Y got them, and the case would measure the machine, not the defect)
        slow = _SlowWrites(p.worker, hold=unfixed)
        p.metadata("p-" + x, tid, [])  # P computes X's prompt
        p.metadata("p-" + x, tid, [[1, 2, 3]])  # and its prefill ended: the blocks are the worker's
        node.add(x, prompt(80), {**p.params(tid), "remote_bootstrap_addr": boot.addr})
        node.step()
        write_started = node.run_until(slow.started.is_set, 10)
        t_cut = time.monotonic()
        link.enabled(False)
        node.run_until(lambda: node.finished(x), 10)
        x_error_after_s = round(time.monotonic() - t_cut, 2)
        node.run_until(lambda: x not in node.sched.requests, 15)
        t_freed = time.monotonic()
        x_blocks = sorted(node.blocks.get(x, ()))
        x_freed = x not in node.sched.requests and node.free_blocks() == node.free0
        node.add(y, prompt(80), None, max_tokens=8)  # Y runs on X's blocks (the only ones)
        node.run_until(lambda: node.status(y) == "RUNNING" and node.reqs[y].num_output_tokens >= 1, 5)
        y_blocks = sorted(b for g in node.sched.kv_cache_manager.get_block_ids(y) for b in g)
        y_before = _intact(node, y_blocks, 1.0)
        slow.release.set()
        write_ended = slow.ended.wait(WRITE_S + 5)
        time.sleep(0.3)
        intact, overwritten = _intact(node, y_blocks, 1.0), _intact(node, y_blocks, 3.0)
        time.sleep(0.6)  # the watcher's poll (4 a second) and its file (every 0.5 s)
        with open(waf_file) as f:
            waf = json.load(f)
        link.enabled(True)
        node.run_until(lambda: node.finished(y), 10)
        return {"write_started": write_started, "write_ended": write_ended, "write_s": WRITE_S,
                "write_ret": slow.ret, "write_bytes": slow.total, "written_bytes": slow.written,
                "write_chunks": slow.calls,
                "write_ended_after_cut_s": None if slow.t_end is None else round(slow.t_end - t_cut, 2),
                "x_error_after_s": x_error_after_s, "x_freed_after_s": round(t_freed - t_cut, 2),
                "x_freed_after_write_ended": slow.t_end is not None and t_freed > slow.t_end,
                "x_freed": x_freed, "y_reuses_x_blocks": len(set(x_blocks) & set(y_blocks)),
                "y_blocks": len(y_blocks), "y_blocks_intact_before": y_before, "y_blocks_intact": intact,
                "y_blocks_overwritten_by_p": overwritten, "x": node.req_facts(x), "waf": waf,
                "p_failures": dict(p.worker.failures.totals)}
    finally:
        WriteGuard.is_cut, hc.GONE_FENCE_S = saved
        link.close()


def case_shutdown_while_writing() -> dict:
    """(issue 43, 7a) The REAL hardened P is writing X's KV into D's blocks (a slow link, WRITE_S)
    when P shuts down (its worker's shutdown, as its __del__ calls it). Upstream's shutdown
    terminates the ZMQ context first (P's side channel closes: D sees refusals and reads P as gone)
    and leaves the executor writing on (shutdown(wait=False)). Measured: when the context was
    terminated, when the write ended, how much was written, and whether shutdown returned within
    3 s (it does not, before the fix or after: upstream's term() waits for the side channel's
    socket, whose asyncio listener never sees ContextTerminated; not this case's subject)."""
    p = RealPrefill()
    node = DNode("HardenedMooncakeConnector", "fail", timeout_ms=LONG_MS, num_blocks=4)
    x = rid("shutdown-x")
    tid = "x-" + x
    slow = _SlowWrites(p.worker)
    p.metadata("p-" + x, tid, [])
    p.metadata("p-" + x, tid, [[1, 2, 3]])
    node.add(x, prompt(80), p.params(tid))
    node.step()
    write_started = node.run_until(slow.started.is_set, 10)
    time.sleep(0.3)  # the write is under way
    ctx = p.worker.async_zmq_ctx
    t_term: list[float] = []
    term = ctx.term

    def timed_term():
        t_term.append(time.monotonic())
        return term()

    ctx.term = timed_term
    t0 = time.monotonic()
    done = threading.Event()
    threading.Thread(target=lambda: (p.worker.shutdown(), done.set()), daemon=True).start()
    write_ended = slow.ended.wait(WRITE_S + 5)
    shut = done.wait(3.0)
    node.run_until(lambda: node.finished(x), 10)
    return {"write_started": write_started, "shutdown_returned": shut,
            "shutdown_s": round(time.monotonic() - t0, 2) if shut else None,
            "write_ended": write_ended, "write_ret": slow.ret, "write_bytes": slow.total,
            "written_bytes": slow.written,
            "write_ended_after_shutdown_s": None if slow.t_end is None else round(slow.t_end - t0, 2),
            "context_terminated_after_s": round(t_term[0] - t0, 2) if t_term else None,
            "wrote_after_context_gone": bool(t_term) and slow.t_end is not None and slow.t_end > t_term[0],
            "p_failures": dict(p.worker.failures.totals)}


def _threads_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of each thread of this process, by thread id."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return out


def case_held_pulls_cpu() -> dict:
    """(issue 43, 7h, measured) 60 pulls to a silent peer (it takes them and never answers, nor a
    cancel), one request a step (a pull each), each failing at its 1 s deadline; then, nothing stepping (an idle
    engine sleeps), the CPU of this process's threads but the main one (D's receiver loop with its
    held pulls, ZMQ's I/O threads, the transfer engine) over 8 s, and the cancel rounds P got."""
    node = DNode("HardenedMooncakeConnector", "fail", timeout_ms=1000, num_blocks=256)
    p = FakePrefill([SILENT])
    ids = []
    for i in range(60):
        r = rid(f"held-{i}")
        ids.append(r)
        node.add(r, prompt(40), p.params("x-" + r))
        node.step()  # a pull each
    node.run_until(lambda: all(node.finished(r) for r in ids), 20)
    failed = sum(node.finished(r) for r in ids)
    node.settle(0.5)
    main = threading.get_native_id()
    c0, t0, k0 = _threads_cpu(), time.monotonic(), sum(p.cancels)
    time.sleep(8.0)
    c1, t1, k1 = _threads_cpu(), time.monotonic(), sum(p.cancels)
    busy = {tid: c1[tid] - c0.get(tid, 0.0) for tid in c1 if tid != main}
    out = {"pulls": sum(p.pulls), "failed": failed, "held_blocks": node.free0 - node.free_blocks(),
           "window_s": round(t1 - t0, 2), "cores": round(sum(busy.values()) / (t1 - t0), 3),
           "busiest_threads": sorted((round(v / (t1 - t0), 3) for v in busy.values()), reverse=True)[:4],
           "cancel_rounds_in_window": k1 - k0}
    p.close()
    return out


CASES = {
    "hma_tp2": case_hma_tp2,
    "requester_lost": case_requester_lost,
    "eos_hold": case_eos_hold,
    "queued_pull_after_record_gone": case_queued_pull_after_record_gone,
    "bootstrap_gap": case_bootstrap_gap,
    "abort_one_of_a_pull": case_abort_one_of_a_pull,
    "fail_policy": case_fail_policy,
    "recompute_policy": case_recompute_policy,
    "multi_p": case_multi_p,
    "empty_pull": case_empty_pull,
    "duplicates": case_duplicates,
    "bad_params": case_bad_params,
    "deadline": case_deadline,
    "abort_while_waiting": case_abort_while_waiting,
    "unreachable": case_unreachable,
    "upstream_p_holds_blocks": case_upstream_p_holds_blocks,
    "recompute_settles": case_recompute_settles,
    "late_write_after_deadline": case_late_write_after_deadline,
    "cancel_as_prefill_ends": case_cancel_as_prefill_ends,
    "cancel_record_gone": case_cancel_record_gone,
    "repeated_ok": case_repeated_ok,
    "ok_sibling_cancels": case_ok_sibling_cancels,
    "never_connected": case_never_connected,
    "monitor_backlog": case_monitor_backlog,
    "write_in_flight": case_write_in_flight,
    "write_in_flight_unfixed": lambda: case_write_in_flight(unfixed=True),
    "held_pulls_cpu": case_held_pulls_cpu,
    # last: the P it shuts down stays behind, its sender loop busy on a terminated context (upstream's
    # term() blocks; measured: held_pulls_cpu after it read 0.364 of a core for this process's threads)
    "shutdown_while_writing": case_shutdown_while_writing,
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
