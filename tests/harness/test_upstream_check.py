"""``pdchaos upstream check`` judged on a small made-up project (a package, its "sdist" test tree and a
series of three diffs), so the rules are proven against diffs they must refuse, without vLLM:

* a diff whose test fails before it and passes after it is proven;
* a diff whose test already passes on the unfixed code is not (it does not show the defect);
* a diff whose ``Tests:`` field names a test that never runs is not (a misspelt name proves nothing);
* upstream's own tests run with the whole series, and a series that breaks one is a problem;
* every diff's own tests run once more with the whole series: a later diff that breaks them is a problem.

The real series are checked by the same code in CI (``.ci/run``) and the nightly."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from connector_patch.upstream import read_diff
from harness.upstream import UpstreamProject, check, line_for

pytestmark = pytest.mark.timeout(120)

HEADER = "Subject: {s}\nDefect: d\nGuarantee: g\nScenarios: none\nTests: {t}\nDepends: {dep}\n\n"


def _file_diff(path: str, old: str | None, new: str) -> str:
    olines, nlines = ([] if old is None else old.splitlines()), new.splitlines()
    head = f"diff --git a/{path} b/{path}\n" + ("new file mode 100644\n--- /dev/null\n" if old is None
                                                   else f"--- a/{path}\n") + f"+++ b/{path}\n"
    hunk = f"@@ -{1 if olines else 0},{len(olines)} +1,{len(nlines)} @@\n"
    return head + hunk + "".join(f"-{ln}\n" for ln in olines) + "".join(f"+{ln}\n" for ln in nlines)


def _project(tmp_path: Path, monkeypatch, series: list[tuple], own_test: str, **gates) -> UpstreamProject:
    """``series``: (name, Tests: field, diff body[, Depends: field, default none; None: no such field]);
    ``gates``: more UpstreamProject fields (lint_lock, tethering) and ``sdist_files`` (path -> text)."""
    sdist_files = gates.pop("sdist_files", {})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    lock = tmp_path / "tools.txt"
    lock.write_text("# nothing: the test's own Python has pytest\n")
    p = UpstreamProject(project="toy", version="1.0", package="toy", sdist_url="file:///nowhere",
                        sdist_sha256="0" * 64, python=lambda: Path(sys.executable),
                        site_packages=lambda: p.test_tools(), series=lambda: diffs,
                        own_tests={"toy/": ["tests/test_own.py"]}, tools_lock=lock, **gates)
    site = p.test_tools()  # the "installed" package sits in the tools folder, which is on PYTHONPATH
    (site / "toy").mkdir(parents=True)
    (site / "toy" / "__init__.py").write_text("")
    (site / "toy" / "mod.py").write_text("def f():\n    return 1\n")
    sdist = p.sdist_dir()
    (sdist / "tests").mkdir(parents=True)
    (sdist / "tests" / "test_own.py").write_text(own_test)
    for rel, text in sdist_files.items():
        (sdist / rel).parent.mkdir(parents=True, exist_ok=True)
        (sdist / rel).write_text(text)
    (sdist / ".complete").write_text("made by the test\n")
    diffs = []
    for name, tests, body, *dep in series:
        f = tmp_path / "series" / name
        f.parent.mkdir(exist_ok=True)
        header = HEADER.format(s=name, t=tests, dep=dep[0] if dep else "none")
        if dep and dep[0] is None:
            header = header.replace("Depends: None\n", "")
        f.write_text(header + body)
        diffs.append(read_diff(f))
    return p


FIX = _file_diff("toy/mod.py", "def f():\n    return 1\n", "def f():\n    return 2\n")
FIX_TEST = _file_diff("tests/test_fix.py", None, "from toy.mod import f\n\n\ndef test_f_is_two():\n    assert f() == 2\n")
ADD_G = _file_diff("toy/g.py", None, "def g():\n    return 3\n")
WEAK_TEST = _file_diff("tests/test_weak.py", None, "def test_nothing_of_the_fix():\n    assert 1 + 1 == 2\n")
G_TEST = _file_diff("tests/test_g.py", None, "def test_g():\n    from toy.g import g\n    assert g() == 3\n")


def test_a_proven_diff_one_that_shows_no_defect_and_one_naming_a_test_that_never_runs(tmp_path, monkeypatch):
    p = _project(tmp_path, monkeypatch, [
        ("01-fix.diff", "tests/test_fix.py::test_f_is_two", FIX + FIX_TEST),
        ("02-weak.diff", "tests/test_weak.py::test_nothing_of_the_fix", ADD_G + WEAK_TEST),
        ("03-misspelt.diff", "tests/test_g.py::test_g tests/test_g.py::test_gg", G_TEST
         + _file_diff("toy/h.py", None, "H = 1\n")),
    ], own_test="from toy.mod import f\n\n\ndef test_f_is_positive():\n    assert f() > 0\n")
    lines: list[str] = []
    results, own, problems = check(p, out=lines.append, jobs=2)
    by = {r.name: r for r in results}
    assert by["01-fix.diff"].ok, line_for(by["01-fix.diff"])
    assert by["01-fix.diff"].before.failed and by["01-fix.diff"].after.passed
    assert not by["02-weak.diff"].ok and by["02-weak.diff"].before.passed
    assert "PASSES BEFORE THE FIX" in line_for(by["02-weak.diff"])
    misspelt = by["03-misspelt.diff"]  # pytest refuses the unknown id (exit 4) and runs nothing
    assert not misspelt.ok and "tests/test_g.py::test_gg" in misspelt.unrun and misspelt.after.error
    assert "NEVER RAN" in line_for(misspelt)
    assert own is not None and own.passed and not own.failed
    assert sorted(pr.split(": ", 1)[0] for pr in problems) == ["toy 1.0 02-weak.diff", "toy 1.0 03-misspelt.diff"]
    # the cached "installed" package and test tree are untouched
    assert (p.test_tools() / "toy" / "mod.py").read_text() == "def f():\n    return 1\n"
    assert not (p.sdist_dir() / "tests" / "test_fix.py").exists()


def test_a_series_that_breaks_upstreams_own_tests_is_a_problem(tmp_path, monkeypatch):
    """An own test that passes on the pinned release and fails with the series is a regression; one
    that fails on the pinned release too (here: it needs a device this host lacks) cannot run here and
    is listed, not judged."""
    own = ("import os\nfrom toy.mod import f\n\n\ndef test_f_is_one():\n    assert f() == 1\n\n\n"
           "def test_needs_a_device():\n    assert os.path.exists('/dev/no-such-device')\n\n\n"
           "def test_f_exists():\n    assert callable(f)\n")
    p = _project(tmp_path, monkeypatch, [("01-fix.diff", "tests/test_fix.py::test_f_is_two", FIX + FIX_TEST)],
                 own_test=own)
    results, own_out, problems = check(p, out=lambda s: None)
    assert results[0].ok
    assert own_out is not None and own_out.pinned is not None
    assert [n.rsplit("::", 1)[1] for n in own_out.regressions] == ["test_f_is_one"]
    assert [n.rsplit("::", 1)[1] for n in own_out.cannot_run_here] == ["test_needs_a_device"]
    assert [n.rsplit("::", 1)[1] for n in own_out.passed] == ["test_f_exists"]
    assert len(problems) == 1 and "1 failed that pass on the pinned release" in problems[0]
    assert "passes on the pinned release: tests/test_own::test_f_is_one" in problems[0]


def test_own_tests_that_fail_on_the_pinned_release_too_are_not_a_problem(tmp_path, monkeypatch):
    own = ("import os\n\n\ndef test_needs_a_device():\n    assert os.path.exists('/dev/no-such-device')\n\n\n"
           "def test_plain():\n    pass\n")
    p = _project(tmp_path, monkeypatch, [("01-fix.diff", "tests/test_fix.py::test_f_is_two", FIX + FIX_TEST)],
                 own_test=own)
    _, own_out, problems = check(p, out=lambda s: None)
    assert problems == [] and len(own_out.cannot_run_here) == 1 and len(own_out.passed) == 1
    assert "1 fail on the pinned release too (not run here)" in own_out.counts()


def test_a_diff_whose_code_does_not_apply_is_not_proven(tmp_path, monkeypatch):
    stale = _file_diff("toy/mod.py", "def f():\n    return 7\n", "def f():\n    return 2\n")
    p = _project(tmp_path, monkeypatch, [("01-stale.diff", "tests/test_fix.py::test_f_is_two", stale + FIX_TEST)],
                 own_test="def test_x():\n    pass\n")
    results, _, problems = check(p, out=lambda s: None, own=False)
    assert not results[0].ok and results[0].problem
    assert problems and "01-stale.diff" in problems[0]


def test_the_test_tool_locks_are_hashed_and_name_the_python_they_are_for() -> None:
    """stacks/upstream_tests/<project>-py3NN.txt: installed with --require-hashes and --no-deps, so every
    pin carries a hash; a lock per Python version a node env may use."""
    import re

    folder = Path(__file__).resolve().parents[2] / "stacks" / "upstream_tests"
    locks = sorted(folder.glob("*.txt"))
    assert {p.name for p in locks} >= {"vllm-py311.txt", "vllm-py312.txt", "vllm-ascend-py311.txt",
                                       "vllm-ascend-py312.txt"}
    for lock in locks:
        assert re.fullmatch(r"[a-z-]+-py3\d\d\.txt", lock.name), lock.name
        pins, hashed, current = set(), set(), None
        for line in lock.read_text().splitlines():
            if re.match(r"[A-Za-z0-9]", line):
                current = line.split("==")[0].lower()
                assert "==" in line, f"{lock.name}: {line!r} is not pinned"
                pins.add(current)
            elif line.strip().startswith("--hash=sha256:") and current:
                hashed.add(current)
        assert "pytest" in pins and pins == hashed, f"{lock.name}: unhashed {sorted(pins - hashed)}"


def test_a_named_test_skipped_before_its_diff_shows_no_defect(tmp_path, monkeypatch):
    """A skip (or a non-strict xfail, which JUnit reports as skipped) before the diff is not a failure."""
    skip_test = _file_diff("tests/test_skip.py", None, "import pytest\nfrom toy.mod import f\n\n\ndef test_weak():\n"
                           "    if f() != 2:\n        pytest.skip('old code')\n")
    p = _project(tmp_path, monkeypatch, [("01-fix.diff", "tests/test_fix.py::test_f_is_two tests/test_skip.py::test_weak",
                                          FIX + FIX_TEST + skip_test)], own_test="def test_x():\n    pass\n")
    results, _, problems = check(p, out=lambda s: None, own=False)
    assert results[0].before.skipped and not results[0].ok and problems


def test_a_named_test_is_matched_by_its_own_file_not_one_whose_name_it_prefixes() -> None:
    from harness.upstream import _same_test

    assert _same_test("tests/test_a.py::test_x", "tests/test_a::test_x")
    assert _same_test("tests/test_a.py::TestK::test_x", "tests/test_a/TestK::test_x[1]")
    assert not _same_test("tests/test_a.py::test_x", "tests/test_ab::test_x")


def test_an_own_test_the_series_skips_or_removes_is_a_problem(tmp_path, monkeypatch):
    """Passing on the pinned release and skipped (or gone) with the series hides a regression."""
    own = ("import pytest\nimport toy.mod as m\n\n\n@pytest.mark.skipif(m.f() != 1, reason='changed')\n"
           "def test_f_is_one():\n    assert m.f() == 1\n\n\ndef test_plain():\n    pass\n")
    p = _project(tmp_path, monkeypatch, [("01-fix.diff", "tests/test_fix.py::test_f_is_two", FIX + FIX_TEST)],
                 own_test=own)
    _, own_out, problems = check(p, out=lambda s: None)
    assert [n.rsplit("::", 1)[1] for n in own_out.lost] == ["test_f_is_one"]
    assert len(problems) == 1 and "skipped or gone with the series: tests/test_own::test_f_is_one" in problems[0]


def test_a_test_that_fails_before_only_for_a_missing_name_shows_no_defect(tmp_path, monkeypatch):
    """Before the diff, a named test that cannot import what the diff adds (at the top of its file: a
    collection error; inside the test: ModuleNotFoundError) fails without reaching its assertion: it
    shows that the diff adds a name, not the defect. A diff proven only by such tests is not proven;
    one with a test that fails on the unfixed code's behaviour is."""
    top = _file_diff("tests/test_top.py", None, "from toy.g import g\n\n\ndef test_g():\n    assert g() == 3\n")
    p = _project(tmp_path, monkeypatch, [
        ("01-new-name-top.diff", "tests/test_top.py::test_g", ADD_G + top),
        ("02-new-name-inside.diff", "tests/test_k.py::test_k", _file_diff(
            "tests/test_k.py", None, "def test_k():\n    from toy.k import K\n    assert K == 1\n")
         + _file_diff("toy/k.py", None, "K = 1\n")),
        ("03-fix.diff", "tests/test_fix.py::test_f_is_two tests/test_g2.py::test_g2", FIX + FIX_TEST + _file_diff(
            "tests/test_g2.py", None, "def test_g2():\n    from toy.g2 import g2\n    assert g2() == 4\n")
         + _file_diff("toy/g2.py", None, "def g2():\n    return 4\n")),
    ], own_test="def test_x():\n    pass\n")
    results, _, problems = check(p, out=lambda _: None, own=False, jobs=2)
    by = {r.name: r for r in results}
    for name in ("01-new-name-top.diff", "02-new-name-inside.diff"):
        r = by[name]
        assert r.before.failed and r.before.not_reached == r.before.failed and not r.shown_before, line_for(r)
        assert r.after.passed and not r.after.failed
        assert not r.ok and "NO TEST SHOWS THE DEFECT" in line_for(r)
    fix = by["03-fix.diff"]  # one test shows the defect (f() is 1), the other only a new name: proven
    assert fix.ok, line_for(fix)
    assert [n.split("::")[-1] for n in fix.shown_before] == ["test_f_is_two"]
    assert sorted(pr.split(": ", 1)[0] for pr in problems) == ["toy 1.0 01-new-name-top.diff",
                                                               "toy 1.0 02-new-name-inside.diff"]


