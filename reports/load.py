"""Read a run folder (summary.json + journals) and a bench samples file into plain data.

Everything the reports show comes from here, so ``pdchaos report RUN_DIR`` on a saved run
rebuilds exactly what the runner wrote at the end of the run.

Which targets a scenario has, in which order, and which one is the "before" (the baseline) come
from the scenario itself: the ``targets`` and ``baseline_target`` of a summary.json result or of
the journal's meta line; for a run folder older than both, the targets in their run order and no
baseline (a report never imports a family). Tables list a scenario's targets in its order; plots put
the baseline first ("before") and pair every other target ("after") with it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness import verdicts as V
from typing import Any

from nodekit import journal as J
from harness.errors import UsageError

from . import data as D
from . import gauges as G
from . import timeline as T

BENCH_FILE = "bench_samples.json"
MORE_BENCH_GLOB = "bench_samples-*.json"


@dataclass(frozen=True)
class Layout:
    """A scenario's targets (its order: the tables' order) and its baseline ("before"), if any."""
    targets: tuple[str, ...]
    baseline: str | None = None

    @property
    def pairs(self) -> list[tuple[str, str]]:
        """(after, before) for every target but the baseline; none without a baseline."""
        if self.baseline not in self.targets:
            return []
        return [(t, self.baseline) for t in self.targets if t != self.baseline]


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
    gauges: G.NodeGauges | None = None  # node gauges over time: the family's, from sample probes
    incident: T.Incident | None = None  # the incident timeline (reports/timeline.py)

    @property
    def outcome(self) -> str | None:
        """as_expected | deviation | skipped | error (harness/outputs.py), or None: no verdict."""
        if self.verdict in ("skipped", "error"):
            return self.verdict
        if self.as_expected is None:
            return None
        return "as_expected" if self.as_expected else "deviation"


@dataclass
class Run:
    path: Path
    run_id: str
    started: str
    elapsed_s: float | None
    results: list[Result]
    has_summary: bool
    bench: dict[str, list[float]] | None = None
    bench_about: dict[str, str] = field(default_factory=dict)  # the samples file's family and op
    more_benches: list[tuple[dict[str, str], dict[str, list[float]]]] = field(default_factory=list)
    """Further families' samples (``bench_samples-<family>.json``: ``pdchaos run --bench`` over
    several families writes one file each), as (about, samples)."""

    def bench_views(self) -> list["Run"]:
        """One view of this run per samples file, each with that file as its ``bench`` (the
        first file first): what the reports show per benchmark."""
        if not self.bench:
            return []
        return [self] + [replace(self, bench=samples, bench_about=about, more_benches=[])
                         for about, samples in self.more_benches]

    def bench_words(self) -> tuple[str, str]:
        """(the command that measured the normal path, what one sample is) for titles: from the
        samples file (``family``, ``op``); generic words when it does not say."""
        fam = self.bench_about.get("family")
        return (f"pdchaos bench {fam}" if fam else "pdchaos bench"), self.bench_about.get("op") or "op"
    layouts: dict[str, Layout] = field(default_factory=dict)

    def scenarios(self) -> list[str]:
        seen: dict[str, None] = {}
        for r in self.results:
            seen.setdefault(r.scenario, None)
        return list(seen)

    def get(self, scenario: str, target: str) -> Result | None:
        return next((r for r in self.results if r.scenario == scenario and r.target == target), None)

    def layout(self, scenario: str) -> Layout:
        present = tuple(r.target for r in self.results if r.scenario == scenario)
        lay = self.layouts.get(scenario) or Layout(present)
        extra = tuple(t for t in present if t not in lay.targets)
        return Layout(lay.targets + extra, lay.baseline) if extra else lay

    def targets(self, scenario: str) -> list[str]:
        """The scenario's targets that are in this run, in the scenario's order (the tables')."""
        present = {r.target for r in self.results if r.scenario == scenario}
        return [t for t in self.layout(scenario).targets if t in present]

    def plot_targets(self, scenario: str) -> list[str]:
        """As :meth:`targets`, the baseline (before) first."""
        b = self.layout(scenario).baseline
        ts = self.targets(scenario)
        return sorted(ts, key=lambda t: t != b)

    def baseline(self) -> str | None:
        """The baseline shared by every scenario of the run, or None (none, or several)."""
        found = {self.layout(s).baseline for s in self.scenarios()}
        return found.pop() if len(found) == 1 else None


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


def _as_expected(r: dict) -> bool | None:
    """From a summary.json result: its ``outcome``, else ``as_expected``, else verdict vs expected."""
    if r.get("outcome") in ("as_expected", "deviation", "skipped", "error"):
        return r["outcome"] == "as_expected"
    if isinstance(r.get("as_expected"), bool):
        return r["as_expected"] and r.get("verdict") not in ("skipped", "error")
    if r.get("verdict") and r.get("expected"):
        return V.outcome(str(r["verdict"]), str(r["expected"]), r.get("failing")) == "as_expected"
    return None


def _layout_of(d: dict) -> Layout | None:
    """From a summary.json result or a meta line: ``targets`` (a list of names) and ``baseline_target``."""
    ts = d.get("targets")
    if not isinstance(ts, list) or not ts or not all(isinstance(t, str) and t for t in ts):
        return None
    b = d.get("baseline_target")
    return Layout(tuple(ts), b if b in ts else None)


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
    saved_layouts: dict[str, Layout] = {}
    for i, r in enumerate(doc.get("results", [])):
        if not isinstance(r, dict) or not r.get("scenario") or not r.get("target"):
            raise UsageError(f"{summary_path}: results[{i}]: expected an object with \"scenario\" and \"target\"")
        checks = r.get("checks") if isinstance(r.get("checks"), list) else []
        results.append(Result(scenario=str(r["scenario"]), target=str(r["target"]),
                              dir=_str(r.get("dir")) or f"{r['scenario']}/{r['target']}",
                              verdict=_str(r.get("verdict")) or "unknown", expected=_str(r.get("expected")),
                              as_expected=_as_expected(r), reason=_str(r.get("reason")),
                              file=_str(r.get("file")), checks=[c for c in checks if isinstance(c, dict)]))
        lay = _layout_of(r)
        if lay is not None:
            saved_layouts.setdefault(str(r["scenario"]), lay)
    # Journals the summary does not list (a crashed runner): shown with verdict "unknown".
    listed = {(r.scenario, r.target) for r in results}
    for (s, t) in sorted(journals):
        if (s, t) not in listed:
            results.append(Result(scenario=s, target=t, dir=f"{s}/{t}"))
    layouts: dict[str, Layout] = dict(saved_layouts)
    for r in results:
        jp = root / r.dir / "journal.jsonl"
        if jp.is_file():
            records = J.read_journal(jp)
            tl = D.timeline(records, r.scenario, r.target)
            r.timeline, r.stats = tl, D.timeline_stats(tl)
            m = J.meta(records)
            r.gauges = G.node_gauges(records, G.meta_gauges(m), r.scenario, r.target, tl.t0)
            r.incident = T.incident_timeline(records)
            if r.scenario not in layouts:
                lay = _layout_of(m)
                if lay is not None:
                    layouts[r.scenario] = lay
    elapsed = doc.get("elapsed_s")
    run = Run(path=root, run_id=_str(doc.get("run_id")) or root.name, started=_str(doc.get("started")),
              elapsed_s=float(elapsed) if isinstance(elapsed, (int, float)) else None, results=results,
              has_summary=bool(doc), layouts=layouts)
    bench_path = Path(bench) if bench is not None else root / BENCH_FILE
    if bench is not None or bench_path.is_file():
        run.bench, run.bench_about = read_bench(bench_path)
        if bench is None:  # the other families' samples of a pdchaos run --bench, in name order
            more = map(read_bench, sorted(root.glob(MORE_BENCH_GLOB)))
            run.more_benches = [(about, samples) for samples, about in more]
    return run


def load_bench(path: str | Path) -> dict[str, list[float]]:
    """The samples of a normal-path benchmark samples file (see :func:`read_bench`)."""
    return read_bench(path)[0]


def read_bench(path: str | Path) -> tuple[dict[str, list[float]], dict[str, str]]:
    """(samples, about) of a normal-path benchmark samples file: ``{"hardened": [µs, ...], "legacy": [µs, ...]}``, the
    keys being targets (``pdchaos bench FAMILY --save``; ``family`` and ``op`` say what was measured). Every list of numbers is one target's
    samples; other keys (``unit``, ``n``, and lists of words such as ``kinds``) are ignored. At
    least one target's samples must be there. ``about``: the ``family`` and ``op`` it names, when
    it names them."""
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
    for target, v in doc.items():
        if not isinstance(v, list) or (v and all(isinstance(x, str) for x in v)):
            continue  # a scalar or a list of words: metadata
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
                   for x in v):
            raise UsageError(f"{p}: \"{target}\": expected a list of non-negative numbers (µs)")
        out[str(target)] = [float(x) for x in v]
    if not out:
        raise UsageError(f"{p}: no samples: expected a list of µs per target, "
                         f"e.g. {{\"hardened\": [µs, ...], \"legacy\": [µs, ...]}}")
    return out, {k: doc[k] for k in ("family", "op") if isinstance(doc.get(k), str)}
