"""The tables of summary.md and report.html, built once as rows of cells and rendered as either.

Columns come from the scenarios' own targets (``Run.layout``): one verdict column per target, one
ratio column per (after, before) pair and metric. Scenarios whose targets differ (several families
in one run) get one verdict table each, with a caption.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field

from harness import verdicts as V

from . import data as D
from .load import Layout, Result, Run

# One mark per outcome (harness/outputs.py); None: no verdict (summary.json missing).
MARK = {"as_expected": "✅", "deviation": "❌", "error": "⚠️", "skipped": "⏭️", None: "❔"}
LEGEND = "✅ as expected · ❌ deviation · ⚠️ error · ⏭️ skipped (not run here) · ❔ no verdict"
CLS = {"as_expected": "ok", "deviation": "bad", "error": "bad", "skipped": "skip", None: "unk"}
RATIO_METRICS = ("p50", "p99")


# ---------------------------------------------------------------- formatting helpers

def fmt_ms(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def ratio(a: float | None, b: float | None) -> float | None:
    """b / a; 1.0 when both are 0; inf when only a is 0; None when either is missing."""
    if a is None or b is None:
        return None
    if a == 0:
        return 1.0 if b == 0 else math.inf
    return b / a


def fmt_ratio(r: float | None) -> str:
    if r is None:
        return "–"
    if math.isinf(r):
        return "∞"
    return f"×{r:.2f}"


def ratio_cell(after: Result | None, before: Result | None, metric: str) -> str:
    """after ÷ before of a latency metric, or why there is none: a target that stalled stopped
    issuing ops, so its quantiles describe a shorter run and a ratio would mislead."""
    sa, sb = (after.stats if after else None), (before.stats if before else None)
    if sa is None or sb is None:
        return "–"
    stalled = [r.target for r, st in ((after, sa), (before, sb)) if st.stalls]
    if stalled:
        return f"n/a ({' and '.join(stalled)} stalled)"
    return fmt_ratio(ratio(getattr(sb, metric), getattr(sa, metric)))


def expected_words(expected: str) -> str:
    """The runner writes alternatives as ``fail[a]|stall[no_stall]``: shown as "fail (failing: a) or
    stall (failing: no_stall)"."""
    return V.words(expected) if expected else ""


def verdict_cell(r: Result | None) -> str:
    if r is None:
        return "–"
    cell = f"{MARK[r.outcome]} {r.verdict}"
    if r.outcome == "deviation" and r.expected:
        cell += f" (expected {expected_words(r.expected)})"
    return cell


def outcome_words(r: Result) -> str:
    """``verdict fail, as expected`` | ``verdict pass, expected fail: DEVIATION`` | ..."""
    o = r.outcome
    if o == "deviation":
        return f"verdict {r.verdict}, expected {expected_words(r.expected) or '?'}: DEVIATION"
    if o == "as_expected":
        return f"verdict {r.verdict}, as expected"
    if o in ("error", "skipped"):
        return f"{o.upper()}: {r.reason}" if r.reason else o.upper()
    return f"verdict {r.verdict}"


def pair_words(pairs: list[tuple[str, str]]) -> str:
    return " and ".join(f"{a} ÷ {b}" for a, b in pairs)


# ---------------------------------------------------------------- the table model

@dataclass(frozen=True)
class Cell:
    text: str
    cls: str = ""    # HTML class: ok | bad | skip | unk | muted
    title: str = ""  # HTML tooltip
    href: str = ""   # HTML link