def test_a_junit_report_that_disagrees_with_pytests_exit_code_is_not_believed(tmp_path, monkeypatch):
    """The JUnit file is written inside the tests' own process: a test that rewrites it (every case
    'passed') while pytest exits 1 leaves an outcome with an error, not a pass."""
    forge = _file_diff("tests/test_forge.py", None, (
        "import atexit, sys\nfrom toy.mod import f\n\n\n"
        "def _rewrite():\n"
        "    path = sys.argv[sys.argv.index('--junitxml') + 1]\n"
        "    open(path, 'w').write('<testsuites><testsuite><testcase classname=\"tests.test_forge\" '\n"
        "                          'name=\"test_f_is_two\"/></testsuite></testsuites>')\n\n\n"
        "def test_f_is_two():\n    atexit.register(_rewrite)\n    assert f() == 2\n"))
    p = _project(tmp_path, monkeypatch, [("01-forge.diff", "tests/test_forge.py::test_f_is_two", FIX + forge)],
                 own_test="def test_x():\n    pass\n")
    results, _, problems = check(p, out=lambda _: None, own=False, jobs=2)
    before = results[0].before
    assert before.error and "disagree" in before.error, before
    assert not results[0].ok and problems


def test_a_new_module_attribute_or_a_test_only_diff_shows_no_defect(tmp_path, monkeypatch):
    """Found by a review that tried to fool the check: a test that fails before only because a
    module lacks the function the diff adds (AttributeError on the module) shows a new name, not a
    defect; and a diff that changes no package file cannot be proven by any test (before and after
    run the same code)."""
    attr = _file_diff("tests/test_attr.py", None, "import toy.mod as m\n\n\ndef test_g():\n    assert m.g() == 3\n")
    add_g_to_mod = _file_diff("toy/mod.py", "def f():\n    return 1\n", "def f():\n    return 1\n\n\ndef g():\n    return 3\n")
    only_test = _file_diff("tests/test_only.py", None, "def test_x():\n    assert False\n")
    p = _project(tmp_path, monkeypatch, [("01-attr.diff", "tests/test_attr.py::test_g", add_g_to_mod + attr),
                                         ("02-test-only.diff", "tests/test_only.py::test_x", only_test)],
                 own_test="def test_x():\n    pass\n")
    results, _, problems = check(p, out=lambda _: None, own=False, jobs=2)
    by = {r.name: r for r in results}
    assert by["01-attr.diff"].before.not_reached and not by["01-attr.diff"].ok, line_for(by["01-attr.diff"])
    assert not by["02-test-only.diff"].ok and "changes nothing in toy/" in line_for(by["02-test-only.diff"])
    assert len(problems) == 2


