"""Compare two runs scenario by scenario and target by target, and gate on regressions.

Thresholds follow pytest-benchmark's ``--benchmark-compare-fail``: ``METRIC:PCT%`` fails when B is
more than PCT percent above A; ``METRIC:NUMBER`` fails when B is more than NUMBER above A, in the
metric's unit (ms for latencies, a count for fail_open and stalls). Only increases count: these
metrics are all smaller-is-better.

What a reviewer reads first is :func:`verdict_changes` (a scenario/target whose verdict or "as
expected" changed from A to B), then the latency ratios, judged against the noise floor of the same
runs (:func:`noise_floor`: the two halves of each run's own normal-path benchmark samples, even vs
odd ops, differ by this much with no change at all). :func:`format_markdown` renders both for a
pull-request comment.
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
_ALIASES = {"fail-open": "fail_open", "failopen": "fail_open", "failed": "fail_open", "stall": "stalls", "stalled": "stalls"}


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


def verdict_changes(rows: list[dict]) -> list[dict[str, Any]]:
    """Rows whose verdict or as-expected differs between A and B, worst first: a run that was as
    expected in A and is not in B (``worse``), then ``better``, then the other changes (a verdict
    that changed but stayed as expected, a run only on one side)."""
    out = []
    for row in rows:
        if row["verdict_a"] == row["verdict_b"] and row["as_expected_a"] == row["as_expected_b"]:
            continue
        ea, eb = row["as_expected_a"], row["as_expected_b"]
        if row["verdict_a"] is None or row["verdict_b"] is None:
            kind = "added" if row["verdict_a"] is None else "removed"
        elif ea is True and eb is not True:
            kind = "worse"
        elif eb is True and ea is not True:
            kind = "better"
        else:
            kind = "changed"
        out.append({"scenario": row["scenario"], "target": row["target"], "kind": kind,
                    "verdict_a": row["verdict_a"], "verdict_b": row["verdict_b"],
                    "as_expected_a": ea, "as_expected_b": eb})
    order = {"worse": 0, "better": 1, "changed": 2, "removed": 3, "added": 4}
    return sorted(out, key=lambda c: order[c["kind"]])


def _quantile(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    if not ys:
        return math.nan
    i = q * (len(ys) - 1)
    lo, hi = math.floor(i), math.ceil(i)
    return ys[lo] + (ys[hi] - ys[lo]) * (i - lo)


def noise_floor(*runs: Run) -> dict[str, Any] | None:
    """The noise floor of latency ratios, measured in these runs: for each run's normal-path
    benchmark samples (``bench_samples.json``) and each target, the ratio of the even-numbered ops'
    p50 (p99) to the odd-numbered ops' — two halves of the same code in the same run, so any
    difference is noise. The floor is the largest ``|ratio - 1|`` over runs and targets (a ratio
    B/A within ``1 ± floor`` is not a change). None when no run has benchmark samples (at least
    20 per target)."""
    found: dict[str, list[float]] = {"p50": [], "p99": []}
    sources = []
    for run in runs:
        for target, xs in sorted((run.bench or {}).items()):
            if len(xs) < 20:
                continue
            ev, od = xs[0::2], xs[1::2]
            for m, q in (("p50", 0.5), ("p99", 0.99)):
                a, b = _quantile(od, q), _quantile(ev, q)
                if a > 0 and math.isfinite(b):
                    found[m].append(abs(b / a - 1.0))
            sources.append(f"{run.run_id}/{target} (n={len(xs)})")
    if not sources:
        return None
    return {"p50": max(found["p50"], default=None), "p99": max(found["p99"], default=None),
            "sources": sources}


def bench_rows(a: Run, b: Run) -> list[dict[str, Any]]:
    """The normal-path benchmark, B vs A, per target present in both runs' samples (µs)."""
    out = []
    if not a.bench or not b.bench:
        return out
    for t in [t for t in a.bench if t in b.bench]:
        xa, xb = a.bench[t], b.bench[t]
        if not xa or not xb:
            continue
        row: dict[str, Any] = {"target": t, "n_a": len(xa), "n_b": len(xb), "a": {}, "b": {}, "ratio": {}}
        for m, q in (("p50", 0.5), ("p99", 0.99)):
            row["a"][m], row["b"][m] = _quantile(xa, q), _quantile(xb, q)
            row["ratio"][m] = ratio(row["a"][m], row["b"][m])
        out.append(row)
    return out


