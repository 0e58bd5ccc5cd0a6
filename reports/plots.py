"""PNG renderers (matplotlib, Agg, headless). They draw what ``reports.data`` computes, nothing more.

Figures are built with ``matplotlib.figure.Figure`` and the Agg canvas directly, not pyplot: no
global figure registry, no backend selection, nothing shown, safe in any process.

- ``timeline_png``: one scenario/target, three panels sharing the time axis: every op as a point
  (log latency, coloured by outcome class, fault windows shaded and labelled, deadline line),
  latency quantiles per time bucket, and completed ops/s per bucket.
- ``before_after_png``: a scenario's baseline target (before) and another target (after) side by
  side, same axes.
- ``bench_cdf_png``: normal-path latency CDF overlay from a bench samples file, one curve per target.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

from . import data as D

DPI = 90
_LABEL_PT = 7.5  # fault window labels

# Outcome colours from Paul Tol's colour-blind-safe "bright" and "vibrant" schemes; error and stalled
# also have their own marker shapes, so the classes read apart without colour too.
STYLE = {
    "ok": dict(color="#4477AA", marker="o", ms=3.0, alpha=0.6, label="ok"),
    "fail-open": dict(color="#EE7733", marker="o", ms=4.5, alpha=0.85, label="failed"),  # label: the family's
    "error": dict(color="#CC3311", marker="X", ms=6.0, alpha=0.9, label="error (raised)"),
    "stalled": dict(color="#AA3377", marker="^", ms=7.0, alpha=0.95, label="stalled (never returned)"),
}


def style(cls: str, tl: D.Timeline) -> dict:
    """An outcome class's style; the failed class in its family's words (the journal's meta line:
    e.g. "fail-open (returned 0)" for a client that returns 0, "failed fast (an HTTP error)")."""
    if cls == "fail-open":
        return {**STYLE[cls], "label": tl.failed_words[1]}
    return STYLE[cls]


QUANTILE_STYLE = {"p50": ("#4477AA", "-"), "p95": ("#228833", "-"), "p99": ("#EE7733", "-"),
                  "max": ("#AA3377", ":")}
# Pale fills for fault windows, one per fault name.
FAULT_COLOURS = ("#CCBB44", "#66CCEE", "#EE6677", "#AA88CC", "#BBBBBB", "#99DDAA", "#FFAABB", "#77AADD")


def fault_colours(names: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for n in names:
        if n not in out:
            out[n] = FAULT_COLOURS[len(out) % len(FAULT_COLOURS)]
    return out


def _ms_formatter(v: float, _pos: object) -> str:
    """Tick labels with their unit: 0.1 ms, 10 ms, 1 s, 100 s."""
    if v <= 0:
        return ""
    if v >= 1000:
        return f"{v / 1000:g} s"
    return f"{v:g} ms"


def _log_y(ax, lo: float, hi: float) -> None:
    ax.set_yscale("log")
    ax.set_ylim(lo, hi)
    ax.yaxis.set_major_locator(LogLocator(base=10, numticks=12))
    ax.yaxis.set_major_formatter(FuncFormatter(_ms_formatter))
    ax.yaxis.set_minor_locator(NullLocator())  # minor log ticks cost a third of the render time
    ax.grid(True, which="major", axis="y", color="#dddddd", lw=0.6)
    ax.grid(True, which="major", axis="x", color="#eeeeee", lw=0.6)


def _headroom(lo: float, hi: float, frac: float = 0.84) -> float:
    """Upper log limit such that ``hi`` sits at ``frac`` of the axis height (room for fault labels)."""
    return lo * (hi / lo) ** (1.0 / frac)


def _shade_bands(ax, bands: Sequence[D.Band], colours: dict[str, str], *, label: bool, xmax: float) -> None:
    if not bands:
        return
    # One collection for all fills and one for all edges (an artist per band is slow with many bands).
    # x in data, y in axes coordinates: the bands span the full height whatever the y limits.
    tr = ax.get_xaxis_transform()
    ax.add_collection(PolyCollection([[(b.start, 0), (b.stop, 0), (b.stop, 1), (b.start, 1)] for b in bands],
                                     facecolors=[colours[b.name] for b in bands], alpha=0.28, linewidths=0,
                                     transform=tr, zorder=0), autolim=False)
    # Edges on top, so a window still shows behind the throughput bars.
    ax.add_collection(LineCollection([[(x, 0), (x, 1)] for b in bands for x in (b.start, b.stop)],
                                     colors=[colours[b.name] for b in bands for _ in (0, 1)], linewidths=1.0,
                                     alpha=0.9, transform=tr, zorder=6), autolim=False)
    if not label:
        return
    rows_end: list[float] = []  # per label row: axes-fraction x where the last label ends
    x_lo, x_hi = 0.0, max(xmax, 1e-9) * 1.01  # the x limits every plot here sets
    # Label widths as a fraction of the axes, estimated without a draw (measuring text needs a
    # renderer and a layout pass): DejaVu Sans averages under 0.62 em per character.
    axes_in = max(ax.get_position().width * ax.figure.get_figwidth(), 1.0)
    per_char = 0.62 * _LABEL_PT / 72.0 / axes_in
    for b in bands:
        text = b.name + (" (no stop)" if b.open_ended else "")
        x0 = (max(b.start, x_lo) - x_lo) / (x_hi - x_lo)
        width = per_char * (len(text) + 2)
        row = next((i for i, e in enumerate(rows_end) if e <= x0), None)
        if row is None and len(rows_end) < 3:
            rows_end.append(0.0)
            row = len(rows_end) - 1
        if row is None:
            continue  # no room: the legend still names it by colour
        rows_end[row] = x0 + width
        # Above the edge lines; pulled left when it would run past the right end of the axes.
        ax.text(max(min(x0, 1.0 - width), 0.0), 0.98 - 0.075 * row, " " + text, transform=ax.transAxes,
                ha="left", va="top", fontsize=_LABEL_PT, color="#333333", clip_on=True, zorder=7,
                bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none", alpha=0.6))


def _deadline_lines(ax, tl: D.Timeline) -> list:
    handles = []
    if tl.deadline_ms:
        # Under the points (fail-open ops sit right on it) and light enough not to hide them.
        handles.append(ax.axhline(tl.deadline_ms, color="#444444", ls="--", lw=0.9, zorder=3,
                                  label=f"deadline {tl.deadline_ms:g} ms"))
        if tl.tolerance_ms:
            handles.append(ax.axhline(tl.deadline_ms + tl.tolerance_ms, color="#555555", ls=":", lw=1.0, zorder=3,
                                      label=f"deadline + tolerance {tl.deadline_ms + tl.tolerance_ms:g} ms"))
    return handles


def draw_latency(ax, tl: D.Timeline, ylim: tuple[float, float], colours: dict[str, str], *,
                 label_bands: bool = True, xmax: float | None = None) -> list:
    """Raw latency: every op a point at its invoke time. Returns legend handles."""
    xmax = tl.end if xmax is None else xmax
    _shade_bands(ax, tl.bands, colours, label=label_bands, xmax=xmax)
    handles = []
    for cls in D.OUTCOME_CLASSES:
        pts = [p for p in tl.points if p.cls == cls and math.isfinite(p.latency_ms)]
        if not pts:
            continue
        st = style(cls, tl)
        y = np.maximum([p.latency_ms for p in pts], ylim[0] * 1.05)  # a 0 ms op still shows, at the floor
        (h,) = ax.plot([p.x for p in pts], y, ls="none", marker=st["marker"], ms=st["ms"], color=st["color"],
                       alpha=st["alpha"], mew=0, zorder=4,
                       label=f"{st['label']}: {len(pts)}")
        handles.append(h)
    handles += _deadline_lines(ax, tl)
    _log_y(ax, ylim[0], _headroom(*ylim))
    ax.set_ylabel("latency (log scale)")
    if not tl.points:
        ax.text(0.5, 0.5, "no operations recorded", transform=ax.transAxes, ha="center", va="center",
                fontsize=10, color="#777777")
    return handles


def draw_quantiles(ax, tl: D.Timeline, q: dict, ylim: tuple[float, float], colours: dict[str, str]) -> list:
    _shade_bands(ax, tl.bands, colours, label=False, xmax=tl.end)
    centers = [s + q["width"] / 2 for s in q["start"]]
    handles = []
    for name in ("p50", "p95", "p99", "max"):
        colour, ls = QUANTILE_STYLE[name]
        y = [v if v is not None else np.nan for v in q[name]]
        y = [max(v, ylim[0] * 1.05) if not np.isnan(v) else v for v in y]
        (h,) = ax.plot(centers, y, color=colour, ls=ls, lw=1.3, marker="o", ms=2.5, label=name, zorder=4)
        handles.append(h)
    handles += _deadline_lines(ax, tl)
    _log_y(ax, ylim[0], _headroom(*ylim, frac=0.92))
    ax.set_ylabel("latency (log scale)")
    return handles


def draw_throughput(ax, tl: D.Timeline, th: dict, colours: dict[str, str], ymax: float | None = None) -> list:
    _shade_bands(ax, tl.bands, colours, label=False, xmax=tl.end)
    bottom = np.zeros(len(th["start"]))
    edges = np.append(np.asarray(th["start"], dtype=float), th["start"][-1] + th["width"]) if th["start"] else None
    handles = []
    for cls in ("ok", "fail-open", "error"):
        v = np.asarray(th[cls], dtype=float)
        if not v.any():
            continue
        # Stacked steps, one patch per class (ax.bar makes a patch per bucket, which is slow).
        h = ax.stairs(bottom + v, edges, baseline=bottom.copy(), fill=True, color=STYLE[cls]["color"], alpha=0.85,
                      lw=0, label=style(cls, tl)["label"].split(" (")[0], zorder=3)
        bottom += v
        handles.append(h)
    top = ymax if ymax is not None else (float(bottom.max()) if bottom.size else 0.0)
    ax.set_ylim(0, top * 1.12 if top > 0 else 1.0)
    ax.set_ylabel("ops/s")
    ax.grid(True, axis="y", color="#dddddd", lw=0.6)
    return handles


def _fault_handles(bands: Sequence[D.Band], colours: dict[str, str]) -> list:
    names: dict[str, int] = {}
    for b in bands:
        names[b.name] = names.get(b.name, 0) + 1
    return [Patch(color=colours[n], alpha=0.45, lw=0, label=f"fault: {n}" + (f" (×{k})" if k > 1 else ""))
            for n, k in names.items()]


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=DPI, format="png", metadata={"Software": None})
    return path


def timeline_png(tl: D.Timeline, path: str | Path, *, subtitle: str = "", bucket_s: float | None = None,
                 ylim: tuple[float, float] | None = None) -> Path:
    """Raw latency, quantiles and throughput of one scenario/target, sharing the time axis."""
    width = bucket_s or D.nice_bucket(tl.end)
    q = D.quantile_buckets(tl.points, width, tl.end)
    th = D.throughput_buckets(tl.points, width, tl.end)
    ylim = ylim or D.y_limits([tl])
    colours = fault_colours([b.name for b in tl.bands])

    # Fixed margins, not constrained layout: the sizes are known and it halves the render time.
    fig = Figure(figsize=(11, 8.6))
    fig.subplots_adjust(left=0.085, right=0.765, top=0.895, bottom=0.065, hspace=0.32)
    axes = fig.subplots(3, 1, sharex=True, height_ratios=[3, 2, 1.5])
    fig.suptitle(f"{tl.scenario} · {tl.target}" + (f"\n{subtitle}" if subtitle else ""), fontsize=12)
    legend = dict(loc="upper left", bbox_to_anchor=(1.015, 1.0), fontsize=8.5, frameon=False, borderaxespad=0)
    h1 = draw_latency(axes[0], tl, ylim, colours) + _fault_handles(tl.bands, colours)
    axes[0].set_title("every operation at its invoke time (stalled: drawn at the time the run gave up)",
                      fontsize=9.5, loc="left", y=1.0)
    axes[0].legend(handles=h1, **legend)
    h2 = draw_quantiles(axes[1], tl, q, ylim, colours)
    axes[1].set_title(f"latency quantiles per {width:g} s of invoke time (a stalled op counts as a lower bound)",
                      fontsize=9.5, loc="left", y=1.0)
    axes[1].legend(handles=h2, **legend)
    h3 = draw_throughput(axes[2], tl, th, colours)
    axes[2].set_title(f"throughput: completed ops per second, per {width:g} s of completion time",
                      fontsize=9.5, loc="left", y=1.0)
    if h3:
        axes[2].legend(handles=h3, **legend)
    axes[2].set_xlabel("time since workload start (s)")
    axes[2].set_xlim(0, max(tl.end, width) * 1.01)
    return _save(fig, Path(path))


def before_after_png(before: D.Timeline, after: D.Timeline, path: str | Path, *,
                     titles: tuple[str, str] = ("", ""), bucket_s: float | None = None) -> Path:
    """The baseline (before, left) and another target (after, right) on the same axes: raw latency
    and throughput."""
    end = max(before.end, after.end)
    width = bucket_s or D.nice_bucket(end)
    ylim = D.y_limits([before, after])
    colours = fault_colours([b.name for b in before.bands + after.bands])
    ths = [D.throughput_buckets(tl.points, width, end) for tl in (before, after)]
    th_max = max(max(t["total"], default=0.0) for t in ths)

    n_leg = sum(1 for c in D.OUTCOME_CLASSES if any(p.cls == c for p in before.points + after.points)) + 2 + len(
        {b.name for b in before.bands + after.bands})
    fig = Figure(figsize=(13, 7.2))
    fig.subplots_adjust(left=0.07, right=0.985, top=0.9, bottom=0.105 + 0.03 * math.ceil(n_leg / 3),
                        hspace=0.14, wspace=0.08)
    axes = fig.subplots(2, 2, sharex=True, height_ratios=[3, 1.3])
    fig.suptitle(f"{before.scenario}: before ({before.target}) and after ({after.target}), same axes", fontsize=12)
    for col, (tl, th, sub) in enumerate(zip((before, after), ths, titles)):
        ax, axt = axes[0, col], axes[1, col]
        draw_latency(ax, tl, ylim, colours, xmax=end)
        ax.set_title(f"{'before' if col == 0 else 'after'}: {tl.target}" + (f" · {sub}" if sub else ""),
                     fontsize=10.5, loc="left", y=1.0)
        draw_throughput(axt, tl, th, colours, ymax=th_max)
        axt.set_xlabel("time since workload start (s)")
        if col == 1:  # same axes: the right column repeats neither labels nor tick labels
            for a in (ax, axt):
                a.set_ylabel("")
                a.tick_params(labelleft=False)
    axes[1, 0].set_xlim(0, max(end, width) * 1.01)
    # One legend for both columns, with the count of each outcome per column.
    leg: list = []
    for cls in D.OUTCOME_CLASSES:
        n_b = sum(1 for p in before.points if p.cls == cls)
        n_a = sum(1 for p in after.points if p.cls == cls)
        if n_b or n_a:
            st = style(cls, after)
            leg.append(Line2D([], [], ls="none", marker=st["marker"], ms=st["ms"] + 1, color=st["color"],
                              label=f"{st['label']}: {before.target} {n_b}, {after.target} {n_a}"))
    tl = before if before.deadline_ms else after
    if tl.deadline_ms:
        leg.append(Line2D([], [], color="#444444", ls="--", lw=0.9, label=f"deadline {tl.deadline_ms:g} ms"))
        if tl.tolerance_ms:
            leg.append(Line2D([], [], color="#555555", ls=":", lw=1.0,
                              label=f"deadline + tolerance {tl.deadline_ms + tl.tolerance_ms:g} ms"))
    seen = set()
    leg += _fault_handles([b for b in before.bands + after.bands if not (b.name in seen or seen.add(b.name))],
                          colours)
    fig.legend(handles=leg, loc="lower center", bbox_to_anchor=(0.5, 0.0), ncols=3, fontsize=8.5, frameon=False)
    return _save(fig, Path(path))


def _us_formatter(v: float, _pos: object) -> str:
    if v <= 0:
        return ""
    if v >= 1000:
        return f"{v / 1000:g} ms"
    return f"{v:g} µs"


def _fmt_us(v: float) -> str:
    if v >= 1000:
        return f"{v / 1000:.3g} ms"
    return f"{v:.3g} µs"


BENCH_COLOURS = ("#4477AA", "#228833", "#AA3377", "#66CCEE", "#CCBB44")  # after targets, in order
BASELINE_COLOUR = "#EE7733"


def bench_cdf_png(samples: dict[str, list[float]], path: str | Path, *, title: str = "",
                  baseline: str | None = None, command: str = "pdchaos bench", op: str = "op") -> Path:
    """Normal-path latency CDF (left) and its tail, fraction of calls at or above x (right, log), one
    curve per target; with ``baseline``, the title gives each other target's p50 and p99 ÷ baseline."""
    fig = Figure(figsize=(12, 5.0))
    fig.subplots_adjust(left=0.07, right=0.965, top=0.84, bottom=0.215, wspace=0.2)
    ax, axt = fig.subplots(1, 2)
    title = title or f"normal path: {op} latency without faults ({command})"
    base = D.bench_stats(samples[baseline]) if baseline in samples else None
    for t, v in samples.items():
        if base is None or t == baseline or not v or not base["p50"] or not base["p99"]:
            continue
        s = D.bench_stats(v)
        title += f"\n{t} ÷ {baseline}: p50 ×{s['p50'] / base['p50']:.2f}, p99 ×{s['p99'] / base['p99']:.2f}"
    fig.suptitle(title, fontsize=12)
    others = [t for t in samples if t != baseline]
    colours = {t: BENCH_COLOURS[i % len(BENCH_COLOURS)] for i, t in enumerate(others)}
    order = others
    if baseline in samples:
        colours[baseline] = BASELINE_COLOUR
        order = [baseline] + others
    lo, hi = math.inf, 0.0
    handles = []
    for t in order:
        s = D.bench_stats(samples[t])
        v = [x for x in samples[t] if x > 0]
        if not v:
            continue
        xs, ys = D.ecdf(v)
        label = f"{t}: {s['n']} calls, p50 {_fmt_us(s['p50'])}, p90 {_fmt_us(s['p90'])}, p99 {_fmt_us(s['p99'])}"
        (h,) = ax.step(xs, ys, where="post", color=colours.get(t), lw=1.6, label=label)
        handles.append(h)
        # Survival: fraction of calls >= x; on (xs[i-1], xs[i]] it is (n - i + 1) / n, ending at 1/n (never 0).
        axt.step(xs, 1.0 - ys + 1.0 / len(xs), where="pre", color=colours.get(t), lw=1.6)
        lo, hi = min(lo, float(xs[0])), max(hi, float(xs[-1]))
    if not handles:
        lo, hi = 1.0, 1000.0
    for a in (ax, axt):
        a.set_xscale("log")
        a.set_xlim(lo / 1.3, hi * 1.3)
        a.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        a.xaxis.set_major_formatter(FuncFormatter(_us_formatter))
        a.xaxis.set_minor_formatter(FuncFormatter(lambda *_: ""))
        a.set_xlabel(f"{op} latency (log scale)")
        a.grid(True, which="major", color="#dddddd", lw=0.6)
    ax.axhline(0.5, color="#888888", ls=":", lw=0.9)
    ax.text(lo / 1.25, 0.5, "p50", va="bottom", ha="left", fontsize=8, color="#555555")
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("fraction of calls ≤ x")
    ax.set_title("CDF", fontsize=10, loc="left", y=1.0)
    axt.set_yscale("log")
    axt.set_ylabel("fraction of calls ≥ x (log scale)")
    axt.set_title("tail: 1 − CDF", fontsize=10, loc="left", y=1.0)
    for q, lab in ((0.1, "p90"), (0.01, "p99"), (0.001, "p99.9")):
        axt.axhline(q, color="#888888", ls=":", lw=0.9)
        axt.text(lo / 1.25, q, lab, va="bottom", ha="left", fontsize=8, color="#555555")
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.0), ncols=1, fontsize=9, frameon=False)
    return _save(fig, Path(path))