def test_a_later_diff_that_breaks_an_earlier_diffs_test_is_a_problem(tmp_path, monkeypatch):
    """01's test fails before 01 and passes with it; 02 (proven by its own test) changes f again, so
    01's test fails on the whole series: each diff alone reads as proven, the series does not."""
    refix = _file_diff("toy/mod.py", "def f():\n    return 2\n", "def f():\n    return 5\n")
    refix_test = _file_diff("tests/test_refix.py", None,
                            "from toy.mod import f\n\n\ndef test_f_is_five():\n    assert f() == 5\n")
    p = _project(tmp_path, monkeypatch, [
        ("01-fix.diff", "tests/test_fix.py::test_f_is_two", FIX + FIX_TEST),
        ("02-refix.diff", "tests/test_refix.py::test_f_is_five", refix + refix_test, "01"),
    ], own_test="def test_nothing():\n    assert True\n")
    lines: list[str] = []
    results, _, problems = check(p, out=lines.append, own=False, jobs=2)
    assert all(r.ok for r in results), [line_for(r) for r in results]
    assert any("FAILS ON THE WHOLE SERIES: tests/test_fix" in pr for pr in problems), problems
    assert any("the diffs' tests on the whole series: 1 passed, 1 failed" in ln for ln in lines), lines


def test_diffs_whose_tests_pass_on_the_whole_series_are_no_problem(tmp_path, monkeypatch):
    p = _project(tmp_path, monkeypatch, [
        ("01-fix.diff", "tests/test_fix.py::test_f_is_two", FIX + FIX_TEST),
    ], own_test="def test_nothing():\n    assert True\n")
    lines: list[str] = []
    results, _, problems = check(p, out=lines.append, own=False, jobs=2)
    assert results[0].ok and problems == [], problems
    assert any("the diffs' tests on the whole series: 1 passed, 0 failed, 0 not run" in ln for ln in lines), lines


