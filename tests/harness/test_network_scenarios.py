"""Network scenarios end to end: `pdchaos run` through a real toxiproxy-server, and across real
network namespaces with iptables; the run's Toxiproxy measurement floor; schema errors for toxics.

Everything is real: the CLI runs as a subprocess, starts toxiproxy-server on a free loopback port,
the lookup server and the workload as processes; the namespace scenario creates its own pair of
namespaces joined by a veth. Skipped with the reason when toxiproxy-server is absent, or when not
root / iptables or ip missing. Scenarios are short (1.5-2 s of workload, one target) to keep the
file fast.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import textwrap
from contextlib import ExitStack
from pathlib import Path

import pytest

from faults import netns
from faults.toxiproxy import ENV_BINARY, Toxiproxy, find_binary, free_port
from harness import floor
from nodekit import journal as J
from harness.services import start_toxiproxy
from harness.schema import load_all

PDCHAOS = [sys.executable, "-m", "harness.cli"]

TOXIPROXY = find_binary()
needs_toxiproxy = pytest.mark.skipif(
    TOXIPROXY is None, reason="toxiproxy-server not found (PATH, ~/go/bin/server, $PDCHAOS_TOXIPROXY_SERVER): "
                              "run .ci/install-toxiproxy.sh")
_NETNS_OK, _NETNS_WHY = netns.availability()
needs_netns = pytest.mark.skipif(not _NETNS_OK, reason=f"isolated hosts unavailable: {_NETNS_WHY}")


def write(tmp: Path, name: str, body: str) -> Path:
    p = tmp / f"{name}.yaml"
    p.write_text(textwrap.dedent(body).lstrip())
    return p


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(PDCHAOS + list(args), capture_output=True, text=True, timeout=timeout)


def only_run(runs: Path) -> Path:
    dirs = [d for d in runs.iterdir() if d.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def journal_of(run_dir: Path, scenario: str, target: str = "hardened") -> list[dict]:
    return J.read_journal(run_dir / scenario / target / "journal.jsonl")


def events(records: list[dict], what: str) -> list[dict]:
    return [r for r in records if r.get("type") == "event" and r.get("what") == what]


def checks_of(run_dir: Path, scenario: str, target: str = "hardened") -> dict[str, dict]:
    return {c["name"]: c for c in json.loads((run_dir / scenario / target / "checks.json").read_text())}


# --------------------------------------------------------------------------- through Toxiproxy

LATENCY_MS = 120

LATENCY_SCENARIO = f"""
name: e2e-toxic-latency
family: lookup
seed: 5
deadline: 500ms
targets: [hardened]
topology: {{transport: tcp, link: toxiproxy, preload_blocks: 32}}
workload: {{duration: 1500ms, concurrency: 2, rate: 40}}
faults:
  - {{type: latency, at: 500ms, for: 600ms, latency: {LATENCY_MS}ms, stream: downstream}}
triggers: [{{type: ops_in_window, fault: 0}}]
expect: {{hardened: pass}}
"""


@needs_toxiproxy
@pytest.mark.timeout(60)
def test_latency_toxic_scenario_end_to_end(tmp_path: Path) -> None:
    path = write(tmp_path, "latency", LATENCY_SCENARIO)
    runs = tmp_path / "runs"
    proc = run_cli("run", str(path), "--runs-dir", str(runs), "--no-report", "--plain")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "e2e-toxic-latency [hardened] pass" in proc.stdout
    run_dir = only_run(runs)
    recs = journal_of(run_dir, "e2e-toxic-latency")

    # the fault's start and stop, on schedule, and the toxic as read back from the server
    faults = [r for r in recs if r.get("type") == "fault"]
    assert [(f["name"], f["phase"]) for f in faults] == [("latency", "start"), ("latency", "stop")]
    assert faults[1]["healed_by"] == "schedule"
    added, removed = events(recs, "toxic added"), events(recs, "toxic removed")
    assert len(added) == 1 and len(removed) == 1
    assert added[0]["toxic_type"] == "latency" and added[0]["stream"] == "downstream"
    assert added[0]["attributes"]["latency"] == LATENCY_MS and added[0]["proxy"] == "lookup"
    assert removed[0]["toxic"] == added[0]["toxic"] and removed[0]["was_present"] is True
    t_on, t_off = added[0]["t"], removed[0]["t"]
    t0 = J.meta(recs)["t0"]
    assert 0.45 <= t_on - t0 <= 0.75 and 1.05 <= t_off - t0 <= 1.35, (t_on - t0, t_off - t0)

    # ops wholly inside the toxic's window waited for it; ops before it did not
    ops = [o for o in J.ops(recs) if o.get("f") == "lookup"]
    wrong = [(o["id"], o["outcome"], o["value"], o["expected"], o["elapsed_ms"]) for o in ops
             if o["outcome"] != "ok" or o["value"] != o["expected"]]
    assert not wrong, f"latency below the deadline, yet: {wrong[:5]}"
    # "inside": invoked once the toxic was in, and due (invoke + latency) before the nemesis even
    # began removing it at t0 + 1.1 s (a removal flushes what the toxic holds, so a reply due
    # later may come early: that is Toxiproxy's documented behaviour, not a miss)
    removal_starts = t0 + 1.1
    inside = [o["elapsed_ms"] for o in ops
              if o["t_invoke"] >= t_on and o["t_invoke"] + LATENCY_MS / 1000 + 0.01 < removal_starts]
    before = [o["elapsed_ms"] for o in ops if o["t_complete"] < t_on]
    after = [o["elapsed_ms"] for o in ops if o["t_invoke"] > t_off + 0.05]
    assert len(inside) >= 4 and len(before) >= 10 and len(after) >= 5, (len(inside), len(before), len(after))
    assert min(inside) >= LATENCY_MS - 5, inside  # every reply waited (Go timers are ~1 ms exact)
    assert statistics.median(before) < LATENCY_MS / 3, before
    assert statistics.median(after) < LATENCY_MS / 3, after  # removed toxic: fast again
    assert checks_of(run_dir, "e2e-toxic-latency")["bounded_return"]["ok"] is True


# --------------------------------------------------------------------------- across namespaces

PARTITION_SCENARIO = """
family: lookup
name: e2e-partition
seed: 6
deadline: 200ms
targets: [hardened]
topology: {transport: tcp, link: netns, preload_blocks: 32}
workload: {duration: 2s, concurrency: 2, rate: 40}
faults:
  - {type: partition, at: 500ms, for: 800ms, direction: both}
