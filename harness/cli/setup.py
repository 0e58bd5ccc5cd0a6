"""``pdchaos setup [--family NAME ...] [--all] [--dry-run] [--only STEP ...]``: install what the
scenarios need.

By default what the README's main job needs: the core steps and the families that set up by
default (``Family.setup_default``: the P/D family's node stack and tiny model). Another family's
stack when asked for (``--family layerwise``), or every family's (``--all``: what CI runs). A run
whose family's stack is missing stops before anything starts and names the command.

Idempotent: each step checks first and installs only what is missing, so a second run only reports
``already present`` per step; every step's line ends with its time. Steps (harness/setup.py):
toxiproxy-server v2.12.0 (built with Go), iptables and iproute2 (apt-get, as root), then the
families' ``setup_steps()``.
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
    p.add_argument("--family", action="append", default=[], metavar="NAME",
                   help="also this family's steps (repeatable; `pdchaos list` names the families)")
    p.add_argument("--all", action="store_true", help="every family's steps (what CI needs)")


def run(args: argparse.Namespace) -> int:
    from ..setup import all_steps, run_setup

    if args.only and (args.family or args.all):
        raise UsageError("--only picks steps by name: leave out --family and --all")
    if args.only:  # a step of any family, by name
        steps, problems = all_steps()
        names = [s.name for s in steps]
        unknown = [n for n in args.only if n not in names]
        if unknown:
            raise UsageError(f"--only: unknown step {unknown[0]!r}; known: {', '.join(names)}")
        steps = [s for s in steps if s.name in args.only]
    else:
        steps, problems = all_steps(args.family, every=args.all)
    return run_setup(steps, dry_run=args.dry_run, problems=problems)
