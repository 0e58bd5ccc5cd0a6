"""The pull-request folders (connector_patch/upstream/prs/<project>-<NN-slug>/, written by ``pdchaos upstream
pr``) can be sent as they are:

* each has its four files; PR.md has the release's template sections, in order, none empty, and its footer
  (vLLM's checklist; vllm-ascend's DCO sign-off line); the commit message is signed off;
* no file holds an absolute path or a word only this project knows (its scenario names, its check
  vocabulary, its own test paths);
* the test output shows a test failing without the change and passing with it, and the gates passed;
* change.diff applies with ``git apply`` on the pinned release's own files alone and gives exactly the files
  the series' diff gives (a folder left behind by a changed diff is stale);
* the first three (vLLM 10 and 33, vllm-ascend 37) exist.

The checks are proven to refuse broken copies of a real folder (a section removed, a machine path, a
scenario name, no sign-off, a test that fails with the change, a diff whose context no longer matches).
The apply check needs the release's files (the node env and the cached sdist): without them it is skipped
with the set-up step to run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from connector_patch.upstream import read_series
from harness.cli.upstream import own_names
from harness.upstream_pr import FOLDER_FILES, folder_diff_problems, folder_problems

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
PRS = REPO / "connector_patch" / "upstream" / "prs"
FIRST = ("vllm-10-mooncake-unusable-transfer-params", "vllm-33-store-lookup-per-engine-path",
         "vllm-ascend-37-layerwise-listener-bind-fails-start")
FOLDERS = sorted(d.name for d in PRS.iterdir() if d.is_dir()) if PRS.is_dir() else []


def _project(folder: str):
    if folder.startswith("vllm-ascend-"):
        from families.layerwise.upstream import vllm_ascend_project

        p, rest = vllm_ascend_project(), folder[len("vllm-ascend-"):]
        series = read_series("vllm-ascend", p.version)
    else:
        from families.pd.upstream import vllm_project

        p, rest = vllm_project(), folder[len("vllm-"):]
        series = read_series("vllm", p.version)
    diff = next((d for d in series if d.name == rest + ".diff"), None)
    assert diff is not None, f"{folder}: no diff {rest}.diff in {p.label}'s series"
    return p, diff


def test_the_first_three_folders_exist():
    assert set(FIRST) <= set(FOLDERS), f"missing: {sorted(set(FIRST) - set(FOLDERS))}"


@pytest.mark.parametrize("folder", FOLDERS)
def test_folder_is_sendable_as_it_is(folder):
    p, _ = _project(folder)
    assert folder_problems(PRS / folder, p, own_names()) == []


def _release_files(p):
    sdist = p.sdist_dir()
    if not (sdist / ".complete").is_file() or not (p.site_packages() / p.package).is_dir():
        pytest.skip(f"{p.label}'s files are not here: run `pdchaos setup --only upstream-tests-{p.project}`")
    return sdist


@pytest.mark.parametrize("folder", FOLDERS)
def test_folder_diff_applies_alone_and_is_the_series_diff(folder, tmp_path):
    p, diff = _project(folder)
    sdist = _release_files(p)
    assert folder_diff_problems(PRS / folder, p, diff, sdist, tmp_path) == []


def _copy(tmp_path: Path, name: str) -> Path:
    if name not in FOLDERS:
        pytest.fail(f"{name}: the folder this test breaks is missing")
    dst = tmp_path / name
    shutil.copytree(PRS / name, dst)
    return dst


@pytest.mark.parametrize("name", [FIRST[0], FIRST[2]])
def test_broken_folders_are_refused(name, tmp_path):
    p, diff = _project(name)
    first_heading = p.pr_sections[0][0]

    def breaks(edit_file: str, change, expect: str) -> None:
        folder = _copy(tmp_path / f"{edit_file}-{len(list(tmp_path.iterdir()))}", name)
        path = folder / edit_file
        path.write_text(change(path.read_text(encoding="utf-8")), encoding="utf-8")
        probs = folder_problems(folder, p, own_names())
        assert any(expect in line for line in probs), (edit_file, expect, probs)

    breaks("PR.md", lambda t: t.replace(first_heading + "\n", "", 1), "no section")
    breaks("PR.md", lambda t: t + "\nlogs in /root/.cache/pdchaos/run-1\n", "an absolute path")
    breaks("PR.md", lambda t: t + "\nSee pd-bad-transfer-params.\n", "only this project knows")
    breaks("PR.md", lambda t: t + "\nAs issue 44 says.\n", "own vocabulary")
    breaks("commit-message.txt", lambda t: t.replace("Signed-off-by:", "Signed:"), "Signed-off-by")
    breaks("test-output.txt", lambda t: t.replace("with this change:    PASSED", "with this change:    FAILED", 1),
           "does not pass with the change")
    breaks("test-output.txt", lambda t: t.replace("without this change: FAILED", "without this change: PASSED"),
           "no test that failed without the change")
    breaks("change.diff", lambda t: "stray words\n" + t, "text before the first")
    folder = _copy(tmp_path / "gone", name)
    (folder / FOLDER_FILES[0]).unlink()
    assert folder_problems(folder, p, own_names()) == [f"{FOLDER_FILES[0]}: missing or empty"]


def test_a_stale_or_broken_diff_is_refused(tmp_path):
    name = FIRST[1]
    p, diff = _project(name)
    sdist = _release_files(p)
    folder = _copy(tmp_path / "ctx", name)
    text = (folder / "change.diff").read_text(encoding="utf-8")
    # a context line that is not in the release: git refuses the hunk
    ctx = next(ln for ln in text.splitlines() if ln.startswith(" ") and ln.strip())
    (folder / "change.diff").write_text(text.replace(ctx + "\n", ctx + "  # edited\n", 1), encoding="utf-8")
    probs = folder_diff_problems(folder, p, diff, sdist, tmp_path / "s1")
    assert probs and "does not apply" in probs[0], probs
    # applies, but is not what the series' diff gives any more
    folder = _copy(tmp_path / "stale", name)
    text = (folder / "change.diff").read_text(encoding="utf-8")
    added = next(ln for ln in text.splitlines() if ln.startswith("+") and not ln.startswith("+++") and ln[1:].strip())
    (folder / "change.diff").write_text(text.replace(added + "\n", added + "  # edited\n", 1), encoding="utf-8")
    probs = folder_diff_problems(folder, p, diff, sdist, tmp_path / "s2")
    assert probs and "not what" in probs[0], probs
