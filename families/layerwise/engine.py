"""Conformance-env side: the engine steps of D and P around the real connector.

vLLM's engine calls a KV connector at fixed points; these two classes make exactly those calls,
with real vLLM objects, on the connector ``stack.build`` made:

* :class:`DecodeEngine` (D): vLLM's real v1 ``Scheduler`` (it builds D's scheduler-side
  connector itself): a request with ``do_remote_prefill`` is added, ``schedule()`` gives it its
  blocks and D's POST to the metaserver, it waits in WAITING_FOR_REMOTE_KVS, and every step
  (``STEP_S``) the step's connector metadata goes to the worker's ``start_load_kv``, the
  worker's ``get_finished`` / ``get_block_ids_with_load_errors`` go into the step's
  ``KVConnectorOutput`` and ``update_from_output`` decides (finished, FINISHED_ERROR, recompute
  per ``kv_load_failure_policy``); the forward pass is a stand-in (one token, no model);
* :class:`PrefillEngine` (P): requests arriving with D's params (what the proxy forwards) get P's
  blocks and their connector metadata (``add_new_req``, as P's scheduler side builds it), up to
  ``batch`` of them in one forward pass: ``start_load_kv``, then ``save_kv_layer`` for each layer
  (P's sending thread pushes each layer; after the last one it signals D DONE or FAILED).

Records per request: state, times, block counts; never token ids or block ids in logs.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
import zlib
from typing import Any

from . import stack

log = logging.getLogger(__name__)
STEP_S = 0.02
LAYER_COMPUTE_S = 0.01  # what one layer of the forward pass costs before its KV is saved
FREED = -1.0  # what D writes into a failed request's freed blocks (every request's pattern is >= 1)
WATCH_S = 20.0  # how long D watches a failed request's freed blocks for a late write of P


def _suffix() -> str:
    """vLLM's engine-core request id = external id + a 9-character suffix (vLLM PR #27987)."""
    return "-" + uuid.uuid4().hex[:8]


class _Blocks:
    def __init__(self, n: int):
        self._free = list(range(1, n))  # block 0: vLLM's null block
        self._lock = threading.Lock()

    def take(self, n: int) -> list[int] | None:
        with self._lock:
            if len(self._free) < n:
                return None
            out, self._free = self._free[:n], self._free[n:]
            return out

    def give(self, ids: list[int]) -> None:
        with self._lock:
            self._free.extend(ids)

    def free(self) -> int:
        with self._lock:
            return len(self._free)


