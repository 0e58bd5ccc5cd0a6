"""``pdchaos list PATH...``: one line per scenario: name, family, expected verdict per target, faults.
``pdchaos list --families``: the families installed, with their targets."""

from __future__ import annotations

import argparse

from ..schema import load_all


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", metavar="PATH")
    p.add_argument("--families", action="store_true", help="list the installed families and their targets")


def run(args: argparse.Namespace) -> int:
    if args.families or not args.paths:
        from ..family import all_families

        for fam in all_families():
            profiles = fam.profile_names()
            print(f"{fam.name:12s} targets: {', '.join(fam.targets):24s} {fam.description}"
                  + (f" (launch profiles: {', '.join(profiles)})" if profiles else ""))
        return 0
    for s in load_all(args.paths):
        m = s.model
        faults = ", ".join(f"{f.type}@{f.at:g}s+{f.for_:g}s" for f in s.faults) or "no faults"
        expect = " ".join(f"{t}={m.expected(t)}" for t in m.targets)
        print(f"{m.name:40s} {m.family:8s} {expect:34s} {faults}")
    return 0
