"""``pdchaos explore --family FAMILY --budget 20m``: generative chaos over real nodes
(harness/explore.py). Draws seeded schedules from the family's generator, runs each against one
target with the scenario checks, shrinks every schedule the target did not pass and writes the
smallest one that still fails as a scenario file (``<run folder>/explore-...yaml``: it expects the
target to pass, so it deviates while the defect is there). The run folder also holds every drawn
scenario (``drawn/``), each run's journal and checks, and ``explore.json`` (the summary).

Exit 0 when the target passed every schedule it ran, 1 when it failed one (a finding), 2 on bad
input or when the family's node stack is missing; 130 when interrupted. A run that could not be
judged (a harness error: e.g. a window no request crossed) is counted apart, never as a pass or a
finding. The budget is checked before each run: the last run may end past it by its own length.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
from contextlib import ExitStack
from pathlib import Path

from ..errors import UsageError


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


def run(args: argparse.Namespace) -> int:
    from ..explore import Explorer, dump_summary, explore_module
    from ..family import get_family, known_families
    from ..pool import NodePool
    from ..runner import Runner, missing_requirements, new_run_dir
    from ..schema import load_scenario

    try:
        family = get_family(args.family).load()
    except UsageError:
        raise UsageError(f"--family {args.family!r}: no such family (known: {', '.join(known_families())})") from None
    explore_module(family)  # one clear error when the family has no generator
    target = args.target or next(t for t in family.targets if t != family.baseline_target)
    if target not in family.targets:
        raise UsageError(f"--target {target!r}: family {family.name} has targets {', '.join(family.targets)}")
    run_dir = new_run_dir(args.runs_dir)
    checked: dict[str, str | None] = {}

    def load(path: Path):
        try:
            sc = load_scenario(path)
        except UsageError as exc:
            return str(exc)
        why = family.excluded(sc.model, target, None)
        if why:
            return why
        if "stack" not in checked:  # the node stack is the same for every draw: checked once
            checked["stack"] = family.unavailable(sc.model, None) or missing_requirements(sc, {}, None)
            if checked["stack"]:
                raise UsageError(f"pdchaos explore: {checked['stack']}")
        return sc

    with ExitStack() as stack:
        pool = stack.enter_context(NodePool(run_dir))
        runner = Runner(run_dir, targets=[target], services={"node_pool": pool})

        def run_one(path: Path, tgt: str):
            return runner.run_one(load_scenario(path), tgt)

        def on_signal(signum, frame):  # noqa: ARG001
            runner.interrupt()
            explorer.budget_s = 0.0  # no further run starts

        explorer = Explorer(family, target, args.seed, args.budget, run_dir, run_one, load,
                            say=lambda s: print(s, flush=True), shrink=not args.no_shrink)
        print(f"explore: family {family.name}, target {target}, seed {args.seed}, budget {args.budget:g} s; "
              f"run folder {run_dir}", flush=True)
        old_int, old_term = signal.signal(signal.SIGINT, on_signal), signal.signal(signal.SIGTERM, on_signal)
        try:
            explorer.explore()
        finally:
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, old_term)
    summary = explorer.summary()
    dump_summary(summary, run_dir / "explore.json")
    t = explorer.tally
    print(f"explore: {t.schedules} schedules ({t.runs} runs, {summary['elapsed_s']:.0f} s): {t.passes} passed, "
          f"{len(t.findings)} failed, {t.errors} not judged (harness errors), {t.invalid} drawn schedules "
          f"refused before running", flush=True)
    for f in summary["findings"]:
        faults = f"{f['faults']} -> {f['shrunk_faults']} faults" if f["shrunk_faults"] is not None else \
            f"{f['faults']} faults, not shrunk" + (f": the same as seed {f['same_as']}" if f.get("same_as") else "")
        print(f"  finding seed {f['seed']}: {f['verdict']} [{', '.join(f['failing'])}] ({faults}, "
              f"{f['shrink_runs']} shrink runs): {f['reproduction']}", flush=True)
    for why in summary["error_reasons"][:5]:
        print(f"  not judged: {why}", flush=True)
    if runner.interrupted:
        print("interrupted: every process of the run was stopped", file=sys.stderr)
        return 130
    return 1 if t.findings else 0
