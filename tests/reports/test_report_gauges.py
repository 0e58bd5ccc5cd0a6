"""Reports: node gauges over time (reports/gauges.py, reports/gauge_plots.py).

A hand-made pd journal (two vLLM nodes sampled every 0.5 s, a proxy sampled without any gauge,
P killed from 2 s to 4 s) goes through the whole report; the numbers behind the lines are checked
on the data functions, the picture by its pixels.
"""

from __future__ import annotations

import base64
import json
import math
import struct
from pathlib import Path

import pytest

from harness.errors import UsageError
from harness.family import all_families
from nodekit.journal import read_journal, write_journal
from reports import data as D
from reports import gauges as G
from reports.build import generate, plan
from reports.load import load_run

T0 = 500.0
SCEN = "pd-gauges"
KILL = (2.0, 4.0)       # P killed (s since t0)
P_PIDS = (11, 12)       # P restarted at 4.5 s: a new process, its CPU counter starts again
D_PID = 21


def _vllm(running: int, waiting: int, usage: float, fetching: int, cpu_s: float, prefix: str = "") -> dict:
    return {f"{prefix}num_requests_running": running, f"{prefix}num_requests_waiting": waiting,
            f"{prefix}num_requests_waiting_by_reason{{reason=capacity}}": 7,  # must not count as "waiting"
            f"{prefix}kv_cache_usage_perc": usage,
            f"{prefix}num_requests_kv_fetch_by_stage{{stage=in_progress}}": fetching,
            f"{prefix}num_requests_kv_fetch_by_stage{{stage=waiting_to_start}}": 5,
            "cpu_s": cpu_s, "rss_mib": 3800.0, "metrics_ok": 1}


def d_cpu(x: float) -> float:
    """D's cumulative CPU: idle (0.02 of a core) until the kill, then one full core."""
    return 30.0 + 0.02 * min(x, KILL[0]) + 1.0 * max(x - KILL[0], 0.0)


def _pd_family():
    from families.pd.family import FAMILY

    return FAMILY


def pd_records(*, samples: bool = True) -> list[dict]:
    recs: list[dict] = [{"type": "meta", "scenario": SCEN, "file": f"{SCEN}.yaml", "family": "pd",
                         "target": "upstream", "deadline_ms": 10000.0, "tolerance_ms": 2000.0, "seed": 1,
                         "t0": T0, "cap_s": 60.0, "checks": {}, "expect": "stall[bounded_return,no_stall]", "targets": ["upstream"],
                         "baseline_target": "upstream", "topology": {}, "faults": [],
                         "gauges": [list(g) for g in _pd_family().gauges]}]  # as the runner writes it
    ev: list[tuple[float, dict]] = [
        (-1.0, {"type": "probe", "node": "prefill:0", "kind": "vllm", "when": "baseline", "pid": P_PIDS[0],
                "counters": _vllm(0, 0, 0.0, 0, 20.0)}),
        (KILL[0], {"type": "fault", "id": 0, "name": "kill", "phase": "start", "params": {"node": "prefill:0"}}),
        (KILL[1], {"type": "fault", "id": 0, "name": "kill", "phase": "stop", "params": {}, "healed_by": "schedule"}),
        (0.0, {"type": "op", "id": 0, "process": 0, "f": "complete", "phase": "invoke", "expected": "x"}),
        (0.3, {"type": "op", "id": 0, "process": 0, "f": "complete", "phase": "ok", "value": "x", "outcome": "ok",
               "elapsed_ms": 300.0}),
        (1.5, {"type": "op", "id": 1, "process": 0, "f": "complete", "phase": "invoke", "expected": "y"}),
    ]
    if samples:
        for k in range(12):  # every 0.5 s from 0.5 s to 6.0 s
            x = 0.5 * (k + 1)
            waiting = 1 if KILL[0] <= x < 5.5 else 0
            ev.append((x, {"type": "probe", "node": "decode:0", "kind": "vllm", "when": "sample", "pid": D_PID,
                           "counters": _vllm(0, waiting, 0.25 * waiting, waiting, d_cpu(x), prefix="vllm:")}))
            ev.append((x + 0.01, {"type": "probe", "node": "proxy", "kind": "pd-proxy", "when": "sample",
                                  "pid": 31, "counters": {"requests": 2, "in_flight": 1}}))
            if x < KILL[0] or x >= 4.5:  # P is dead during the kill, and restarted at 4.5 s
                pid = P_PIDS[0] if x < KILL[0] else P_PIDS[1]
                cpu = 20.0 + 0.5 * x if pid == P_PIDS[0] else 1.0 + 0.1 * (x - 4.5)
                ev.append((x + 0.02, {"type": "probe", "node": "prefill:0", "kind": "vllm", "when": "sample",
                                      "pid": pid, "counters": _vllm(1 if x == 1.5 else 0, 0, 0.5, 0, cpu)}))
    ev.append((6.5, {"type": "op", "id": 1, "process": 0, "f": "complete", "phase": "info", "value": None,
                     "outcome": "stalled"}))
    ev.append((6.5, {"type": "end", "reason": "done", "stalled": 1}))
    ev.sort(key=lambda e: e[0])
    for x, r in ev:
        r["t"] = round(T0 + x, 6)
        recs.append(r)
    return recs


