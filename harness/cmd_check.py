"""``pdchaos check RUN_DIR``: re-run the checks of a saved run offline, from its journals alone.

Prints each scenario/target's verdict and outcome and whether the verdict equals the one saved at
run time. A run that was skipped or ended in a harness error (its journal says so) keeps that
outcome. Exit as ``pdchaos run``: 1 on any deviation or error, and with ``--strict`` on any
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
from .outputs import counts, outcome_of, run_status, tally

MARK = {"as_expected": "", "deviation": " DEVIATION", "skipped": " SKIPPED", "error": " ERROR"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--json", action="store_true", help="one JSON object per scenario/target")
    p.add_argument("--strict", action="store_true", help="a skipped scenario run fails the check: exit 1")


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


def recheck(run_dir: Path) -> list[dict]:
    out = []
    for scenario, target, path in iter_runs(run_dir):
        records = J.read_journal(path)
        expected = meta(records).get("expect", "pass")
        row = {"scenario": scenario, "target": target, "expected": expected}
        not_run = _not_run(records)
        if not_run:
            row.update(verdict=not_run[0], reason=not_run[1], checks=[])
        else:
            results = C.check_saved(path)
            row.update(verdict=C.verdict(results), reason="", checks=[r.to_dict() for r in results])
        row["outcome"] = outcome_of(row["verdict"], expected)
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
    rows = recheck(run_dir)
    if not rows:
        raise UsageError(f"{run_dir}: no journals (*/*/journal.jsonl) in this folder")
    for row in rows:
        same = saved.get((row["scenario"], row["target"]))
        if args.json:
            print(json.dumps({**row, "saved_verdict": same}))
            continue
        note = "" if same is None else (" (same as saved)" if same == row["verdict"] else f" (saved: {same})")
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
