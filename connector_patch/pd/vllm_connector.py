"""The hardened MooncakeConnector: vLLM's own connector (vLLM 0.32.0,
``vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py``) with the fewest
methods overridden to apply the rules of :mod:`connector_patch.pd`. It imports vLLM, as do
:mod:`connector_patch.vllm_plugin` (which registers it) and the two vllm-ascend connectors
(``lookup/ascend_store.py``, ``layerwise/ascend_connector.py``); it runs inside a vLLM server, never in the
harness. DESIGN.md maps each override to the upstream path it changes and to the scenario that
shows the gap.

Selected by ``"kv_connector": "HardenedMooncakeConnector"`` in ``--kv-transfer-config``; settings in
``kv_connector_extra_config`` (:class:`connector_patch.pd.settings.Settings`): ``kv_load_timeout_ms``
(default 30000), ``quiet_wait_max_ms`` (1000; 0: quiet waiting off, see :mod:`connector_patch.quiet`),
``heartbeat_ms`` (500). Wire format unchanged: a hardened
node and an upstream one talk to each other (the abort answer is upstream's own ``err_reqs``).
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
import time
from collections import defaultdict
from typing import Any

from connector_patch.versions import require as _require_upstream

_require_upstream("HardenedMooncakeConnector")  # one line and nothing loaded on an upstream release it does not support

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

import vllm
from vllm import envs
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake import mooncake_connector as mc
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.stats import MooncakeKVConnectorStats
from vllm.logger import init_logger
from vllm.v1.request import RequestStatus

from connector_patch.pd.ledger import LoadLedger, flatten_blocks
from connector_patch.pd import patch_output_aggregator
from connector_patch.pd.pull import (GONE_FENCE_S, PeerWatch, RequesterLinks, cancel_targets, pull_socket_options,
                                     side_channel_options)
from connector_patch.pd.settle import UNSETTLED_CODES as _UNSETTLED, Settlements
from connector_patch import quiet
from connector_patch.pd.settings import FailureLog, Settings, remote_prefill_problem, summary
from connector_patch.pd.terminal import TerminalRecords
from connector_patch.pd.write import ChunkSizer, GuardedPtrs, WriteGuard, chunks as write_chunks, submit_and_wait

logger = init_logger("vllm.pdchaos.hardened_mooncake")  # under "vllm": vLLM's log format and level

NAME = "HardenedMooncakeConnector"
ABORTED_MSG = "pdchaos-aborted: P will never send this request (aborted or expired)"
QUEUED_EXPIRED_MSG = "pdchaos-expired: the pull waited in P's queue past the records it needs"
LOST_MSG = "pdchaos-lost: the pull's connection dropped before P could write"
_PULL_LINK: contextvars.ContextVar = contextvars.ContextVar("pdchaos_pull_link", default=None)  # per sender task
Status = mc.MooncakeXferResponseStatus
Response = mc.MooncakeXferResponse

_MON_EVENTS = (zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_DISCONNECTED
               | zmq.EVENT_MONITOR_STOPPED)  # the last: every event of a closed socket was delivered
_REFUSED_LIMIT = 2  # connection refused this many times in a row: nobody listens there (connector_patch/pd/pull.py)
_PEER_CODES = frozenset({"timeout", "unreachable", "peer_gone"})  # D forgets P's cached address after these
BOUND_MARGIN_S = 60.0  # upstream D's receive timeout is abort timeout + 60 s: P never writes later
CANCEL_KEY = "pdchaos_cancel"  # D -> P side channel: {"pdchaos_cancel": [transfer ids]}
CANCEL_WAIT_MS = 1000  # a cancel round waits this long for P's acknowledgement
CANCEL_EVERY_S = 2.0  # and is repeated, first after this long, then twice as long each time, until
CANCEL_EVERY_MAX_S = 16.0  # the pull settles (a P that connects again is asked at once)
DROPPED_CANCEL_ROUNDS = 3  # a load dropped before its pull opened: P is told in at most this many rounds
WRITE_CUT = -1001  # _send_blocks' result for a write P cut (not a transfer engine code): a failed write
SHUTDOWN_WRITE_WAIT_S = 2.0  # P's shutdown waits at most this long for a cut write's chunk to end
UNSETTLED_POLL_MS = 1000  # a failed pull waiting for P's last word wakes at least this often (250 before
# it failed: an abort must reach it at once); each wake costs CPU while a silent P holds it (issue 30, item 14)


class HardenedStats(MooncakeKVConnectorStats):
    """vLLM's Mooncake stats plus one entry per failure or abort, by code (``failure_codes``), which
    :class:`HardenedPromMetrics` exports as ``vllm:pdchaos_kv_failures_total{code=...}``."""

    def reset(self):
        super().reset()
        self.data["failure_codes"] = []

    def record_code(self, code: str, n: int = 1) -> None:
        with self._lock:
            self.data.setdefault("failure_codes", []).extend([code] * n)

    def is_empty(self) -> bool:
        return super().is_empty() and not self.data.get("failure_codes")

    def clone_and_reset(self) -> "HardenedStats":
        with self._lock:
            snapshot = {k: list(v) for k, v in self.data.items()}
            self.reset()
        return HardenedStats(data=snapshot)

    def aggregate(self, other):
        if not other.is_empty():
            for k, v in other.data.items():
                self.data.setdefault(k, []).extend(v)
        return self

    def reduce(self) -> dict:
        out = super().reduce()
        codes: dict[str, int] = {}
        for c in self.data.get("failure_codes", []):
            codes[c] = codes.get(c, 0) + 1
        if codes:
            out["Failures by code"] = summary(codes)
        return out


class HardenedPromMetrics(KVConnectorPromMetrics):
    """``vllm:pdchaos_kv_failures_total{code}`` from :class:`HardenedStats`' ``failure_codes``.
    Nothing of upstream's is replaced: vLLM 0.32.0's MooncakeConnector exports no Prometheus
    metric (its ``build_prom_metrics`` is the base class's, None); its stats reach vLLM's "KV
    Transfer metrics" log line, which :class:`HardenedStats` keeps (tests/connector_patch/test_pd_claims.py)."""

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._failures = self._counter_cls(
            name="vllm:pdchaos_kv_failures", labelnames=[*labelnames, "code"],
            documentation="KV transfer failures and aborts of the hardened Mooncake connector, by code "
                          "(timeout, unreachable, peer_gone, peer_error, bad_reply, unanswered, aborted, "
                          "p_aborted, p_expired, late_pull_answered, ...)")

    def observe(self, transfer_stats_data: dict, engine_idx: int = 0):
        labels = self.per_engine_labelvalues.get(engine_idx, [])
        for code in transfer_stats_data.get("failure_codes", ()):
            self._failures.labels(*labels, code).inc()


class HardenedMooncakeConnectorScheduler(mc.MooncakeConnectorScheduler):
    def __init__(self, vllm_config, engine_id, kv_cache_config):
        super().__init__(vllm_config, engine_id, kv_cache_config)
        self.failures = FailureLog()
        # D: loads in flight (request -> its blocks), and loads finished (failed or aborted) before
        # they were reported in finished_recving: the worker cancels them at P (connector_patch/pd/settle.py)
        self._loading: dict[str, frozenset[int]] = {}
        self._to_cancel: set[str] = set()
        self._eos_held: set[str] = set()  # P: EOS-answered prompts kept for D (eos_hold_ms, not 480 s)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        pending = self._reqs_need_recv.get(request.request_id)
        if pending is not None and any(pending[1]):
            self._loading[request.request_id] = flatten_blocks(pending[1])

    # Reached through HardenedMooncakeConnector.update_connector_output (MooncakeConnector keeps the
    # base class's empty one): a load reported in finished_recving is no longer in flight, so a
    # request that loaded and then finished is never cancelled at P (issue 43, 7d).
    def update_connector_output(self, connector_output):
        for rid in connector_output.finished_recving or ():
            self._loading.pop(rid, None)

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        params = request.kv_transfer_params
        if params and params.get("do_remote_prefill"):
            problem = remote_prefill_problem(params)
            if problem is not None:
                # upstream: async load promised, never started -> WAITING_FOR_REMOTE_KVS forever.
                # Here: no remote KV; D computes the prompt itself (the answer stays correct).
                params["do_remote_prefill"] = False
                self.failures.note(f"bad_params:{problem}")
                due = self.failures.due(time.monotonic())
                if due:
                    logger.warning("Hardened Mooncake: unusable kv_transfer_params, computed locally: %s",
                                   summary(due))
                return 0, False
        return super().get_num_new_matched_tokens(request, num_computed_tokens)

    def request_finished(self, request, block_ids):
        rid = request.request_id
        if self._loading.pop(rid, None) is not None:
            # D: finished (aborted, or failed: FINISHED_ERROR) before its load was reported in
            # finished_recving. vLLM keeps such a request's blocks until that report, which the
            # worker sends once P cannot write into them; P is asked to cancel meanwhile. (A load
            # that ended OK left _loading at its finished_recving: update_connector_output.)
            self._to_cancel.add(rid)
            return False, None
        return self._p_request_finished(request, block_ids)

    def _p_request_finished(self, request, block_ids):
        """Upstream keeps P's blocks for D only when P's one-token request ended FINISHED_LENGTH_CAPPED.
        When that token is EOS (FINISHED_STOPPED) it frees them at once, yet the proxy still sends
        the request to D, whose pull then waits the abort timeout for "P side ready" and fails
        (measured: a 502 after 10 s for a prompt whose greedy answer is empty). The KV of the
        prompt is complete either way, so P keeps it for D here too, but only for ``eos_hold_ms``
        (the worker's expiry), not the abort timeout: when no D ever pulls it (a proxy that answers
        from P, a client that left) upstream's 480 s of blocks per such prompt (issue 30, item 9)."""
        params = request.kv_transfer_params
        if (params and params.get("do_remote_decode") and params.get("transfer_id")
                and not params.get("do_remote_prefill") and request.status == RequestStatus.FINISHED_STOPPED
                and not self.is_kv_consumer):
            delay = any(len(group) > 0 for group in block_ids)
            if delay:
                self._reqs_need_send[request.request_id] = (request, self.get_sw_clipped_blocks(block_ids))
                self._eos_held.add(request.request_id)
            return delay, None
        return super().request_finished(request, block_ids)

    def build_connector_meta(self, scheduler_output):
        meta = super().build_connector_meta(scheduler_output)
        meta.reqs_to_cancel, self._to_cancel = self._to_cancel, set()
        meta.reqs_eos_hold, self._eos_held = self._eos_held, set()
        return meta


class HardenedMooncakeConnectorWorker(mc.MooncakeConnectorWorker):
    def __init__(self, vllm_config, engine_id, kv_cache_config):
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config
        self.settings = Settings.from_extra(extra)  # a bad value stops the node before any thread starts
        self.bound_s = float(envs.VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT) + BOUND_MARGIN_S
        # policy fail: report a failed load at its deadline (the client gets its error), free its
        # blocks once P cannot write; recompute (the blocks are refilled in place): report it then
        self.report_unsettled = vllm_config.kv_transfer_config.kv_load_failure_policy != "recompute"
        ledger_ms = self.settings.kv_load_timeout_ms if self.report_unsettled else int((self.bound_s + 5) * 1000)
        self.ledger = LoadLedger(ledger_ms)
        self.settlements = Settlements()
        self._expired_at = 0.0
        self._cancel_wanted: set[str] = set()  # aborted while pulling: their pulls cancel at once
        self._stale_engines: set[str] = set()  # P engines whose cached addresses the next pull re-queries
        self._deferred: dict[str, str] = {}  # request -> failure code held until settled (recompute)
        self._recv_q: queue.SimpleQueue[str] = queue.SimpleQueue()  # -> finished_recving (aborted loads)
        self.terminal = TerminalRecords(envs.VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT)
        self.failures = FailureLog()
        self._waiters: dict[str, int] = defaultdict(int)  # transfer id -> pulls waiting on it (P side)
        self._cancel_prefix = msgspec.msgpack.encode({CANCEL_KEY: []})[:-1]  # map header + key
        self._wake = quiet.WakeEvent()  # set on a load outcome or a served pull; wakes a quietly waiting engine
        self._links = RequesterLinks()  # P: the side channel's connections (pull.py)
        self._link_mon = None  # P: a plain socket reading the side channel's monitor without waiting
        self._writing: set[WriteGuard] = set()  # P: writes in the executor now (write.py)
        self._write_cond = threading.Condition()  # guards _writing and _writes_active (loop and executor)
        self._writes_active = 0
        self._closing = False  # P: shutdown began; no chunk starts any more
        super().__init__(vllm_config, engine_id, kv_cache_config)
        self.xfer_stats = HardenedStats()

    def _note(self, code: str, n: int = 1) -> None:
        """Count a failure or abort: the rate-limited log line and the Prometheus counter."""
        if n > 0:
            self.failures.note(code, n)
            self.xfer_stats.record_code(code, n)

    # ------------------------------------------------------------------ D: loads with a deadline
    def start_load_kv(self, metadata):
        if not self.is_kv_producer:
            if metadata.reqs_to_recv:
                now = time.monotonic()
                for pull_metas in metadata.reqs_to_recv.values():
                    for meta in pull_metas.values():
                        self.ledger.start(meta.d_req_id, meta.local_block_ids, now)
            cancel = {r: self.ledger.forget(r) for r in getattr(metadata, "reqs_to_cancel", ())}
            if cancel:
                asyncio.run_coroutine_threadsafe(self._cancelled(cancel), self.receiver_loop)
        super().start_load_kv(metadata)

    async def _cancelled(self, cancel: dict) -> None:
        """The scheduler finished these requests while their loads were in flight (aborted; or
        failed, already reported by their invalid blocks; or ended OK, see request_finished):
        True when the ledger still tracked the load (not reported yet). Each gets its
        finished_recving once P cannot write (at once when settled); its pulls ask P to cancel
        meanwhile."""
        for rid, tracked in cancel.items():
            if tracked and self.settlements.want(rid, "recv"):
                self._act(rid, "recv")
        self._cancel_wanted.update(r for r in cancel if self.settlements.is_open(r))
        self._wake.set()

    def _act(self, rid: str, todo: str | None) -> None:
        if todo == "recv":
            self._recv_q.put(rid)
        self._wake.set()

    async def _cancel_round(self, addr: str, tids: dict[str, str]) -> set[str]:
        """Ask P's side channel ``addr`` to drop these transfers (``{transfer id: request}``); the
        requests P acknowledged as not being written (a hardened P then never writes them). An
        upstream P answers ERROR: nothing acknowledged, the pull settles on P's own answer."""
        sock = self.async_zmq_ctx.socket(zmq.DEALER)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(addr)
            await sock.send(self._encoder.encode({CANCEL_KEY: sorted(tids)}))
            if not await sock.poll(CANCEL_WAIT_MS, zmq.POLLIN):
                return set()
            reply = msgspec.msgpack.decode(await sock.recv())
            acked = reply.get("cancelled") if isinstance(reply, dict) else None
            return {tids[t] for t in acked or () if isinstance(t, str) and t in tids}
        except zmq.ContextTerminated:
            return set()
        except Exception:  # noqa: BLE001 - best effort: an ERROR reply or garbage acknowledges nothing
            return set()
        finally:
            sock.close(linger=0)

    async def _tell_dropped(self, addr: str, tids: dict[str, str]) -> None:
        """Ask P's side channel ``addr`` to drop transfers D never pulled (given up while the
        bootstrap query was out): a hardened P frees the prompt's blocks at once instead of at its
        abort timeout. Best effort, a few rounds (0, 2, 6 s) until acknowledged; nothing waits on it."""
        wait = CANCEL_EVERY_S
        for attempt in range(DROPPED_CANCEL_ROUNDS):
            if attempt:
                await asyncio.sleep(wait)
                wait *= 2
            if await self._cancel_round(addr, tids):
                return

    def receive_kv(self, remote_engine_id, pull_metas):
        """As upstream (the same P workers: the paired TP ranks, the matching PP ranks), and each
        load is opened in the settlements with exactly the side channels it pulls from; a load
        whose blocks the scheduler already gave up (aborted, or failed at its deadline, while the
        bootstrap query was out: upstream pulls into them all the same) is not pulled at all."""
        remote_tp_ranks = self.transfer_topo.handshake_target_ranks(self._tp_size[remote_engine_id])
        worker_addrs: list[str] = []
        for remote_tp_rank in remote_tp_ranks:
            pp_to_addr = self._remote_agents[remote_engine_id][remote_tp_rank]
            if self.pp_size == len(pp_to_addr) and self.pp_rank in pp_to_addr:
                pp_ranks = [self.pp_rank]
            else:
                pp_ranks = sorted(pp_to_addr)
            worker_addrs.extend(pp_to_addr[pp_rank] for pp_rank in pp_ranks)
        if not worker_addrs:
            self._fail(pull_metas, list(pull_metas), "unknown_engine")
            return
        live = {}
        for rid, pull_meta in pull_metas.items():
            pull_meta.pull_tasks_count = len(worker_addrs)
            # refused when the scheduler gave the blocks up before this pull could open (an abort or
            # the load deadline while P's bootstrap query was out): they may be another request's now
            if self.settlements.opened(rid, worker_addrs):
                live[rid] = pull_meta
        dropped = len(pull_metas) - len(live)
        if dropped:
            gone = set(pull_metas) - set(live)
            self._cancel_wanted.difference_update(gone)
            self._note("pull_dropped", dropped)
            self._log_due()
            # P kept (or will keep) the prompt's blocks for this transfer until its abort timeout:
            # nothing else would tell it that no pull comes (issue 43, 7b)
            tids = {pull_metas[r].transfer_id: r for r in gone}
            for addr in worker_addrs:
                asyncio.create_task(self._tell_dropped(addr, tids))
        if not live:
            return
        for worker_addr in worker_addrs:
            asyncio.create_task(self.receive_kv_from_single_worker(worker_addr, live))

    def _settled(self, req_ids, addr: str) -> None:
        """The pull of each to P's side channel ``addr`` settled: P will not write for it any more."""
        now = time.monotonic()
        for rid in req_ids:
            todo = self.settlements.settle(rid, addr, now)
            if not self.settlements.is_open(rid):
                code = self._deferred.pop(rid, None)
                if code is not None:
                    self.ledger.fail(rid, f"settled_{code}")  # recompute: now nothing can overwrite it
            if todo:
                self._act(rid, todo)

    def _fail(self, pull_metas, req_ids, code: str) -> None:
        """Fail these pulls once each (seed 001's rule: a failed request is never completed by a
        later OK); the ledger reports them to the scheduler at the next step (with policy
        recompute and P possibly still writing: once the pull settles)."""
        for req_id in req_ids:
            meta = pull_metas.get(req_id)
            if meta is None or meta.failed:
                continue
            meta.failed = True
            if self.ledger.tracked(meta.d_req_id):  # not yet reported (e.g. by its deadline)
                self.xfer_stats.record_failed_recv()
                self._note(code)
            if code in _UNSETTLED and not self.report_unsettled and self.settlements.is_open(meta.d_req_id):
                self._deferred[meta.d_req_id] = code
            else:
                self.ledger.fail(meta.d_req_id, code)
        self._wake.set()

    def _handle_failed_recv(self, pull_metas, req_ids, reason: str) -> None:
        # upstream callers: an unknown engine after the bootstrap query, a P that said ERROR
        code = "unknown_engine" if reason.startswith("remote engine_id") else "peer_error"
        self._fail(pull_metas, req_ids, code)

    def _forget_peer(self, engine_id: str) -> None:
        """P's cached side-channel addresses are marked stale: the next pull asks the bootstrap
        server again, so a P restarted under the same engine id (on new ports) is found. Marked,
        not removed: upstream checks the engine right after its bootstrap query, and a removal by
        another pull's failure in between (at an await of the query) failed a healthy load as
        unknown_engine (seen on CI under pd-abort-all-under-load)."""
        if engine_id != self.engine_id:
            self._stale_engines.add(engine_id)

    async def _start_load_kv(self, reqs_to_recv):
        """As upstream, but an engine marked stale is asked for again, like an unknown one."""
        for remote_engine_id, pull_metas in reqs_to_recv.items():
            if remote_engine_id not in self._remote_agents or remote_engine_id in self._stale_engines:
                asyncio.create_task(self.handle_new_engine_id(remote_engine_id, pull_metas))
            else:
                self.receive_kv(remote_engine_id, pull_metas)

    async def _connect_to_prefiller_bootstrap(self, remote_bootstrap_addr: str):
        """As upstream; the engines the bootstrap server answered with are fresh again."""
        before = dict(self._remote_agents)  # upstream stores a new mapping for each engine answered
        await super()._connect_to_prefiller_bootstrap(remote_bootstrap_addr)
        self._stale_engines -= {e for e, v in self._remote_agents.items() if before.get(e) is not v}

    def _xfer_request(self, pull_metas) -> mc.MooncakeXferMetadata:
        return mc.MooncakeXferMetadata(  # as upstream builds it
            remote_hostname=self.hostname, remote_port=self.rpc_port, remote_tp_size=self.tp_size,
            remote_tp_rank=self.tp_rank, remote_pp_size=self.pp_size,
            req_blocks={rid: (m.transfer_id, m.local_block_ids) for rid, m in pull_metas.items()},
            kv_caches_base_addr=self.kv_caches_base_addr, block_lens=self.block_len_per_layer,
            kv_block_lens=self.kv_block_len_per_layer, registered_layer_names=self.registered_layer_names,
            registered_layer_indices=self.registered_layer_indices,
            registered_group_indices=self.registered_group_indices,
            registered_shared_group_ids=[list(g) for g in self.region_shared_groups],
            registered_row_offsets=self.region_row_offsets)

    async def receive_kv_from_single_worker(self, worker_addr, pull_metas):
        """Upstream waits on the DEALER's RCVTIMEO (abort timeout + 60 s: 540 s by default) for a
        dead, frozen, partitioned or silent P, and forever for a FINISH that does not name its
        request. Here the load fails at its deadline at the latest, earlier when the socket monitor
        sees that nobody listens at P's address (refused twice) or that the connection died
        (closed, or 3 heartbeats missed); a FINISH that leaves an asked request unnamed fails it;
        after a peer failure P's cached addresses are marked stale (:meth:`_forget_peer`). When P
        may still write (timeout, connection lost, request aborted), the pull keeps listening and
        asks P to cancel (after 2 s, then twice as long each time up to 16 s; at once when P
        connects again); it settles on P's last word, P's acknowledgement, a refused
        port, or the bound (abort timeout + 60 s after the pull)."""
        req_ids = set(pull_metas)
        engine_id = next(iter(pull_metas.values())).remote_engine_id
        t0 = time.monotonic()
        deadline = t0 + self.settings.kv_load_timeout_ms / 1000.0 + 0.25  # the ledger reports at its own
        bound = t0 + self.bound_s
        named: set[str] = set()
        code: str | None = None  # the failure of this pull, once known
        unsettled = False  # P may still write: listen on, cancel
        failed_here = False  # this pull's own failure (code) was reported
        settled = False
        unreached = False  # failed before it ever connected: closed first, then the monitor is asked
        reached = False  # ... and it connected as it was closed after all
        next_cancel = 0.0
        cancel_every = CANCEL_EVERY_S
        sock = self.async_zmq_ctx.socket(zmq.DEALER)
        mon = None
        try:
            for opt, value in pull_socket_options(self.settings.heartbeat_ms, self.settings.heartbeat_timeout_ms):
                sock.setsockopt(getattr(zmq, opt), value)
            mon = sock.get_monitor_socket(_MON_EVENTS)
            sock.connect(worker_addr)
            await sock.send(self._encoder.encode(self._xfer_request(pull_metas)))
            poller = zmq.asyncio.Poller()
            poller.register(sock, zmq.POLLIN)
            poller.register(mon, zmq.POLLIN)
            # once P got the pull, "gone" waits GONE_FENCE_S after the first refusal: P's write has
            # ended or been cut by then (pull.py, write.py; issue 43, 7a)
            watch = PeerWatch(_REFUSED_LIMIT, self.settings.heartbeat_timeout_ms / 1000.0, GONE_FENCE_S)
            while not settled:
                now = time.monotonic()
                if code is None and now >= deadline:
                    code = "timeout"
                if code is not None and not watch.ever_connected and await self._never_connected(mon, watch):
                    # The pull failed and has not connected: closed below with linger 0, it never
                    # will, and it goes out only on an established connection. Once the monitor
                    # confirms that no connection came before the close, P never got it and can
                    # never write for it: a blackholed P (no refusal ever comes) no longer holds
                    # the blocks to the bound (issue 43, 7f)
                    unreached = settled = True
                    break
                if code in _UNSETTLED and not failed_here:
                    failed_here = unsettled = True  # fail the loads now (policy fail), settle them later
                    self._fail(pull_metas, req_ids - named, code)
                    if code in _PEER_CODES:  # an abort alone says nothing about P
                        self._forget_peer(engine_id)
                if not unsettled and req_ids & self._cancel_wanted:
                    unsettled = True  # the aborted ones are cancelled; the others go on
                if now >= bound:
                    break  # upstream's own bound: P has given up writing by now
                # a pull P never got needs no cancel (its loads settle when it fails, above); one
                # that connects later is asked at once (EVENT_CONNECTED)
                cancelling = unsettled and watch.ever_connected
                if cancelling and now >= next_cancel:
                    next_cancel = now + cancel_every
                    cancel_every = min(cancel_every * 2, CANCEL_EVERY_MAX_S)
                    doomed = cancel_targets(req_ids, code is not None, self._cancel_wanted)
                    open_ids = {pull_metas[r].transfer_id: r for r in doomed
                                if self.settlements.is_open(r, worker_addr)}
                    acked = await self._cancel_round(worker_addr, open_ids) if open_ids else set()
                    self._settled(acked, worker_addr)
                    if not any(self.settlements.is_open(r, worker_addr) for r in req_ids):
                        settled = True
                        break
                    continue
                until = min(deadline if code is None else bound, next_cancel if cancelling else bound)
                gone_at = watch.gone_at()
                if gone_at is not None:
                    until = min(until, gone_at)
                cap = UNSETTLED_POLL_MS if unsettled else 250
                ready = dict(await poller.poll(timeout=max(1, min(cap, int((until - now) * 1000)))))
                if mon in ready:
                    ev = parse_monitor_message(await mon.recv_multipart())["event"]
                    t_ev = time.monotonic()
                    if ev == zmq.EVENT_CONNECTED:
                        watch.on_connected(t_ev)
                        if unsettled:  # reached again: cancel now, and often again
                            next_cancel, cancel_every = 0.0, CANCEL_EVERY_S
                    elif ev == zmq.EVENT_CONNECT_RETRIED:
                        watch.on_retried(t_ev)
                    elif ev == zmq.EVENT_DISCONNECTED:
                        watch.on_disconnected(t_ev)
                        code = code or "peer_gone"
                if watch.gone(time.monotonic()) and not settled:
                    # nobody listens at P's side channel: P (and its transfer engine) is gone
                    code = code or "unreachable"
                    settled = True
                if sock in ready and not settled:
                    got = self._on_reply(await sock.recv(), req_ids, named, pull_metas, worker_addr)
                    if got is not None:  # P's last word: FINISH ("") or a failure it reported
                        code = code or got or None
                        settled = True
        except zmq.ContextTerminated:
            return
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a transfer error fails this pull, never the thread
            code = code or "transfer_error"
        finally:
            if unreached:
                sock.close(linger=0)  # first: nothing it holds leaves after this
                reached = await self._connected_before_close(mon)
                mon.close(linger=0)
            else:
                if mon is not None:
                    try:
                        sock.disable_monitor()
                    except zmq.ZMQError:
                        pass
                    mon.close(linger=0)
                sock.close(linger=0)
        if unreached and not reached:
            self._note("pull_never_connected")
        elif reached:  # connected as it was given up: P may have the pull; it settles on P's word
            self._note("pull_connected_at_close")
            await self._cancel_until_acknowledged(worker_addr, pull_metas, req_ids, bound)
        self._cancel_wanted.difference_update(req_ids)
        self._settled(req_ids, worker_addr)  # first: a failure reported below then frees at once
        if code:
            self._fail(pull_metas, req_ids - named, code)
            if code in _PEER_CODES:
                self._forget_peer(engine_id)
        self._log_due()

    @staticmethod
    async def _connected_before_close(mon, wait_s: float = 2.0) -> bool:
        """After the pull socket closed: whether its monitor reported a connection before it
        stopped (libzmq delivers a closed socket's events, then MONITOR_STOPPED). No word within
        ``wait_s``: it may have connected."""
        connected, end = False, time.monotonic() + wait_s
        while True:
            left = end - time.monotonic()
            if left <= 0 or not await mon.poll(max(1, int(left * 1000)), zmq.POLLIN):
                return True
            ev = parse_monitor_message(await mon.recv_multipart())["event"]
            if ev == zmq.EVENT_CONNECTED:
                connected = True
            elif ev == zmq.EVENT_MONITOR_STOPPED:
                return connected

    async def _cancel_until_acknowledged(self, addr: str, pull_metas, req_ids: set, bound: float) -> None:
        """A pull that may have reached P although its socket is closed: ask P to cancel it (2, 4,
        8, 16 s apart) until P acknowledged every request or the bound passed."""
        wait = CANCEL_EVERY_S
        while time.monotonic() < bound:
            open_ids = {pull_metas[r].transfer_id: r for r in req_ids if self.settlements.is_open(r, addr)}
            if not open_ids:
                return
            self._settled(await self._cancel_round(addr, open_ids), addr)
            if not any(self.settlements.is_open(r, addr) for r in req_ids):
                return
            await asyncio.sleep(min(wait, max(0.0, bound - time.monotonic())))
            wait = min(wait * 2, CANCEL_EVERY_MAX_S)

    @staticmethod
    async def _never_connected(mon, watch: PeerWatch) -> bool:
        """Apply the pull socket's monitor events queued so far; whether it still never connected."""
        while True:
            try:
                ev = parse_monitor_message(await mon.recv_multipart(zmq.NOBLOCK))["event"]
            except zmq.Again:
                return not watch.ever_connected
            t_ev = time.monotonic()
            if ev == zmq.EVENT_CONNECTED:
                watch.on_connected(t_ev)
            elif ev == zmq.EVENT_CONNECT_RETRIED:
                watch.on_retried(t_ev)
            elif ev == zmq.EVENT_DISCONNECTED:
                watch.on_disconnected(t_ev)

    def _on_reply(self, raw: bytes, req_ids: set, named: set, pull_metas, addr: str = "") -> str | None:
        """Apply one reply of P. Returns None to keep reading, "" when the pull is over, or a
        failure code for the asked requests not answered yet."""
        try:
            resp = self._xfer_resp_decoder.decode(raw)
        except Exception:  # noqa: BLE001 - any undecodable reply
            return "bad_reply"
        if resp.status == Status.ERROR:
            return "peer_error"
        for rid in resp.ok_reqs or ():
            if rid not in req_ids:
                self._note("reply_names_unasked")
                continue
            if rid in named:  # this P rank answered it already: one answer per rank counts (issue 43, 7e)
                continue
            named.add(rid)
            # P wrote it and said so: this pull is settled for it (P never writes a sent transfer
            # again), so a later failure of the pull cancels only its open siblings (issue 43, item 5)
            self._settled([rid], addr)
            meta = pull_metas[rid]
            if meta.failed:
                continue
            meta.pull_tasks_count -= 1
            if meta.pull_tasks_count <= 0:
                self.ledger.ok(meta.d_req_id)
                self._wake.set()
        errs = [rid for rid in (resp.err_reqs or ()) if rid in req_ids]
        if len(errs) < len(resp.err_reqs or ()):
            self._note("reply_names_unasked")
        if errs:
            named.update(errs)
            aborted = (resp.err_msg or "").startswith("pdchaos-aborted")
            self._settled(errs, addr)  # P's last word for them: settled before the failure is reported
            self._fail(pull_metas, errs, "aborted" if aborted else "peer_error")
        if resp.status == Status.FINISH:
            unnamed = req_ids - named
            if unnamed:  # upstream: these wait forever
                named.update(unnamed)
                self._settled(unnamed, addr)
                self._fail(pull_metas, unnamed, "unanswered")
            return ""
        return None

    def get_transfer_results(self):
        res = super().get_transfer_results()
        while True:
            try:
                res.finished_recving.add(self._recv_q.get_nowait())
            except queue.Empty:
                break
        rep = self.ledger.collect(time.monotonic())
        due = self.ledger.next_deadline()
        if due is not None:  # a quietly waiting engine steps at the deadline, not up to its cap later
            quiet.wake_at(due)
        if rep.finished:
            # a failed load's error goes out now (its invalid blocks: vLLM fails the request and
            # keeps its blocks); its finished_recving, which frees them, once P cannot write
            res.finished_recving |= rep.finished - rep.failed_ids
            for rid in rep.failed_ids:
                if self.settlements.want(rid, "recv"):
                    res.finished_recving.add(rid)
            if rep.failed_ids:
                if self._is_hma_required:  # block ids are per group: report the requests
                    res.failed_recving |= rep.failed_ids
                else:
                    self._invalid_block_ids.put(set(rep.failed_blocks))
            n = rep.failures.get("timeout", 0)  # the others were counted where they happened
            self._note("timeout", n)
            for _ in range(n):
                self.xfer_stats.record_failed_recv()
        if self.settlements and time.monotonic() - self._expired_at > 10.0:
            self._expired_at = time.monotonic()
            self.settlements.expire(self._expired_at)  # loads that ended OK are never asked about
        self._log_due()
        return res

    def _log_due(self) -> None:
        due = self.failures.due(time.monotonic())
        if due:
            logger.warning("Hardened Mooncake: KV transfer failures and aborts since last report: %s", summary(due))

    # ------------------------------------------------------------------ P: answer, never make D wait
    async def record_send_reqs(self, metadata):
        """Upstream forgets an aborted request's transfer id, so a pull waiting for it (or coming
        later) waits the abort timeout for "P side ready" (pd-stop-decode-past-abort-timeout,
        26 s). Here it is a terminal record: a waiting pull is answered at once, a late one too."""
        not_processed = set(metadata.reqs_not_processed)
        metadata.reqs_not_processed = set()
        eos = {metadata.reqs_to_send[r][0]: r for r in getattr(metadata, "reqs_eos_hold", ())
               if r in metadata.reqs_to_send}  # transfer id -> P's request
        now = time.monotonic()
        forgotten = 0
        for p_req_id, (tid, blocks) in list(metadata.reqs_to_send.items()):
            if self.terminal.lookup(tid, now):
                pass  # D cancelled it before P finished: nobody will pull
            elif blocks and tid not in self.reqs_need_send:
                # Only a cancel or an abort drops the entry before P's prefill ends, and its
                # terminal record is gone by now (older than its TTL, or pushed out by 4096 later
                # ones while P was overloaded). Upstream would raise KeyError here: these blocks,
                # and every later entry of the batch, would be held for good.
                self.terminal.record(tid, "cancelled", now)  # a late pull is answered at once
                forgotten += 1
            else:
                continue
            del metadata.reqs_to_send[p_req_id]
            if blocks:
                self.finished_sending_reqs.add(p_req_id)  # P frees its blocks at once
        self._note("p_forgotten_freed", forgotten)
        try:
            await super().record_send_reqs(metadata)
        finally:
            metadata.reqs_not_processed = not_processed
        if eos:
            until = time.perf_counter() + self.settings.eos_hold_ms / 1000.0  # upstream's expiry clock
            for tid, p_req_id in eos.items():
                meta = self.reqs_need_send.get(tid)
                if meta is not None and meta.p_req_id == p_req_id and meta.expire_time > until:
                    meta.expire_time = until
        now = time.monotonic()
        for tid in not_processed:
            self.terminal.record(tid, "aborted", now)
            self._note("p_aborted")
            meta = self.reqs_need_send.get(tid)
            if meta is None:
                continue  # upstream would raise KeyError here and drop the rest of this batch
            if self._waiters.get(tid):
                meta.pdchaos_aborted = True
                meta.ready.set()  # the waiting pull goes on and answers err (_build_transfer_params)
            else:
                del self.reqs_need_send[tid]

    async def send_kv_to_decode(self, identity, sock, meta):
        now = time.monotonic()
        dead = [d for d, (tid, _) in meta.req_blocks.items() if self.terminal.lookup(tid, now)]
        if dead:
            live = {d: v for d, v in meta.req_blocks.items() if d not in set(dead)}
            resp = Response(status=Status.CONTINUE if live else Status.FINISH, err_reqs=dead, err_msg=ABORTED_MSG)
            await sock.send_multipart((identity, self._encoder.encode(resp)))
            self._note("late_pull_answered", len(dead))
            if not live:
                return
            meta.req_blocks = live
        tids = [tid for tid, _ in meta.req_blocks.values()]
        for tid in tids:
            self._waiters[tid] += 1
        try:
            await super().send_kv_to_decode(identity, sock, meta)
        finally:
            self._wake.set()  # an idle step may report finished_sending now, not after its sleep
            for tid in tids:
                self._waiters[tid] -= 1
                if self._waiters[tid] <= 0:
                    del self._waiters[tid]
                    m = self.reqs_need_send.get(tid)
                    if m is not None and getattr(m, "pdchaos_aborted", False):
                        del self.reqs_need_send[tid]
                        if _holds_blocks(m):  # cancelled as P's prefill ended: nobody pulls them
                            self.finished_sending_reqs.add(m.p_req_id)

    async def _build_transfer_params(self, ready_reqs, *args, **kwargs):
        """Right before P writes: a request aborted or cancelled meanwhile is answered, not written;
        so is every request of a pull whose connection dropped (its answer can no longer reach D,
        and D may have read P as gone and freed the blocks: issue 30, item 4). The write itself
        carries a guard (write.py): cut before its next chunk if that connection drops while it
        runs, or P shuts down (issue 43, 7a)."""
        self._read_links()
        link = _PULL_LINK.get()
        if ready_reqs and self._links.lost(link):
            self._lost(ready_reqs)
            return [], [], [], [d for d, _ in ready_reqs], LOST_MSG
        aborted = [(d, m) for d, m in ready_reqs if getattr(m, "pdchaos_aborted", False)]
        live = [(d, m) for d, m in ready_reqs if not getattr(m, "pdchaos_aborted", False)]
        src, dst, lengths, err_reqs, err_msg = await super()._build_transfer_params(live, *args, **kwargs)
        if aborted:
            err_reqs = list(err_reqs) + [d for d, _ in aborted]
            err_msg = ABORTED_MSG if err_msg is None else f"{ABORTED_MSG}; {err_msg}"
        if src:  # upstream hands these to _send_blocks next, in the executor, with no await between
            errs = set(err_reqs)
            guard = WriteGuard(link, [m for d, m in live if d not in errs])
            src = GuardedPtrs(src)
            src.guard = guard
            with self._write_cond:
                self._writing.add(guard)
            if self._links.lost(link):  # dropped during the await above
                self._cut(guard, "requester_lost")
        return src, dst, lengths, err_reqs, err_msg

    def _lost(self, ready_reqs) -> None:
        """These requests' pull lost its connection: never written from now on (a pull on a new
        connection is answered at once), P's blocks freed once no pull waits on them."""
        now = time.monotonic()
        for _, m in ready_reqs:
            self.terminal.record(m.transfer_id, "cancelled", now)
            m.pdchaos_aborted = True
        self._note("p_requester_lost", len(ready_reqs))

    def _cut(self, guard: WriteGuard, reason: str) -> None:
        """Cut a write in the executor before its next chunk (on P's sender loop)."""
        if guard.cut(reason) and reason == "requester_lost":
            self._lost([(None, m) for m in guard.metas])

    def _send_blocks(self, remote_session, src_ptrs, dst_ptrs, lengths) -> int:
        """Upstream's write (in P's sender executor), in chunks (write.py): before each, the write's
        guard is asked; a cut write stops there and fails (WRITE_CUT), as a transfer engine error
        does. Nothing is logged per write (upstream's lines carry D's address); counted instead."""
        guard = getattr(src_ptrs, "guard", None)
        with self._write_cond:
            self._writes_active += 1
        try:
            t0 = time.perf_counter()
            sizer = ChunkSizer()
            ret = 0
            for c_src, c_dst, c_len in write_chunks(list(src_ptrs), dst_ptrs, lengths, sizer):
                if self._closing or (guard is not None and guard.is_cut()):
                    ret = WRITE_CUT
                    break
                t = time.perf_counter()
                ret = self._write_chunk(remote_session, c_src, c_dst, c_len)
                if ret != 0:
                    break
                sizer.wrote(sum(c_len), time.perf_counter() - t)
            if ret == 0:
                self.xfer_stats.record_transfer(duration_s=time.perf_counter() - t0, total_bytes=sum(lengths),
                                                num_descs=len(src_ptrs))
            else:
                self.xfer_stats.record_failed_transfer()
                self._note("p_write_cut" if ret == WRITE_CUT else "p_write_failed")
            return ret
        finally:
            with self._write_cond:
                self._writing.discard(guard)
                self._writes_active -= 1
                self._write_cond.notify_all()

    def _write_chunk(self, remote_session, c_src, c_dst, c_len) -> int:
        """One chunk: submitted and waited for with sleeps (write.submit_and_wait), so a write that
        waits on a D taking no bytes costs P next to no CPU; an engine without the async calls
        (a Mooncake older than them) writes it with upstream's sync call."""
        eng = self.engine
        if hasattr(eng, "transfer_submit_write") and hasattr(eng, "transfer_check_status"):
            return submit_and_wait(eng, remote_session, c_src, c_dst, c_len)
        return eng.batch_transfer_sync_write(remote_session, c_src, c_dst, c_len)

    def shutdown(self):
        """P: the writes in the executor are cut before their next chunk, and waited for (at most
        SHUTDOWN_WRITE_WAIT_S), before upstream's shutdown terminates the ZMQ context. That closes
        the side channel, whose refusals D reads as P gone; upstream left the executor writing on
        after it (shutdown(wait=False)), into blocks D may free by then (issue 43, 7a)."""
        cond = getattr(self, "_write_cond", None)
        if cond is not None:
            self._closing = True
            with cond:
                guards = list(self._writing)
            for g in guards:
                g.cut("shutdown")
            with cond:
                cond.wait_for(lambda: self._writes_active <= 0, timeout=SHUTDOWN_WRITE_WAIT_S)
        super().shutdown()

    async def _watch_links(self, amon) -> None:
        """Read the side channel's monitor as its events come. Read only when a pull arrived, its
        unread events (two per connection: D's cancel rounds each use a new one) filled the monitor
        pipe after ~1000 and blocked libzmq's I/O thread: P accepted and received nothing more, and
        the pull that would have drained them never came (issue 43, 7c)."""
        while self._link_mon is not None:
            await amon.poll(flags=zmq.POLLIN)
            self._read_links()

    def _read_links(self) -> None:
        """Apply the side channel's monitor events received so far (never waits)."""
        mon = self._link_mon
        while mon is not None:
            try:
                msg = parse_monitor_message(mon.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            except zmq.ZMQError:
                return  # closed with the listener
            if msg["event"] == zmq.EVENT_ACCEPTED:
                self._links.on_accepted(int(msg["value"]))
            elif msg["event"] == zmq.EVENT_DISCONNECTED:
                self._links.on_disconnected(int(msg["value"]))
                with self._write_cond:
                    writing = list(self._writing)
                for guard in writing:  # a write whose requester dropped stops at its next chunk
                    if self._links.lost(guard.link):
                        self._cut(guard, "requester_lost")

    async def fetch_finished_sending_reqs(self):
        now = time.perf_counter()
        expiring = [tid for tid, m in self.reqs_need_send.items()
                    if m.p_req_id and m.expire_time < now and m.sending == 0]
        out = await super().fetch_finished_sending_reqs()
        mono = time.monotonic()
        for tid in expiring:
            if tid not in self.reqs_need_send:
                self.terminal.record(tid, "expired", mono)
                self._note("p_expired")
        return out

    def _on_cancel(self, payload: bytes) -> list[str]:
        """D gave up these transfers: P never sends them. A pull waiting for one is answered at once
        (aborted); blocks P kept for one are freed at once; one P is still computing is freed when
        it finishes (record_send_reqs); a transfer being written goes on and its pull answers."""
        try:
            tids = msgspec.msgpack.decode(payload)[CANCEL_KEY]
            tids = [t for t in tids if isinstance(t, str)][:4096]
        except Exception:  # noqa: BLE001 - a malformed cancel cancels nothing
            self._note("bad_cancel")
            return []
        now = time.monotonic()
        acked = []
        for tid in tids:
            meta = self.reqs_need_send.get(tid)
            if meta is not None and meta.sending:
                continue  # being written: not acknowledged; D asks again, its pull gets the answer
            if meta is None and self._waiters.get(tid):
                continue  # sent and forgotten by one pull while another for it may still write
            self.terminal.record(tid, "cancelled", now)  # never sent from now on
            acked.append(tid)
            if meta is None:
                continue
            if self._waiters.get(tid):
                meta.pdchaos_aborted = True
                meta.ready.set()
            else:
                del self.reqs_need_send[tid]
                if _holds_blocks(meta):
                    self.finished_sending_reqs.add(meta.p_req_id)
        self._note("p_cancelled", len(acked))
        return acked

    async def _sender_worker(self, sock):
        """As upstream's, for what the hardened listener queues (identity, payload, received at): a
        pull that waited in the queue while a terminal record it may need was lost (expired, or
        pushed out by newer ones) is answered ERROR, never served. Otherwise a cancel P acknowledged
        while the pull waited (every sender task busy on other prefills) could be forgotten, and the
        pull, served late, would wait for P's prefill and then write into blocks D freed on the
        acknowledgement (issue 30, item 10)."""
        while True:
            try:
                identity, payload, t_recv, link = await self.sender_worker_queue.get()
                _PULL_LINK.set(link)  # this task's pull: _build_transfer_params checks its connection
                try:
                    if self.terminal.lost_since(t_recv, time.monotonic()):
                        self._note("queued_pull_expired")
                        resp = Response(status=Status.ERROR, err_msg=QUEUED_EXPIRED_MSG)
                        await sock.send_multipart((identity, self._encoder.encode(resp)))
                        continue
                    await self.send_kv_to_decode(identity, sock, self._xfer_meta_decoder.decode(payload))
                except Exception as e:  # noqa: BLE001 - as upstream: an ERROR answer, the task goes on
                    logger.error("Hardened Mooncake: side-channel request failed (%s)", type(e).__name__)
                    resp = Response(status=Status.ERROR, err_msg=type(e).__name__)
                    await sock.send_multipart((identity, self._encoder.encode(resp)))
                finally:
                    self.sender_worker_queue.task_done()
            except asyncio.CancelledError:
                break
            except Exception as e:  # noqa: BLE001 - never ends the task
                logger.error("Hardened Mooncake: sender task error (%s)", type(e).__name__)

    async def _mooncake_sender_listener(self, ready_event):
        """As upstream, but a message that is not [identity, payload] gets an ERROR reply and the
        listener goes on (upstream's unpacking raises and the listener thread exits for good)."""
        sock = self.async_zmq_ctx.socket(zmq.ROUTER)
        for opt, value in side_channel_options():  # pull.py says why
            sock.setsockopt(getattr(zmq, opt), value)
        mon_addr = f"inproc://pdchaos-side-channel-{id(self)}"
        sock.monitor(mon_addr, zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        amon = self.async_zmq_ctx.socket(zmq.PAIR)
        amon.connect(mon_addr)
        self._link_mon = zmq.Socket.shadow(amon.underlying)  # plain reads that never wait (_read_links)
        self.side_channel_port = sock.bind_to_random_port(f"tcp://{self.hostname}")
        await self.register_worker_with_bootstrap()
        tasks = [asyncio.create_task(self._sender_worker(sock)) for _ in range(self.num_sender_tasks)]
        tasks.append(asyncio.create_task(self._watch_links(amon)))
        ready_event.set()
        try:
            while True:
                try:
                    parts = await sock.recv_multipart(copy=False)
                    fd = parts[-1].get(zmq.SRCFD) if parts else None  # the connection it came on
                    frames = [f.bytes for f in parts]
                    if len(frames) == 2 and frames[1].startswith(self._cancel_prefix):
                        acked = self._on_cancel(frames[1])
                        await sock.send_multipart((frames[0], self._encoder.encode({"cancelled": acked})))
                        continue
                    if len(frames) != 2:
                        self._note("bad_request_frames")
                        nack = Response(status=Status.ERROR, err_msg=f"expected 2 frames, got {len(frames)}")
                        await sock.send_multipart((frames[0], self._encoder.encode(nack)))
                        continue
                    self._read_links()
                    await self.sender_worker_queue.put((frames[0], frames[1], time.monotonic(),
                                                        self._links.tag(fd)))
                except (zmq.ContextTerminated, asyncio.CancelledError):
                    raise
                except Exception as e:  # noqa: BLE001 - one bad message never ends the listener
                    self._note("listener_error")
                    logger.warning("Hardened Mooncake: side-channel message dropped (%s)", type(e).__name__)
        except zmq.ContextTerminated:
            pass
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._link_mon = None
            try:
                sock.disable_monitor()
            except zmq.ZMQError:
                pass
            amon.close(linger=0)
            sock.close()


def _holds_blocks(meta) -> bool:  # noqa: ANN001 - upstream's SendBlockMeta
    """P's scheduler handed its worker this request's blocks (request_finished): they stay held
    until the worker reports the request in finished_sending. A meta with no blocks is a prefill
    still running (its blocks come later, with the transfer id already terminal) or one P itself
    aborted (reqs_not_processed: P's scheduler frees those); ``ready`` alone says neither, as a
    cancel or abort sets it to wake a waiting pull."""
    return bool(meta.p_req_id) and bool(meta.local_block_ids)


class HardenedMooncakeConnector(mc.MooncakeConnector):
    """vLLM's MooncakeConnector with the hardened scheduler and worker sides."""

    def __init__(self, vllm_config, role, kv_cache_config):
        KVConnectorBase_V1.__init__(self, vllm_config, role, kv_cache_config)
        assert vllm_config.kv_transfer_config is not None
        assert vllm_config.kv_transfer_config.engine_id is not None
        self.engine_id = vllm_config.kv_transfer_config.engine_id
        self.connector_scheduler = None
        self.connector_worker = None
        # the engine core (scheduler side) and each worker: quiet waiting in this process
        settings = Settings.from_extra(vllm_config.kv_transfer_config.kv_connector_extra_config)
        logger.info("Hardened Mooncake: %s", quiet.install(settings.quiet_wait_max_ms,
                                                           "engine" if role == KVConnectorRole.SCHEDULER
                                                           else "worker"))
        if role == KVConnectorRole.SCHEDULER and settings.aggregate_failed_early:
            # the engine core process, where the executor aggregates its workers' outputs
            logger.info("Hardened Mooncake: %s", patch_output_aggregator.install(vllm.__version__))
        if role == KVConnectorRole.SCHEDULER:
            self.connector_scheduler = HardenedMooncakeConnectorScheduler(vllm_config, self.engine_id,
                                                                          kv_cache_config)
        elif role == KVConnectorRole.WORKER:
            self.connector_worker = HardenedMooncakeConnectorWorker(vllm_config, self.engine_id, kv_cache_config)

    def update_connector_output(self, connector_output):
        super().update_connector_output(connector_output)
        if self.connector_scheduler is not None:
            self.connector_scheduler.update_connector_output(connector_output)

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return HardenedStats(data=data or {})

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return HardenedPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def get_transfer_results(self, finished_req_ids: set[str]) -> Any:
        assert self.connector_worker is not None
        return self.connector_worker.get_transfer_results()
