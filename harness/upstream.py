"""``pdchaos upstream check``: the upstream diffs proven the way a reviewer would prove them.

A family that runs an upstream project's code names it (:meth:`harness.family.Family.upstream_projects`):
the release its node env installs, the sdist that release was built from (its ``tests/`` are upstream's
own tests), the series of diffs against it (connector_patch/upstream/, read by the family: the core
imports neither the patch nor the stacks), and which of upstream's test files cover which package files.

For each diff of a series, in order:

* **before**: the package with the diffs before it applied, upstream's tests with those diffs' test
  parts and this diff's test part applied: every test the diff names (its ``Tests:`` header field) must
  fail (a test that passes on the unfixed code does not show the defect);
* **after**: the package and tests with this diff applied too: every one of them must pass.

Then, with the whole series applied, upstream's own test files for every package file the series
changes must pass (tests that skip, e.g. those needing CUDA, are listed as not run). Each pytest run is
the node env's Python with the package copy (harness/nodeenv/overlay.py) and the test tools first on
``PYTHONPATH``, in a copy of the sdist's test tree; outcomes come from pytest's JUnit XML, never from
its text. Every test has a timeout (pytest-timeout: unfixed code that hangs fails its test) and so has
every run. Nothing installed is touched.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import upstream_gates as gates
from .errors import HarnessError
from .nodeenv.overlay import _link_tree, own_copy, publish, series_overlay
from .nodeenv.venv import cache_root

PYTEST_TIMEOUT_S = 1200.0
# a failure message (pytest's JUnit ``message``) that says the test never reached what it asserts
# (a missing module, a name a module does not have yet, a name never bound, a strict xfail that passed)
NOT_REACHED = re.compile(r"(?:\w+\.)*(?:ImportError|ModuleNotFoundError|NameError)\b|collection failure"
                         r"|(?:\w+\.)*AttributeError: module '[\w.]+' has no attribute|\[XPASS\(strict\)\]")
TEST_ID = re.compile(r"\btests/[\w./-]+\.py(?:::[\w\[\]./-]+)*")


@dataclass
class UpstreamProject:
    """One upstream release a family's nodes run, and how its own tests run here."""
    project: str  # its PyPI name: vllm, vllm-ascend
    version: str
    package: str  # the import package the diffs change: vllm, vllm_ascend
    sdist_url: str
    sdist_sha256: str
    python: Callable[[], Path]  # the node env's interpreter
    site_packages: Callable[[], Path]  # where it has the package installed
    series: Callable[[], list]  # the diffs, in order (connector_patch.upstream.Diff-like)
    own_tests: dict[str, list[str]]  # package file (prefix) -> upstream's test files that cover it
    tools_lock: Path  # pytest & co. for the node env's Python, with hashes (installed beside it, never in it)
    env: dict[str, str] = field(default_factory=dict)
    prepare: Callable[[Path], dict[str, str]] | None = None  # (test tree) -> more environment
    root_files: tuple[str, ...] = ("pyproject.toml",)
    test_timeout_s: float = 120.0  # per test (pytest-timeout, in the tools lock): code that hangs fails its test
    package_in_tree: bool = False  # the tests find the package beside tests/ (vllm-ascend's _mock_deps.py does)
    # upstream's own gates (harness/upstream_gates.py): more of the sdist kept beside tests/ (its pre-commit
    # config, CI test areas, hooks), ruff pinned at the version that config names, and the release's
    # test-tethering hook (a path in the sdist; None where the project has none)
    gate_files: tuple[str, ...] = (".pre-commit-config.yaml",)
    lint_lock: Path | None = None
    tethering: str | None = None
    # the release's pull-request template: (heading, what goes in it) in order, and what ends every body
    # (harness/upstream_pr.py: what, change, tests, details, user-facing)
    pr_sections: tuple[tuple[str, tuple[str, ...]], ...] = ()
    pr_footer: str = ""

    @property
    def label(self) -> str:
        return f"{self.project} {self.version}"

    def sdist_dir(self) -> Path:
        kept = hashlib.sha256("\0".join((*self.root_files, *self.gate_files)).encode()).hexdigest()[:6]
        return cache_root() / "upstream" / f"{self.project}-{self.version}-{self.sdist_sha256[:12]}-{kept}"

    def test_tools(self) -> Path:
        key = hashlib.sha256(self.tools_lock.read_bytes()).hexdigest()[:12]
        return cache_root() / "upstream" / f"tools-{self.tools_lock.stem}-{key}"

    def lint_tools(self) -> Path | None:
        if self.lint_lock is None:
            return None
        key = hashlib.sha256(self.lint_lock.read_bytes()).hexdigest()[:12]
        return cache_root() / "upstream" / f"lint-{self.lint_lock.stem}-{key}"

    def ruff(self) -> Path | None:
        tools = self.lint_tools()
        return tools / "bin" / "ruff" if tools is not None and (tools / ".complete").is_file() else None

    def ready(self) -> bool:
        """The sdist's tree, the test tools and the lint tools are all in the cache."""
        lint = self.lint_tools()
        return ((self.sdist_dir() / ".complete").is_file() and (self.test_tools() / ".complete").is_file()
                and (lint is None or (lint / ".complete").is_file()))


