"""Which KV blocks a P/D decode node has freed from a load that did not complete, step by step:
the pure rules of the write-after-free watcher (:mod:`pdchaos_waf`; no vLLM, no torch).

Mooncake is push: P writes into D's memory. A load that failed, or whose request ended before it
completed (aborted), gives its blocks back to vLLM's pool at the step where both are true: the
scheduler finished the request (``finished_req_ids`` of a later scheduler output), and the worker
reported the load in ``finished_recving`` (vLLM keeps a loading request's blocks until then). A
write into such a block after that, before vLLM hands it out again, is a write after free.

The worker sees both facts, so the tracker needs nothing but what the worker's model runner sees
each step: the scheduler output at the step's start (new loads with their block ids, the blocks
handed out in this step, the requests finished since the last), the connector output at its end
(``finished_recving``, invalid block ids, ``failed_recving``). It never names a block that may
still be in use: blocks of a load that completed are forgotten (they may be prefix-cached and
reused without being handed out again); a request that recomputes after a failed load
(``kv_load_failure_policy: recompute``) never finishes for that reason, so its blocks are never
named; a block handed out again is dropped before anything can write it.

A freed block handed out again in the very step that follows (vLLM reuses a freed block with no
prefix-cache hash first) cannot be poisoned: its new owner's KV goes into it. Such a block is
*reassigned* (:attr:`FreedLoads.reassigned`, this step's): the watcher compares it between steps,
when nothing of vLLM writes KV, unless the new owner is itself a remote load (its P writes it then).
"""

from __future__ import annotations

from typing import Iterable


class FreedLoads:
    def __init__(self) -> None:
        self.loads: dict[str, frozenset[int]] = {}  # request -> its load's blocks, until settled here
        self.failed: set[str] = set()
        self.reported: set[str] = set()  # the worker reported the load (finished_recving)
        self.finished: set[str] = set()  # the scheduler finished the request
        self.freed: set[int] = set()  # blocks given back since the last step's start, to watch
        self.reassigned: set[int] = set()  # this step's: freed and handed out again at once, not to a load
        self.counters = {"loads": 0, "loads_freed": 0, "blocks_freed": 0, "freed_handed_out_at_once": 0}

    def step_start(self, new_loads: dict[str, Iterable[int]], handed_out: Iterable[int],
                   finished_ids: Iterable[str]) -> tuple[set[int], set[int]]:
        """A step begins: its scheduler output. Returns (blocks to watch from now on, blocks
        handed out again in this step: no longer free)."""
        for rid in finished_ids:
            if rid in self.loads:
                self.finished.add(rid)
                self._maybe_free(rid)
        load_blocks: set[int] = set()
        for rid, blocks in new_loads.items():
            b = frozenset(blocks)
            load_blocks |= b
            if b:
                self.loads[rid] = b
                self.counters["loads"] += 1
                self.failed.discard(rid)
                self.reported.discard(rid)
                self.finished.discard(rid)
        out = set(handed_out)
        watch = self.freed - out
        self.reassigned = (self.freed & out) - load_blocks
        self.counters["freed_handed_out_at_once"] += len(self.freed & out)
        self.freed = set()
        return watch, out

    def step_end(self, finished_recving: Iterable[str], invalid_blocks: Iterable[int],
                 failed_recving: Iterable[str]) -> None:
        """A step ends: what the worker reported (the connector output)."""
        invalid = set(invalid_blocks)
        failed = set(failed_recving)
        if invalid or failed:
            for rid, blocks in self.loads.items():
                if rid in failed or blocks & invalid:
                    self.failed.add(rid)
        for rid in finished_recving:
            if rid not in self.loads:
                continue
            if rid not in self.failed and rid not in self.finished:
                self._forget(rid)  # completed: its blocks hold the prompt (maybe prefix-cached)
                continue
            self.reported.add(rid)
            self._maybe_free(rid)

    def _maybe_free(self, rid: str) -> None:
        if rid in self.reported and rid in self.finished:
            blocks = self.loads[rid]
            self.freed |= blocks
            self.counters["loads_freed"] += 1
            self.counters["blocks_freed"] += len(blocks)
            self._forget(rid)

    def _forget(self, rid: str) -> None:
        self.loads.pop(rid, None)
        self.failed.discard(rid)
        self.reported.discard(rid)
        self.finished.discard(rid)
