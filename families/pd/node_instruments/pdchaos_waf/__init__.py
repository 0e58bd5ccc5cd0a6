"""The P/D family's write-after-free watcher, inside a decode node's vLLM worker (a harness
instrument, not part of the system under test; the upstream and the hardened D alike).

Loaded as a vLLM general plugin from the instrument site (``families/pd/plugin_site.py``) of the
CPU profile's decode nodes, active only when ``PDCHAOS_WAF_FILE`` names the file it writes its
counts to. It wraps two vLLM functions in the worker process: the Mooncake connector's
``register_kv_caches`` (to hold the KV tensors), the model runner's ``_update_states`` (the
scheduler output, before vLLM zeroes the blocks the step hands out or anything writes them) and
its per-step KV connector context (``KVConnectorModelRunnerMixin._get_kv_connector_output``: the
connector output after the step). :class:`tracker.FreedLoads` says which blocks a load that
failed or was aborted gave back; the watcher fills them with a NaN pattern no KV write produces
(the "poison") and a thread looks at them 4 times a second: a watched block whose bytes changed before
vLLM handed it out again was written after it was freed (P's late write: Mooncake is push, only
D's memory shows it). Blocks handed out again are looked at one last time and dropped before the
step that may write them runs. A freed block handed out again at once (most are: vLLM reuses an
unhashed freed block first) cannot be poisoned; it is copied at the end of each step for
``REASSIGNED_S`` and compared between steps, when nothing of vLLM writes KV: a change then is
P's late write into another request's KV (a block whose new owner loads from P is left out).

Counts only, in the file (JSON, replaced atomically every 0.5 s): loads, loads_freed,
blocks_freed, watched (now), poisoned, late_writes (late_writes_reassigned of them into reassigned
blocks), reassigned_watched, checks. Never block ids, request ids or data.
"""

from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager

from .tracker import FreedLoads

ENV = "PDCHAOS_WAF_FILE"
POLL_S = 0.25  # a late write stays in the block until vLLM hands it out: looked at 4 times a second
WRITE_S = 0.5
REASSIGNED_S = 30.0  # a reassigned block is compared between steps this long (P's write in flight: seconds)
MAX_REASSIGNED = 256  # at most this many at once (a copy each, refreshed every step)
_installed = False


