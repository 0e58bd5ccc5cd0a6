"""Compare two runs scenario by scenario and target by target, and gate on regressions.

Thresholds follow pytest-benchmark's ``--benchmark-compare-fail``: ``METRIC:PCT%`` fails when B is
more than PCT percent above A; ``METRIC:NUMBER`` fails when B is more than NUMBER above A, in the
metric's unit (ms for latencies, a count for fail_open and stalls). Only increases count: these
metrics are all smaller-is-better.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from harness.errors import UsageError

from .load import Run
from .tables import fmt_ms, ratio

METRICS = {"p50": "ms", "p99": "ms", "max": "ms", "fail_open": "count", "stalls": "count"}
_ALIASES = {"fail-open": "fail_open", "failopen": "fail_open", "stall": "stalls", "stalled": "stalls"}


@dataclass(frozen=True)
class Threshold:
    metric: str
    percent: bool
    value: float
    spec: str

    def limit(self, a: float) -> float:
        return a * (1.0 + self.value / 100.0) if self.percent else a + self.value

    def exceeded(self, a: float, b: float) -> bool:
        return b > self.limit(a) + 1e-12

    def describe(self) -> str:
        unit = "" if METRICS[self.metric] == "count" else " ms"
        return f"> +{self.value:g}%" if self.percent else f"> +{self.value:g}{unit}"


_SPEC = re.compile(r"^\s*([A-Za-z][A-Za-z0-9_-]*)\s*:\s*([0-9]*\.?[0-9]+)\s*(%?)\s*$")


def parse_threshold(spec: str) -> Threshold:
    """``p99:10%`` | ``p50:5%`` | ``max:50`` (ms) | ``fail_open:0`` | ``stalls:0``."""
    m = _SPEC.match(spec or "")
    if not m:
        raise UsageError(f"--fail-above {spec!r}: expected METRIC:PERCENT% or METRIC:NUMBER, e.g. p99:10% "
                         f"(metrics: {', '.join(METRICS)})")
    name = _ALIASES.get(m.group(1).lower(), m.group(1).lower())
    if name not in METRICS:
        raise UsageError(f"--fail-above {spec!r}: unknown metric {m.group(1)!r}; expected one of {', '.join(METRICS)}")
    value = float(m.group(2))
    if not math.isfinite(value):
        raise UsageError(f"--fail-above {spec!r}: the limit must be a finite number")
    return Threshold(metric=name, percent=m.group(3) == "%", value=value, spec=spec.strip())


def _metric(stats, name: str) -> float | None:
    if stats is None:
        return None
    v = getattr(stats, name)
    if v is None:
        return None
    return int(v) if METRICS[name] == "count" else float(v)


def compare_runs(a: Run, b: Run) -> list[dict[str, Any]]:
    """One row per (scenario, target) present in either run, in A's order then B's new ones."""
    keys: list[tuple[str, str]] = []
    for run in (a, b):
        for s in run.scenarios():
            for t in run.targets(s):
                if (s, t) not in keys:
                    keys.append((s, t))
    rows = []
    for s, t in keys:
        ra, rb = a.get(s, t), b.get(s, t)
        sa, sb = (ra.stats if ra else None), (rb.stats if rb else None)
        row: dict[str, Any] = {"scenario": s, "target": t,
                               "verdict_a": ra.verdict if ra else None, "verdict_b": rb.verdict if rb else None,
                               "as_expected_a": ra.as_expected if ra else None,
                               "as_expected_b": rb.as_expected if rb else None,
                               "n_a": sa.n if sa else None, "n_b": sb.n if sb else None,
                               "a": {}, "b": {}, "ratio": {}}
        for m in METRICS:
            va, vb = _metric(sa, m), _metric(sb, m)
            row["a"][m], row["b"][m] = va, vb
            row["ratio"][m] = ratio(va, vb)
        rows.append(row)
    return rows


def regressions(rows: list[dict], thresholds: list[Threshold]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        for th in thresholds:
            va, vb = row["a"].get(th.metric), row["b"].get(th.metric)
            if va is None or vb is None:
                continue  # missing on one side (skipped, no ops): nothing to compare
            if th.exceeded(va, vb):
                out.append({"scenario": row["scenario"], "target": row["target"], "metric": th.metric,
                            "a": va, "b": vb, "limit": th.limit(va), "threshold": th.spec})
    return out


def fmt_value(m: str, v: float | None) -> str:
    """A metric's value with its unit: ``0.312 ms``, ``3``."""
    if v is None:
        return "–"
    return f"{fmt_ms(v)} ms" if METRICS[m] == "ms" else f"{int(v)}"


def _num(m: str, v: float | None) -> str:
    if v is None:
        return "–"
    return fmt_ms(v) if METRICS[m] == "ms" else f"{int(v)}"


def _ratio_txt(r: float | None) -> str:
    if r is None:
        return ""
    return " (×∞)" if math.isinf(r) else f" (×{r:.2f})"


def format_table(rows: list[dict], regs: list[dict], name_a: str, name_b: str) -> str:
    """A plain-text table (CI logs are not terminals): each cell is ``A → B (×B/A)``, ``!`` marks a
    cell over a threshold."""
    flagged = {(r["scenario"], r["target"], r["metric"]) for r in regs}
    head = ["scenario", "target", "verdict A → B", "p50 ms", "p99 ms", "max ms", "fail-open", "stalls"]
    body = []
    for row in rows:
        va, vb = row["verdict_a"] or "–", row["verdict_b"] or "–"
        cells = [row["scenario"], row["target"], f"{va} → {vb}" + (" *" if va != vb else "")]
        for m in METRICS:
            mark = "! " if (row["scenario"], row["target"], m) in flagged else ""
            txt = f"{_num(m, row['a'][m])} → {_num(m, row['b'][m])}"
            if METRICS[m] == "ms":
                txt += _ratio_txt(row["ratio"][m])
            cells.append(mark + txt)
        body.append(cells)
    widths = [max(len(str(c)) for c in col) for col in zip(head, *body)] if body else [len(h) for h in head]

    def line(cells: list[str]) -> str:
        return "  ".join(str(c).ljust(w) if i < 3 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    out = [f"A = {name_a}", f"B = {name_b}", "", line(head), "  ".join("-" * w for w in widths)]
    out += [line(c) for c in body]
    out.append("")
    out.append("cells: A → B (×B/A); * verdict changed; ! over a --fail-above threshold")
    return "\n".join(out)


def json_safe(v: Any) -> Any:
    """inf and nan are not JSON: written as the strings "inf" / "nan"."""
    if isinstance(v, float) and not math.isfinite(v):
        return "inf" if math.isinf(v) else "nan"
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, list):
        return [json_safe(x) for x in v]
    return v