def png_size(path: Path) -> tuple[int, int]:
    raw = path.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", raw[16:24])


def _rgb(hex_colour: str, alpha: float = 1.0) -> tuple[float, float, float]:
    """The colour as drawn over white with ``alpha``."""
    c = [int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    return tuple(1 - alpha + alpha * v for v in c)


def _count_pixels(img, rgb: tuple[float, float, float], tol: float = 0.02) -> int:
    import numpy as np

    return int((np.abs(img[:, :, :3] - np.asarray(rgb)) <= tol).all(axis=2).sum())


# ------------------------------------------------------------------ data


@pytest.mark.timeout(10)
def test_cpu_fraction_is_the_rate_of_cpu_s_between_samples_of_one_process():
    probes = [{"t": 10.0, "pid": 1, "counters": {"cpu_s": 5.0}},
              {"t": 10.5, "pid": 1, "counters": {"cpu_s": 5.25}},   # 0.25 s of CPU in 0.5 s
              {"t": 11.5, "pid": 1, "counters": {"cpu_s": 6.25}},   # a full core
              {"t": 12.0, "pid": 2, "counters": {"cpu_s": 0.5}},    # restarted: no rate across processes
              {"t": 12.5, "pid": 2, "counters": {"cpu_s": 1.25}},   # 1.5 cores
              {"t": 13.0, "pid": 2, "counters": {"rss_mib": 1.0}},  # no cpu_s: a break on both sides
              {"t": 13.5, "pid": 2, "counters": {"cpu_s": 2.0}},
              {"t": 14.0, "pid": 2, "counters": {"cpu_s": 2.5}},    # one core
              {"t": 14.5, "pid": 2, "counters": {"cpu_s": 0.1}}]    # went down: a break, never negative
    s = G.rate_series("decode:0", probes, "cpu_s", t0=10.0)
    assert s.node == "decode:0"
    assert s.x == pytest.approx((0.5, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5))
    got = [None if math.isnan(v) else round(v, 9) for v in s.y]
    assert got == [0.5, 1.0, None, 1.5, None, None, 1.0, None]
    assert G.rate_series("x", probes[:1], "cpu_s", 0.0) is None  # one sample: no rate
    assert G.rate_series("x", probes, "nope", 0.0) is None


@pytest.mark.timeout(10)
def test_counter_value_prefix_labels_and_sums():
    c = {"vllm:num_requests_waiting": 2, "num_requests_waiting_by_reason{reason=capacity}": 9,
         "vllm:num_requests_kv_fetch_by_stage{stage=in_progress}": 3,
         "num_requests_kv_fetch_by_stage{stage=waiting_to_start}": 4, "flag": True, "nan": float("nan"),
         "cpu_s": 1.5}
    assert G.counter_value(c, "num_requests_waiting") == 2.0
    assert G.counter_value(c, "num_requests_kv_fetch_by_stage{stage=in_progress}") == 3.0
    assert G.counter_value(c, "num_requests_kv_fetch_by_stage") == 7.0  # no labels asked: every stage
    assert G.counter_value(c, "cpu_s") == 1.5
    assert G.counter_value(c, "flag") is None and G.counter_value(c, "nan") is None
    assert G.counter_value(c, "missing") is None and G.counter_value(None, "cpu_s") is None


def pd_gauges():
    """The pd family's gauges as the runner writes them into the meta line (the report reads them there)."""
    from families.pd.family import FAMILY

    return G.meta_gauges({"scenario": SCEN, "gauges": [list(g) for g in FAMILY.gauges]})


@pytest.mark.timeout(10)
def test_node_gauges_from_a_pd_journal(tmp_path):
    path = tmp_path / "j.jsonl"
    write_journal(path, pd_records())
    recs = read_journal(path)
    g = G.node_gauges(recs, pd_gauges(), SCEN, "upstream")
    assert g.t0 == T0 and g.end == pytest.approx(6.5)
    assert g.bands == D.fault_bands(recs, T0)
    assert [(b.name, round(b.start, 6), round(b.stop, 6)) for b in g.bands] == [("kill", 2.0, 4.0)]
    assert g.nodes == ("decode:0", "proxy", "prefill:0")
    panels = {p.gauge.spec: {s.node: s for s in p.series} for p in g.panels}
    assert list(panels) == [x.spec for x in pd_gauges()]  # one panel per gauge, in order
    assert all("proxy" not in by for by in panels.values())  # sampled, but reports none of the gauges
    # D's waiting requests, read under the "vllm:" prefix, 1 from the kill until 5.5 s
    dw = panels["num_requests_waiting"]["decode:0"]
    assert dw.x == pytest.approx([0.5 * (k + 1) for k in range(12)])
    assert dw.y == (0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 0)
    # P's line breaks where the restarted process begins
    pw = panels["num_requests_running"]["prefill:0"]
    assert pw.x == pytest.approx((0.52, 1.02, 1.52, 4.52, 4.52, 5.02, 5.52, 6.02))
    assert [None if math.isnan(v) else v for v in pw.y] == [0, 0, 1, None, 0, 0, 0, 0]
    # CPU: D idles at 0.02 of a core before the kill and burns a full core during it
    dc = panels["rate(cpu_s)"]["decode:0"]
    assert dc.x == pytest.approx([0.5 * (k + 1) for k in range(1, 12)])
    assert dc.y == pytest.approx((0.02,) * 3 + (1.0,) * 8)
    pc = panels["rate(cpu_s)"]["prefill:0"]
    assert [None if math.isnan(v) else round(v, 6) for v in pc.y] == [0.5, 0.5, None, 0.1, 0.1, 0.1]


@pytest.mark.timeout(10)
def test_no_gauges_without_samples_or_declaration(tmp_path):
    write_journal(tmp_path / "j.jsonl", pd_records(samples=False))
    recs = read_journal(tmp_path / "j.jsonl")
    assert G.node_gauges(recs, pd_gauges(), SCEN, "upstream") is None
    with_samples = pd_records()
    assert G.node_gauges(with_samples, (), SCEN, "upstream") is None  # a family that declares none
    only_other = G.parse_gauges((("gpu_util", "GPU"),), "t")
    assert G.node_gauges(with_samples, only_other, SCEN, "upstream") is None  # no sample reports it
    assert G.meta_gauges({"scenario": "old"}) == ()  # a run folder from before gauges travelled in meta


@pytest.mark.timeout(10)
def test_gauge_declarations_are_checked():
    assert G.parse_gauges((("rate(cpu_s)", "CPU"),), "f") == (G.GaugeSpec("rate(cpu_s)", "cpu_s", True, "CPU"),)
    for bad, msg in (([("a", "b"), ("rate(cpu_s", "CPU")], r"family 'x': gauges\[1\]: 'rate\(cpu_s': expected"),
                     ([("a b", "A")], r"gauges\[0\]: 'a b': expected a counter name or rate\(NAME\)"),
                     ([("a", "")], r"gauges\[0\]: expected a \(counter, label\) pair"),
                     ([("a",)], r"gauges\[0\]: expected a \(counter, label\) pair"),
                     ("cpu_s", "gauges: expected a tuple of \\(counter, label\\) pairs, got str")):
        with pytest.raises(UsageError, match=msg):
            G.parse_gauges(bad, "family 'x'")
    # every family this repository has declares valid gauges
    for fam in all_families():
        G.parse_gauges(fam.gauges, fam.name)


# ------------------------------------------------------------------ the report


def _pd_run(root: Path, *, samples: bool = True) -> Path:
    write_journal(root / SCEN / "upstream" / "journal.jsonl", pd_records(samples=samples))
    (root / "summary.json").write_text(json.dumps({"run_id": "pd-gauges", "results": [
        {"scenario": SCEN, "target": "upstream", "dir": f"{SCEN}/upstream", "verdict": "stall",
         "expected": "stall[bounded_return,no_stall]", "failing": ["bounded_return", "no_stall"],
         "as_expected": True, "checks": []}]}))
    return root


@pytest.mark.timeout(60)
def test_report_draws_the_gauges_next_to_the_latency_plot(tmp_path):
    import matplotlib.image

    from reports.gauge_plots import NODE_COLOURS
    from reports.plots import FAULT_COLOURS

    root = _pd_run(tmp_path / "run")
    run = load_run(root)
    jobs, rels, _ = plan(run)
    gauge_rel = f"plots/{SCEN}--upstream--gauges.png"
    assert rels[SCEN] == [f"plots/{SCEN}--upstream.png", gauge_rel]
    kw = {rel: kw for _, rel, kw in jobs}
    # one time axis: the gauges plot ends where the latency plot does
    assert kw[gauge_rel]["xmax"] == max(run.get(SCEN, "upstream").timeline.end, kw[rels[SCEN][0]]["bucket_s"])

    written = generate(root, jobs=1)
    png = root / gauge_rel
    assert png in written
    w, h = png_size(png)
    assert w >= 900 and h >= 600  # five panels
    img = matplotlib.image.imread(png)
    # both node lines (decode first, then prefill: the order they were first sampled) and the kill band
    assert _count_pixels(img, _rgb(NODE_COLOURS[0])) > 300
    assert _count_pixels(img, _rgb(NODE_COLOURS[2])) > 100
    assert _count_pixels(img, _rgb(NODE_COLOURS[1])) == 0  # the proxy reports no gauge: no line
    assert _count_pixels(img, _rgb(FAULT_COLOURS[0], 0.28), tol=0.01) > 2000

    page = (root / "report.html").read_text()
    assert f"<summary>node gauges: <code>{gauge_rel}</code></summary>" in page
    assert base64.b64encode(png.read_bytes()).decode("ascii") in page  # inlined
    assert page.index(f"<code>plots/{SCEN}--upstream.png</code>") < page.index(f"<code>{gauge_rel}</code>")
    assert f"`{gauge_rel}`" in (root / "summary.md").read_text()


@pytest.mark.timeout(60)
def test_no_gauge_plot_without_samples_and_stale_one_removed(tmp_path):
    root = _pd_run(tmp_path / "run")
    generate(root, jobs=1)
    assert (root / "plots" / f"{SCEN}--upstream--gauges.png").is_file()
    (root / SCEN / "upstream" / "journal.jsonl").unlink()  # write_journal appends
    _pd_run(root, samples=False)  # the same run folder, its journal now without samples
    written = generate(root, jobs=1)
    assert [p.name for p in written if p.suffix == ".png"] == [f"{SCEN}--upstream.png"]
    assert not (root / "plots" / f"{SCEN}--upstream--gauges.png").exists()
    assert "node gauges" not in (root / "report.html").read_text()


@pytest.mark.timeout(60)
def test_lookup_run_has_no_gauge_plot_and_no_error(tmp_path):
    recs = [{"type": "meta", "scenario": "lk", "family": "lookup", "target": "hardened", "t0": 10.0,
             "deadline_ms": 200, "tolerance_ms": 50, "targets": ["hardened", "legacy"], "baseline_target": "legacy"},
            {"type": "op", "id": 0, "process": 0, "f": "lookup", "phase": "invoke", "t": 10.0, "expected": 64},
            {"type": "op", "id": 0, "process": 0, "f": "lookup", "phase": "ok", "t": 10.001, "value": 64,
             "outcome": "ok", "elapsed_ms": 1.0},
            # a sample probe with counters: the lookup family declares no gauges, so still no plot
            {"type": "probe", "node": "server", "kind": "lookup-server", "when": "sample", "t": 10.5, "pid": 3,
             "counters": {"cpu_s": 1.0, "requests": 1}},
            {"type": "end", "t": 11.0, "reason": "done", "stalled": 0}]
    write_journal(tmp_path / "lk" / "hardened" / "journal.jsonl", recs)
    written = generate(tmp_path, jobs=1)
    assert sorted(p.name for p in written if p.suffix == ".png") == ["lk--hardened.png"]
    assert load_run(tmp_path).get("lk", "hardened").gauges is None
    assert "node gauges" not in (tmp_path / "report.html").read_text()


@pytest.mark.timeout(90)
def test_gauge_plots_render_in_the_worker_processes(tmp_path):
    import logging

    root = tmp_path / "run"
    results = []
    for k in range(3):  # 3 timelines + 3 gauges plots: enough jobs for the worker processes
        recs = pd_records()
        recs[0]["scenario"] = s = f"{SCEN}-{k}"
        write_journal(root / s / "upstream" / "journal.jsonl", recs)
        results.append({"scenario": s, "target": "upstream", "dir": f"{s}/upstream", "verdict": "stall",
                        "expected": "stall[bounded_return,no_stall]", "failing": ["bounded_return", "no_stall"],
                        "as_expected": True, "checks": []})
    (root / "summary.json").write_text(json.dumps({"run_id": "par", "results": results}))
    warnings: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = warnings.append
    logging.getLogger("reports").addHandler(handler)
    try:
        written = generate(root, jobs=2)
    finally:
        logging.getLogger("reports").removeHandler(handler)
    assert [r.getMessage() for r in warnings] == []  # the worker rendered its share, gauges included
    gauges = sorted(p.name for p in written if p.name.endswith("--gauges.png"))
    assert gauges == [f"{SCEN}-{k}--upstream--gauges.png" for k in range(3)]
    assert all(png_size(root / "plots" / n)[1] >= 600 for n in gauges)
