"""The upstream diffs (connector_patch/upstream/): every series reads (header fields, numbering, a/ b/
paths), its package part applies, as written, to the package the node env installs (the patched
target's copy is built from exactly that), every runtime patch names a diff that exists, and every
diff carries tests of its own in upstream's tree. A diff that no longer applies says the patch and its
diff have drifted apart. Whether each diff's tests fail before it and pass after it is `pdchaos
upstream check` (tests/harness/test_upstream_check.py proves its rules)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from connector_patch.upstream import (HERE, SeriesError, package_patch, read_diff, read_series, series_key)
from harness.upstream import TEST_ID

REPO = Path(__file__).resolve().parents[2]
# every <project>/<version>/ series (prs/ holds pull-request folders: tests/harness/test_upstream_pr_folders.py)
SERIES = sorted((p.parent.name, p.name) for p in HERE.glob("*/*") if p.is_dir() and p.parent.name != "prs")
pytestmark = pytest.mark.timeout(60)


def test_there_are_series_and_the_runtime_patches_name_their_diffs() -> None:
    assert ("vllm", "0.32.0") in {(proj, ver) for proj, ver in SERIES}
    names = {d.name for d in read_series("vllm", "0.32.0")}
    assert {"01-engine-core-quiet-wait.diff", "02-shm-broadcast-adaptive-spin.diff",
            "03-kv-output-aggregator-failed-early.diff"} <= names
    for mod in sorted(REPO.glob("connector_patch/*/patch_*.py")):
        named = re.findall(r"connector_patch/upstream/([\w.-]+/[\w.+-]+/\d\d-[a-z0-9-]+\.diff)", mod.read_text())
        assert named, f"{mod.name} names no upstream diff"
        for rel in named:
            assert (HERE / rel).is_file(), f"{mod.name} names {rel}, which does not exist"


@pytest.mark.parametrize("project,version", SERIES)
def test_each_diff_reads_and_carries_tests_of_its_own(project: str, version: str) -> None:
    diffs = read_series(project, version)
    assert diffs, f"connector_patch/upstream/{project}/{version}/ holds no diff"
    package = project.replace("-", "_")
    for d in diffs:
        assert d.package_files(package), f"{d.name} changes nothing in {package}/"
        assert d.test_files(), f"{d.name} brings no test in upstream's tests/ tree"
        for f in d.files:  # and vLLM's CI test areas, where a new test file is listed (its tethering hook)
            assert f.path.startswith((f"{package}/", "tests/", ".buildkite/test_areas/")), (
                f"{d.name}: {f.path} is outside {package}/, tests/ and .buildkite/test_areas/")
        for f in d.package_files(package):  # upstream's code: nothing of pd-chaos
            added = "".join(ln[1:] for ln in f.text.splitlines(keepends=True) if ln.startswith("+")
                            and not ln.startswith("+++"))
            assert not re.search(r"\b(connector_patch|pdchaos|pd_chaos)\b", added), f"{d.name}: {f.path} names pd-chaos"


def test_a_diff_without_its_header_or_with_a_bad_name_is_refused(tmp_path: Path) -> None:
    body = "--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1 +1 @@\n-a\n+b\n"
    bad = tmp_path / "01-no-header.diff"
    bad.write_text("Subject: s\n" + body)
    with pytest.raises(SeriesError, match="header lacks Defect, Guarantee, Scenarios, Tests"):
        read_diff(bad)
    named = tmp_path / "fix.diff"
    named.write_text(body)
    with pytest.raises(SeriesError, match="NN-slug.diff"):
        read_diff(named)
    nopath = tmp_path / "02-plain.diff"
    nopath.write_text("Subject: s\nDefect: d\nGuarantee: g\nScenarios: x\nTests: t\n"
                      "--- vllm/x.py\n+++ vllm/x.py\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(SeriesError, match="paths start with a/ and b/"):
        read_diff(nopath)


def test_the_package_part_and_its_key(tmp_path: Path) -> None:
    diffs = read_series("vllm", "0.32.0")
    text = package_patch(diffs, "vllm")
    assert "+++ b/tests/" not in text and "+++ b/vllm/" in text
    assert series_key(diffs, "vllm") == series_key(read_series("vllm", "0.32.0"), "vllm")
    assert series_key(diffs[:1], "vllm") != series_key(diffs, "vllm")


def _node_site():
    from stacks.vllm_cpu.recipe import pd_node_env

    env = pd_node_env(out=lambda line: None)
    if not env.installed():
        pytest.skip("the P/D node stack is not installed here: run `pdchaos setup --only pd-node-stack`")
    return env.site_packages()


def test_the_vllm_series_applies_to_the_node_envs_vllm_as_a_copy() -> None:
    """The patched target's copy: every changed file differs from the installed one and is a file of
    its own; every other file is the installed one (a hard link); the installed files are untouched."""
    from harness.nodeenv.overlay import overlay_for

    site = _node_site()
    diffs = read_series("vllm", "0.32.0")
    changed = sorted({f.path for d in diffs for f in d.package_files("vllm")})
    before = {rel: (site / rel).read_bytes() if (site / rel).exists() else None for rel in changed}
    root = overlay_for(site, "vllm", package_patch(diffs, "vllm"), series_key(diffs, "vllm"), "vllm 0.32.0")
    for rel in changed:
        assert (root / rel).read_bytes() != before[rel], f"{rel} is unchanged in the copy"
        if before[rel] is None:  # a module the series adds: only in the copy
            assert not (site / rel).exists(), f"{rel} was written into the node env"
        else:
            assert not (root / rel).samefile(site / rel)
            assert (site / rel).read_bytes() == before[rel], f"the installed {rel} was written"
        compile((root / rel).read_text(), rel, "exec")
    untouched = root / "vllm" / "logger.py"  # a module no diff of the series changes (envs.py: 01, 02)
    assert "vllm/logger.py" not in changed
    assert untouched.samefile(site / "vllm" / "logger.py")
    again = overlay_for(site, "vllm", package_patch(diffs, "vllm"), series_key(diffs, "vllm"), "vllm 0.32.0")
    assert again == root  # built once per key


def test_a_diff_that_does_not_apply_is_one_error_and_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    from harness.nodeenv import overlay

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("x = 1\n")
    bad = "--- a/pkg/__init__.py\n+++ b/pkg/__init__.py\n@@ -1 +1 @@\n-x = 2\n+x = 3\n"
    with pytest.raises(overlay.OverlayError, match="do not apply to the installed pkg"):
        overlay.overlay_for(site, "pkg", bad, "k1", "pkg 1.0")
    assert not [p for p in (tmp_path / "cache" / "pdchaos" / "patched").iterdir()], "a half-built copy was left"
    good = "--- a/pkg/__init__.py\n+++ b/pkg/__init__.py\n@@ -1 +1 @@\n-x = 1\n+x = 3\n"
    root = overlay.overlay_for(site, "pkg", good, "k2", "pkg 1.0")
    assert (root / "pkg" / "__init__.py").read_text() == "x = 3\n"
    assert (site / "pkg" / "__init__.py").read_text() == "x = 1\n"
    with pytest.raises(overlay.OverlayError, match="not installed"):
        overlay.overlay_for(site, "other", good, "k3", "other 1.0")


def _named_files(field: str) -> set[str]:
    """The test files a header field names (``tests/...py`` or ``tests/...py::name``)."""
    return {t.split("::", 1)[0] for t in TEST_ID.findall(field)}


def _removed_lines(text: str) -> int:
    return sum(1 for ln in text.splitlines() if ln.startswith("-") and not ln.startswith("---"))


@pytest.mark.parametrize("project,version", SERIES)
def test_a_diff_that_changes_upstreams_own_tests_names_them_in_tests_changed(project: str, version: str) -> None:
    """A diff may add tests to one of upstream's test files freely; a diff that changes or removes a
    line of upstream's own tests (a file the pinned release has, not one an earlier diff of the series
    added) names that file in its Tests-changed field, with the reason, and names no file it leaves alone."""
    ours: set[str] = set()  # test files the series itself added
    for d in read_series(project, version):
        named = _named_files(d.header.get("Tests-changed", ""))
        changed = {f.path for f in d.test_files() if not f.new_file and f.path not in ours
                   and _removed_lines(f.text)}
        assert changed <= named, (f"{d.name} changes upstream's own tests in {sorted(changed - named)} "
                                  "without naming them in Tests-changed")
        touched = {f.path for f in d.test_files()}
        assert named <= touched, f"{d.name}: Tests-changed names {sorted(named - touched)}, which it does not touch"
        ours |= {f.path for f in d.test_files() if f.new_file}


def test_the_tests_changed_rule_refuses_a_silent_change(tmp_path: Path) -> None:
    """The rule itself, on a made-up diff that rewrites an assertion of an upstream test and says nothing."""
    body = ("Subject: s\nDefect: d\nGuarantee: g\nScenarios: none\nTests: tests/test_x.py::test_new\n"
            "Tests-changed: none\n\n"
            "diff --git a/tests/test_x.py b/tests/test_x.py\n--- a/tests/test_x.py\n+++ b/tests/test_x.py\n"
            "@@ -1,2 +1,2 @@\n def test_old():\n-    assert f() == 1\n+    assert f() == 2\n"
            "diff --git a/toy/m.py b/toy/m.py\n--- a/toy/m.py\n+++ b/toy/m.py\n@@ -1 +1 @@\n-A = 1\n+A = 2\n")
    f = tmp_path / "01-x.diff"
    f.write_text(body)
    d = read_diff(f)
    changed = {x.path for x in d.test_files() if not x.new_file and _removed_lines(x.text)}
    assert changed == {"tests/test_x.py"}
    assert not changed <= _named_files(d.header.get("Tests-changed", ""))