# ---------------------------------------------------------------------------------------- upstream's own gates
def test_a_diff_whose_depends_is_missing_incomplete_or_forward_is_refused(tmp_path, monkeypatch):
    """Each diff must apply on the pinned release with only what its Depends: names: 02 changes what 01
    wrote but says it needs nothing; 03 has no Depends: field at all; 04 names a later diff. 05 names 01
    and is proven on 01 alone, without 02-04 under it."""
    refix = _file_diff("toy/mod.py", "def f():\n    return 2\n", "def f():\n    return 5\n")
    refix_test = _file_diff("tests/test_refix.py", None, "from toy.mod import f\n\n\ndef test_f_is_five():\n"
                            "    assert f() == 5\n")
    p = _project(tmp_path, monkeypatch, [
        ("01-fix.diff", "tests/test_fix.py::test_f_is_two", FIX + FIX_TEST),
        ("02-refix.diff", "tests/test_refix.py::test_f_is_five", refix + refix_test, "none"),
        ("03-no-field.diff", "tests/test_g.py::test_g", ADD_G + G_TEST, None),
        ("04-forward.diff", "tests/test_k.py::test_k", _file_diff("toy/k.py", None, "K = 1\n") + _file_diff(
            "tests/test_k.py", None, "import toy.mod as m\n\n\ndef test_k():\n    from toy.k import K\n"
            "    assert K == 1 and m.f() == 2\n"), "05"),
        ("05-on-01.diff", "tests/test_refix5.py::test_f_is_five", refix + refix_test.replace("test_refix", "test_refix5"),
         "01"),
    ], own_test="def test_x():\n    pass\n")
    lines: list[str] = []
    results, _, problems = check(p, out=lines.append, own=False, jobs=2)
    by = {r.name: r for r in results}
    gate = {n: {g.name: g for g in r.gates} for n, r in by.items()}
    assert by["01-fix.diff"].ok and gate["01-fix.diff"]["depends"].ok, line_for(by["01-fix.diff"])
    assert not by["02-refix.diff"].ok and "does not apply" in gate["02-refix.diff"]["depends"].detail
    assert not by["03-no-field.diff"].ok and "no Depends: field" in gate["03-no-field.diff"]["depends"].detail
    assert not by["04-forward.diff"].ok and "not an earlier diff" in gate["04-forward.diff"]["depends"].detail
    assert by["05-on-01.diff"].ok and by["05-on-01.diff"].base == "Depends: 01", line_for(by["05-on-01.diff"])
    assert any("depends: FAILS" in ln for ln in lines) and any("depends: ok (Depends: 01" in ln for ln in lines)
    # (05 and 02 both change what 01 wrote: the whole series, in order, does not apply; a problem too)
    assert sorted(pr.split(": ", 1)[0] for pr in problems if pr.startswith("toy 1.0 0")) == [
        "toy 1.0 02-refix.diff", "toy 1.0 03-no-field.diff", "toy 1.0 04-forward.diff"]


