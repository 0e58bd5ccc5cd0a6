"""Node gauges over time: pure functions from a journal's ``sample`` probes to the lines of the
gauges plot (``reports.gauge_plots``). Nothing here draws or touches the filesystem.

Which gauges: the family's ``gauges`` (``harness.family.Family.gauges``), which the runner writes
into the journal's meta line (a report never imports a family); a family that declares none, or a journal without ``sample``
probes, has no gauges plot. Each gauge is ``(spec, label)``; ``spec`` is

* a counter name, read from a probe's ``counters`` with :func:`counter_value`: a key matches when
  it equals the name once a ``prefix:`` is dropped (``vllm:num_requests_waiting``); when the name
  has no ``{labels}``, labelled keys of that name match too and matching values are summed;
* ``rate(NAME)``: the per-second rate of the cumulative counter NAME between two consecutive
  samples of the same process (same ``pid``), drawn at the later sample's time:
  ``(v_b - v_a) / (t_b - t_a)``; ``rate(cpu_s)`` is CPU as a fraction of one core (above 1 when
  the node's processes use several cores).

Times: ``x`` is ``t - t0`` in seconds with the same ``t0`` as the latency plots
(``reports.data.t0_of``), fault bands from ``reports.data.fault_bands``. A line (one per node
role, in the order the roles first appear among the samples) breaks (a NaN) where a sample lacks
the counter, where the process changed (a restarted node: a new ``pid``) and, for a rate, where
the counter went down.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

from harness.errors import UsageError

from . import data as D

_RATE = re.compile(r"^rate\(([^()\s]+)\)$")
_NAME = re.compile(r"^[^()\s]+$")


@dataclass(frozen=True)
class GaugeSpec:
    spec: str       # as declared: "num_requests_waiting", "rate(cpu_s)"
    counter: str    # the counter read from each sample
    rate: bool      # per-second rate of a cumulative counter
    label: str      # the panel's axis label


@dataclass(frozen=True)
class Series:
    node: str
    x: tuple[float, ...]   # s since t0
    y: tuple[float, ...]   # NaN: a break in the line


@dataclass(frozen=True)
class Panel:
    gauge: GaugeSpec
    series: tuple[Series, ...]   # only nodes that reported the gauge at least once


@dataclass(frozen=True)
class NodeGauges:
    """Everything the gauges plot of one scenario/target needs."""
    scenario: str
    target: str
    t0: float
    end: float                     # s since t0, as Timeline.end
    bands: list[D.Band]
    panels: tuple[Panel, ...]      # one per declared gauge, in the family's order
    nodes: tuple[str, ...]         # every sampled node role, in order of first appearance


def parse_gauges(declared: object, owner: str) -> tuple[GaugeSpec, ...]:
    """The family's ``gauges`` declaration, checked; UsageError naming ``owner`` and the entry."""
    if not isinstance(declared, (tuple, list)):
        raise UsageError(f"{owner}: gauges: expected a tuple of (counter, label) pairs, got {type(declared).__name__}")
    out = []
    for i, g in enumerate(declared):
        if (not isinstance(g, (tuple, list)) or len(g) != 2 or not all(isinstance(v, str) and v for v in g)):
            raise UsageError(f"{owner}: gauges[{i}]: expected a (counter, label) pair of non-empty strings, got {g!r}")
        spec, label = g
        m = _RATE.match(spec)
        if m is None and not _NAME.match(spec):
            raise UsageError(f"{owner}: gauges[{i}]: {spec!r}: expected a counter name or rate(NAME)")
        out.append(GaugeSpec(spec=spec, counter=m.group(1) if m else spec, rate=m is not None, label=label))
    return tuple(out)


def meta_gauges(meta: dict) -> tuple[GaugeSpec, ...]:
    """The gauges a run's meta line declares (the runner writes the family's ``gauges`` there, so
    a report never imports a family); none for an older run folder. A malformed declaration is a
    UsageError (see :func:`parse_gauges`)."""
    return parse_gauges(meta.get("gauges") or (), f"run {meta.get('scenario')!r} (meta line)")


def _bare(key: str, keep_labels: bool) -> str:
    head = key.split("{", 1)[0]
    if ":" in head:
        key = key.split(":", 1)[1]
    return key if keep_labels else key.split("{", 1)[0]


def counter_value(counters: object, name: str) -> float | None:
    """The value of counter ``name`` in one probe's counters (see the module docstring), or None
    when no key matches or no matching value is a finite number."""
    if not isinstance(counters, dict):
        return None
    keep = "{" in name
    vals = [float(v) for k, v in counters.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and isinstance(k, str) and _bare(k, keep) == name]
    return sum(vals) if vals else None


def samples_by_node(records: Sequence[dict]) -> dict[str, list[dict]]:
    """The ``sample`` probes with a time, per node role (first appearance order), in time order."""
    out: dict[str, list[dict]] = {}
    for r in records:
        if (r.get("type") == "probe" and r.get("when") == "sample" and isinstance(r.get("t"), (int, float))
                and not isinstance(r.get("t"), bool)):
            out.setdefault(str(r.get("node")), []).append(r)
    for ps in out.values():
        ps.sort(key=lambda p: p["t"])
    return out


def _level_series(node: str, probes: list[dict], counter: str, t0: float) -> Series | None:
    x, y, prev_pid, seen = [], [], None, False
    for p in probes:
        v = counter_value(p.get("counters"), counter)
        if x and p.get("pid") != prev_pid and not math.isnan(y[-1]):
            x.append(p["t"] - t0)  # a new process: break the line
            y.append(math.nan)
        prev_pid = p.get("pid")
        x.append(p["t"] - t0)
        y.append(math.nan if v is None else v)
        seen |= v is not None
    return Series(node, tuple(x), tuple(y)) if seen else None


def rate_series(node: str, probes: list[dict], counter: str, t0: float) -> Series | None:
    """Per-second rate of a cumulative counter between consecutive samples of one process, at the
    later sample's time; a break (NaN) where the pair is not of one process, lacks the counter, does
    not move forward in time or sees the counter go down. None: not one rate could be computed."""
    x, y, seen = [], [], False
    for a, b in zip(probes, probes[1:]):
        va, vb = counter_value(a.get("counters"), counter), counter_value(b.get("counters"), counter)
        ok = (va is not None and vb is not None and a.get("pid") == b.get("pid") and b["t"] > a["t"] and vb >= va)
        x.append(b["t"] - t0)
        y.append((vb - va) / (b["t"] - a["t"]) if ok else math.nan)
        seen |= ok
    return Series(node, tuple(x), tuple(y)) if seen else None


def node_gauges(records: list[dict], gauges: Sequence[GaugeSpec], scenario: str, target: str,
                t0: float | None = None) -> NodeGauges | None:
    """The gauges plot's data, or None: no gauge declared, no ``sample`` probe, or no sample
    reporting any declared gauge."""
    if not gauges:
        return None
    by_node = samples_by_node(records)
    if not by_node:
        return None
    t0 = D.t0_of(records) if t0 is None else t0
    panels = []
    for g in gauges:
        make = rate_series if g.rate else _level_series
        series = [s for node, ps in by_node.items() if (s := make(node, ps, g.counter, t0)) is not None]
        panels.append(Panel(g, tuple(series)))
    if not any(p.series for p in panels):
        return None
    return NodeGauges(scenario=scenario, target=target, t0=t0, end=D.end_of(records) - t0,
                      bands=D.fault_bands(records, t0), panels=tuple(panels), nodes=tuple(by_node))
