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
  combinations may miss one (a 20-minute control drew 12 schedules and no silent peer); findings
  made while covering are settled after it, and the round stops early when the budget left is only
  what re-proving them needs (a target that fails many kinds, such as upstream, would otherwise
  spend the whole budget covering and prove nothing: 13 findings, none re-proven, on 2026-12-07);
- optionally ``signature(schedule) -> str``: what makes two findings the same (e.g. the fault
  kinds): a finding whose signature and failing checks equal an earlier one's is recorded, not
  shrunk again (the budget goes to new schedules).

The core never names a family. A drawn schedule that does not validate (schema, recovery gaps) or
that the launch profile leaves out is drawn again, never run. Shrinking is greedy and bounded by the
same budget: drop a fault, halve a window, halve the concurrency, start a fault later.

Re-proving: a run that fails is a *candidate*, never a finding by itself. A schedule (drawn or a
shrink step) counts only when it fails the same checks in ``reprove`` (N, default 3) of N runs, the
run that found it being the first: every run a failure (never pass, error or skipped), and at least
one check failing in all of them (the checks they have in common, among those of the first run,
are the finding's *re-proven checks*). A drawn schedule that fails k < N of its N runs is reported
as flaky with its rate (k of N), not shrunk, not a finding. A re-run that cannot be judged (a
harness error, skipped) is no evidence either way: it is run again (at most N such runs), never
counted. Each re-run is a copy of the file under its own name (``NAME-r2``...: the runner keeps
one journal per scenario name). A shrink step is kept only when it
re-proves the same way (a step whose first or any later run passes is dropped at once). The kept
reproduction is then written as a scenario file and run once more *from that file* (the very file
reported); it is reported as re-proven only when that run fails one of the re-proven checks too.
Budget: a schedule whose N runs, or its re-run from the file, the budget cut short is reported as
"not re-proven", never as a finding; each shrink step starts only when its N runs and the file's
re-run fit in what is left (so the budget ending shrinking leaves an already re-proven, less
small, reproduction: reported with "shrinking cut short").
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
# a finding's re-runs against the run that found it: a failing run leaves the pool's nodes dirty and
# the next run restarts them (the upstream 20-minute control of 2026-12-07, seed 12: its re-proving
# took 1.28 times its findings' first runs; estimated by run counts it re-proved 5 of its 7)
SETTLE_MARGIN = 1.5


REPROVEN, FLAKY, NOT_REPROVEN, SAME = "re-proven", "flaky", "not re-proven", "same"


@dataclass
class Finding:
    """A schedule the target did not pass, what re-proving it said, and the smallest schedule found
    that still fails N of N (``status``: re-proven, flaky, not re-proven, or the same as an earlier
    finding)."""

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
    status: str = NOT_REPROVEN
    failed_runs: int = 1  # k: runs of the drawn schedule that failed the re-proven checks
    proving_runs: int = 1  # m: its judged runs so far (N when re-proving ran to its end)
    not_judged: int = 0  # its re-runs that could not be judged (harness errors): run again, never counted
    checks: list[str] = field(default_factory=list)  # the re-proven checks (failing in every run)
    shrink_note: str = ""  # "shrinking cut short by the budget" or ""
    rerun: dict | None = None  # the re-run from the written file: verdict, failing, reproduces
    why_not: str = ""  # why it is not re-proven (the budget, a run that passed)
    found_at_s: float = 0.0  # seconds into the exploration when its first run ended
    proven_at_s: float | None = None  # when its drawn schedule had failed N of N
    reported_at_s: float | None = None  # when it was settled (after shrinking and the file's re-run)
    drawn: str = ""  # the drawn scenario file it was found with (its re-runs load it)
    run_s: float = 0.0  # how long the run that found it took (what each of its re-runs is expected to take)


@dataclass
class Tally:
    schedules: int = 0
    runs: int = 0
    passes: int = 0
    errors: int = 0
    invalid: int = 0
    findings: list[Finding] = field(default_factory=list)
    error_reasons: list[str] = field(default_factory=list)

    @property
    def reproven(self) -> list[Finding]:
        return [f for f in self.findings if f.status == REPROVEN]


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


def _is_failure(res: Any) -> bool:
    return res.verdict not in ("pass", "error", "skipped")


class Explorer:
    """``run_one(scenario_path, target) -> Result`` is injected (the CLI runs real nodes through the
    runner; tests may pass another), as is ``load(path) -> LoadedScenario | str`` (a reason when
    the file is invalid or left out). ``reprove``: N, the runs a schedule must fail (N of N);
    ``first``: stop at the first re-proven finding, settling (re-proving, shrinking) each finding
    as soon as it is found (``pdchaos explore --mutant``: the time to kill)."""

    def __init__(self, family: Any, target: str, seed: int, budget_s: float, out_dir: Path,
                 run_one: Callable[[Path, str], Any], load: Callable[[Path], Any], say: Callable[[str], None] = print,
                 shrink: bool = True, clock: Callable[[], float] = time.monotonic, reprove: int = 3,
                 first: bool = False):
        if reprove < 1:
            raise UsageError(f"--reprove {reprove}: at least 1")
        self.family, self.target, self.seed = family, target, seed
        self.mod = explore_module(family)
        self.budget_s, self.out_dir = budget_s, out_dir
        self.run_one, self.load, self.say, self.shrink = run_one, load, say, shrink
        self.reprove, self.first = reprove, first
        self.clock = clock
        self.t0 = clock()
        self.tally = Tally()
        self.covering_cut = False  # the covering round stopped to keep the budget for re-proving
        self._reserve_s = 0.0  # seconds a shrink leaves for the findings still to re-prove
        self._last_run_s = 60.0  # a guess until the first run says better
        self.run_times: list[float] = []  # each run's seconds (the first includes the nodes' cold start)
        self._ran: set[str] = set()  # the scenario names run so far (the runner keeps one journal per name)

    # ------------------------------------------------------------------ budget
    def left(self) -> float:
        return self.budget_s - (self.clock() - self.t0)

    def elapsed(self) -> float:
        return round(self.clock() - self.t0, 1)

    def _room(self, runs: int = 1, plus_s: float = 0.0) -> bool:
        """``runs`` more runs fit, and ``plus_s`` seconds after them: the budget left is at least that
        many times the last run's time (a soft bound: one run that started in time may end past it)."""
        return self.left() >= runs * min(self._last_run_s, self.budget_s) + plus_s

    def _settle_need_s(self, findings: list[Finding]) -> float:
        """Seconds re-proving ``findings`` takes: each its N runs (N - 1 re-runs, the written file's
        re-run) at the time of the run that found it (a stall's run is two to four times a pass's),
        with :data:`SETTLE_MARGIN`: a re-run after a failing run pays the nodes' restart."""
        return SETTLE_MARGIN * sum(self.reprove * f.run_s for f in findings)  # run_s >= 5 s, as _last_run_s

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
        self.run_times.append(round(self.clock() - t, 1))
        self._ran.add(path.stem)
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

    def _done(self) -> bool:
        return self.first and bool(self.tally.reproven)

    def explore(self) -> Tally:
        rng = random.Random(self.seed)
        covering = self._covering(random.Random(rng.randrange(1, 1 << 30)))
        seen: dict[tuple, Finding] = {}  # (signature, verdict, failing) -> the latest finding with them
        pending: list[Finding] = []  # found while covering: settled once every kind was tried
        while self._room() and not self._done():
            if covering is not None and pending and not self._room(1 + SETTLE_MARGIN * self.reprove,
                                                                     self._settle_need_s(pending)):
                # the budget left is what re-proving the findings so far needs (each: its N runs, the
                # last the file's re-run, at its own run's time), and one more schedule with its own
                # re-proving if it fails: proving what failed comes before trying the kinds not yet run
                self.say(f"explore: the covering round stops after {self.tally.schedules} schedules: the budget "
                         f"left ({self.left():.0f} s) is kept for re-proving its {len(pending)} finding(s)")
                self.covering_cut = True
                covering = iter(())
            first = next(covering, None) if covering is not None else None
            if first is not None:
                seed, schedule, path = first
            else:
                if covering is not None:
                    covering = None
                    for i, f in enumerate(pending):
                        if not self._done():
                            # shrinking leaves room for re-proving the findings still waiting
                            self._reserve_s = self._settle_need_s(pending[i + 1:])
                            self._settle(f)
                    self._reserve_s = 0.0
                    pending = []
                    if not self._room() or self._done():
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
                f = Finding(seed, res.verdict, list(res.failing), res.reason, schedule,
                            checks=sorted(res.failing), found_at_s=self.elapsed(), drawn=str(path),
                            run_s=self._last_run_s)
                self.tally.findings.append(f)
                sig = self._signature(schedule)
                key = (sig, res.verdict, tuple(sorted(res.failing)))
                earlier = seen.get(key) if sig is not None else None
                if earlier is not None and (earlier.status == REPROVEN or earlier in pending):
                    f.same_as, f.status = earlier.seed, SAME
                    self.say(f"    the same as seed {f.same_as} (faults {sig}, the same failing checks, "
                             f"{'re-proven' if earlier.status == REPROVEN else 'not yet settled'}): "
                             "not re-proven or shrunk again")
                    self._write_finding(f)
                    f.reported_at_s = self.elapsed()
                else:  # new, or the earlier one was flaky or not re-proven: this one is evidence too
                    seen[key] = f
                    if covering is not None and not self.first:
                        pending.append(f)
                        continue
                    self._settle(f)
        for f in pending:  # the budget ended while covering: written as found, not re-proven
            f.why_not = f.why_not or "the budget ended before it was re-run"
            self._write_finding(f)
            f.reported_at_s = self.elapsed()
        return self.tally

    @staticmethod
    def _describe(schedule: dict) -> str:
        w = schedule["workload"]
        def what(f: dict) -> str:  # its kind's own words too (a node, a mode), never its timing
            extra = [str(v) for k, v in f.items() if k not in ("type", "at", "for") and isinstance(v, str)]
            return f"{f['type']}({', '.join(extra)})" if extra else f["type"]

        faults = ", ".join(f"{what(f)}@{f['at']:g}s+{f['for']:g}s" for f in schedule["faults"])
        return f"concurrency {w.get('concurrency')}, rate {w.get('rate')}/s; {faults}"

    # ------------------------------------------------------------------ re-proving
    def _copy_for_run(self, path: Path, n: int) -> Path:
        """``path`` under its own name for its ``n``-th run (the runner keeps one journal per scenario
        name: a second run under the same name would add to the first one's journal)."""
        doc = yaml.safe_load(path.read_text())
        doc["name"] = f"{str(doc['name'])[:60].rstrip('-.')}-r{n}"
        out = path.parent / f"{doc['name']}.yaml"
        write_scenario(doc, out)
        return out

    def _prove(self, path: Path, ref: set[str], first: Any | None, stop_early: bool,
               label: str) -> tuple[int, int, set[str], bool, int]:
        """Run ``path`` until it has N judged runs (``first``, a run already made, is the first of
        them), each run under its own name: (k failing runs, m judged runs, the checks failing in
        every one among ``ref``, cut short by the budget, runs not judged). A run that could not be
        judged (error, skipped) is neither: it is run again, at most N times in all.
        ``stop_early``: stop at the first run that does not fail them, or that cannot be judged (a
        shrink step: a smaller schedule whose fault no longer acts is no reproduction; its N runs
        would only spend the budget)."""
        runs = [first] if first is not None else []
        not_judged, attempt, cut = 0, len(runs), False
        while len(runs) < self.reprove and not_judged < self.reprove:
            if not self._room():
                cut = True
                break
            attempt += 1
            res = self._run(self._copy_for_run(path, attempt) if attempt > 1 else path)
            self.say(f"    {label}: run {attempt} -> {res.verdict}"
                     + (f" [{', '.join(res.failing)}]" if res.failing else ""))
            if res.verdict in ("error", "skipped"):
                not_judged += 1
                if stop_early:  # a smaller schedule that cannot be judged reproduces nothing: drop the step
                    break
                continue
            runs.append(res)
            if stop_early and not (_is_failure(res) and ref & set(res.failing)):
                break
        common = set(ref)
        k = 0
        for r in runs:
            if _is_failure(r) and ref & set(r.failing):
                k += 1
            common &= set(r.failing) if _is_failure(r) else set()
        return k, len(runs), common, cut, not_judged

    def _settle(self, f: Finding) -> None:
        """Re-prove ``f`` N of N, shrink it (each kept step N of N too), write it and re-run it from
        the written file; set its status."""
        k, m, common, cut, nj = self._prove(Path(f.drawn), set(f.failing), _Ran(f.verdict, f.failing), False,
                                            f"re-prove seed {f.seed}")
        f.failed_runs, f.proving_runs, f.not_judged = k, m, nj
        why = ""
        also = f"; {nj} more not judged (harness errors)" if nj else ""
        if k < m:  # a judged run that did not fail it: flaky, however many runs the budget left
            f.status, why = FLAKY, f"failed {k} of {m} runs{also}"
        elif m < self.reprove:
            f.status = NOT_REPROVEN
            why = (f"the budget ended after {m} of its {self.reprove} runs ({k} failed{also})" if cut else
                   f"{nj} of its runs could not be judged (harness errors): {m} of {self.reprove} judged, all failed")
        elif not common:
            f.status = FLAKY
            why = f"failed {m} of {m} runs, but no check in all of them"
        if why:
            f.why_not = why
            self.say(f"    seed {f.seed}: {f.status} ({why})")
            self._write_finding(f)
            f.reported_at_s = self.elapsed()
            return
        f.checks = sorted(common)
        f.proven_at_s = self.elapsed()
        self.say(f"    seed {f.seed}: failed {k} of {m} runs, re-proven checks {', '.join(f.checks)}")
        drawn_checks = list(f.checks)
        if self.shrink:
            self._shrink(f)
        self._rerun_written(f)
        if f.status != REPROVEN and f.shrunk is not None and f.rerun and f.rerun["verdict"] not in ("refused",):
            # the shrunk schedule failed N of N but not from its file: back to the drawn one (also N of N)
            was = f"the shrunk reproduction's re-run from its file: {f.rerun['verdict']}"
            self.say(f"    seed {f.seed}: {was}; back to the drawn schedule")
            f.shrink_note = (f.shrink_note + "; " if f.shrink_note else "") + was + ", so the drawn schedule is kept"
            f.shrunk, f.shrunk_verdict, f.shrunk_failing, f.checks = None, None, [], drawn_checks
            f.status, f.why_not, f.rerun = NOT_REPROVEN, "", None
            self._rerun_written(f)
        f.reported_at_s = self.elapsed()

    def _rerun_written(self, f: Finding) -> None:
        """Write ``f``'s reproduction and run it once from that file (once more from a copy when
        the run cannot be judged): its status from that run."""
        self._write_finding(f)
        if not self._room():
            f.status, f.why_not = NOT_REPROVEN, "the budget ended before its re-run from the written file"
            self.say(f"    seed {f.seed}: {f.status} ({f.why_not})")
            return
        got = self.load(Path(f.path))
        if isinstance(got, str):  # the written file is the reproduction: it must load as written
            f.status, f.why_not = NOT_REPROVEN, f"its written file does not load: {got[:200]}"
            f.rerun = {"path": f.path, "verdict": "refused", "failing": [], "reproduces": False}
        else:
            res = self._run(Path(f.path))
            if res.verdict in ("error", "skipped") and self._room():  # not judged: once more, from a copy
                self.say(f"    seed {f.seed}: re-run from {f.path} -> {res.verdict} (not judged): once more")
                res = self._run(self._copy_for_run(Path(f.path), 2))
            same = _is_failure(res) and bool(set(f.checks) & set(res.failing))
            f.rerun = {"path": f.path, "verdict": res.verdict, "failing": list(res.failing), "reproduces": same}
            if same:
                f.status = REPROVEN
            elif res.verdict in ("error", "skipped"):
                f.status, f.why_not = NOT_REPROVEN, f"its re-run from the written file could not be judged ({res.verdict})"
            else:
                f.status, f.why_not = FLAKY, f"its re-run from the written file: {res.verdict}"
        self.say(f"    seed {f.seed}: re-run from {f.path} -> {f.rerun['verdict']}"
                 + (f" [{', '.join(f.rerun['failing'])}]" if f.rerun["failing"] else "") + f": {f.status}")

    # ------------------------------------------------------------------ shrinking
    def _shrink(self, f: Finding) -> None:
        best = f.schedule
        ref = set(f.checks)
        progress = True
        while progress:
            progress = False
            for what, cand in shrink_candidates(best, float(self.mod.MIN_WINDOW_S)):
                if not self._room(self.reprove + 1, self._reserve_s):  # its N runs, the file's re-run, the others
                    f.shrink_note = "shrinking cut short by the budget"
                    self.say(f"    shrink seed {f.seed}: {f.shrink_note}")
                    break
                path, why = self._materialize(cand, f.seed, f"k{f.shrink_runs}")
                if path is None:
                    continue
                before = self.tally.runs
                k, m, common, cut, _ = self._prove(path, ref, None, True, f"shrink seed {f.seed}: {what}")
                f.shrink_runs += self.tally.runs - before
                keep = not cut and k == m == self.reprove and bool(common)
                self.say(f"    shrink seed {f.seed}: {what} -> failed {k} of {m}" + (" (kept)" if keep else ""))
                if keep:
                    best, ref, progress = cand, common, True
                    break
        if best is not f.schedule:
            f.shrunk, f.shrunk_verdict, f.shrunk_failing = best, f.verdict, sorted(ref)
            f.checks = sorted(ref)

    def _write_finding(self, f: Finding) -> None:
        """The smallest failing schedule as a scenario that reproduces it: the target expected to
        pass (it deviates as long as the defect is there), the observed failure in its
        description."""
        schedule = f.shrunk or f.schedule
        failing = f.checks or (f.shrunk_failing if f.shrunk else f.failing)
        name = f"explore-{self.family.name}-{self.target}-{f.seed}"[:60].rstrip("-.")
        n = 1
        while name in self._ran:  # written again (back to the drawn schedule): its own name
            n += 1
            name = f"explore-{self.family.name}-{self.target}-{f.seed}"[:60].rstrip("-.") + f"-w{n}"
        doc = self.mod.render(schedule, name, self.target, f.seed)
        proof = (f"failed {f.failed_runs} of {f.proving_runs} runs" if f.status != SAME
                 else f"the same as seed {f.same_as}")
        doc["description"] = (f"Found by pdchaos explore (family {self.family.name}, target {self.target}, seed "
                              f"{f.seed}){' and shrunk' if f.shrunk else ''}: {f.verdict}, failing "
                              f"{', '.join(failing)} ({proof}). Expected to pass; it deviates while the defect "
                              "is there.")
        path = self.out_dir / f"{name}.yaml"
        write_scenario(doc, path)
        f.path = str(path)

    # ------------------------------------------------------------------ summary
    def summary(self) -> dict:
        t = self.tally
        return {"family": self.family.name, "target": self.target, "seed": self.seed, "budget_s": self.budget_s,
                "reprove": self.reprove, "elapsed_s": self.elapsed(), "schedules": t.schedules, "runs": t.runs,
                "passes": t.passes, "errors": t.errors, "invalid_draws": t.invalid,
                "reproven": len(t.reproven), "covering_cut": self.covering_cut, "first_run_s": self.run_times[0] if self.run_times else None,
                "median_run_s": sorted(self.run_times)[len(self.run_times) // 2] if self.run_times else None,
                "findings": [{"seed": f.seed, "status": f.status, "verdict": f.verdict, "failing": f.failing,
                              "checks": f.checks, "rate": f"{f.failed_runs}/{f.proving_runs}",
                              "not_judged": f.not_judged,
                              "why_not": f.why_not, "shrunk_failing": f.shrunk_failing,
                              "shrink_runs": f.shrink_runs, "shrink_note": f.shrink_note,
                              "faults": len(f.schedule["faults"]),
                              "shrunk_faults": len(f.shrunk["faults"]) if f.shrunk else None,
                              "same_as": f.same_as, "reproduction": f.path, "rerun": f.rerun,
                              "kept": self._describe(f.shrunk or f.schedule),
                              "found_at_s": f.found_at_s, "proven_at_s": f.proven_at_s,
                              "reported_at_s": f.reported_at_s} for f in t.findings],
                "error_reasons": t.error_reasons}


@dataclass
class _Ran:
    """The run that found a finding, as the first of its N."""

    verdict: str
    failing: list[str]


def dump_summary(summary: dict, path: Path) -> None:
    path.write_text(json.dumps(summary, indent=1) + "\n")
