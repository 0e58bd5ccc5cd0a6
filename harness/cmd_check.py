"""``pdchaos check RUN_DIR``: re-run the checks of a saved run offline, from its journals alone.

Prints each scenario/target's verdict and outcome and whether the verdict equals the one saved at
run time. What the checks read besides the history (expectation, check options, applicability,
the effect each fault must show) comes from the scenario file the run names when it is here (a
history cannot lower its own bar), else from the run's saved meta line, and the line says so. A run
that was skipped or ended in a harness error (its journal says so) keeps that outcome. Exit as ``pdchaos run``: 1 on any deviation or error, and with ``--strict`` on any
skipped run; else 0; 2 when RUN_DIR is not a run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import checks as C
from . import journal as J
from .errors import UsageError
from .journal import iter_runs, meta
from . import verdicts as V
from .outputs import counts, outcome_of, run_status, tally

MARK = {"as_expected": "", "deviation": " DEVIATION", "skipped": " SKIPPED", "error": " ERROR"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--json", action="store_true", help="one JSON object per scenario/target")
    p.add_argument("--strict", action="store_true", help="a skipped scenario run fails the check: exit 1")
    p.add_argument("--as", dest="as_target", metavar="TARGET",
                   help="judge every run as if it were TARGET's: that target's expectation and options, from "
                        "the scenario file the run names (e.g. upstream's runs against hardened's claims: each "
                        "scenario that claims a hardened gain must then deviate)")


# what a saved meta line says that the checks read: rebuilt from the scenario file when it is here
FROM_FILE = ("scenario", "family", "deadline_ms", "tolerance_ms", "checks", "not_applicable", "expect", "targets",
             "baseline_target", "primary_ops", "planned_ops", "topology", "workload", "faults")


def _scenario_of(records: list[dict]):
    """The scenario the meta line names, loaded from its file, or None when the file is not here
    or now holds another scenario."""
    from .schema import load_scenario

    m = meta(records)
    path = m.get("file")
    if not path or not Path(path).is_file():
        return None
    sc = load_scenario(path)
    return sc if sc.model.name == m.get("scenario") else None


def judged_as(records: list[dict], target: str) -> list[dict]:
    """The records with the meta line of ``target`` instead: its expectation, applicability,
    options and faults' declared effects, read from the scenario file the meta line names (the
    current file)."""
    m = meta(records)
    sc = _scenario_of(records)
    if sc is None:
        raise UsageError(f"--as {target}: the run names scenario file {m.get('file')!r}, which is not here "
                         f"(or holds another scenario than {m.get('scenario')!r})")
    if target not in sc.model.targets and target not in sc.family.targets:
        raise UsageError(f"--as {target}: {sc.path} has no target {target!r} (targets: {', '.join(sc.family.targets)})")
    return _with_meta(records, sc, target, {"judged_as_from": m.get("target")})


def _with_meta(records: list[dict], sc, target: str, extra: dict) -> list[dict]:
    from .runner import scenario_meta

    fresh = scenario_meta(sc, target)
    new_meta = {**meta(records), **{k: fresh[k] for k in FROM_FILE}, "target": target, **extra}
    return [new_meta if r.get("type") == "meta" else r for r in records]


def judged_by_file(records: list[dict]) -> tuple[list[dict], str]:
    """The records with their meta line rebuilt from the scenario file (a history cannot lower
    its own bar), and where the meta came from: ``file`` or ``saved`` (the file is not here: the
    saved line, as written by the run, is all there is)."""
    sc = _scenario_of(records)
    target = meta(records).get("target")
    if sc is None or (target not in sc.model.targets and target not in sc.family.targets):
        return records, "saved"
    return _with_meta(records, sc, target, {}), "file"


def _not_run(records: list[dict]) -> tuple[str, str] | None:
    """(verdict, reason) when the journal records a run that never reached its checks."""
    m = meta(records)
    if m.get("skipped"):
        return "skipped", str(m["skipped"])
    if m.get("error"):
        return "error", str(m["error"])
    end = next((r for r in reversed(records) if r.get("type") == "end"), {})
    if end.get("reason") in ("error", "interrupted"):
        return "error", f"the run ended with reason {end['reason']!r} (no verdict)"
    return None


def recheck(run_dir: Path, as_target: str | None = None) -> list[dict]:
    out = []
    for scenario, target, path in iter_runs(run_dir):
        records = J.read_journal(path)
        if as_target:
            records, source = judged_as(records, as_target), "file"
        else:
            records, source = judged_by_file(records)
        expected = meta(records).get("expect", "pass")
        row = {"scenario": scenario, "target": target, "expected": expected, "meta_from": source}
        not_run = _not_run(records)
        if not_run:
            row.update(verdict=not_run[0], reason=not_run[1], checks=[])
        else:
            results = C.check_saved(path, records)
            verdict, failing = V.of_results(results)
            row.update(verdict=verdict, failing=failing, reason="", checks=[r.to_dict() for r in results])
        row["outcome"] = outcome_of(row["verdict"], expected, row.get("failing"))
        if row["outcome"] == "deviation":
            row["reason"] = V.difference(row["verdict"], expected, row.get("failing"))
        out.append(row)
    return out


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: no such run folder")
    saved = {}
    summary = run_dir / "summary.json"
    if summary.exists():
        for r in json.loads(summary.read_text()).get("results", []):
            saved[(r["scenario"], r["target"])] = r.get("verdict")
    rows = recheck(run_dir, getattr(args, "as_target", None))
    if not rows:
        raise UsageError(f"{run_dir}: no journals (*/*/journal.jsonl) in this folder")
    for row in rows:
        same = saved.get((row["scenario"], row["target"]))
        if args.json:
            print(json.dumps({**row, "saved_verdict": same}))
            continue
        note = "" if same is None else (" (same as saved)" if same == row["verdict"] else f" (saved: {same})")
        if row.get("meta_from") == "saved":
            note += " (scenario file not here: judged by the run's saved meta line)"
        print(f"{row['scenario']} [{row['target']}] {row['verdict']}, expected {row['expected']}"
              f"{MARK[row['outcome']]}{note}" + (f": {row['reason']}" if row["reason"] else ""))
        for c in row["checks"]:
            if c["ok"] is False:
                print(f"    {c['name']}: {c['message']}")
        na = [c["name"] for c in row["checks"] if c["ok"] is None]
        if na:
            print(f"    n/a (not applicable): {', '.join(na)}")
    outcomes = [row["outcome"] for row in rows]
    code, why = run_status(outcomes, strict=args.strict)
    if not args.json:
        print(f"{len(rows)} scenario runs: {tally(counts(outcomes))}")
        print(why)
    return code
