"""Read a run folder (summary.json + journals) and a bench samples file into plain data.

Everything the reports show comes from here, so ``pdchaos report RUN_DIR`` on a saved run
rebuilds exactly what the runner wrote at the end of the run.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import journal as J
from harness.errors import UsageError

from . import data as D

TARGET_ORDER = ("legacy", "hardened")  # before, after: the plots' order
TABLE_ORDER = ("hardened", "legacy")   # the tables' order: the patch first
BENCH_FILE = "bench_samples.json"


@dataclass
class Result:
    scenario: str
    target: str
    dir: str
    verdict: str = "unknown"
    expected: str = ""
    as_expected: bool | None = None
    reason: str = ""
    file: str = ""
    checks: list[dict] = field(default_factory=list)
    timeline: D.Timeline | None = None
    stats: D.Stats | None = None


@dataclass
class Run:
    path: Path
    run_id: str
    started: str
    elapsed_s: float | None
    results: list[Result]
    has_summary: bool
    bench: dict[str, list[float]] | None = None

    def scenarios(self) -> list[str]:
        seen: dict[str, None] = {}
        for r in self.results:
            seen.setdefault(r.scenario, None)
        return list(seen)

    def get(self, scenario: str, target: str) -> Result | None:
        return next((r for r in self.results if r.scenario == scenario and r.target == target), None)

    def targets(self, scenario: str, order: tuple[str, ...] = TARGET_ORDER) -> list[str]:
        """The scenario's targets, legacy (before) then hardened (after) unless ``order`` says otherwise."""
        ts = [r.target for r in self.results if r.scenario == scenario]
        return sorted(ts, key=lambda t: (order.index(t) if t in order else len(order), t))


def _str(v: Any) -> str:
    return "" if v is None else str(v)


def _read_summary(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results", []), list):
        raise UsageError(f"{path}: expected an object with a \"results\" list")
    return doc


def load_run(run_dir: str | Path, *, bench: str | Path | None = None) -> Run:
    """The run in ``run_dir``: summary.json if present (verdicts), every journal (data).

    A folder with journals but no summary.json (a runner that crashed) still loads, with verdicts
    "unknown". A folder with neither is not a run folder: UsageError.
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise UsageError(f"{root}: not a run folder: no such directory")
    summary_path = root / "summary.json"
    journals = {(s, t): p for s, t, p in J.iter_runs(root)}
    if not summary_path.is_file() and not journals:
        raise UsageError(f"{root}: not a run folder: no summary.json and no <scenario>/<target>/journal.jsonl")
    doc = _read_summary(summary_path) if summary_path.is_file() else {}
    results: list[Result] = []
    for i, r in enumerate(doc.get("results", [])):
        if not isinstance(r, dict) or not r.get("scenario") or not r.get("target"):
            raise UsageError(f"{summary_path}: results[{i}]: expected an object with \"scenario\" and \"target\"")
        checks = r.get("checks") if isinstance(r.get("checks"), list) else []
        ae = r.get("as_expected")
        results.append(Result(scenario=str(r["scenario"]), target=str(r["target"]),
                              dir=_str(r.get("dir")) or f"{r['scenario']}/{r['target']}",
                              verdict=_str(r.get("verdict")) or "unknown", expected=_str(r.get("expected")),
                              as_expected=ae if isinstance(ae, bool) else None, reason=_str(r.get("reason")),
                              file=_str(r.get("file")), checks=[c for c in checks if isinstance(c, dict)]))
    # Journals the summary does not list (a crashed runner): shown with verdict "unknown".
    listed = {(r.scenario, r.target) for r in results}
    for (s, t) in sorted(journals):
        if (s, t) not in listed:
            results.append(Result(scenario=s, target=t, dir=f"{s}/{t}"))
    for r in results:
        jp = root / r.dir / "journal.jsonl"
        if jp.is_file():
            tl = D.timeline(J.read_journal(jp), r.scenario, r.target)
            r.timeline, r.stats = tl, D.timeline_stats(tl)
    elapsed = doc.get("elapsed_s")
    run = Run(path=root, run_id=_str(doc.get("run_id")) or root.name, started=_str(doc.get("started")),
              elapsed_s=float(elapsed) if isinstance(elapsed, (int, float)) else None, results=results,
              has_summary=bool(doc))
    bench_path = Path(bench) if bench is not None else root / BENCH_FILE
    if bench is not None or bench_path.is_file():
        run.bench = load_bench(bench_path)
    return run


def load_bench(path: str | Path) -> dict[str, list[float]]:
    """A normal-path benchmark samples file: ``{"hardened": [µs, ...], "legacy": [µs, ...]}``.
    Other keys are ignored; at least one of the two targets must be there."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{p}: bench samples file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{p}: cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{p}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{p}: expected an object {{\"hardened\": [µs, ...], \"legacy\": [µs, ...]}}")
    if doc.get("unit", "us") != "us":
        raise UsageError(f"{p}: \"unit\": expected \"us\" (microseconds), got {doc.get('unit')!r}")
    out: dict[str, list[float]] = {}
    for target in ("hardened", "legacy"):
        if target not in doc:
            continue
        v = doc[target]
        if not isinstance(v, list) or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0 for x in v):
            raise UsageError(f"{p}: \"{target}\": expected a list of non-negative numbers (µs)")
        out[target] = [float(x) for x in v]
    if not out:
        raise UsageError(f"{p}: neither \"hardened\" nor \"legacy\" samples found")
    return out
