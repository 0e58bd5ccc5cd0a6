"""Conformance-env side: the engine steps of D and P around the real connector.

vLLM's engine calls a KV connector at fixed points; these two classes make exactly those calls,
with real vLLM objects (``Request``, ``KVCacheBlocks``), on the connector ``stack.build`` made:

* :class:`DecodeEngine` (D): a request with ``do_remote_prefill`` is admitted as the scheduler does
  (``update_state_after_alloc``: D's scheduler side POSTs its transfer params to the metaserver),
  waits in WAITING_FOR_REMOTE_KVS, and every step (``STEP_S``) the scheduler's
  ``build_connector_meta`` goes to the worker's ``start_load_kv``, and the worker's
  ``get_finished`` / ``get_block_ids_with_load_errors`` say which requests leave the wait and
  which blocks failed to load (what the scheduler's ``update_from_output`` reads);
* :class:`PrefillEngine` (P): a request arriving with D's params (what the proxy forwards) gets P's
  blocks and its connector metadata (``add_new_req``, as P's scheduler side builds it), then a
  forward pass: ``start_load_kv``, then ``save_kv_layer`` for each layer (P's sending thread pushes
  each layer; after the last one it signals D DONE or FAILED). One forward pass at a time.

Records per request: state, times, block counts; never token ids or block ids in logs.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from typing import Any

from . import stack

log = logging.getLogger(__name__)
STEP_S = 0.02
LAYER_COMPUTE_S = 0.01  # what one layer of the forward pass costs before its KV is saved


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
    def __init__(self, worker: Any, sched: Any, metaserver_url: str):
        self.worker, self.sched, self.url = worker, sched, metaserver_url
        self.blocks = _Blocks(stack.NUM_BLOCKS)
        self.reqs: dict[str, dict] = {}  # external id -> state
        self.by_internal: dict[str, str] = {}
        self._lock = threading.Lock()
        self.counters = {"admitted": 0, "done": 0, "failed": 0, "waiting": 0, "blocks_reported": 0,
                         "refused": 0}
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="decode-engine", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(2.0)

    def admit(self, ext_id: str, tokens: int) -> dict:
        from vllm import SamplingParams
        from vllm.v1.core.kv_cache_manager import KVCacheBlocks
        from vllm.v1.core.kv_cache_utils import KVCacheBlock
        from vllm.v1.request import Request

        n_blocks = -(-tokens // stack.BLOCK_SIZE)
        ids = self.blocks.take(n_blocks)
        if ids is None:
            self.counters["refused"] += 1
            return {"admitted": False, "why": "no free blocks"}
        internal = ext_id + _suffix()
        req = Request(internal, [1] * tokens, SamplingParams(max_tokens=1), None)
        req.kv_transfer_params = {"do_remote_prefill": True, "metaserver": self.url}
        with self._lock:
            self.reqs[ext_id] = {"state": "waiting", "t_admit": time.monotonic(), "blocks": ids,
                                 "blocks_reported": 0, "internal": internal}
            self.by_internal[internal] = ext_id
        # the scheduler: blocks allocated for the remote tokens -> D's POST to the metaserver
        self.sched.update_state_after_alloc(req, KVCacheBlocks(([KVCacheBlock(i) for i in ids],)), tokens)
        self.counters["admitted"] += 1
        return {"admitted": True, "blocks": n_blocks}

    def _step(self) -> None:
        meta = self.sched.build_connector_meta(None)  # D's side of it never reads the output
        self.worker.bind_connector_metadata(meta)
        try:
            self.worker.start_load_kv(None)
        finally:
            self.worker.clear_connector_metadata()
        _, finished = self.worker.get_finished(set())
        invalid = self.worker.get_block_ids_with_load_errors()
        if not finished and not invalid:
            return
        now = time.monotonic()
        with self._lock:
            if invalid:  # failed loads, whether or not the request left the wait
                self.counters["blocks_reported"] += len(invalid)
                for r in self.reqs.values():
                    if r["state"] == "waiting":
                        r["blocks_reported"] += sum(1 for b in r["blocks"] if b in invalid)
            for internal in finished:
                ext = self.by_internal.pop(internal, None)
                r = self.reqs.get(ext) if ext else None
                if r is None or r["state"] != "waiting":
                    continue
                r["state"] = "failed" if r["blocks_reported"] else "done"
                r["t_end"] = now
                self.counters[r["state"]] += 1
                self.blocks.give(r["blocks"])

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
            out = {"state": r["state"], "blocks": len(r["blocks"]), "blocks_reported": r["blocks_reported"]}
            if "t_end" in r:
                out["wait_ms"] = round((r["t_end"] - r["t_admit"]) * 1000, 1)
            return out

    def stats(self) -> dict:
        with self._lock:
            self.counters["waiting"] = sum(1 for r in self.reqs.values() if r["state"] == "waiting")
        out = dict(self.counters)
        t = self.worker.connector_worker.kv_recv_layer_thread
        out["free_blocks"] = self.blocks.free()
        for k, v in (getattr(t, "counters", None) or {}).items():
            out[f"listener_{k}"] = v
        return out

    def alive(self) -> bool:
        t = self.worker.connector_worker.kv_recv_layer_thread
        return bool(t is not None and t.is_alive() and self.thread.is_alive())


class PrefillEngine:
    def __init__(self, worker: Any, caches: dict):
        self.worker, self.caches = worker, caches
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

    def _forward(self, params: dict) -> bool:
        from vllm_ascend.distributed.kv_transfer.kv_p2p.mooncake_layerwise_connector import (
            MooncakeLayerwiseConnectorMetadata)

        remote = params.get("remote_block_ids") or [[]]
        n_blocks = len(remote[0])
        ids = self.blocks.take(n_blocks)
        if ids is None:
            self.counters["refused"] += 1
            return False
        tokens = n_blocks * stack.BLOCK_SIZE
        internal = str(params.get("request_id", "")) + _suffix()
        kv = dict(params, remote_cached_tokens=params.get("remote_cached_tokens", 0))
        meta = MooncakeLayerwiseConnectorMetadata()
        meta.add_new_req(request_id=internal, local_block_ids=[ids], kv_transfer_params=kv, token_ids=[],
                         chunk_finish=True, prompt_len=tokens, remote_cache_tokens=0,
                         local_computed_tokens=tokens, local_transed_tokens=0)
        caches = self.caches
        t0 = time.monotonic()
        self.worker.bind_connector_metadata(meta)
        try:
            self.worker.start_load_kv(None)
            for name in stack.layer_names():
                time.sleep(LAYER_COMPUTE_S)
                self.worker.save_kv_layer(name, caches[name], None)
        finally:
            self.worker.clear_connector_metadata()
            self.blocks.give(ids)
        layers = self._layers.pop(internal, set())
        if stack.NUM_LAYERS - 1 in layers and len(layers) < stack.NUM_LAYERS:
            self.counters["partial_sends"] += 1
            log.error("prefill: a request went to the sending thread for its last layer after %d of %d layers "
                      "were skipped", stack.NUM_LAYERS - len(layers), stack.NUM_LAYERS)
        ms = (time.monotonic() - t0) * 1000
        self.counters["forwards"] += 1
        self.counters["forward_ms_max"] = round(max(self.counters["forward_ms_max"], ms), 1)
        return True

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                ticket, params = self.q.get(timeout=0.2)
            except queue.Empty:
                continue
            ok = False
            try:
                ok = self._forward(params)
            except Exception as exc:
                self.counters["forward_errors"] += 1
                log.error("prefill forward raised %s", type(exc).__name__)
            finally:
                self._finish(ticket, ok)

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
