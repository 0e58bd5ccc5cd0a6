"""Run scenarios: topology + workload + nemesis (fault schedule) + checks, per target.

Family-independent (Jepsen's test runner): for each scenario and target, the scenario's family
builds the topology; the runner starts it, lets each fault prepare what is slow to make (a helper
process), starts the workload node, sends it the start signal (t0), applies each fault at ``t0 +
at`` and heals it at ``t0 + at + for``, waits for the workload (never longer than the scenario's
cap), heals whatever is still injected, releases what the faults prepared, probes every node, tears
everything down, merges the workload's ops into the journal and runs the checks on the journal. A
scenario run never hangs: every wait is bounded, and a workload stuck in a call (a client with no
deadline) is killed and its in-flight ops recorded as stalled.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from faults.base import Fault, load_registry

from .saved import check_saved
from nodekit import journal as J
from . import verdicts as V
from .errors import HarnessError
from nodekit.journal import JournalWriter, read_journal
from .outputs import Result, write_junit, write_summary  # noqa: F401 - re-exported for callers
from .schema import LoadedScenario
from .topology import BaseTopology
from .triggers import none_reason
from . import phases as PH

GRACE_S = 1.0  # after the workload's duration, on top of deadline + tolerance
RELEASE_MARGIN_S = 0.25  # after the last heal, on top of the time recovery's ops need (every worker's N due times)
NEMESIS_JOIN_S = 15.0  # a fault start/stop is bounded (a node's READY wait is 10 s)


def new_run_dir(root: str | Path = "runs") -> Path:
    run_id = datetime.now().strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)
    d = Path(root) / run_id
    d.mkdir(parents=True, exist_ok=False)
    return d


def missing_requirements(scenario: LoadedScenario, services: dict[str, Any], profile: Any = None) -> str | None:
    """Why this scenario cannot run here under the launch ``profile`` (skipped, never passed), or None."""
    registry = load_registry(scenario.family.name)
    needs = set(scenario.family.requirements(scenario))
    for f in scenario.faults:
        needs |= set(registry[f.type].requires)
    why = scenario.family.unmet(scenario, needs) or scenario.family.unavailable(scenario, profile)
    if why:
        return why
    if "toxiproxy" in needs and services.get("toxiproxy") is None:
        return "toxiproxy-server is not installed (run `pdchaos setup`; see `pdchaos doctor`)"
    if "root" in needs and os.geteuid() != 0:
        return "needs root (network namespaces and iptables)"
    if "netns" in needs:
        from faults.netns import availability

        ok, why = availability()
        if not ok:
            return f"isolated hosts unavailable: {why}"
    return None


def not_applicable(sc: LoadedScenario, target: str) -> dict[str, str]:
    """{check: why} for the checks not run for this scenario and target: the family's, and those
    that judge fault windows when no fault is scheduled."""
    na = dict(sc.family.not_applicable(sc, target))
    if not sc.faults:
        na.setdefault("recovery", "no fault is scheduled")
        na.setdefault("fault_effect", "no fault is scheduled")
        reason = none_reason(triggers_meta(sc.model))
        if reason is not None:  # the scenario says its claim rests on no event, and why
            na["triggers"] = f"none declared: {reason}"
    return na


def fault_meta(sc: LoadedScenario, fault: Fault) -> dict:
    """What the journal's meta line says of one scheduled fault instance: the failure categories it
    should cause (metrics_match), those it explains and for how long after its heal
    (failures_explained), and the effect its window must show (fault_effect)."""
    return {"categories": list(fault.expected_categories()), "explains": list(sc.family.fault_explains(fault)),
            "tail_s": float(sc.family.fault_tail_s(fault, sc)), "required": dict(fault.required_effect())}


def make_fault(registry: dict, entry: Any, ctx: Any) -> Fault:
    """The fault instance of one schedule entry over ``ctx`` (the run's topology, or a stand-in
    that only answers what the fault declares). The entry was validated against a subclass of the
    fault's Params: its values are reused as they are."""
    cls = registry[entry.type]
    return cls(cls.Params.model_construct(**{k: getattr(entry, k) for k in cls.Params.model_fields}), ctx)


