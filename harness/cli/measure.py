"""``pdchaos measure [--cold] [--steps install,setup,quick,main,tests] [--no-write]``: measure what a new
user waits for, on this checkout (a fresh clone), and write the figures (harness/measure.py).

Exit codes: 0 measured and written; 1 a measured step failed (its figures are still written, with
its exit code); 2 bad input or a step that could not be measured (one line).
"""

from __future__ import annotations

import argparse
import json

from ..errors import UsageError

STEPS = ("install", "setup", "quick", "main", "tests")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", default=",".join(STEPS),
                   help=f"comma-separated, in this order: {', '.join(STEPS)} (default: all)")
    p.add_argument("--cold", action="store_true",
                   help="measure `pdchaos setup` in empty cache folders of its own (what a fresh machine downloads "
                        "and installs), then set up the usual cache")
    p.add_argument("--no-write", action="store_true", help="print the measurement, write nothing")


def run(args: argparse.Namespace) -> int:
    from ..measure import MeasureError, measure, write

    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = [s for s in steps if s not in STEPS]
    if unknown or not steps:
        raise UsageError(f"--steps: unknown step {unknown[0]!r}; known: {', '.join(STEPS)}" if unknown
                         else "--steps: name at least one step")
    if list(steps) != list(STEPS) and not args.no_write:
        raise UsageError("--steps: a measurement of some steps only is printed, not written (--no-write): the "
                         "README's figures come from one whole measurement")
    try:
        m = measure(steps, cold=args.cold)
    except MeasureError as exc:
        raise UsageError(f"measure: {exc}") from None
    print(json.dumps(m, indent=1, sort_keys=True))
    if not args.no_write:
        try:
            written = write(m)
        except MeasureError as exc:
            raise UsageError(f"measure: measured, but not written: {exc}") from None
        for path in written:
            print(f"wrote {path}")
    failed = [k for k in ("install_rc", "setup_rc") if m.get(k)] + [k for k in ("quick", "main", "tests")
                                                                      if isinstance(m.get(k), dict) and m[k].get("rc")]
    return 1 if failed else 0
