"""Run scenarios: topology + workload + nemesis (fault schedule) + checks, per target.

For each scenario and target: start the topology (server and link), start the workload process,
send it the start signal (t0), apply each fault at ``t0 + at`` and heal it at ``t0 + at + for``,
wait for the workload (never longer than the scenario's cap), heal whatever is still injected,
probe the server, tear everything down, merge the workload's ops into the journal and run the
checks on the journal. A scenario run never hangs: every wait is bounded, and a workload stuck in
a call (the legacy client has no deadline) is killed and its in-flight ops recorded as stalled.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from faults.base import Fault, load_registry

from . import checks as C
from . import journal as J
from .errors import HarnessError
from .journal import JournalWriter, read_journal
from .schema import LoadedScenario
from .topology import Topology

GRACE_S = 1.0  # after the workload's duration, on top of deadline + tolerance
NEMESIS_JOIN_S = 15.0  # a fault start/stop is bounded (a node's READY wait is 10 s)


@dataclass
class Result:
    scenario: str
    file: str
    target: str
    dir: str
    verdict: str
    expected: str
    reason: str = ""
    checks: list[dict] = field(default_factory=list)
    elapsed_s: float = 0.0
    setup_s: float = 0.0
    teardown_s: float = 0.0

    @property
    def as_expected(self) -> bool:
        return self.verdict == "skipped" or self.verdict in self.expected.split("|")

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["as_expected"] = self.as_expected
        return d


def new_run_dir(root: str | Path = "runs") -> Path:
    run_id = datetime.now().strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)
    d = Path(root) / run_id
    d.mkdir(parents=True, exist_ok=False)
    return d


def preload_keys(seed: int, n: int) -> list[str]:
    rng = random.Random(seed ^ 0x5EED)
    return [rng.getrandbits(256).to_bytes(32, "big").hex() for _ in range(n)]


def missing_requirements(scenario: LoadedScenario, toxiproxy: Any) -> str | None:
    """Why this scenario cannot run here (skipped, never passed), or None."""
    registry = load_registry()
    needs = set()
    for f in scenario.faults:
        needs |= set(registry[f.type].requires)
    link = scenario.model.topology.link
    if link == "toxiproxy":
        needs.add("toxiproxy")
    if link == "netns":
        needs |= {"netns", "root"}
    if "interposer" in needs and link != "interposer":
        return "a fault needs topology.link: interposer"
    if "toxiproxy" in needs and toxiproxy is None:
        return "toxiproxy-server is not installed (run .ci/install-toxiproxy.sh; see `pdchaos doctor`)"
    if "root" in needs and os.geteuid() != 0:
        return "needs root (network namespaces and iptables)"
    if "toxiproxy" in needs and link != "toxiproxy":
        return "a toxic fault needs topology.link: toxiproxy"
    if "netns" in needs:
        from faults.netns import availability

        ok, why = availability()
        if not ok:
            return f"isolated hosts unavailable: {why}"
        if link != "netns":
            return "a partition fault needs topology.link: netns"
    return None


class _Interrupted(Exception):
    pass


class Runner:
    def __init__(self, run_dir: Path, *, targets: list[str] | None = None,
                 on_result: Callable[[Result], None] | None = None, toxiproxy: Any = None):
        self.run_dir = run_dir
        self.targets = targets
        self.on_result = on_result
        self.toxiproxy = toxiproxy
        self.results: list[Result] = []
        self.on_start: Callable[[str, str], None] | None = None
        self._stop = threading.Event()

    def interrupt(self) -> None:
        self._stop.set()

    # ----------------------------------------------------------------------------
    def run(self, scenarios: list[LoadedScenario]) -> list[Result]:
        for sc in scenarios:
            for target in sc.model.targets:
                if self.targets and target not in self.targets:
                    continue
                if self._stop.is_set():
                    return self.results
                if self.on_start:
                    self.on_start(sc.name, target)
                res = self.run_one(sc, target)
                self.results.append(res)
                if self.on_result:
                    self.on_result(res)
        return self.results

    def run_one(self, sc: LoadedScenario, target: str) -> Result:
        m = sc.model
        rel = f"{m.name}/{target}"
        d = self.run_dir / m.name / target
        d.mkdir(parents=True, exist_ok=True)
        res = Result(m.name, str(sc.path), target, rel, "error", m.expected(target))
        why = missing_requirements(sc, self.toxiproxy)
        started = time.monotonic()
        jw = JournalWriter(d / "journal.jsonl")
        registry = load_registry()
        faults_meta = [{"id": i, "type": f.type, "at": f.at, "for": f.for_,
                        "params": f.model_dump(mode="json", exclude={"type", "at", "for_"}),
                        "categories": list(registry[f.type].categories)} for i, f in enumerate(sc.faults)]
        meta = {"type": "meta", "scenario": m.name, "file": str(sc.path), "target": target,
                "deadline_ms": m.deadline * 1000.0, "tolerance_ms": m.tolerance * 1000.0, "seed": m.seed,
                "cap_s": m.cap, "wall_start": datetime.now(timezone.utc).isoformat(),
                "checks": self._check_config(sc), "expect": m.expected(target),
                "topology": m.topology.model_dump(), "workload": m.workload.model_dump(), "faults": faults_meta,
                "t0": None}
        if why:
            jw.write({**meta, "skipped": why})
            jw.write({"type": "end", "t": time.monotonic(), "reason": "skipped", "stalled": 0})
            jw.close()
            res.verdict, res.reason = "skipped", why
            return res
        preload = preload_keys(m.seed, m.topology.preload_blocks)
        preload_path = d / "preload.txt"
        preload_path.write_text("\n".join(preload) + "\n")
        part = d / "ops.part.jsonl"
        try:
            topo = Topology(m, target, d, preload_path, jw.write, toxiproxy=self.toxiproxy)
        except Exception as exc:  # noqa: BLE001 - e.g. the namespaces could not be made
            jw.write({**meta, "error": str(exc)})
            jw.write({"type": "end", "t": time.monotonic(), "reason": "error", "stalled": 0})
            jw.close()
            res.verdict, res.reason = "error", f"topology: {type(exc).__name__}: {exc}"
            return res
        workload = None
        nemesis = None
        active: dict[int, Fault] = {}
        reason = "done"
        stop_nemesis = threading.Event()
        try:
            for fm, f in zip(faults_meta, sc.faults):  # what each fault should cause, given this topology
                fm["categories"] = list(self._instance(f, topo).expected_categories())
            topo.start()
            cfg = {"endpoint": topo.client_endpoint, "target": target, "deadline_ms": int(round(m.deadline * 1000)),
                   "concurrency": m.workload.concurrency, "rate": m.workload.rate,
                   "duration_s": m.workload.duration, "grace_s": m.deadline + m.tolerance + GRACE_S,
                   "mix": m.workload.mix.model_dump(), "prompt_blocks": list(m.workload.prompt_blocks),
                   "seed": m.seed, "preload": preload, "block_size": m.topology.block_size,
                   "groups": m.topology.groups, "reset_at_s": m.workload.reset_at}
            cfg_path = d / "workload.json"
            cfg_path.write_text(json.dumps(cfg))
            workload = topo.spawn_client(["--config", str(cfg_path), "--journal", str(part)], "client-workload.log")
            res.setup_s = time.monotonic() - started
            t0 = time.monotonic()
            os.kill(workload.pid, signal.SIGUSR1)
            jw.write({**meta, "t0": t0})
            end_at = t0 + m.workload.duration + cfg["grace_s"] + 1.0
            hard_cap = started + m.cap
            nemesis = threading.Thread(target=self._nemesis, args=(sc, topo, jw, t0, active, stop_nemesis), daemon=True,
                                       name="nemesis")
            nemesis.start()
            while workload.alive and time.monotonic() < min(end_at, hard_cap):
                if self._stop.is_set():
                    raise _Interrupted()
                time.sleep(0.02)
            if workload.alive:
                reason = "cap" if time.monotonic() >= hard_cap else "done"
                workload.kill()
                topo.event("workload_killed", reason="ops still in flight after the grace period")
        except _Interrupted:
            reason = "interrupted"
        except Exception as exc:  # noqa: BLE001 - a harness failure is an error verdict, never a pass
            reason = "error"
            res.reason = str(exc) if isinstance(exc, HarnessError) else f"{type(exc).__name__}: {exc}"
        finally:
            t_down = time.monotonic()
            stop_nemesis.set()
            if nemesis is not None:
                # a fault may be half-way through starting (a peer swap waits for READY): let it
                # finish, so the heal below sees it; never touch the topology from two threads
                nemesis.join(NEMESIS_JOIN_S)
                if nemesis.is_alive():
                    topo.event("nemesis_stuck", error=f"fault schedule still busy after {NEMESIS_JOIN_S:g} s")
            for fid, fault in list(active.items()):
                self._heal(fault, fid, jw, "teardown")
            active.clear()
            if workload is not None:
                workload.stop(2.0)
                topo.event("workload_exit", returncode=workload.returncode)
            try:
                topo.final_probe()
            except Exception as exc:  # noqa: BLE001 - a probe must not break teardown
                topo.event("probe_failed", error=type(exc).__name__)
            handles = topo.handles() + ([workload] if workload is not None else [])
            topo.close()
            leftovers = [f"pid {h.pid} ({h.name})" for h in handles if h.alive] + topo.leftovers()
            if leftovers:
                topo.event("leftovers", what_left=leftovers)
            if part.exists():
                for rec in read_journal(part):
                    jw.write(rec)
                part.unlink()
            stalled = sum(1 for o in ops_of(d / "journal.jsonl", jw) if o.get("outcome") == "stalled")
            jw.write({"type": "end", "t": time.monotonic(), "reason": reason, "stalled": stalled})
            jw.close()
            res.teardown_s = time.monotonic() - t_down
        res.elapsed_s = time.monotonic() - started
        if reason == "interrupted":
            res.verdict, res.reason = "error", "interrupted"
            self._stop.set()
            return res
        if reason == "error":
            res.verdict = "error"
            return res
        results = C.run_checks(C.load_input(d / "journal.jsonl"), meta["checks"])
        res.checks = [r.to_dict() for r in results]
        res.verdict = C.verdict(results)
        failed = [r for r in results if r.ok is False]
        res.reason = "; ".join(f"{r.name}: {r.message}" for r in failed[:3])
        (d / "checks.json").write_text(json.dumps(res.checks, indent=1))
        return res

    def _check_config(self, sc: LoadedScenario) -> dict:
        cfg = {}
        for name, opts in sc.model.checks.items():
            o = opts.model_dump()
            if o.get("tolerance") is not None:
                o["tolerance_ms"] = o.pop("tolerance") * 1000.0
            cfg[name] = o
        return cfg

    def _nemesis(self, sc: LoadedScenario, topo: Topology, jw: JournalWriter, t0: float,
                 active: dict[int, Fault], stop: threading.Event) -> None:
        """The fault schedule: start and stop events in time order, each recorded in the journal."""
        events = []
        for i, f in enumerate(sc.faults):
            events.append((t0 + f.at, 0, i, f))
            events.append((t0 + f.at + f.for_, 1, i, f))
        events.sort(key=lambda e: (e[0], e[1]))
        for when, kind, i, f in events:
            if stop.wait(max(0.0, when - time.monotonic())):
                return
            if kind == 0:
                fault = self._instance(f, topo)
                jw.write({"type": "fault", "id": i, "name": f.type, "phase": "start", "t": time.monotonic(),
                          "params": fault.params.model_dump(mode="json")})
                active[i] = fault  # before start(): a fault half-started at teardown is healed too
                try:
                    fault.start()
                except Exception as exc:  # noqa: BLE001 - recorded; the run goes on and heals
                    topo.event("fault_error", fault=f.type, phase="start", error=f"{type(exc).__name__}: {exc}")
            elif i in active:
                self._heal(active.pop(i), i, jw, "schedule")

    @staticmethod
    def _instance(entry: Any, topo: Topology) -> Fault:
        cls = load_registry()[entry.type]
        # the entry was validated against a subclass of cls.Params: reuse its values as they are
        fields = {k: getattr(entry, k) for k in cls.Params.model_fields}
        return cls(cls.Params.model_construct(**fields), topo)

    def _heal(self, fault: Fault, fid: int, jw: JournalWriter, by: str) -> None:
        try:
            fault.stop()
        except Exception as exc:  # noqa: BLE001
            jw.write({"type": "event", "what": "fault_error", "t": time.monotonic(), "fault": fault.name,
                      "phase": "stop", "error": f"{type(exc).__name__}: {exc}"})
        jw.write({"type": "fault", "id": fid, "name": fault.name, "phase": "stop", "t": time.monotonic(),
                  "healed_by": by})


def ops_of(path: Path, jw: JournalWriter) -> list[dict]:
    jw.flush()
    return J.ops(read_journal(path))


# --------------------------------------------------------------------------- outputs


def write_summary(run_dir: Path, results: list[Result], started_wall: str, elapsed_s: float) -> dict:
    summary = {"run_id": run_dir.name, "started": started_wall, "elapsed_s": round(elapsed_s, 3),
               "results": [r.to_dict() for r in results]}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    write_junit(run_dir / "junit.xml", results)
    return summary


def write_junit(path: Path, results: list[Result]) -> None:
    suite = ET.Element("testsuite", name="pdchaos", tests=str(len(results)),
                       failures=str(sum(1 for r in results if not r.as_expected and r.verdict != "error")),
                       errors=str(sum(1 for r in results if r.verdict == "error")),
                       skipped=str(sum(1 for r in results if r.verdict == "skipped")),
                       time=f"{sum(r.elapsed_s for r in results):.3f}")
    for r in results:
        case = ET.SubElement(suite, "testcase", classname=r.scenario, name=r.target, time=f"{r.elapsed_s:.3f}",
                             file=r.file)
        if r.verdict == "skipped":
            ET.SubElement(case, "skipped", message=r.reason)
        elif r.verdict == "error":
            ET.SubElement(case, "error", message=r.reason or "harness error")
        elif not r.as_expected:
            failed = [c for c in r.checks if c["ok"] is False]
            msg = f"verdict {r.verdict}, expected {r.expected}"
            el = ET.SubElement(case, "failure", message=msg)
            el.text = "\n".join(f"{c['name']}: {c['message']}" for c in failed) or msg
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