@dataclass
class Table:
    head: list[str]
    rows: list[list[Cell]] = field(default_factory=list)
    numeric: frozenset[int] = frozenset()  # right-aligned columns
    caption: str = ""

    def markdown(self) -> list[str]:
        lines = [_md(self.caption), ""] if self.caption else []
        lines.append("| " + " | ".join(_md(h) for h in self.head) + " |")
        lines.append("|" + "|".join("---:" if i in self.numeric else "---" for i in range(len(self.head))) + "|")
        lines += ["| " + " | ".join(_md(c.text) for c in row) + " |" for row in self.rows]
        return lines

    def html(self) -> str:
        out = [f"<h3>{_e(self.caption)}</h3>"] if self.caption else []
        out.append("<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in self.head) + "</tr>")
        for row in self.rows:
            out.append("<tr>" + "".join(_td(c, i in self.numeric) for i, c in enumerate(row)) + "</tr>")
        out.append("</table>")
        return "\n".join(out)


def _md(s: object) -> str:
    """Safe in a markdown table cell: no pipes, no newlines, bounded length."""
    t = " ".join(str(s).split()).replace("|", "\\|")
    return t if len(t) <= 240 else t[:237] + "..."


def _e(s: object) -> str:
    return html.escape(str(s), quote=True)


def _td(c: Cell, numeric: bool) -> str:
    cls = " ".join(x for x in (c.cls, "n" if numeric else "") if x)
    attrs = (f' class="{cls}"' if cls else "") + (f' title="{_e(c.title)}"' if c.title else "")
    text = f'<a href="{_e(c.href)}">{_e(c.text)}</a>' if c.href else _e(c.text)
    return f"<td{attrs}>{text}</td>"


# ---------------------------------------------------------------- the rows

def anchor(scenario: str) -> str:
    return f"#s-{scenario}"


def _verdict(r: Result | None) -> Cell:
    if r is None:
        return Cell("–")
    tip = f"expected {expected_words(r.expected)}" if r.expected else "no expectation"
    if r.outcome in ("skipped", "error") and r.reason:
        tip += f"; {r.reason}"
    return Cell(verdict_cell(r), CLS[r.outcome], tip)


def verdict_tables(run: Run) -> list[Table]:
    """Per scenario: its verdict per target and after ÷ before ratios; one table per target layout."""
    groups: dict[Layout, list[str]] = {}
    for s in run.scenarios():
        groups.setdefault(run.layout(s), []).append(s)
    tables = []
    for lay, scenarios in groups.items():
        head = ["scenario", *lay.targets, *[f"{m} {a}/{b}" for m in RATIO_METRICS for a, b in lay.pairs]]
        t = Table(head, numeric=frozenset(range(1 + len(lay.targets), len(head))))
        if len(groups) > 1:
            t.caption = f"Targets {', '.join(lay.targets)}" + (f" (before: {lay.baseline})" if lay.baseline else "")
        for s in scenarios:
            row = [Cell(s, href=anchor(s))] + [_verdict(run.get(s, tg)) for tg in lay.targets]
            row += [Cell(ratio_cell(run.get(s, a), run.get(s, b), m)) for m in RATIO_METRICS for a, b in lay.pairs]
            t.rows.append(row)
        tables.append(t)
    return tables


LATENCY_HEAD = ["scenario", "target", "ops", "ok", "fail-open", "raised", "stalls", "p50 ms", "p95 ms", "p99 ms",
                "max ms", "ops/s"]


def failed_column(run: Run) -> str:
    """The word for failed ops in a table of this run: its families' own when they share one
    (e.g. fail-open, failed fast), else the generic one."""
    words = {r.timeline.failed_words[0] for s in run.scenarios() for tg in run.targets(s)
             if (r := run.get(s, tg)) is not None and r.timeline is not None}
    return words.pop() if len(words) == 1 else D.GENERIC_FAILED_WORDS[0]


def latency_table(run: Run) -> Table:
    """Per scenario and target: op counts by outcome class, latency quantiles, throughput."""
    head = list(LATENCY_HEAD)
    head[head.index("fail-open")] = failed_column(run)
    t = Table(head, numeric=frozenset(range(2, len(LATENCY_HEAD))))
    for s in run.scenarios():
        for tg in run.targets(s):
            r = run.get(s, tg)
            st = r.stats if r is not None and r.outcome != "skipped" else None
            if st is None:
                t.rows.append([Cell(s), Cell(tg)] + [Cell("–")] * (len(LATENCY_HEAD) - 2))
                continue
            tput = f"{st.throughput:.1f}" if st.throughput is not None else "–"
            vals = (st.n, st.ok, st.fail_open, st.errors, st.stalls, fmt_ms(st.p50), fmt_ms(st.p95),
                    fmt_ms(st.p99), fmt_ms(st.max), tput)
            t.rows.append([Cell(s), Cell(tg)] + [Cell(str(v)) for v in vals])
    return t


def bench_order(run: Run) -> tuple[list[str], str | None]:
    """The bench samples' targets (the others first, the baseline last) and the baseline, if the
    run has one and the samples include it."""
    if not run.bench:
        return [], None
    b = run.baseline()
    b = b if b in run.bench else None
    return [t for t in run.bench if t != b] + ([b] if b else []), b


def bench_table(run: Run) -> Table | None:
    order, _ = bench_order(run)
    if not order:
        return None
    t = Table(["target", "calls", "p50 µs", "p90 µs", "p99 µs", "max µs"], numeric=frozenset(range(1, 6)))
    for tg in order:
        b = D.bench_stats(run.bench[tg])
        t.rows.append([Cell(tg)] + [Cell(str(v)) for v in (b["n"], fmt_ms(b["p50"]), fmt_ms(b["p90"]),
                                                           fmt_ms(b["p99"]), fmt_ms(b["max"]))])
    return t


def bench_ratios(run: Run) -> list[tuple[str, str, float | None, float | None]]:
    """(after, before, p50 ratio, p99 ratio) of the normal-path samples, after ÷ before."""
    order, b = bench_order(run)
    if b is None:
        return []
    sb = D.bench_stats(run.bench[b])
    out = []
    for a in order[:-1]:
        sa = D.bench_stats(run.bench[a])
        out.append((a, b, ratio(sb["p50"], sa["p50"]), ratio(sb["p99"], sa["p99"])))
    return out
