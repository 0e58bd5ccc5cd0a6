"""The hardened layerwise (decoder-first) connector: a plugin over vllm-ascend's real classes.

``HardenedMooncakeLayerwiseConnector`` subclasses vllm-ascend 0.23.0.post1's
``MooncakeLayerwiseConnector`` (``kv_p2p/mooncake_layerwise_connector.py``) and overrides only what
its guarantees need; everything else (block bookkeeping, transfer planning, the NPU paths, the
wire format) is upstream's own code. :func:`register` adds it to vLLM's ``KVConnectorFactory``
under ``"HardenedMooncakeLayerwiseConnector"``; a deployment then names it in
``kv_transfer_config.kv_connector``.

Guarantees, each against a gap of upstream's code (measured by pd-chaos' ``layerwise`` family):

1. **D's listener always answers.** A malformed frame, an undecodable payload, an unknown message
   type or a message with missing fields gets a NACK at once (codes in
   ``connector_patch.layerwise.rules``); upstream logs it and sends nothing, so the sender waits out
   its retries.
2. **A transfer error fails that request only.** An error of the transfer engine (raised or a
   negative return) in P's sending thread marks the requests of that session failed; after the
   last layer D is told FAILED for them; any other error of a layer task fails that task's requests
   (FAILED after the last layer). The thread serves the next request.
3. **A failed metadata query is reported.** P's query for D's metadata is one bounded attempt
   (``layerwise_meta_timeout_s``, default 2 s) on a socket closed afterwards; once it failed, the
   request's later layers are never sent (checked before the metadata cache: another request to
   the same D filling it must not let them through, or upstream's DONE would race the FAILED), and
   after the last layer D is told FAILED (off the forward pass). Upstream retries the query ~3.3 s
   on every layer and never tells D. A failed write fails the requests of its D session only
   (upstream's sender marks a leftover loop variable failed: another session's request).
   DONE/FAILED go out off the sending thread, bounded (``layerwise_signal_timeout_s``, default
   2 s); upstream's sender retries up to ~10 s on the sending thread when D is unreachable.
4. **D never waits forever.** Every request D waits for has a deadline
   (``layerwise_recv_timeout_s``, default 60 s). When it passes without DONE (from every sender)
   or FAILED, D fails the request itself. A failed request (FAILED, deadline, failed POST) leaves
   WAITING_FOR_REMOTE_KVS through ``finished_recving`` with its blocks reported by
   ``get_block_ids_with_load_errors``; upstream reports the blocks but never the request. A late
   completion of a request D already failed is ignored.
5. **D's blocks go back only once P cannot write them.** D's POST carries the request's write-by
   time (``layerwise_write_by``: D's deadline, wall clock); P's sending thread never starts a write
   past it, checked before each write to each D (the request fails there: FAILED after the last
   layer; a write to one D session carries all its requests, so one of them late fails the session's). When D fails a request itself
   (its deadline, or a POST that may have reached the proxy) it reports the blocks as failed loads
   at once (under policy ``fail`` the client has its error then) but reports the load finished,
   which frees the blocks, only on P's last word for it (a late DONE/FAILED) or at the write-by
   time plus ``layerwise_write_grace_s`` (default 5 s: one write in flight and the hosts' clock
   skew). Upstream has no deadline; a D that freed at its deadline would let P's late write land
   in blocks another request owns by then. A POST that never connected holds nothing.
6. **The metaserver POST is bounded and checked.** D's scheduler posts with a timeout
   (``metaserver_timeout_s``, default 5 s; tried again only when no connection was made: the
   POST is not idempotent) and treats a non-2xx answer as a failure;
   a failed POST fails the request (guarantee 4's path). A POST sent but unanswered within the
   bound fails nothing: vllm-ascend's example proxy answers only once P completed the request,
   so the request waits for P's word until its own deadline (guarantee 4). Upstream's client has
   no timeout (a metaserver that never answers holds the thread forever), ignores the status,
   and only logs.

7. **A thread that cannot start fails the start.** Upstream's listener thread dies on the bind
   error (and its sender on a failed device setup) and ``register_kv_caches`` waits for its ready
   event forever (the worker never starts and never says why; here it would also hold the swap
   lock). The hardened threads catch any exception before their ready event, set it, and
   ``register_kv_caches`` raises with the cause. It also asserts that the threads running are the
   hardened classes: if upstream stopped looking the classes up at call time, the swap would
   silently do nothing.

Options live in ``kv_transfer_config.kv_connector_extra_config``. Logs carry counts, codes, phases
and times only: never request ids, block ids, frames or addresses of KV memory.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import httpx
import msgspec
import zmq
from connector_patch.versions import require as _require_upstream

_require_upstream("HardenedMooncakeLayerwiseConnector")  # one line and nothing loaded on an upstream release it does not support

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole
from vllm.utils.network_utils import make_zmq_path, make_zmq_socket
from vllm_ascend.distributed.kv_transfer.kv_p2p import mooncake_layerwise_connector as up

from connector_patch.layerwise.rules import (ACK, DONE, FAILED, GET_META, NACK_MALFORMED, WRITE_BY_KEY, Holds, Message,
                                             RecvDeadlines, classify, past_write_by, post_failure)

logger = logging.getLogger(__name__)

NAME = "HardenedMooncakeLayerwiseConnector"
RECV_TIMEOUT_KEY, META_TIMEOUT_KEY, POST_TIMEOUT_KEY = ("layerwise_recv_timeout_s", "layerwise_meta_timeout_s",
                                                        "metaserver_timeout_s")
SIGNAL_TIMEOUT_KEY, GRACE_KEY = "layerwise_signal_timeout_s", "layerwise_write_grace_s"
DEFAULTS = {RECV_TIMEOUT_KEY: 60.0, META_TIMEOUT_KEY: 2.0, POST_TIMEOUT_KEY: 5.0, SIGNAL_TIMEOUT_KEY: 2.0,
            GRACE_KEY: 5.0}
SIGNAL_TRIES = 2
POST_TRIES = 2
POLL_MS = 100


def option(vllm_config: Any, key: str) -> float:
    extra = getattr(vllm_config.kv_transfer_config, "kv_connector_extra_config", None) or {}
    try:
        value = float(extra.get(key, DEFAULTS[key]))
    except (TypeError, ValueError):
        raise ValueError(f"kv_connector_extra_config.{key}: expected a number of seconds") from None
    if value <= 0:
        raise ValueError(f"kv_connector_extra_config.{key}: must be positive")
    return value


# --------------------------------------------------------------------------- D: the listener


class HardenedRecvingLayerThread(up.KVCacheRecvingLayerThread):
    """D's listener (ROUTER): answers every message, and knows which requests D waits for."""

    def __init__(self, *args: Any, recv_timeout_s: float = DEFAULTS[RECV_TIMEOUT_KEY],
                 grace_s: float = DEFAULTS[GRACE_KEY], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.deadlines = RecvDeadlines(recv_timeout_s)
        self.holds = Holds(grace_s)
        self._counts: dict[str, int] = {}  # request -> the sender count its DONEs said (while waiting)
        self.stop_event = threading.Event()
        self.bind_error: Exception | None = None
        # DONE/FAILED that came before the worker started waiting, per request, in arrival order
        # (kind, count, sender); several P senders (trans_count > 1) each leave one (issue 30, item 8)
        self._early: dict[str, list[tuple[str, int, str]]] = {}
        self._early_at: dict[str, float] = {}
        self.counters = {"get_meta": 0, "done": 0, "failed": 0, "nacks": 0, "late": 0, "early": 0, "expired": 0,
                         "reply_errors": 0}

    # -- what the worker calls
    def expect(self, req_id: str) -> None:
        # one lock with the listener's early check (update_done_task): a DONE is either kept early
        # and replayed here, or sees D waiting; never neither
        with self.lock:
            self.deadlines.expect(req_id)
            early = self._early.pop(req_id, [])
            self._early_at.pop(req_id, None)
        for kind, count, sender in early:
            if kind == "done":
                self.update_done_task(req_id, count, sender)
            else:
                self.update_failed_task(req_id, count, sender)

    def fail(self, req_id: str, hold: bool = False, count: int = 0, sender: str = "") -> bool:
        """D fails a request it waits for (a failed POST, or one sender's FAILED); ``hold``: P may
        still write it (its blocks stay D's, :class:`Holds`). A FAILED from one of ``count`` > 1
        senders holds too, until every sender said its last word (those that said DONE already
        have) or the write-by time plus the grace. False: D was not waiting for it."""
        due = self.deadlines.due(req_id)
        if not self.deadlines.settle(req_id):
            return False
        if count > 1:
            with self.lock:
                done_senders = set(self.task_tracker.get(req_id, ()))
            self.holds.hold(req_id, due)
            for s in done_senders | {sender}:
                self.holds.word(req_id, count, s)
        elif hold:
            self.holds.hold(req_id, due)
        up.KVCacheRecvingLayerThread.update_failed_task(self, req_id)
        return True

    def expire(self) -> int:
        gone = self.deadlines.expired()
        for req_id in gone:  # P may still write them: held until its last word or write-by + grace
            with self.lock:
                done_senders = set(self.task_tracker.get(req_id, ()))
                count = self._counts.pop(req_id, 0)
            self.holds.hold(req_id, None)
            for s in done_senders if count > 1 else ():  # their writes are over
                self.holds.word(req_id, count, s)
            up.KVCacheRecvingLayerThread.update_failed_task(self, req_id)
        if gone:
            self.counters["expired"] += len(gone)
            logger.warning("layerwise recv: %d request(s) heard no DONE/FAILED within %.1f s: failed by D",
                           len(gone), self.deadlines.timeout_s)
        return len(gone)

    def _kept_early(self, req_id: str, kind: str, count: int, sender: str) -> bool:
        """Keep a DONE/FAILED for a request D does not wait for yet (not gone either): checked and
        kept under the lock :meth:`expect` takes. True: kept (or dropped past 4096 requests)."""
        now = time.monotonic()
        with self.lock:
            if self.deadlines.waiting(req_id) or self.deadlines.gone(req_id):
                return False
            for rid in [r for r, t in self._early_at.items() if now - t > self.deadlines.timeout_s]:
                del self._early_at[rid]
                self._early.pop(rid, None)
            if req_id in self._early or len(self._early) < 4096:
                self._early.setdefault(req_id, []).append((kind, count, sender))
                self._early_at.setdefault(req_id, now)
        self.counters["early"] += 1
        return True

    # -- what a message does
    def update_done_task(self, req_id: str, trans_count: int, side_channel_path: str) -> None:
        if self._kept_early(req_id, "done", trans_count, side_channel_path):
            return
        if not self.deadlines.waiting(req_id):  # D already settled or failed it: never completes it again
            self.counters["late"] += 1
            self.holds.word(req_id, trans_count, side_channel_path)  # P's last word (from this sender): it writes no more
            return
        with self.lock:
            self._counts[req_id] = trans_count
        super().update_done_task(req_id, trans_count, side_channel_path)
        with self.lock:
            done = req_id in self.done_requests
            if done:
                self._counts.pop(req_id, None)
        if done:
            self.deadlines.settle(req_id)

    def update_failed_task(self, req_id: str, count: int = 0, sender: str = "") -> None:
        if self._kept_early(req_id, "failed", count, sender):
            return
        if not self.fail(req_id, count=count, sender=sender):
            self.counters["late"] += 1
            self.holds.word(req_id, count if count > 1 else None, sender)
        with self.lock:
            self._counts.pop(req_id, None)

    def answer(self, frames: list[bytes], decoder: Any, metadata: bytes) -> bytes:
        payload = [f for f in frames[1:] if f != b""]
        if len(payload) != 1:
            return NACK_MALFORMED
        try:
            msg = decoder.decode(payload[0])
        except Exception:  # msgspec raises its own DecodeError / ValidationError
            return NACK_MALFORMED
        m = classify(msg)
        if not isinstance(m, Message):
            return m
        if m.kind == "get_meta":
            self.counters["get_meta"] += 1
            return metadata
        if m.kind == "done":
            self.counters["done"] += 1
            self.update_done_task(m.req_id, m.count, m.sender)
        else:
            self.counters["failed"] += 1
            self.update_failed_task(m.req_id, m.count, m.sender)
        return ACK

    def run(self) -> None:
        ctx = None
        try:
            path = make_zmq_path("tcp", self.side_channel_host, self.side_channel_port + self.tp_rank)
            metadata = msgspec.msgpack.Encoder().encode(self.metadata)
            decoder = msgspec.msgpack.Decoder(type=tuple)
            ctx = zmq.Context()
            sock = make_zmq_socket(ctx=ctx, path=path, socket_type=zmq.ROUTER, bind=True)
        except Exception as exc:  # noqa: BLE001 - anything before the ready event fails the start
            # upstream's thread dies here and register_kv_caches waits for its ready event forever
            self.bind_error = exc
            if ctx is not None:
                ctx.destroy(linger=0)  # closes a socket that failed to bind (term() would wait for it)
            self.ready_event.set()
            return
        logger.info("layerwise recv: listening (tp_rank %d, deadline %.1f s)", self.tp_rank,
                    self.deadlines.timeout_s)
        try:
            self.ready_event.set()
            while not self.stop_event.is_set():
                if not sock.poll(POLL_MS):
                    continue
                frames = sock.recv_multipart()
                try:
                    reply = self.answer(frames, decoder, metadata)
                except Exception as exc:  # a bug here must not end the listener
                    logger.error("layerwise recv: message handling failed (%s)", type(exc).__name__)
                    reply = NACK_MALFORMED
                if reply not in (ACK,) and reply is not metadata:
                    self.counters["nacks"] += 1
                    logger.warning("layerwise recv: bad message answered %s", reply.decode())
                try:
                    sock.send_multipart((frames[0], b"", reply), flags=zmq.NOBLOCK)
                except zmq.ZMQError:
                    self.counters["reply_errors"] += 1
        finally:
            sock.close(linger=0)
            ctx.term()

    def stop(self, timeout_s: float = 2.0) -> None:
        self.stop_event.set()
        if self.is_alive():
            self.join(timeout_s)


# --------------------------------------------------------------------------- P: the sending thread


class _GuardedEngine:
    """The transfer engine as P's sending thread sees it: a failed write (raised or negative)
    marks every request of that session failed, and becomes the engine's error code."""

    def __init__(self, inner: Any, owner: "HardenedSendingLayerThread"):
        self._inner, self._owner = inner, owner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def batch_transfer_sync_write(self, session_id: str, src: list, dst: list, length: list) -> int:
        owner = self._owner
        late = [r for r in owner.sessions.get(session_id, ())
                if past_write_by(getattr(owner.task_requests.get(r), "write_by", None), time.time())]
        if late:
            # checked at each write, not once per layer task: a slow write to one D must not push
            # another D's write past the time that D may free the blocks (issue 30, item 7). The
            # session's requests go in one write: all of them fail (never a write after a free)
            owner.counters["past_write_by"] += len(late)
            owner.failed_reqs.update(owner.sessions.get(session_id, ()))
            return -1
        try:
            ret = self._inner.batch_transfer_sync_write(session_id, src, dst, length)
        except Exception as exc:
            logger.error("layerwise send: transfer engine raised %s", type(exc).__name__)
            ret = -1
        if ret < 0:
            owner.counters["transfer_errors"] += 1
            owner.failed_reqs.update(owner.sessions.get(session_id, ()))
        return ret


class _FailedRequests(set):
    """P's failed requests. vllm-ascend 0.23.0.post1's sending thread adds to this set in one place,
    after a failed write, with ``req_id`` left over from the loop before (the last request of the
    task, whichever D session it belongs to), so a request whose write succeeded was told FAILED
    and the failed ones were not. That ``add`` is dropped here (counted); the guarded engine has
    already added every request of the failed session (``update``)."""

    def __init__(self, counters: dict):
        super().__init__()
        self._counters = counters

    def add(self, req_id: str) -> None:
        self._counters["stale_adds_dropped"] = self._counters.get("stale_adds_dropped", 0) + 1


class HardenedSendingLayerThread(up.KVCacheSendingLayerThread):
    """P's per-layer sender: a failing layer fails its requests (D told FAILED), never the thread."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.engine = _GuardedEngine(self.engine, self)
        self.sessions: dict[str, list[str]] = {}
        self.task_requests: dict[str, Any] = {}  # the layer task's requests (their write-by times)
        self.counters = {"layers": 0, "transfer_errors": 0, "task_errors": 0, "failed_signals": 0,
                         "stale_adds_dropped": 0, "past_write_by": 0}
        self.failed_reqs = _FailedRequests(self.counters)
        self._signalled: set[str] = set()
        inner = self.callback_func

        def signal(req_id: str, req_meta: Any, group_idx: int, trans_flag: bool = True) -> None:
            self._signalled.add(req_id)
            if not trans_flag:
                self.counters["failed_signals"] += 1
            inner(req_id, req_meta, group_idx, trans_flag=trans_flag)

        self.callback_func = signal

    def run(self) -> None:
        """Upstream's ``run`` (set the device, set ready, serve the queue), with its start guarded:
        an exception before the ready event is kept for ``register_kv_caches`` to raise."""
        try:
            local_rank = up.get_world_group().local_rank
            up.torch.npu.set_device(up.torch.device(f"npu:{local_rank}"))
        except Exception as exc:  # noqa: BLE001 - reported by register_kv_caches, never a hang
            self.start_error = exc
            self.ready_event.set()
            return
        self.ready_event.set()
        while True:
            self._handle_request(self.send_queue.get())

    def _handle_request(self, send_task: Any) -> None:
        late = {r: m for r, m in send_task.send_request.items()
                if past_write_by(getattr(m, "write_by", None), time.time())}
        if late:  # D's deadline passed: D may free these blocks soon, never write them now
            self.counters["past_write_by"] += len(late)
            self.failed_reqs.update(late)
            send_task.send_request = {r: m for r, m in send_task.send_request.items() if r not in late}
        self.sessions = {}
        self.task_requests = dict(send_task.send_request)
        for req_id, meta in send_task.send_request.items():
            self.sessions.setdefault(f"{meta.remote_host}:{meta.remote_te_rpc_port}", []).append(req_id)
        self._signalled = set()
        self.counters["layers"] += 1
        try:
            if send_task.send_request:
                self._transfer_kv_cache(send_task)
        except Exception as exc:
            self.counters["task_errors"] += 1
            logger.error("layerwise send: layer %d failed (%s): its %d request(s) fail", send_task.layer_idx,
                         type(exc).__name__, len(send_task.send_request))
            self.failed_reqs.update(send_task.send_request)
            self._signal_failed(send_task, send_task.send_request)
        if late:
            self._signal_failed(send_task, late)

    def _signal_failed(self, send_task: Any, requests: dict) -> None:
        """After the last layer: FAILED to D for each of ``requests`` whose prefill is complete and
        that heard nothing yet (upstream's sender signals only requests it wrote this layer)."""
        if send_task.layer_idx != self.total_layers - 1:
            return
        try:
            group = self.layer_metadata[send_task.layer_name].tensor_group_idx[0]
        except Exception:
            group = 0
        for req_id, meta in requests.items():
            if meta.chunk_finish and req_id not in self._signalled:
                self.failed_reqs.discard(req_id)
                try:
                    self.callback_func(req_id, meta, group, trans_flag=False)
                except Exception as sig_exc:
                    logger.error("layerwise send: FAILED signal raised %s", type(sig_exc).__name__)


# --------------------------------------------------------------------------- worker


@contextlib.contextmanager
def _hardened_threads(worker: "HardenedLayerwiseWorker") -> Iterator[None]:
    """While upstream's ``register_kv_caches`` starts the two threads, it builds the hardened ones
    (it names the classes through its module: the only way in without copying the method)."""
    with _SWAP_LOCK:
        saved = up.KVCacheSendingLayerThread, up.KVCacheRecvingLayerThread
        timeout, grace, recv_cls = worker.recv_timeout_s, worker.grace_s, worker.RECV_THREAD

        def recv_thread(*args: Any, **kwargs: Any) -> HardenedRecvingLayerThread:
            return recv_cls(*args, recv_timeout_s=timeout, grace_s=grace, **kwargs)

        up.KVCacheSendingLayerThread, up.KVCacheRecvingLayerThread = worker.SEND_THREAD, recv_thread
        try:
            yield
        finally:
            up.KVCacheSendingLayerThread, up.KVCacheRecvingLayerThread = saved


_SWAP_LOCK = threading.Lock()


class HardenedLayerwiseWorker(up.MooncakeLayerwiseConnectorWorker):
    SEND_THREAD: type = HardenedSendingLayerThread  # the thread classes register_kv_caches starts
    RECV_THREAD: type = HardenedRecvingLayerThread

    def __init__(self, vllm_config: Any, kv_cache_config: Any, engine_id: str):
        super().__init__(vllm_config, kv_cache_config, engine_id)
        self.recv_timeout_s = option(vllm_config, RECV_TIMEOUT_KEY)
        self.meta_timeout_s = option(vllm_config, META_TIMEOUT_KEY)
        self.signal_timeout_s = option(vllm_config, SIGNAL_TIMEOUT_KEY)
        self.grace_s = option(vllm_config, GRACE_KEY)
        self._meta_failed: dict[str, float] = {}
        self._signals = ThreadPoolExecutor(2, thread_name_prefix="layerwise-signal")
        self.counters = {"meta_queries": 0, "meta_failures": 0, "meta_skips": 0, "recv_failed": 0, "recv_done": 0,
                         "signals": 0, "signal_failures": 0, "recv_released": 0}

    def register_kv_caches(self, kv_caches: dict) -> None:
        with _hardened_threads(self):
            super().register_kv_caches(kv_caches)
        tc = self.vllm_config.kv_transfer_config
        for role, attr, cls in (("producer", "kv_send_layer_thread", HardenedSendingLayerThread),
                                ("consumer", "kv_recv_layer_thread", HardenedRecvingLayerThread)):
            if getattr(tc, f"is_kv_{role}") and not isinstance(getattr(self, attr, None), cls):
                raise RuntimeError(f"{NAME}: {attr} is {type(getattr(self, attr, None)).__name__}, not "
                                   f"{cls.__name__}: upstream no longer builds its threads through the names "
                                   "the hardened connector swaps; not started")
        err = getattr(self.kv_recv_layer_thread, "bind_error", None)
        if err is not None:  # raised here, where vLLM reports a failed start, instead of waiting forever
            if isinstance(err, zmq.ZMQError):
                raise zmq.ZMQError(getattr(err, "errno", None) or 98,
                                   f"layerwise listener cannot bind port {self.handshake_port}: {err.strerror}")
            raise RuntimeError(f"layerwise listener did not start: {type(err).__name__}")
        err = getattr(getattr(self, "kv_send_layer_thread", None), "start_error", None)
        if err is not None:
            raise RuntimeError(f"layerwise sender did not start: {type(err).__name__}")

    # -- D
    def start_load_kv(self, metadata: Any) -> None:
        super().start_load_kv(metadata)
        thread = self.kv_recv_layer_thread
        if not self.vllm_config.kv_transfer_config.is_kv_consumer or thread is None:
            return
        for req_id, meta in metadata.requests.items():
            if not meta.do_virtual:
                thread.expect(up.get_external_request_id(req_id))
        for external_id, sent in (getattr(metadata, "failed_posts", None) or {}).items():
            thread.fail(external_id, hold=sent)  # a POST that may have reached the proxy: P may write

    def get_finished(self) -> tuple[set[str], set[str]]:
        thread = self.kv_recv_layer_thread
        if not self.vllm_config.kv_transfer_config.is_kv_consumer or thread is None:
            return super().get_finished()
        thread.expire()
        done_ext = thread.get_and_clear_done_requests()
        failed_ext = thread.get_and_clear_failed_requests()
        done = {self.request_map[s] for s in done_ext if s in self.request_map}
        failed = {self.request_map[s] for s in failed_ext if s in self.request_map}
        done -= failed
        done |= self.virtual_request
        self.virtual_request = set()
        for req_id in failed:  # reported now: under policy fail the client has its error now
            meta = self._recving_metadata.get(req_id)
            if meta is not None:
                self._invalid_block_ids.update(b for group in meta.local_block_ids for b in group)
        # a request D failed itself stays in the wait (its blocks D's) while P may still write it
        held = {r for r in failed if thread.holds.holding(up.get_external_request_id(r))}
        released = {self.request_map[s] for s in thread.holds.take_released() if s in self.request_map}
        finished = done | (failed - held) | released
        for req_id in finished:
            self.request_map.pop(up.get_external_request_id(req_id), None)
            self._recving_metadata.pop(req_id, None)
        self.counters["recv_done"] += len(done)
        self.counters["recv_failed"] += len(failed)
        self.counters["recv_released"] += len(released)
        if failed:
            logger.warning("layerwise recv: %d request(s) failed (%d held until P cannot write them)", len(failed),
                           len(held))
        # a failed request leaves WAITING_FOR_REMOTE_KVS through finished_recving too, which frees its blocks
        return set(), finished

    # -- P
    def update_decoder_info(self, req_id: str, req_meta: Any) -> Any:
        engine, port = req_meta.remote_engine_id, req_meta.remote_port
        if req_id in self._meta_failed:
            # checked before the cache: another request to the same D may have filled it since, and
            # a layer sent now would end in upstream's DONE racing this request's FAILED
            self.counters["meta_skips"] += 1
            raise RuntimeError("metadata query failed earlier for this request")
        if engine not in self.remote_layer_metadata or port not in self.remote_layer_metadata[engine]:
            try:
                agent_meta = self._query_metadata(req_id, req_meta)
            except Exception as exc:
                self._meta_failed[req_id] = time.monotonic()
                while len(self._meta_failed) > 4096:
                    self._meta_failed.pop(next(iter(self._meta_failed)))
                self.counters["meta_failures"] += 1
                logger.error("layerwise send: metadata query failed (%s) within %.1f s: the request fails",
                             type(exc).__name__, self.meta_timeout_s)
                raise
            if engine == self.engine_id:
                raise RuntimeError("remote engine id equals the local one")
            self.remote_layer_metadata[engine][port] = agent_meta.layer_metadata
            self.remote_te_port[engine][port] = agent_meta.te_rpc_port
            if self.pd_head_ratio > 1:  # as upstream: pre-create the link before resharded writes
                first = next(iter(self.layer_metadata.keys()))
                ret = self.engine.batch_transfer_sync_write(
                    f"{req_meta.remote_host}:{agent_meta.te_rpc_port}",
                    [self.layer_metadata[first].kv_caches_base_addr[0]],
                    [agent_meta.layer_metadata[first].kv_caches_base_addr[0]], [128])
                if ret < 0:
                    logger.error("layerwise send: link pre-creation failed (ret %d)", ret)
        req_meta.remote_te_rpc_port = self.remote_te_port[engine][port]
        req_meta.remote_layer_metadata = self.remote_layer_metadata[engine][port]
        return req_meta

    def _query_metadata(self, req_id: str, req_meta: Any) -> Any:
        """One GET_META round trip bounded by ``meta_timeout_s``, on a socket closed afterwards."""
        self.counters["meta_queries"] += 1
        ms = max(1, int(self.meta_timeout_s * 1000))
        ctx = zmq.Context()
        try:
            sock = make_zmq_socket(ctx=ctx, path=make_zmq_path("tcp", req_meta.remote_host, req_meta.remote_port),
                                   socket_type=zmq.REQ, bind=False)
            sock.setsockopt(zmq.SNDTIMEO, ms)
            sock.setsockopt(zmq.LINGER, 0)
            t_end = time.monotonic() + self.meta_timeout_s
            sock.send(self.encoder.encode((GET_META, up.get_external_request_id(req_id))))
            left = max(1, int((t_end - time.monotonic()) * 1000))
            if not sock.poll(left, zmq.POLLIN):
                raise TimeoutError("no metadata reply")
            data = sock.recv()
            return self.decoder.decode(data)
        finally:
            ctx.destroy(linger=0)

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, connector_metadata: Any,
                      **kwargs: Any) -> None:
        super().save_kv_layer(layer_name, kv_layer, attn_metadata, connector_metadata, **kwargs)
        if not (self.vllm_config.kv_transfer_config.is_kv_producer and connector_metadata.requests
                and self.current_layer == self.total_layers):
            return
        for req_id, meta in connector_metadata.requests.items():
            if req_id in self._meta_failed and meta.chunk_finish:
                self._meta_failed.pop(req_id, None)
                self.send_done_send_signal(req_id, meta, 0, trans_flag=False)

    def send_done_send_signal(self, req_id: str, req_meta: Any, group_idx: int, trans_flag: bool = True) -> None:
        """DONE/FAILED to D, off the sending thread and bounded (``layerwise_signal_timeout_s`` in
        all, two tries): upstream sends it on the sending thread, 3 tries of up to ~2 s each, so an
        unreachable D holds every later layer of every request. A signal that cannot get through is
        counted; D's deadline then settles the request."""
        self._signals.submit(self._signal, req_id, req_meta, group_idx, trans_flag)

    def _signal(self, req_id: str, req_meta: Any, group_idx: int, trans_flag: bool) -> None:
        self.counters["signals"] += 1
        try:
            count = req_meta.trans_count[group_idx] if req_meta.trans_count else 1
            data = msgspec.msgpack.Encoder().encode((DONE if trans_flag else FAILED,
                                                     up.get_external_request_id(req_id), count,
                                                     f"{self.side_channel_host}:{self.handshake_port}"))
            path = make_zmq_path("tcp", req_meta.remote_host, req_meta.remote_port)
        except Exception as exc:
            self.counters["signal_failures"] += 1
            logger.error("layerwise send: cannot build the %s signal (%s)", "DONE" if trans_flag else "FAILED",
                         type(exc).__name__)
            return
        t_end = time.monotonic() + self.signal_timeout_s
        why = "no time left"
        for _ in range(SIGNAL_TRIES):
            left = t_end - time.monotonic()
            if left <= 0:
                break
            per_try = max(1, int(left * 1000 / 2)) if _ == 0 else max(1, int(left * 1000))
            ctx = zmq.Context()
            try:
                sock = ctx.socket(zmq.REQ)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SNDTIMEO, per_try)
                sock.connect(path)
                sock.send(data)
                if not sock.poll(per_try, zmq.POLLIN):
                    why = "no answer"
                    continue
                reply = sock.recv()
                if reply == ACK:
                    return
                why = "answered " + (reply.decode(errors="replace") if reply.startswith(b"NACK") else "other")
                break  # D refused it: trying again would not change that
            except zmq.ZMQError as exc:
                why = f"zmq errno {exc.errno}"
            finally:
                ctx.destroy(linger=0)
        self.counters["signal_failures"] += 1
        logger.error("layerwise send: %s signal not delivered (%s) within %.1f s; D's deadline settles the request",
                     "DONE" if trans_flag else "FAILED", why, self.signal_timeout_s)


