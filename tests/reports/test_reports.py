"""Reports: the data behind every plot, the PNGs, compare's exit codes, regeneration from a saved run.

Journals here are written with nodekit.journal.write_journal from made-up histories: the reports
are pure functions of journals, so a synthetic journal with known numbers is exactly their input and
lets the tests assert exact values.
"""

from __future__ import annotations

import json
import logging
import shutil
import struct
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from harness.cli import main
from harness.errors import UsageError
from nodekit.journal import write_journal
from reports import data as D
from reports import plots as P
from reports.build import generate, plan
from reports.compare import Threshold, compare_runs, parse_threshold, regressions
from reports.load import load_bench, load_run


from synthetic_runs import DEADLINE_MS, T0, _meta, make_run, scenario_journal


# ------------------------------------------------------------------ a tiny journal with known numbers
#
# t0 = 100.0; deadline 200 ms, tolerance 50 ms; the journal ends at 104.0 (end record).
#   op 0  invoke 100.0  ok    at 100.001  elapsed 1.0 ms           -> ok,        x 0.0, 1.0 ms
#   op 1  invoke 100.5  fail  at 100.7    elapsed 200.0 ms value 0 -> fail-open, x 0.5, 200 ms
#   op 2  invoke 101.0  info  at 101.002  raised, elapsed 2.0 ms   -> error,     x 1.0, 2.0 ms
#   op 3  invoke 101.5  never completes                            -> stalled,   x 1.5, 2500 ms (until 104.0)
#   op 4  invoke 102.0  info stalled at 103.0 (the runner gave up) -> stalled,   x 2.0, 1000 ms
#   op 5  invoke 102.2  ok    at 102.205, no elapsed_ms            -> ok,        x 2.2, 5.0 ms (from the times)
#   fault 0 slow_peer 100.4 -> 101.2; fault 1 silent_server 101.4 -> no stop (ends with the journal, 104.0)


def tiny_records() -> list[dict]:
    def inv(i, t):
        return {"type": "op", "id": i, "process": 0, "f": "lookup", "phase": "invoke", "t": t, "kind": "full",
                "token_len": 64, "hashes": 4, "groups": [0], "expected": 64}

    def done(i, t, phase, outcome, value, elapsed=None):
        r = {"type": "op", "id": i, "process": 0, "f": "lookup", "phase": phase, "t": t, "value": value,
             "outcome": outcome, "code": ""}
        if elapsed is not None:
            r["elapsed_ms"] = elapsed
        return r

    return [
        {"type": "meta", "scenario": "tiny", "target": "hardened", "deadline_ms": 200, "tolerance_ms": 50,
         "seed": 1, "t0": 100.0, "cap_s": 5, "checks": {}, "expect": "pass", "topology": {}, "faults": []},
        inv(0, 100.0), done(0, 100.001, "ok", "ok", 64, 1.0),
        {"type": "fault", "id": 0, "name": "slow_peer", "phase": "start", "t": 100.4, "params": {"delay": "1s"}},
        inv(1, 100.5), done(1, 100.7, "fail", "timeout", 0, 200.0),
        inv(2, 101.0), done(2, 101.002, "info", "raised", None, 2.0),
        {"type": "fault", "id": 0, "name": "slow_peer", "phase": "stop", "t": 101.2, "params": {},
         "healed_by": "schedule"},
        {"type": "fault", "id": 1, "name": "silent_server", "phase": "start", "t": 101.4, "params": {}},
        inv(3, 101.5),
        inv(4, 102.0),
        inv(5, 102.2), done(5, 102.205, "ok", "ok", 64),
        done(4, 103.0, "info", "stalled", None),
        {"type": "end", "t": 104.0, "reason": "cap", "stalled": 2},
    ]


@pytest.fixture
def tiny(tmp_path) -> D.Timeline:
    path = tmp_path / "tiny" / "hardened" / "journal.jsonl"
    write_journal(path, tiny_records())
    from nodekit.journal import read_journal

    return D.timeline(read_journal(path), "tiny", "hardened")


