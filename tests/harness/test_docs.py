"""docs/scenarios/ is generated from the scenario files (pdchaos docs): the committed tables match
them, and an edited YAML makes --check fail until the tables are regenerated."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)


def docs(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's harness, whatever cwd is
    return subprocess.run([sys.executable, "-m", "harness.cli", "docs", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=100, env=env)


def test_committed_tables_match_the_scenario_files() -> None:
    p = docs("--check")
    assert p.returncode == 0, p.stdout + p.stderr


def test_an_edited_scenario_makes_the_tables_stale_until_regenerated(tmp_path) -> None:
    shutil.copytree(ROOT / "scenarios", tmp_path / "scenarios")
    shutil.copytree(ROOT / "docs" / "scenarios", tmp_path / "docs" / "scenarios")
    f = tmp_path / "scenarios" / "pd" / "stop-decode.yaml"
    f.write_text(f.read_text().replace("D frozen 6 s", "D frozen for six seconds"))
    p = docs("--check", "--scenarios", "scenarios", "--out", "docs/scenarios", cwd=tmp_path)
    assert p.returncode == 1 and "pd.md" in p.stdout, p.stdout + p.stderr
    assert docs("--scenarios", "scenarios", "--out", "docs/scenarios", cwd=tmp_path).returncode == 0
    assert "D frozen for six seconds" in (tmp_path / "docs" / "scenarios" / "pd.md").read_text()
    assert docs("--check", "--scenarios", "scenarios", "--out", "docs/scenarios", cwd=tmp_path).returncode == 0


def test_record_judges_the_run_again_and_takes_its_times_from_the_summary(tmp_path) -> None:
    """--record stores what pdchaos check says of each journal now (the current checks and
    expectations), with the time summary.json gives; a run of no scenario here is left out."""
    shutil.copytree(ROOT / "scenarios", tmp_path / "scenarios")
    run = tmp_path / "run"
    (run / "pd-baseline" / "upstream").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "golden" / "journals" / "pd-baseline-upstream.jsonl",
                run / "pd-baseline" / "upstream" / "journal.jsonl")
    (run / "summary.json").write_text(json.dumps({"run_id": "r1", "results": [
        {"scenario": "pd-baseline", "target": "upstream", "verdict": "pass", "outcome": "as_expected",
         "elapsed_s": 9.94},
        {"scenario": "not-a-scenario-here", "target": "hardened", "verdict": "pass", "outcome": "as_expected"}]}))
    p = docs("--record", str(run), "--scenarios", "scenarios", "--out", "out", cwd=tmp_path)
    assert p.returncode == 0 and "recorded 1 runs" in p.stdout, p.stdout + p.stderr
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    check = subprocess.run([sys.executable, "-m", "harness.cli", "check", str(run), "--json"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=100, env=env)
    [row] = [json.loads(x) for x in check.stdout.splitlines() if x.startswith("{")]
    assert json.loads((tmp_path / "out" / "runs.json").read_text()) == {
        "pd-baseline/upstream": {"verdict": row["verdict"], "outcome": row["outcome"], "elapsed_s": 9.9,
                                 "run_id": "r1"}}
    assert f"{row['verdict']}, " in (tmp_path / "out" / "pd.md").read_text()
    bad = docs("--record", str(tmp_path / "nowhere"), "--scenarios", "scenarios", "--out", "out", cwd=tmp_path)
    assert bad.returncode == 2 and "no summary.json" in bad.stderr and "Traceback" not in bad.stderr


def _links(md: Path) -> list[tuple[str, Path]]:
    """The relative link targets of a Markdown file (``[text](path)``, anchors and URLs left out)."""
    import re

    out = []
    for target in re.findall(r"\]\(([^)\s]+)\)", md.read_text()):
        if "://" in target or target.startswith(("#", "mailto:")):
            continue
        out.append((target, (md.parent / target.split("#")[0]).resolve()))
    return out


def test_readme_is_short_with_both_commands_on_its_first_screen_and_links_that_resolve() -> None:
    readme = ROOT / "README.md"
    lines = readme.read_text().splitlines()
    assert len(lines) <= 200, len(lines)
    first_screen = "\n".join(lines[:45])
    assert "python3 -m pip install -e '.[dev]' && pdchaos setup && pdchaos run scenarios/pd/ --strict" in first_screen
    assert "pdchaos setup --all && python -m pytest" in first_screen
    broken = [(str(md.relative_to(ROOT)), t) for md in [readme, *sorted((ROOT / "docs").rglob("*.md")),
                                                        ROOT / "connector_patch" / "DESIGN.md"]
              for t, p in _links(md) if not p.exists()]
    assert not broken


def test_the_generated_reference_says_what_every_check_and_fault_does() -> None:
    """docs/scenarios/checks-and-faults.md: a row per check and fault, none of them blank."""
    text = (ROOT / "docs" / "scenarios" / "checks-and-faults.md").read_text()
    from faults.base import load_registry
    from harness.checks import GENERIC
    from harness.family import installed_families

    families = installed_families()  # not a toy family another test of this process loaded
    names = set(GENERIC.checks) | {n for f in families for n in f.checks.checks} | \
        {n for n, c in load_registry().items() if c.family is None or c.family in {f.name for f in families}}
    rows = {line.split("|")[1].strip(" `") for line in text.splitlines() if line.startswith("| `")}
    assert names <= rows, names - rows
    assert "|  |" not in text