def within_noise(r: float | None, floor: float | None) -> bool | None:
    """True when the ratio is within ``1 ± floor``; None when either is unknown."""
    if r is None or floor is None or not math.isfinite(r):
        return None
    return abs(r - 1.0) <= floor + 1e-12


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


def _floor_words(floor: dict | None) -> str:
    if floor is None:
        return "noise floor: not measured (no benchmark samples in either run: `pdchaos run --bench N`)"
    parts = [f"{m} ±{floor[m] * 100:.1f}%" for m in ("p50", "p99") if floor.get(m) is not None]
    return (f"noise floor (even vs odd ops of the same run's benchmark, {', '.join(floor['sources'])}): "
            + ", ".join(parts) + "; a ratio within 1 ± floor is not a change")


def _change_words(c: dict) -> str:
    def side(v, e):
        return "–" if v is None else f"{v}" + ("" if e is None else (" (as expected)" if e else " (NOT as expected)"))
    return f"{side(c['verdict_a'], c['as_expected_a'])} → {side(c['verdict_b'], c['as_expected_b'])}"


def format_table(rows: list[dict], regs: list[dict], name_a: str, name_b: str, *,
                 changes: list[dict] | None = None, floor: dict | None = None,
                 bench: list[dict] | None = None) -> str:
    """A plain-text table (CI logs are not terminals): verdict changes first (when given), then
    each cell ``A → B (×B/A)``, ``!`` marking a cell over a threshold, then the benchmark ratios
    and the noise floor (when given)."""
    flagged = {(r["scenario"], r["target"], r["metric"]) for r in regs}
    head = ["scenario", "target", "verdict A → B", "p50 ms", "p99 ms", "max ms", "failed", "stalls"]
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

    out = [f"A = {name_a}", f"B = {name_b}", ""]
    if changes is not None:
        if changes:
            out.append(f"verdict changes ({len(changes)}):")
            out += [f"  {c['kind'].upper():8s} {c['scenario']}/{c['target']}: {_change_words(c)}" for c in changes]
        else:
            out.append("verdict changes: none")
        out.append("")
    out += [line(head), "  ".join("-" * w for w in widths)]
    out += [line(c) for c in body]
    out.append("")
    out.append("cells: A → B (×B/A); * verdict changed; ! over a --fail-above threshold")
    if bench:
        out.append("")
        out.append("normal-path benchmark (ms), A → B (×B/A):")
        for br in bench:
            cells = []
            for m in ("p50", "p99"):
                r = br["ratio"][m]
                noise = within_noise(r, (floor or {}).get(m))
                cells.append(f"{m} {fmt_ms(br['a'][m] / 1000)} → {fmt_ms(br['b'][m] / 1000)}{_ratio_txt(r)}"
                             + (" within noise" if noise else ""))
            out.append(f"  {br['target']}: " + ", ".join(cells) + f" (n {br['n_a']} / {br['n_b']})")
    if changes is not None or bench is not None:
        out.append(_floor_words(floor))
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


# ------------------------------------------------------------------ Markdown (a pull-request comment)

COMMENT_LIMIT = 65536  # GitHub rejects a comment body longer than this (characters)
DEFAULT_MAX_BYTES = 60000  # what format_markdown aims under, leaving room for a caller's header


def _md_cell(s: object) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _md_verdict(v: str | None, e: bool | None) -> str:
    if v is None:
        return "–"
    return f"{v}" + ("" if e is None else (" ✓" if e else " ✗"))


