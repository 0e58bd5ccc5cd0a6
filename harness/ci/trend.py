"""The bench trend file: ``python3 -m harness.ci.trend --bench RUN/bench.json --data DIR/data.js ...``.

Appends one entry (this commit's figures from a run's ``bench.json``, github-action-benchmark's
``customSmallerIsBetter`` input) to a trend file in github-action-benchmark's own ``data.js`` layout
(``window.BENCHMARK_DATA = {"lastUpdate", "repoUrl", "entries": {NAME: [{"commit", "date", "tool",
"benches"}...]}}``), so its charts page reads it as is. Keeps the last ``--max-items`` entries;
an entry for the same commit replaces the older one. The workflow keeps the file between runs
on a data branch (.github/scripts/trend_push.sh). Exit 2 when bench.json is missing or not a list.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

PREFIX = "window.BENCHMARK_DATA = "


def read(path: Path) -> dict:
    if not path.is_file():
        return {"lastUpdate": 0, "repoUrl": "", "entries": {}}
    text = path.read_text(encoding="utf-8").strip()
    if text.startswith(PREFIX):
        text = text[len(PREFIX):]
    doc = json.loads(text.rstrip(";"))
    doc.setdefault("entries", {})
    return doc


def append(doc: dict, name: str, benches: list[dict], *, commit: str, repo_url: str, now_ms: int,
           max_items: int) -> dict:
    entry = {"commit": {"id": commit, "url": f"{repo_url}/commit/{commit}" if repo_url else "",
                        "message": "", "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now_ms / 1000))},
             "date": now_ms, "tool": "customSmallerIsBetter", "benches": benches}
    items = [e for e in doc["entries"].get(name, []) if e.get("commit", {}).get("id") != commit]
    items.append(entry)
    doc["entries"][name] = items[-max_items:]
    doc["lastUpdate"] = now_ms
    if repo_url:
        doc["repoUrl"] = repo_url
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m harness.ci.trend", description=__doc__.splitlines()[0])
    p.add_argument("--bench", required=True, help="a run's bench.json")
    p.add_argument("--data", required=True, help="the trend file (data.js), created if missing")
    p.add_argument("--name", default="pd-chaos nightly")
    p.add_argument("--commit", required=True)
    p.add_argument("--repo-url", default="")
    p.add_argument("--max-items", type=int, default=200)
    p.add_argument("--now-ms", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        benches = json.loads(Path(args.bench).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"error: {args.bench}: {exc}", file=sys.stderr)
        return 2
    if not isinstance(benches, list):
        print(f"error: {args.bench}: expected a list of {{name, unit, value}}", file=sys.stderr)
        return 2
    data = Path(args.data)
    doc = append(read(data), args.name, benches, commit=args.commit, repo_url=args.repo_url,
                 now_ms=args.now_ms if args.now_ms is not None else int(time.time() * 1000),
                 max_items=args.max_items)
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text(PREFIX + json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"trend: {len(doc['entries'][args.name])} entries of {args.name!r} in {data} ({len(benches)} figures)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