RUFF_LOCK = Path(__file__).resolve().parents[2] / "stacks" / "upstream_tests" / "lint" / "ruff-0.14.0.txt"
PRE_COMMIT = "repos:\n- repo: https://github.com/astral-sh/ruff-pre-commit\n  rev: v0.14.0\n  hooks:\n  - id: ruff-check\n"
PYPROJECT = '[tool.ruff]\nline-length = 88\n\n[tool.ruff.lint]\nselect = ["E", "F", "I"]\n'


def _with_ruff(tmp_path: Path, monkeypatch) -> dict:
    """The gate's ruff: the folder `pdchaos setup --only upstream-tests-vllm` installed from RUFF_LOCK,
    seen from the test's own cache (its key is the lock's hash)."""
    import hashlib

    from harness.nodeenv.venv import cache_root

    key = hashlib.sha256(RUFF_LOCK.read_bytes()).hexdigest()[:12]
    real = cache_root() / "upstream" / f"lint-{RUFF_LOCK.stem}-{key}"
    if not (real / ".complete").is_file():
        pytest.skip(f"ruff is not installed: run `pdchaos setup --only upstream-tests-vllm` ({real})")
    mine = tmp_path / "cache" / "pdchaos" / "upstream" / real.name
    mine.parent.mkdir(parents=True, exist_ok=True)
    mine.symlink_to(real, target_is_directory=True)
    return {"lint_lock": RUFF_LOCK, "sdist_files": {".pre-commit-config.yaml": PRE_COMMIT, "pyproject.toml": PYPROJECT}}


