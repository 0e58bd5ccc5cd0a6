"""``pdchaos compare RUN_A RUN_B``: latency, fail-open and stall counts per scenario and target, B vs A.

The output puts verdict changes per scenario first, then the latency table, then the normal-path
benchmark B vs A with the noise floor measured in the same runs (reports/compare.py).

Exit 0 when no ``--fail-above`` threshold is exceeded, 1 when one is (a regression of B over A, as
pytest-benchmark's ``--benchmark-compare-fail``), 2 on bad input (a missing run folder, a bad spec).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_a", metavar="RUN_A", help="baseline run folder (e.g. main)")
    p.add_argument("run_b", metavar="RUN_B", help="candidate run folder (e.g. the PR)")
    p.add_argument("--fail-above", action="append", default=[], metavar="METRIC:LIMIT",
                   help="exit 1 if B exceeds A by more than LIMIT for any scenario/target: PERCENT%% "
                        "(p99:10%%) or an absolute amount in the metric's unit (max:50 ms, stalls:0); "
                        "metrics p50, p99, max, fail_open, stalls; repeatable")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON instead of a table")
    p.add_argument("--json-out", metavar="PATH", help="also write the comparison as JSON to PATH")
    p.add_argument("--markdown", metavar="PATH",
                   help="also write the comparison as Markdown to PATH (a pull-request comment, under 60 KB)")


def run(args: argparse.Namespace) -> int:
    from reports.compare import (bench_rows, compare_runs, fmt_value, format_markdown, format_table, json_safe,
                                 noise_floor, parse_threshold, regressions, verdict_changes)
    from reports.load import load_run

    thresholds = [parse_threshold(s) for s in args.fail_above]  # bad spec: UsageError before any work
    a = load_run(args.run_a)
    b = load_run(args.run_b)
    rows = compare_runs(a, b)
    regs = regressions(rows, thresholds)
    changes = verdict_changes(rows)
    floor = noise_floor(a, b)
    bench = bench_rows(a, b)
    doc = json_safe({"a": str(a.path), "b": str(b.path), "run_id_a": a.run_id, "run_id_b": b.run_id,
                     "thresholds": [t.spec for t in thresholds], "verdict_changes": changes, "rows": rows,
                     "regressions": regs, "noise_floor": floor, "bench": bench})
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    if args.markdown:
        Path(args.markdown).write_text(format_markdown(doc), encoding="utf-8")
    if args.json:
        print(json.dumps(doc, indent=2, ensure_ascii=False))
    else:
        print(format_table(rows, regs, f"{a.path} ({a.run_id})", f"{b.path} ({b.run_id})", changes=changes,
                           floor=floor, bench=bench))
        if thresholds:
            print()
            if regs:
                for r in regs:
                    th = next(t for t in thresholds if t.spec == r["threshold"])
                    print(f"REGRESSION {r['scenario']}/{r['target']} {r['metric']}: {fmt_value(th.metric, r['a'])} -> "
                          f"{fmt_value(th.metric, r['b'])}, over the limit {fmt_value(th.metric, r['limit'])} "
                          f"(--fail-above {th.spec})")
            else:
                print("no regression over " + ", ".join(t.spec for t in thresholds))
    return 1 if regs else 0
