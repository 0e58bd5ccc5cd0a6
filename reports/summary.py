"""Text outputs of a run: summary.md (a PR comment), report.html (one self-contained file), bench.json.

All three are pure functions of a loaded ``Run`` (and the plot paths), with no timestamps of their
own, so regenerating a saved run gives byte-identical files.
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path
from typing import Any

from . import data as D
from .load import TABLE_ORDER, Result, Run

MARK = {True: "✅", False: "❌", None: "❔"}


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


def ratio_cell(h: Result | None, lg: Result | None, metric: str) -> str:
    """hardened ÷ legacy of a latency metric, or why there is none: a target that stalled stopped
    issuing ops, so its quantiles describe a shorter run and a ratio would mislead."""
    hs, ls = (h.stats if h else None), (lg.stats if lg else None)
    if hs is None or ls is None:
        return "–"
    stalled = [t for t, st in (("hardened", hs), ("legacy", ls)) if st.stalls]
    if stalled:
        return f"n/a ({' and '.join(stalled)} stalled)"
    return fmt_ratio(ratio(getattr(ls, metric), getattr(hs, metric)))


def fmt_ratio(r: float | None) -> str:
    if r is None:
        return "–"
    if math.isinf(r):
        return "∞"
    return f"×{r:.2f}"


def _md(s: object) -> str:
    """Safe in a markdown table cell: no pipes, no newlines, bounded length."""
    t = " ".join(str(s).split()).replace("|", "\\|")
    return t if len(t) <= 240 else t[:237] + "..."


def expected_words(expected: str) -> str:
    """The runner writes alternatives as ``fail|stall``: shown as "fail or stall"."""
    return " or ".join(e for e in expected.split("|") if e)


def verdict_cell(r: Result | None) -> str:
    if r is None:
        return "–"
    cell = f"{MARK[r.as_expected]} {r.verdict}"
    if r.as_expected is False and r.expected:
        cell += f" (expected {expected_words(r.expected)})"
    return cell


def deviations(run: Run) -> list[Result]:
    return [r for r in run.results if r.as_expected is False]


def failed_checks(r: Result) -> list[dict]:
    return [c for c in r.checks if c.get("ok") is False]


# ---------------------------------------------------------------- summary.md

FLOOR_FILE = "toxiproxy_floor.json"  # written by the runner (harness/floor.py) when a run used Toxiproxy


def floor_md(run_dir: Path) -> list[str]:
    """The measurement floor section: what Toxiproxy itself adds, so readers know which latency
    differences are noise. Nothing when the run used no Toxiproxy."""
    path = Path(run_dir) / FLOOR_FILE
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    lines = ["#### Measurement floor (Toxiproxy)", "", _md(rec.get("text", "")), ""]
    f = rec.get("floor") if rec.get("measured") else None
    if f:
        lines += ["| | median ms | p90 ms |", "|---|---:|---:|",
                  f"| direct | {f['direct_median_ms']:.3f} | {f['direct_p90_ms']:.3f} |",
                  f"| through the proxy, no toxic | {f['proxied_median_ms']:.3f} | {f['proxied_p90_ms']:.3f} |",
                  f"| added by Toxiproxy | {f['added_median_ms']:.3f} | |", "",
                  f"Latency toxic: configured {f['latency_configured_ms']} ms, measured "
                  f"{f['latency_measured_ms']:.2f} ms above the direct round trip (raw round trips with the toxic: "
                  f"min {f['latency_min_ms']:.2f}, max {f['latency_max_ms']:.2f} ms); "
                  f"toxiproxy-server {_md(rec.get('toxiproxy_version', '?'))}.", ""]
    return lines


def summary_md(run: Run, plots: dict[str, list[str]], bench_plot: str | None) -> str:
    """``plots``: scenario -> plot paths relative to the run folder (in display order)."""
    scenarios = run.scenarios()
    n_as = sum(1 for r in run.results if r.as_expected is True)
    n_dev = len(deviations(run))
    n_unk = sum(1 for r in run.results if r.as_expected is None)
    lines = [f"### pd-chaos run `{_md(run.run_id)}`", ""]
    head = []
    if run.started:
        head.append(f"started {_md(run.started)}")
    if run.elapsed_s is not None:
        head.append(f"took {run.elapsed_s:.1f} s")
    head.append(f"{len(scenarios)} scenario(s), {len(run.results)} scenario/target pair(s)")
    tally = f"**{n_as} as expected, {n_dev} deviation(s)**" + (f", {n_unk} without a verdict" if n_unk else "")
    lines += [", ".join(head) + ": " + tally + ".", ""]
    if not run.has_summary:
        lines += ["> summary.json is missing (the run did not finish): verdicts are unknown, data is from "
                  "the journals.", ""]

    lines += ["| scenario | hardened | legacy | p50 hardened/legacy | p99 hardened/legacy |",
              "|---|---|---|---:|---:|"]
    for s in scenarios:
        h, lg = run.get(s, "hardened"), run.get(s, "legacy")
        lines.append(f"| {_md(s)} | {verdict_cell(h)} | {verdict_cell(lg)} | {ratio_cell(h, lg, 'p50')} | "
                     f"{ratio_cell(h, lg, 'p99')} |")
    others = sorted({r.target for r in run.results} - {"hardened", "legacy"})
    if others:
        lines += ["", "Other targets: " + ", ".join(
            f"{_md(r.scenario)}/{_md(r.target)} {verdict_cell(r)}" for r in run.results if r.target in others)]
    lines += ["", "✅ as expected · ❌ deviation · ❔ no verdict. Ratios are hardened ÷ legacy latency under the "
                  "scenario's faults (n/a when a target stalled: it stopped issuing ops); in the latency table a stalled "
                  "op counts with the time until the run gave up (a lower bound).", ""]

    lines += ["<details><summary>Latency and outcomes per scenario and target</summary>", "",
              "| scenario | target | ops | ok | fail-open | errors | stalls | p50 ms | p99 ms | max ms |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in scenarios:
        for t in run.targets(s, TABLE_ORDER):
            r = run.get(s, t)
            st = r.stats if r else None
            if st is None:
                lines.append(f"| {_md(s)} | {_md(t)} | – | – | – | – | – | – | – | – |")
                continue
            lines.append(f"| {_md(s)} | {_md(t)} | {st.n} | {st.ok} | {st.fail_open} | {st.errors} | {st.stalls} | "
                         f"{fmt_ms(st.p50)} | {fmt_ms(st.p99)} | {fmt_ms(st.max)} |")
    lines += ["", "</details>", ""]

    if run.bench:
        lines += ["#### Normal path (no faults, `pdchaos bench lookup`)", "",
                  "| target | calls | p50 µs | p90 µs | p99 µs | max µs |", "|---|---:|---:|---:|---:|---:|"]
        bs = {t: D.bench_stats(v) for t, v in run.bench.items()}
        for t in ("hardened", "legacy"):
            if t in bs:
                b = bs[t]
                lines.append(f"| {t} | {b['n']} | {fmt_ms(b['p50'])} | {fmt_ms(b['p90'])} | {fmt_ms(b['p99'])} | "
                             f"{fmt_ms(b['max'])} |")
        if "hardened" in bs and "legacy" in bs:
            lines += ["", f"Cost of the patch on the normal path, hardened ÷ legacy: "
                          f"**p50 {fmt_ratio(ratio(bs['legacy']['p50'], bs['hardened']['p50']))}**, "
                          f"**p99 {fmt_ratio(ratio(bs['legacy']['p99'], bs['hardened']['p99']))}**."]
        lines.append("")

    lines += floor_md(run.path)

    devs = deviations(run)
    if devs:
        lines += ["#### Deviations", ""]
        for r in devs:
            bad = failed_checks(r)
            lines.append(f"- **{_md(r.scenario)} / {_md(r.target)}**: {r.verdict}, expected "
                         f"{_md(expected_words(r.expected)) or '?'}"
                         + (f": {_md(r.reason)}" if r.reason and not bad else ""))
            for c in bad:  # the reason repeats these; each on its own line reads better
                lines.append(f"  - `{_md(c.get('name', '?'))}`: {_md(c.get('message', ''))}")
        lines.append("")

    if plots or bench_plot:
        lines += ["#### Plots", "", "In the run folder:", ""]
        if bench_plot:
            lines.append(f"- normal path CDF: `{bench_plot}`")
        for s in scenarios:
            if plots.get(s):
                lines.append(f"- {_md(s)}: " + ", ".join(f"`{p}`" for p in plots[s]))
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------- bench.json

def bench_entries(run: Run) -> list[dict[str, Any]]:
    """github-action-benchmark's ``customSmallerIsBetter`` input: ``[{name, unit, value, range?, extra?}]``."""
    out: list[dict[str, Any]] = []
    for s in run.scenarios():
        for t in run.targets(s, TABLE_ORDER):
            r = run.get(s, t)
            st = r.stats if r else None
            if st is None:
                continue
            extra = (f"ops={st.n} ok={st.ok} fail_open={st.fail_open} errors={st.errors} stalls={st.stalls} "
                     f"verdict={r.verdict}")
            for name in ("p50", "p99"):
                v = getattr(st, name)
                if v is not None:
                    out.append({"name": f"{s}/{t}/{name}", "unit": "ms", "value": round(v, 4), "extra": extra})
    if run.bench:
        for t in ("hardened", "legacy"):
            if t not in run.bench:
                continue
            b = D.bench_stats(run.bench[t])
            if not b["n"]:
                continue
            for name in ("p50", "p99"):
                out.append({"name": f"normal-path/{t}/{name}", "unit": "us", "value": round(b[name], 3),
                            "range": f"± {b['stdev']:.3f}", "extra": f"calls={b['n']} (stdev over all calls)"})
    return out


