"""The hardened lookup RPC installed into vllm-ascend's real ``AscendStoreConnector``.

vllm-ascend 0.23.0.post1 (``kv_pool/ascend_store/``) asks worker rank 0 how many prompt tokens the
KV pool holds over a ZMQ REQ/REP pair: ``LookupKeyClient`` on the scheduler side (created lazily by
``KVPoolScheduler.get_num_new_matched_tokens`` when its ``client`` is None) and ``LookupKeyServer``
on the worker side (created by ``AscendStoreConnector.__init__`` on rank 0, non-layerwise). Neither
has a deadline, an error reply or an exception boundary (DESIGN.md, first section).

This module puts :mod:`connector_patch.lookup` in their place, on the same ipc path
(``get_zmq_rpc_path_lookup``), without editing vllm-ascend:

* :class:`HardenedLookupKeyClient` has upstream's ``lookup(token_len, block_hashes, group_ids,
  hbm_hit_tokens) -> int`` and ``close()``, plus ``reset() -> bool``. It never raises and never
  waits past ``lookup_rpc_timeout_ms`` (``kv_connector_extra_config``, default 1000): any failure
  is a miss (0), so the scheduler computes locally and records no load spec.
* :class:`HardenedLookupKeyServer` takes upstream's ``(pool_worker, vllm_config)``. It serves with
  a per-request exception boundary, a backend deadline and versioned error replies; its backend
  calls ``pool_worker.lookup_scheduler`` (upstream's own hit rule) and, for the admin reset,
  drains the worker's store-sending queue before clearing this model's keys from the store (and
  refuses when other ranks store too, or the store cannot remove one model's keys alone). ``close()`` never aborts the
  process (upstream's does when its thread waits in ``recv``).
* :class:`HardenedAscendStoreConnector` is ``AscendStoreConnector`` with those two installed, and
  ``reset_cache()`` (vLLM's connector reset hook) answered through the tagged admin reset.

``connector_patch.vllm_plugin.register`` registers it with vLLM's KV connector factory as
``HardenedAscendStoreConnector`` when vllm-ascend is installed.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from connector_patch.versions import require as _require_upstream

_require_upstream("HardenedAscendStoreConnector")  # one line and nothing loaded on an upstream release it does not support

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole
from vllm_ascend.distributed.kv_transfer.kv_pool.ascend_store.ascend_store_connector import AscendStoreConnector
from vllm_ascend.distributed.kv_transfer.kv_pool.ascend_store.pool_scheduler import (
    KVPoolScheduler,
    get_zmq_rpc_path_lookup,
)
from vllm_ascend.distributed.kv_transfer.kv_pool.ascend_store.pool_worker import KVPoolWorker

from . import LookupClient, LookupServer, validate_timeout_ms
from .backend import Backend, drain_queue
from .client import backend_timeout_for
from .protocol import LookupRequest

logger = logging.getLogger(__name__)

TIMEOUT_KEY = "lookup_rpc_timeout_ms"
BACKEND_TIMEOUT_KEY = "lookup_backend_timeout_ms"
RESET_TIMEOUT_KEY = "lookup_reset_timeout_ms"
DEFAULT_TIMEOUT_MS = 1000
RESET_DRAIN_S = 2.0
# The admin reset waits for the worker's drain (up to RESET_DRAIN_S) and clear: its own deadline,
# longer than the drain budget, so that the worker's answer (done, or RESET_FAILED) reaches the caller.
DEFAULT_RESET_TIMEOUT_MS = 3000


def _extra(vllm_config: Any) -> dict:
    return dict(vllm_config.kv_transfer_config.kv_connector_extra_config or {})


def settings(vllm_config: Any) -> tuple[int, int]:
    """(client deadline ms, server backend deadline ms) from ``kv_connector_extra_config``;
    ValueError naming the key when one is not a positive int, or when the backend's is not below
    the client's (default: three quarters of it, :func:`connector_patch.lookup.client.backend_timeout_for`)."""
    extra = _extra(vllm_config)
    timeout = validate_timeout_ms(extra.get(TIMEOUT_KEY, DEFAULT_TIMEOUT_MS), TIMEOUT_KEY)
    backend = backend_timeout_for(timeout, extra.get(BACKEND_TIMEOUT_KEY), TIMEOUT_KEY, BACKEND_TIMEOUT_KEY)
    return timeout, backend


