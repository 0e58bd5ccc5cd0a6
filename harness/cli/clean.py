"""``pdchaos clean --profile NAME``: remove what runs under that launch profile's runtime left
behind (a run killed outright, before its own teardown: on a cluster, its namespace and objects,
found by the run label every object carries). Exit 0 when nothing is left, 1 when something could
not be removed (one line each), 2 on bad input.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", required=True, metavar="NAME|FILE",
                   help="the launch profile whose runtime's leftovers to remove (a cluster profile: `pdchaos list --families`)")


def run(args: argparse.Namespace) -> int:
    from .doctor import profile_runtimes

    removed, failed = [], []
    seen = set()
    for rt, profile in profile_runtimes(args.profile):
        if rt.name in seen:
            continue
        seen.add(rt.name)
        done, left = rt.clean(profile)
        removed += done
        failed += left
    for line in removed:
        print(f"removed: {line}")
    for line in failed:
        print(f"left: {line}")
    print(f"clean: {len(removed)} removed, {len(failed)} left" if removed or failed else "clean: nothing left behind")
    return 1 if failed else 0
