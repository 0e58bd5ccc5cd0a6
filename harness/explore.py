"""Generative chaos (Jepsen's generator and nemesis, FoundationDB's simulation in spirit): draw
seeded schedules over real nodes, run each with the same checks as a written scenario, and when a
target does not pass, shrink the schedule to a small one that still fails and write it out as a
scenario file that reproduces it.

A family opts in with ``Family.explore_module``: a module with

- ``draw(rng) -> dict``: one schedule, ``{"workload": {...}, "faults": [{"type", "at", "for", ...}],
  "topology": {...}}`` (only fault combinations the family can run: e.g. never two proxy hooks at
  once, whose heals would clear each other);
- ``render(schedule, name, target, seed) -> dict``: the scenario file for it (deadline, cap, pauses
  for ``no_busy_wait``, a ``triggers:`` entry per fault so that a window no request crossed is a
  harness error, never a pass, and ``expect: {target: pass}``);
- ``MIN_WINDOW_S``: the shortest window shrinking may leave a fault;
- optionally ``cover(rng) -> list[dict]``: schedules run first, before any random draw (e.g. each
  fault kind alone once): a budget that ends early has still tried every kind, where random
  combinations may miss one (a 20-minute control drew 12 schedules and no silent peer);
- optionally ``signature(schedule) -> str``: what makes two findings the same (e.g. the fault
  kinds): a finding whose signature and failing checks equal an earlier one's is recorded, not
  shrunk again (the budget goes to new schedules).

The core never names a family. A drawn schedule that does not validate (schema, recovery gaps) or
that the launch profile leaves out is drawn again, never run. Shrinking is greedy and bounded by the
same budget: drop a fault, halve a window, halve the concurrency, start a fault later; a step is
kept when the run still fails with one of the checks the original run failed (same verdict kind).
"""

from __future__ import annotations

import copy
import importlib
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from .errors import UsageError

MAX_REDRAWS = 200  # drawn schedules that do not validate, in a row, before giving up (a family bug)


@dataclass
class Finding:
    """A schedule the target did not pass, and the smallest one found that still fails."""

    seed: int
    verdict: str
    failing: list[str]
    reason: str
    schedule: dict
    shrunk: dict | None = None
    shrunk_verdict: str | None = None
    shrunk_failing: list[str] = field(default_factory=list)
    shrink_runs: int = 0
    path: str | None = None
    same_as: int | None = None  # the seed of an earlier finding with the same signature and checks


@dataclass
class Tally:
    schedules: int = 0
    runs: int = 0
    passes: int = 0
    errors: int = 0
    invalid: int = 0
    findings: list[Finding] = field(default_factory=list)
    error_reasons: list[str] = field(default_factory=list)


def explore_module(family: Any):
    name = getattr(family, "explore_module", None)
    if not name:
        raise UsageError(f"family {family.name!r} has no generator for pdchaos explore")
    return importlib.import_module(name)


def shrink_candidates(schedule: dict, min_window_s: float) -> list[tuple[str, dict]]:
    """Smaller schedules, most promising first: one fault fewer, a window halved, half the
    concurrency (rate per worker kept), a fault started later (its end kept)."""
    out: list[tuple[str, dict]] = []
    faults = schedule["faults"]
    if len(faults) > 1:
        for i in range(len(faults)):
            s = copy.deepcopy(schedule)
            del s["faults"][i]
            out.append((f"drop fault {i} ({faults[i]['type']})", s))
    for i, f in enumerate(faults):
        if f["for"] / 2 >= min_window_s:
            s = copy.deepcopy(schedule)
            s["faults"][i]["for"] = round(f["for"] / 2, 2)
            out.append((f"halve fault {i}'s window", s))
    w = schedule["workload"]
    if w.get("concurrency", 1) > 1:
        s = copy.deepcopy(schedule)
        c = max(1, w["concurrency"] // 2)
        s["workload"]["rate"] = round(w["rate"] * c / w["concurrency"], 3)
        s["workload"]["concurrency"] = c
        out.append((f"concurrency {c}", s))
    for i, f in enumerate(faults):
        if f["for"] / 2 >= min_window_s:
            s = copy.deepcopy(schedule)
            shift = round(f["for"] / 2, 2)
            s["faults"][i]["at"] = round(f["at"] + shift, 2)
            s["faults"][i]["for"] = round(f["for"] - shift, 2)
            out.append((f"start fault {i} later", s))
    return out


def write_scenario(doc: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=110))