def reset_timeout_ms(vllm_config: Any) -> int:
    """The admin reset's deadline (``lookup_reset_timeout_ms``, default 3000)."""
    return validate_timeout_ms(_extra(vllm_config).get(RESET_TIMEOUT_KEY, DEFAULT_RESET_TIMEOUT_MS), RESET_TIMEOUT_KEY)


class HardenedLookupKeyClient:
    """Upstream ``LookupKeyClient``'s interface over :class:`connector_patch.lookup.LookupClient`."""

    def __init__(self, vllm_config: Any, timeout_ms: int | None = None, reset_ms: int | None = None):
        self.endpoint = get_zmq_rpc_path_lookup(vllm_config)
        self.client = LookupClient(self.endpoint, timeout_ms if timeout_ms is not None else settings(vllm_config)[0])
        self.reset_ms = reset_ms if reset_ms is not None else reset_timeout_ms(vllm_config)
        self._admin: LookupClient | None = None  # made on the first reset: its own socket and deadline

    @property
    def last_outcome(self) -> str:
        return self.client.last_outcome

    @property
    def last_code(self) -> str:
        return str(self.client.last_code)

    @property
    def counters(self) -> dict[str, int]:
        return self.client.counters

    def lookup(self, token_len: int, block_hashes: list, kv_cache_group_ids: list[int] | None = None,
               hbm_hit_tokens: int = 0) -> int:
        return self.client.lookup(token_len, list(block_hashes), tuple(kv_cache_group_ids or [0]), hbm_hit_tokens)

    def reset(self) -> bool:
        """The tagged admin reset, within ``lookup_reset_timeout_ms``: True once the worker drained
        and cleared; False on any failure (never raises). A False after the deadline means "not
        confirmed": the worker may still finish it."""
        if self._admin is None:
            self._admin = LookupClient(self.endpoint, self.reset_ms)
        return self._admin.reset()

    def close(self) -> None:
        self.client.close()
        if self._admin is not None:
            self._admin.close()


class PoolWorkerBackend(Backend):
    """The server's backend: upstream's ``pool_worker.lookup_scheduler`` for hits; for the admin
    reset, the worker's store-sending queue drained (bounded), then its store emptied."""

    def __init__(self, pool_worker: Any, groups: int = 1):
        self.pool_worker = pool_worker
        self.groups = groups

    def hit_tokens(self, request: LookupRequest) -> int:
        return int(self.pool_worker.lookup_scheduler(request.token_len, list(request.hashes), list(request.group_ids),
                                                     use_layerwise=False, hbm_hit_tokens=request.hbm_hit_tokens))

    def drain(self, timeout_s: float) -> bool:
        return drain_queue(getattr(getattr(self.pool_worker, "kv_send_thread", None), "request_queue", None), timeout_s)

    def clear(self) -> None:
        """Empty this model's part of the pool, or refuse (RuntimeError: the reset answers
        RESET_FAILED, nothing removed):

        * more than one rank stores into the pool (tensor, pipeline or context parallel): only this
          rank's puts were drained, another rank's could land after the clear;
        * the store cannot remove this model's keys alone (no ``remove_by_regex``, or no model
          name): ``remove_all`` would wipe the pool of every instance sharing the master.

        Keys are ``<model name>@...`` (``KVPoolWorker``): instances of the same model share them by
        design, and they are what a weight update makes stale."""
        worker = self.pool_worker
        clear = getattr(worker, "clear_pool", None)
        if callable(clear):  # a stand-in worker that knows how to empty its pool
            clear()
            return
        ranks = 1
        for name in ("tp_size", "pp_size", "pcp_size"):
            n = getattr(worker, name, 1)
            ranks *= n if isinstance(n, int) and n > 0 else 1
        if ranks > 1:
            raise RuntimeError(f"{ranks} ranks store into the pool and only this rank's stores were drained: refused")
        store = getattr(getattr(worker, "m_store", None), "store", None)
        model = getattr(worker, "model_name", None)
        remove_by_regex = getattr(store, "remove_by_regex", None)
        if not (isinstance(model, str) and model and callable(remove_by_regex)):
            raise RuntimeError("the store cannot remove this model's keys alone (remove_all would clear every "
                               "instance's pool): refused")
        rc = remove_by_regex("^" + re.escape(model) + "@", force=True)
        if not isinstance(rc, int) or rc < 0:
            raise RuntimeError(f"remove_by_regex returned {rc!r}")