def test_a_diff_whose_new_test_imports_a_name_unused_is_refused_by_ruff(tmp_path, monkeypatch):
    """The release's ruff (the version its pre-commit config names, its pyproject's rules) on the files a
    diff adds or changes: 02's new test imports `os` unused (F401) and is refused; 01 is clean; 03 only
    touches a file whose untouched lines already break a rule (judged on the diff's lines: not its)."""
    gates = _with_ruff(tmp_path, monkeypatch)
    gates["sdist_files"]["tests/test_old.py"] = "import sys\n\n\ndef test_old():\n    pass\n"
    unused = _file_diff("tests/test_unused.py", None, "import os\n\nfrom toy.g import g\n\n\ndef test_g():\n"
                        "    assert g() == 3\n")
    old_touched = _file_diff("tests/test_old.py", "import sys\n\n\ndef test_old():\n    pass\n",
                             "import sys\n\n\ndef test_old():\n    assert True\n")
    p = _project(tmp_path, monkeypatch, [
        ("01-fix.diff", "tests/test_fix.py::test_f_is_two", FIX + FIX_TEST),
        ("02-unused.diff", "tests/test_unused.py::test_g", ADD_G + unused),
        ("03-old.diff", "tests/test_fix3.py::test_h", _file_diff("toy/h.py", None, "H = 1\n") + old_touched
         + _file_diff("tests/test_fix3.py", None, "def test_h():\n    from toy.h import H\n\n    assert H == 1\n")),
    ], own_test="def test_x():\n    pass\n", **gates)
    lines: list[str] = []
    results, _, problems = check(p, out=lines.append, own=False, jobs=2)
    ruff = {r.name: next(g for g in r.gates if g.name == "ruff") for r in results}
    assert ruff["01-fix.diff"].ok, ruff["01-fix.diff"].detail
    assert not ruff["02-unused.diff"].ok and "tests/test_unused.py:1: F401" in ruff["02-unused.diff"].detail
    assert ruff["03-old.diff"].ok, ruff["03-old.diff"].detail  # `import sys` unused, but not the diff's line
    assert any(pr.startswith("toy 1.0 02-unused.diff") for pr in problems)
    assert any("ruff: FAILS (ruff 0.14.0: 1 finding(s)" in ln for ln in lines), lines


