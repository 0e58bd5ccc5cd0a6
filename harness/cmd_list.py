"""``pdchaos list PATH...``: one line per scenario: name, targets, faults, expected verdicts."""

from __future__ import annotations

import argparse

from .schema import load_all


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH")


def run(args: argparse.Namespace) -> int:
    for s in load_all(args.paths):
        m = s.model
        faults = ", ".join(f"{f.type}@{f.at:g}s+{f.for_:g}s" for f in s.faults) or "no faults"
        expect = " ".join(f"{t}={m.expected(t)}" for t in m.targets)
        print(f"{m.name:40s} {m.topology.transport}/{m.topology.link:10s} {expect:30s} {faults}")
    return 0