def format_markdown(doc: dict[str, Any], *, max_bytes: int = DEFAULT_MAX_BYTES, header: str = "",
                    footer: str = "") -> str:
    """The comparison as Markdown, from the JSON document ``pdchaos compare --json`` writes: the
    gate's outcome, verdict changes per scenario first, the regressions, then the latency table
    (ratios, with the noise floor measured in the same runs) and the benchmark. The whole body,
    ``header`` and ``footer`` included, stays under ``max_bytes`` (UTF-8): rows that do not fit are
    left out, whole, and a note says how many and where the full output is."""
    thresholds = doc.get("thresholds") or []
    regs = doc.get("regressions") or []
    changes = doc.get("verdict_changes") or []
    floor = doc.get("noise_floor")
    rows = doc.get("rows") or []
    bench = doc.get("bench") or []
    worse = [c for c in changes if c["kind"] == "worse"]
    if regs or worse:
        gate = (f"**{len(worse)} verdict(s) got worse, {len(regs)} latency regression(s)** over "
                f"{', '.join(thresholds) or 'no threshold'}")
    else:
        gate = (f"no verdict got worse, no latency regression over {', '.join(thresholds)}" if thresholds
                else "no verdict got worse (no latency threshold given)")
    blocks: list[tuple[str, list[str], list[str]]] = []  # (heading + intro lines, rows, table head)
    intro = [f"A (base) = `{doc.get('run_id_a', '?')}`, B (head) = `{doc.get('run_id_b', '?')}`: {gate}.", ""]
    if changes:
        blocks.append((f"### Verdict changes ({len(changes)})", ["| scenario | target | change | A | B |",
                                                                 "|---|---|---|---|---|"],
                       [f"| {_md_cell(c['scenario'])} | {_md_cell(c['target'])} | {c['kind']} | "
                        f"{_md_verdict(c['verdict_a'], c['as_expected_a'])} | "
                        f"{_md_verdict(c['verdict_b'], c['as_expected_b'])} |" for c in changes]))
    else:
        intro += ["**Verdict changes:** none (every scenario and target has the same verdict on A and B).", ""]
    if regs:
        blocks.append((f"### Regressions ({len(regs)})", ["| scenario | target | metric | A | B | limit |",
                                                          "|---|---|---|---:|---:|---:|"],
                       [f"| {_md_cell(r['scenario'])} | {_md_cell(r['target'])} | {r['metric']} | "
                        f"{fmt_value(r['metric'], _num_or_none(r['a']))} | {fmt_value(r['metric'], _num_or_none(r['b']))} | "
                        f"{fmt_value(r['metric'], _num_or_none(r['limit']))} (`{r['threshold']}`) |" for r in regs]))
    fl = floor or {}
    flagged = {(r["scenario"], r["target"], r["metric"]) for r in regs}

    def lat(row: dict, m: str) -> str:
        a, b, r = _num_or_none(row["a"].get(m)), _num_or_none(row["b"].get(m)), _num_or_none(row["ratio"].get(m))
        txt = f"{_num(m, a)} → {_num(m, b)}" + (_ratio_txt(r) if METRICS[m] == "ms" else "")
        if METRICS[m] == "ms" and within_noise(r, fl.get(m if m in ("p50", "p99") else "p99")):
            txt += " ≈"
        return ("**" + txt + "** ⚠" if (row["scenario"], row["target"], m) in flagged else txt)

    blocks.append(("### Latency per scenario (ms, A → B (×B/A))",
                   ["| scenario | target | p50 | p99 | max | failed | stalls |",
                    "|---|---|---:|---:|---:|---:|---:|"],
                   [f"| {_md_cell(row['scenario'])} | {_md_cell(row['target'])} | "
                    + " | ".join(lat(row, m) for m in METRICS) + " |" for row in rows]))
    if bench:
        blocks.append(("### Normal-path benchmark (ms, A → B (×B/A))",
                       ["| target | n A / B | p50 | p99 |", "|---|---:|---:|---:|"],
                       [f"| {_md_cell(br['target'])} | {br['n_a']} / {br['n_b']} | "
                        + " | ".join(f"{fmt_ms(_num_or_none(br['a'][m]) / 1000)} → "
                                     f"{fmt_ms(_num_or_none(br['b'][m]) / 1000)}{_ratio_txt(_num_or_none(br['ratio'][m]))}"
                                     + (" ≈" if within_noise(_num_or_none(br['ratio'][m]), fl.get(m)) else "")
                                     for m in ("p50", "p99")) + " |" for br in bench]))
    legend = ["", _floor_words(floor).replace("noise floor", "**Noise floor**", 1) + ". "
              "≈ marks a ratio within the noise floor; ⚠ a cell over a `--fail-above` threshold; "
              "✓ / ✗ as expected / not."]

    def size(lines: list[str]) -> int:
        return len("\n".join(lines).encode("utf-8"))

    fixed = [header] if header else []
    tail = legend + ([footer] if footer else [])
    out = fixed + intro
    omitted = 0
    note_room = 200
    for title, head, body in blocks:
        if size(out + [title] + head + tail) + note_room > max_bytes:
            omitted += len(body)
            continue
        out += [title] + head
        for i, line in enumerate(body):
            if size(out + [line] + tail) + note_room > max_bytes:
                omitted += len(body) - i
                break
            out.append(line)
        out.append("")
    if omitted:
        out.append(f"_{omitted} row(s) left out to keep this comment under {max_bytes // 1000} KB: the full "
                   "comparison is `compare.txt` / `compare.json` in the artifact._")
    return "\n".join(out + tail).rstrip("\n") + "\n"


def _num_or_none(v: Any) -> float | None:
    """A number from a JSON document (json_safe wrote inf as "inf")."""
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return v
