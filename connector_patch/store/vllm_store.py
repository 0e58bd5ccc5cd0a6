"""The hardened admin channel installed into vLLM's real ``MooncakeStoreConnector`` (vLLM 0.32.0).

Upstream (``vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/``): the scheduler's
``MooncakeStoreScheduler.__init__`` builds ``LookupKeyClient(vllm_config)`` and worker rank 0's
``MooncakeStoreWorker.__init__`` builds ``LookupKeyServer(self, vllm_config)``; both look the class
up in their module at call time. The client has no deadline (a lookup or reset waits forever on a
dead or stuck server: one executor thread, ``RCVTIMEO`` -1); the server's thread dies on a short
message or a raising store, for good; ``reset`` reports success without checking ``remove_all``'s
return code; two servers on one host with the same ``lookup_rpc_port`` bind the same ipc path.

:class:`HardenedMooncakeStoreConnector` builds upstream's scheduler and worker with the two
classes swapped for this module's (under a lock, restored at once), then asserts the swapped
classes are the ones running (a start-up error otherwise: the swap cannot silently stop working
if upstream stops looking them up at call time):

* :class:`HardenedStoreLookupKeyClient`: upstream's ``lookup(req_id, num_tokens, block_hashes,
  non_block) -> MooncakeLookupResult | None``, ``discard``, ``reset``, ``close`` over
  :class:`connector_patch.store.StoreLookupClient`: every lookup and reset within its deadline
  (``lookup_rpc_timeout_ms``, default 1000; ``lookup_reset_timeout_ms``, default 5000); any
  failure is a miss (the prompt is computed) or a failed reset; the socket is rebuilt after one.
* :class:`HardenedStoreLookupKeyServer`: the lookup package's server in the store dialect: a
  validated dispatch, one reply per message, the thread survives anything, a backend deadline
  (``lookup_backend_timeout_ms``, below the client's: default three quarters of it); the reset drains the send queue within
  ``lookup_reset_drain_ms`` (default 2000), removes this model's keys only (``remove_by_regex``;
  refused when the store cannot, or other ranks store too) and reports success only when the
  remove returned a non-negative count.
* Quiet waiting (:mod:`connector_patch.quiet`, ``quiet_wait_max_ms``, default 100, 0 off), as
  the hardened P2P connector installs it: an engine that only waits on the pool (P keeping blocks
  for a put the master has not taken, D waiting for a load) backs off instead of stepping every
  millisecond, and the store's transfer threads wake it when a put or a load ends.
* Both use :func:`lookup_path`, which names the engine (``kv_transfer_config.engine_id``, the
  same in the scheduler and every worker of one engine): two servers on one host never share it,
  and a live socket on the path is never unlinked.

``connector_patch.vllm_plugin.register`` registers the connector as ``HardenedMooncakeStoreConnector``.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from connector_patch.versions import require as _require_upstream

_require_upstream("HardenedMooncakeStoreConnector")  # one line and nothing loaded on an upstream release it does not support

import vllm.envs as envs
import zmq
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store import scheduler as up_scheduler
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store import worker as up_worker
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.connector import MooncakeStoreConnector
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.data import MooncakeLookupResult, TailKeyBoundary

from .. import quiet
from ..lookup.backend import Backend, drain_queue
from ..lookup.client import backend_timeout_for, validate_timeout_ms
from ..lookup.server import LookupServer
from .client import StoreLookupClient
from .protocol import STORE, StoreRequest, StoreResult, engine_lookup_path

logger = logging.getLogger(__name__)

TIMEOUT_KEY = "lookup_rpc_timeout_ms"
BACKEND_TIMEOUT_KEY = "lookup_backend_timeout_ms"
RESET_TIMEOUT_KEY = "lookup_reset_timeout_ms"
RESET_DRAIN_KEY = "lookup_reset_drain_ms"
QUIET_KEY = "quiet_wait_max_ms"
DEFAULT_QUIET_MS = 100
DEFAULTS = {TIMEOUT_KEY: 1000, RESET_TIMEOUT_KEY: 5000, RESET_DRAIN_KEY: 2000}  # the backend's: below the client's

_SWAP_LOCK = threading.Lock()


def settings(vllm_config: Any) -> dict[str, int]:
    """Every deadline from ``kv_connector_extra_config``, validated (ValueError naming the key)."""
    extra = dict(vllm_config.kv_transfer_config.kv_connector_extra_config or {})
    out = {k: validate_timeout_ms(extra.get(k, v), k) for k, v in DEFAULTS.items()}
    out[BACKEND_TIMEOUT_KEY] = backend_timeout_for(out[TIMEOUT_KEY], extra.get(BACKEND_TIMEOUT_KEY), TIMEOUT_KEY,
                                                   BACKEND_TIMEOUT_KEY)
    q = extra.get(QUIET_KEY, DEFAULT_QUIET_MS)
    if isinstance(q, bool) or not isinstance(q, int) or not 0 <= q <= 1000:
        raise ValueError(f"{QUIET_KEY} must be an int of milliseconds in [0, 1000] (0: off), got {q!r}")
    out[QUIET_KEY] = q
    if out[RESET_TIMEOUT_KEY] <= out[RESET_DRAIN_KEY]:
        raise ValueError(f"{RESET_TIMEOUT_KEY} ({out[RESET_TIMEOUT_KEY]}) must exceed {RESET_DRAIN_KEY} "
                         f"({out[RESET_DRAIN_KEY]}): the worker's answer must reach the caller")
    return out


def lookup_path(vllm_config: Any) -> str:
    """This engine's admin channel (:func:`connector_patch.store.protocol.engine_lookup_path`), named
    by ``kv_transfer_config.engine_id`` (the same in the scheduler and every worker of one engine)."""
    return engine_lookup_path(envs.VLLM_RPC_BASE_PATH, str(vllm_config.kv_transfer_config.engine_id),
                              vllm_config.parallel_config.data_parallel_index)


def _to_upstream(result: StoreResult) -> MooncakeLookupResult:
    return MooncakeLookupResult(result.hit_tokens, tuple(TailKeyBoundary(group_id=g, num_tokens=n)
                                                         for g, n in result.tails))


class HardenedStoreLookupKeyClient:
    """Upstream ``LookupKeyClient(vllm_config)``'s interface; never raises, never waits past a deadline."""

    def __init__(self, vllm_config: Any):
        s = settings(vllm_config)
        self.endpoint = lookup_path(vllm_config)
        # one ZMQ context (its I/O thread) for both; the admin client is made now, not at the
        # first reset, so a node's descriptors do not grow when a reset first comes
        self._ctx = zmq.Context()
        self.client = StoreLookupClient(self.endpoint, s[TIMEOUT_KEY], context=self._ctx)
        self.reset_ms = s[RESET_TIMEOUT_KEY]
        self._admin = StoreLookupClient(self.endpoint, self.reset_ms, context=self._ctx)  # its own socket and deadline
        # non_block lookups run here; each is bounded by the client's deadline, so the one thread
        # is never held longer than that
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="HardenedStoreLookup")
        self.futures: dict[str, Future] = {}

    @property
    def counters(self) -> dict[str, int]:
        return self.client.counters

    def _lookup(self, num_tokens: int, block_hashes: list) -> MooncakeLookupResult:
        return _to_upstream(self.client.lookup(num_tokens, block_hashes))

    def lookup(self, req_id: str, num_tokens: int, block_hashes: list,
               non_block: bool = False) -> MooncakeLookupResult | None:
        if not non_block:
            self.futures.pop(req_id, None)
            return self._lookup(num_tokens, list(block_hashes))
        future = self.futures.get(req_id)
        if future is None:
            future = self.futures[req_id] = self.executor.submit(self._lookup, num_tokens, list(block_hashes))
        if not future.done():
            return None
        del self.futures[req_id]
        try:
            return future.result()
        except Exception:  # _lookup never raises; a cancelled future is a miss
            return MooncakeLookupResult(0)

    def discard(self, req_id: str) -> None:
        future = self.futures.pop(req_id, None)
        if future is not None:
            future.cancel()

    def reset(self) -> bool:
        """True only when worker rank 0 drained its puts and this model's keys were removed,
        within ``lookup_reset_timeout_ms``. False after the deadline means "not confirmed"."""
        return self._admin.reset()

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.client.close()
        self._admin.close()
        try:
            self._ctx.term()
        except Exception:  # noqa: BLE001 - close never raises
            pass


