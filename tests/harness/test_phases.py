"""Faults keyed on protocol phases (harness/phases.py): the nemesis waits for an event a node
journals, then acts; a phase that never comes makes the run a harness error naming it.

The end-to-end cases run the toy echo family (tests/toy_family/) through the real ``pdchaos run``
with real node processes: its server appends a phase event ``echo_served`` per echo to a file the
nemesis reads live. The P/D family's own phases are proven on real vLLM nodes by the scenarios in
scenarios/pd/ and scenarios/pd-phases/ (docs/interleavings.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from harness import phases as PH
from harness.checks import CheckInput
from harness.triggers import phase_keyed

HERE = Path(__file__).resolve().parents[1]
TOY = HERE / "toy_family"
PDCHAOS = [sys.executable, "-m", "harness.cli"]


def cli(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TOY), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(PDCHAOS + list(args), capture_output=True, text=True, timeout=timeout, env=env)


SCENARIO = """\
name: {name}
family: echo_family
description: the echo server is frozen at a phase it journals
deadline: 300ms
tolerance: 300ms
cap: 20s
targets: [plain]
workload: {{duration: 3s, concurrency: 1, rate: 20}}
faults:
  - {{type: stop, node: server, at: 500ms, for: 300ms, upon: {upon}}}
triggers: [{{type: phase_keyed, fault: 0}}, {{type: ops_in_window, fault: 0}}]
checks: {{recovery: {{within: 2}}, failures_explained: {{enabled: false}}}}
expect: {{plain: pass}}
"""


def write(tmp: Path, name: str, upon: str) -> Path:
    p = tmp / f"{name}.yaml"
    p.write_text(SCENARIO.format(name=name, upon=upon))
    return p


def journal(run_root: Path, name: str) -> list[dict]:
    run_dir = next(run_root.iterdir())
    return [json.loads(line) for line in (run_dir / name / "plain" / "journal.jsonl").open()]


@pytest.mark.timeout(120)
def test_fault_starts_at_the_nth_phase_event_plus_its_offset(tmp_path: Path) -> None:
    path = write(tmp_path, "echo-stop-at-phase", "{phase: echo_served, nth: 5, offset: 50ms, within: 1500ms}")
    runs = tmp_path / "runs"
    r = cli("run", str(path), "--runs-dir", str(runs), "--plain", "--no-report")
    assert r.returncode == 0, r.stdout + r.stderr
    recs = journal(runs, "echo-stop-at-phase")
    meta = recs[0]
    assert meta["faults"][0]["upon"] == {"phase": "echo_served", "offset": 0.05, "nth": 5, "within": 1.5,
                                         "node": None}
    (start,) = [x for x in recs if x["type"] == "fault" and x["phase"] == "start"]
    keyed = start["keyed"]
    armed = meta["t0"] + 0.5
    assert keyed["phase"] == "echo_served" and keyed["role"] == "server" and keyed["nth"] == 5
    assert abs(keyed["armed_at"] - armed) < 0.05
    # the fifth echo_served at or after the arming, as the server journalled it (merged into the history)
    served = sorted(x["t"] for x in recs if x.get("what") == "phase" and x["phase"] == "echo_served"
                    and x["t"] >= keyed["armed_at"])
    assert keyed["t_phase"] == served[4]
    assert 0.05 <= start["t"] - keyed["t_phase"] < 0.05 + 0.25  # the offset, then the nemesis's poll
    (stop,) = [x for x in recs if x["type"] == "fault" and x["phase"] == "stop"]
    assert abs(stop["t"] - start["t"] - 0.3) < 0.25  # healed `for` after it started, not after `at`
    (effect,) = [x for x in recs if x.get("what") == "fault_effect"]
    assert effect["keyed"]["t_phase"] == keyed["t_phase"]
    checks = json.loads((next(runs.iterdir()) / "echo-stop-at-phase" / "plain" / "checks.json").read_text())
    trig = next(c for c in checks if c["name"] == "triggers")
    assert trig["ok"] is True and "after echo_served (of server) + 50 ms offset" in trig["message"], trig


@pytest.mark.timeout(120)
def test_a_phase_that_never_comes_is_a_harness_error_naming_it(tmp_path: Path) -> None:
    path = write(tmp_path, "echo-stop-never", "{phase: echo_never, within: 800ms}")
    runs = tmp_path / "runs"
    r = cli("run", str(path), "--runs-dir", str(runs), "--plain", "--no-report")
    assert r.returncode != 0
    assert "error" in r.stdout and "echo_never" in r.stdout, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr  # the nemesis ends with its last fault missed (it died waiting forever)
    recs = journal(runs, "echo-stop-never")
    assert not [x for x in recs if x["type"] == "fault"]  # it never started
    (missed,) = [x for x in recs if x.get("what") == "phase_missed"]
    assert missed["phase"] == "echo_never" and "0 such event(s) came" in missed["error"]
    assert recs[-1]["type"] == "end" and recs[-1]["reason"] == "error"
    summary = json.loads((next(runs.iterdir()) / "summary.json").read_text())["results"][0]
    assert summary["verdict"] == "error" and "echo_never" in summary["reason"]


@pytest.mark.parametrize("upon, where, words", [
    ("{phase: echo_nope}", ":10: faults[0].upon.phase:", "Input should be 'echo_never', 'echo_served' or"),
    ("{phase: echo_served, offset: 5}", ":10: faults[0].upon.offset:", "expected a duration"),
    ("{phase: echo_served, nth: 0}", ":10: faults[0].upon.nth:", "greater than or equal to 1"),
    ("{phase: echo_served, within: 4s}", ":1: (top level):", "it may end at 4.8s, after the workload (3s)"),
    ("{phase: echo_served, when: 1s}", ":10: faults[0].upon.when:", "unknown field"),
    ("{phase: echo_shouted, within: 1s}", ":1: (top level):", "echo_shouted is seen only on shouting; this scenario also "
                                                   "runs plain"),
])
def test_bad_phase_keys_are_one_clear_error_naming_file_line_and_field(tmp_path: Path, upon: str, where: str,
                                                                       words: str) -> None:
    path = write(tmp_path, "echo-bad", upon)
    r = cli("validate", str(path))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{path}{where}" in r.stderr and words in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_on_is_read_by_yaml_as_true_and_named_so(tmp_path: Path) -> None:
    path = tmp_path / "echo-on.yaml"
    path.write_text(SCENARIO.format(name="echo-on", upon="{phase: echo_served}").replace("upon:", "on:"))
    r = cli("validate", str(path))
    assert r.returncode == 2 and f"{path}:10: faults[0]: a key YAML reads as true or false" in r.stderr, r.stderr
    assert "upon: {phase: NAME" in r.stderr and "Traceback" not in r.stderr


def test_a_family_without_phases_refuses_a_keyed_fault(tmp_path: Path) -> None:
    path = tmp_path / "lookup-keyed.yaml"
    path.write_text(textwrap.dedent("""\
        name: lookup-keyed
        family: lookup
        workload: {duration: 3s}
        faults:
          - {type: slow_peer, at: 1s, for: 1s, delay: 50ms, upon: {phase: anything}}
        triggers: [{type: ops_in_window, fault: 0}]
        expect: {hardened: pass, legacy: pass}
        """))
    r = cli("validate", str(path))
    assert r.returncode == 2 and "family 'lookup' declares no phases" in r.stderr, r.stdout + r.stderr


# --------------------------------------------------------------------------- the live tail


def _append(path: Path, *events: tuple[float, str], torn: str = "") -> None:
    with open(path, "a", encoding="utf-8") as fh:
        for t, name in events:
            fh.write(json.dumps({"t": t, "phase": name}) + "\n")
        fh.write(torn)


def test_tail_skips_what_a_pooled_node_wrote_before_and_follows_new_files(tmp_path: Path) -> None:
    p, d = tmp_path / "p.jsonl", tmp_path / "d.jsonl"
    _append(p, (1.0, "p_write_started"))  # an earlier run's (a pooled node): not this run's
    files = {"prefill:0": p}
    tail = PH.PhaseTail(lambda: dict(files))
    _append(p, (2.0, "p_write_started"), torn='{"t": 3.0, "pha')  # a line still being written
    assert [e["t"] for e in tail.poll()] == [2.0]
    with open(p, "a") as fh:
        fh.write('se": "p_write_started"}\nnot json\n')
    files["decode:0"] = d  # a node started again writes a new file: read from its start
    _append(d, (2.5, "d_pull_out"))
    new = tail.poll()
    assert sorted((e["t"], e["role"]) for e in new) == [(2.5, "decode:0"), (3.0, "prefill:0")]
    assert tail.unreadable == 1
    key = PH.PhaseKey(phase="p_write_started", nth=2)
    assert tail.find(key, since=0.0)["t"] == 3.0
    assert tail.find(PH.PhaseKey(phase="p_write_started"), since=2.1)["t"] == 3.0
    assert tail.find(PH.PhaseKey(phase="d_pull_out", node="prefill:0"), since=0.0) is None
    assert tail.find(PH.PhaseKey(phase="d_pull_out", node="decode:0"), since=0.0)["role"] == "decode:0"
    recs, left = tail.journal_records(2.2, 10.0)
    assert [(r["what"], r["phase"], r["t"]) for r in recs] == [("phase", "d_pull_out", 2.5),
                                                               ("phase", "p_write_started", 3.0)] and left == 0


def test_wait_for_returns_the_event_a_writer_appends_or_none_at_its_bound(tmp_path: Path) -> None:
    p = tmp_path / "p.jsonl"
    p.touch()
    tail = PH.PhaseTail(lambda: {"prefill:0": p})
    since = time.monotonic()
    writer = threading.Timer(0.2, lambda: _append(p, (time.monotonic(), "p_write_started")))
    writer.start()
    ev = PH.wait_for(tail, PH.PhaseKey(phase="p_write_started", within="3s"), since, threading.Event())
    writer.join()
    assert ev is not None and 0.15 < ev["t"] - since < 1.0
    t = time.monotonic()
    assert PH.wait_for(tail, PH.PhaseKey(phase="p_write_done", within="300ms"), t, threading.Event()) is None
    assert time.monotonic() - t >= 0.3


# --------------------------------------------------------------------------- the trigger


def _history(lag: float, journalled: bool = True) -> list[dict]:
    t_phase = 101.0
    upon = {"phase": "p_write_started", "offset": 0.1, "nth": 1, "within": 2.0, "node": None}
    recs = [{"type": "meta", "t0": 100.0, "faults": [{"id": 0, "type": "stop", "upon": upon}]},
            {"type": "fault", "id": 0, "name": "stop", "phase": "start", "t": t_phase + 0.1 + lag,
             "keyed": {"phase": "p_write_started", "nth": 1, "t_phase": t_phase, "role": "prefill:0"}},
            {"type": "fault", "id": 0, "name": "stop", "phase": "stop", "t": t_phase + 2}]
    if journalled:
        recs.append({"type": "event", "what": "phase", "phase": "p_write_started", "role": "prefill:0", "t": t_phase})
    return sorted(recs, key=lambda r: r.get("t", 0))


@pytest.mark.parametrize("lag, journalled, fired", [(0.004, True, True), (0.5, True, False),
                                                    (-0.05, True, False), (0.004, False, False)])
def test_phase_keyed_trigger(lag: float, journalled: bool, fired: bool) -> None:
    got = phase_keyed(CheckInput(_history(lag, journalled)), {"fault": 0, "max_lag": 0.25})
    assert got.fired is fired, got.evidence


def test_phase_keyed_trigger_refuses_a_fault_not_keyed() -> None:
    recs = _history(0.0)
    recs[0]["faults"][0].pop("upon")
    got = phase_keyed(CheckInput(recs), {"fault": 0})
    assert got.fired is False and "not keyed on a phase" in got.evidence


@pytest.mark.parametrize("answered_after, fired", [(0.002, False), (0.2, True), (None, True)])
def test_phase_keyed_before_says_whether_the_fault_caught_what_it_was_keyed_on(answered_after: float | None,
                                                                               fired: bool) -> None:
    recs = _history(0.004)
    t_phase = 101.0
    recs.append({"type": "event", "what": "fault_started", "id": 0, "t": t_phase + 0.1 + 0.004 + 0.003})
    if answered_after is not None:  # P answered the pull: before the freeze had acted, or after
        recs.append({"type": "event", "what": "phase", "phase": "p_pull_answered", "role": "prefill:0",
                     "t": t_phase + 0.1 + answered_after})
    recs.append({"type": "event", "what": "phase", "phase": "p_pull_answered", "role": "decode:0",
                 "t": t_phase + 0.101})  # another node's: never counts
    recs.sort(key=lambda r: r.get("t", 0))
    got = phase_keyed(CheckInput(recs), {"fault": 0, "max_lag": 0.25, "before": "p_pull_answered"})
    assert got.fired is fired, got.evidence