class Explorer:
    """``run_one(scenario_path, target) -> Result`` is injected (the CLI runs real nodes through the
    runner; tests may pass another), as is ``load(path) -> LoadedScenario | str`` (a reason when
    the file is invalid or left out)."""

    def __init__(self, family: Any, target: str, seed: int, budget_s: float, out_dir: Path,
                 run_one: Callable[[Path, str], Any], load: Callable[[Path], Any], say: Callable[[str], None] = print,
                 shrink: bool = True, clock: Callable[[], float] = time.monotonic):
        self.family, self.target, self.seed = family, target, seed
        self.mod = explore_module(family)
        self.budget_s, self.out_dir = budget_s, out_dir
        self.run_one, self.load, self.say, self.shrink = run_one, load, say, shrink
        self.clock = clock
        self.t0 = clock()
        self.tally = Tally()
        self._last_run_s = 60.0  # a guess until the first run says better

    # ------------------------------------------------------------------ budget
    def left(self) -> float:
        return self.budget_s - (self.clock() - self.t0)

    def _room(self) -> bool:
        """Another run fits: the budget left is at least the last run's time (a soft bound: one run
        that started in time may end past it)."""
        return self.left() >= min(self._last_run_s, self.budget_s)

    # ------------------------------------------------------------------ one schedule
    def _materialize(self, schedule: dict, seed: int, tag: str) -> tuple[Path | None, str]:
        name = f"explore-{self.family.name}-{seed}-{tag}"[:64].rstrip("-.")
        doc = self.mod.render(schedule, name, self.target, seed)
        path = self.out_dir / "drawn" / f"{name}.yaml"
        write_scenario(doc, path)
        got = self.load(path)
        if isinstance(got, str):
            return None, got
        return path, ""

    def _run(self, path: Path) -> Any:
        t = self.clock()
        res = self.run_one(path, self.target)
        self._last_run_s = max(5.0, self.clock() - t)
        self.tally.runs += 1
        return res

    def _draw_valid(self, rng: random.Random, seed: int) -> tuple[dict, Path] | None:
        for _ in range(MAX_REDRAWS):
            schedule = self.mod.draw(rng)
            path, why = self._materialize(schedule, seed, f"s{self.tally.schedules}")
            if path is not None:
                return schedule, path
            self.tally.invalid += 1
        self.say(f"explore: {MAX_REDRAWS} drawn schedules in a row did not validate (last: {why}); stopping")
        return None

    def _covering(self, rng: random.Random):
        """(seed, schedule, path) of the family's ``cover`` schedules that validate, in order."""
        cover = getattr(self.mod, "cover", None)
        if cover is None:
            return
        for schedule in cover(random.Random(rng.randrange(1, 1 << 30))):
            seed = rng.randrange(1, 1 << 30)
            path, why = self._materialize(schedule, seed, f"c{self.tally.schedules}")
            if path is None:
                self.tally.invalid += 1
                self.say(f"explore: a covering schedule does not validate ({why[:200]}); skipped")
                continue
            yield seed, schedule, path

    def _signature(self, schedule: dict) -> str | None:
        sig = getattr(self.mod, "signature", None)
        return sig(schedule) if sig is not None else None

    def explore(self) -> Tally:
        rng = random.Random(self.seed)
        covering = self._covering(random.Random(rng.randrange(1, 1 << 30)))
        seen: dict[tuple, int] = {}
        pending: list[Finding] = []  # found while covering: shrunk once every kind was tried
        while self._room():
            first = next(covering, None) if covering is not None else None
            if first is not None:
                seed, schedule, path = first
            else:
                if covering is not None:
                    covering = None
                    for f in pending:
                        if self.shrink and self._room():
                            self._shrink(f)
                        self._write_finding(f)
                    pending = []
                    if not self._room():
                        break
                seed = rng.randrange(1, 1 << 30)
                drawn = self._draw_valid(random.Random(seed), seed)
                if drawn is None:
                    break
                schedule, path = drawn
            self.tally.schedules += 1
            res = self._run(path)
            line = (f"[{self.tally.schedules}] seed {seed}: {self._describe(schedule)} -> {res.verdict}"
                    + (f" [{', '.join(res.failing)}]" if res.failing else ""))
            self.say(line + f" ({self.left():.0f} s of budget left)")
            if res.verdict == "pass":
                self.tally.passes += 1
            elif res.verdict in ("error", "skipped"):
                self.tally.errors += 1
                self.tally.error_reasons.append(f"seed {seed}: {res.reason}"[:300])
            else:
                f = Finding(seed, res.verdict, list(res.failing), res.reason, schedule)
                self.tally.findings.append(f)
                sig = self._signature(schedule)
                key = (sig, res.verdict, tuple(sorted(res.failing)))
                if sig is not None and key in seen:
                    f.same_as = seen[key]
                    self.say(f"    the same as seed {f.same_as} (faults {sig}, the same failing checks): not shrunk again")
                    self._write_finding(f)
                else:
                    seen[key] = seed
                    if covering is not None:
                        pending.append(f)
                        continue
                    if self.shrink:
                        self._shrink(f)
                    self._write_finding(f)
        for f in pending:  # the budget ended while covering: written as found
            self._write_finding(f)
        return self.tally

    @staticmethod
    def _describe(schedule: dict) -> str:
        w = schedule["workload"]
        def what(f: dict) -> str:  # its kind's own words too (a node, a mode), never its timing
            extra = [str(v) for k, v in f.items() if k not in ("type", "at", "for") and isinstance(v, str)]
            return f"{f['type']}({', '.join(extra)})" if extra else f["type"]

        faults = ", ".join(f"{what(f)}@{f['at']:g}s+{f['for']:g}s" for f in schedule["faults"])
        return f"concurrency {w.get('concurrency')}, rate {w.get('rate')}/s; {faults}"

    # ------------------------------------------------------------------ shrinking
    def _still_fails(self, res: Any, f: Finding) -> bool:
        return res.verdict not in ("pass", "error", "skipped") and bool(set(res.failing) & set(f.failing))

    def _shrink(self, f: Finding) -> None:
        best, best_res = f.schedule, None
        progress = True
        while progress and self._room():
            progress = False
            for what, cand in shrink_candidates(best, float(self.mod.MIN_WINDOW_S)):
                if not self._room():
                    break
                path, why = self._materialize(cand, f.seed, f"k{f.shrink_runs}")
                if path is None:
                    continue
                f.shrink_runs += 1
                res = self._run(path)
                keep = self._still_fails(res, f)
                self.say(f"    shrink seed {f.seed}: {what} -> {res.verdict}"
                         + (f" [{', '.join(res.failing)}]" if res.failing else "") + (" (kept)" if keep else ""))
                if keep:
                    best, best_res, progress = cand, res, True
                    break
        if best_res is not None:
            f.shrunk, f.shrunk_verdict, f.shrunk_failing = best, best_res.verdict, list(best_res.failing)

    def _write_finding(self, f: Finding) -> None:
        """The smallest failing schedule as a scenario that reproduces it: the target expected to
        pass (it deviates as long as the defect is there), the observed failure in its
        description."""
        schedule = f.shrunk or f.schedule
        failing = f.shrunk_failing if f.shrunk else f.failing
        verdict = f.shrunk_verdict if f.shrunk else f.verdict
        name = f"explore-{self.family.name}-{self.target}-{f.seed}"[:64].rstrip("-.")
        doc = self.mod.render(schedule, name, self.target, f.seed)
        doc["description"] = (f"Found by pdchaos explore (family {self.family.name}, target {self.target}, seed "
                              f"{f.seed}){' and shrunk' if f.shrunk else ''}: {verdict}, failing "
                              f"{', '.join(failing)}. Expected to pass; it deviates while the defect is there.")
        path = self.out_dir / f"{name}.yaml"
        write_scenario(doc, path)
        f.path = str(path)

    # ------------------------------------------------------------------ summary
    def summary(self) -> dict:
        t = self.tally
        return {"family": self.family.name, "target": self.target, "seed": self.seed, "budget_s": self.budget_s,
                "elapsed_s": round(self.clock() - self.t0, 1), "schedules": t.schedules, "runs": t.runs,
                "passes": t.passes, "errors": t.errors, "invalid_draws": t.invalid,
                "findings": [{"seed": f.seed, "verdict": f.verdict, "failing": f.failing,
                              "shrunk_failing": f.shrunk_failing, "shrink_runs": f.shrink_runs,
                              "faults": len(f.schedule["faults"]),
                              "shrunk_faults": len(f.shrunk["faults"]) if f.shrunk else None,
                              "same_as": f.same_as, "reproduction": f.path} for f in t.findings],
                "error_reasons": t.error_reasons}


def dump_summary(summary: dict, path: Path) -> None:
    path.write_text(json.dumps(summary, indent=1) + "\n")
