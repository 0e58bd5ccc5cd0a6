"""Outcomes: a skipped scenario run is its own outcome everywhere, never "as expected".

Hand-made run folders (nodekit.journal.write_journal + harness.outputs.write_summary) check the
counts in summary.json, summary.md, report.html and junit.xml; a real ``pdchaos run`` of a
Toxiproxy scenario on a machine where toxiproxy-server cannot be found (PDCHAOS_TOXIPROXY_SERVER
names a missing file) checks the exit codes with and without ``--strict``, and ``pdchaos check``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from nodekit.journal import write_journal
from harness.outputs import Result, counts, run_status, write_summary
from reports.load import load_run
from reports.page import report_html
from reports.summary import summary_md

REPO = Path(__file__).resolve().parents[2]
PDCHAOS = [sys.executable, "-m", "harness.cli"]
TOXIC_SCENARIO = REPO / "scenarios" / "network" / "toxic-slicer.yaml"


def _result(scenario: str, target: str, verdict: str, expected: str, reason: str = "",
            failing: list[str] | None = None) -> Result:
    return Result(scenario, f"{scenario}.yaml", target, f"{scenario}/{target}", verdict, expected, reason=reason,
                  failing=list(failing or []))


@pytest.mark.timeout(10)
def test_a_skipped_result_is_not_as_expected():
    skipped = _result("s", "legacy", "skipped", "pass", "needs root")
    assert skipped.outcome == "skipped" and skipped.as_expected is False
    assert skipped.to_dict()["as_expected"] is False and skipped.to_dict()["outcome"] == "skipped"
    # an expectation names the exact set of failing checks (harness/verdicts.py)
    named = "fail[recovery]|stall[no_stall,recovery]"
    assert _result("s", "legacy", "fail", named, failing=["recovery"]).outcome == "as_expected"
    assert _result("s", "legacy", "stall", named, failing=["no_stall", "recovery"]).outcome == "as_expected"
    assert _result("s", "legacy", "fail", named, failing=["no_leaks", "recovery"]).outcome == "deviation"
    assert _result("s", "legacy", "fail", named, failing=["bounded_return"]).outcome == "deviation"
    assert _result("s", "legacy", "pass", named).outcome == "deviation"
    # a journal saved before expectations named their checks: its verdict alone is compared
    assert _result("s", "legacy", "fail", "fail|stall", failing=["anything"]).outcome == "as_expected"
    assert _result("s", "legacy", "pass", "fail|stall").outcome == "deviation"
    assert _result("s", "legacy", "error", "pass").outcome == "error"
    assert counts(["as_expected", "skipped", "skipped", "error"]) == {
        "as_expected": 1, "deviations": 0, "skipped": 2, "errors": 1}
    # exit status: skips alone pass, unless --strict; a deviation or an error always fails
    assert run_status(["as_expected", "skipped"])[0] == 0
    code, why = run_status(["as_expected", "skipped"], strict=True)
    assert code == 1 and "1 skipped (--strict" in why
    assert run_status(["as_expected", "error"]) == (1, "exit 1: 1 error(s)")
    assert run_status(["deviation"]) == (1, "exit 1: 1 deviation(s)")
    assert run_status(["as_expected"]) == (0, "exit 0: every run as expected")


def _meta(scenario: str, target: str, expect: str, **extra) -> dict:
    return {"type": "meta", "scenario": scenario, "family": "lookup", "target": target, "deadline_ms": 200.0,
            "tolerance_ms": 50.0, "t0": 10.0, "expect": expect, "targets": ["hardened", "legacy"],
            "baseline_target": "legacy", "faults": [], **extra}


def _ops(n: int, *, stall_last: bool = False) -> list[dict]:
    recs = []
    for i in range(n):
        t = 10.0 + i * 0.1
        recs.append({"type": "op", "id": i, "process": 0, "f": "lookup", "phase": "invoke", "t": t, "expected": 0})
        if not (stall_last and i == n - 1):
            recs.append({"type": "op", "id": i, "process": 0, "f": "lookup", "phase": "ok", "t": t + 0.001,
                         "value": 0, "outcome": "ok", "elapsed_ms": 1.0})
    return recs


@pytest.fixture()
def mixed_run(tmp_path: Path) -> Path:
    """a: hardened as expected, legacy a deviation; b: hardened skipped, legacy an error."""
    run_dir = tmp_path / "mixed"
    specs = [("a", "hardened", "pass", "pass", "", _ops(5)),
             ("a", "legacy", "stall", "fail[recovery]", "no_stall: op 4 never returned", _ops(5, stall_last=True)),
             ("b", "hardened", "skipped", "pass", "toxiproxy-server is not installed", None),
             ("b", "legacy", "error", "fail[recovery]", "topology: OSError: no namespaces", None)]
    results = []
    for scenario, target, verdict, expected, reason, ops in specs:
        head = _meta(scenario, target, expected)
        if ops is None:  # never ran: the runner writes the reason in the meta line and an end record
            head[verdict] = reason
            ops = []
        end = {"type": "end", "t": 11.0, "reason": "done" if verdict not in ("skipped", "error") else verdict,
               "stalled": 0}
        write_journal(run_dir / scenario / target / "journal.jsonl", [head, *ops, end])
        res = _result(scenario, target, verdict, expected, reason, ["no_stall"] if verdict == "stall" else None)
        if verdict == "stall":
            res.checks = [{"name": "no_stall", "ok": False, "message": "op 4 never returned"},
                          {"name": "recovery", "ok": None, "message": "not applicable: no fault is scheduled"}]
        results.append(res)
    write_summary(run_dir, results, "2026-01-01T00:00:00+00:00", 3.0)
    return run_dir


@pytest.mark.timeout(30)
def test_summary_json_md_html_and_junit_count_skipped_separately(mixed_run: Path):
    doc = json.loads((mixed_run / "summary.json").read_text())
    assert doc["counts"] == {"as_expected": 1, "deviations": 1, "skipped": 1, "errors": 1}
    by = {(r["scenario"], r["target"]): r for r in doc["results"]}
    assert by[("b", "hardened")]["outcome"] == "skipped" and by[("b", "hardened")]["as_expected"] is False
    assert by[("b", "legacy")]["outcome"] == "error"

    run = load_run(mixed_run)
    md = summary_md(run, {}, None)
    assert "**1 as expected, 1 deviation(s), 1 skipped, 1 error(s)**" in md
    assert "| b | ⏭️ skipped | ⚠️ error |" in md
    assert "| a | ✅ pass | ❌ stall (expected fail (failing: recovery)) |" in md
    assert "#### Skipped (not run here)" in md and "- **b / hardened**: toxiproxy-server is not installed" in md
    assert "#### Errors" in md and "- **b / legacy**: topology: OSError: no namespaces" in md
    assert "#### Deviations" in md and "- **a / legacy**: stall, expected fail (failing: recovery)" in md

    page = report_html(run, {}, None)
    assert '<span class="bad">1 as expected, 1 deviation(s), 1 skipped, 1 error(s)</span>' in page
    assert "⏭️ skipped" in page and "<td>recovery</td><td class='unk'>n/a</td>" in page

    suite = ET.parse(mixed_run / "junit.xml").getroot()
    assert [suite.get(k) for k in ("tests", "failures", "errors", "skipped")] == ["4", "1", "1", "1"]
    cases = {(c.get("classname"), c.get("name")): c for c in suite.iter("testcase")}
    assert cases[("b", "hardened")].find("skipped").get("message") == "toxiproxy-server is not installed"
    assert cases[("b", "legacy")].find("error") is not None
    assert cases[("a", "legacy")].find("failure").text == "no_stall: op 4 never returned"
    assert list(cases[("a", "hardened")]) == []


# ------------------------------------------------------------------ a real run that must be skipped

def _no_toxiproxy_env(tmp_path: Path) -> dict[str, str]:
    """toxiproxy-server cannot be found: the variable names a missing file (an explicit choice, no
    fallback to PATH; see faults/toxiproxy.find_binary), and PATH has no toxiproxy-server either."""
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not (Path(d) / "toxiproxy-server").exists()]
    return dict(os.environ, PDCHAOS_TOXIPROXY_SERVER=str(tmp_path / "no-such-toxiproxy-server"),
                PATH=os.pathsep.join(path), PYTHONPATH=str(REPO))


def _pdchaos(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(PDCHAOS + args, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


@pytest.fixture()
def toxic_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "scn" / TOXIC_SCENARIO.name
    dst.parent.mkdir()
    shutil.copy(TOXIC_SCENARIO, dst)
    assert "link: toxiproxy" in dst.read_text()
    return dst


@pytest.mark.timeout(300)
def test_run_strict_fails_on_a_skipped_scenario_and_plain_run_does_not(tmp_path: Path, toxic_copy: Path):
    env = _no_toxiproxy_env(tmp_path)
    runs = tmp_path / "runs"
    plain = _pdchaos(["run", str(toxic_copy), "--runs-dir", str(runs), "--plain"], env)
    out = plain.stdout + plain.stderr
    assert plain.returncode == 0, out
    assert "skipped (expected pass) SKIPPED" in plain.stdout and "toxiproxy-server is not installed" in plain.stdout
    assert "0 as expected, 0 deviations, 2 skipped, 0 errors" in plain.stdout
    assert plain.stdout.strip().splitlines()[-1].startswith("exit 0: no deviation, no error; 2 skipped")

    (run_dir,) = list(runs.iterdir())
    doc = json.loads((run_dir / "summary.json").read_text())
    assert doc["counts"] == {"as_expected": 0, "deviations": 0, "skipped": 2, "errors": 0}
    assert {r["outcome"] for r in doc["results"]} == {"skipped"}
    assert all(r["as_expected"] is False for r in doc["results"])
    suite = ET.parse(run_dir / "junit.xml").getroot()
    assert suite.get("skipped") == "2" and len(list(suite.iter("skipped"))) == 2
    md = (run_dir / "summary.md").read_text()  # the reports ran: skipped shown as such, not as a pass
    assert "**0 as expected, 0 deviation(s), 2 skipped, 0 error(s)**" in md
    assert "| toxic-slicer | ⏭️ skipped | ⏭️ skipped |" in md and "✅" not in md.split("\n\n")[2]

    strict = _pdchaos(["run", str(toxic_copy), "--runs-dir", str(runs), "--plain", "--no-report", "--strict"], env)
    assert strict.returncode == 1, strict.stdout + strict.stderr
    last = strict.stdout.strip().splitlines()[-1]
    assert last == "exit 1: 2 skipped (--strict: a skipped run fails the run)", last

    # pdchaos check: the same rules, from the journals alone
    check = _pdchaos(["check", str(run_dir)], env, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count("skipped, expected pass SKIPPED (same as saved): toxiproxy-server") == 2
    assert "2 scenario runs: 0 as expected, 0 deviations, 2 skipped, 0 errors" in check.stdout
    check = _pdchaos(["check", str(run_dir), "--strict"], env, timeout=60)
    assert check.returncode == 1 and "--strict" in check.stdout.strip().splitlines()[-1], check.stdout
    check = _pdchaos(["check", str(run_dir), "--json"], env, timeout=60)
    assert {json.loads(line)["outcome"] for line in check.stdout.splitlines()} == {"skipped"}


@pytest.mark.timeout(200)
def test_pytest_plugin_keeps_a_skipped_scenario_a_skip(tmp_path: Path, toxic_copy: Path):
    env = _no_toxiproxy_env(tmp_path)
    # --pdchaos-target takes any name (targets come from the families); this scenario's legacy only
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "--pdchaos", str(toxic_copy),
           "--pdchaos-runs-dir", str(tmp_path / "runs"), "--pdchaos-target", "legacy", "--pdchaos-target", "plain"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 skipped" in proc.stdout and "toxiproxy-server is not installed" in proc.stdout
    assert "passed" not in proc.stdout
