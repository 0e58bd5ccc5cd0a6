"""A stateful model of the P/D pull protocol (issue 30, item 4), over the hardened connector's REAL
pure rules: D's :class:`LoadLedger` (deadlines, one report per load), its :class:`Settlements`
(blocks freed only once P cannot write, closed when given up before a pull opened), which
requests of a pull D cancels (:func:`connector_patch.pd.pull.cancel_targets`) and P's
:class:`TerminalRecords`. What vLLM and Mooncake do around them is modelled here, as
``connector_patch/pd/vllm_connector.py`` glues the rules in (one small step per rule, named after
the method it stands for); nothing of vLLM is imported.

Messages over TCP are neither duplicated nor reordered within one connection; the model
duplicates them anyway (a D that pulls the same transfer twice), and P then behaves as upstream's:
blocks it sent went back to its pool, so it never writes a transfer twice.

Actors: D's scheduler (steps, aborts), D's worker (the bootstrap query, one pull per P worker of a
step's requests, its deadline, cancel rounds, its bound), P with ``WORKERS`` TP ranks (a pull per
rank; a rank writes D's blocks when its prefill is ready, waits for it up to its abort timeout,
answers cancels as the hardened P does) and the network: every message may be delivered late, in
any order, lost or duplicated; one older than ``MAX_DELAY`` is lost (a TCP connection delivers
within a bound or fails).

Invariants, checked after every step:

- no write into a block D does not hold for that request (freed, or another request's);
- every load is reported by its deadline, and every failed or aborted load gives its blocks back
  by its bound (P's abort timeout + margin, as upstream's receive timeout);
- D asks P to cancel only requests the client aborted or whose pull failed: an abort touches only
  its own request;
- the block pool adds up: each block free or held by exactly one request.

Not modelled: P restarts (found again through the bootstrap query: real nodes, pd-long), HMA block
groups, vLLM's preemption.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from connector_patch.pd import pull as pull_rules
from connector_patch.pd.ledger import LoadLedger
from connector_patch.pd.settle import Settlements
from connector_patch.pd.terminal import TerminalRecords

# times in model seconds: only their order matters (deadline < P's abort timeout < D's bound), as
# in the scenarios (2 s < 10 s < 70 s) and vLLM's defaults (30 s < 480 s < 540 s)
DEADLINE = 1.5  # D's kv_load_timeout_ms
P_TIMEOUT = 3.0  # P waits this long for its own prefill, then answers the pull with an error
MAX_DELAY = 0.5  # a message older than this is lost
BOUND = P_TIMEOUT + MAX_DELAY + 0.5  # D's bound on a pull: P never writes after it
CANCEL_EVERY = 0.5
NBLOCKS = 6


SEEN: dict[str, int] = defaultdict(int)  # how often each path ran, over every example (the model is not vacuous)


class PDModel(RuleBasedStateMachine):
    WORKERS = 1

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.ledger = LoadLedger(int(DEADLINE * 1000))
        self.sets = Settlements()
        self.terminal = [TerminalRecords(P_TIMEOUT) for _ in range(self.WORKERS)]
        self.free = set(range(NBLOCKS))
        self.owner: dict[int, str] = {}
        self.reqs: dict[str, dict] = {}
        self.bootstrap: list[list[str]] = []  # steps whose pulls wait for P's bootstrap answer
        self.pulls: dict[int, dict] = {}  # D's pulls in flight
        self.p_pending: list[dict] = [{} for _ in range(self.WORKERS)]  # P rank -> pull id -> its state
        self.p_ready: set[str] = set()  # requests whose prefill ended on P
        # per P rank, requests it wrote: their blocks go back to P's pool once sent (finished_sending),
        # so a second pull for one (duplicated) waits for a prefill that never comes again, as upstream
        self.p_sent: list[set[str]] = [set() for _ in range(self.WORKERS)]
        self.net: list[dict] = []
        self.cancel_wanted: set[str] = set()
        self.ok_count: dict[str, int] = defaultdict(int)
        self.ids = itertools.count()

    # ------------------------------------------------------------------ helpers
    def _send(self, **msg) -> None:
        self.net.append({**msg, "t": self.now})

    def _free(self, rid: str) -> None:
        """vLLM frees the request's blocks (finished_recving of a finished request)."""
        r = self.reqs[rid]
        assert not r["freed"], f"{rid}: blocks freed twice"
        r["freed"] = True
        for b in r["blocks"]:
            assert self.owner.get(b) == rid
            del self.owner[b]
            self.free.add(b)

    def _act(self, rid: str, action: str | None) -> None:
        if action == "recv":
            self._free(rid)

    def _settled(self, rids, worker: int) -> None:
        for rid in rids:
            self._act(rid, self.sets.settle(rid, f"p{worker}", self.now))

    def _fail(self, rids, code: str) -> None:
        for rid in rids:
            self.ledger.fail(rid, code)

    def _collect(self) -> None:
        """get_transfer_results: the ledger's report; a failed load frees once settled."""
        rep = self.ledger.collect(self.now)
        for rid in rep.finished:
            r = self.reqs[rid]
            if rid in rep.failed_ids:
                r["status"] = "failed"
                SEEN["failed"] += 1
                if self.sets.want(rid, "recv"):
                    self._free(rid)
            else:
                SEEN["done"] += 1
                r["status"] = "done"  # its blocks now hold its KV: the request decodes on them

    def _end_pull(self, pid: int) -> None:
        p = self.pulls.pop(pid)
        self.cancel_wanted.difference_update(p["reqs"])
        self._settled(p["reqs"], p["worker"])
        if p["code"]:
            self._fail(p["reqs"] - p["named"], p["code"])

    # ------------------------------------------------------------------ D's scheduler
    @precondition(lambda self: len(self.free) >= 1 and len(self.reqs) < 12)
    @rule(n=st.integers(1, 3), size=st.integers(1, 2))
    def step(self, n: int, size: int) -> None:
        """Requests of one step get blocks (lowest free first: a freed block is reused at once) and
        their loads start (start_load_kv); their pulls wait for the bootstrap query."""
        group = []
        for _ in range(n):
            if len(self.free) < size:
                break
            blocks = sorted(self.free)[:size]
            rid = f"r{next(self.ids)}"
            for b in blocks:
                self.free.discard(b)
                self.owner[b] = rid
            self.reqs[rid] = {"blocks": blocks, "status": "waiting", "aborted": False, "freed": False,
                              "start": self.now}
            assert self.ledger.start(rid, [blocks], self.now)
            group.append(rid)
        if group:
            self.bootstrap.append(group)

    @rule(data=st.data())
    def abort(self, data) -> None:
        """The client disconnects (request_finished -> the worker's _cancelled)."""
        live = sorted(r for r, v in self.reqs.items() if not v["aborted"] and v["status"] != "done")
        if not live:
            return
        rid = data.draw(st.sampled_from(live))
        self.reqs[rid]["aborted"] = True
        tracked = self.ledger.forget(rid)
        if tracked:
            self.reqs[rid]["status"] = "aborted"
            if self.sets.want(rid, "recv"):
                self._free(rid)
        if self.sets.is_open(rid):
            self.cancel_wanted.add(rid)

    # ------------------------------------------------------------------ D's worker
    @precondition(lambda self: bool(self.bootstrap))
    @rule(data=st.data())
    def bootstrap_answers(self, data) -> None:
        """P's bootstrap server answered: receive_kv opens each load still held and sends one pull
        per P rank (a load given up meanwhile is refused by the settlements: never pulled)."""
        group = self.bootstrap.pop(data.draw(st.integers(0, len(self.bootstrap) - 1)))
        workers = [f"p{w}" for w in range(self.WORKERS)]
        live = {rid for rid in group if self.sets.opened(rid, workers)}
        SEEN["pull_dropped"] += len(group) - len(live)
        if not live:
            return
        for w in range(self.WORKERS):
            pid = next(self.ids)
            self.pulls[pid] = {"worker": w, "reqs": set(live), "named": set(), "code": None, "t0": self.now,
                               "unsettled": False, "next_cancel": 0.0}
            self._send(kind="pull", worker=w, pid=pid, reqs={r: list(self.reqs[r]["blocks"]) for r in live})

    def _pull_tick(self, pid: int) -> None:
        """One turn of receive_kv_from_single_worker's loop."""
        p = self.pulls[pid]
        if p["code"] is None and self.now >= p["t0"] + DEADLINE:
            p["code"] = "timeout"
            p["unsettled"] = True
            self._fail(p["reqs"] - p["named"], "timeout")
        if p["reqs"] & self.cancel_wanted:
            p["unsettled"] = True
        if self.now >= p["t0"] + BOUND:
            SEEN["bound"] += 1
            self._end_pull(pid)  # upstream's own bound: P has given up writing by now
            return
        if p["unsettled"] and self.now >= p["next_cancel"]:
            p["next_cancel"] = self.now + CANCEL_EVERY
            doomed = pull_rules.cancel_targets(p["reqs"], p["code"] is not None, self.cancel_wanted)
            ids = sorted(r for r in doomed if self.sets.is_open(r, f"p{p['worker']}"))
            if ids:
                for r in ids:  # an abort touches only its own request
                    assert self.reqs[r]["aborted"] or p["code"] is not None, \
                        f"D cancels {r} at P: neither aborted nor its pull failed"
                self._send(kind="cancel", worker=p["worker"], pid=pid, tids=ids)
            if not any(self.sets.is_open(r, f"p{p['worker']}") for r in p["reqs"]):
                self._end_pull(pid)

    @rule(dt=st.sampled_from([0.1, 0.25, 0.5, 1.0]))
    def advance(self, dt: float) -> None:
        self.now += dt
        for pid in sorted(self.pulls):
            if pid in self.pulls:
                self._pull_tick(pid)
        self._p_expire()
        self._collect()

    # ------------------------------------------------------------------ P
    def _p_answer(self, w: int, pid: int) -> None:
        """P's send task for one pull: once every request of it is ready or cancelled, write the
        ready ones into D's blocks and answer FINISH (the cancelled ones in err_reqs)."""
        st_ = self.p_pending[w].get(pid)
        if st_ is None:
            return
        ready = [r for r in st_["reqs"] if r in self.p_ready and r not in self.p_sent[w]
                 and not self.terminal[w].lookup(r, self.now)]
        dead = [r for r in st_["reqs"] if self.terminal[w].lookup(r, self.now)]
        if len(ready) + len(dead) < len(st_["reqs"]):
            return  # P waits for its prefill (up to P_TIMEOUT: _p_expire)
        for r in ready:
            for b in st_["reqs"][r]:
                assert self.owner.get(b) == r, (f"P wrote {r}'s KV into block {b}, which D holds for "
                                                f"{self.owner.get(b) or 'nobody (freed)'}")
        SEEN["written"] += len(ready)
        self.p_sent[w].update(ready)
        del self.p_pending[w][pid]
        self._send(kind="reply", worker=w, pid=pid, ok=ready, err=dead, aborted=True)

    def _p_expire(self) -> None:
        for w in range(self.WORKERS):
            for pid, st_ in list(self.p_pending[w].items()):
                if self.now >= st_["t"] + P_TIMEOUT:
                    SEEN["p_expired"] += 1
                    for r in st_["reqs"]:
                        if r not in self.p_ready or r in self.p_sent[w]:
                            self.terminal[w].record(r, "expired", self.now)
                    self._p_answer(w, pid)

    @rule(data=st.data())
    def prefill_ready(self, data) -> None:
        """P's prefill of a request ends (its blocks handed to the worker: request_finished)."""
        todo = sorted(r for r in self.reqs if r not in self.p_ready)
        if not todo:
            return
        self.p_ready.add(data.draw(st.sampled_from(todo)))
        for w in range(self.WORKERS):
            for pid in sorted(self.p_pending[w]):
                self._p_answer(w, pid)

    def _p_receive(self, m: dict) -> None:
        w = m["worker"]
        if m["kind"] == "pull":
            if any(m["pid"] in self.p_pending[x] for x in range(self.WORKERS)):
                return  # a duplicate of a pull P is serving
            dead = [r for r in m["reqs"] if self.terminal[w].lookup(r, self.now)]
            if dead:  # send_kv_to_decode: a terminal transfer is answered at once
                self._send(kind="reply", worker=w, pid=m["pid"], ok=[], err=dead, aborted=True,
                           final=len(dead) == len(m["reqs"]))
            live = {r: b for r, b in m["reqs"].items() if r not in dead}
            if live:
                self.p_pending[w][m["pid"]] = {"reqs": live, "t": self.now}
                self._p_answer(w, m["pid"])
        else:  # a cancel: the hardened P's _on_cancel
            acked = []
            for r in m["tids"]:
                self.terminal[w].record(r, "cancelled", self.now)
                acked.append(r)
            SEEN["cancelled"] += len(acked)
            self._send(kind="ack", worker=w, pid=m["pid"], acked=acked)
            for pid in sorted(self.p_pending[w]):
                self._p_answer(w, pid)

    # ------------------------------------------------------------------ D receives
    def _d_receive(self, m: dict) -> None:
        p = self.pulls.get(m["pid"])
        if p is None:
            return  # that pull is over: its socket is closed
        w = p["worker"]
        if m["kind"] == "ack":
            self._settled(set(m["acked"]) & p["reqs"], w)
            if not any(self.sets.is_open(r, f"p{w}") for r in p["reqs"]):
                self._end_pull(m["pid"])
            return
        for r in m["ok"]:
            if r in p["reqs"] and r not in p["named"]:
                p["named"].add(r)
                self.ok_count[r] += 1
                if self.ok_count[r] >= self.WORKERS:
                    self.ledger.ok(r)
        errs = [r for r in m["err"] if r in p["reqs"]]
        if errs:
            p["named"].update(errs)
            self._settled(errs, w)
            self._fail(errs, "aborted")
        if m.get("final", True):
            unnamed = p["reqs"] - p["named"]
            self._settled(unnamed, w)
            self._fail(unnamed, "unanswered")
            p["named"] |= unnamed
            self._end_pull(m["pid"])

    # ------------------------------------------------------------------ the network
    @precondition(lambda self: bool(self.net))
    @rule(data=st.data())
    def deliver(self, data) -> None:
        m = self.net.pop(data.draw(st.integers(0, len(self.net) - 1)))
        if self.now - m["t"] > MAX_DELAY:
            return  # too late: the connection failed, the message is lost
        if m["kind"] in ("pull", "cancel"):
            self._p_receive(m)
        else:
            self._d_receive(m)

    @precondition(lambda self: bool(self.net))
    @rule()
    def flush(self) -> None:
        """The network delivers the oldest messages in flight, in order (the common case), and what
        that sends in turn: four at most."""
        for _ in range(4):
            if not self.net:
                return
            m = self.net.pop(0)
            if self.now - m["t"] > MAX_DELAY:
                continue  # too late: lost
            if m["kind"] in ("pull", "cancel"):
                self._p_receive(m)
            else:
                self._d_receive(m)

    @precondition(lambda self: bool(self.net))
    @rule(data=st.data())
    def lose(self, data) -> None:
        self.net.pop(data.draw(st.integers(0, len(self.net) - 1)))

    @precondition(lambda self: bool(self.net) and len(self.net) < 30)
    @rule(data=st.data())
    def duplicate(self, data) -> None:
        self.net.append(dict(self.net[data.draw(st.integers(0, len(self.net) - 1))]))

    # ------------------------------------------------------------------ invariants
    @invariant()
    def blocks_add_up(self) -> None:
        held = {b for r in self.reqs.values() if not r["freed"] for b in r["blocks"]}
        assert held.isdisjoint(self.free) and len(held) + len(self.free) == NBLOCKS
        assert set(self.owner) == held

    @invariant()
    def every_load_reported_by_its_deadline(self) -> None:
        for rid, r in self.reqs.items():
            if not r["aborted"] and self.now >= r["start"] + DEADLINE:
                assert r["status"] in ("done", "failed"), f"{rid} unreported {self.now - r['start']:.1f} s in"

    @invariant()
    def failed_or_aborted_loads_give_their_blocks_back_by_their_bound(self) -> None:
        for rid, r in self.reqs.items():
            # a pull opens before the load's deadline (after it, the load is given up: closed) and
            # ends by its bound, at the next turn of its loop
            if r["status"] in ("failed", "aborted") and self.now >= r["start"] + DEADLINE + BOUND + 1.0:
                assert r["freed"], f"{rid} ({r['status']}) still holds its blocks {self.now - r['start']:.1f} s in"


class PDModelTwoRanks(PDModel):
    WORKERS = 2