def test_ruff_pinned_at_another_version_than_the_release_names_cannot_judge(tmp_path, monkeypatch):
    gates = _with_ruff(tmp_path, monkeypatch)
    gates["sdist_files"][".pre-commit-config.yaml"] = PRE_COMMIT.replace("v0.14.0", "v0.15.2")
    p = _project(tmp_path, monkeypatch, [("01-fix.diff", "tests/test_fix.py::test_f_is_two", FIX + FIX_TEST)],
                 own_test="def test_x():\n    pass\n", **gates)
    results, _, problems = check(p, out=lambda _: None, own=False)
    ruff = next(g for g in results[0].gates if g.name == "ruff")
    assert not ruff.ok and "names ruff 0.15.2, the lint lock pins 0.14.0" in ruff.detail and problems


# a stand-in for vLLM's tethering hook, with its interface: the changed test files as arguments, exit 1
# and one "error: <file> is not run by any Buildkite job" line each for a file no job's pytest names
TOY_HOOK = '''import pathlib, re, sys
root = pathlib.Path(__file__).resolve().parents[1]
if any(a == "--crash" for a in sys.argv):
    raise SystemExit("hook: cannot read its pipeline")
ran = set()
for y in (root / ".buildkite").glob("*.yaml"):
    ran |= set(re.findall(r"pytest (\\S+)", y.read_text()))
bad = [a for a in sys.argv[1:] if a.startswith("tests/") and pathlib.Path(a).name.startswith("test_")
       and a[len("tests/"):] not in ran]
for a in bad:
    print(f"error: {a} is not run by any Buildkite job")
sys.exit(1 if bad else 0)
'''


