"""``pdchaos check RUN_DIR``: re-run the checks of a saved run offline, from its journals alone.

Prints each scenario/target's verdict and whether it equals the one saved at run time; exit 0
when every verdict is as the scenario expected, 1 otherwise, 2 when RUN_DIR is not a run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import checks as C
from .errors import UsageError
from . import journal as J
from .journal import iter_runs, meta


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--json", action="store_true", help="one JSON object per scenario/target")


def recheck(run_dir: Path) -> list[dict]:
    out = []
    for scenario, target, path in iter_runs(run_dir):
        m = meta(J.read_journal(path))
        if m.get("skipped"):
            out.append({"scenario": scenario, "target": target, "verdict": "skipped", "expected": m.get("expect"),
                        "checks": []})
            continue
        results = C.check_saved(path)
        out.append({"scenario": scenario, "target": target, "verdict": C.verdict(results),
                    "expected": m.get("expect", "pass"), "checks": [r.to_dict() for r in results]})
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
    deviations = 0
    for row in rows:
        same = saved.get((row["scenario"], row["target"]))
        ok = row["verdict"] == "skipped" or row["verdict"] in str(row["expected"]).split("|")
        deviations += not ok
        if args.json:
            print(json.dumps({**row, "saved_verdict": same}))
            continue
        note = "" if same is None else (" (same as saved)" if same == row["verdict"] else f" (saved: {same})")
        print(f"{row['scenario']} [{row['target']}] {row['verdict']}, expected {row['expected']}"
              f"{'' if ok else ' DEVIATION'}{note}")
        for c in row["checks"]:
            if c["ok"] is False:
                print(f"    {c['name']}: {c['message']}")
    return 1 if deviations else 0