triggers: [{type: ops_in_window, fault: 0}]
expect: {hardened: pass}
"""


@needs_netns
@pytest.mark.timeout(60)
def test_partition_across_namespaces_times_out_then_recovers(tmp_path: Path) -> None:
    path = write(tmp_path, "partition", PARTITION_SCENARIO)
    runs = tmp_path / "runs"
    proc = run_cli("run", str(path), "--runs-dir", str(runs), "--no-report", "--plain")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = only_run(runs)
    recs = journal_of(run_dir, "e2e-partition")
    faults = [r for r in recs if r.get("type") == "fault"]
    assert [(f["name"], f["phase"]) for f in faults] == [("partition", "start"), ("partition", "stop")]
    cut, healed = events(recs, "partition"), events(recs, "healed")
    assert len(cut) == 1 and len(healed) == 1 and cut[0]["mode"] == "drop" and cut[0]["direction"] == "both"
    t_cut, t_heal = cut[0]["t"], healed[0]["t"]
    deadline_s = 0.2

    ops = [o for o in J.ops(recs) if o.get("f") == "lookup"]
    # invoked with the rules in place and due before they are gone: nothing can answer, every one
    # of them must come back as a timeout, within the deadline (plus scheduling noise)
    cut_off = [o for o in ops if t_cut <= o["t_invoke"] and o["t_invoke"] + deadline_s < t_heal]
    assert len(cut_off) >= 4, len(cut_off)
    assert {o["outcome"] for o in cut_off} == {"timeout"}, [(o["id"], o["outcome"]) for o in cut_off]
    assert all(o["value"] == 0 and o["elapsed_ms"] < 200 + 150 for o in cut_off)
    # after the heal: correct hits again (the first op after it included: the client rebuilt its
    # socket on each timeout, so a fresh connection is set up as soon as packets pass)
    after = sorted((o for o in ops if o["t_invoke"] > t_heal), key=lambda o: o["t_invoke"])
    assert len(after) >= 10
    assert all(o["outcome"] == "ok" and o["value"] == o["expected"] for o in after), \
        [(o["id"], o["outcome"]) for o in after if o["outcome"] != "ok"][:5]
    checks = checks_of(run_dir, "e2e-partition")
    assert checks["recovery"]["ok"] is True and checks["metrics_match"]["ok"] is True
    assert checks["no_leaks"]["ok"] is True


# --------------------------------------------------------------------------- measurement floor


def _toxiproxy_scenarios(tmp: Path):
    return load_all([str(write(tmp, "lat", LATENCY_SCENARIO))])


@needs_toxiproxy
@pytest.mark.timeout(30)
def test_start_toxiproxy_measures_the_floor_once(tmp_path: Path) -> None:
    scenarios = _toxiproxy_scenarios(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with ExitStack() as stack:
        api = start_toxiproxy(scenarios, stack, run_dir)
        assert api is not None and api.ping()
        assert api.proxies() == {}, "the floor's proxy is removed after the measurement"
    assert not api.ping(), "the server is stopped with the run's ExitStack"
    data = floor.read_floor(run_dir)
    assert data is not None and data["measured"] is True, data
    f = data["floor"]
    assert data["toxiproxy_version"] and data["took_s"] < 10
    assert 0 < f["direct_median_ms"] <= f["direct_p90_ms"] and 0 < f["proxied_median_ms"] <= f["proxied_p90_ms"]
    assert f["added_median_ms"] == pytest.approx(f["proxied_median_ms"] - f["direct_median_ms"], abs=1e-3)
    assert f["latency_configured_ms"] == 20
    assert abs(f["latency_error_ms"]) < 10, f  # a latency toxic is close to what it is told
    assert f["latency_min_ms"] >= 19, f
    assert "Toxiproxy adds" in data["text"] and "20 ms latency toxic" in data["text"]


@pytest.mark.timeout(10)
def test_floor_not_measured_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scenarios = _toxiproxy_scenarios(tmp_path)
    # an explicit binary that does not exist: find_binary answers None, as on a machine without it
    monkeypatch.setenv(ENV_BINARY, str(tmp_path / "no-such-toxiproxy-server"))
    with ExitStack() as stack:
        assert start_toxiproxy(scenarios, stack, tmp_path) is None
    data = floor.read_floor(tmp_path)
    assert data == {"measured": False, "reason": data["reason"], "text": data["text"]}
    assert "toxiproxy-server is not installed" in data["reason"]
    # a server that does not answer: the measurement failure is recorded, not raised
    dead = Toxiproxy(free_port(), timeout=0.5)
    data = floor.measure_and_write(dead, tmp_path)
    assert data["measured"] is False and "measurement failed" in data["reason"]
    assert floor.read_floor(tmp_path) == data


@pytest.mark.timeout(10)
def test_no_floor_without_toxiproxy_scenarios(tmp_path: Path) -> None:
    plain = load_all([str(write(tmp_path, "plain", """
        name: plain-tcp
        family: lookup
        topology: {transport: tcp}
        workload: {duration: 1s}
        triggers: {none: "baseline without faults"}
        expect: {hardened: pass, legacy: pass}
        """))])
    with ExitStack() as stack:
        assert start_toxiproxy(plain, stack, tmp_path) is None
    assert floor.read_floor(tmp_path) is None
    assert not (tmp_path / floor.FLOOR_FILE).exists()


@needs_toxiproxy
@pytest.mark.timeout(30)
def test_always_starts_the_server_for_scenarios_drawn_later(tmp_path: Path) -> None:
    """pdchaos explore knows no scenario when it starts: with always=True the server runs anyway
    (before, every drawn toxic was skipped as 'toxiproxy-server is not installed')."""
    with ExitStack() as stack:
        api = start_toxiproxy([], stack, tmp_path, always=True)
        assert api is not None and api.ping()
    assert not api.ping()
    assert floor.read_floor(tmp_path)["measured"] is True


# --------------------------------------------------------------------------- bad input

# Block style, so the line of the offending attribute (10 or 9) differs from the line of its fault
# entry (6). Either is a fair location; any other line is not.
BAD_HEAD = """\
name: bad-toxic
family: lookup
topology: {transport: tcp, link: toxiproxy}
workload: {duration: 2s}
faults:
  - type: TYPE
    at: 500ms
    for: 500ms
