"""``pdchaos report RUN_DIR``: rebuild plots, summary.md, report.html and bench.json from a saved run."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..errors import UsageError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder (runs/<run_id>/ with summary.json and journals)")
    p.add_argument("--bench", metavar="PATH",
                   help="normal-path samples from `pdchaos bench FAMILY --save PATH` "
                        "(default: RUN_DIR/bench_samples.json if present)")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="render plots in N processes (default: the usable CPUs, at most 4)")


def run(args: argparse.Namespace) -> int:
    # reports.build, not the package's generate(): works even where an editable install made before
    # reports/__init__.py existed maps "reports" as a namespace package.
    from reports.build import generate

    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs: must be >= 1, got {args.jobs}")
    start = time.monotonic()
    written = generate(args.run_dir, bench=args.bench, jobs=args.jobs)
    root = Path(args.run_dir)
    pngs = [p for p in written if p.suffix == ".png"]
    for p in written:
        if p.suffix != ".png":
            print(p)
    print(f"{root / 'plots'}/: {len(pngs)} PNG(s)")
    print(f"report of {root} in {time.monotonic() - start:.1f} s")
    return 0