def model_key_pattern(store_worker: Any) -> str | None:
    """The regex of this model's keys in the pool, from the worker's key metadata (vLLM's
    ``PoolKey``: ``[<cache_prefix>@]<model><store namespace>@tp_rank:...``), or None when the
    worker does not say. Instances of one model (and cache prefix) share these keys by design."""
    dbs = getattr(store_worker, "token_dbs", None) or ()
    meta = getattr(dbs[0], "metadata", None) if dbs else None
    model = getattr(meta, "model_name", None)
    if not isinstance(model, str) or not model:
        return None
    prefix = str(getattr(meta, "cache_prefix", "") or "")
    namespace = str(getattr(meta, "store_namespace", "") or "")
    return "^" + re.escape((prefix + "@" if prefix else "") + model + namespace + "@tp_rank:")


class StoreWorkerBackend(Backend):
    """The server's backend: upstream's ``MooncakeStoreWorker.lookup`` for hits; for the reset,
    the worker's send queue drained (bounded), then this model's keys removed with the return
    code checked (:meth:`clear`)."""

    groups = 1

    def __init__(self, store_worker: Any):
        self.store_worker = store_worker

    def hit_tokens(self, request: StoreRequest) -> StoreResult:
        r = self.store_worker.lookup(request.token_len, request.hashes)
        return StoreResult(int(r.hit_length), tuple((int(b.group_id), int(b.num_tokens))
                                                    for b in (r.tail_key_boundaries or ())))

    def drain(self, timeout_s: float) -> bool:
        return drain_queue(getattr(getattr(self.store_worker, "kv_send_thread", None), "request_queue", None), timeout_s)

    def clear(self) -> None:
        """Remove this model's keys (:func:`model_key_pattern`, ``remove_by_regex``), or refuse
        (RuntimeError: the reset reports failure, nothing removed) when more than one rank stores
        into the pool (only rank 0's puts were drained: another rank's could land after the clear)
        or the store cannot remove one model's keys alone (``remove_all`` would wipe the pool of
        every instance on the master)."""
        worker = self.store_worker
        store = getattr(worker, "store", None)
        if store is None:
            raise RuntimeError("the worker has no store (closed)")
        ranks = 1
        for name in ("tp_size", "pp_size", "pcp_size"):
            n = getattr(worker, name, 1)
            ranks *= n if isinstance(n, int) and n > 0 else 1
        if ranks > 1:
            raise RuntimeError(f"{ranks} ranks store into the pool and only rank 0's puts were drained: refused")
        pattern = model_key_pattern(worker)
        remove_by_regex = getattr(store, "remove_by_regex", None)
        if pattern is None or not callable(remove_by_regex):
            raise RuntimeError("the store cannot remove this model's keys alone (remove_all would clear every "
                               "instance's pool): refused")
        rc = remove_by_regex(pattern, force=True)
        if not isinstance(rc, int) or rc < 0:
            raise RuntimeError(f"remove_by_regex returned {rc!r}")