@pytest.mark.timeout(10)
def test_latency_points_classes_times_and_stalled_lower_bounds(tiny):
    got = [(p.id, p.cls, round(p.x, 6), round(p.latency_ms, 6)) for p in tiny.points]
    assert got == [(0, "ok", 0.0, 1.0), (1, "fail-open", 0.5, 200.0), (2, "error", 1.0, 2.0),
                   (3, "stalled", 1.5, 2500.0), (4, "stalled", 2.0, 1000.0), (5, "ok", 2.2, 5.0)]
    assert [p.x_complete is None for p in tiny.points] == [False, False, False, True, True, False]
    assert tiny.end == pytest.approx(4.0)
    assert (tiny.deadline_ms, tiny.tolerance_ms) == (200.0, 50.0)


@pytest.mark.timeout(10)
def test_fault_bands_relative_to_t0_and_open_ended(tiny):
    got = [(b.id, b.name, round(b.start, 6), round(b.stop, 6), b.open_ended) for b in tiny.bands]
    assert got == [(0, "slow_peer", 0.4, 1.2, False), (1, "silent_server", 1.4, 4.0, True)]
    assert tiny.bands[0].params == {"delay": "1s"}


@pytest.mark.timeout(10)
def test_quantile_buckets_by_invoke_time(tiny):
    q = D.quantile_buckets(tiny.points, 1.0, tiny.end)
    assert q["start"] == [0.0, 1.0, 2.0, 3.0] and q["n"] == [2, 2, 2, 0]
    assert q["p50"][:3] == pytest.approx([100.5, 1251.0, 502.5])
    assert q["p99"][0] == pytest.approx(1.0 + 0.99 * 199.0)
    assert q["max"][:3] == [200.0, 2500.0, 1000.0]
    assert q["p50"][3] is None and q["max"][3] is None  # an empty bucket is a gap, not a zero


@pytest.mark.timeout(10)
def test_throughput_counts_completions_per_second_without_stalls(tiny):
    th = D.throughput_buckets(tiny.points, 0.5, tiny.end)
    assert len(th["start"]) == 8
    # completions at 0.001 (ok), 0.7 (fail-open), 1.002 (error), 2.205 (ok); 0.5 s buckets -> x2 per second
    assert th["ok"] == [2.0, 0, 0, 0, 2.0, 0, 0, 0]
    assert th["fail-open"] == [0, 2.0, 0, 0, 0, 0, 0, 0]
    assert th["error"] == [0, 0, 2.0, 0, 0, 0, 0, 0]
    assert th["total"] == [2.0, 2.0, 2.0, 0, 2.0, 0, 0, 0]


@pytest.mark.timeout(10)
def test_stats_per_target(tiny):
    st = D.timeline_stats(tiny)
    assert (st.n, st.ok, st.fail_open, st.errors, st.stalls) == (6, 2, 1, 1, 2)
    lat = [1.0, 200.0, 2.0, 2500.0, 1000.0, 5.0]
    assert st.p50 == pytest.approx(102.5)
    assert st.p99 == pytest.approx(float(np.percentile(lat, 99)))
    assert st.max == 2500.0
    assert st.throughput == pytest.approx(4 / 4.0)  # 4 completed ops over 4 s


@pytest.mark.timeout(10)
def test_bucket_width_and_shared_limits(tiny):
    assert D.nice_bucket(6.0) == 0.2 and D.nice_bucket(0.0) == 0.01 and D.nice_bucket(40.0) == 1.0
    lo, hi = D.y_limits([tiny])
    assert lo < 1.0 and hi > 2500.0  # every point and the deadline + tolerance line fit
    other = D.Timeline("tiny", "legacy", 0.0, 1.0, 200.0, None,
                       [D.Point(0, "lookup", 0.1, 9000.0, "ok", 9.1)], [])
    assert D.y_limits([tiny, other])[1] > 9000.0  # shared: the larger of the two


@pytest.mark.timeout(10)
def test_classify_mapping():
    assert D.classify({"phase": "ok", "outcome": "ok"}) == "ok"
    assert D.classify({"phase": "fail", "outcome": "timeout", "value": 0}) == "fail-open"
    assert D.classify({"phase": "info", "outcome": "raised"}) == "error"
    assert D.classify({"phase": "info", "outcome": "stalled"}) == "stalled"


