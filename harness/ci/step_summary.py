"""A run's report into the job summary: ``python3 -m harness.ci.step_summary --runs-dir DIR [--title T]``.

Finds the run folder(s) under ``--runs-dir`` (each with a ``summary.json``; newest last), appends
each ``summary.md`` to ``$GITHUB_STEP_SUMMARY`` (cut under GitHub's 1 MiB), and sets the step outputs
``run_dir`` (the newest), ``as_expected``, ``deviations``, ``skipped``, ``errors`` (summed over
the folders). With no run folder it says so in the summary and sets ``run_dir`` empty: the run
step failed before it wrote one, and its own log says why. Exit 0 unless ``--fail-on-deviation``
and a run was not as expected (a deviation or an error) — 1 then.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .gha import add_summary, set_output


def run_dirs(runs_dir: Path) -> list[Path]:
    if not runs_dir.is_dir():
        return []
    return sorted((p for p in runs_dir.iterdir() if (p / "summary.json").is_file()), key=lambda p: p.name)


def counts(run_dir: Path) -> dict[str, int]:
    doc = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    out = {"as_expected": 0, "deviations": 0, "skipped": 0, "errors": 0}
    for r in doc.get("results", []):
        v = r.get("verdict")
        if v == "skipped":
            out["skipped"] += 1
        elif v == "error":
            out["errors"] += 1
        elif r.get("as_expected") is True:
            out["as_expected"] += 1
        else:
            out["deviations"] += 1
    return out


def not_run_note(run_dir: Path) -> str:
    """The runs the launch profile left out (``not_run.json``, written by ``pdchaos run``): their
    number, then one line each (scenario, target, why), under a fold."""
    try:
        items = json.loads((run_dir / "not_run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    if not isinstance(items, list) or not items:
        return ""
    lines = "\n".join(f"- `{i.get('scenario')}` [{i.get('target')}]: {i.get('why')}" for i in items[:200]
                      if isinstance(i, dict))
    return (f"; {len(items)} not run under the launch profile\n\n<details><summary>not run</summary>\n\n"
            f"{lines}\n\n</details>")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m harness.ci.step_summary", description=__doc__.splitlines()[0])
    p.add_argument("--runs-dir", required=True)
    p.add_argument("--title", default="pd-chaos")
    p.add_argument("--fail-on-deviation", action="store_true")
    args = p.parse_args(argv)
    dirs = run_dirs(Path(args.runs_dir))
    total = {"as_expected": 0, "deviations": 0, "skipped": 0, "errors": 0}
    if not dirs:
        add_summary(f"## {args.title}\n\nNo run folder in `{args.runs_dir}`: the run stopped before writing one "
                    "(see the run step's log).\n")
    for d in dirs:
        c = counts(d)
        for k in total:
            total[k] += c[k]
        md = d / "summary.md"
        body = md.read_text(encoding="utf-8") if md.is_file() else "_(no summary.md: the run used --no-report)_\n"
        add_summary(f"## {args.title}: `{d.name}`\n\n{c['as_expected']} as expected, {c['deviations']} "
                    f"deviation(s), {c['errors']} error(s), {c['skipped']} skipped{not_run_note(d)}\n\n{body}")
    set_output("run_dir", str(dirs[-1]) if dirs else "")
    for k, v in total.items():
        set_output(k, v)
    print(f"{args.title}: {len(dirs)} run folder(s); " + ", ".join(f"{k} {v}" for k, v in total.items()))
    return 1 if args.fail_on_deviation and (total["deviations"] or total["errors"]) else 0


if __name__ == "__main__":
    sys.exit(main())
