"""``pdchaos validate PATH...``: every error in every file at once; exit 2 on any."""

from __future__ import annotations

import argparse

from ..schema import load_all


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH")


def run(args: argparse.Namespace) -> int:
    scenarios = load_all(args.paths)
    for s in scenarios:
        print(f"ok {s.path}: {s.name} ({len(s.faults)} faults, targets {', '.join(s.model.targets)})")
    return 0
