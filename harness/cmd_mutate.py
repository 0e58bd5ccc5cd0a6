"""``pdchaos mutate DIR``: prove the scenarios can tell a broken system from the hardened one.

The strongest mutant of a hardened target is its family's baseline (``upstream``: every guarantee
switched off at once). For every scenario in DIR that **claims a gain** — its expectation for the
hardened target differs from the baseline's — the baseline's run, judged against the hardened
target's claims (``pdchaos check --as``), must deviate: the mutant is *killed* there. A scenario in
which it still reads "as expected" lets a system without the guarantee pass: it *survives*, and
the command exits 1. A run that cannot be judged (error, skipped, missing) is neither: it is
listed as unjudged and also exits 1.

``--from RUN_DIR`` judges the baseline runs of a saved run (offline, seconds: what CI does after
its suites); without it the baseline target of the claiming scenarios is run first. Writes
``mutate.json`` into the run folder and prints one line per scenario and the mutation score.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import journal as J
from . import verdicts as V
from .errors import UsageError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="DIR", help="scenario files or folders")
    p.add_argument("--from", dest="from_run", metavar="RUN_DIR",
                   help="judge the baseline runs of this saved run instead of running them")
    p.add_argument("--target", default="hardened", help="the target whose claims are judged (default hardened)")
    p.add_argument("--runs-dir", default="runs", help="where a new run folder goes (without --from)")
    p.add_argument("--plain", action="store_true", help="no live progress display")


def claims(scenarios: list, target: str) -> list[tuple]:
    """(scenario, baseline target) for every scenario that runs both and expects of ``target``
    what its baseline cannot show: no outcome meets both expectations (a baseline that may pass
    or fail where the target passes claims nothing: its passing run could not be told apart)."""
    out = []
    for sc in scenarios:
        base = sc.family.baseline_target
        m = sc.model
        if base is None or base == target or target not in m.targets or base not in m.targets:
            continue
        if not V.overlap(m.expected(target), m.expected(base)):
            out.append((sc, base))
    return out


def judge(journal: Path, target: str) -> dict:
    """The baseline's saved run judged against ``target``'s claims (cmd_check.judged_as)."""
    from . import checks as C
    from .cmd_check import _not_run, judged_as

    records = judged_as(J.read_journal(journal), target)
    expected = J.meta(records).get("expect", "")
    not_run = _not_run(records)
    if not_run:
        return {"verdict": not_run[0], "failing": [], "expected": expected, "outcome": not_run[0],
                "reason": not_run[1]}
    verdict, failing = V.of_results(C.check_saved(journal, records))
    outcome = V.outcome(verdict, expected, failing)
    return {"verdict": verdict, "failing": failing, "expected": expected, "outcome": outcome,
            "reason": V.difference(verdict, expected, failing) if outcome == "deviation" else ""}


def run(args: argparse.Namespace) -> int:
    from .schema import load_all

    scenarios = load_all(args.paths)
    todo = claims(scenarios, args.target)
    if not todo:
        raise UsageError(f"no scenario in {', '.join(args.paths)} claims a gain of {args.target!r} over its "
                         f"family's baseline (their expectations are the same): nothing to judge")
    if args.from_run:
        run_dir = Path(args.from_run)
        if not run_dir.is_dir():
            raise UsageError(f"{run_dir}: no such run folder")
    else:
        run_dir = _run_baselines(args, todo)
    rows = []
    for sc, base in todo:
        journal = run_dir / sc.name / base / "journal.jsonl"
        row = {"scenario": sc.name, "mutant": base, "claim": sc.model.expected(args.target)}
        if not journal.is_file():
            row.update(verdict="missing", failing=[], outcome="missing", reason=f"no run of {sc.name} [{base}] in "
                                                                              f"{run_dir}")
        else:
            row.update(judge(journal, args.target))
        row["result"] = {"deviation": "killed", "as_expected": "survived"}.get(row["outcome"], "unjudged")
        rows.append(row)
    killed = sum(r["result"] == "killed" for r in rows)
    for r in rows:
        how = f"{r['verdict']} [{', '.join(r['failing'])}]"
        print(f"{r['result'].upper():9s} {r['scenario']} [{r['mutant']} judged as {args.target}]: {how}; claim "
              f"{r['claim']}" + (f" ({r['reason']})" if r["result"] == "unjudged" else ""))
    score = f"{killed}/{len(rows)}"
    print(f"mutation score ({args.target} vs its baseline, the strongest mutant): {score} killed")
    doc = {"target": args.target, "from": str(run_dir), "killed": killed, "total": len(rows), "rows": rows}
    out = run_dir / "mutate.json"
    try:
        out.write_text(json.dumps(doc, indent=1))
    except OSError as exc:
        print(f"could not write {out}: {exc}")
    return 0 if killed == len(rows) else 1


def _run_baselines(args: argparse.Namespace, todo: list) -> Path:
    """Run the baseline target of each claiming scenario with ``pdchaos run`` (its own process: a
    normal run folder, warm reuse, reports); the run's own deviations do not matter here."""
    import subprocess
    import sys

    bases = sorted({base for _, base in todo})
    root = Path(args.runs_dir)
    root.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in root.iterdir()}
    cmd = [sys.executable, "-m", "harness.cli", "run", *[str(sc.path) for sc, _ in todo], "--runs-dir", str(root),
           "--no-report"] + [x for b in bases for x in ("--target", b)] + (["--plain"] if args.plain else [])
    rc = subprocess.call(cmd)
    new = sorted(p for p in root.iterdir() if p.is_dir() and p.name not in before)
    if rc not in (0, 1) or not new:
        raise UsageError(f"the baseline run ({' '.join(cmd[3:6])} ...) failed with exit {rc}")
    return new[-1]
