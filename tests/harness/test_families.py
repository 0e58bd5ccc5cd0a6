"""The family seams: a second system under test plugs in by adding files, not by editing the core.

The toy ``echo_family`` (tests/toy_family/) brings its own topology and workload blocks, node
kinds, workload, a check and a fault; it is found by module path (it is on PYTHONPATH only for
these tests) and runs through the real ``pdchaos run``, with real node processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]
TOY = HERE / "toy_family"
PDCHAOS = [sys.executable, "-m", "harness.cli"]


def cli(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TOY), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(PDCHAOS + list(args), capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.timeout(120)
def test_toy_family_runs_through_pdchaos_run(tmp_path: Path) -> None:
    r = cli("run", str(TOY / "yaml"), "--runs-dir", str(tmp_path), "--plain", "--no-report")
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = next(tmp_path.iterdir())
    results = {(x["scenario"], x["target"]): x for x in json.loads((run_dir / "summary.json").read_text())["results"]}
    assert set(results) == {("echo-kill", "plain"), ("echo-kill", "shouting"), ("echo-garble", "plain")}
    assert results[("echo-kill", "plain")]["verdict"] == "pass"
    assert results[("echo-garble", "plain")]["verdict"] == "fail"  # caught by the family's own check
    checks = {c["name"]: c for c in results[("echo-garble", "plain")]["checks"]}
    assert checks["echo_matches"]["ok"] is False
    # generic checks ran on the toy's history, with the generic kill fault by role
    kill = {c["name"]: c for c in results[("echo-kill", "plain")]["checks"]}
    for name in ("bounded_return", "recovery", "no_leaks", "no_stall", "node_alive", "harness_integrity",
                 "failures_explained", "fault_effect"):
        assert kill[name]["ok"] is True, kill[name]
    # the kill was seen (the process gone), and every echo it failed lies in its window
    assert kill["fault_effect"]["details"]["judged"] == 1, kill["fault_effect"]
    # a check that does not apply is reported as such, never as passing
    shout = {c["name"]: c for c in results[("echo-kill", "shouting")]["checks"]}
    assert shout["echo_matches"]["ok"] is None and shout["echo_matches"]["message"].startswith("not applicable")
    # the journal is the family's: its meta names the family, its ops are echoes
    journal = [json.loads(line) for line in (run_dir / "echo-kill" / "plain" / "journal.jsonl").open()]
    assert next(r for r in journal if r["type"] == "meta")["family"] == "echo_family"
    assert {r.get("f") for r in journal if r["type"] == "op"} == {"echo"}
    assert any(r["type"] == "event" and r["what"] == "process_kill" and r["role"] == "server" for r in journal)
    # a node's own part of the journal (the echo server's state transitions) is merged in time order
    garble = [json.loads(line) for line in (run_dir / "echo-garble" / "plain" / "journal.jsonl").open()]
    states = [r for r in garble if r["type"] == "event" and r["what"] == "echo_garble"]
    assert [r["on"] for r in states] == [True, False]
    # the fault prepared before t0 (never inside its window) and was released after its heal
    t0 = garble[0]["t0"]
    prep = [r for r in garble if r.get("what") in ("echo_garble_prepare", "fault_prepared")]
    assert [r["what"] for r in prep] == ["echo_garble_prepare", "fault_prepared"] and prep[-1]["t"] < t0
    stop = next(r for r in garble if r["type"] == "fault" and r["phase"] == "stop")
    (release,) = [r for r in garble if r.get("what") == "echo_garble_release"]
    assert stop["t"] < release["t"]
    (started,) = [r for r in garble if r.get("what") == "fault_started"]
    assert started["fault"] == "echo_garble" and 0 <= started["s"] < 5
    times = [r["t"] for r in garble if "t" in r and r["type"] != "meta"]
    assert times == sorted(times) and garble[0]["type"] == "meta" and garble[-1]["type"] == "end"
    assert not list((run_dir / "echo-garble" / "plain").glob("*.part.jsonl"))
    # offline re-check gives the same verdicts
    again = cli("check", str(run_dir))
    assert again.returncode == 0 and "DEVIATION" not in again.stdout, again.stdout + again.stderr


def test_toy_family_is_listed_and_validated(tmp_path: Path) -> None:
    r = cli("list", str(TOY / "yaml"))
    assert r.returncode == 0 and "echo_family" in r.stdout and "shouting=pass" in r.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(textwrap.dedent("""\
        name: bad
        family: echo_family
        workload: {duration: 1s, rate: 20, mix: {full: 1}}
        """))
    r = cli("validate", str(bad))
    assert r.returncode == 2 and f"{bad}:3: workload.mix: unknown field" in r.stderr, r.stderr
    # another family's fault is no fault of this one
    bad.write_text("name: bad\nfamily: echo_family\nfaults:\n  - {type: server_kill, at: 1s, for: 1s}\n")
    r = cli("validate", str(bad))
    assert r.returncode == 2 and "unknown fault type 'server_kill'" in r.stderr and "echo_garble" in r.stderr
    assert "Traceback" not in r.stderr
    # and a target of another family is refused at its line
    bad.write_text("name: bad\nfamily: echo_family\nexpect: {hardened: pass}\n")
    r = cli("validate", str(bad))
    assert r.returncode == 2 and f"{bad}:3: expect.hardened" in r.stderr, r.stderr


def test_unknown_family_is_one_clear_error(tmp_path: Path) -> None:
    f = tmp_path / "x.yaml"
    f.write_text("name: x\nfamily: nosuchfamily\n")
    r = cli("validate", str(f))
    assert r.returncode == 2 and f"{f}:2: family: unknown family 'nosuchfamily'" in r.stderr, r.stderr
    assert "lookup" in r.stderr and "Traceback" not in r.stderr


def test_lookup_family_files_still_validate_unchanged() -> None:
    r = cli("validate", str(HERE.parent / "scenarios"))
    assert r.returncode == 0, r.stderr
    r = cli("list", "--families")
    assert r.returncode == 0 and "lookup" in r.stdout and "hardened, legacy" in r.stdout


SLOW_START = """
name: echo-slow-start
family: echo_family
deadline: 200ms
cap: 4s
topology: {start_delay: 3.5}
workload: {duration: 2s, concurrency: 1, rate: 20}
targets: [plain]
triggers: {none: "no fault: a slow start is the topology's"}
expect: {plain: pass}
"""


@pytest.mark.timeout(120)
def test_cap_counts_from_the_workload_start_not_the_cold_start(tmp_path: Path) -> None:
    """Issue 30, item 16: a cold start of 3.5 s against a 4 s cap once left the workload 0.5 s
    and killed it as "ops still in flight" (store-two-engines: 23.5 s of start, cap 30 s). The cap
    bounds the run from t0; node start-up has its own timeouts."""
    (tmp_path / "slow.yaml").write_text(SLOW_START)
    runs = tmp_path / "runs"
    r = cli("run", str(tmp_path / "slow.yaml"), "--runs-dir", str(runs), "--plain", "--no-report")
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = next(runs.iterdir())
    (res,) = json.loads((run_dir / "summary.json").read_text())["results"]
    assert res["verdict"] == "pass", res
    journal = [json.loads(line) for line in (run_dir / "echo-slow-start" / "plain" / "journal.jsonl").open()]
    assert not [x for x in journal if x.get("what") == "workload_killed"]
    assert journal[-1]["reason"] == "done"