def _live_ipc(path: str) -> bool:
    """Is something listening on this ipc path? (A connect on a unix socket with no listener
    fails at once; a stale file from a dead process is safe to remove.)"""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(0.5)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


class HardenedStoreLookupKeyServer:
    """Upstream ``LookupKeyServer(store_worker, vllm_config)``, bound and serving when constructed.
    Refuses (RuntimeError) to take over a path another live server is listening on."""

    def __init__(self, store_worker: Any, vllm_config: Any):
        s = settings(vllm_config)
        self.endpoint = lookup_path(vllm_config)
        path = self.endpoint[len("ipc://"):]
        if os.path.exists(path):
            if _live_ipc(path):
                raise RuntimeError("another store lookup server is listening on this engine's path")
            os.unlink(path)  # left by a process that died
        self.backend = StoreWorkerBackend(store_worker)
        self.server = LookupServer(self.endpoint, self.backend, dialect=STORE,
                                   backend_timeout_ms=s[BACKEND_TIMEOUT_KEY], reset_drain_timeout_ms=s[RESET_DRAIN_KEY])
        self.server.start()

    @property
    def counters(self) -> dict[str, int]:
        return self.server.counters

    def close(self) -> None:
        self.server.close()


def _waking(fn: Any) -> Any:
    """``fn``, then wake the engine core: a put or a load ended (quiet waiting)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        quiet.wake()
        return out

    return call


class HardenedMooncakeStoreConnector(MooncakeStoreConnector):
    """``MooncakeStoreConnector`` with the hardened admin channel (see the module docstring)."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None):
        s = settings(vllm_config)  # a bad deadline fails here, naming its key
        logger.info("Hardened Mooncake store: %s", quiet.install(s[QUIET_KEY], "engine"
                                                                 if role == KVConnectorRole.SCHEDULER else "worker"))
        with _SWAP_LOCK:
            saved = up_scheduler.LookupKeyClient, up_worker.LookupKeyServer
            up_scheduler.LookupKeyClient = HardenedStoreLookupKeyClient
            up_worker.LookupKeyServer = HardenedStoreLookupKeyServer
            try:
                super().__init__(vllm_config, role, kv_cache_config)
            finally:
                up_scheduler.LookupKeyClient, up_worker.LookupKeyServer = saved
        sched, worker = self.connector_scheduler, self.connector_worker
        if sched is not None and not isinstance(sched.client, HardenedStoreLookupKeyClient):
            raise RuntimeError("HardenedMooncakeStoreConnector: the scheduler's lookup client is upstream's "
                               "(this vLLM no longer builds it through the module's LookupKeyClient)")
        if worker is not None and vllm_config.parallel_config.rank == 0 \
                and not isinstance(worker.lookup_server, HardenedStoreLookupKeyServer):
            raise RuntimeError("HardenedMooncakeStoreConnector: rank 0's lookup server is upstream's "
                               "(this vLLM no longer builds it through the module's LookupKeyServer)")

    def register_kv_caches(self, kv_caches: Any) -> None:
        super().register_kv_caches(kv_caches)
        worker = self.connector_worker
        for thread in (getattr(worker, "kv_send_thread", None), *getattr(worker, "kv_recv_threads", ())):
            for name in ("set_finished_request", "set_failed_request"):
                fn = getattr(thread, name, None) if thread is not None else None
                if callable(fn):
                    setattr(thread, name, _waking(fn))

    def reset_cache(self) -> bool | None:
        sched = self.connector_scheduler
        if sched is None:
            return None
        ok = bool(sched.client.reset())
        if ok:
            sched.load_specs.clear()
            self._kv_cache_events = None
        logger.info("mooncake store reset: %s", "ok" if ok else "failed")
        return ok

    def shutdown(self) -> None:
        worker = getattr(self, "connector_worker", None)
        server = getattr(worker, "lookup_server", None) if worker is not None else None
        if isinstance(server, HardenedStoreLookupKeyServer):
            server.close()
        sched = getattr(self, "connector_scheduler", None)
        client = getattr(sched, "client", None) if sched is not None else None
        if isinstance(client, HardenedStoreLookupKeyClient):
            client.close()
        super().shutdown()