def install_tools(p: UpstreamProject, timeout_s: float = 600.0, lint: bool = False) -> Path:
    """The test tools of ``p.tools_lock`` (``lint``: the lint tools of ``p.lint_lock``) in their own
    folder (uv, --require-hashes, no dependencies resolved: the lock lists every one), for the node
    env's Python. Idempotent: an installed folder is kept."""
    final = p.lint_tools() if lint else p.test_tools()
    lock = p.lint_lock if lint else p.tools_lock
    if final is None or lock is None:
        raise HarnessError(f"{p.label}: no lint lock")
    if (final / ".complete").is_file():
        return final
    from .nodeenv.lock import uv_bin

    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tools-", dir=final.parent))
    try:
        cmd = [uv_bin(), "pip", "install", "--target", str(tmp / "t"), "--no-deps", "--require-hashes",
               "--python", str(p.python()), "-r", str(lock), "-q"]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise HarnessError(f"{p.label}: installing the tools of {lock.name} took longer than {timeout_s:g} s") from None
        if res.returncode != 0:
            last = [ln for ln in res.stderr.splitlines() if ln.strip()][-1:] or ["no output"]
            raise HarnessError(f"{p.label}: installing the tools ({lock.name}) failed: {last[0][:200]}")
        return publish(tmp / "t", final, lock.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class UpstreamTestsStep:
    """``pdchaos setup`` step (optional: CI and ``pdchaos upstream check`` pick it by name): the sdist's
    test tree and the test tools of one upstream release."""

    optional = True

    def __init__(self, project: UpstreamProject, needs: Callable[[], str | None]):
        self.project = project
        self.name = f"upstream-tests-{project.project}"
        self._needs = needs  # the node env's own step: None when it is installed, else its name

    def check(self) -> str | None:
        p = self.project
        if self._needs() is not None or not p.tools_lock.is_file():
            return None
        if p.ready():
            return (f"{p.label}'s tests in {p.sdist_dir()}, pytest in {p.test_tools()}"
                    + (f", ruff in {p.lint_tools()}" if p.lint_lock is not None else ""))
        return None

    def plan(self) -> str:
        p = self.project
        return (f"download {p.sdist_url} (sha256 checked), install {p.tools_lock.name}"
                + (f" and {p.lint_lock.name}" if p.lint_lock is not None else ""))

    def install(self) -> None:
        from .setup import StepFailed

        missing = self._needs()
        if missing is not None:
            raise StepFailed(f"{self.project.label}'s node env is not installed",
                             f"pdchaos setup --only {missing} --only {self.name}")
        try:
            fetch_sdist(self.project)
            install_tools(self.project)
            if self.project.lint_lock is not None:
                install_tools(self.project, lint=True)
        except (HarnessError, OSError) as e:
            raise StepFailed(str(e), f"pdchaos setup --only {self.name}") from None


# ---------------------------------------------------------------------------------------- the sdist
def fetch_sdist(p: UpstreamProject, timeout_s: float = 600.0) -> Path:
    """The sdist's test tree (``tests/`` and its root files) in the cache, downloaded once and checked
    against its sha256; returns the folder."""
    final = p.sdist_dir()
    if (final / ".complete").is_file():
        return final
    import urllib.request

    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".sdist-", dir=final.parent))
    try:
        archive = tmp / "sdist.tar.gz"
        h = hashlib.sha256()
        with urllib.request.urlopen(p.sdist_url, timeout=60) as r, open(archive, "wb") as f:
            deadline = time.monotonic() + timeout_s
            while chunk := r.read(1 << 20):
                h.update(chunk)
                f.write(chunk)
                if time.monotonic() > deadline:
                    raise HarnessError(f"{p.label}: the sdist download took longer than {timeout_s:g} s")
        if h.hexdigest() != p.sdist_sha256:
            raise HarnessError(f"{p.label}: the sdist's sha256 is {h.hexdigest()[:16]}..., not the pinned "
                               f"{p.sdist_sha256[:16]}...")
        tree = tmp / "tree"
        with tarfile.open(archive) as tf:
            top = tf.getnames()[0].split("/", 1)[0]
            keep = tuple(f"{top}/{n}" for n in p.gate_files)
            wanted = [m for m in tf.getmembers()
                      if m.name.startswith(f"{top}/tests/") or m.name in {f"{top}/{n}" for n in p.root_files}
                      or m.name in keep or m.name.startswith(tuple(k for k in keep if k.endswith("/")))]
            tf.extractall(tree, members=wanted, filter="data")
        shutil.move(str(tree / top), str(tmp / "src"))
        return publish(tmp / "src", final, f"{p.sdist_url}\n{p.sdist_sha256}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------- trees
def _apply(root: Path, text: str, what: str) -> None:
    if not text.strip():
        return
    changed = sorted({ln[6:].split("\t")[0].strip() for ln in text.splitlines() if ln.startswith("+++ b/")})
    for rel in changed:  # never write through a hard link into the cached sdist
        own_copy(root / rel)
    res = subprocess.run(["git", "apply", "-p1", "--whitespace=nowarn", "-"], cwd=root, input=text,
                         capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        first = next((ln for ln in res.stderr.splitlines() if ln.strip()), "no output")
        raise HarnessError(f"{what}: does not apply: {first}")


def test_tree(p: UpstreamProject, diffs: list, with_tests_of: list, into: Path) -> Path:
    """A copy of the sdist's test tree with the test part of ``with_tests_of`` applied (and what they
    change beside the package and tests/, e.g. vLLM's .buildkite/ test areas)."""
    src = fetch_sdist(p)
    _link_tree(src, into)
    (into / ".complete").unlink(missing_ok=True)
    for d in with_tests_of:
        _apply(into, "".join(f.text for f in [*d.test_files(), *d.other_files(p.package)]),
               f"{p.label} {d.name} (tests)")
    return into


def package_copy(p: UpstreamProject, diffs: list) -> Path:
    text = "".join(f.text for d in diffs for f in d.package_files(p.package))
    if not text.strip():  # nothing changed in the package: the installed one, through an empty folder
        empty = cache_root() / "upstream" / "empty"
        empty.mkdir(parents=True, exist_ok=True)
        return empty
    return series_overlay(p.site_packages(), p.package, lambda: diffs, f"{p.label} {diffs[-1].name}")


def named_tests(diff: Any) -> list[str]:
    """The tests a diff names in its ``Tests:`` field (``tests/...py`` or ``tests/...py::name``) that lie in
    test files the diff itself adds or changes (other tests it mentions, e.g. pd-chaos's own, prove
    nothing about the diff here)."""
    own = {f.path for f in diff.test_files()}
    return [t for t in dict.fromkeys(TEST_ID.findall(diff.header.get("Tests", ""))) if t.split("::", 1)[0] in own]


# ---------------------------------------------------------------------------------------- pytest
@dataclass
class Outcome:
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    error: str | None = None  # the run itself failed (nothing collected, timeout, crash)
    seconds: float = 0.0
    # failed tests that failed without reaching what they assert: a collection or set-up error (JUnit's
    # <error>) or a name the code does not have yet (ImportError, ModuleNotFoundError); the rest of
    # ``failed`` failed in the test's own body (an assertion, an exception of the code under test)
    not_reached: list[str] = field(default_factory=list)
    # each failed test's first line of pytest's failure message (JUnit's ``message``), for a PR's test output
    messages: dict[str, str] = field(default_factory=dict)

    def counts(self) -> str:
        return f"{len(self.passed)} passed, {len(self.failed)} failed, {len(self.skipped)} not run"


# a failure's first line as kept (long enough that a reader shortens it only after replacing its paths)
MESSAGE_KEEP = 2000


def run_pytest(p: UpstreamProject, tree: Path, overlay: Path, ids: list[str], timeout_s: float = PYTEST_TIMEOUT_S,
               scratch: Path | None = None) -> Outcome:
    (scratch or tree).mkdir(parents=True, exist_ok=True)
    junit = (scratch or tree) / f"junit-{hashlib.sha1(' '.join(ids).encode()).hexdigest()[:8]}.xml"
    if p.package_in_tree:  # a tree of this run's own: the package under test beside tests/, as in a checkout
        own = (scratch or tree) / "tree"
        if not own.exists():
            _link_tree(tree, own)
            src = overlay if (overlay / p.package).is_dir() else p.site_packages()
            (own / p.package).symlink_to(src / p.package, target_is_directory=True)
        tree = own
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(p.env)
    if p.prepare is not None:
        env.update(p.prepare(tree))
    env["PYTHONPATH"] = os.pathsep.join([str(overlay), str(p.test_tools())])
    env["PYTHONNOUSERSITE"] = "1"
    cmd = [str(p.python()), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors",
           f"--timeout={p.test_timeout_s:g}", "--junitxml", str(junit), *ids]
    t0 = time.monotonic()
    out = Outcome()
    try:
        res = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout_s,
                             start_new_session=True)
    except subprocess.TimeoutExpired:
        out.error = f"pytest took longer than {timeout_s:g} s"
        return out
    out.seconds = time.monotonic() - t0
    if not junit.is_file():
        last = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip()][-1:] or ["no output"]
        out.error = f"pytest exited {res.returncode} without a report: {last[0][:200]}"
        return out
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('file') or case.get('classname', '').replace('.', '/')}::{case.get('name')}"
        kinds = {c.tag for c in case}
        if kinds & {"failure", "error"}:
            out.failed.append(name)
            message = next((c.get("message") or "" for c in case if c.tag in ("failure", "error")), "")
            out.messages[name] = (message.strip().splitlines() or [""])[0][:MESSAGE_KEEP]
            if "error" in kinds or NOT_REACHED.match(message):
                out.not_reached.append(name)
        elif "skipped" in kinds:
            out.skipped.append(name)
        else:
            out.passed.append(name)
    if res.returncode not in (0, 1) and not out.failed:  # 2-5: interrupted, usage, nothing collected
        out.error = f"pytest exited {res.returncode}"
    # the report is a file the tests' own process writes: it must agree with pytest's exit code
    # (0: nothing failed; 1: something did), or neither is believed
    elif (res.returncode == 0) == bool(out.failed):
        out.error = (f"pytest exited {res.returncode} but its JUnit report has {len(out.failed)} failed: the "
                     "two disagree (a report written by something other than pytest?)")
    return out


