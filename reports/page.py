"""report.html: one self-contained file (plots inlined as data URIs), from the same tables as summary.md."""

from __future__ import annotations

import base64
from pathlib import Path

from . import timeline as T
from .load import Run
from .summary import NOT_AS_EXPECTED, bench_cost_words, bench_plot_list, failed_checks, legend, outcome_counts, run_facts, tally_words
from .tables import CLS, MARK, _e, bench_table, expected_words, latency_table, verdict_tables

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1400px;padding:0 16px;color:#222}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd;padding-bottom:4px}h3{font-size:15px}
table{border-collapse:collapse;margin:8px 0 16px}th,td{border:1px solid #ddd;padding:4px 8px;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}th{background:#f5f5f5}
.ok{color:#1a7f37}.bad{color:#cf222e;font-weight:600}.unk{color:#777}.skip{color:#9a6700}
img{max-width:100%;border:1px solid #eee;margin:6px 0}details{margin:6px 0}summary{cursor:pointer}
code{background:#f3f3f3;padding:1px 4px;border-radius:3px}.muted{color:#666}
"""
# A check's ok: True passed, False violated, None not applicable (never shown as passing).
CHECK_WORD = {True: ("ok", "ok"), False: ("bad", "violated"), None: ("unk", "n/a")}


def _img(run_dir: Path, rel: str, alt: str) -> str:
    data = base64.b64encode((run_dir / rel).read_bytes()).decode("ascii")
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


GAUGES_SUFFIX = "--gauges.png"


def is_before_after(rel: str) -> bool:
    return rel.endswith("--before-after.png") or "--before-after--" in rel


def is_gauges(rel: str) -> bool:
    return rel.endswith(GAUGES_SUFFIX)


def incident_html(inc: T.Incident) -> str:
    """The incident timeline as a table (time, where, what), its headline first."""
    rows = "".join(f"<tr><td class='n'>{_e(T.fmt_s(e.t))}</td><td>{_e(e.source)}</td><td>{_e(e.text)}</td></tr>"
                   for e in inc.entries)
    return (f"<p>{_e(inc.headline())}.</p><table><tr><th>t (s)</th><th>where</th><th>what</th></tr>{rows}</table>")


def _scenario_section(run: Run, s: str, plots: list[str]) -> list[str]:
    root = run.path
    p = [f'<h2 id="s-{_e(s)}">{_e(s)}</h2>']
    for t in run.targets(s):
        r = run.get(s, t)
        if r is None:
            continue
        line = f"<b>{_e(t)}</b>: <span class='{CLS[r.outcome]}'>{MARK[r.outcome]} {_e(r.verdict)}</span>"
        if r.expected:
            line += f", expected {_e(expected_words(r.expected))}"
        if r.reason:
            line += f" — {_e(r.reason)}"
        p.append(f"<p>{line}</p>")
        if r.checks:
            p.append(f"<details{' open' if failed_checks(r) else ''}><summary>checks of {_e(t)}</summary>"
                     "<table><tr><th>check</th><th>result</th><th>message</th></tr>")
            for c in r.checks:
                cls, word = CHECK_WORD.get(c.get("ok"), ("unk", "?"))
                p.append(f"<tr><td>{_e(c.get('name', '?'))}</td><td class='{cls}'>{word}</td>"
                         f"<td>{_e(c.get('message', ''))}</td></tr>")
            p.append("</table></details>")
        if r.incident is not None and r.outcome != "skipped":
            p.append(f"<details open><summary>incident timeline of {_e(t)}</summary>{incident_html(r.incident)}</details>")
    both = [rel for rel in plots if is_before_after(rel)]
    for rel in both:
        p.append(_img(root, rel, f"{s}: before and after"))
    for rel in plots:
        if rel in both:
            continue
        # the per-target timelines, each followed by its node gauges (same time axis): folded when
        # a before/after plot is there
        what = "node gauges" if is_gauges(rel) else "timeline, quantiles and throughput"
        p.append(f"<details{'' if both else ' open'}><summary>{what}: "
                 f"<code>{_e(rel)}</code></summary>{_img(root, rel, rel)}</details>")
    return p


def report_html(run: Run, plots: dict[str, list[str]], bench_plots: list[str] | str | None) -> str:
    c = outcome_counts(run)
    cls = "ok" if not (c["deviation"] or c["error"]) else "bad"
    p: list[str] = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
                    f"<title>pd-chaos run {_e(run.run_id)}</title><style>{_CSS}</style></head><body>",
                    f"<h1>pd-chaos run <code>{_e(run.run_id)}</code></h1>",
                    f'<p>{_e(", ".join(run_facts(run)))}: <span class="{cls}">{_e(tally_words(run))}</span></p>']
    if not run.has_summary:
        p.append("<p class='bad'>summary.json is missing: verdicts are unknown, data is from the journals.</p>")

    p.append("<h2>Verdicts</h2>")
    p += [t.html() for t in verdict_tables(run)]
    p.append(f"<p class='muted'>{_e(legend(run))}</p>")
    for outcome, title in NOT_AS_EXPECTED[1:]:  # deviations show in their scenario's section
        rs = [r for r in run.results if r.outcome == outcome]
        if rs:
            p.append(f"<p class='{CLS[outcome]}'>{_e(title)}: " + "; ".join(
                f'<a href="#s-{_e(r.scenario)}">{_e(r.scenario)}</a> [{_e(r.target)}]: {_e(r.reason or outcome)}'
                for r in rs) + "</p>")

    p += ["<h2>Latency and outcomes</h2>", latency_table(run).html()]

    rels = bench_plot_list(bench_plots)
    for i, view in enumerate(run.bench_views()):
        bt = bench_table(view)
        if bt is None:
            continue
        p += [f"<h2>Normal path (no faults, {_e(view.bench_words()[0])})</h2>", bt.html()]
        cost = bench_cost_words(view)
        if cost:
            p.append(f"<p>Cost on the normal path, {_e(cost.replace('**', ''))}.</p>")
        if i < len(rels):
            p.append(_img(run.path, rels[i], "normal path latency CDF"))

    for s in run.scenarios():
        p += _scenario_section(run, s, plots.get(s, []))
    p.append("</body></html>")
    return "\n".join(p) + "\n"
