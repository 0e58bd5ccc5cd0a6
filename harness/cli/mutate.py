"""``pdchaos mutate DIR``: prove the scenarios can tell a broken system from the hardened one.

The strongest mutant of a hardened target is its family's baseline (``upstream``: every guarantee
switched off at once). For every scenario in DIR that **claims a gain** — its expectation for the
hardened target differs from the baseline's — the baseline's run, judged against the hardened
target's claims (``pdchaos check --as``), must deviate: the mutant is *killed* there. A scenario in
which it still reads "as expected" lets a system without the guarantee pass: it *survives*, and
the command exits 1. A run that cannot be judged (error, skipped, missing) is neither: it is
listed as unjudged and also exits 1.

**System mutants** (without ``--from``): for each guarantee of a hardened connector, the connector
with that guarantee switched off, kept with the tests and never part of ``connector_patch/``. A
family lists its mutants in ``tests/mutants/system/<family>.py`` (``MUTANTS``: name, guarantee,
the scenarios that claim it; ``profile_sets(name)``: the ``--set`` values that make the target
that mutant). Each mutant runs as the target on its scenarios, on real nodes (``pdchaos run``, its
own process and run folder), and is judged against the target's expectations: a deviation kills
it; as expected, it survives; an error, a skip or a missing run leaves it unjudged. ``--mutant
NAME`` runs only those (and not the strongest mutant).

``--from RUN_DIR`` judges the baseline runs of a saved run (offline, seconds: what CI does after
its suites), and nothing else; without it the baseline target of the claiming scenarios is run
first, then the system mutants. Writes ``mutate.json`` (every row, the score) into the last run
folder and prints one line per scenario and mutant and the mutation score. Exit 1 unless every
mutant was killed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from nodekit import journal as J
from .. import verdicts as V
from ..errors import UsageError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", metavar="DIR", help="scenario files or folders")
    p.add_argument("--list", action="store_true", help="print the system mutants' names, one a line, and exit "
                                                      "(with --family: that family's only)")
    p.add_argument("--family", default=None, help="with --list: only this family's mutants")
    p.add_argument("--from", dest="from_run", metavar="RUN_DIR",
                   help="judge the baseline runs of this saved run instead of running them")
    p.add_argument("--target", default="hardened", help="the target whose claims are judged (default hardened)")
    p.add_argument("--runs-dir", default="runs", help="where a new run folder goes (without --from)")
    p.add_argument("--plain", action="store_true", help="no live progress display")
    p.add_argument("--mutant", action="append", default=[], metavar="NAME",
                   help="run only this system mutant (repeatable; the strongest mutant is not run then)")


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
    """The baseline's saved run judged against ``target``'s claims (harness/cli/check.py: judged_as)."""
    from ..saved import check_saved
    from .check import _not_run, judged_as

    records = judged_as(J.read_journal(journal), target)
    expected = J.meta(records).get("expect", "")
    not_run = _not_run(records)
    if not_run:
        return {"verdict": not_run[0], "failing": [], "expected": expected, "outcome": not_run[0],
                "reason": not_run[1]}
    verdict, failing = V.of_results(check_saved(journal, records))
    outcome = V.outcome(verdict, expected, failing)
    return {"verdict": verdict, "failing": failing, "expected": expected, "outcome": outcome,
            "reason": V.difference(verdict, expected, failing) if outcome == "deviation" else ""}


def list_mutants(family: str | None) -> list[str]:
    """The system mutants' names (``family``'s only, when given; an unknown family is a usage error)."""
    tables = mutant_tables()
    if family is not None and family not in tables:
        raise UsageError(f"--family {family!r}: no system mutants (families with some: {', '.join(sorted(tables))})")
    return [m[0] for fam, mod in sorted(tables.items()) if family in (None, fam) for m in mod.MUTANTS]


def run(args: argparse.Namespace) -> int:
    from ..schema import load_all

    if args.list:
        if args.paths or args.from_run or args.mutant:
            raise UsageError("--list prints the system mutants' names: no DIR, --from or --mutant with it")
        for name in list_mutants(args.family):
            print(name)
        return 0
    if args.family is not None:
        raise UsageError("--family goes with --list (a run takes its families from its scenarios)")
    if not args.paths:
        raise UsageError("name the scenario files or folders (DIR), or --list")
    scenarios = load_all(args.paths)
    if args.from_run and args.mutant:
        raise UsageError("--mutant runs system mutants on real nodes; --from judges a saved run: not both")
    todo = claims(scenarios, args.target)
    systems = [] if args.from_run else system_mutants(scenarios, args.target, args.mutant)
    if not todo and not systems:
        raise UsageError(f"no scenario in {', '.join(args.paths)} claims a gain of {args.target!r} over its "
                         f"family's baseline (their expectations are the same), and no system mutant of theirs "
                         f"exists: nothing to judge")
    rows: list[dict] = []
    run_dir: Path | None = None
    if todo and not args.mutant:
        if args.from_run:
            run_dir = Path(args.from_run)
            if not run_dir.is_dir():
                raise UsageError(f"{run_dir}: no such run folder")
        else:
            run_dir = _run(args, [sc for sc, _ in todo], sorted({b for _, b in todo}), [], "the baseline run")
        for sc, base in todo:
            rows.append(_row(run_dir, sc, base, base, args.target, "the strongest mutant"))
    for m in systems:
        run_dir = _run(args, m["scenarios"], [args.target], m["sets"], f"mutant {m['name']}")
        for sc in m["scenarios"]:
            rows.append(_row(run_dir, sc, args.target, m["name"], args.target, m["guarantee"]))
    killed = sum(r["result"] == "killed" for r in rows)
    for r in rows:
        how = f"{r['verdict']} [{', '.join(r['failing'])}]"
        print(f"{r['result'].upper():9s} {r['scenario']} [{r['mutant']} judged as {args.target}]: {how}; claim "
              f"{r['claim']}" + (f" ({r['reason']})" if r["result"] == "unjudged" else ""))
    score = f"{killed}/{len(rows)}"
    names = sorted({r["mutant"] for r in rows})
    print(f"mutation score ({args.target}; mutants: {', '.join(names)}): {score} killed")
    doc = {"target": args.target, "from": str(run_dir), "killed": killed, "total": len(rows), "rows": rows}
    out = (run_dir or Path(args.runs_dir)) / "mutate.json"
    try:
        out.write_text(json.dumps(doc, indent=1))
        print(f"wrote {out} (`pdchaos report {out.parent}` puts the score in the run's summary.md and report)")
    except OSError as exc:
        print(f"could not write {out}: {exc}")
    return 0 if killed == len(rows) else 1


def _row(run_dir: Path, sc, ran_as: str, mutant: str, target: str, guarantee: str) -> dict:  # noqa: ANN001
    journal = run_dir / sc.name / ran_as / "journal.jsonl"
    row = {"scenario": sc.name, "mutant": mutant, "guarantee": guarantee, "claim": sc.model.expected(target),
           "run": str(run_dir)}
    if not journal.is_file():
        row.update(verdict="missing", failing=[], outcome="missing", reason=f"no run of {sc.name} [{ran_as}] in "
                                                                          f"{run_dir}")
    else:
        row.update(judge(journal, target))
    row["result"] = {"deviation": "killed", "as_expected": "survived"}.get(row["outcome"], "unjudged")
    return row


def mutant_tables() -> dict[str, object]:
    """{family: its mutant table module} from tests/mutants/system/ beside this checkout."""
    import importlib.util

    root = Path(__file__).resolve().parents[2] / "tests" / "mutants" / "system"
    out: dict[str, object] = {}
    for f in sorted(root.glob("*.py")) if root.is_dir() else []:
        if f.name.startswith("_"):
            continue
        spec = importlib.util.spec_from_file_location(f"pdchaos_mutant_table_{f.stem}", f)
        mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
        out[getattr(mod, "FAMILY", f.stem)] = mod
    return out


def system_mutants(scenarios: list, target: str, only: list[str]) -> list[dict]:
    """The system mutants of the families in ``scenarios`` for ``target``, each with the scenarios
    (of those given) that claim its guarantee; a mutant none of whose scenarios is given is left
    out; ``only`` names mutants to keep (an unknown name is a usage error)."""
    tables = mutant_tables()
    by_name = {sc.name: sc for sc in scenarios}
    out, known = [], set()
    for fam in sorted({sc.family.name for sc in scenarios}):
        mod = tables.get(fam)
        if mod is None or getattr(mod, "TARGET", target) != target:
            continue
        for name, guarantee, names in mod.MUTANTS:
            known.add(name)
            if only and name not in only:
                continue
            mine = [by_name[n] for n in names if n in by_name]
            if mine:
                out.append({"name": name, "guarantee": guarantee, "scenarios": mine, "sets": mod.profile_sets(name)})
    unknown = sorted(set(only) - known)
    if unknown:
        raise UsageError(f"--mutant {unknown[0]}: no such system mutant (known: {', '.join(sorted(known)) or 'none'})")
    return out


def _run(args: argparse.Namespace, scs: list, targets: list[str], sets: list[str], what: str) -> Path:
    """Run ``scs`` for ``targets`` with ``pdchaos run`` (its own process: a normal run folder, warm
    reuse); the run's own deviations do not matter here, they are judged after."""
    import subprocess
    import sys

    root = Path(args.runs_dir)
    root.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in root.iterdir()}
    cmd = [sys.executable, "-m", "harness.cli", "run", *[str(sc.path) for sc in scs], "--runs-dir", str(root),
           "--no-report"] + [x for t in targets for x in ("--target", t)] + [x for v in sets for x in ("--set", v)] \
        + (["--plain"] if args.plain else [])
    print(f"== {what}: {len(scs)} scenario(s), target {', '.join(targets)}", flush=True)
    rc = subprocess.call(cmd)
    new = sorted(p for p in root.iterdir() if p.is_dir() and p.name not in before)
    if rc not in (0, 1) or not new:
        raise UsageError(f"{what} (pdchaos run {' '.join(cmd[4:6])} ...) failed with exit {rc}")
    return new[-1]