"""
ENTRY_LINE = 6


@pytest.mark.timeout(30)
@pytest.mark.parametrize("type_, attrs, bad_line, message", [
    # an attribute Toxiproxy does not have (the server itself would silently ignore it)
    ("slicer", ["average_size: 8", "avg_delay: 100us"], 10, "faults[0].avg_delay: unknown field"),
    # the fault type is also the name of one of its attributes: the error must not point at that
    # (valid) attribute's line
    ("latency", ["latency: 100ms", "jiter: 5ms"], 10, "faults[0].jiter: unknown field"),
    ("timeout", ["timeout: 0ms", "timout_ms: 5"], 10, "faults[0].timout_ms: unknown field"),
    # a value Toxiproxy cannot take
    ("latency", ["latency: 1500us"], 9, "faults[0].latency: Toxiproxy takes whole milliseconds"),
    ("bandwidth", ["rate: 10", "stream: sideways"], 10, "faults[0].stream: Input should be"),
    ("reset_peer", ["toxicity: 1.5"], 9, "faults[0].toxicity: Input should be less than or equal to 1"),
    # an unknown toxic
    ("latancy", ["latency: 100ms"], ENTRY_LINE, "faults[0]: unknown fault type 'latancy'"),
])
def test_bad_toxic_is_a_schema_error_with_its_line(tmp_path: Path, type_: str, attrs: list[str],
                                                    bad_line: int, message: str) -> None:
    body = BAD_HEAD.replace("TYPE", type_) + "".join(f"    {a}\n" for a in attrs)
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    runs = tmp_path / "runs"
    proc = run_cli("run", str(path), "--runs-dir", str(runs), "--no-report", "--plain", timeout=30)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    prefix = f"error: {path}:"
    assert lines[0].startswith(prefix), proc.stderr
    line, _, rest = lines[0][len(prefix):].partition(": ")
    assert int(line) in (bad_line, ENTRY_LINE), f"line {line} of:\n{body}"
    assert rest.startswith(message), proc.stderr
    assert not runs.exists(), "nothing starts before every scenario validated"