@pytest.mark.timeout(10)
def test_a_failed_op_is_named_in_its_familys_words():
    """A P/D request that failed fast with an HTTP 502 is no lookup "fail-open (returned 0)": the
    words come from the journal's meta line (the runner writes the family's failed_words), a
    journal without them gets the generic ones, a table of one family uses its column word."""
    from harness.family import get_family
    from reports.tables import failed_column

    def tl(words):
        meta = {**tiny_records()[0], **({"failed_words": words} if words is not None else {})}
        return D.timeline([meta] + tiny_records()[1:], "tiny", "hardened")

    pd_words, lookup_words = get_family("pd").failed_words, get_family("lookup").failed_words
    assert pd_words == ("failed fast", "failed fast (an HTTP error)")
    assert lookup_words == ("fail-open", "fail-open (returned 0)")
    assert P.style("fail-open", tl(list(pd_words)))["label"] == "failed fast (an HTTP error)"
    assert P.style("fail-open", tl(list(lookup_words)))["label"] == "fail-open (returned 0)"
    assert P.style("fail-open", tl(None))["label"] == D.GENERIC_FAILED_WORDS[1]
    assert P.style("fail-open", tl(["x" * 100, "y"]))["label"] == D.GENERIC_FAILED_WORDS[1]  # malformed: generic
    assert P.style("ok", tl(list(pd_words))) == P.STYLE["ok"]

    class OneRun:  # the part of reports.load.Run that failed_column reads
        def __init__(self, tls):
            self.tls = tls

        def scenarios(self):
            return list(self.tls)

        def targets(self, s):
            return ["hardened"]

        def get(self, s, t):
            from types import SimpleNamespace
            return SimpleNamespace(timeline=self.tls[s])

    assert failed_column(OneRun({"a": tl(list(pd_words)), "b": tl(list(pd_words))})) == "failed fast"
    assert failed_column(OneRun({"a": tl(list(pd_words)), "b": tl(list(lookup_words))})) == "failed"


@pytest.mark.timeout(20)
def test_renderers_make_pngs_even_from_an_empty_journal(tmp_path, tiny):
    empty = D.timeline([{"type": "meta", "scenario": "e", "target": "legacy", "t0": 5.0}], "e", "legacy")
    assert empty.points == [] and empty.bands == []
    for path in (P.timeline_png(tiny, tmp_path / "t.png"), P.timeline_png(empty, tmp_path / "e.png"),
                 P.before_after_png(empty, tiny, tmp_path / "ba.png"),
                 P.bench_cdf_png({"hardened": [100.0, 120.0, 130.0]}, tmp_path / "cdf.png")):
        assert png_size(path)[0] > 500


# ------------------------------------------------------------------ a whole synthetic run

def png_size(path: Path) -> tuple[int, int]:
    raw = path.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", raw[16:24])


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> tuple[Path, list[Path], float]:
    import time

    root = make_run(tmp_path_factory.mktemp("runs") / "run-a", scenarios=("slow-peer", "silent-server"))
    warnings: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = warnings.append
    logging.getLogger("reports").addHandler(handler)
    try:
        start = time.monotonic()
        written = generate(root, jobs=2)  # two processes: the default on the 2-core CI machine
        elapsed = time.monotonic() - start
    finally:
        logging.getLogger("reports").removeHandler(handler)
    # The worker process rendered its share: no fallback to rendering in this process.
    assert [r.getMessage() for r in warnings] == []
    return root, written, elapsed


@pytest.mark.timeout(60)
def test_generate_writes_every_output(run_dir):
    root, written, elapsed = run_dir
    names = sorted(str(p.relative_to(root)) for p in written)
    assert names == sorted([
        "plots/slow-peer--before-after.png", "plots/slow-peer--legacy.png", "plots/slow-peer--hardened.png",
        "plots/silent-server--before-after.png", "plots/silent-server--legacy.png",
        "plots/silent-server--hardened.png", "plots/normal-path-cdf.png",
        "summary.md", "report.html", "bench.json"])
    for p in written:
        assert p.stat().st_size > 0
        if p.suffix == ".png":
            w, h = png_size(p)
            assert w >= 900 and h >= 400
    print(f"synthetic run (2 scenarios x 2 targets + bench, 7 plots) rendered in {elapsed:.2f} s")


