"""``pdchaos explore --family FAMILY --budget 20m``: generative chaos over real nodes
(harness/explore.py). Draws seeded schedules from the family's generator, runs each against one
target with the scenario checks, re-proves every schedule the target did not pass (it must fail
the same checks in N of N runs, ``--reprove N``, default 3), shrinks it (each kept step re-proven
N of N too), writes the smallest one as a scenario file (``<run folder>/explore-...yaml``: it
expects the target to pass, so it deviates while the defect is there) and runs it once more from
that file before reporting it. A finding that fails k < N of its runs is reported as flaky with
its rate; one whose re-proving the budget cut short as "not re-proven"; neither is a finding. The
run folder also holds every drawn scenario (``drawn/``), each run's journal and checks, and
``explore.json`` (the summary).

``--mutant NAME`` runs the explorer alone (no written scenario) against one of ``pdchaos
mutate``'s system mutants (``pdchaos mutate --list``): the family's mutant target (hardened) with
that guarantee switched off; it stops at the first re-proven finding (the mutant is killed) and
``explore.json`` says when.

Exit 0 when no re-proven finding was made (with ``--mutant``: the mutant survived the budget), 1
when one was (the mutant was killed), 2 on bad input or when the family's node stack is missing;
128 + the signal's number when SIGINT, SIGTERM or SIGHUP interrupted it (130, 143, 129: the run
under way torn down, every process stopped, ``explore.json`` written). A run that could not be
judged (a harness error: e.g. a window no request crossed) is counted apart, never as a pass or
a finding. The budget is checked before each run: the last run may end past it by its own length.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
from contextlib import ExitStack
from pathlib import Path

from ..errors import UsageError
from ..interrupts import Interrupts, sweep_leftovers


def _budget(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration such as 90s, 20m or 1h")
    v = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2) or "s"]
    if not 30 <= v <= 24 * 3600:
        raise argparse.ArgumentTypeError(f"{text!r}: between 30 s and 24 h")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--family", required=True, help="the family whose generator draws the schedules")
    p.add_argument("--target", default=None, help="the target every schedule runs against (default: the family's "
                                                  "first target that is not its baseline, e.g. hardened)")
    p.add_argument("--budget", type=_budget, default=_budget("20m"), help="how long to explore (e.g. 20m; default 20m)")
    p.add_argument("--seed", type=int, default=1, help="the seed of the whole exploration (default 1)")
    p.add_argument("--runs-dir", default="runs", help="where the run folder goes (default: runs/)")
    p.add_argument("--no-shrink", action="store_true", help="report findings as drawn, without shrinking them")
    p.add_argument("--reprove", type=_reprove, default=3, metavar="N",
                   help="a schedule counts only when it fails the same checks in N of N runs (default 3)")
    p.add_argument("--mutant", default=None, metavar="NAME",
                   help="explore against this system mutant of the family (`pdchaos mutate --list`) and stop at "
                        "the first re-proven finding: exit 1 when it is killed, 0 when it survives the budget")


def _reprove(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of runs, 1 to 10") from None
    if not 1 <= n <= 10:
        raise argparse.ArgumentTypeError(f"{text!r}: between 1 and 10 runs")
    return n


def mutant_profile(family, name: str, target: str | None) -> tuple[str, list[str]]:  # noqa: ANN001
    """(the mutant's target, the profile ``--set`` values that make that target the mutant), or one
    UsageError naming the valid mutants."""
    from .mutate import mutant_tables

    table = mutant_tables().get(family.name)
    if table is None:
        raise UsageError(f"--mutant {name!r}: family {family.name} has no system mutants")
    names = [m[0] for m in table.MUTANTS]
    if name not in names:
        raise UsageError(f"--mutant {name!r}: no such system mutant of family {family.name} (valid: "
                         f"{', '.join(names)})")
    mtarget = getattr(table, "TARGET", "hardened")
    if target is not None and target != mtarget:
        raise UsageError(f"--target {target!r}: a system mutant of family {family.name} runs as {mtarget!r}")
    return mtarget, list(table.profile_sets(name))


def run(args: argparse.Namespace) -> int:
    from ..explore import Explorer, dump_summary, explore_module
    from ..family import get_family, known_families
    from ..pool import NodePool
    from ..runner import Runner, missing_requirements, new_run_dir
    from ..schema import load_scenario
    from ..services import start_toxiproxy

    try:
        family = get_family(args.family).load()
    except UsageError:
        raise UsageError(f"--family {args.family!r}: no such family (known: {', '.join(known_families())})") from None
    explore_module(family)  # one clear error when the family has no generator
    profile = None
    if args.mutant is not None:
        target, sets = mutant_profile(family, args.mutant, args.target)
        profile = family.load_profile(None, sets)
    else:
        target = args.target or next(t for t in family.targets if t != family.baseline_target)
    if target not in family.targets:
        raise UsageError(f"--target {target!r}: family {family.name} has targets {', '.join(family.targets)}")
    sweep_leftovers(sys.stderr)  # what a run killed outright left here (its namespaces)
    run_dir = new_run_dir(args.runs_dir)
    checked: dict[str, str | None] = {}
    services: dict = {}

    def load(path: Path):
        try:
            sc = load_scenario(path)
        except UsageError as exc:
            return str(exc)
        why = family.excluded(sc.model, target, profile)
        if why:
            return why
        if "stack" not in checked:  # the node stack is the same for every draw: checked once
            checked["stack"] = family.unavailable(sc.model, profile)
            if checked["stack"]:
                raise UsageError(f"pdchaos explore: {checked['stack']}")
        # what this draw needs beyond the stack (toxiproxy-server, root): a draw this machine cannot
        # run is refused before it runs (counted, redrawn), never run as a skip
        return missing_requirements(sc, services, profile) or sc

    # SIGINT, SIGTERM and SIGHUP from here to the end: a clean stop (harness/interrupts.py)
    with Interrupts() as intr:
        with ExitStack() as stack:
            pool = stack.enter_context(NodePool(run_dir))
            # the drawn schedules are not known yet: toxiproxy-server runs whenever it is installed, so a
            # drawn toxic is run, not skipped (without the server such a draw is refused and redrawn)
            services.update(node_pool=pool, toxiproxy=start_toxiproxy([], stack, run_dir, always=True))
            runner = Runner(run_dir, targets=[target], services=services,
                            profiles={family.name: profile} if profile is not None else None)

            def run_one(path: Path, tgt: str):
                return runner.run_one(load_scenario(path), tgt)

            explorer = Explorer(family, target, args.seed, args.budget, run_dir, run_one, load,
                                say=lambda s: print(s, flush=True), shrink=not args.no_shrink, reprove=args.reprove,
                                first=args.mutant is not None)
            what = f"mutant {args.mutant} (as {target})" if args.mutant else f"target {target}"
            print(f"explore: family {family.name}, {what}, seed {args.seed}, budget {args.budget:g} s, re-proving "
                  f"{args.reprove} of {args.reprove}; run folder {run_dir}", flush=True)

            def on_signal(name: str) -> None:
                runner.interrupt(name)
                explorer.budget_s = 0.0  # no further run starts

            intr.on(on_signal)
            explorer.explore()
        summary = explorer.summary()
        if args.mutant is not None:
            killer = next((f for f in summary["findings"] if f["status"] == "re-proven"), None)
            summary["mutant"] = {"name": args.mutant, "killed": killer is not None,
                                 "time_to_kill_s": killer["proven_at_s"] if killer else None,
                                 "reported_at_s": killer["reported_at_s"] if killer else None,
                                 "reproduction": killer["reproduction"] if killer else None,
                                 "rate": killer["rate"] if killer else None}
        dump_summary(summary, run_dir / "explore.json")
        t = explorer.tally
        by = {s: sum(f["status"] == s for f in summary["findings"]) for s in ("re-proven", "flaky", "not re-proven", "same")}
        print(f"explore: {t.schedules} schedules ({t.runs} runs, {summary['elapsed_s']:.0f} s): {t.passes} passed, "
              f"{len(t.findings)} failed ({by['re-proven']} re-proven {args.reprove} of {args.reprove} and by their "
              f"file's re-run, {by['flaky']} flaky, {by['not re-proven']} not re-proven, {by['same']} the same as an "
              f"earlier one), {t.errors} not judged (harness errors), {t.invalid} drawn schedules refused before running",
              flush=True)
        for f in summary["findings"]:
            faults = f"{f['faults']} -> {f['shrunk_faults']} faults" if f["shrunk_faults"] is not None else \
                f"{f['faults']} faults, not shrunk" + (f": the same as seed {f['same_as']}" if f.get("same_as") else "")
            status = f["status"] if f["status"] != "same" else "the same"
            rate = f"failed {f['rate'].replace('/', ' of ')} runs"
            rerun = (f"; re-run from its file: {f['rerun']['verdict']}" if f["rerun"] else "")
            why = f" ({f['why_not']})" if f["why_not"] else ""
            note = f", {f['shrink_note']}" if f["shrink_note"] else ""
            print(f"  {status} seed {f['seed']}: {f['verdict']} [{', '.join(f['checks'] or f['failing'])}] ({rate}, "
                  f"{faults}, {f['shrink_runs']} shrink runs{note}{rerun}){why}: {f['reproduction']}", flush=True)
        for why in summary["error_reasons"][:5]:
            print(f"  not judged: {why}", flush=True)
        if intr.signum is not None or runner.interrupted:
            print(f"interrupted ({intr.name or 'SIGINT'}): every process of the run was stopped; run folder {run_dir}",
                  file=sys.stderr)
            return intr.exit_code or 128 + signal.SIGINT
        if args.mutant is not None:
            m = summary["mutant"]
            open_ = [f for f in summary["findings"] if f["status"] in ("flaky", "not re-proven")]
            print(f"mutant {args.mutant}: " + (f"KILLED at {m['time_to_kill_s']:.0f} s (failed {m['rate'].replace('/', ' of ')}"
                                              f" runs, re-run from {m['reproduction']})" if m["killed"] else
                                              f"not killed in {args.budget:g} s" + (
                                                  f" ({len(open_)} candidate(s) flaky or not re-proven: see above)"
                                                  if open_ else ": survived")), flush=True)
        return 1 if t.reproven else 0
