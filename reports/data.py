"""Pure functions from journal records to the data behind every plot and table.

Nothing here draws or touches the filesystem: tests check these numbers, plots only render them.

Outcome classes (one per op, from the merged op of ``nodekit.journal.ops``):

==============  ===============================================================================
``ok``          phase "ok": the call succeeded (its value may still be wrong; ``correct_hits``
                judges that, not the plots).
``fail-open``   phase "fail": the call failed and the client knew it: in the family's words
                (the meta line's ``failed_words``): e.g. a client that returned 0 (fail-open),
                a request that got an HTTP error (failed fast).
``error``       phase "info" with any outcome but "stalled": indeterminate, the call raised.
``stalled``     outcome "stalled": the call never returned (no completion record, or the runner
                wrote one with outcome "stalled" when it gave up).
==============  ===============================================================================

Times: ``x`` is ``t_invoke - t0`` in seconds (``t0`` = the meta line's workload start; the first
invoke if the meta line has none). Latency in ms is the op's ``elapsed_ms`` (measured by the
workload around the call) when present, else ``(t_complete - t_invoke) * 1000``. A stalled op has no
latency: it is drawn at the time the run gave up on it (its "stalled" record, else the journal's
``end`` record, else the last timestamp in the journal), so its latency is a LOWER BOUND.

Every op counts, whatever its ``f`` (lookup or reset); each Point keeps its ``f``.

Stalled ops count in the latency quantiles and stats with that lower bound (leaving them out would
make a target that hangs look fast); they are not "completed", so throughput leaves them out.

Quantiles use numpy's default (linear interpolation between order statistics).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from nodekit import journal as J

OUTCOME_CLASSES = ("ok", "fail-open", "error", "stalled")
QUANTILES = (("p50", 50.0), ("p95", 95.0), ("p99", 99.0))

# Bucket widths the time axis may use (seconds): round numbers a reader can take in at a glance.
_NICE_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0,
                 300.0, 600.0)


def classify(op: dict) -> str:
    """The outcome class of one merged op (see the module docstring)."""
    if op.get("outcome") == "stalled":
        return "stalled"
    phase = op.get("phase")
    if phase == "ok":
        return "ok"
    if phase == "fail":
        return "fail-open"
    return "error"


@dataclass(frozen=True)
class Point:
    id: int
    f: str
    x: float            # invoke time - t0, s
    latency_ms: float   # for "stalled": a lower bound (until the run gave up)
    cls: str            # one of OUTCOME_CLASSES
    x_complete: float | None  # completion time - t0, s (None for stalled)


@dataclass(frozen=True)
class Band:
    id: int
    name: str
    start: float        # s since t0
    stop: float
    open_ended: bool    # no stop record: the band runs to the journal's end
    params: dict = field(default_factory=dict)


@dataclass
class Timeline:
    """Everything the plots of one scenario/target need."""
    scenario: str
    target: str
    t0: float
    end: float                      # s since t0: when the journal ended
    deadline_ms: float | None
    tolerance_ms: float | None
    points: list[Point]
    bands: list[Band]
    failed_words: tuple[str, str] = ("failed", "failed (the client was told)")  # see failed_words()


GENERIC_FAILED_WORDS = ("failed", "failed (the client was told)")


def failed_words(records: list[dict]) -> tuple[str, str]:
    """What the family calls an op of class ``fail-open`` (its meta line's ``failed_words``:
    column word, legend), else the generic words (a journal from before they were written)."""
    w = J.meta(records).get("failed_words")
    if isinstance(w, list) and len(w) == 2 and all(isinstance(x, str) and x and len(x) <= 60 for x in w):
        return w[0], w[1]
    return GENERIC_FAILED_WORDS


def t0_of(records: list[dict]) -> float:
    m = J.meta(records)
    if isinstance(m.get("t0"), (int, float)):
        return float(m["t0"])
    invokes = [r["t"] for r in records if r.get("type") == "op" and r.get("phase") == "invoke" and "t" in r]
    if invokes:
        return float(min(invokes))
    return float(min((r["t"] for r in records if isinstance(r.get("t"), (int, float))), default=0.0))


def end_of(records: list[dict]) -> float:
    """Absolute monotonic time the journal ended: the ``end`` record, else the last timestamp."""
    ends = [r["t"] for r in records if r.get("type") == "end" and isinstance(r.get("t"), (int, float))]
    if ends:
        return float(max(ends))
    return float(max((r["t"] for r in records if isinstance(r.get("t"), (int, float))), default=0.0))


def latency_points(records: list[dict], t0: float | None = None) -> list[Point]:
    """One point per op (invoke order), see the module docstring for x, latency and class."""
    t0 = t0_of(records) if t0 is None else t0
    end = end_of(records)
    out = []
    for op in J.ops(records):
        if "t_invoke" not in op:  # a completion with no invoke line (torn journal): no x to plot
            continue
        cls = classify(op)
        ti = float(op["t_invoke"])
        tc = op.get("t_complete")
        if cls == "stalled":
            gave_up = float(tc) if isinstance(tc, (int, float)) else end
            lat = max(gave_up - ti, 0.0) * 1000.0
            xc = None
        else:
            el = op.get("elapsed_ms")
            if isinstance(el, (int, float)) and not isinstance(el, bool) and math.isfinite(el):
                lat = float(el)
            elif isinstance(tc, (int, float)):
                lat = (float(tc) - ti) * 1000.0
            else:
                lat = float("nan")
            xc = float(tc) - t0 if isinstance(tc, (int, float)) else None
        out.append(Point(id=op["id"], f=str(op.get("f", "")), x=ti - t0, latency_ms=lat, cls=cls,
                         x_complete=xc))
    return out


def fault_bands(records: list[dict], t0: float | None = None) -> list[Band]:
    """Fault windows relative to t0. A stop with no start begins at t0 (0 s)."""
    t0 = t0_of(records) if t0 is None else t0
    stopped = {r.get("id") for r in records if r.get("type") == "fault" and r.get("phase") == "stop"}
    out = []
    for w in J.fault_windows(records):
        start = w["start"] if w["start"] is not None else t0
        out.append(Band(id=w["id"], name=str(w["name"]), start=float(start) - t0, stop=float(w["stop"]) - t0,
                        open_ended=w["id"] not in stopped, params=dict(w.get("params") or {})))
    return out


def deadline(records: list[dict]) -> tuple[float | None, float | None]:
    """(deadline_ms, tolerance_ms) from the meta line; None when absent."""
    m = J.meta(records)
    d = m.get("deadline_ms")
    tol = m.get("tolerance_ms")
    return (float(d) if isinstance(d, (int, float)) else None,
            float(tol) if isinstance(tol, (int, float)) else None)


def timeline(records: list[dict], scenario: str = "", target: str = "") -> Timeline:
    m = J.meta(records)
    t0 = t0_of(records)
    points = latency_points(records, t0)
    d, tol = deadline(records)
    end = end_of(records) - t0
    # The plot must hold every op even if the journal's end came first (clock noise, torn file).
    end = max([end] + [p.x for p in points] + [p.x_complete for p in points if p.x_complete is not None])
    return Timeline(scenario=scenario or str(m.get("scenario", "")), target=target or str(m.get("target", "")),
                    t0=t0, end=max(end, 0.0), deadline_ms=d, tolerance_ms=tol, points=points,
                    bands=fault_bands(records, t0), failed_words=failed_words(records))


def nice_bucket(duration_s: float, target_buckets: int = 40) -> float:
    """The smallest round bucket width giving at most ``target_buckets`` buckets over the duration."""
    want = max(duration_s, 0.0) / max(target_buckets, 1)
    for b in _NICE_BUCKETS:
        if b >= want:
            return b
    return float(math.ceil(want / 600.0) * 600.0)


def _n_buckets(end: float, width: float) -> int:
    return max(1, int(math.ceil(end / width - 1e-9))) if end > 0 else 1


def _bucket_index(x: float, width: float, n: int) -> int:
    return min(max(int(math.floor(x / width)), 0), n - 1)


def quantile_buckets(points: Sequence[Point], width: float, end: float) -> dict[str, list]:
    """Latency quantiles per time bucket of invoke time: ``{"start": [s...], "width": w, "n": [...],
    "p50": [...], "p95": [...], "p99": [...], "max": [...]}``; an empty bucket has None values."""
    n = _n_buckets(end, width)
    lat: list[list[float]] = [[] for _ in range(n)]
    for p in points:
        if math.isfinite(p.latency_ms):
            lat[_bucket_index(p.x, width, n)].append(p.latency_ms)
    out: dict[str, list] = {"start": [round(i * width, 9) for i in range(n)], "width": width,
                            "n": [len(v) for v in lat]}
    for name, q in QUANTILES:
        out[name] = [float(np.percentile(v, q)) if v else None for v in lat]
    out["max"] = [max(v) if v else None for v in lat]
    return out


def throughput_buckets(points: Sequence[Point], width: float, end: float) -> dict[str, list]:
    """Completed ops per second per bucket of completion time, in total and per outcome class:
    ``{"start": [...], "width": w, "total": [...], "ok": [...], "fail-open": [...], "error": [...]}``.
    Stalled ops never completed and are not counted."""
    n = _n_buckets(end, width)
    counts = {c: [0] * n for c in ("ok", "fail-open", "error")}
    for p in points:
        if p.cls == "stalled" or p.x_complete is None:
            continue
        counts[p.cls][_bucket_index(p.x_complete, width, n)] += 1
    out: dict[str, list] = {"start": [round(i * width, 9) for i in range(n)], "width": width}
    for c, v in counts.items():
        out[c] = [k / width for k in v]
    out["total"] = [sum(counts[c][i] for c in counts) / width for i in range(n)]
    return out


@dataclass
class Stats:
    n: int
    ok: int
    fail_open: int
    errors: int
    stalls: int
    p50: float | None   # ms; stalled ops count with their lower bound
    p95: float | None
    p99: float | None
    max: float | None
    duration_s: float
    throughput: float | None  # completed ops/s over the run

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def stats(points: Sequence[Point], duration_s: float | None = None) -> Stats:
    lat = [p.latency_ms for p in points if math.isfinite(p.latency_ms)]
    by = {c: sum(1 for p in points if p.cls == c) for c in OUTCOME_CLASSES}
    if duration_s is None:
        duration_s = max([p.x_complete for p in points if p.x_complete is not None] + [p.x for p in points] + [0.0])
    completed = by["ok"] + by["fail-open"] + by["error"]

    def q(v: float) -> float | None:
        return float(np.percentile(lat, v)) if lat else None

    return Stats(n=len(points), ok=by["ok"], fail_open=by["fail-open"], errors=by["error"], stalls=by["stalled"],
                 p50=q(50), p95=q(95), p99=q(99), max=max(lat) if lat else None, duration_s=float(duration_s),
                 throughput=(completed / duration_s) if duration_s > 0 else None)


def timeline_stats(tl: Timeline) -> Stats:
    return stats(tl.points, tl.end)


def y_limits(timelines: Iterable[Timeline], floor_ms: float = 1e-3) -> tuple[float, float]:
    """Shared log-scale y limits (ms) covering every point, the deadline and tolerance line, with a
    margin; used to put a scenario's targets (before and after) on the same axes."""
    vals = []
    for tl in timelines:
        vals += [p.latency_ms for p in tl.points if math.isfinite(p.latency_ms) and p.latency_ms > 0]
        for v in (tl.deadline_ms, (tl.deadline_ms or 0) + (tl.tolerance_ms or 0) if tl.deadline_ms else None):
            if v:
                vals.append(v)
    if not vals:
        return (0.1, 10.0)
    lo, hi = max(min(vals), floor_ms), max(vals)
    return (lo / 1.6, hi * 1.6)


def bench_stats(samples_us: Sequence[float]) -> dict[str, float | int | None]:
    """n, p50, p90, p99, max, mean and stdev (all in µs) of a normal-path benchmark's samples."""
    v = np.asarray([s for s in samples_us], dtype=float)
    if v.size == 0:
        return {"n": 0, "p50": None, "p90": None, "p99": None, "max": None, "mean": None, "stdev": None}
    return {"n": int(v.size), "p50": float(np.percentile(v, 50)), "p90": float(np.percentile(v, 90)),
            "p99": float(np.percentile(v, 99)), "max": float(v.max()), "mean": float(v.mean()),
            "stdev": float(v.std(ddof=1)) if v.size > 1 else 0.0}


def ecdf(samples: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Sorted samples and the fraction of samples <= each (the empirical CDF, steps at each sample)."""
    v = np.sort(np.asarray(samples, dtype=float))
    return v, np.arange(1, v.size + 1, dtype=float) / max(v.size, 1)
