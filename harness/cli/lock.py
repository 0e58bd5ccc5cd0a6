"""``pdchaos lock [--family NAME ...] [--all] [--python 3.X ...]``: resolve the node stacks' lock files.

Each node stack that installs from a lock (its set-up step's ``lock_spec()``) gets one file per
Python version, resolved by ``uv pip compile --generate-hashes`` at the stack's fixed resolution date
(harness/nodeenv/lock.py) and committed beside its recipe; ``pdchaos setup`` then installs from it
and resolves nothing. Which stacks: as ``pdchaos setup`` picks them (default: what the README's main
job needs; ``--family``, ``--all``). Needs the package index (PyPI), not the packages themselves.

Exit codes: 0 every file written; 2 bad input or a resolution that failed (one line each).
"""

from __future__ import annotations

import argparse
import re
import time

from ..errors import UsageError

_VERSION = re.compile(r"^3\.\d{1,2}$")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--family", action="append", default=[], metavar="NAME",
                   help="also this family's stacks (repeatable; `pdchaos list` names the families)")
    p.add_argument("--all", action="store_true", help="every family's stacks")
    p.add_argument("--python", action="append", default=[], metavar="3.X",
                   help="only this Python version (repeatable; default: every version the stack lists)")


def run(args: argparse.Namespace) -> int:
    from ..nodeenv.lock import compile_lock, locked_pins
    from ..nodeenv.venv import NodeEnvError
    from ..setup import all_steps

    bad = [v for v in args.python if not _VERSION.match(v)]
    if bad:
        raise UsageError(f"--python {bad[0]!r}: give a version such as 3.11")
    steps, problems = all_steps(args.family, every=args.all)
    if problems:
        raise UsageError(problems[0])
    specs = [(s.name, spec) for s in steps if (spec := getattr(s, "lock_spec", lambda: None)()) is not None]
    if not specs:
        print("no selected node stack installs from a lock")
        return 0
    failed = 0
    for step_name, spec in specs:
        pythons = [v for v in spec.pythons if not args.python or v in args.python]
        missing = [v for v in args.python if v not in spec.pythons]
        if missing:
            raise UsageError(f"--python {missing[0]}: {step_name} is locked for {', '.join(spec.pythons)} only")
        print(f"{step_name}: {spec.name}, Python {', '.join(pythons)} (resolved at {spec.exclude_newer})")
        for v in pythons:
            t0 = time.monotonic()
            try:
                paths = compile_lock(spec, v)
            except NodeEnvError as exc:
                print(f"  Python {v}: failed: {exc}")
                failed += 1
                continue
            said = ", ".join(f"{len(locked_pins(p))} in {p}" for p in paths)
            print(f"  Python {v}: {said} [{time.monotonic() - t0:.1f} s]")
    return 2 if failed else 0