def test_a_new_test_file_no_ci_job_runs_is_refused_by_the_tethering_hook(tmp_path, monkeypatch):
    """The release's own tethering hook, run in the sdist's tree with the diff applied: 01's new test is
    listed in the sdist's CI file; 02's is not (refused); 03 lists its new test in the CI file in the
    same diff (tethered)."""
    ci = "steps:\n- commands:\n  - pytest test_fix.py\n"
    g3 = _file_diff(".buildkite/area.yaml", ci, ci + "  - pytest test_g3.py\n")
    p = _project(tmp_path, monkeypatch, [
        ("01-fix.diff", "tests/test_fix.py::test_f_is_two", FIX + FIX_TEST),
        ("02-untethered.diff", "tests/test_g.py::test_g", ADD_G + G_TEST),
        ("03-tethered.diff", "tests/test_g3.py::test_g3", _file_diff("toy/g3.py", None, "G3 = 3\n") + _file_diff(
            "tests/test_g3.py", None, "import importlib.util\n\n\ndef test_g3():\n"
            "    assert importlib.util.find_spec('toy.g3') is not None\n") + g3),
    ], own_test="def test_x():\n    pass\n", tethering="tools/hook.py",
        sdist_files={"tools/hook.py": TOY_HOOK, ".buildkite/area.yaml": ci})
    results, _, problems = check(p, out=lambda _: None, own=False, jobs=2)
    teth = {r.name: next(g for g in r.gates if g.name == "tethering") for r in results}
    assert teth["01-fix.diff"].ok, teth["01-fix.diff"].detail
    assert not teth["02-untethered.diff"].ok
    assert teth["02-untethered.diff"].detail == "tests/test_g.py is not run by any Buildkite job"
    assert teth["03-tethered.diff"].ok, teth["03-tethered.diff"].detail
    assert [pr.split(": ", 1)[0] for pr in problems] == ["toy 1.0 02-untethered.diff"]


def test_a_tethering_hook_that_crashes_cannot_judge(tmp_path, monkeypatch):
    p = _project(tmp_path, monkeypatch, [("01-fix.diff", "tests/test_fix.py::test_f_is_two", FIX + FIX_TEST)],
                 own_test="def test_x():\n    pass\n", tethering="tools/hook.py",
                 sdist_files={"tools/hook.py": "raise SystemExit(3)\n"})
    results, _, problems = check(p, out=lambda _: None, own=False)
    teth = next(g for g in results[0].gates if g.name == "tethering")
    assert not teth.ok and "the hook exited 3" in teth.detail and problems


def test_the_lint_lock_is_hashed_and_pins_the_ruff_the_releases_name() -> None:
    from harness.upstream_gates import ruff_version_locked

    text = RUFF_LOCK.read_text()
    assert ruff_version_locked(RUFF_LOCK) == "0.14.0"
    assert text.count("--hash=sha256:") >= 2 and "ruff==0.14.0 \\" in text


def test_a_proven_diff_gets_a_pr_body_in_its_projects_template(tmp_path, monkeypatch):
    """`--pr-bodies`: the template's headings in order, the header's subject and defect, the named tests'
    command and what this run saw before and after the diff, the footer; a diff not proven gets none."""
    from harness.upstream_pr import write_pr_bodies

    p = _project(tmp_path, monkeypatch, [
        ("01-fix.diff", "tests/test_fix.py::test_f_is_two", FIX + FIX_TEST),
        ("02-weak.diff", "tests/test_weak.py::test_nothing_of_the_fix", ADD_G + WEAK_TEST),
    ], own_test="def test_x():\n    pass\n",
        pr_sections=(("## Purpose", ("what", "change")), ("## Test Plan", ("tests",)), ("## Notes", ("details",))),
        pr_footer="Signed-off-by: NAME <EMAIL>")
    results, _, _ = check(p, out=lambda _: None, own=False, jobs=2)
    written = write_pr_bodies(p, results)
    assert [w.name for w in written] == ["01-fix.pr.md"]
    body = written[0].read_text()
    assert body.index("## Purpose") < body.index("## Test Plan") < body.index("## Notes")
    assert "**01-fix.diff**" in body and "pytest -v tests/test_fix.py" in body
    assert "without this change (the pinned release): 1 failed, 0 passed. With it: 1 passed" in body
    assert "Applies on its own on toy 1.0." in body and body.rstrip().endswith("Signed-off-by: NAME <EMAIL>")