class HardenedLookupKeyServer:
    """Upstream ``LookupKeyServer(pool_worker, vllm_config)`` over
    :class:`connector_patch.lookup.LookupServer` (bound and serving when constructed)."""

    def __init__(self, pool_worker: Any, vllm_config: Any, *, groups: int | None = None,
                 backend_timeout_ms: int | None = None):
        self.endpoint = get_zmq_rpc_path_lookup(vllm_config)
        if groups is None:
            kv_cache_config = getattr(pool_worker, "kv_cache_config", None)
            groups = len(getattr(kv_cache_config, "kv_cache_groups", None) or [0]) or 1
        timeout = backend_timeout_ms if backend_timeout_ms is not None else settings(vllm_config)[1]
        self.backend = PoolWorkerBackend(pool_worker, groups)
        self.server = LookupServer(self.endpoint, self.backend, groups=groups, backend_timeout_ms=timeout,
                                   reset_drain_timeout_ms=int(RESET_DRAIN_S * 1000))
        self.server.start()

    @property
    def counters(self) -> dict[str, int]:
        return self.server.counters

    @property
    def alive(self) -> bool:
        thread = self.server._thread
        return thread is not None and thread.is_alive()

    def close(self) -> None:
        self.server.close()


class HardenedAscendStoreConnector(AscendStoreConnector):
    """``AscendStoreConnector`` with the hardened lookup client and server installed.

    ``__init__`` builds the same parts as upstream's (``KVPoolScheduler`` on the scheduler,
    ``KVPoolWorker`` on a worker, the lookup server on rank 0 when not layerwise), except that the
    lookup server is :class:`HardenedLookupKeyServer` and the scheduler's client is
    :class:`HardenedLookupKeyClient` from the start (upstream creates its own lazily only when the
    attribute is None). Upstream's ``__init__`` cannot be called: it would bind upstream's server
    on the same path."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None):
        timeout_ms, backend_ms = settings(vllm_config)  # a bad setting fails here, naming the key
        reset_ms = reset_timeout_ms(vllm_config)
        KVConnectorBase_V1.__init__(self, vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = _extra(vllm_config)
        self.kv_role = vllm_config.kv_transfer_config.kv_role
        self.use_layerwise = extra.get("use_layerwise", False)
        self.backend_name = str(extra.get("backend", "mooncake")).lower()
        self.use_gva_layerwise = self.use_layerwise and self.backend_name == "memcache"
        self.consumer_is_to_put = extra.get("consumer_is_to_put", False)
        self.kv_caches = {}
        self._kv_cache_events = None
        self._current_step_has_real_forward = False
        self.lookup_server = None
        if role == KVConnectorRole.SCHEDULER:
            assert kv_cache_config is not None
            page_size_bytes = kv_cache_config.kv_cache_groups[0].kv_cache_spec.page_size_bytes
            self.connector_scheduler = KVPoolScheduler(vllm_config, self.use_layerwise, kv_cache_config,
                                                       page_size_bytes=page_size_bytes)
            if not self.use_layerwise:
                self.connector_scheduler.client = HardenedLookupKeyClient(vllm_config, timeout_ms, reset_ms)
        else:
            self.connector_worker = KVPoolWorker(vllm_config, self.use_layerwise, kv_cache_config)
            if not self.use_layerwise and vllm_config.parallel_config.rank == 0:
                self.lookup_server = HardenedLookupKeyServer(self.connector_worker, vllm_config,
                                                             backend_timeout_ms=backend_ms)

    def reset_cache(self) -> bool | None:
        """The tagged admin reset (seed 002): the worker drains pending stores, then clears the
        pool. True on the worker's ack; False on any failure (bounded by the client deadline,
        never raises); None on a worker (the scheduler owns the reset)."""
        sched = getattr(self, "connector_scheduler", None)
        if sched is None:
            return None
        client = getattr(sched, "client", None)
        if not isinstance(client, HardenedLookupKeyClient):
            return False
        try:
            ok = client.reset()
        except Exception:  # never raises to the engine
            ok = False
        if ok:
            getattr(sched, "load_specs", {}).clear()
        logger.info("kv pool reset: %s", "ok" if ok else "failed")
        return ok

    def shutdown(self) -> None:
        server = getattr(self, "lookup_server", None)
        if server is not None:
            server.close()
        sched = getattr(self, "connector_scheduler", None)
        client = getattr(sched, "client", None) if sched is not None else None
        if isinstance(client, HardenedLookupKeyClient):
            client.close()
        parent = getattr(super(), "shutdown", None)
        if callable(parent):
            parent()
