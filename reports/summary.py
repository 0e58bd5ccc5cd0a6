"""Text outputs of a run: summary.md (a PR comment) and bench.json; report.html is in page.py.

All are pure functions of a loaded ``Run`` (and the plot paths), with no timestamps of their own,
so regenerating a saved run gives byte-identical files. The tables come from tables.py, built once
and rendered here as Markdown and in page.py as HTML.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import data as D
from . import timeline as T
from .load import Result, Run
from .tables import (LEGEND, MARK, _md, bench_order, bench_ratios, bench_table, expected_words,  # noqa: F401
                     fmt_ms, fmt_ratio, latency_table, pair_words, ratio, ratio_cell, verdict_cell, verdict_tables)

# The sections listing runs that were not as expected: outcome -> heading.
NOT_AS_EXPECTED = (("deviation", "Deviations"), ("error", "Errors"), ("skipped", "Skipped (not run here)"))


def deviations(run: Run) -> list[Result]:
    return [r for r in run.results if r.outcome == "deviation"]


def failed_checks(r: Result) -> list[dict]:
    return [c for c in r.checks if c.get("ok") is False]


def outcome_counts(run: Run) -> dict[str | None, int]:
    """Outcome (None: no verdict) -> number of scenario/target runs."""
    out: dict[str | None, int] = dict.fromkeys(MARK, 0)
    for r in run.results:
        out[r.outcome] += 1
    return out


def tally_words(run: Run) -> str:
    """``4 as expected, 0 deviation(s), 1 skipped, 0 error(s)`` (+ ``, 2 without a verdict``)."""
    c = outcome_counts(run)
    return (f"{c['as_expected']} as expected, {c['deviation']} deviation(s), {c['skipped']} skipped, "
            f"{c['error']} error(s)") + (f", {c[None]} without a verdict" if c[None] else "")


def run_facts(run: Run) -> list[str]:
    facts = []
    if run.started:
        facts.append(f"started {run.started}")
    if run.elapsed_s is not None:
        facts.append(f"took {run.elapsed_s:.1f} s")
    facts.append(f"{len(run.scenarios())} scenario(s), {len(run.results)} scenario/target pair(s)")
    return facts


def all_pairs(run: Run) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for s in run.scenarios():
        out += [p for p in run.layout(s).pairs if p not in out]
    return out


def legend(run: Run) -> str:
    pairs = all_pairs(run)
    text = LEGEND + "."
    if pairs:
        text += (f" Ratios are {pair_words(pairs)} latency under the scenario's faults (n/a when a target "
                 "stalled: it stopped issuing ops)")
        return text + "; in the latency table a stalled op counts with the time until the run gave up (a lower bound)."
    return text + " In the latency table a stalled op counts with the time until the run gave up (a lower bound)."


def bench_cost_words(run: Run) -> str:
    """``hardened ÷ legacy: **p50 ×1.04**, **p99 ×1.06**`` per pair, or "" without a baseline."""
    return "; ".join(f"{a} ÷ {b}: **p50 {fmt_ratio(r50)}**, **p99 {fmt_ratio(r99)}**"
                     for a, b, r50, r99 in bench_ratios(run))


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


def mutation_md(run_dir: Path) -> list[str]:
    """The mutation score ``pdchaos mutate`` left in the run folder (``mutate.json``), if any."""
    try:
        doc = json.loads((run_dir / "mutate.json").read_text())
        killed, total, rows = int(doc["killed"]), int(doc["total"]), list(doc["rows"])
    except (OSError, ValueError, KeyError, TypeError):
        return []
    lines = [f"#### Mutation score: {killed}/{total} killed (`pdchaos mutate`, target {_md(str(doc.get('target')))})", ""]
    for r in rows:
        if isinstance(r, dict):
            lines.append(f"- {_md(str(r.get('result', '?')))}: {_md(str(r.get('scenario', '?')))} "
                         f"[{_md(str(r.get('mutant', '?')))}]")
    return lines + [""]


def bench_plot_list(bench_plots: list[str] | str | None) -> list[str]:
    """The normal-path CDF plots, one per samples file (a single path or none is accepted)."""
    return [bench_plots] if isinstance(bench_plots, str) else list(bench_plots or [])


def triggers_md(run: Run) -> list[str]:
    """Per run that declares triggers (harness/triggers.py), the events its claim rests on as the
    ``triggers`` check saw them (a run where one did not fire is an error and says so there)."""
    rows = []
    for r in run.results:
        c = next((c for c in r.checks if c.get("name") == "triggers"), None)
        details = (c or {}).get("details") or {}
        seen = [str(x) for x in details.get("seen") or []] + [f"NOT FIRED: {x}" for x in details.get("missed") or []]
        if seen:
            rows.append(f"- {_md(r.scenario)} / {_md(r.target)}: " + "; ".join(_md(x) for x in seen))
    if not rows:
        return []
    return ["<details><summary>Triggers: the events each claim rests on, as seen</summary>", "", *rows, "",
            "</details>", ""]


INCIDENT_ROWS_MD = 20  # rows per run in summary.md: the client's and the faults' (report.html shows them all)


def incidents_md(run: Run) -> list[str]:
    """Per scenario and target that ran: its incident timeline (reports/timeline.py), folded,
    with its headline in the fold's title."""
    out = []
    for s in run.scenarios():
        for t in run.targets(s):
            r = run.get(s, t)
            if r is None or r.incident is None or r.outcome == "skipped":
                continue
            out += [f"<details><summary>{_md(s)} / {_md(t)}: {_md(r.incident.headline())}</summary>", "",
                    *T.markdown(r.incident, INCIDENT_ROWS_MD, T.KEY_STAGES)[2:], "", "</details>", ""]
    if not out:
        return []
    return ["#### Incident timelines", "",
            "Per run: fault injected (and when its effect showed in the nodes) -> first failure the client saw -> "
            "requests by terminal state -> healed and recovered; times in seconds since the run's start. "
            "report.html joins the nodes' events, gauges and counters to each.", "", *out]