class _DeclaredContext:
    """Stand-in for a topology where only a fault's declarations are asked for (no node exists):
    it knows the client deadline and nothing else."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline


def scenario_meta(sc: LoadedScenario, target: str) -> dict:
    """The journal's meta line for one run of ``sc`` as ``target``: everything the checks read
    besides the history (expectation, options, applicability, what each fault must cause). It
    depends on the scenario file alone, so ``pdchaos check`` rebuilds it from the file rather than
    trust the saved line."""
    m, fam = sc.model, sc.family
    registry = load_registry(fam.name)
    faults_meta = []
    # a fault's declared effects depend on its parameters and, for delays, on the client deadline
    # the topology holds (BaseTopology.deadline = the scenario's): an instance over this stand-in
    # context says them as the run's instance does (140 of 140 recorded CI runs: identical)
    ctx = _DeclaredContext(m.deadline)
    for i, f in enumerate(sc.faults):
        fault = make_fault(registry, f, ctx)
        on = getattr(f, "upon", None)
        faults_meta.append({"id": i, "type": f.type, "at": f.at, "for": f.for_,
                            "params": f.model_dump(mode="json", exclude={"type", "at", "for_"}),
                            **({"upon": PH.key_meta(on)} if on is not None else {}),
                            "categories": list(registry[f.type].categories), **fault_meta(sc, fault)})
    na = not_applicable(sc, target)
    return {"type": "meta", "scenario": m.name, "file": str(sc.path), "family": fam.name, "target": target,
            "deadline_ms": m.deadline * 1000.0, "tolerance_ms": m.tolerance * 1000.0, "seed": m.seed,
            "cap_s": m.cap, "wall_start": datetime.now(timezone.utc).isoformat(),
            "checks": Runner._check_config(sc), "not_applicable": na, "expect": m.expected(target),
            "targets": list(m.targets), "baseline_target": fam.baseline_target,
            "gauges": [list(g) for g in getattr(fam, "gauges", ())],  # what reports plot (no family import)
            "failed_words": list(fam.failed_words),
            "primary_ops": list(fam.primary_ops), "op_kinds": list(fam.op_kinds or fam.primary_ops),
            "planned_ops": m.workload.planned_ops(),
            "topology": m.topology.model_dump(), "workload": m.workload.model_dump(), "faults": faults_meta,
            "triggers": triggers_meta(m), "t0": None}


def triggers_meta(m: Any) -> list[dict] | dict:
    """The meta line's ``triggers``: the declared entries, or ``{"none": REASON}``."""
    declared = getattr(m, "triggers", None)
    if declared is None:
        return []
    if isinstance(declared, list):
        return [t.model_dump(mode="json") for t in declared]
    return declared.model_dump(mode="json")


class _Interrupted(Exception):
    pass


