"""What a CI log needs to explain a deviation when the run folder stays on the CI machine:
``python3 -m harness.ci.deviation_notes RUN_DIR [--max-lines N]``.

For every scenario run of the folder that is not as expected (a deviation or an error) it prints
the ops that did not succeed (id, outcome, the error's type and phase as the client learnt them,
when each was invoked and how long it took, relative to the run's start) and, per log of that run
(``harness.checks.run_logs``: the nodes' logs, the servers' own, a warm server's pooled log), how
many ERROR / Traceback lines it holds from the run's start on, and the first few of them cut to
200 characters. The ops' texts, prompts and token digests are never printed; a log line is printed
as the server wrote it (vLLM's error lines name request ids and exception types, not prompts).
Exit 0 always: it only explains, the run's own exit code is the verdict.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import datetime
from pathlib import Path

from ..checks import run_logs

_STAMP = re.compile(r"\b(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)\b")  # vLLM's "MM-DD hh:mm:ss"
_ERROR = re.compile(r"\bERROR\b|Traceback \(most recent call last\)|\bCRITICAL\b")


def _records(journal: Path) -> list[dict]:
    out = []
    for line in journal.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict):
            out.append(r)
    return out


def _since(line: str, start: datetime | None) -> bool:
    """Whether a log line was written at or after the run's start (a line without vLLM's stamp: yes)."""
    m = _STAMP.search(line)
    if start is None or m is None:
        return True
    mo, d, h, mi, s = (int(x) for x in m.groups())
    try:
        t = start.replace(month=mo, day=d, hour=h, minute=mi, second=s, microsecond=0)
    except ValueError:
        return True
    return t >= start.replace(microsecond=0)


def notes(run_dir: Path, max_lines: int = 6) -> list[str]:
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    out: list[str] = []
    for res in summary.get("results", []):
        if res.get("as_expected") is True or res.get("verdict") == "skipped":
            continue
        jp = run_dir / str(res.get("dir", "")) / "journal.jsonl"
        out.append(f"-- {res.get('scenario')} [{res.get('target')}]: {res.get('verdict')} "
                   f"(expected {res.get('expected')})")
        if not jp.is_file():
            out.append("   no journal")
            continue
        recs = _records(jp)
        meta = next((r for r in recs if r.get("type") == "meta"), {})
        invokes = {r.get("id"): r for r in recs if r.get("type") == "op" and r.get("phase") == "invoke"}
        t0 = min((r["t"] for r in invokes.values() if isinstance(r.get("t"), (int, float))), default=0.0)
        for r in recs:
            if r.get("type") != "op" or r.get("phase") in ("invoke", "ok"):
                continue
            inv = invokes.get(r.get("id"), {})
            ti = inv.get("t")
            when = f"invoked at {ti - t0:.2f} s" if isinstance(ti, (int, float)) else "invoke not recorded"
            out.append(f"   op {r.get('id')}: {r.get('phase')} {r.get('outcome')} type={r.get('code') or '-'} "
                       f"phase={r.get('error_phase') or '-'} {when}, took {r.get('elapsed_ms')} ms")
        for r in recs:
            if r.get("type") == "fault":
                t = r.get("t")
                out.append(f"   fault {r.get('id')} {r.get('name')} {r.get('phase')} at "
                           + (f"{t - t0:.2f} s" if isinstance(t, (int, float)) else "?"))
        try:
            start = datetime.fromisoformat(str(meta.get("wall_start")))
        except ValueError:
            start = None
        for name, text in sorted(run_logs(jp, recs).items()):
            errors = [ln for ln in text.splitlines() if _ERROR.search(ln) and _since(ln, start)]
            out.append(f"   log {name}: {len(errors)} error lines since the run's start")
            out.extend(f"     {ln[:200]}" for ln in errors[:max_lines])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m harness.ci.deviation_notes", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--max-lines", type=int, default=6)
    a = ap.parse_args(argv)
    if not (a.run_dir / "summary.json").is_file():
        print(f"deviation notes: no summary.json in {a.run_dir}", file=sys.stderr)
        return 0
    for line in notes(a.run_dir, a.max_lines):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