def summary_md(run: Run, plots: dict[str, list[str]], bench_plots: list[str] | str | None) -> str:
    """``plots``: scenario -> plot paths relative to the run folder (in display order)."""
    lines = [f"### pd-chaos run `{_md(run.run_id)}`", "",
             _md(", ".join(run_facts(run))) + f": **{tally_words(run)}**.", ""]
    if not run.has_summary:
        lines += ["> summary.json is missing (the run did not finish): verdicts are unknown, data is from "
                  "the journals.", ""]
    for t in verdict_tables(run):
        lines += t.markdown() + [""]
    lines += [legend(run), ""]
    lines += triggers_md(run)
    lines += ["<details><summary>Latency and outcomes per scenario and target</summary>", ""]
    lines += latency_table(run).markdown() + ["", "</details>", ""]

    for view in run.bench_views():
        bt = bench_table(view)
        if bt is None:
            continue
        lines += [f"#### Normal path (no faults, `{view.bench_words()[0]}`)", ""] + bt.markdown()
        cost = bench_cost_words(view)
        if cost:
            lines += ["", f"Cost on the normal path, {cost}."]
        lines.append("")

    lines += floor_md(run.path)
    lines += mutation_md(run.path)

    for outcome, title in NOT_AS_EXPECTED:
        rs = [r for r in run.results if r.outcome == outcome]
        if not rs:
            continue
        lines += [f"#### {title}", ""]
        for r in rs:
            bad = failed_checks(r)
            head = f"- **{_md(r.scenario)} / {_md(r.target)}**: "
            if outcome == "deviation":
                head += f"{r.verdict}, expected {_md(expected_words(r.expected)) or '?'}"
                head += f": {_md(r.reason)}" if r.reason and not bad else ""
            else:
                head += _md(r.reason) or outcome
            lines.append(head)
            for c in bad:  # the reason repeats these; each on its own line reads better
                lines.append(f"  - `{_md(c.get('name', '?'))}`: {_md(c.get('message', ''))}")
        lines.append("")

    lines += incidents_md(run)

    bench_plot = bench_plot_list(bench_plots)
    if plots or bench_plot:
        lines += ["#### Plots", "", "In the run folder:", ""]
        for rel in bench_plot:
            lines.append(f"- normal path CDF: `{rel}`")
        for s in run.scenarios():
            if plots.get(s):
                lines.append(f"- {_md(s)}: " + ", ".join(f"`{p}`" for p in plots[s]))
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------- bench.json

def bench_entries(run: Run) -> list[dict[str, Any]]:
    """github-action-benchmark's ``customSmallerIsBetter`` input: ``[{name, unit, value, range?, extra?}]``."""
    out: list[dict[str, Any]] = []
    for s in run.scenarios():
        for t in run.targets(s):
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
    for i, view in enumerate(run.bench_views()):
        prefix = "normal-path" if i == 0 else f"normal-path-{view.bench_about.get('family') or i}"
        for t in bench_order(view)[0]:
            b = D.bench_stats(view.bench[t])
            if not b["n"]:
                continue
            for name in ("p50", "p99"):
                out.append({"name": f"{prefix}/{t}/{name}", "unit": "us", "value": round(b[name], 3),
                            "range": f"± {b['stdev']:.3f}", "extra": f"calls={b['n']} (stdev over all calls)"})
    return out


def bench_json(run: Run) -> str:
    return json.dumps(bench_entries(run), indent=2, ensure_ascii=False) + "\n"
