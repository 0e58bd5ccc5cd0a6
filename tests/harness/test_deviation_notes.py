"""harness/ci/deviation_notes.py: what CI prints for a run that is not as expected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.ci import deviation_notes

pytestmark = pytest.mark.timeout(30)


def _run(tmp_path: Path, as_expected: bool) -> Path:
    run = tmp_path / "20261207-000000-abcd"
    sc = run / "pd-x" / "upstream"
    (sc / "server-logs").mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"results": [
        {"scenario": "pd-x", "target": "upstream", "dir": "pd-x/upstream", "verdict": "stall",
         "expected": "pass", "as_expected": as_expected}]}))
    recs = [
        {"type": "meta", "wall_start": "2026-12-07T04:00:00+00:00"},
        {"type": "op", "id": 1, "phase": "invoke", "t": 100.0, "expected": "SECRET PROMPT TEXT"},
        {"type": "op", "id": 1, "phase": "fail", "t": 100.4, "outcome": "http_502", "code": "bad_status",
         "error_phase": "decode", "elapsed_ms": 400.0, "value": "SECRET OUTPUT"},
        {"type": "op", "id": 2, "phase": "invoke", "t": 101.0},
        {"type": "op", "id": 2, "phase": "ok", "t": 101.5, "outcome": "ok"},
        {"type": "fault", "id": 0, "name": "kill", "phase": "start", "t": 102.0},
    ]
    (sc / "journal.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (sc / "server-logs" / "decode.log").write_text(
        "(Worker pid=1) ERROR 12-07 03:59:58 [x.py:1] an error of the run before\n"
        "(Worker pid=1) INFO 12-07 04:00:01 [x.py:1] fine\n"
        "(Worker pid=1) ERROR 12-07 04:00:02 [mooncake_connector.py:2405] pulling kv_caches failed: transfer failed\n")
    return run


def test_a_deviation_prints_its_failed_ops_faults_and_the_error_lines_since_its_start(tmp_path):
    out = "\n".join(deviation_notes.notes(_run(tmp_path, as_expected=False)))
    assert "-- pd-x [upstream]: stall (expected pass)" in out
    assert "op 1: fail http_502 type=bad_status phase=decode invoked at 0.00 s, took 400.0 ms" in out
    assert "op 2" not in out  # it succeeded
    assert "fault 0 kill start at 2.00 s" in out
    assert "server-logs/decode.log: 1 error lines since the run's start" in out
    assert "pulling kv_caches failed" in out and "the run before" not in out
    assert "SECRET" not in out  # never the prompt or the output


def test_a_run_as_expected_prints_nothing(tmp_path):
    assert deviation_notes.notes(_run(tmp_path, as_expected=True)) == []


def test_a_folder_without_summary_says_so_and_exits_0(tmp_path, capsys):
    assert deviation_notes.main([str(tmp_path)]) == 0
    assert "no summary.json" in capsys.readouterr().err