class DecodeEngine:
    """D: vLLM's real v1 ``Scheduler`` (it builds its own scheduler-side connector from the
    config, as vLLM's engine core does) stepped with the worker-side connector and a stand-in
    forward pass (no model: one sampled token per request whose prompt is complete; every request
    has ``max_tokens=1``). A step is what vLLM's engine core does: ``schedule()`` (a new request
    with remote KV gets its blocks and D's POST to the metaserver; the connector metadata), the
    worker's ``start_load_kv``, its ``get_finished`` and ``get_block_ids_with_load_errors`` into
    the ``KVConnectorOutput`` of the step, then ``update_from_output``. Requests are added from the
    control thread through a queue (the scheduler is not thread-safe). ``kv_load_failure_policy``
    is the config's: ``fail`` finishes a request whose blocks failed FINISHED_ERROR, ``recompute``
    computes it locally.

    A request's state: ``waiting`` until the scheduler finished it; ``done`` (finished normally)
    or ``failed`` (FINISHED_ERROR); ``blocks_reported``: its blocks among the step's invalid ones.
    ``free_blocks`` / ``blocks_initial`` / ``blocks_live`` (held by unfinished requests) /
    ``blocks_held_finished`` (held by finished requests the scheduler keeps) are the scheduler's
    own block pool: what a leak shows in."""

    def __init__(self, worker: Any, cfg: Any, metaserver_url: str, caches: dict | None = None):
        from vllm.config import set_current_vllm_config
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.structured_output import StructuredOutputManager

        self.worker, self.url, self.caches = worker, metaserver_url, caches
        with set_current_vllm_config(cfg):
            self.sched = Scheduler(vllm_config=cfg, kv_cache_config=stack.kv_cache_config(),
                                   structured_output_manager=StructuredOutputManager(cfg),
                                   block_size=stack.BLOCK_SIZE, log_stats=False)
        self.policy = cfg.kv_transfer_config.kv_load_failure_policy
        self.blocks_initial = self._free_blocks()
        self.pending: "queue.Queue[Any]" = queue.Queue()
        self.reqs: dict[str, dict] = {}  # external id -> state
        self.by_internal: dict[str, str] = {}
        self._lock = threading.Lock()
        self.counters = {"admitted": 0, "done": 0, "failed": 0, "waiting": 0, "blocks_reported": 0,
                         "refused": 0, "recomputed": 0, "steps": 0, "batched_max": 0, "content_checked": 0,
                         "content_bad": 0, "freed_after_failure": 0, "writes_after_free": 0}
        self._unfreed: set[str] = set()  # failed (or with blocks reported) and their blocks not freed yet
        self._watch: dict[str, tuple[list[int], float]] = {}  # freed after a failure: ids, when
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="decode-engine", daemon=True)

    def _free_blocks(self) -> int:
        return int(self.sched.kv_cache_manager.block_pool.get_num_free_blocks())

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(2.0)

    def admit(self, ext_id: str, tokens: int) -> dict:
        from vllm import SamplingParams
        from vllm.v1.request import Request

        if ext_id in self.reqs:
            return {"admitted": False, "why": "duplicate request id"}
        n_blocks = -(-tokens // stack.BLOCK_SIZE)
        if n_blocks >= self.blocks_initial:
            self.counters["refused"] += 1
            return {"admitted": False, "why": "more blocks than the pool has"}
        internal = ext_id + _suffix()
        base = zlib.crc32(ext_id.encode()) % 200  # a prompt of its own per request
        req = Request(internal, [1 + (base + i) % 250 for i in range(tokens)], SamplingParams(max_tokens=1), None)
        req.kv_transfer_params = {"do_remote_prefill": True, "metaserver": self.url}
        with self._lock:
            self.reqs[ext_id] = {"state": "waiting", "t_admit": time.monotonic(), "blocks": n_blocks, "ids": set(),
                                 "blocks_reported": 0, "internal": internal}
            self.by_internal[internal] = ext_id
        self.pending.put(req)
        self.counters["admitted"] += 1
        return {"admitted": True, "blocks": n_blocks}

    def _step(self) -> None:
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

        while True:
            try:
                self.sched.add_request(self.pending.get_nowait())
            except queue.Empty:
                break
        so = self.sched.schedule()
        meta = so.kv_connector_metadata
        if meta is not None:
            self.worker.bind_connector_metadata(meta)
            try:
                self.worker.start_load_kv(None)
            finally:
                self.worker.clear_connector_metadata()
        sending, recving = self.worker.get_finished(set(so.finished_req_ids))
        invalid = set(self.worker.get_block_ids_with_load_errors() or ())
        self._check_content(recving or (), invalid)
        ids = list(so.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            req = self.sched.requests[rid]
            sampled.append([7] if req.num_computed_tokens >= req.num_tokens else [])
        with self._lock:  # the blocks each waiting request holds (invalid ones are matched against them)
            for internal, ext in self.by_internal.items():
                if internal in self.sched.requests:
                    self.reqs[ext]["ids"] = set(self.sched.kv_cache_manager.get_block_ids(internal)[0])
        out = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=sampled,
                                kv_connector_output=KVConnectorOutput(finished_sending=sending or None,
                                                                      finished_recving=recving or None,
                                                                      invalid_block_ids=invalid))
        outputs = self.sched.update_from_output(so, out)
        self.counters["steps"] += 1
        self.counters["batched_max"] = max(self.counters["batched_max"], len(ids))
        now = time.monotonic()
        with self._lock:
            if invalid:
                self.counters["blocks_reported"] += len(invalid)
                for ext, r in self.reqs.items():
                    if r["state"] == "waiting" and r["ids"] & invalid:
                        r["blocks_reported"] += len(r["ids"] & invalid)
                        self._unfreed.add(ext)
            for eco in outputs.values():
                for o in eco.outputs:
                    if o.finish_reason is None:
                        continue
                    ext = self.by_internal.pop(o.request_id, None)
                    r = self.reqs.get(ext) if ext else None
                    if r is None or r["state"] != "waiting":
                        continue
                    failed = str(o.finish_reason).lower().endswith("error")
                    r["state"] = "failed" if failed else "done"
                    if not failed and r["blocks_reported"]:
                        self.counters["recomputed"] += 1  # recompute policy: its prompt computed here
                    r["t_end"] = now
                    self.counters[r["state"]] += 1
                    if failed:
                        self._unfreed.add(ext)
        self._watch_freed(now)

    def _watch_freed(self, now: float) -> None:
        """P must not write a request's blocks once D gave them back. When vLLM frees the blocks of
        a request whose load failed, they are filled with a value no request's pattern has; from
        then on (``WATCH_S``) D looks for that request's pattern there every step: finding it is a
        write by P after the free (``writes_after_free``, once per request), which would land in
        another request's KV once the blocks are reused."""
        if self.caches is None:
            return
        names = stack.layer_names()
        for ext in [e for e in self._unfreed if self.reqs[e]["internal"] not in self.sched.requests]:
            self._unfreed.discard(ext)
            ids = sorted(self.reqs[ext]["ids"])
            if not ids:
                continue
            for name in names:
                for kv in (0, 1):
                    self.caches[name][kv][ids] = FREED
            self._watch[ext] = (ids, now)
            self.counters["freed_after_failure"] += 1
        for ext, (ids, t) in list(self._watch.items()):
            hit = any(bool((self.caches[name][kv][ids] == stack.kv_pattern(ext, layer, kv)).any())
                      for layer, name in enumerate(names) for kv in (0, 1))
            if hit:
                self.counters["writes_after_free"] += 1
                log.error("decode: P wrote a failed request's KV after its blocks were freed (%.2f s after)",
                          now - t)
            if hit or now - t > WATCH_S:
                del self._watch[ext]

    def _check_content(self, recving: Any, invalid: set) -> None:
        """A request whose load finished with no block reported failed must hold what P wrote for
        it, on every layer, K and V (``stack.kv_pattern``): a layer never written, or written over
        by another request's late write, shows here (``content_bad``), before vLLM frees anything."""
        if self.caches is None:
            return
        for internal in recving:
            ext = self.by_internal.get(internal)
            if ext is None or internal not in self.sched.requests:
                continue
            ids = list(self.sched.kv_cache_manager.get_block_ids(internal)[0])
            if not ids or set(ids) & invalid:
                continue
            bad = 0
            for layer, name in enumerate(stack.layer_names()):
                for kv in (0, 1):
                    if not bool((self.caches[name][kv][ids] == stack.kv_pattern(ext, layer, kv)).all()):
                        bad += 1
            self.counters["content_checked"] += 1
            if bad:
                self.counters["content_bad"] += 1
                log.error("decode: a loaded request's KV differs from what P wrote in %d of %d layer halves",
                          bad, 2 * stack.NUM_LAYERS)

    def _loop(self) -> None:
        while not self._stop.wait(STEP_S):
            try:
                self._step()
            except Exception as exc:  # an engine step that raises: vLLM's engine would die here
                log.error("decode engine step raised %s", type(exc).__name__)
                self.counters["step_errors"] = self.counters.get("step_errors", 0) + 1

    def status(self, ext_id: str) -> dict:
        with self._lock:
            r = self.reqs.get(ext_id)
            if r is None:
                return {"state": "unknown"}
            out = {"state": r["state"], "blocks": r["blocks"], "blocks_reported": r["blocks_reported"]}
            if "t_end" in r:
                out["wait_ms"] = round((r["t_end"] - r["t_admit"]) * 1000, 1)
            return out

    def stats(self) -> dict:
        with self._lock:
            self.counters["waiting"] = sum(1 for r in self.reqs.values() if r["state"] == "waiting")
            live = held = 0
            for rid, req in list(self.sched.requests.items()):
                n = len(self.sched.kv_cache_manager.get_block_ids(rid)[0])
                if req.is_finished():
                    held += n  # finished, its blocks not freed (a load never reported finished)
                else:
                    live += n
        out = dict(self.counters)
        t = self.worker.connector_worker.kv_recv_layer_thread
        out.update(free_blocks=self._free_blocks(), blocks_initial=self.blocks_initial, blocks_live=live,
                   blocks_held_finished=held, scheduler_requests=len(self.sched.requests))
        for k, v in (getattr(t, "counters", None) or {}).items():
            out[f"listener_{k}"] = v
        holds = getattr(t, "holds", None)  # hardened, patched: requests D failed whose blocks it still holds
        if holds is not None:
            out["listener_held_now"] = holds.held()
            # hardened's counters (the patched diff keeps none: diagnostics only, no check reads them)
            out.update({f"listener_{k}": v for k, v in (getattr(holds, "counters", None) or {}).items()})
        return out

    def alive(self) -> bool:
        t = self.worker.connector_worker.kv_recv_layer_thread
        return bool(t is not None and t.is_alive() and self.thread.is_alive())


class PrefillEngine:
    """P: requests forwarded by the metaserver, run ``batch`` at a time (those that arrive within
    ``gather_s`` of the first join its forward pass)."""

    def __init__(self, worker: Any, caches: dict, batch: int = 1, gather_s: float = 0.05, tag: Any = None):
        self.worker, self.caches, self.tag = worker, caches, tag
        self.batch, self.gather_s = max(1, int(batch)), gather_s
        self.layer_delay_s = 0.0  # added to every layer of a forward pass (fault prefill_slow)
        self.slow_forwards = 0  # forward passes running with that delay now
        self.blocks = _Blocks(stack.NUM_BLOCKS)
        self.q: "queue.Queue[dict]" = queue.Queue(maxsize=256)
        self.counters = {"received": 0, "forwards": 0, "forward_ms_max": 0.0, "forward_errors": 0,
                         "refused": 0, "partial_sends": 0}
        self._layers: dict[str, set[int]] = {}
        self._tickets_lock = threading.Lock()
        self._ticket = 0
        self._done: dict[int, bool] = {}
        self._watch_send_queue()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="prefill-engine", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(2.0)

    def submit(self, params: dict) -> dict:
        """Queue one request for the forward pass; its ticket tells when P is done with it
        (``forwarded``: what a proxy that waits for P's completion polls)."""
        with self._tickets_lock:
            self._ticket += 1
            ticket = self._ticket
        try:
            self.q.put_nowait((ticket, dict(params)))
        except queue.Full:
            self.counters["refused"] += 1
            return {"queued": False}
        self.counters["received"] += 1
        return {"queued": True, "ticket": ticket}

    def forwarded(self, ticket: int) -> dict:
        """``done``: P finished the request (its layers sent, or it was refused); ``sent``: sent."""
        with self._tickets_lock:
            if ticket in self._done:
                return {"done": True, "sent": self._done[ticket]}
        return {"done": False, "sent": False}

    def _finish(self, ticket: int, ok: bool) -> None:
        with self._tickets_lock:
            self._done[ticket] = ok
            while len(self._done) > 4096:  # a proxy polls right after: the oldest are long read
                self._done.pop(next(iter(self._done)))

    def _watch_send_queue(self) -> None:
        """Observe (never change) which layers of which request P's connector hands its sending
        thread: a request in the last layer's task gets DONE from upstream's sender whatever
        layers it missed before (``partial_sends``: D then completes it with layers never written)."""
        thread = self.worker.connector_worker.kv_send_layer_thread
        put = thread.send_queue.put

        def observed(task, *args, **kwargs):
            for rid in task.send_request:
                self._layers.setdefault(rid, set()).add(int(task.layer_idx))
            return put(task, *args, **kwargs)

        thread.send_queue.put = observed

    def _forward(self, batch: list[tuple[int, dict]]) -> dict[int, bool]:
        """One forward pass over a batch of requests (P's scheduler would run them together):
        each gets its blocks and its entry in one connector metadata, then every layer is computed
        once and saved for all of them. Returns ticket -> sent."""
        from vllm_ascend.distributed.kv_transfer.kv_p2p.mooncake_layerwise_connector import (
            MooncakeLayerwiseConnectorMetadata)

        meta = MooncakeLayerwiseConnectorMetadata()
        result: dict[int, bool] = {}
        taken: list[list[int]] = []
        internals: list[str] = []
        externals: list[str] = []
        for ticket, params in batch:
            remote = params.get("remote_block_ids") or [[]]
            n_blocks = len(remote[0])
            ids = self.blocks.take(n_blocks)
            if ids is None:
                self.counters["refused"] += 1
                result[ticket] = False
                continue
            tokens = n_blocks * stack.BLOCK_SIZE
            internal = str(params.get("request_id", "")) + _suffix()
            kv = dict(params, remote_cached_tokens=params.get("remote_cached_tokens", 0))
            meta.add_new_req(request_id=internal, local_block_ids=[ids], kv_transfer_params=kv, token_ids=[],
                             chunk_finish=True, prompt_len=tokens, remote_cache_tokens=0,
                             local_computed_tokens=tokens, local_transed_tokens=0)
            if self.tag is not None:  # what P's scheduler side adds from the request's params
                self.tag(meta, {internal: kv})
            taken.append(ids)
            internals.append(internal)
            externals.append(str(params.get("request_id", "")))
            result[ticket] = True
        if not internals:
            return result
        caches = self.caches
        t0 = time.monotonic()
        delay = self.layer_delay_s
        if delay:
            self.slow_forwards += 1
        self.worker.bind_connector_metadata(meta)
        try:
            self.worker.start_load_kv(None)
            for layer, name in enumerate(stack.layer_names()):
                time.sleep(LAYER_COMPUTE_S + delay)
                for ext, ids in zip(externals, taken):  # the layer's KV this request computed
                    for kv in (0, 1):
                        caches[name][kv][ids] = stack.kv_pattern(ext, layer, kv)
                self.worker.save_kv_layer(name, caches[name], None)
        finally:
            self.worker.clear_connector_metadata()
            for ids in taken:
                self.blocks.give(ids)
            if delay:
                self.slow_forwards -= 1
        for internal in internals:
            layers = self._layers.pop(internal, set())
            if stack.NUM_LAYERS - 1 in layers and len(layers) < stack.NUM_LAYERS:
                self.counters["partial_sends"] += 1
                log.error("prefill: a request went to the sending thread for its last layer after %d of %d layers "
                          "were skipped", stack.NUM_LAYERS - len(layers), stack.NUM_LAYERS)
        ms = (time.monotonic() - t0) * 1000
        self.counters["forwards"] += 1
        self.counters["batched_max"] = max(self.counters.get("batched_max", 0), len(internals))
        self.counters["forward_ms_max"] = round(max(self.counters["forward_ms_max"], ms), 1)
        return result

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                batch = [self.q.get(timeout=0.2)]
            except queue.Empty:
                continue
            deadline = time.monotonic() + self.gather_s  # what else arrives while the batch forms
            while len(batch) < self.batch:
                try:
                    batch.append(self.q.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            result: dict[int, bool] = {}
            try:
                result = self._forward(batch)
            except Exception as exc:
                self.counters["forward_errors"] += 1
                log.error("prefill forward raised %s", type(exc).__name__)
            finally:
                for ticket, _ in batch:
                    self._finish(ticket, result.get(ticket, False))

    def stats(self) -> dict:
        out = dict(self.counters)
        t = self.worker.connector_worker.kv_send_layer_thread
        out["queue"] = self.q.qsize()
        out["send_queue"] = t.send_queue.qsize() if t is not None else -1
        for k, v in (getattr(t, "counters", None) or {}).items():
            out[f"sender_{k}"] = v
        for k, v in (getattr(self.worker.connector_worker, "counters", None) or {}).items():
            out[f"worker_{k}"] = v
        return out

    def alive(self) -> bool:
        t = self.worker.connector_worker.kv_send_layer_thread
        return bool(t is not None and t.is_alive() and self.thread.is_alive())