# --------------------------------------------------------------------------- scheduler (D's POST)


def tag_write_by(meta: Any, params: dict[str, Any]) -> None:
    """P's scheduler side: carry each request's write-by time from its transfer params (what D
    POSTed) into its ``ReqMeta`` (upstream's dataclass drops keys it does not know), where P's
    sending thread reads it. ``params``: request id -> kv_transfer_params."""
    for req_id, req_meta in meta.requests.items():
        req_meta.write_by = (params.get(req_id) or {}).get(WRITE_BY_KEY)


class HardenedLayerwiseScheduler(up.MooncakeLayerwiseConnectorScheduler):
    def __init__(self, vllm_config: Any, kv_cache_config: Any, engine_id: str):
        super().__init__(vllm_config, kv_cache_config, engine_id)
        self.post_timeout_s = option(vllm_config, POST_TIMEOUT_KEY)
        self.recv_timeout_s = option(vllm_config, RECV_TIMEOUT_KEY)
        self.metaserver_client.close()
        kwargs: dict[str, Any] = {"limits": httpx.Limits(max_connections=100000),
                                  "timeout": httpx.Timeout(self.post_timeout_s)}
        if self.ssl_enable:
            kwargs.update(cert=self.cert_path, verify=self.ca_path)
        self.metaserver_client = httpx.Client(**kwargs)
        self._failed_posts: dict[str, bool] = {}  # external id -> the metaserver may have it
        self._posts_lock = threading.Lock()
        self._alloc_time: dict[str, float] = {}
        self.counters = {"posts": 0, "post_failures": 0, "post_timeouts": 0}

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        # D's worker starts the request's deadline after this (its next start_load_kv): a write-by
        # time counted from here is never later than D's deadline
        with self._posts_lock:
            self._alloc_time[up.get_external_request_id(request.request_id)] = time.time()
            while len(self._alloc_time) > 4096:
                self._alloc_time.pop(next(iter(self._alloc_time)))
        super().update_state_after_alloc(request, blocks, num_external_tokens)

    def _access_metaserver(self, url: Any, message: dict) -> None:
        """One POST, bounded, carrying the request's write-by time. Tried again only when the
        connection was never made (then the metaserver cannot have the request): the POST is not
        idempotent, and a retry after a timeout or an answer could have the proxy send the request
        to P twice."""
        self.counters["posts"] += 1
        rid = str(message.get("request_id", ""))
        with self._posts_lock:
            t0 = self._alloc_time.pop(rid, None)
        message = dict(message)
        message[WRITE_BY_KEY] = (t0 if t0 is not None else time.time()) + self.recv_timeout_s
        why, unsent = "not tried", True
        for attempt in range(1, POST_TRIES + 1):
            unsent = False
            try:
                resp = self.metaserver_client.post(url, json=message)
                why = post_failure(resp.status_code, None)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                why, unsent = post_failure(None, type(exc).__name__), True
            except httpx.TimeoutException:
                # sent, unanswered within the bound: vllm-ascend's example proxy answers only once P
                # completed the request, so P may well be writing it. Not a failure: D waits for P's
                # word until the request's deadline, which bounds it (guarantee 4); failing it here
                # failed requests P then completed (issue 30, item 5)
                self.counters["post_timeouts"] += 1
                logger.warning("layerwise metaserver: POST unanswered within %.1f s: D waits for P until the "
                               "request's deadline", self.post_timeout_s)
                return
            except Exception as exc:
                why = post_failure(None, type(exc).__name__)
            if why is None:
                return
            logger.warning("layerwise metaserver: POST failed (%s), try %d/%d", why, attempt, POST_TRIES)
            if not unsent:
                break  # the metaserver may have it: never sent twice
        self.counters["post_failures"] += 1
        with self._posts_lock:
            self._failed_posts[rid] = not unsent
        logger.error("layerwise metaserver: POST failed (%s): the request fails", why)

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        params = {r: info.request.kv_transfer_params for r, info in self._reqs_need_send_layerwise.items()}
        meta = super().build_connector_meta(scheduler_output)
        if not self.vllm_config.kv_transfer_config.is_kv_consumer:
            tag_write_by(meta, params)
        with self._posts_lock:
            meta.failed_posts, self._failed_posts = self._failed_posts, {}
        return meta


# --------------------------------------------------------------------------- the connector


class HardenedMooncakeLayerwiseConnector(up.MooncakeLayerwiseConnector):
    """vllm-ascend's layerwise connector with the hardened scheduler and worker sides."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        KVConnectorBase_V1.__init__(self, vllm_config, role, kv_cache_config)
        kv = vllm_config.kv_transfer_config
        self._is_kv_producer = kv.is_kv_producer
        self.engine_id = kv.engine_id
        self._connector_metadata = up.MooncakeLayerwiseConnectorMetadata()
        self.connector_scheduler: Any = None
        self.connector_worker: Any = None
        if role == KVConnectorRole.SCHEDULER:
            self.connector_scheduler = HardenedLayerwiseScheduler(vllm_config, kv_cache_config, str(self.engine_id))
        elif role == KVConnectorRole.WORKER:
            self.connector_worker = HardenedLayerwiseWorker(vllm_config, kv_cache_config, str(self.engine_id))


def register() -> None:
    """Register the hardened connector with vLLM's ``KVConnectorFactory`` (idempotent)."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    if NAME not in KVConnectorFactory._registry:
        KVConnectorFactory.register_connector(NAME, __name__, NAME)