# ---------------------------------------------------------------------------------------- the check
@dataclass
class DiffResult:
    name: str
    tests: list[str]
    before: Outcome | None = None
    after: Outcome | None = None
    problem: str | None = None
    gates: list = field(default_factory=list)  # harness.upstream_gates.Gate: depends, ruff, tethering
    base: str = "the diffs before it"  # what before/after ran on: its Depends, or the series up to it

    @property
    def gates_ok(self) -> bool:
        return bool(self.gates) and all(g.ok for g in self.gates)

    @property
    def unrun(self) -> list[str]:
        """Named tests (``file::name``) that the run with the diff never reported: a misspelt or
        uncollected test proves nothing, in either direction."""
        if self.after is None:
            return []
        seen = self.after.passed + self.after.failed + self.after.skipped
        return [t for t in self.tests if "::" in t and not any(_same_test(t, s) for s in seen)]

    @property
    def shown_before(self) -> list[str]:
        """Named tests that failed before the diff in their own body: what shows the defect. A test
        that cannot even be collected or import its names before the diff shows only that the diff
        adds them."""
        if self.before is None:
            return []
        return [n for n in self.before.failed if n not in self.before.not_reached]

    @property
    def ok(self) -> bool:
        return (self.problem is None and self.gates_ok and self.before is not None and self.after is not None
                and not self.before.error and not self.after.error
                and not self.before.passed and not self.before.skipped and bool(self.shown_before)
                and not self.after.failed and not self.after.skipped and bool(self.after.passed)
                and not self.unrun)


