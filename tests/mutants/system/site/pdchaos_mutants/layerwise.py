"""One mutant per guarantee of the hardened layerwise connector
(connector_patch/layerwise/ascend_connector.py): that connector with the guarantee switched off and
nothing else changed. A mutant swaps the class of the scheduler or worker side the hardened
connector built (the subclasses add no state), or the thread classes the worker starts, or changes
a setting on the built object. Runs inside a layerwise node (the conformance env) only: the node
imports it with ``--hardened-class pdchaos_mutants.layerwise:NAME --plugin-path <site>``."""

from __future__ import annotations

import httpx
from vllm_ascend.distributed.kv_transfer.kv_p2p import mooncake_layerwise_connector as up

from connector_patch.layerwise import ascend_connector as ac

FOREVER_S = 10.0 ** 6  # ~11.6 days: no deadline a run can reach (the setting has no "off")


class _Mutant(ac.HardenedMooncakeLayerwiseConnector):
    SCHEDULER: type | None = None
    WORKER: type | None = None

    def __init__(self, vllm_config, role, kv_cache_config=None):  # noqa: ANN001
        super().__init__(vllm_config, role, kv_cache_config)
        for side, cls in ((self.connector_scheduler, self.SCHEDULER), (self.connector_worker, self.WORKER)):
            if side is not None and cls is not None:
                side.__class__ = cls
                getattr(side, "mutate", lambda: None)()  # a setting changed on the built object, if any


# -- D: a request that hears no DONE/FAILED is failed by D's deadline -------------------------

class _ForeverWorker(ac.HardenedLayerwiseWorker):
    def mutate(self) -> None:
        self.recv_timeout_s = FOREVER_S  # read when register_kv_caches builds the listener


class HardenedMooncakeLayerwiseConnectorMutantNoRecvDeadline(_Mutant):
    WORKER = _ForeverWorker


# -- D: the listener answers every message and survives it ------------------------------------

class _UpstreamLoopRecv(ac.HardenedRecvingLayerThread):
    run = up.KVCacheRecvingLayerThread.run  # upstream's loop: a malformed message ends the thread


class _UpstreamLoopWorker(ac.HardenedLayerwiseWorker):
    RECV_THREAD = _UpstreamLoopRecv


class HardenedMooncakeLayerwiseConnectorMutantListenerDies(_Mutant):
    WORKER = _UpstreamLoopWorker


# -- P: a failed write fails its requests (D told FAILED) -------------------------------------

class _UpstreamSender(ac.HardenedSendingLayerThread):
    def __init__(self, *args, **kwargs):  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.engine = self.engine._inner  # no guard: a raised write escapes, a failed one is not tracked
        self.failed_reqs = set()  # upstream's set: its stale add is kept

    _handle_request = up.KVCacheSendingLayerThread._handle_request


class _UpstreamSenderWorker(ac.HardenedLayerwiseWorker):
    SEND_THREAD = _UpstreamSender


class HardenedMooncakeLayerwiseConnectorMutantUpstreamSender(_Mutant):
    WORKER = _UpstreamSenderWorker


# -- P: a request whose metadata query failed is skipped on every later layer ----------------

class _CheckOnMissWorker(ac.HardenedLayerwiseWorker):
    """The hardened fix before issue 21: the failed-request check ran only on a cache miss, so
    once another request to the same D filled the cache, the failed request's later layers went
    out and upstream's DONE raced the hardened FAILED."""

    def update_decoder_info(self, req_id, req_meta):  # noqa: ANN001, ANN201
        engine, port = req_meta.remote_engine_id, req_meta.remote_port
        hit = engine in self.remote_layer_metadata and port in self.remote_layer_metadata[engine]
        if not (hit and req_id in self._meta_failed):
            return super().update_decoder_info(req_id, req_meta)
        t = self._meta_failed.pop(req_id)
        try:
            return super().update_decoder_info(req_id, req_meta)
        finally:
            self._meta_failed[req_id] = t


class HardenedMooncakeLayerwiseConnectorMutantMetaCheckOnMiss(_Mutant):
    WORKER = _CheckOnMissWorker


# -- D: the metaserver POST is bounded, and never sent twice ----------------------------------

class _NoPostDeadlineScheduler(ac.HardenedLayerwiseScheduler):
    def mutate(self) -> None:
        self.metaserver_client.close()
        self.metaserver_client = httpx.Client(limits=httpx.Limits(max_connections=100000),
                                              timeout=httpx.Timeout(None))


