"""Warm nodes kept between the scenario runs of one ``pdchaos run`` (or one pytest session).

Starting a real vLLM server costs 20 s to minutes here; a scenario whose faults leave a node
healthy and drained can hand it to the next scenario instead of stopping it. The pool knows
nothing of families: a topology says which roles may be pooled and under which **key** (every
setting the node was started with that matters, e.g. its failure policy and timeouts), gives a
node back at its close when the family's check says it is reusable, and takes one at its start.
A node taken is probed again (its ``baseline``) by the new scenario, so every check judges that
scenario from the node's state at its start.

Between runs the pool may know the plan (``want``: how many runs still to start need each key,
set by ``pdchaos run``, harness.plan.WarmOrder). It then stops an idle node no later run needs at
once (its memory and CPU go to the runs that remain), and beyond ``max_idle`` stops first the
idle nodes the fewest runs need. Without a plan: the oldest beyond ``max_idle``.

A pooled node keeps its process, ports, control endpoint (under the pool's own ipc folder, which
outlives each scenario's) and logs. Nodes left in the pool are stopped by :meth:`close`; if the
runner dies outright, each node notices its parent is gone and stops itself (see the nodes'
parent watch), and the next run sweeps the ipc folder (harness.topology.sweep_stale_tmp).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .runtime import NodeHandle


@dataclass
class PooledNode:
    """A running node waiting for its next scenario."""

    key: tuple
    kind: str
    handle: NodeHandle
    control_ep: str | None
    endpoints: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # family data, e.g. the ports it listens on
    first_run: str = ""  # the scenario run that started it
    reuses: int = 0


class NodePool:
    def __init__(self, folder: Path | None = None, stop_timeout_s: float = 40.0, max_idle: int = 2):
        self.folder = folder  # the run folder: logs of pooled nodes live here, not in one scenario's
        self.tmp = Path(tempfile.mkdtemp(prefix=f"pdc-{os.getpid()}-pool"))
        self.stop_timeout_s = stop_timeout_s
        self.max_idle = max_idle  # one P/D pair: more idle vLLM servers would cost ~4 GB each
        self._idle: list[PooledNode] = []
        self._lock = threading.Lock()
        self._n = 0
        self.closed = False
        self._want: Counter | None = None  # per key: the runs still to start that need it (None: no plan)

    def want(self, counts: Counter | None, starting: Counter | None = None) -> list[PooledNode]:
        """The plan's need per key (None: no plan): ``counts`` of the runs after the one
        ``starting`` now (its keys: what it is about to take). Idle nodes neither needs are stopped
        now (returned); later, when nodes come back, only ``counts`` is what runs still need."""
        with self._lock:
            self._want = Counter(counts) + Counter(starting or {}) if counts is not None else None
            evicted = self._evict()
            if counts is not None:
                self._want = Counter(counts)
        self._stop(evicted)
        return evicted

    def _stop(self, nodes: list[PooledNode]) -> None:
        for n in nodes:
            n.handle.stop(self.stop_timeout_s)

    def _evict(self) -> list[PooledNode]:
        """(under the lock) Takes out and returns the idle nodes to stop: with a plan, those no run
        needs, then beyond ``max_idle`` those the fewest runs need (the oldest of equals); without
        one, the oldest beyond ``max_idle``."""
        dead = [n for n in self._idle if not n.handle.alive]  # first: they hold no place of a live one
        live = [n for n in self._idle if n.handle.alive]
        if self._want is None:
            out = dead + (live[:-self.max_idle] if len(live) > self.max_idle else [])
        else:
            out, rest, kept = list(dead), [], Counter()
            for n in reversed(live):  # per key, as many as runs still need it, the newest kept
                if kept[n.key] < self._want[n.key]:
                    kept[n.key] += 1
                    rest.insert(0, n)
                else:
                    out.append(n)
            if len(rest) > self.max_idle:
                by_need = sorted(range(len(rest)), key=lambda i: (self._want[rest[i].key], i))
                out += [rest[i] for i in sorted(by_need[:len(rest) - self.max_idle])]
        for n in out:
            self._idle.remove(n)
        return out

    def control_endpoint(self, role: str) -> str:
        with self._lock:
            self._n += 1
            return f"ipc://{self.tmp}/{role.replace(':', '-')}-{self._n}-ctl.sock"

    def log_folder(self, fallback: Path) -> Path:
        d = (self.folder / "pooled-logs") if self.folder is not None else fallback
        d.mkdir(parents=True, exist_ok=True)
        return d

    def give(self, node: PooledNode) -> None:
        """Keep ``node`` for a later run; idle nodes beyond what the plan needs are stopped (see
        :meth:`want`)."""
        with self._lock:
            if self.closed:
                evicted = [node]
            else:
                self._idle.append(node)
                evicted = self._evict()
        self._stop(evicted)

    def take(self, key: tuple) -> PooledNode | None:
        """A live node pooled under ``key`` (the oldest first); dead ones met on the way are dropped."""
        dead: list[PooledNode] = []
        found = None
        with self._lock:
            for n in [n for n in self._idle if n.key == key]:
                self._idle.remove(n)
                if n.handle.alive:
                    found = n
                    n.reuses += 1
                    break
                dead.append(n)
        for n in dead:
            n.handle.stop(1.0)  # reaps it
        return found

    def idle_keys(self) -> list[tuple]:
        """The keys of the live idle nodes, oldest first."""
        with self._lock:
            return [n.key for n in self._idle if n.handle.alive]

    def idle(self) -> list[PooledNode]:
        with self._lock:
            return list(self._idle)

    def discard(self, node: PooledNode) -> None:
        node.handle.stop(self.stop_timeout_s)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            nodes, self._idle = self._idle, []
        threads = [threading.Thread(target=n.handle.stop, args=(self.stop_timeout_s,)) for n in nodes]
        for th in threads:
            th.start()
        for th in threads:
            th.join(self.stop_timeout_s + 5.0)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> "NodePool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
