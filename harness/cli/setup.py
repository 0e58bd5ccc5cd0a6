"""``pdchaos setup [--dry-run] [--only NAME ...]``: install what every installed family's scenarios need.

Idempotent: each step checks first and installs only what is missing, so a second run only reports
``already present`` per step. Steps (harness/setup.py): toxiproxy-server v2.12.0 (built with Go),
iptables and iproute2 (apt-get, as root), then every family's ``setup_steps()``.
``pdchaos doctor`` is the read-only report of the same machine.

Exit codes: 0 everything present at the end; 2 something could not be installed (one line each on
stderr: what, why, how to do it by hand) or bad input. ``--dry-run`` installs nothing: 0 complete,
1 incomplete.
"""

from __future__ import annotations

import argparse

from ..errors import UsageError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true", help="only report what would be done (exit 0 complete, 1 not)")
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="only this step (repeatable): toxiproxy-server, iptables, iproute2, or a family's step")


def run(args: argparse.Namespace) -> int:
    from ..setup import all_steps, run_setup

    steps, problems = all_steps()
    if args.only:
        names = [s.name for s in steps]
        unknown = [n for n in args.only if n not in names]
        if unknown:
            raise UsageError(f"--only: unknown step {unknown[0]!r}; known: {', '.join(names)}")
        steps = [s for s in steps if s.name in args.only]
    return run_setup(steps, dry_run=args.dry_run, problems=problems)