@pytest.mark.timeout(30)
def test_synthetic_run_plot_data(run_dir):
    root = run_dir[0]
    run = load_run(root)
    legacy = run.get("silent-server", "legacy").timeline
    hardened = run.get("silent-server", "hardened").timeline
    # The legacy target hangs from 3 s: one stalled op, drawn at the cap (8 s), no completions after it.
    stalled = [p for p in legacy.points if p.cls == "stalled"]
    assert len(stalled) == 1 and stalled[0].x == pytest.approx(3.0, abs=0.03)
    assert stalled[0].latency_ms == pytest.approx((8.0 - stalled[0].x) * 1000.0, abs=1.0)
    th = D.throughput_buckets(legacy.points, 1.0, legacy.end)
    assert th["total"][:3] == [40.0, 40.0, 40.0] and th["total"][4:] == [0.0] * (len(th["total"]) - 4)
    # The hardened target fails open at the deadline inside the fault window, and only there.
    fo = [p for p in hardened.points if p.cls == "fail-open"]
    band = hardened.bands[0]
    assert fo and all(band.start <= p.x < band.stop for p in fo)
    assert all(DEADLINE_MS <= p.latency_ms < DEADLINE_MS + 5 for p in fo)
    assert [(b.name, round(b.start, 3), round(b.stop, 3)) for b in legacy.bands] == [("silent_server", 3.0, 5.0)]
    q = D.quantile_buckets(hardened.points, 1.0, hardened.end)
    assert q["max"][3] == pytest.approx(max(p.latency_ms for p in fo if 3.0 <= p.x < 4.0))
    assert q["p50"][0] < 2.0  # the normal path, before the fault


@pytest.mark.timeout(30)
def test_before_after_and_timelines_share_axes_per_scenario(run_dir):
    run = load_run(run_dir[0])
    jobs, rels, bench_rels = plan(run)
    assert bench_rels == ["plots/normal-path-cdf.png"]
    assert rels["silent-server"] == ["plots/silent-server--before-after.png", "plots/silent-server--legacy.png",
                                     "plots/silent-server--hardened.png"]
    timelines = [kw for kind, rel, kw in jobs if kind == "timeline" and "silent-server" in rel]
    assert len(timelines) == 2
    ylims = {kw["ylim"] for kw in timelines}
    buckets = {kw["bucket_s"] for kw in timelines}
    assert len(ylims) == 1 and len(buckets) == 1  # legacy and hardened on the same axes and buckets
    lo, hi = ylims.pop()
    legacy = run.get("silent-server", "legacy").timeline
    assert hi > max(p.latency_ms for p in legacy.points)  # the stalled op fits, on the hardened plot too
    ba = next(kw for kind, rel, kw in jobs if kind == "before_after" and "silent-server" in rel)
    assert (ba["before"].target, ba["after"].target) == ("legacy", "hardened")
    assert D.y_limits([ba["before"], ba["after"]]) == (lo, hi)


@pytest.mark.timeout(30)
def test_summary_md_bench_json_and_html(run_dir):
    root = run_dir[0]
    md = (root / "summary.md").read_text()
    assert "| silent-server | ✅ pass | ✅ stall | n/a (legacy stalled) | n/a (legacy stalled) |" in md
    assert "**4 as expected, 0 deviation(s), 0 skipped, 0 error(s)**" in md
    assert "| scenario | hardened | legacy | p50 hardened/legacy | p99 hardened/legacy |" in md
    assert "Ratios are hardened ÷ legacy latency" in md
    assert "Cost on the normal path, hardened ÷ legacy: **p50 ×" in md
    for rel in ("plots/slow-peer--before-after.png", "plots/normal-path-cdf.png"):
        assert f"`{rel}`" in md and (root / rel).is_file()

    bench = json.loads((root / "bench.json").read_text())
    assert all(set(e) <= {"name", "unit", "value", "range", "extra"} and isinstance(e["value"], (int, float))
               for e in bench)
    by_name = {e["name"]: e for e in bench}
    run = load_run(root)
    st = run.get("slow-peer", "hardened").stats
    assert by_name["slow-peer/hardened/p99"] == {"name": "slow-peer/hardened/p99", "unit": "ms",
                                                 "value": round(st.p99, 4), "extra": by_name[
                                                     "slow-peer/hardened/p99"]["extra"]}
    samples = json.loads((root / "bench_samples.json").read_text())
    assert by_name["normal-path/legacy/p50"]["unit"] == "us"
    assert by_name["normal-path/legacy/p50"]["value"] == pytest.approx(np.percentile(samples["legacy"], 50), abs=1e-3)

    class Refs(HTMLParser):
        def __init__(self):
            super().__init__()
            self.refs, self.imgs = [], 0

        def handle_starttag(self, tag, attrs):
            self.imgs += tag == "img"
            self.refs += [v for k, v in attrs if k in ("src", "href") and v is not None]

    h = Refs()
    h.feed((root / "report.html").read_text())
    assert h.imgs == 7
    external = [r for r in h.refs if not r.startswith(("data:image/png;base64,", "#"))]
    assert external == []  # one self-contained file
    assert "<link" not in (root / "report.html").read_text()


