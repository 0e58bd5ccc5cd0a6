"""``gauges_png``: a family's node gauges over time for one scenario/target (data: ``reports.gauges``).

One panel per gauge, one line per node role (the same colour in every panel), sharing the time
axis; fault windows shaded, labelled and coloured as in the latency plot (``reports.plots``), and
the same margins and x range as that plot, so the two line up when read one under the other.
"""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from . import gauges as G
from .plots import _fault_handles, _save, _shade_bands, fault_colours

# Paul Tol's "bright" scheme, strong enough to read over the pale fault fills.
NODE_COLOURS = ("#4477AA", "#EE6677", "#228833", "#AA3377", "#66CCEE", "#CCBB44", "#BBBBBB")


def node_colours(nodes: tuple[str, ...]) -> dict[str, str]:
    return {n: NODE_COLOURS[i % len(NODE_COLOURS)] for i, n in enumerate(nodes)}


def gauges_png(g: G.NodeGauges, path: str | Path, *, subtitle: str = "", xmax: float | None = None) -> Path:
    """Every panel of ``g``; ``xmax``: the right end of the time axis (s since t0, before the 1 %
    margin), the latency plot's, so both share the time axis; default the journal's end."""
    xmax = max(g.end if xmax is None else xmax, 1e-3)
    colours = fault_colours([b.name for b in g.bands])
    ncol = node_colours(g.nodes)
    n = len(g.panels)
    fig = Figure(figsize=(11, 1.15 + 1.55 * n))
    top_in, bottom_in = 0.85, 0.5
    fig.subplots_adjust(left=0.085, right=0.765, top=1 - top_in / fig.get_figheight(),
                        bottom=bottom_in / fig.get_figheight(), hspace=0.42)
    axes = fig.subplots(n, 1, sharex=True, squeeze=False)[:, 0]
    fig.suptitle(f"{g.scenario} · {g.target}: node gauges" + (f"\n{subtitle}" if subtitle else ""), fontsize=12)
    for i, (ax, panel) in enumerate(zip(axes, g.panels)):
        _shade_bands(ax, g.bands, colours, label=i == 0, xmax=xmax)
        top = 0.0
        for s in panel.series:
            ax.plot(s.x, s.y, color=ncol[s.node], lw=1.4, marker="o", ms=2.2, zorder=4)
            top = max([top] + [v for v in s.y if not math.isnan(v)])
        ax.set_ylim(0, top * 1.15 if top > 0 else 1.0)
        ax.set_ylabel(panel.gauge.label, fontsize=8.5)
        ax.set_title(panel.gauge.spec + ("" if panel.series else ": no node reported it"), fontsize=9,
                     loc="left", y=1.0, color="#333333" if panel.series else "#999999")
        ax.grid(True, axis="y", color="#dddddd", lw=0.6)
        ax.grid(True, axis="x", color="#eeeeee", lw=0.6)
    axes[-1].set_xlabel("time since workload start (s)")
    axes[-1].set_xlim(0, xmax * 1.01)
    shown = [n for n in g.nodes if any(s.node == n for p in g.panels for s in p.series)]
    handles = [Line2D([], [], color=ncol[n], lw=1.6, marker="o", ms=3, label=n) for n in shown]
    handles += _fault_handles(g.bands, colours)
    axes[0].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.015, 1.0), fontsize=8.5, frameon=False,
                   borderaxespad=0)
    return _save(fig, Path(path))