class Runner:
    def __init__(self, run_dir: Path, *, targets: list[str] | None = None,
                 on_result: Callable[[Result], None] | None = None, toxiproxy: Any = None,
                 services: dict[str, Any] | None = None, profiles: dict[str, Any] | None = None):
        self.run_dir = run_dir
        self.profiles = dict(profiles or {})  # family name -> its launch profile (None: its default)
        self.targets = targets
        self.on_result = on_result
        self.services = dict(services or {})
        if toxiproxy is not None:
            self.services["toxiproxy"] = toxiproxy
        self.results: list[Result] = []
        self.on_start: Callable[[str, str], None] | None = None
        self._stop = threading.Event()
        self.interrupted_by: str | None = None  # what interrupted the run (a signal's name), once it was

    def interrupt(self, by: str | None = None) -> None:
        """Stop: the run under way tears down (its journal ends ``interrupted``) and no other
        starts. ``by`` names the cause (e.g. ``SIGTERM``) for the journal."""
        if by and self.interrupted_by is None:
            self.interrupted_by = by
        self._stop.set()

    @property
    def interrupted(self) -> bool:
        return self._stop.is_set()

    # ----------------------------------------------------------------------------
    def run(self, scenarios: list[LoadedScenario]) -> list[Result]:
        """Every scenario against each of its targets, in file order, targets in the scenario's order."""
        return self.run_plan([(sc, t) for sc in scenarios for t in sc.model.targets])

    def run_plan(self, plan: list[tuple[LoadedScenario, str]],
                 choose: Callable[[list], int] | None = None) -> list[Result]:
        """These (scenario, target) runs (targets not selected are left out): in this order, or
        each next one ``choose(runs not yet started)`` picks (its position in that list; e.g.
        harness.plan.WarmOrder.choose)."""
        remaining = [(sc, t) for sc, t in plan if not self.targets or t in self.targets]
        while remaining:
            if self._stop.is_set():
                return self.results
            sc, target = remaining.pop(choose(remaining) if choose is not None else 0)
            if self.on_start:
                self.on_start(sc.name, target)
            res = self.run_one(sc, target)
            self.results.append(res)
            if self.on_result:
                self.on_result(res)
        return self.results

    def _meta(self, sc: LoadedScenario, target: str) -> dict:
        return scenario_meta(sc, target)

    def run_one(self, sc: LoadedScenario, target: str) -> Result:
        m = sc.model
        d = self.run_dir / m.name / target
        d.mkdir(parents=True, exist_ok=True)
        res = Result(m.name, str(sc.path), target, f"{m.name}/{target}", "error", m.expected(target),
                     family=sc.family.name)
        started = time.monotonic()
        jw = JournalWriter(d / "journal.jsonl")
        meta = self._meta(sc, target)
        profile = self.profiles.get(sc.family.name)
        why = missing_requirements(sc, self.services, profile)
        if why:
            return self._abandon(jw, meta, res, "skipped", why)
        try:
            from .runtime import runtime_of

            services = {**self.services, "runtime": runtime_of(profile), "runtime_profile": profile,  # where its nodes run
                        "interrupted": self._stop}
            topo = sc.family.topology(sc, target, d, jw.write, services, profile)
        except Exception as exc:  # noqa: BLE001 - e.g. the namespaces could not be made
            return self._abandon(jw, meta, res, "error", f"topology: {type(exc).__name__}: {exc}")
        part = d / "ops.part.jsonl"
        run = _ScenarioRun(self, sc, topo, jw, meta, part)
        reason = run.execute(res, started)
        res.elapsed_s = time.monotonic() - started
        if reason == "interrupted":
            res.verdict, res.reason = "error", "interrupted"
            self._stop.set()
            return res
        if reason == "error":
            res.verdict = "error"
            return res
        results = check_saved(d / "journal.jsonl")
        res.checks = [r.to_dict() for r in results]
        res.verdict, res.failing = V.of_results(results)
        failed = [r for r in results if r.ok is False]
        res.reason = "; ".join(f"{r.name}: {r.message}" for r in failed[:3])
        if res.outcome == "deviation":
            res.reason = V.difference(res.verdict, res.expected, res.failing) + (f" -- {res.reason}" if res.reason
                                                                                  else "")
        (d / "checks.json").write_text(json.dumps(res.checks, indent=1))
        return res

    @staticmethod
    def _abandon(jw: JournalWriter, meta: dict, res: Result, verdict: str, why: str) -> Result:
        jw.write({**meta, ("skipped" if verdict == "skipped" else "error"): why})
        jw.write({"type": "end", "t": time.monotonic(), "reason": verdict, "stalled": 0})
        jw.close()
        res.verdict, res.reason = verdict, why
        return res

    @staticmethod
    def _check_config(sc: LoadedScenario) -> dict:
        """{check: options}: the family's defaults (``Family.check_defaults``), then what the
        scenario sets (only the fields it sets)."""
        cfg: dict = {name: dict(o) for name, o in sc.family.check_defaults.items()}
        for name, opts in sc.model.checks.items():
            o = opts.model_dump(exclude_unset=True)
            for key in ("tolerance", "tail"):
                if o.get(key) is not None:
                    o[f"{key}_ms"] = o.pop(key) * 1000.0
            cfg[name] = {**cfg.get(name, {}), **o}
        return cfg