class HardenedMooncakeLayerwiseConnectorMutantNoPostDeadline(_Mutant):
    SCHEDULER = _NoPostDeadlineScheduler


class _ResendScheduler(ac.HardenedLayerwiseScheduler):
    """Tries the POST again after any failure, a timeout too (upstream's way: the metaserver may
    already have the request, and the proxy then sends it to P twice)."""

    def _access_metaserver(self, url, message):  # noqa: ANN001, ANN202
        self.counters["posts"] += 1
        why = "not tried"
        for _ in range(ac.POST_TRIES):
            try:
                resp = self.metaserver_client.post(url, json=message)
                why = ac.post_failure(resp.status_code, None)
            except Exception as exc:  # noqa: BLE001
                why = ac.post_failure(None, type(exc).__name__)
            if why is None:
                return
        self.counters["post_failures"] += 1
        with self._posts_lock:
            self._failed_posts.add(str(message.get("request_id", "")))


class HardenedMooncakeLayerwiseConnectorMutantResendPost(_Mutant):
    SCHEDULER = _ResendScheduler


# -- D: a request D failed itself keeps its blocks until P cannot write them -----------------

class _NoHolds(ac.Holds):
    def hold(self, req_id, due):  # noqa: ANN001, ANN201
        """Never holds: the blocks go back at D's deadline (the fix before issue 21)."""


class _FreeAtDeadlineRecv(ac.HardenedRecvingLayerThread):
    def __init__(self, *args, **kwargs):  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.holds = _NoHolds(self.holds.grace_s)


class _FreeAtDeadlineWorker(ac.HardenedLayerwiseWorker):
    RECV_THREAD = _FreeAtDeadlineRecv


class HardenedMooncakeLayerwiseConnectorMutantFreeAtDeadline(_Mutant):
    WORKER = _FreeAtDeadlineWorker


# -- P: never starts a write past the write-by time D sent ----------------------------------

class _WritePastWriteBySender(ac.HardenedSendingLayerThread):
    def _handle_request(self, send_task):  # noqa: ANN001, ANN202
        for meta in send_task.send_request.values():
            meta.write_by = None  # as if D had sent none: every layer is written, however late
        super()._handle_request(send_task)


class _WritePastWriteByWorker(ac.HardenedLayerwiseWorker):
    SEND_THREAD = _WritePastWriteBySender


class HardenedMooncakeLayerwiseConnectorMutantWritePastWriteBy(_Mutant):
    WORKER = _WritePastWriteByWorker


# -- P: a failed write fails the requests of its own D session only --------------------------

class _StaleAddSender(ac.HardenedSendingLayerThread):
    def __init__(self, *args, **kwargs):  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.failed_reqs = set()  # upstream's set: its add of the leftover loop variable is kept


class _StaleAddWorker(ac.HardenedLayerwiseWorker):
    SEND_THREAD = _StaleAddSender


class HardenedMooncakeLayerwiseConnectorMutantStaleFailedAdd(_Mutant):
    WORKER = _StaleAddWorker


# -- start-up fixes, judged in process (tests/connector_patch/test_layerwise_worker.py): a node
#    that cannot start is a harness error in a scenario run, never a verdict, so no scenario can
#    kill these; the in-process test runs each against the case it must fail.

class StartupMutantBindErrorOnly(ac.HardenedRecvingLayerThread):
    """The listener-start fix before issue 21: only a bind error (ZMQError) before the ready event
    is caught; any other exception ends the thread with the ready event never set."""

    def run(self) -> None:
        import msgspec

        # what the fix's guarded start does first (metadata it cannot encode raises here); the
        # bind error is still caught by the guarded start below, any other exception escapes
        msgspec.msgpack.Encoder().encode(self.metadata)
        ac.HardenedRecvingLayerThread.run(self)


class StartupMutantNoSwapCheck(ac.HardenedLayerwiseWorker):
    """register_kv_caches without the assertion that the threads running are the hardened ones:
    if upstream stopped looking the classes up at call time, the swap would silently do nothing."""

    def register_kv_caches(self, kv_caches):  # noqa: ANN001, ANN201
        with ac._hardened_threads(self):
            ac.up.MooncakeLayerwiseConnectorWorker.register_kv_caches(self, kv_caches)


STARTUP_MUTANTS = ("StartupMutantBindErrorOnly", "StartupMutantNoSwapCheck")