def _same_test(named: str, reported: str) -> bool:
    """``tests/a/test_b.py::test_c`` (a diff's header) against JUnit's ``tests/a/test_b::test_c`` or
    ``tests/a/test_b/TestK::test_c`` (parametrized ids included)."""
    file, _, name = named.partition("::")
    rfile, _, rname = reported.rpartition("::")
    stem = file[:-3] if file.endswith(".py") else file
    head = name.split("::")[-1]
    return (rfile == stem or rfile.startswith(stem + "/")) and (rname == head or rname.startswith(head + "["))


def own_test_files(p: UpstreamProject, diffs: list) -> list[str]:
    changed = {f.path for d in diffs for f in d.package_files(p.package)}
    files: list[str] = []
    for prefix, tests in p.own_tests.items():
        if any(c.startswith(prefix) for c in changed):
            files += [t for t in tests if t not in files]
    return files


@dataclass
class OwnOutcome(Outcome):
    """Upstream's own tests with the series, judged against the pinned release: a test that fails on
    the pinned release too cannot run here (CUDA, a network name) and is listed as not run, with the
    pinned run's outcome as the reason; one that passed there and fails with the series is a
    regression."""
    pinned: Outcome | None = None
    cannot_run_here: list[str] = field(default_factory=list)
    regressions: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)  # passed on the pinned release, skipped or gone with the series

    def counts(self) -> str:
        return (f"{len(self.passed)} passed, {len(self.regressions)} failed that pass on the pinned release, "
                f"{len(self.lost)} that pass on the pinned release skipped or gone, "
                f"{len(self.cannot_run_here)} fail on the pinned release too (not run here), "
                f"{len(self.skipped)} skipped")


