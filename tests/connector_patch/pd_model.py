"""A stateful model of the P/D pull protocol that drives the hardened connector's REAL worker code
(issue 43, item 5): D's pull path (``start_load_kv``, ``_cancelled``, ``receive_kv``,
``receive_kv_from_single_worker``, ``_on_reply``, ``_cancel_round``, ``get_transfer_results``),
P's listener, sender tasks, ``send_kv_to_decode``, ``_build_transfer_params``, ``_on_cancel`` and
``record_send_reqs``, the scheduler side's ``request_finished``/``build_connector_meta``/
``update_connector_output``, and the rules under them (``PeerWatch``, ``RequesterLinks``,
``cancel_targets``, ``LoadLedger``, ``Settlements``, ``TerminalRecords``), all of
``connector_patch/pd`` as shipped, over the simulated clock, loop and network of
:mod:`pd_sim`. vLLM's scheduler around them is modelled here (a block pool, one engine step
every ``STEP_S``; a failed load's blocks are kept until its ``finished_recving``, as vLLM does);
what the hardened worker inherits from upstream's worker is modelled in :mod:`pd_sim`.

Actors: one D rank; P with ``P_TP`` ranks (1 to 4), each its own hardened worker with its own side
channel; the client (requests, aborts); P's scheduler (a prefill ends at any time, before or after
D pulls); the network (per P rank: up, refusing, blackholed; a connection reset; a message delayed,
lost or duplicated; cancel rounds on new connections overtake the pull); P's writes, which take
time and can be cut (the transfer engine fails).

Invariants, checked after every rule and at the end of each run (then the world runs on past
every bound):

- ``no write into a block D freed or reassigned``: every chunk P writes (at its start and as each
  lands) goes into blocks D holds for that request;
- ``a load is reported OK only once every P rank wrote it``;
- ``each request reaches exactly one terminal state within its bound``: OK, failed or aborted,
  never two; a load not aborted is reported by its deadline; a failed or aborted load's blocks
  come back by its bound (bootstrap + P's abort timeout + D's margin + the close's 2 s);
- ``an abort touches only its own request``: D asks P to cancel only requests that are finished
  at D (aborted, failed) or whose pull failed;
- ``P frees what it kept within its bound``: P's blocks of a finished prefill come back by its
  abort timeout, and within a few steps of P acknowledging a cancel for it when no pull that
  names it waits at P (one that does, waiting for its siblings' prefills, holds them until it
  ends: within the abort timeout).

Fault spaces: ``FULL = False`` leaves out the two ways into defect 7a (issue 43): writes longer
than D's 1.5 s "P gone" delay and a blackhole that turns into refusals (D reads P as gone 0.2 s
in, P's keepalive sees the reset only ~1 s in). ``FULL = True`` has them (and a D bound that leaves
P a whole write after its abort timeout, as the real 60 s margin does). Before 7a's fix the model
found it there; now the full space keeps the invariants, and :func:`directed_7a` puts a write in
flight in each of 7a's interleavings by hand (the bounded examples no longer reach them: measured,
neither half of the fix broken, nor both, is caught within 150 full-space examples at TP 1).

P's write goes through the hardened worker's own ``_send_blocks`` (chunks, each asked whether the
pull's connection dropped) in pd_sim's executor, a thread that runs in strict turns with the loop;
each chunk is :meth:`PDModel.write_chunk`, which checks the blocks it names at its start and as it
lands.
"""

from __future__ import annotations

import asyncio
import types
from collections import defaultdict

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import pd_sim
from pd_sim import ABORT_S, DEADLINE_MS, ENGINE, MARGIN_S, PullReqMeta, World

NBLOCKS = 6
STEP_S = 0.1  # one engine step
DECODE_S = 0.5  # a request whose load ended OK decodes this long, then frees its blocks
BOOT_MAX_S = 2.0
DEADLINE_S = DEADLINE_MS / 1000.0
REPORT_BY_S = DEADLINE_S + 0.25 + 2 * STEP_S  # the ledger's deadline, seen at the next step
FREE_BY_S = BOOT_MAX_S + ABORT_S + MARGIN_S + 2.0 + 1.0  # bound + the close's monitor read + slack
FULL_WRITE_S = 2.5  # the full space's long writes
P_FREE_BY_S = ABORT_S + 3 * STEP_S  # plus the run's longest write: P keeps blocks it is writing (``sending``)
MAX_LINK_CHANGES = 3  # per run: most of a run is requests, prefills and time, around a few faults
MAX_FAULTS = 3
SEEN: dict[str, int] = defaultdict(int)  # how often each path ran, over every example (not vacuous)