class Watcher:
    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.tracker = FreedLoads()
        self.views: list = []  # (int view of a KV tensor, block dim, poison value)
        self.watched: set[int] = set()
        self.reassigned: dict[int, list] = {}  # block -> [watch until, its copies at the last step's end]
        self.in_step = False  # between a step's start and end vLLM writes KV: reassigned blocks not compared
        self.counters = {"poisoned": 0, "late_writes": 0, "late_writes_reassigned": 0, "reassigned_watched": 0,
                         "checks": 0, "errors": 0}
        self._written = 0.0
        threading.Thread(target=self._run, name="pdchaos-waf", daemon=True).start()

    # -- the KV tensors
    def set_caches(self, kv_caches: dict, num_blocks: int) -> None:
        import torch

        views = []
        for t in kv_caches.values():
            if not isinstance(t, torch.Tensor) or t.element_size() not in (2, 4):
                continue
            dims = [i for i, n in enumerate(t.shape) if n == num_blocks]
            if not dims:
                continue
            iv = t.view(torch.int16 if t.element_size() == 2 else torch.int32)
            views.append((iv, dims[0], 0x7FA5 if t.element_size() == 2 else 0x7FA5A5A5))  # a NaN in every dtype
        with self.lock:
            self.views = views
        self.write(force=True)

    def _poison(self, b: int) -> None:
        for iv, dim, value in self.views:
            iv.select(dim, b).fill_(value)

    def _intact(self, b: int) -> bool:
        return all(bool((iv.select(dim, b) == value).all()) for iv, dim, value in self.views)

    def _copy(self, b: int) -> list:
        return [iv.select(dim, b).clone() for iv, dim, _ in self.views]

    def _same(self, b: int, copies: list) -> bool:
        return all(bool(iv.select(dim, b).equal(c)) for (iv, dim, _), c in zip(self.views, copies))

    def _compare_reassigned(self) -> None:
        """Between steps (the lock held): a reassigned block that changed since the last step's end
        was written by someone other than vLLM."""
        now = time.monotonic()
        for b, (until, copies) in list(self.reassigned.items()):
            if copies is not None:
                self.counters["checks"] += 1
                if not self._same(b, copies):
                    self.counters["late_writes"] += 1
                    self.counters["late_writes_reassigned"] += 1
                    del self.reassigned[b]
                    continue
            if now > until:
                del self.reassigned[b]

    # -- the step hooks
    def step_start(self, so) -> None:  # noqa: ANN001 - vLLM's SchedulerOutput
        try:
            loads = {}
            meta = getattr(so, "kv_connector_metadata", None)
            for per_engine in (getattr(meta, "reqs_to_recv", None) or {}).values():
                for rid, pm in per_engine.items():
                    loads[rid] = [b for g in pm.local_block_ids for b in g]
            handed = set()
            for nr in so.scheduled_new_reqs:
                handed.update(b for g in nr.block_ids for b in g)
            for ids in so.scheduled_cached_reqs.new_block_ids:
                for g in ids or ():
                    handed.update(g)
            for blocks in loads.values():
                handed.update(blocks)
            handed.update(getattr(so, "new_block_ids_to_zero", None) or ())
            with self.lock:
                if not self.in_step:
                    self._compare_reassigned()  # a last look before this step may write them
                else:  # the last step's end was not seen: its copies are no baseline
                    for entry in self.reassigned.values():
                        entry[1] = None
                self.in_step = True
                for blocks in loads.values():  # a new owner that loads from P: P writes it between steps
                    for b in blocks:
                        self.reassigned.pop(b, None)
                watch, out = self.tracker.step_start(loads, handed, so.finished_req_ids)
                until = time.monotonic() + REASSIGNED_S
                for b in sorted(self.tracker.reassigned):
                    if len(self.reassigned) < MAX_REASSIGNED and self.views:
                        self.reassigned[b] = [until, None]  # copied at this step's end
                        self.counters["reassigned_watched"] += 1
                for b in self.watched & out:  # a last look before the step may write it
                    self._look(b)
                self.watched -= out
                for b in watch:
                    self._poison(b)
                self.watched |= watch
                self.counters["poisoned"] += len(watch)
        except Exception:  # noqa: BLE001 - an instrument must never break the node
            self.counters["errors"] += 1

    def step_end(self, out) -> None:  # noqa: ANN001 - vLLM's KVConnectorOutput
        try:
            with self.lock:
                self.tracker.step_end(out.finished_recving or (), out.invalid_block_ids or (),
                                      out.failed_recving or ())
        except Exception:  # noqa: BLE001
            self.counters["errors"] += 1
        finally:
            try:
                with self.lock:
                    for entry_b, entry in self.reassigned.items():  # what this step wrote is vLLM's
                        entry[1] = self._copy(entry_b)
                    self.in_step = False
            except Exception:  # noqa: BLE001
                self.counters["errors"] += 1

    # -- the watch
    def _look(self, b: int) -> None:
        self.counters["checks"] += 1
        if not self._intact(b):
            self.counters["late_writes"] += 1
            self.watched.discard(b)

    def _run(self) -> None:
        while True:
            time.sleep(POLL_S)
            try:
                with self.lock:
                    for b in list(self.watched):
                        self._look(b)
                    if not self.in_step:
                        self._compare_reassigned()
                self.write()
            except Exception:  # noqa: BLE001
                self.counters["errors"] += 1

    def write(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._written < WRITE_S:
            return
        self._written = now
        data = {**self.tracker.counters, **self.counters, "watched": len(self.watched), "tensors": len(self.views)}
        tmp = f"{self.path}.{os.getpid()}.{threading.get_ident()}.tmp"  # the poll thread and set_caches both write
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, self.path)


_watcher: Watcher | None = None


def register() -> None:
    """The ``vllm.general_plugins`` entry point: wraps the two functions when ``PDCHAOS_WAF_FILE`` is set."""
    global _installed
    path = os.environ.get(ENV)
    if not path or _installed:
        return
    _installed = True
    from vllm.distributed.kv_transfer.kv_connector.v1.mooncake import mooncake_connector as mc
    from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin as Mixin

    original_register = mc.MooncakeConnector.register_kv_caches

    def register_kv_caches(self, kv_caches):  # noqa: ANN001, ANN202
        global _watcher
        original_register(self, kv_caches)
        if _watcher is None:
            _watcher = Watcher(path)
        worker = getattr(self, "connector_worker", None)
        num_blocks = getattr(getattr(worker, "kv_cache_config", None), "num_blocks", None)
        if num_blocks:
            _watcher.set_caches(kv_caches, int(num_blocks))

    mc.MooncakeConnector.register_kv_caches = register_kv_caches
    original_output = Mixin.__dict__["_get_kv_connector_output"].__func__

    @contextmanager
    def _get_kv_connector_output(scheduler_output, defer_finalize=False):  # noqa: ANN001, ANN202
        with original_output(scheduler_output, defer_finalize=defer_finalize) as output:
            yield output
        w = _watcher
        if w is not None:
            w.step_end(output)

    Mixin._get_kv_connector_output = staticmethod(_get_kv_connector_output)
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # the CPU model runner's base

    original_update = GPUModelRunner._update_states

    def _update_states(self, scheduler_output):  # noqa: ANN001, ANN202
        w = _watcher
        if w is not None:  # before vLLM zeroes the blocks this step hands out, or anything writes them
            w.step_start(scheduler_output)
        return original_update(self, scheduler_output)

    GPUModelRunner._update_states = _update_states
