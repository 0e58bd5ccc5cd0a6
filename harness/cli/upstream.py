"""``pdchaos upstream check [--project NAME] [--series VERSION] [--diff NN] [--no-own]``: prove the upstream diffs.

For every upstream release a family names (harness/upstream.py), each diff's own tests must fail on the
code before it and pass with it, and upstream's own tests for every file the series changes must pass
with the whole series applied. Needs ``pdchaos setup --only upstream-tests-<project>`` (the sdist's tests
and pytest beside the node env).

Exit codes: 0 every diff proven and upstream's tests passed; 1 something not proven (one line each);
2 bad input or a missing set-up.
"""

from __future__ import annotations

import argparse
import time

from ..errors import UsageError


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    c = sub.add_parser("check", help="run each diff's tests before and after it, and upstream's own tests",
                       description="run each diff's tests before and after it, and upstream's own tests")
    c.add_argument("--project", action="append", default=[], metavar="NAME",
                   help="only this upstream project (vllm, vllm-ascend; repeatable)")
    c.add_argument("--series", action="append", default=[], metavar="VERSION",
                   help="only this series of a project (its folder under connector_patch/upstream/<project>/, "
                        "e.g. 0.23.0.post1 or main-182b75e; repeatable)")
    c.add_argument("--diff", action="append", default=[], metavar="NN",
                   help="only the diffs whose name starts with this (e.g. 12; repeatable)")
    c.add_argument("--no-own", action="store_true", help="leave out upstream's own tests (only the diffs' tests)")
    c.add_argument("--list", action="store_true", help="list the diffs and their headers, run nothing")
    c.add_argument("--jobs", type=int, default=2, metavar="N", help="pytest runs side by side (default 2)")
    c.add_argument("--pr-bodies", action="store_true",
                   help="write each proven diff's PR body beside it (NN-slug.pr.md), from its header and this run")
    r = sub.add_parser("pr", help="write a pull-request folder for a diff from a real run of its check",
                       description="prove one diff alone (its tests before and after it, on the pinned release with "
                                   "only what its Depends: names; ruff and tethering) and write its pull-request "
                                   "folder: change.diff (git's diff on the release's own files), PR.md (the "
                                   "release's template), commit-message.txt, test-output.txt")
    r.add_argument("--diff", action="append", default=[], metavar="PROJECT/NN", required=True,
                   help="e.g. vllm/33 or vllm-ascend/37 (repeatable)")
    r.add_argument("--out", default=None, metavar="DIR",
                   help="where the folders go (default connector_patch/upstream/prs/)")
    r.add_argument("--jobs", type=int, default=2, metavar="N", help="pytest runs side by side (default 2)")


def projects() -> list:
    from ..family import all_families

    seen: dict[tuple[str, str], object] = {}
    for fam in all_families():
        for p in fam.upstream_projects() or []:
            seen.setdefault((p.project, p.version), p)
    return list(seen.values())


def run(args: argparse.Namespace) -> int:
    if args.action == "pr":
        return run_pr(args)
    from ..upstream import check, line_for

    found = projects()
    names = sorted({p.project for p in found})
    unknown = [n for n in args.project if n not in names]
    if unknown:
        raise UsageError(f"--project {unknown[0]!r}: no family runs it; projects: {', '.join(names)}")
    chosen = [p for p in found if not args.project or p.project in args.project]
    versions = sorted({p.version for p in chosen})
    unknown = [v for v in args.series if v not in versions]
    if unknown:
        raise UsageError(f"--series {unknown[0]!r}: no such series; series: {', '.join(versions)}")
    chosen = [p for p in chosen if not args.series or p.version in args.series]
    if not 1 <= args.jobs <= 16:
        raise UsageError(f"--jobs {args.jobs}: between 1 and 16")
    for d in args.diff:
        if not d or not d.replace("-", "").isalnum():
            raise UsageError(f"--diff {d!r}: give the start of a diff's name, e.g. 12")
    if args.list:
        for p in chosen:
            print(f"{p.label}:")
            for d in p.series():
                print(f"  {d.name}: {d.header.get('Subject', '')}")
                print(f"      guarantee: {d.header.get('Guarantee', '')}")
                print(f"      depends: {d.header.get('Depends', '- (missing)')}")
                print(f"      files: {', '.join(f.path for f in d.files)}")
        return 0
    for p in chosen:
        if not p.ready():
            step = f"upstream-tests-{p.project}" + ("-main" if p.version.startswith("main-") else "")
            raise UsageError(f"{p.label}: upstream's tests are not set up: run `pdchaos setup --only {step}`")
    problems: list[str] = []
    t0 = time.monotonic()
    for p in chosen:
        print(f"{p.label}: {len(p.series())} diffs", flush=True)
        results, own, probs = check(p, out=lambda s: print(s, flush=True), only=args.diff or None,
                                    own=not args.no_own, jobs=args.jobs)
        problems += probs
        if args.pr_bodies:
            from ..upstream_pr import write_pr_bodies

            written = write_pr_bodies(p, results)
            print(f"{p.label}: {len(written)} PR bodies written beside the diffs", flush=True)
    print(f"upstream check: {len(problems)} problem(s) in {time.monotonic() - t0:.0f} s")
    for line in problems:
        print(f"  {line}")
    return 1 if problems else 0