def own_tests(p: UpstreamProject, diffs: list, files: list[str], scratch: Path,
              jobs: int = 2) -> tuple[OwnOutcome, list[str]]:
    res = OwnOutcome()
    try:
        pinned_tree = test_tree(p, [], [], scratch / "own-pinned")
        tree = test_tree(p, diffs, diffs, scratch / "own")
        pinned_pkg, pkg = package_copy(p, []), package_copy(p, diffs)
    except HarnessError as e:
        res.error = str(e)
        return res, [f"{p.label}: upstream's own tests: {e}"]
    with ThreadPoolExecutor(max_workers=max(1, min(2, jobs))) as pool:
        fp = pool.submit(run_pytest, p, pinned_tree, pinned_pkg, files, scratch=scratch / "own-pinned-out")
        fs = pool.submit(run_pytest, p, tree, pkg, files, scratch=scratch / "own-out")
        pinned, series = fp.result(), fs.result()
    res.pinned, res.passed, res.skipped, res.seconds = pinned, series.passed, series.skipped, series.seconds
    res.error = series.error or (f"on the pinned release: {pinned.error}" if pinned.error else None)
    failed_pinned, passed_pinned = set(pinned.failed), set(pinned.passed)
    for name in series.failed:
        (res.cannot_run_here if name in failed_pinned else res.regressions).append(name)
    res.failed = list(series.failed)
    res.lost = sorted(passed_pinned - set(series.passed) - set(series.failed))
    problems = []
    if res.error or res.regressions or res.lost or not res.passed:
        problems.append(f"{p.label}: upstream's own tests with the series applied: {res.counts()}"
                        + (f"; {res.error}" if res.error else "")
                        + "".join(f"\n    failed with the series"
                                  + (", passes on the pinned release" if n in passed_pinned else "")
                                  + f": {n}" for n in res.regressions[:20])
                        + "".join(f"\n    passes on the pinned release, skipped or gone with the series: {n}"
                                  for n in res.lost[:20]))
    return res, problems


