"""The workload: the scheduler side of a topology, run as its own process (``pdchaos node workload``).

It generates lookups from a seed (full hits, partial hits, misses, hbm_hit_tokens, several KV
groups), knows the expected hit of each from the preloaded keys, calls the target's client and
records every op in the journal part (invoke, then ok / fail / info). Workers are threads, each
with its own client (REQ is strictly request-reply), paced to the configured rate.

Each lookup is asked the way the scheduler asks it: through ``connector_patch.lookup.scheduler``
(upstream's ``get_num_new_matched_tokens`` rules around the client, chunk size = block size,
``hbm_hit_tokens`` as the tokens already computed). The op records the client's answer as
``value`` (what the checks compare with ``expected``) and the scheduler's decision as ``matched``
(the new tokens it would load from the pool; 0 = local compute, as after any RPC failure). When
those rules ask nothing (every token already computed), the lookup is still sent: every op is an
RPC.

Protocol with the runner: prints READY once its baseline probe is written, then waits for SIGUSR1
(the start signal) and runs for ``duration`` seconds. A worker stuck in a call (the legacy client has
no deadline) is left behind at the end: the process writes its final probe and leaves with
``os._exit`` so a hung call cannot keep it alive; that op has no completion and is stalled.
"""

from __future__ import annotations

import argparse
import random
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

from connector_patch.lookup.backend import prefix_hit_tokens
from connector_patch.lookup.scheduler import PoolRequest, PoolScheduler
from nodekit.control import process_stats
from nodekit.journal import JournalWriter
from nodekit.nodeio import watch_parent
from nodekit.workload import Horizon, Tally, add_workload_arguments, finish, paced, run_workers, start_node


@dataclass(frozen=True)
class OpSpec:
    kind: str
    token_len: int
    hashes: tuple[bytes, ...]
    groups: tuple[int, ...]
    hbm_hit_tokens: int
    expected: int