class _ScenarioRun:
    """One scenario against one target: up, workload + nemesis, teardown, journal."""

    def __init__(self, runner: Runner, sc: LoadedScenario, topo: BaseTopology, jw: JournalWriter, meta: dict,
                 part: Path):
        self.runner, self.sc, self.topo, self.jw, self.meta, self.part = runner, sc, topo, jw, meta, part
        self.active: dict[int, Fault] = {}
        self.faults: list[Fault] = []  # one instance per schedule entry, in file order
        self.prepared: list[Fault] = []  # those whose prepare() was called: released at teardown
        self.stop_nemesis = threading.Event()
        self.nemesis: threading.Thread | None = None
        self.workload = None
        self.horizon = self.end_at = self.op_s = 0.0  # set at t0 (execute)
        self.holding = False  # the workload pauses at its duration's end until _release
        self.tail: PH.PhaseTail | None = None  # the nodes' live phase events, when a fault is keyed on one
        self.missed: list[str] = []  # keyed faults whose phase never came: the run is a harness error
        self.t0 = 0.0
        self._keyed: dict[int, dict] = {}  # id -> the phase event that started it (its journal records)

    def execute(self, res: Result, started: float) -> str:
        m = self.sc.model
        reason = "done"
        try:
            registry = load_registry(self.sc.family.name)
            # each as the run's runtime carries it out (itself locally; a Chaos Mesh object on a cluster)
            self.faults = [self.topo.placement.wrap_fault(make_fault(registry, f, self.topo), f, i)
                           for i, f in enumerate(self.sc.faults)]
            self.topo.start()
            if self.runner.interrupted:  # came while the nodes started (the ones started are torn down)
                raise _Interrupted()
            for i, fault in enumerate(self.faults):  # slow preparations happen before t0, not in the window
                self.prepared.append(fault)
                t_prep = time.monotonic()
                fault.prepare()
                self.topo.event("fault_prepared", fault=fault.name, id=i, s=round(time.monotonic() - t_prep, 3))
            if any(getattr(f, "upon", None) is not None for f in self.sc.faults):
                # from here: what a pooled node wrote in an earlier run is not this run's
                self.tail = PH.PhaseTail(self.topo.phase_files)
            self.workload = self.topo.start_workload(self.part)
            res.setup_s = time.monotonic() - started
            self.op_s = max(m.deadline + m.tolerance, m.workload.op_bound())
            # ``recovery`` needs ops after the last heal, however late it comes (a node restart
            # slower than usual): the workload pauses at its duration's end, if it comes first, and
            # goes on once the nemesis sets its end (_release; nodekit.workload.Horizon)
            self.holding = bool(self.faults) and self._recovery_gap() is not None
            if self.holding:
                self._write_horizon(None)
            t0 = self.t0 = time.monotonic()
            os.kill(self.workload.pid, signal.SIGUSR1)
            self.jw.write({**self.meta, "t0": t0})
            self.horizon = t0 + m.workload.duration  # when the workload stops issuing ops
            self.end_at = float("inf") if self.holding else self.horizon + self.op_s + 2 * GRACE_S
            # the cap bounds the scenario from its t0: a node's cold start (bounded by its own start
            # timeout) never eats the workload's time (a 23.5 s start of two store servers once left a
            # 30 s cap 0.06 s of workload)
            hard_cap = t0 + m.cap
            self.nemesis = threading.Thread(target=self._schedule, args=(t0,), daemon=True, name="nemesis")
            self.nemesis.start()
            self.topo.start_sampling()
            while self.workload.alive and time.monotonic() < min(self.end_at, hard_cap):
                if self.runner.interrupted:
                    raise _Interrupted()
                time.sleep(0.02)
            if self.workload.alive:
                capped = time.monotonic() >= hard_cap
                reason = "cap" if capped else "done"
                self.workload.kill()
                self.topo.event("workload_killed", reason=(f"the scenario's cap ({m.cap:g} s after t0) was reached"
                                                           if capped else "ops still in flight after the grace period"))
            if self.missed:  # the point of the scenario never happened: no verdict is honest
                raise HarnessError("; ".join(self.missed))
        except _Interrupted:
            reason = "interrupted"
        except Exception as exc:  # noqa: BLE001 - a harness failure is an error verdict, never a pass
            if self.runner.interrupted:  # e.g. a node's start cut short by the interrupt: not the system's fault
                reason = "interrupted"
            else:
                reason = "error"
                res.reason = str(exc) if isinstance(exc, HarnessError) else f"{type(exc).__name__}: {exc}"
        finally:
            if reason == "interrupted":
                self.topo.event("interrupted", by=self.runner.interrupted_by or "the caller")
            t_down = time.monotonic()
            self._teardown(reason)
            res.teardown_s = time.monotonic() - t_down
        return reason

    def _teardown(self, reason: str) -> None:
        topo, jw = self.topo, self.jw
        self.stop_nemesis.set()
        if self.nemesis is not None:
            # a fault may be half-way through starting (a peer swap waits for READY): let it
            # finish, so the heal below sees it; never touch the topology from two threads
            bound = max(NEMESIS_JOIN_S, getattr(topo, "fault_bound_s", NEMESIS_JOIN_S))
            self.nemesis.join(bound)
            if self.nemesis.is_alive():
                topo.event("nemesis_stuck", error=f"fault schedule still busy after {bound:g} s")
        for fid, fault in list(self.active.items()):
            self._heal(fault, fid, "teardown")
        self.active.clear()
        for fault in self.prepared:
            try:
                fault.release()
            except Exception as exc:  # noqa: BLE001 - recorded; teardown goes on
                topo.event("fault_error", fault=fault.name, phase="release", error=f"{type(exc).__name__}: {exc}")
        if self.tail is not None:
            self.tail.poll()
            recs, left = self.tail.journal_records(self.t0, time.monotonic())
            for rec in recs:
                jw.write(rec)
            topo.event("phases_seen", n=len(recs) + left, journalled=len(recs), unreadable=self.tail.unreadable,
                       files=len(self.tail._offsets))
        topo.stop_sampling()
        if self.workload is not None:
            self.workload.stop(2.0)
            topo.event("workload_exit", returncode=self.workload.returncode)
        try:
            topo.final_probe()
        except Exception as exc:  # noqa: BLE001 - a probe must not break teardown
            topo.event("probe_failed", error=type(exc).__name__)
        handles = topo.handles() + ([self.workload] if self.workload is not None else [])
        topo.close()
        kept = {id(h) for h in topo.kept()}
        leftovers = [f"{h.name} ({h.instance})" for h in handles if h.alive and id(h) not in kept] + topo.leftovers()
        if leftovers:
            topo.event("leftovers", what_left=leftovers)
        # every node may write its own part of the journal (the workload writes its ops): the
        # parts and the runner's own records become one history, in time order (meta first)
        jw.close()
        parts = sorted(self.part.parent.glob("*.part.jsonl"))
        records = read_journal(jw.path) + [rec for part in parts for rec in read_journal(part)]
        records.sort(key=lambda r: (r.get("type") != "meta", r.get("t", 0.0)))
        stalled = sum(1 for o in J.ops(records) if o.get("outcome") == "stalled")
        records.append({"type": "end", "t": time.monotonic(), "reason": reason, "stalled": stalled})
        tmp = jw.path.with_suffix(".tmp")
        J.write_journal(tmp, records)
        os.replace(tmp, jw.path)
        for part in parts:
            part.unlink()

    def _schedule(self, t0: float) -> None:
        """The nemesis: start and stop events in time order, each recorded in the journal. A fault
        keyed on a phase (``upon:``, harness/phases.py) is armed at its ``at``; it starts ``offset``
        after its phase event, and is healed ``for`` after that."""
        events = []
        for i, f in enumerate(self.sc.faults):
            if getattr(f, "upon", None) is not None:
                events.append((t0 + f.at, 2, i, f))  # armed: its start and stop come from the phase
                continue
            events.append((t0 + f.at, 0, i, f))
            events.append((t0 + f.at + f.for_, 1, i, f))
        events.sort(key=lambda e: (e[0], e[1]))
        last = events[-1] if events else None
        try:
            last = self._nemesis(events) or last
        finally:  # also when the schedule broke: the workload is never held open until the cap
            if self.holding and last is not None and not self.stop_nemesis.is_set():
                self._release(last[3].type, last[2])

    def _nemesis(self, events: list) -> tuple | None:
        """Carry out ``events`` (when, kind 0 start | 1 stop | 2 arm, id, entry); returns the last
        event carried out. An armed fault is watched for its phase between the other events."""
        import heapq

        heap = list(events)
        heapq.heapify(heap)
        armed: dict[int, tuple[float, Any]] = {}  # id -> (armed at, entry)
        last = None
        while heap or armed:
            now = time.monotonic()
            if armed:
                if self.tail is not None:
                    self.tail.poll()
                for i, (since, f) in list(armed.items()):
                    ev = self.tail.find(f.upon, since) if self.tail is not None else None
                    if ev is not None:
                        del armed[i]
                        when = ev["t"] + f.upon.offset
                        heapq.heappush(heap, (when, 0, i, f))
                        self._keyed[i] = {"phase": f.upon.phase, "nth": f.upon.nth, "t_phase": ev["t"],
                                          "role": ev["role"], "offset_s": f.upon.offset, "armed_at": since}
                    elif now >= since + f.upon.within:
                        del armed[i]
                        files = self.tail._offsets if self.tail is not None else {}
                        why = ("no node of this topology journals phases" if not files else
                               f"{self.tail.count(f.upon.phase, since, now) if self.tail else 0} such event(s) came")
                        msg = (f"fault {i} ({f.type}) never started: phase {PH.describe(f.upon)} did not come within "
                               f"{f.upon.within:g} s of its arming at {since - self.t0:.3f} s ({why})")
                        self.missed.append(msg)
                        self.topo.event("phase_missed", fault=f.type, id=i, phase=f.upon.phase, nth=f.upon.nth,
                                        within_s=f.upon.within, error=msg)
            if not heap and not armed:  # the last keyed fault missed its phase: nothing is left to start
                return last
            nxt = heap[0][0] if heap else float("inf")
            if armed:
                nxt = min(nxt, now + PH.POLL_S)
            if self.stop_nemesis.wait(max(0.0, nxt - time.monotonic())):
                return last
            if not heap or heap[0][0] > time.monotonic():
                continue
            when, kind, i, f = heapq.heappop(heap)
            last = (when, kind, i, f)
            if kind == 2:
                armed[i] = (when, f)
                self.topo.event("fault_armed", fault=f.type, id=i, phase=f.upon.phase, nth=f.upon.nth,
                                offset_s=f.upon.offset, within_s=f.upon.within)
            elif kind == 0:
                fault = self.faults[i]
                keyed = self._keyed.get(i)
                t_start = time.monotonic()
                self.jw.write({"type": "fault", "id": i, "name": f.type, "phase": "start", "t": t_start,
                               "params": fault.params.model_dump(mode="json"),
                               **({"keyed": {**keyed, "lag_s": round(t_start - keyed["t_phase"], 6)}}
                                  if keyed else {})})
                self.active[i] = fault  # before start(): a fault half-started at teardown is healed too
                try:
                    fault.start()
                except Exception as exc:  # noqa: BLE001 - recorded; the run goes on and heals
                    self.topo.event("fault_error", fault=f.type, phase="start", error=f"{type(exc).__name__}: {exc}")
                else:  # how long the injection took: a slow one shortens the window it acts in
                    self.topo.event("fault_started", fault=f.type, id=i, s=round(time.monotonic() - when, 3))
                if keyed:  # its heal: ``for`` after it started
                    heapq.heappush(heap, (t_start + f.for_, 1, i, f))
            elif i in self.active:
                if self._heal(self.active[i], i, "schedule"):
                    del self.active[i]  # else it stays active: teardown tries the heal once more
        return last

    def _recovery_gap(self) -> float | None:
        """How long (s) after the last heal every worker needs for the ops ``recovery`` judges;
        None when the check is off."""
        m = self.sc.model
        opts = m.checks.get("recovery")
        if opts is not None and not opts.enabled:
            return None
        return m.workload.recovery_gap(opts.within if opts is not None else 1)

    def _write_horizon(self, end: float | None) -> None:
        """The workload's end (time.monotonic() s), or None: ``hold`` (nodekit.workload.Horizon)."""
        tmp = self.topo.horizon_path.with_suffix(".tmp")
        tmp.write_text("hold" if end is None else f"{end:.6f}")
        os.replace(tmp, self.topo.horizon_path)

    def _release(self, fault: str, fid: int) -> None:
        """Every scheduled heal was tried: the workload ends at its duration, or later when the last
        heal came too late for the ops ``recovery`` must see after it (nodekit.workload.Horizon; the
        scenario's cap bounds it like the rest of the run)."""
        need = time.monotonic() + (self._recovery_gap() or 0.0) + RELEASE_MARGIN_S
        end = max(self.horizon, need)
        self._write_horizon(end)
        if end > self.horizon:
            self.topo.event("workload_extended", fault=fault, id=fid, s=round(end - self.horizon, 3))
        self.horizon, self.holding = end, False
        self.end_at = end + self.op_s + 2 * GRACE_S

    def _heal(self, fault: Fault, fid: int, by: str) -> bool:
        """Heal one fault; False (and a fault_error event) when its stop() raised."""
        try:
            fault.stop()
        except Exception as exc:  # noqa: BLE001
            self.topo.event("fault_error", fault=fault.name, phase="stop", error=f"{type(exc).__name__}: {exc}")
            return False
        tail = fault.tail_after_heal()
        self.jw.write({"type": "fault", "id": fid, "name": fault.name, "phase": "stop", "t": time.monotonic(),
                       "healed_by": by, **({} if tail is None else {"tail_s": float(tail)})})
        self._record_effect(fault, fid)
        return True

    def _record_effect(self, fault: Fault, fid: int) -> None:
        """What the window did (the fault's counts) and what its kind requires: fault_effect judges."""
        try:
            required = dict(fault.required_effect())
        except Exception as exc:  # noqa: BLE001 - recorded; fault_effect then fails
            required, error = {}, f"{type(exc).__name__}: {exc}"
        else:
            error = None
        try:
            effect = fault.effect()
        except Exception as exc:  # noqa: BLE001 - recorded; fault_effect fails when something was required
            effect, error = None, f"{type(exc).__name__}: {exc}"
        if effect is None and not required and error is None and fid not in self._keyed:
            return
        self.topo.event("fault_effect", fault=fault.name, id=fid, effect=effect, required=required,
                        **({"error": error} if error else {}),
                        **({"keyed": self._keyed[fid]} if fid in self._keyed else {}))