def bench_json(run: Run) -> str:
    return json.dumps(bench_entries(run), indent=2, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------- report.html

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1400px;padding:0 16px;color:#222}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd;padding-bottom:4px}h3{font-size:15px}
table{border-collapse:collapse;margin:8px 0 16px}th,td{border:1px solid #ddd;padding:4px 8px;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}th{background:#f5f5f5}
.ok{color:#1a7f37}.bad{color:#cf222e;font-weight:600}.unk{color:#777}
img{max-width:100%;border:1px solid #eee;margin:6px 0}details{margin:6px 0}summary{cursor:pointer}
code{background:#f3f3f3;padding:1px 4px;border-radius:3px}.muted{color:#666}
"""


def _e(s: object) -> str:
    return html.escape(str(s), quote=True)


def _img(run_dir: Path, rel: str, alt: str) -> str:
    data = base64.b64encode((run_dir / rel).read_bytes()).decode("ascii")
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _vcell(r: Result | None) -> str:
    if r is None:
        return "<td>–</td>"
    cls = {True: "ok", False: "bad", None: "unk"}[r.as_expected]
    tip = f"expected {expected_words(r.expected)}" if r.expected else "no expectation"
    return f'<td class="{cls}" title="{_e(tip)}">{MARK[r.as_expected]} {_e(r.verdict)}' + (
        f" (expected {_e(expected_words(r.expected))})" if r.as_expected is False and r.expected else "") + "</td>"


def report_html(run: Run, plots: dict[str, list[str]], bench_plot: str | None) -> str:
    root = run.path
    scenarios = run.scenarios()
    n_dev = len(deviations(run))
    p: list[str] = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
                    f"<title>pd-chaos run {_e(run.run_id)}</title><style>{_CSS}</style></head><body>",
                    f"<h1>pd-chaos run <code>{_e(run.run_id)}</code></h1>"]
    info = []
    if run.started:
        info.append(f"started {_e(run.started)}")
    if run.elapsed_s is not None:
        info.append(f"took {run.elapsed_s:.1f} s")
    info.append(f"{len(scenarios)} scenario(s), {len(run.results)} scenario/target pair(s)")
    verdict_cls = "ok" if n_dev == 0 else "bad"
    p.append(f'<p>{", ".join(info)}: <span class="{verdict_cls}">'
             f"{sum(1 for r in run.results if r.as_expected is True)} as expected, {n_dev} deviation(s)</span></p>")
    if not run.has_summary:
        p.append("<p class='bad'>summary.json is missing: verdicts are unknown, data is from the journals.</p>")

    p += ["<h2>Verdicts</h2>", "<table><tr><th>scenario</th><th>hardened</th><th>legacy</th>"
          "<th>p50 hardened/legacy</th><th>p99 hardened/legacy</th></tr>"]
    for s in scenarios:
        h, lg = run.get(s, "hardened"), run.get(s, "legacy")
        p.append(f'<tr><td><a href="#s-{_e(s)}">{_e(s)}</a></td>{_vcell(h)}{_vcell(lg)}'
                 f'<td class="n">{_e(ratio_cell(h, lg, "p50"))}</td><td class="n">{_e(ratio_cell(h, lg, "p99"))}</td></tr>')
    p.append("</table>")

    p += ["<h2>Latency and outcomes</h2>",
          "<p class='muted'>Latency in ms. Stalled ops count with the time until the run gave up (a lower bound).</p>",
          "<table><tr><th>scenario</th><th>target</th><th>ops</th><th>ok</th><th>fail-open</th><th>errors</th>"
          "<th>stalls</th><th>p50</th><th>p95</th><th>p99</th><th>max</th><th>ops/s</th></tr>"]
    for s in scenarios:
        for t in run.targets(s, TABLE_ORDER):
            r = run.get(s, t)
            st = r.stats if r else None
            if st is None:
                p.append(f"<tr><td>{_e(s)}</td><td>{_e(t)}</td><td colspan=10 class='muted'>no journal</td></tr>")
                continue
            tput = f"{st.throughput:.1f}" if st.throughput is not None else "–"
            p.append(f"<tr><td>{_e(s)}</td><td>{_e(t)}</td>" + "".join(
                f'<td class="n">{v}</td>' for v in (st.n, st.ok, st.fail_open, st.errors, st.stalls, fmt_ms(st.p50),
                                                   fmt_ms(st.p95), fmt_ms(st.p99), fmt_ms(st.max), tput)) + "</tr>")
    p.append("</table>")

    if run.bench:
        p.append("<h2>Normal path (no faults)</h2><table><tr><th>target</th><th>calls</th><th>p50 µs</th>"
                 "<th>p90 µs</th><th>p99 µs</th><th>max µs</th></tr>")
        for t in ("hardened", "legacy"):
            if t in run.bench:
                b = D.bench_stats(run.bench[t])
                p.append(f"<tr><td>{t}</td>" + "".join(f'<td class="n">{v}</td>' for v in (
                    b["n"], fmt_ms(b["p50"]), fmt_ms(b["p90"]), fmt_ms(b["p99"]), fmt_ms(b["max"]))) + "</tr>")
        p.append("</table>")
        if bench_plot:
            p.append(_img(root, bench_plot, "normal path latency CDF"))

    for s in scenarios:
        p.append(f'<h2 id="s-{_e(s)}">{_e(s)}</h2>')
        for t in run.targets(s, TABLE_ORDER):
            r = run.get(s, t)
            if r is None:
                continue
            line = f"<b>{_e(t)}</b>: {MARK[r.as_expected]} {_e(r.verdict)}"
            if r.expected:
                line += f", expected {_e(expected_words(r.expected))}"
            if r.reason:
                line += f" — {_e(r.reason)}"
            p.append(f"<p>{line}</p>")
            if r.checks:
                p.append(f"<details{' open' if failed_checks(r) else ''}><summary>checks of {_e(t)}</summary>"
                         "<table><tr><th>check</th><th>result</th><th>message</th></tr>")
                for c in r.checks:
                    ok = c.get("ok")
                    cls, word = {True: ("ok", "ok"), False: ("bad", "violated"), None: ("unk", "n/a")}.get(
                        ok, ("unk", "?"))
                    p.append(f"<tr><td>{_e(c.get('name', '?'))}</td><td class='{cls}'>{word}</td>"
                             f"<td>{_e(c.get('message', ''))}</td></tr>")
                p.append("</table></details>")
        both = [rel for rel in plots.get(s, []) if rel.endswith("--before-after.png")]
        for rel in both:
            p.append(_img(root, rel, f"{s}: before and after"))
        for rel in plots.get(s, []):
            if rel not in both:  # the per-target timelines: folded when the before/after plot is there
                p.append(f"<details{'' if both else ' open'}><summary>timeline, quantiles and throughput: "
                         f"<code>{_e(rel)}</code></summary>{_img(root, rel, rel)}</details>")
    p.append("</body></html>")
    return "\n".join(p) + "\n"
