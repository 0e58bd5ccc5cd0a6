"""harness/measure.py: the README's figures come from the last `pdchaos measure` (docs/measurements.json)
and cannot drift: a figure outside the marks, or one the measurement does not have, fails here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness import measure as M

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(30)


def _last() -> dict:
    path = ROOT / M.JSON
    assert path.is_file(), f"{M.JSON} missing: run `pdchaos measure` on a fresh clone"
    return json.loads(path.read_text())


# --------------------------------------------------------------------------- this checkout

def test_every_readme_figure_is_the_last_measurement():
    readme = (ROOT / M.README).read_text()
    marks = M.MARK.findall(readme)
    assert {k for k, _ in marks} >= {"setup", "quick", "main", "tests", "main_sample", "env_pd_node"}
    assert M.fill_readme(readme, M.figures(_last())) == readme, \
        "README.md's figures differ from docs/measurements.json: run `pdchaos measure` (or its write step)"


def test_the_readme_states_no_figure_outside_the_marks():
    assert M.readme_figures_outside_marks((ROOT / M.README).read_text()) == []


def test_the_measurements_table_is_the_last_measurement():
    md = (ROOT / M.MD).read_text()
    assert M.table(_last()) in md


# --------------------------------------------------------------------------- the parts

OUT_MAIN = """\
[1/44] pd-abort-after-prefill [upstream] fail (expected pass|fail[no_busy_wait]) as expected 56.1s
[4/44] pd-bad-transfer-params [upstream] fail (expected fail[bounded_return]) as expected 33.2s
[14/44] pd-fake-prefill-silent [upstream] stall (expected stall[no_stall]) as expected 37.2s
[34/44] pd-fake-prefill-silent [hardened] pass (expected pass) as expected 11.9s
[36/44] pd-kill-prefill-before-pull [hardened] pass (expected pass) as expected 31.4s
44 scenario runs in 1232.1s: 44 as expected, 0 deviations, 0 skipped, 0 errors; run folder runs/x
"""


def test_the_commands_measured_are_the_readmes_own():
    assert M.readme_command("main") == ["pdchaos", "run", "scenarios/pd/", "--strict"]
    assert M.readme_command("quick") == ["pdchaos", "run", "scenarios/pd/", "--quick"]
    text = "```bash\npip install x && pdchaos setup && pdchaos run scenarios/a/ --strict\n```\nsooner: `pdchaos run b/ --quick`"
    assert M.readme_command("main", text)[2] == "scenarios/a/" and M.readme_command("quick", text)[2] == "b/"
    lines = "```sh\npython3 -m pip install -e '.[dev]'\nPDCHAOS_X=1 pdchaos setup; pdchaos run 'a b/' --strict  # 21 min\n```"
    assert M.readme_command("main", lines) == ["pdchaos", "run", "a b/", "--strict"]
    with pytest.raises(M.MeasureError, match="names no main command"):
        M.readme_command("main", "no block")


def test_parsers_read_what_the_commands_print():
    assert M.parse_tally(OUT_MAIN) == {"runs": 44, "runs_s": 1232.1, "as_expected": 44, "deviations": 0,
                                       "skipped": 0, "errors": 0}
    assert M.parse_tally("nothing") == {}
    assert M.parse_pytest("...\n===== 1 failed, 1559 passed in 945.99s (0:15:45) =====\n") == {
        "passed": 1559, "failed": 1, "skipped": 0, "errors": 0, "pytest_s": 945.99}
    assert M.parse_pytest("no closing line") == {}
    # pytest -q prints its closing line without the "=" rule (the first full measurement's output)
    assert M.parse_pytest("skips: 0\n1582 passed in 798.36s (0:13:18)\n") == {
        "passed": 1582, "failed": 0, "skipped": 0, "errors": 0, "pytest_s": 798.36}
    with pytest.raises(M.MeasureError, match="lacks 'passed'"):
        M.figures({"tests_s": 1.0, "tests": {"rc": 0}})
    out = ("setup: toxiproxy-server ... already present: v2.12.0 [0.1 s]\n"
           "  pd-node: [1/5] locked: ok in 36 s\n"
           "setup: pd-node-stack ... installed pd-node at /x in 57 s (5 of 5 steps run) [56.9 s]\n")
    assert M.parse_setup_steps(out) == {"toxiproxy-server": 0.1, "pd-node-stack": 56.9}
    sample = M.sample_lines(OUT_MAIN)
    assert sample[-1].startswith("44 scenario runs in 1232.1s")
    assert any("[upstream] stall" in s for s in sample) and any("[hardened] pass" in s for s in sample)
    assert [int(s.split("/")[0][1:]) for s in sample[:-1]] == sorted(int(s.split("/")[0][1:]) for s in sample[:-1])


def test_a_figure_the_measurement_lacks_is_an_error_and_marks_are_filled():
    text = "set-up <!-- measured:setup -->old<!-- /measured --> and <!-- measured:nope -->1 s<!-- /measured -->"
    with pytest.raises(M.MeasureError, match="names the figure 'nope'"):
        M.fill_readme(text, {"setup": "57 s"})
    assert M.fill_readme(text.split(" and ")[0], {"setup": "57 s"}) == "set-up <!-- measured:setup -->57 s<!-- /measured -->"
    block = "<!-- measured:main_sample -->\nx\n<!-- /measured -->"
    assert M.fill_readme(block, {"main_sample": "a\nb"}) == "<!-- measured:main_sample -->\na\nb\n<!-- /measured -->"
    m = {"main_s": 1, "main_cmd": "pdchaos run x/", "main": {"runs": 1}, "main_sample": ["[1/1] a", "1 scenario runs"]}
    assert M.figures(m)["main_sample"] == "```text\n$ pdchaos run x/ --plain\n[1/1] a\n1 scenario runs\n```"


@pytest.mark.parametrize("text, found", [
    ("the first set-up takes 301 s here", ["301 s"]),
    ("21 min; 25 minutes", ["21 min", "25 minutes"]),
    ("an env of 6.4 GB", ["6.4 GB"]),
    ("45 runs and 1560 tests", ["1560 tests", "45 runs"]),
    ("a run 56.1s long", ["56.1s"]),
    ("[docs/x.md](docs/x.md) v2.12.0, 9/9 killed, Python 3.11", []),
    ("[takes 5 min](docs/x.md)", ["5 min"]),
    ("<!-- measured:setup -->57 s<!-- /measured -->", []),
])
def test_figures_outside_marks_are_found(text, found):
    assert M.readme_figures_outside_marks(text) == sorted(found)


def test_the_table_is_replaced_in_place(tmp_path):
    m = {"date": "2026-12-04", "commit": "abc", "machine": "2 cores", "install_s": 54.0, "setup_s": 70.2,
         "setup_steps": {"pd-node-stack": 57.0}, "main_s": 1190.0,
         "main": {"runs": 45, "as_expected": 45, "deviations": 0, "errors": 0, "rc": 0}, "env_gb": {"pd-node": 6.0}}
    once = M.fill_md("# Measured\n\nolder rows\n", m)
    assert once.index(M.TABLE_BEGIN) < once.index("older rows") and "| `pdchaos setup` | 1 min 10 s" in once
    m["setup_s"] = 65.0
    twice = M.fill_md(once, m)
    assert twice.count(M.TABLE_BEGIN) == 1 and "1 min 05 s" in twice and "older rows" in twice
    figs = M.figures(m)
    assert figs["setup"] == "1 min 10 s".replace("10", "05") and figs["main_runs"] == "45 runs"
    assert figs["env_pd_node"] == "6.0 GB"


def test_a_silent_command_still_meets_its_deadline_and_write_changes_nothing_on_a_missing_figure(tmp_path):
    with pytest.raises(M.MeasureError, match="did not finish within 1 s"):
        M.run_timed(["sh", "-c", "sleep 20"], 1, echo=lambda s: None)
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("<!-- measured:main -->x<!-- /measured -->")
    (tmp_path / "docs" / "measurements.md").write_text("# m\n")
    with pytest.raises(M.MeasureError):
        M.write({"date": "d", "commit": "c"}, root=tmp_path)
    assert not (tmp_path / "docs" / "measurements.json").exists()
    assert (tmp_path / "docs" / "measurements.md").read_text() == "# m\n"


def test_a_partial_measurement_is_not_written():
    res = subprocess.run([sys.executable, "-m", "harness.cli", "measure", "--steps", "setup"],
                         capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert res.returncode == 2 and "printed, not written" in res.stderr and res.stderr.count("\n") == 1


def test_bad_steps_are_one_line_exit_2():
    res = subprocess.run([sys.executable, "-m", "harness.cli", "measure", "--steps", "setup,lunch"],
                         capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "--steps: unknown step 'lunch'" in res.stderr and "Traceback" not in res.stderr


def test_the_readmes_scenario_count_is_the_main_jobs_folder():
    """The README's "under N fault scenarios" is a count, not a measurement: it must be the number
    of scenario files the main job runs (scenarios/pd/)."""
    import re

    n = len(list((ROOT / "scenarios" / "pd").glob("*.yaml")))
    stated = re.findall(r"under (\d+) fault scenarios", (ROOT / M.README).read_text())
    assert stated == [str(n)], (stated, n)