PR_ROOT = "connector_patch/upstream/prs"


def run_pr(args: argparse.Namespace) -> int:
    """``pdchaos upstream pr --diff vllm/33``: each named diff checked alone, then its folder written."""
    from pathlib import Path

    import tempfile

    from ..upstream import check, fetch_sdist, own_test_files, own_tests
    from ..upstream_gates import closure
    from ..upstream_pr import folder_problems, write_pr_folder

    repo = Path(__file__).resolve().parents[2]
    out_root = Path(args.out) if args.out else repo / PR_ROOT
    by_name = {p.project: p for p in projects()}
    wanted: list[tuple[object, str]] = []
    for spec in args.diff:
        project, _, num = spec.partition("/")
        if project not in by_name or not (len(num) == 2 and num.isdigit()):
            raise UsageError(f"--diff {spec!r}: give PROJECT/NN, e.g. vllm/33; projects: {', '.join(sorted(by_name))}")
        wanted.append((by_name[project], num))
    if not 1 <= args.jobs <= 16:
        raise UsageError(f"--jobs {args.jobs}: between 1 and 16")
    for p, num in wanted:
        if not any(d.name.startswith(num + "-") for d in p.series()):
            raise UsageError(f"--diff {p.project}/{num}: no such diff in {p.label}")
        if not p.ready():
            raise UsageError(f"{p.label}: upstream's tests are not set up: run `pdchaos setup --only "
                             f"upstream-tests-{p.project}`")
    bad = 0
    for p, num in wanted:
        print(f"{p.label}: {num}", flush=True)
        results, _, probs = check(p, out=lambda s: print(s, flush=True), only=[num + "-"], own=False, jobs=args.jobs)
        r = results[0] if results else None
        if r is None or not r.ok:
            bad += 1
            for line in probs:
                print(f"  {line}")
            print(f"  {p.project}/{num}: not proven, no folder written")
            continue
        d = next(d for d in p.series() if d.name == r.name)
        # upstream's own tests of the files it changes, on the release with it (and its Depends:) against
        # the release alone: what a reviewer asks next
        needed, _ = closure(d, p.series())
        files = own_test_files(p, [*(needed or []), d])
        own = None
        if files:
            print(f"  upstream's own tests of the changed files ({len(files)} files), with it and without ...", flush=True)
            with tempfile.TemporaryDirectory(prefix="pdchaos-pr-own-") as tmp:
                own, own_probs = own_tests(p, [*(needed or []), d], files, Path(tmp), args.jobs)
            print(f"  upstream's own tests: {own.counts()} in {own.seconds:.0f} s", flush=True)
            if own_probs:
                bad += 1
                for line in own_probs:
                    print(f"  {line}")
                print(f"  {p.project}/{num}: breaks upstream's own tests, no folder written")
                continue
        when = time.strftime("%Y-%m-%d", time.gmtime())
        folder = write_pr_folder(p, d, r, out_root, fetch_sdist(p), when, own=own, own_files=files)
        left = folder_problems(folder, p, own_names())
        print(f"  wrote {folder.relative_to(out_root.parent) if folder.is_relative_to(out_root.parent) else folder}"
              + (": " + "; ".join(left) if left else ""))
        bad += bool(left)
    return 1 if bad else 0


def own_names() -> tuple[str, ...]:
    """This project's scenario names (a PR folder must name none of them)."""
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    names = set()
    for f in (repo / "scenarios").rglob("*.yaml"):
        m = re.search(r"^name:\s*['\"]?([\w.-]+)", f.read_text(encoding="utf-8", errors="replace"), re.M)
        # a name its suite prefixes, or of three words or more; the bare short ones (baseline, server-down)
        # are plain words too
        if m and (m.group(1) != f.stem or m.group(1).count("-") >= 2):
            names.add(m.group(1))
    return tuple(sorted(names))