def check(p: UpstreamProject, out: Callable[[str], None] = print, only: list[str] | None = None,
          own: bool = True, jobs: int = 2) -> tuple[list[DiffResult], Outcome | None, list[str]]:
    """Before/after for each diff (``only``: those whose name starts with one of these), then
    upstream's own tests with the whole series. Returns the per-diff results, the own tests' outcome
    and the problems (each one line)."""
    diffs = p.series()
    problems: list[str] = []
    if not diffs:
        return [], None, [f"{p.label}: no diffs"]
    results: list[DiffResult] = []
    with tempfile.TemporaryDirectory(prefix="pdchaos-upstream-") as tmp:
        scratch = Path(tmp)
        jobs_of: list[tuple[DiffResult, Any, Any]] = []
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            for i, d in enumerate(diffs):  # trees and package copies one by one, the pytest runs side by side
                if only and not any(d.name.startswith(o) for o in only):
                    continue
                r = DiffResult(d.name, named_tests(d))
                results.append(r)
                r.gates.append(gates.size_gate(d, gates.SIZE_LIMIT))
                # before and after run on what the diff's Depends: names (a maintainer applies it with
                # those PRs only); where that is missing or does not apply, on the series up to it
                needed, why = gates.closure(d, diffs)
                dep = gates.depends_gate(p, d, needed, why, scratch / f"{i}-depends", apply=_apply,
                                         fetch_sdist=fetch_sdist)
                r.gates.append(dep)
                base = needed if dep.ok and needed is not None else diffs[:i]
                if dep.ok:
                    r.base = gates.depends_label(d, needed)
                if not d.package_files(p.package):  # before and after would run the same code
                    r.problem = f"it changes nothing in {p.package}/: its tests cannot show a fix"
                    continue
                if not r.tests:
                    r.problem = "its Tests: field names no test (tests/...py or tests/...py::name)"
                    continue
                try:
                    tree = test_tree(p, [*base, d], [*base, d], scratch / f"{i}-tests")
                    before, after = package_copy(p, base), package_copy(p, [*base, d])
                except HarnessError as e:
                    r.problem = str(e)
                    continue
                if p.lint_lock is not None:  # the project's linter, as its release configures it
                    texts = gates.diff_texts(p, d, after, tree, scratch / f"{i}-texts")
                    r.gates.append(gates.Gate("ruff", False, texts) if isinstance(texts, str) else
                                   gates.ruff_gate(p, d, *texts, p.ruff(),
                                                   gates.lint_root(p, after, tree, scratch / f"{i}-lint")))
                teth = gates.tethering_gate(p, d, tree)
                if teth is not None:
                    r.gates.append(teth)
                jobs_of.append((r, pool.submit(run_pytest, p, tree, before, r.tests, scratch=scratch / f"{i}-b"),
                                pool.submit(run_pytest, p, tree, after, r.tests, scratch=scratch / f"{i}-a")))
            for r, b, a in jobs_of:
                r.before, r.after = b.result(), a.result()
        for r in results:
            out("  " + line_for(r))
            for g in r.gates:
                out("      " + g.line())
        problems += _on_the_whole_series(p, diffs, results, scratch, out)
        own_out = None
        if own:
            files = own_test_files(p, diffs)
            if files:
                out(f"  upstream's own tests for the patched files ({len(files)} files): the pinned release and the "
                    "whole series, side by side ...")
                own_out, probs = own_tests(p, diffs, files, scratch, jobs)
                out(f"  upstream's own tests: {own_out.counts()}" + (f" ({own_out.error})" if own_out.error else "")
                    + f" in {own_out.seconds:.0f} s")
                problems += probs
    for r in results:
        if not r.ok:
            problems.append(f"{p.label} {r.name}: {line_for(r)}"
                            + "".join(f"\n    {g.line()}" for g in r.gates if not g.ok))
    return results, own_out, problems