class OpGenerator:
    """Deterministic ops from a seed. ``preload`` are the keys present in every group."""

    def __init__(self, preload: list[str], block_size: int, groups: int, mix: dict[str, int],
                 prompt_blocks: tuple[int, int], seed: int):
        self.preload = [bytes.fromhex(h) for h in preload]
        self.present = set(preload)
        self.bs = block_size
        self.groups = groups
        kinds = [k for k, w in mix.items() if w > 0]
        self.kinds, self.weights = kinds, [mix[k] for k in kinds]
        self.lo, self.hi = prompt_blocks
        self.rng = random.Random(seed)

    def forget_all(self) -> None:
        """After an admin reset: keys are still sent, but none is present any more."""
        self.present = set()

    def _unknown(self) -> bytes:
        while True:
            h = self.rng.getrandbits(256).to_bytes(32, "big")
            if h.hex() not in self.present:
                return h

    def next(self) -> OpSpec:
        rng = self.rng
        kind = rng.choices(self.kinds, self.weights)[0]
        n = rng.randint(self.lo, self.hi)
        known = [rng.choice(self.preload) for _ in range(n)]
        groups: tuple[int, ...] = (0,)
        hbm = 0
        if kind == "full":
            hashes = known
        elif kind == "partial":
            cut = rng.randint(1, max(1, n - 1))
            hashes = known[:cut] + [self._unknown() for _ in range(n - cut)]
        elif kind == "miss":
            hashes = [self._unknown()] + known[1:]
        elif kind == "hbm":  # unknown blocks already in HBM, then known ones
            m = rng.randint(1, n)
            hashes = [self._unknown() for _ in range(m)] + known[m:]
            hbm = m * self.bs
        else:  # multigroup
            groups = tuple(range(self.groups)) if self.groups > 1 else (0,)
            hashes = known if rng.random() < 0.5 else known[: n // 2] + [self._unknown() for _ in range(n - n // 2)]
        token_len = n * self.bs + rng.randint(0, self.bs - 1)  # a partial last block has no hash
        hbm = min(hbm, token_len)
        hexes = [h.hex() for h in hashes]
        expected = prefix_hit_tokens(token_len, hexes, groups, hbm, self.bs,
                                     lambda h, g: h in self.present)
        return OpSpec(kind, token_len, tuple(hashes), groups, hbm, expected)


class _Answer:
    """The client as the scheduler sees it, keeping the answer of the lookup it made."""

    def __init__(self, client: Any):
        self.client = client
        self.asked = False
        self.value: Any = None

    def lookup(self, token_len: int, block_hashes: Any, kv_cache_group_ids: Any = (0,), hbm_hit_tokens: int = 0) -> Any:
        self.asked = True
        self.value = self.client.lookup(token_len, block_hashes, kv_cache_group_ids, hbm_hit_tokens)
        return self.value


def scheduled_lookup(client: Any, spec: OpSpec, request_id: str, block_size: int) -> tuple[Any, int]:
    """One lookup through the scheduler's rules: (the client's answer, num new matched tokens)."""
    answer = _Answer(client)
    sched = PoolScheduler(answer, chunk_size=block_size, kv_cache_group_ids=spec.groups)
    matched, _ = sched.get_num_new_matched_tokens(PoolRequest(request_id, spec.token_len, list(spec.hashes)),
                                                  spec.hbm_hit_tokens)
    if not answer.asked:  # nothing left to load: the scheduler asks nothing, the workload still does
        answer.lookup(spec.token_len, spec.hashes, spec.groups, spec.hbm_hit_tokens)
    return answer.value, matched


class Workload:
    def __init__(self, cfg: dict[str, Any], journal: JournalWriter):
        self.cfg = cfg
        self.journal = journal
        self.target = cfg["target"]
        self._ids = iter(range(1, 1 << 62))
        self._id_lock = threading.Lock()
        self.clients: list[Any] = []
        self.tally = Tally("lookup")
        self.orphaned = threading.Event()
        watch_parent(self.orphaned)

    def _next_id(self) -> int:
        with self._id_lock:
            return next(self._ids)

    def make_client(self):
        if self.target == "hardened":
            from connector_patch.lookup import LookupClient

            return LookupClient(self.cfg["endpoint"], int(self.cfg["deadline_ms"]))
        from connector_patch.lookup.legacy import LegacyLookupClient

        return LegacyLookupClient(self.cfg["endpoint"])

    def lookup_op(self, client: Any, spec: OpSpec, op_id: int) -> tuple[Any, int]:
        """One lookup: (the client's answer, the new tokens the scheduler would load)."""
        return scheduled_lookup(client, spec, str(op_id), int(self.cfg["block_size"]))

    def call(self, worker: int, client: Any, f: str, spec: OpSpec | None) -> Any:
        op_id = self._next_id()
        inv = {"type": "op", "id": op_id, "process": worker, "f": f, "phase": "invoke"}
        if spec is not None:
            inv.update(kind=spec.kind, token_len=spec.token_len, hashes=len(spec.hashes), groups=list(spec.groups),
                       hbm_hit_tokens=spec.hbm_hit_tokens, expected=spec.expected)
        else:
            inv.update(kind="reset", expected=True)
        inv["t"] = time.monotonic()
        self.journal.write(inv)
        start = time.monotonic()
        done: dict[str, Any] = {"type": "op", "id": op_id, "process": worker, "f": f}
        try:
            if spec is not None:
                value, matched = self.lookup_op(client, spec, op_id)
                done["matched"] = matched
            else:
                value = client.reset()
            outcome = getattr(client, "last_outcome", "ok")
            code = getattr(client, "last_code", "")
            if self.target in ("legacy", "upstream"):
                outcome, code = "ok", ""  # today's client cannot tell a failure from a result
            phase = "ok" if outcome == "ok" else "fail"
            done.update(phase=phase, value=value, outcome=outcome, code=code)
        except Exception as exc:  # the legacy client raises (EFSM, ...): indeterminate
            done.update(phase="info", value=None, outcome="raised", code=type(exc).__name__)
        t = time.monotonic()
        done.update(t=t, elapsed_ms=round((t - start) * 1000.0, 3))
        self.journal.write(done)
        self.tally.count(done)
        return done.get("value")

    def worker(self, idx: int, client: Any, gen: OpGenerator, t_start: float, t_end: Horizon,
               interval: float, reset_at: float | None) -> None:
        for _ in paced(t_start, t_end, interval, self.orphaned):
            if reset_at is not None and time.monotonic() >= reset_at:
                reset_at = None
                if self.call(idx, client, "reset", None) is True:
                    gen.forget_all()  # the pool is empty now: every later op expects a miss
            else:
                self.call(idx, client, "lookup", gen.next())

    def run(self) -> int:
        cfg = self.cfg
        self.journal.write({"type": "probe", "node": "client", "when": "baseline", "t": time.monotonic(),
                            **process_stats(), "counters": {}})
        n = int(cfg["concurrency"])
        gens = [OpGenerator(cfg["preload"], cfg["block_size"], cfg["groups"], cfg["mix"],
                            tuple(cfg["prompt_blocks"]), cfg["seed"] * 1000 + i) for i in range(n)]
        self.clients = [self.make_client() for _ in range(n)]
        print("READY", flush=True)
        # The runner sends SIGUSR1 to start (blocked in main() before any thread exists).
        if signal.sigtimedwait({signal.SIGUSR1}, float(cfg.get("go_timeout_s", 30.0))) is None:
            for c in self.clients:
                c.close()
            return 0
        t_start = time.monotonic()
        duration = float(cfg["duration_s"])
        t_end = Horizon(t_start + duration, cfg.get("horizon_path"))
        interval = n / float(cfg["rate"])
        reset_at = cfg.get("reset_at_s")

        def work(i: int, first_at: float) -> None:
            self.worker(i, self.clients[i], gens[i], first_at, t_end, interval,
                        None if reset_at is None or i else t_start + float(reset_at))

        stuck, crashed = run_workers(self.journal, "workload", n, work, t_start=t_start, t_end=t_end,
                                     interval=interval, grace=float(cfg["grace_s"]))
        counters: dict[str, int] = {}
        for i, c in enumerate(self.clients):
            if i in stuck:
                continue  # a client stuck in a call cannot be closed (the legacy one has no deadline)
            for k, v in (getattr(c, "counters", {}) or {}).items():
                counters[k] = counters.get(k, 0) + v
            c.close()
        counters.update(self.tally.counters())  # the ops it wrote, per outcome (harness_integrity)
        return finish(self.journal, stuck, crashed, counters=counters)


def add_node_arguments(p: argparse.ArgumentParser, kind: str) -> None:  # noqa: ARG001
    add_workload_arguments(p)


def run_node(args: argparse.Namespace) -> int:
    cfg = start_node(args)
    journal = JournalWriter(args.journal)
    return Workload(cfg, journal).run()