@pytest.mark.timeout(60)
def test_report_regenerates_identically_from_a_saved_run(run_dir, tmp_path, capsys):
    root = run_dir[0]
    saved = tmp_path / "saved"
    # A saved run: only what the runner leaves behind as data (summary.json, journals, bench samples).
    shutil.copytree(root, saved, ignore=shutil.ignore_patterns("plots", "*.md", "*.html", "bench.json"))
    assert main(["report", str(saved), "--jobs", "1"]) == 0
    assert "summary.md" in capsys.readouterr().out
    for name in ("summary.md", "bench.json", "report.html"):
        assert (saved / name).read_bytes() == (root / name).read_bytes(), name
    assert sorted(p.name for p in (saved / "plots").iterdir()) == sorted(p.name for p in (root / "plots").iterdir())


@pytest.mark.timeout(20)
def test_report_bad_input_exit_2(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "not a run folder" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 2
    assert "no summary.json" in capsys.readouterr().err
    (tmp_path / "summary.json").write_text("{not json")
    assert main(["report", str(tmp_path)]) == 2
    assert "summary.json:1: not valid JSON" in capsys.readouterr().err


@pytest.mark.timeout(20)
def test_load_without_summary_and_bad_bench(tmp_path):
    write_journal(tmp_path / "tiny" / "legacy" / "journal.jsonl", tiny_records())
    run = load_run(tmp_path)  # a crashed runner: journals, no summary.json
    assert not run.has_summary and [(r.scenario, r.target, r.verdict) for r in run.results] == [
        ("tiny", "legacy", "unknown")]
    assert run.get("tiny", "legacy").stats.stalls == 2
    bad = tmp_path / "b.json"
    bad.write_text(json.dumps({"hardened": [1, "x"]}))
    with pytest.raises(UsageError, match="hardened.*list of non-negative numbers"):
        load_bench(bad)
    bad.write_text(json.dumps({"unit": "us", "n": 1}))
    with pytest.raises(UsageError, match="no samples"):
        load_bench(bad)
    bad.write_text(json.dumps({"plain": [1.0], "shouting": [2], "kinds": ["hit"]}))  # another family's targets
    assert load_bench(bad) == {"plain": [1.0], "shouting": [2.0]}
    bad.write_text(json.dumps({"unit": "ms", "hardened": [1.0]}))
    with pytest.raises(UsageError, match="microseconds"):
        load_bench(bad)
    bad.write_text(json.dumps({"unit": "us", "n": 2, "kinds": ["hit", "miss"], "hardened": [1.5, 2.0]}))
    assert load_bench(bad) == {"hardened": [1.5, 2.0]}  # pdchaos bench lookup --save: extra keys ignored


# ------------------------------------------------------------------ compare

@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("cmp")
    a = make_run(base / "a", scenarios=("normal", "slow-peer"), bench=False, run_id="main")
    b = make_run(base / "b", scenarios=("normal", "slow-peer"), bench=False, scale=1.5, run_id="pr")
    return a, b


@pytest.mark.timeout(20)
def test_compare_exit_1_on_regression_0_without(two_runs, capsys):
    a, b = two_runs
    assert main(["compare", str(a), str(b), "--fail-above", "p50:10%"]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION normal/hardened p50" in out and "×1.50" in out
    assert main(["compare", str(a), str(b), "--fail-above", "p50:60%"]) == 0  # +50% is within +60%
    assert "no regression over p50:60%" in capsys.readouterr().out
    assert main(["compare", str(b), str(a), "--fail-above", "p50:10%", "--fail-above", "p99:10%"]) == 0  # faster
    assert main(["compare", str(a), str(a), "--fail-above", "p99:0%", "--fail-above", "stalls:0"]) == 0
    assert main(["compare", str(a), str(b)]) == 0  # no threshold: a table, never a failure


@pytest.mark.timeout(20)
def test_compare_json(two_runs, capsys):
    a, b = two_runs
    assert main(["compare", str(a), str(b), "--json", "--fail-above", "p50:10%"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["run_id_a"] == "main" and doc["run_id_b"] == "pr"
    assert {(r["scenario"], r["target"]) for r in doc["rows"]} == {
        ("normal", "hardened"), ("normal", "legacy"), ("slow-peer", "hardened"), ("slow-peer", "legacy")}
    row = next(r for r in doc["rows"] if (r["scenario"], r["target"]) == ("normal", "hardened"))
    assert row["ratio"]["p50"] == pytest.approx(1.5, rel=0.01)
    assert {r["metric"] for r in doc["regressions"]} == {"p50"}


@pytest.mark.timeout(20)
def test_compare_bad_input_exit_2(two_runs, tmp_path, capsys):
    a, _ = two_runs
    for spec, msg in (("p99", "expected METRIC:PERCENT%"), ("p98:5%", "unknown metric 'p98'"),
                      ("p99:-5%", "expected METRIC:PERCENT%"), ("p99:ten%", "expected METRIC:PERCENT%")):
        assert main(["compare", str(a), str(a), "--fail-above", spec]) == 2
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err
    assert main(["compare", str(a), str(tmp_path / "missing")]) == 2
    assert "not a run folder" in capsys.readouterr().err


@pytest.mark.timeout(10)
def test_thresholds_percent_absolute_and_from_zero():
    assert parse_threshold("p99:10%") == Threshold("p99", True, 10.0, "p99:10%")
    assert parse_threshold("fail-open:2").metric == "fail_open"
    rows = [{"scenario": "s", "target": "hardened", "a": {"p99": 10.0, "stalls": 0, "max": 100.0},
             "b": {"p99": 11.5, "stalls": 1, "max": 140.0}}]
    got = {r["metric"] for r in regressions(rows, [parse_threshold("p99:10%"), parse_threshold("stalls:0"),
                                                   parse_threshold("max:50")])}
    assert got == {"p99", "stalls"}  # max grew by 40 ms, under the absolute 50 ms
    assert regressions(rows, [parse_threshold("p99:15%")]) == []
    rows[0]["b"]["p99"] = None  # no ops on one side: nothing to compare, no false alarm
    assert regressions(rows, [parse_threshold("p99:0%")]) == []
    zero = [{"scenario": "s", "target": "t", "a": {"fail_open": 0}, "b": {"fail_open": 0}}]
    assert regressions(zero, [parse_threshold("fail_open:10%")]) == []
    zero[0]["b"]["fail_open"] = 1
    assert regressions(zero, [parse_threshold("fail_open:10%")])[0]["limit"] == 0  # any rise from 0


@pytest.mark.timeout(20)
def test_compare_rows_cover_both_runs(two_runs, tmp_path):
    a, _ = two_runs
    c = make_run(tmp_path / "c", scenarios=("normal", "bad-reply"), bench=False)
    rows = compare_runs(load_run(a), load_run(c))
    keys = [(r["scenario"], r["target"]) for r in rows]
    assert ("slow-peer", "hardened") in keys and ("bad-reply", "legacy") in keys
    gone = next(r for r in rows if (r["scenario"], r["target"]) == ("slow-peer", "legacy"))
    assert gone["verdict_b"] is None and gone["b"]["p50"] is None


@pytest.mark.timeout(10)
def test_verdict_cells_and_ratio_cells():
    from reports.load import Result
    from reports.summary import ratio_cell, verdict_cell

    # the expectation names the failing checks of each alternative
    r = Result("s", "legacy", "s/legacy", verdict="pass", expected="fail[recovery]|stall[no_stall,recovery]",
               as_expected=False)
    assert verdict_cell(r) == "❌ pass (expected fail (failing: recovery) or stall (failing: no_stall, recovery))"
    # a summary written before expectations named their checks: the verdicts alone
    old = Result("s", "legacy", "s/legacy", verdict="pass", expected="fail|stall", as_expected=False)
    assert verdict_cell(old) == "❌ pass (expected fail or stall)"
    r.as_expected = True
    assert verdict_cell(r) == "✅ pass"
    # a skipped run is its own outcome, even where an older summary.json said "as_expected": true
    assert verdict_cell(Result("s", "legacy", "s/legacy", verdict="skipped", expected="pass",
                               as_expected=True)) == "⏭️ skipped"
    assert verdict_cell(Result("s", "legacy", "s/legacy", verdict="error", as_expected=False)) == "⚠️ error"
    h = Result("s", "hardened", "s/hardened", stats=D.Stats(10, 10, 0, 0, 0, 1.0, 2.0, 3.0, 4.0, 1.0, 10.0))
    lg = Result("s", "legacy", "s/legacy", stats=D.Stats(10, 10, 0, 0, 0, 0.5, 1.0, 1.5, 2.0, 1.0, 10.0))
    assert ratio_cell(h, lg, "p99") == "×2.00"
    lg.stats.stalls = 1
    assert ratio_cell(h, lg, "p99") == "n/a (legacy stalled)"
    assert ratio_cell(h, None, "p50") == "–"


# ------------------------------------------------------------------ targets from the scenario, not from names

def _three_target_run(root: Path) -> Path:
    """slow-peer with targets fast, middle, base (baseline base); normal with middle skipped."""
    targets, results = ("fast", "middle", "base"), []
    for s in ("slow-peer", "normal"):
        for t in targets:
            path = root / s / t / "journal.jsonl"
            if s == "normal" and t == "middle":
                write_journal(path, [{**_meta(s, t, "pass", [], targets=targets, baseline="base"),
                                      "skipped": "needs root"}, {"type": "end", "t": T0, "reason": "skipped"}])
                results.append({"scenario": s, "target": t, "dir": f"{s}/{t}", "verdict": "skipped",
                                "expected": "pass", "reason": "needs root", "checks": []})
                continue
            # scenario_journal's "hardened" behaviour (fail open at the deadline) for the fast target
            recs = scenario_journal(s, "hardened" if t == "fast" else t, targets=targets, baseline="base")
            recs[0]["target"] = t
            write_journal(path, recs)
            verdict = "fail" if (s, t) == ("slow-peer", "base") else "pass"
            results.append({"scenario": s, "target": t, "dir": f"{s}/{t}", "verdict": verdict,
                            "expected": "fail[bounded_return]" if verdict == "fail" else "pass",
                            "failing": ["bounded_return"] if verdict == "fail" else [],
                            "checks": [{"name": "bounded_return", "ok": verdict == "pass", "message": "m"},
                                       {"name": "recovery", "ok": None, "message": "not applicable: no fault"}]})
    (root / "summary.json").write_text(json.dumps({"run_id": "three", "results": results}))
    return root


@pytest.mark.timeout(30)
def test_columns_and_pairs_come_from_the_scenarios_targets(tmp_path):
    from reports.page import report_html
    from reports.summary import summary_md

    run = load_run(_three_target_run(tmp_path / "three"))
    assert run.targets("slow-peer") == ["fast", "middle", "base"]
    assert run.plot_targets("slow-peer") == ["base", "fast", "middle"]
    jobs, rels, _ = plan(run)
    assert rels["slow-peer"] == ["plots/slow-peer--before-after--fast.png", "plots/slow-peer--before-after--middle.png",
                                 "plots/slow-peer--base.png", "plots/slow-peer--fast.png",
                                 "plots/slow-peer--middle.png"]
    pairs = [(kw["before"].target, kw["after"].target) for kind, _, kw in jobs if kind == "before_after"]
    assert pairs == [("base", "fast"), ("base", "middle"), ("base", "fast")]  # normal: middle skipped, no plot
    assert rels["normal"] == ["plots/normal--before-after--fast.png", "plots/normal--base.png",
                              "plots/normal--fast.png"]

    md = summary_md(run, rels, None)
    assert ("| scenario | fast | middle | base | p50 fast/base | p50 middle/base | p99 fast/base | p99 middle/base |"
            in md)
    assert "| normal | ✅ pass | ⏭️ skipped | ✅ pass | " in md
    assert "**5 as expected, 0 deviation(s), 1 skipped, 0 error(s)**" in md
    assert "#### Skipped (not run here)" in md and "- **normal / middle**: needs root" in md
    assert "Ratios are fast ÷ base and middle ÷ base latency" in md
    assert "hardened" not in md and "legacy" not in md

    page = report_html(run, {}, None)
    assert "<th>p99 middle/base</th>" in page and "⏭️ skipped" in page
    # a check that does not apply is n/a, never "ok"
    assert "<td>recovery</td><td class='unk'>n/a</td><td>not applicable: no fault</td>" in page
    assert "<td>recovery</td><td class='ok'>" not in page


@pytest.mark.timeout(30)
def test_bench_samples_of_other_targets_render(tmp_path):
    root = _three_target_run(tmp_path / "three")
    (root / "bench_samples.json").write_text(json.dumps({"fast": [90.0, 100.0, 110.0], "base": [100.0, 120.0, 140.0],
                                                         "kinds": ["hit", "miss", "hit"]}))
    written = generate(root, jobs=1)
    assert root / "plots" / "normal-path-cdf.png" in written
    md = (root / "summary.md").read_text()
    assert "| fast | 3 |" in md and "| base | 3 |" in md  # the baseline last
    assert md.index("| fast | 3 |") < md.index("| base | 3 |")
    assert "Cost on the normal path, fast ÷ base: **p50 ×0.83**" in md
    names = {e["name"] for e in json.loads((root / "bench.json").read_text())}
    assert {"normal-path/fast/p50", "normal-path/base/p99"} <= names


@pytest.mark.timeout(60)
def test_each_familys_bench_samples_get_their_own_table_plot_and_entries(tmp_path):
    """``pdchaos run --bench`` over two families writes bench_samples.json and
    bench_samples-<family>.json: the report shows both, each titled from its own file."""
    root = _three_target_run(tmp_path / "three")
    (root / "bench_samples.json").write_text(json.dumps({"family": "famA", "op": "call", "unit": "us",
                                                         "fast": [90.0, 100.0, 110.0], "base": [100.0, 120.0, 140.0]}))
    (root / "bench_samples-famB.json").write_text(json.dumps({"family": "famB", "op": "request", "unit": "us",
                                                              "fast": [900.0, 1000.0], "base": [1000.0, 1100.0]}))
    written = generate(root, jobs=1)
    assert {root / "plots" / "normal-path-cdf.png", root / "plots" / "normal-path-cdf-famB.png"} <= set(written)
    md = (root / "summary.md").read_text()
    assert "#### Normal path (no faults, `pdchaos bench famA`)" in md
    assert "#### Normal path (no faults, `pdchaos bench famB`)" in md
    assert md.index("pdchaos bench famA") < md.index("pdchaos bench famB")
    names = {e["name"] for e in json.loads((root / "bench.json").read_text())}
    assert {"normal-path/fast/p50", "normal-path-famB/fast/p50", "normal-path-famB/base/p99"} <= names
    page = (root / "report.html").read_text()
    assert "pdchaos bench famB" in page and page.count('alt="normal path latency CDF"') == 2


@pytest.mark.timeout(20)
def test_old_journals_without_targets_are_read_without_their_family(tmp_path):
    """A report reads the journal and its meta line only, never a family: a run folder from
    before the meta line held targets gets them in their run order, no baseline, so no pairs (and
    no crash), whatever family it names."""
    for name, fam in (("slow-peer", None), ("normal", "no_such_family_here")):
        for t in ("legacy", "hardened"):
            recs = scenario_journal(name, t)
            for k in ("targets", "baseline_target") + (("family",) if fam is None else ()):
                del recs[0][k]
            if fam is not None:
                recs[0]["family"] = fam
            write_journal(tmp_path / name / t / "journal.jsonl", recs)
    run = load_run(tmp_path)
    for name in ("slow-peer", "normal"):
        assert run.layout(name).pairs == [] and sorted(run.targets(name)) == ["hardened", "legacy"]