def _on_the_whole_series(p: UpstreamProject, diffs: list, results: list[DiffResult], scratch: Path,
                         out: Callable[[str], None]) -> list[str]:
    """Every proven diff's named tests once more, with the whole series applied: a later diff that
    breaks an earlier one's tests (the tests of 12 failed from 15 on, unseen, while each diff was
    only run up to itself) is a problem, as is a named test that does not run there."""
    names = [t for r in results if r.ok for t in r.tests]  # the others are problems already
    if not names:
        return []
    try:
        tree = test_tree(p, diffs, diffs, scratch / "series-tests")
        pkg = package_copy(p, diffs)
    except HarnessError as e:
        return [f"{p.label}: the diffs' tests on the whole series: {e}"]
    whole = run_pytest(p, tree, pkg, names, scratch=scratch / "series-out")
    seen = whole.passed + whole.failed + whole.skipped
    unrun = [t for t in names if "::" in t and not any(_same_test(t, s) for s in seen)]
    line = (f"the diffs' tests on the whole series: {whole.counts()}" + (f" ({whole.error})" if whole.error else "")
            + "".join(f"; FAILS ON THE WHOLE SERIES: {n}" for n in whole.failed[:5])
            + "".join(f"; NOT RUN ON THE WHOLE SERIES: {n}" for n in (whole.skipped + unrun)[:5]))
    out("  " + line)
    if whole.error or whole.failed or whole.skipped or unrun or not whole.passed:
        return [f"{p.label}: {line}"]
    return []


def line_for(r: DiffResult) -> str:
    failing = [g.name for g in r.gates if not g.ok]
    gate_note = f"; GATES FAILED: {', '.join(failing)}" if failing else ""
    if r.problem:
        return f"{r.name}: {r.problem}{gate_note}"
    b, a = r.before, r.after
    parts = [f"{r.name}: {len(r.tests)} named test(s) on {r.base}"]
    if b is not None:
        parts.append(f"before: {b.counts()}" + (f" ({b.error})" if b.error else "")
                     + (f", {len(b.not_reached)} of them before reaching an assertion (a collection error or a "
                        "missing name)" if b.not_reached else "")
                     + ("; NO TEST SHOWS THE DEFECT (every failure before the fix is a missing name)"
                        if b.failed and not r.shown_before else "")
                     + ("".join(f"; PASSES BEFORE THE FIX: {n}" for n in b.passed[:5])))
    if a is not None:
        parts.append(f"after: {a.counts()}" + (f" ({a.error})" if a.error else "")
                     + ("".join(f"; FAILS WITH THE FIX: {n}" for n in a.failed[:5])))
    if a is not None and a.skipped:
        parts.append(f"NOT RUN WITH THE FIX: {', '.join(a.skipped[:3])}")
    if r.unrun:
        parts.append(f"NEVER RAN: {', '.join(r.unrun[:3])}")
    return "; ".join(parts) + gate_note + ("" if r.ok else "  <- not proven")
