"""``pdchaos list PATH...``: one line per scenario: name, family, expected verdict per target, faults.
``pdchaos list --families``: the families installed, with their targets.
``pdchaos list --runtimes``: where nodes can run (harness/runtime.py), with what each can do to a node."""

from __future__ import annotations

import argparse
import sys

from ..schema import load_all


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", metavar="PATH")
    p.add_argument("--families", action="store_true", help="list the installed families and their targets")
    p.add_argument("--runtimes", action="store_true", help="list the node runtimes and what each can do to a node")


def run(args: argparse.Namespace) -> int:
    if args.runtimes:
        from ..runtime import load_runtime, runtime_names

        for name in runtime_names():
            rt = load_runtime(name)
            doc = (getattr(sys.modules.get(type(rt).__module__), "__doc__", None) or "").strip()
            print(f"{name:8s} {doc.splitlines()[0] if doc else ''}\n         can: {', '.join(sorted(rt.provides))}")
        return 0
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