class _Req:
    def __init__(self, rid: str) -> None:
        self.request_id = rid
        self.kv_transfer_params = None
        self.status = None


class PDModel(RuleBasedStateMachine):
    P_TP = 1
    FULL = False  # 7a's two ways in (module docstring)
    DUP_PULLS = False  # a pull may be duplicated too (TCP never does it)

    def __init__(self) -> None:
        super().__init__()
        mod = pd_sim.hardened_module()
        SEEN["examples"] += 1
        self.mod = mod
        self.world = World(self.P_TP)
        self.world.dup_pulls = self.DUP_PULLS
        pd_sim.WORLD_MONITORS.clear()
        pd_sim.bind_clock(mod, self.world)
        self.violations: list[str] = []
        self.world.loop.set_exception_handler(self._crash)
        self.bootstrap_s = 0.0
        self.write_s = self.write_max = 0.05
        self.cut: set[int] = set()
        self.d = mod.HardenedMooncakeConnectorWorker(pd_sim.config(self.world, self, 0, False), "d-engine", None)
        # D's bound on a pull (abort timeout + BOUND_MARGIN_S: 60 s on real nodes, MARGIN_S here) must
        # leave P a whole write after its abort timeout: in the full space a write takes 2.5 s
        self.margin_s = MARGIN_S + (FULL_WRITE_S if self.FULL else 0.0)
        self.d.bound_s = ABORT_S + self.margin_s
        self.sched = object.__new__(mod.HardenedMooncakeConnectorScheduler)
        self.sched._loading, self.sched._to_cancel, self.sched._eos_held = {}, set(), set()
        self.p = [mod.HardenedMooncakeConnectorWorker(pd_sim.config(self.world, self, r, True), ENGINE, None)
                  for r in range(self.P_TP)]
        for p in self.p:
            self.world.loop.create_task(p._mooncake_sender_listener(asyncio.Event()))
        self.world.d_send_hooks.append(self._d_sent)
        self.world.p_send_hooks.append(self._p_sent)
        self.free = set(range(NBLOCKS))
        self.owner: dict[int, str] = {}
        self.reqs: dict[str, dict] = {}
        self.metas: dict[str, PullReqMeta] = {}
        self.new_loads: list[str] = []
        self.wrote: dict[tuple[str, int], float] = {}  # (request, P rank) -> when its write landed whole
        self.landed: dict[tuple[str, int], int] = defaultdict(int)  # bytes of it landed so far
        self.writes: list[int] = []  # each write's bytes (new_write)
        self.p_kept: dict[tuple[str, int], float] = {}  # (request, rank) -> when P's prefill kept its blocks
        self.p_acked: dict[tuple[str, int], float] = {}
        self.n = 0
        self.n_link = self.n_fault = 0
        self.world.loop.create_task(self._engine())
        self.world.run_until(self.world.now() + STEP_S)

    # ------------------------------------------------------------------ bookkeeping
    def _crash(self, loop, ctx) -> None:
        exc = ctx.get("exception")
        if exc is not None and not isinstance(exc, asyncio.CancelledError):
            self.violations.append(f"a task of the real code raised {type(exc).__name__}: {exc}")

    def _violate(self, msg: str) -> None:
        self.violations.append(msg)

    def _terminal(self, rid: str, what: str) -> None:
        r = self.reqs[rid]
        r["terminal"].append(what)
        if len(r["terminal"]) > 1:
            self._violate(f"{rid} reached two terminal states: {r['terminal']}")
        SEEN[what] += 1

    def _free(self, rid: str) -> None:
        r = self.reqs[rid]
        if r["freed"] is not None:
            self._violate(f"{rid}'s blocks released twice")
            return
        r["freed"] = self.world.now()
        for b in r["blocks"]:
            del self.owner[b]
            self.free.add(b)

    def new_write(self, total_bytes: int) -> int:
        """A write P is about to hand its executor (pd_sim's _build_transfer_params): its id."""
        self.writes.append(total_bytes)
        return len(self.writes) - 1

    def write_chunk(self, rank: int, src, dst, lengths) -> int:
        """P's transfer engine writing one chunk of D's blocks (upstream: run_in_executor(_send_blocks),
        the hardened P in chunks): it takes its share of the write's ``write_s`` and lands at the
        end; every block it names must be its request's at D when it starts and when it lands. A
        cut write (the transfer engine fails) returns -1. Runs in the executor's thread, in turns
        with the world's loop (pd_sim.SimExecutor)."""
        parts: dict[tuple[str, int], int] = defaultdict(int)  # (request, block) -> bytes
        wid = None
        for s_ptr, d_ptr, n in zip(src, dst, lengths):
            w_r_b = s_ptr // pd_sim.PTR_STRIDE
            wid, rid = w_r_b // 1_000_000, f"r{w_r_b // 1000 % 1000}"
            parts[(rid, d_ptr // pd_sim.PTR_STRIDE)] += n
        total = sum(parts.values())

        def check() -> bool:
            for d, b in parts:
                if self.owner.get(b) != d:
                    self._violate(f"P rank {rank} wrote {d}'s KV into block {b}, which D holds for "
                                  f"{self.owner.get(b) or 'nobody (freed)'}")
                    return False
            return True

        if not check():
            return -1
        if rank in self.cut:
            self.cut.discard(rank)
            SEEN["write_cut"] += 1
            return -1
        pd_sim.executor_sleep(self.write_s * total / max(1, self.writes[wid]))
        if not check():
            return -1
        for (d, b), n in parts.items():
            self.landed[(d, rank)] += n
            if self.landed[(d, rank)] >= len(self.reqs[d]["blocks"]) * pd_sim.BLOCK_BYTES and (d, rank) not in self.wrote:
                self.wrote[(d, rank)] = self.world.now()
                SEEN["written"] += 1
        SEEN["chunks"] += 1
        return 0

    def _d_sent(self, data: bytes) -> None:
        msg = pd_sim.Codec.decode(data)
        if not isinstance(msg, dict) or self.mod.CANCEL_KEY not in msg:
            return
        for tid in msg[self.mod.CANCEL_KEY]:
            rid = tid[1:]
            r = self.reqs[rid]
            if r["state"] not in ("aborted", "failed") and not self.metas[rid].failed:
                self._violate(f"D asked P to cancel {rid} ({r['state']}): neither finished at D nor its pull failed")
        SEEN["cancel_sent"] += 1

    def _p_sent(self, rank: int, data: bytes) -> None:
        msg = pd_sim.Codec.decode(data)
        if isinstance(msg, dict) and "cancelled" in msg:
            for tid in msg["cancelled"]:
                # freed at once, unless a pull that names it still waits at P (for its siblings'
                # prefills): then when that pull ends, within P's abort timeout (the general bound)
                if not self.p[rank]._waiters.get(tid):
                    self.p_acked.setdefault((tid[1:], rank), self.world.now())
                SEEN["cancel_acked"] += 1

    # ------------------------------------------------------------------ the engines
    async def _engine(self) -> None:
        while True:
            await asyncio.sleep(STEP_S)
            try:
                self._d_step()
                for rank, p in enumerate(self.p):
                    for p_rid in await p.fetch_finished_sending_reqs():
                        key = (p_rid[1:], rank)
                        if key not in self.p_kept:
                            self._violate(f"P rank {rank} released {p_rid}, whose blocks it never kept")
                        elif self.p_kept[key] is not None:
                            self.reqs[p_rid[1:]]["p_freed"][rank] = self.world.now()
                            self.p_kept[key] = None
                            SEEN["p_freed"] += 1
            except Exception as e:  # noqa: BLE001 - the real code raised: a violation, not a hang
                self._violate(f"the engine step raised {type(e).__name__}: {e}")

    def _d_step(self) -> None:
        now = self.world.now()
        res = self.d.get_transfer_results()
        invalid: set[int] = set()
        while not self.d._invalid_block_ids.empty():
            invalid |= self.d._invalid_block_ids.get_nowait()
        for rid, r in self.reqs.items():
            if r["state"] == "waiting" and invalid & set(r["blocks"]):
                r["state"] = "failed"  # policy fail: FINISHED_ERROR; vLLM keeps its blocks until finished_recving
                self._terminal(rid, "failed")
                self.sched.request_finished(_Req(rid), [r["blocks"]])
        for rid in res.finished_recving:
            r = self.reqs[rid]
            if r["state"] == "waiting":
                for rank in range(self.P_TP):
                    if (rid, rank) not in self.wrote:
                        self._violate(f"{rid}'s load reported OK before P rank {rank} wrote it")
                r["state"] = "running"
                r["done_at"] = now + DECODE_S
                self._terminal(rid, "ok")
            elif r["state"] in ("failed", "aborted") and r["freed"] is None:
                self._free(rid)
                SEEN["released"] += 1
            else:
                self._violate(f"{rid} reported in finished_recving again ({r['state']})")
        self.sched.update_connector_output(res)
        for rid, r in self.reqs.items():
            if r["state"] == "running" and now >= r["done_at"]:
                r["state"] = "done"
                self.sched.request_finished(_Req(rid), [r["blocks"]])
                self._free(rid)
        loads = {}
        for rid in self.new_loads:
            self.reqs[rid]["t_load"] = now
            loads[rid] = self.metas[rid]
        self.new_loads = []
        meta = types.SimpleNamespace(reqs_to_recv={ENGINE: loads} if loads else {}, reqs_to_send={},
                                     reqs_not_processed=set())
        self.d.start_load_kv(self.sched.build_connector_meta(meta))

    def _p_meta(self, rid: str, blocks) -> types.SimpleNamespace:
        return types.SimpleNamespace(reqs_to_recv={}, reqs_to_send={f"p{rid}": (f"t{rid}", blocks)},
                                     reqs_not_processed=set())

    @initialize(delay=st.sampled_from([0.001, 0.05, 0.3]), jitter=st.booleans(),
                bootstrap_s=st.sampled_from([0.0, 0.3, BOOT_MAX_S]), seed=st.integers(0, 2**16), data=st.data())
    def profile(self, delay: float, jitter: bool, bootstrap_s: float, seed: int, data) -> None:
        """The run's network and P: latency (with jitter each message draws its own, up to it, so
        messages on different connections overtake each other), write time, bootstrap time."""
        write_s = data.draw(st.sampled_from([0.05, 0.3, FULL_WRITE_S] if self.FULL else [0.05, 0.3]), label="write_s")
        self.write_max = max(self.write_max, write_s)
        self.world.delay, self.write_s, self.bootstrap_s = delay, write_s, bootstrap_s
        self.world.jitter_seed(seed if jitter else None)

    # ------------------------------------------------------------------ the client and P's scheduler
    @precondition(lambda self: len(self.free) >= 1 and len(self.reqs) < 10)
    @rule(n=st.integers(1, 3), size=st.integers(1, 2))
    def new_requests(self, n: int, size: int) -> None:
        """Requests of one step get blocks (lowest free first: a freed block is reused at once);
        their loads start at the next step; P has scheduled their prefills."""
        for _ in range(n):
            if len(self.free) < size:
                break
            rid = f"r{self.n}"
            self.n += 1
            blocks = sorted(self.free)[:size]
            for b in blocks:
                self.free.discard(b)
                self.owner[b] = rid
            self.reqs[rid] = {"blocks": blocks, "state": "waiting", "terminal": [], "freed": None,
                              "t_load": None, "p_freed": {}}
            self.sched._loading[rid] = frozenset(blocks)  # update_state_after_alloc
            self.metas[rid] = PullReqMeta(rid, f"t{rid}", [list(blocks)], ENGINE, "http://p-bootstrap")
            self.new_loads.append(rid)
            for p in self.p:
                p.start_load_kv(self._p_meta(rid, []))

    @rule(data=st.data())
    def abort(self, data) -> None:
        live = sorted(r for r, v in self.reqs.items() if v["state"] in ("waiting", "running"))
        if not live:
            return
        rid = data.draw(st.sampled_from(live), label="abort")
        r = self.reqs[rid]
        if r["state"] == "running":
            r["state"] = "done"
            self.sched.request_finished(_Req(rid), [r["blocks"]])
            self._free(rid)
            return
        r["state"] = "aborted"
        if rid in self.new_loads:  # not scheduled yet: vLLM frees it at once
            self.new_loads.remove(rid)
            self.sched._loading.pop(rid, None)
            self._terminal(rid, "aborted")
            self._free(rid)
            return
        self._terminal(rid, "aborted")
        delay, _ = self.sched.request_finished(_Req(rid), [r["blocks"]])
        assert delay is False

    @rule(data=st.data())
    def prefill_ready(self, data) -> None:
        todo = sorted((r for r in self.reqs if (r, 0) not in self.p_kept), key=lambda r: int(r[1:]))
        if not todo:
            return
        rid = data.draw(st.sampled_from(todo[:2]), label="prefill")  # P prefills in about arrival order
        for rank, p in enumerate(self.p):
            self.p_kept[(rid, rank)] = self.world.now()
            self.reqs[rid].setdefault("p_kept_at", self.world.now())
            p.start_load_kv(self._p_meta(rid, [[100 + self.n]]))

    # ------------------------------------------------------------------ time and faults
    @rule(dt=st.sampled_from([0.1, 0.3, 0.6, 1.5]))
    def advance(self, dt: float) -> None:
        self.world.run_until(self.world.now() + dt)

    @precondition(lambda self: self.n_link < MAX_LINK_CHANGES)
    @rule(data=st.data())
    def link(self, data) -> None:
        self.n_link += 1
        rank = data.draw(st.integers(0, self.P_TP - 1), label="rank")
        modes = ["up", "refuse", "blackhole"]
        if not self.FULL and self.world.mode[rank] == "blackhole":
            modes = ["up"]  # blackhole -> refuse opens 7a's keepalive window
        self.world.set_mode(rank, data.draw(st.sampled_from(modes), label="mode"))

    @precondition(lambda self: self.n_fault < MAX_FAULTS)
    @rule(data=st.data())
    def fault(self, data) -> None:
        """One of the rarer faults (one rule, so that requests, prefills, time and links are drawn
        often): a reset of a rank's connections, the network's latency, the next message lost or
        duplicated, the next write of a rank cut, how long writes take, how long the bootstrap
        query takes."""
        self.n_fault += 1
        kind = data.draw(st.sampled_from(["reset", "latency", "lose", "duplicate", "cut", "write_time",
                                          "bootstrap_time"]), label="fault")
        SEEN[f"fault_{kind}"] += 1
        if kind == "reset":
            self.world.drop(data.draw(st.integers(0, self.P_TP - 1), label="rank"))
        elif kind == "latency":
            self.world.delay = data.draw(st.sampled_from([0.001, 0.05, 0.3]), label="latency")
        elif kind == "lose":
            self.world.lose_next = True
        elif kind == "duplicate":
            self.world.dup_next = True
        elif kind == "cut":
            self.cut.add(data.draw(st.integers(0, self.P_TP - 1), label="rank"))
        elif kind == "write_time":
            self.write_s = data.draw(st.sampled_from([0.05, 0.3, FULL_WRITE_S] if self.FULL else [0.05, 0.3]), label="write_s")
            self.write_max = max(self.write_max, self.write_s)
        else:
            self.bootstrap_s = data.draw(st.sampled_from([0.0, 0.3, BOOT_MAX_S]), label="bootstrap_s")

    # ------------------------------------------------------------------ invariants
    @invariant()
    def no_violation(self) -> None:
        assert not self.violations, self.violations[0]

    @invariant()
    def within_bounds(self) -> None:
        now = self.world.now()
        for rid, r in self.reqs.items():
            t = r["t_load"]
            if t is None:
                continue
            if r["state"] == "waiting" and now > t + REPORT_BY_S:
                raise AssertionError(f"{rid}: no terminal state {now - t:.2f} s after its load started")
            if r["state"] in ("failed", "aborted") and r["freed"] is None and now > t + FREE_BY_S + self.margin_s - MARGIN_S:
                raise AssertionError(f"{rid} ({r['state']}) still holds its blocks {now - t:.2f} s after its load")
        for (rid, rank), t in self.p_kept.items():
            if t is None:
                continue
            ack = self.p_acked.get((rid, rank))
            if now > t + P_FREE_BY_S + self.write_max:
                raise AssertionError(f"P rank {rank} still keeps {rid}'s blocks {now - t:.2f} s after its prefill")
            if ack is not None and now > max(t, ack) + 3 * STEP_S:
                raise AssertionError(f"P rank {rank} still keeps {rid}'s blocks {now - max(t, ack):.2f} s after "
                                     f"it acknowledged D's cancel")

    @invariant()
    def blocks_add_up(self) -> None:
        held = {b for r in self.reqs.values() if r["freed"] is None for b in r["blocks"]}
        assert held.isdisjoint(self.free) and len(held) + len(self.free) == NBLOCKS
        assert set(self.owner) == held

    def teardown(self) -> None:
        try:
            end = self.world.now() + FREE_BY_S + self.margin_s + P_FREE_BY_S + self.write_max + 1.0
            while self.world.now() < end and not self.violations:
                self.world.run_until(self.world.now() + 0.5)
                self.within_bounds()
            self.no_violation()
            for rid, r in self.reqs.items():
                if r["t_load"] is not None and len(r["terminal"]) != 1:
                    raise AssertionError(f"{rid} ended with terminal states {r['terminal']}")
            SEEN["runs"] += 1
            for k, v in self.world.seen.items():
                SEEN[k] += v
        finally:
            self.world.close()


def model(p_tp: int, full: bool = False, dup_pulls: bool = False) -> type:
    name = f"PDModelTP{p_tp}{'Full' if full else ''}{'DupPulls' if dup_pulls else ''}"
    return type(name, (PDModel,), {"P_TP": p_tp, "FULL": full, "DUP_PULLS": dup_pulls})


class _Draw:
    """Hypothesis' data object for a hand-written run: hands out the given values in order."""

    def __init__(self, *values) -> None:
        self.values = list(values)

    def draw(self, strategy, label=None):
        return self.values.pop(0)


def directed_7a(case: str) -> dict:
    """Defect 7a's two interleavings (issue 43), run by hand on the real code at TP 1, each with
    the one write of one request (2 MiB) in flight when D may read P as gone:

    - ``refuse``: the write takes 6 s and starts 0.3 s before P's side-channel link starts refusing
      (D's connection reset at once, P's keepalive sees it 1 s later). Without P's cut, D's fence
      (2 s after the first refusal) ends before the write does.
    - ``blackhole``: the link blackholes while the pull waits for P's prefill; the prefill ends
      2.1 s in and P, which cannot see a blackhole for a minute, starts a 2.5 s write; 1.5 s later
      the link refuses: D's connection was lost long enough ago, so two refusals (0.2 s) read as P
      gone, while P's keepalive needs 1 s to see the reset. Without D's fence the blocks go while
      P writes (P's cut comes a second late).

    Returns what happened: the violations, the bytes that landed, when D freed the blocks (seconds
    from the start), P's counts."""
    m = model(1, full=True)()
    try:
        m.profile(0.001, False, 0.0, 0, _Draw(6.0 if case == "refuse" else FULL_WRITE_S))
        m.d.bound_s = ABORT_S + 60.0  # the real margin: D's bound is never what ends these
        t0 = m.world.now()
        m.new_requests(1, 1)
        if case == "refuse":
            m.prefill_ready(_Draw("r0"))
            m.advance(0.3)  # the pull reached P, whose write began
            m.link(_Draw(0, "refuse"))
        else:
            m.advance(0.3)  # the pull waits at P for its prefill
            m.link(_Draw(0, "blackhole"))
            m.advance(1.5)  # D lost the connection (its heartbeat timeout)
            m.advance(0.6)
            m.prefill_ready(_Draw("r0"))  # P, which cannot see a blackhole for a minute, writes
            m.advance(1.5)
            m.link(_Draw(0, "refuse"))
        for _ in range(20):
            m.advance(0.6)
        r = m.reqs["r0"]
        return {"violations": list(m.violations), "landed": m.landed.get(("r0", 0), 0),
                "bytes": pd_sim.BLOCK_BYTES, "state": r["state"],
                "freed_s": None if r["freed"] is None else round(r["freed"] - t0, 2),
                "d": dict(m.d.failures.totals), "p": dict(m.p[0].failures.totals)}
    finally:
        m.world.close()
