"""Upstream's own gates on each diff of a series (``pdchaos upstream check``), besides its tests.

* **depends**: the diff applies on the pinned release with only the diffs its ``Depends:`` header names
  (and theirs, in series order), as a maintainer would apply it with the PRs it needs;
* **ruff**: the ruff release the pinned release's ``.pre-commit-config.yaml`` names (``ruff-check`` and
  ``ruff-format``), with the release's own ``pyproject.toml`` settings, on every Python file the diff adds
  or changes; a finding counts against the diff when it lies on a line the diff adds or changes (every
  line of a new file), or when the diff adds one more of it (the same code on the same text) elsewhere in
  the file, e.g. an import it leaves unused;
* **tethering** (projects that have one, vLLM): the release's own test-tethering hook
  (``tools/pre_commit/check_test_tethering.py``) on the test files the diff adds or changes, in the
  sdist's tree with the diff applied (its ``.buildkite/`` test areas included): a new test file no CI
  job runs is refused.

A gate that cannot judge (no ruff, no config, a hook that crashes) fails: the diff is not proven.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RUFF_REV = re.compile(r"astral-sh/ruff-pre-commit\s*\n\s*rev:\s*['\"]?v?([0-9][\w.]*)")
RUFF_PIN = re.compile(r"^ruff==([0-9][\w.]*)", re.M)
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@")
GATE_TIMEOUT_S = 120.0
SIZE_LIMIT = 400  # source lines (added or removed outside tests/) a diff changes without a written reason (Size:)


@dataclass
class Gate:
    name: str  # depends, ruff, tethering
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{self.name}: {'ok' if self.ok else 'FAILS'} ({self.detail})"


# ------------------------------------------------------------------------------------------- size
def size_gate(diff: Any, limit: int) -> Gate:
    """A diff that changes more than ``limit`` source lines names why it is one PR (its ``Size:`` field)."""
    n = diff.source_lines()
    if n <= limit:
        return Gate("size", True, f"{n} source lines")
    if diff.header.get("Size"):
        return Gate("size", True, f"{n} source lines, over {limit}: its Size: field says why")
    return Gate("size", False, f"{n} source lines, over {limit}, and no Size: field says why it is one PR "
                               "(split it, or write the reason)")


# ---------------------------------------------------------------------------------------- depends
def closure(diff: Any, series: list) -> tuple[list | None, str]:
    """The diffs ``diff`` needs, by its ``Depends:`` field and theirs, in series order; None and why when
    the field is missing or names a diff that is not an earlier one of the series."""
    by_num = {d.number: d for d in series}
    try:
        direct = diff.depends()
    except ValueError as e:
        return None, str(e).split(": ", 1)[-1]
    if direct is None:
        return None, "no Depends: field (write 'Depends: none' for a diff that applies alone)"
    need: set[int] = set()
    todo = list(direct)
    while todo:
        n = todo.pop()
        if n in need:
            continue
        dep = by_num.get(n)
        if dep is None or n >= diff.number:
            return None, f"Depends: {n:02d} is not an earlier diff of the series"
        need.add(n)
        try:
            todo += dep.depends() or []
        except ValueError as e:
            return None, str(e).split(": ", 1)[-1]
    return [d for d in series if d.number in need], ""


def depends_label(diff: Any, needed: list | None) -> str:
    direct = diff.header.get("Depends")
    if needed is None or direct is None:
        return "Depends: -"
    names = ", ".join(f"{d.number:02d}" for d in needed) or "none"
    return f"Depends: {names}"


def depends_gate(p: Any, diff: Any, needed: list | None, why: str, into: Path, *,
                 apply: Any, fetch_sdist: Any) -> Gate:
    """Apply ``needed`` then ``diff`` (every file part) on the pristine release's files. ``apply`` and
    ``fetch_sdist`` are harness.upstream's own (given by it: this module imports nothing of it)."""
    from .errors import HarnessError

    if needed is None:
        return Gate("depends", False, why)
    label = depends_label(diff, needed)
    src = fetch_sdist(p)
    into.mkdir(parents=True, exist_ok=True)
    for rel in {f.path for d in [*needed, diff] for f in d.files}:
        origin = (p.site_packages() / rel) if rel.split("/", 1)[0] == p.package else (src / rel)
        if origin.is_file():
            (into / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(origin, into / rel)
    for d in [*needed, diff]:
        try:
            apply(into, "".join(f.text for f in d.files), d.name)
        except HarnessError as e:
            what = "it" if d is diff else f"{d.name} (a diff it needs)"
            return Gate("depends", False, f"{label}: on the pinned release with only those, {what} does not apply: "
                                          f"{str(e).split(': does not apply: ', 1)[-1]}")
    return Gate("depends", True, f"{label}: applies on the pinned release with only those")


# ---------------------------------------------------------------------------------------- ruff
def ruff_version_named(sdist: Path) -> str | None:
    cfg = sdist / ".pre-commit-config.yaml"
    if not cfg.is_file():
        return None
    m = RUFF_REV.search(cfg.read_text(encoding="utf-8"))
    return m.group(1) if m else None


def ruff_version_locked(lock: Path) -> str | None:
    m = RUFF_PIN.search(lock.read_text(encoding="utf-8")) if lock.is_file() else None
    return m.group(1) if m else None


def touched_lines(before: str | None, after: str) -> set[int]:
    """1-based numbers of the lines of ``after`` that are new or changed against ``before``."""
    a_lines = after.splitlines()
    if before is None:
        return set(range(1, len(a_lines) + 1))
    sm = difflib.SequenceMatcher(None, before.splitlines(), a_lines, autojunk=False)
    out: set[int] = set()
    for tag, _i1, _i2, j1, j2 in sm.get_opcodes():
        if tag in ("replace", "insert"):
            out.update(range(j1 + 1, j2 + 1))
    return out


def lint_root(p: Any, pkg_dir: Path, tree: Path, into: Path) -> Path:
    """A checkout as ruff sees it: the release's pyproject.toml beside the whole package (``pkg_dir``'s
    copy, else the installed one) and the whole test tree (isort tells first-party modules by the
    paths that exist, INP001 looks for ``__init__.py``)."""
    into.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(p.sdist_dir() / "pyproject.toml", into / "pyproject.toml")
    pkg = pkg_dir / p.package if (pkg_dir / p.package).is_dir() else p.site_packages() / p.package
    (into / p.package).symlink_to(pkg, target_is_directory=True)
    (into / "tests").symlink_to(tree / "tests", target_is_directory=True)
    return into


def _ruff(ruff: Path, args: list[str], cwd: Path, text: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUFF_")}
    return subprocess.run([str(ruff), *args], cwd=cwd, env=env, input=text, capture_output=True, text=True,
                          timeout=GATE_TIMEOUT_S)


def _findings(ruff: Path, root: Path, rel: str, text: str) -> list[tuple[int, str, str]] | str:
    """(line, code, message) of ``ruff check`` on ``text`` as the file ``rel`` of ``root``; a string when
    ruff could not judge."""
    res = _ruff(ruff, ["check", "--no-cache", "--no-fix", "--force-exclude", "--output-format", "json",
                       "--stdin-filename", rel, "-"], root, text)
    if res.returncode not in (0, 1):
        return f"ruff check exited {res.returncode}: {(res.stderr.strip().splitlines() or ['no output'])[-1][:200]}"
    try:
        items = json.loads(res.stdout or "[]")
    except ValueError:
        return "ruff check wrote no JSON"
    return [(int(it["location"]["row"]), it.get("code") or "syntax", (it.get("message") or "")[:120])
            for it in items]


def _unformatted(ruff: Path, root: Path, rel: str, text: str) -> set[int] | str:
    """The lines of ``text`` that ``ruff format`` would change."""
    res = _ruff(ruff, ["format", "--no-cache", "--force-exclude", "--stdin-filename", rel, "-"], root, text)
    if res.returncode != 0:
        return f"ruff format exited {res.returncode}: {(res.stderr.strip().splitlines() or ['no output'])[-1][:200]}"
    if not res.stdout and text:  # an excluded file is echoed back; nothing at all means no answer
        return "ruff format wrote nothing"
    out: set[int] = set()
    sm = difflib.SequenceMatcher(None, text.splitlines(), res.stdout.splitlines(), autojunk=False)
    for tag, i1, i2, _j1, _j2 in sm.get_opcodes():
        if tag != "equal":
            out.update(range(i1 + 1, i2 + 1) if i2 > i1 else (max(1, i1), i1 + 1))
    return out


def ruff_gate(p: Any, diff: Any, before: dict[str, str | None], after: dict[str, str], ruff: Path | None,
              root: Path | None) -> Gate:
    """``before``/``after``: the text of each Python file the diff touches (None: a file it adds);
    ``root``: :func:`lint_root` of the tree with the diff applied."""
    sdist = p.sdist_dir()
    if ruff is None or root is None:
        return Gate("ruff", False, "no ruff installed (pdchaos setup --only upstream-tests-" + p.project + ")")
    named, pinned = ruff_version_named(sdist), ruff_version_locked(p.lint_lock)
    if named is None or not (sdist / "pyproject.toml").is_file():
        return Gate("ruff", False, "the sdist has no .pre-commit-config.yaml naming ruff, or no pyproject.toml: "
                                   "cannot judge")
    if named != pinned:
        return Gate("ruff", False, f"the release's pre-commit config names ruff {named}, the lint lock pins {pinned}")
    if not after:
        return Gate("ruff", True, f"ruff {named}: no Python file changed")
    theirs: list[str] = []
    for rel in sorted(after):
        text, old = after[rel], before.get(rel)
        found = _findings(ruff, root, rel, text)
        was = _findings(ruff, root, rel, old) if old is not None else []
        fmt = _unformatted(ruff, root, rel, text)
        for res in (found, was, fmt):
            if isinstance(res, str):
                return Gate("ruff", False, f"{rel}: {res}")
        touched = touched_lines(old, text)
        new_lines, old_lines = text.splitlines(), (old or "").splitlines()

        def key(line: int, code: str, lines: list[str]) -> tuple[str, str]:
            return code, lines[line - 1].strip() if 0 < line <= len(lines) else ""

        had: dict[tuple, int] = {}
        for line, code, _ in was:
            had[key(line, code, old_lines)] = had.get(key(line, code, old_lines), 0) + 1
        seen: dict[tuple, int] = {}
        for line, code, msg in sorted(found):
            k = key(line, code, new_lines)
            seen[k] = seen.get(k, 0) + 1
            if line in touched or seen[k] > had.get(k, 0):
                theirs.append(f"{rel}:{line}: {code} {msg}")
        hit = sorted(fmt & touched)
        if hit:
            theirs.append(f"{rel}:{hit[0]}: ruff format would change {len(hit)} line(s) the diff touches")
    if theirs:
        return Gate("ruff", False, f"ruff {named}: {len(theirs)} finding(s) on the diff's lines: "
                                   + "; ".join(theirs[:6]) + (" ..." if len(theirs) > 6 else ""))
    return Gate("ruff", True, f"ruff {named} check and format: no finding on the diff's lines in {len(after)} file(s)")


# ---------------------------------------------------------------------------------------- tethering
def tethering_gate(p: Any, diff: Any, tree: Path) -> Gate | None:
    """The release's own tethering hook on the test files the diff adds or changes, in ``tree`` (the
    sdist's tree with the diff applied). None for a project without the hook."""
    if not p.tethering:
        return None
    script = tree / p.tethering
    if not script.is_file():
        return Gate("tethering", False, f"the sdist has no {p.tethering}: cannot judge")
    files = [f.path for f in diff.files if f.path.startswith("tests/") and f.path.endswith(".py")
             and Path(f.path).name.startswith("test_")]
    files += [f.path for f in diff.other_files(p.package)]
    if not files:
        return Gate("tethering", True, "no test file added or changed")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update({"PYTHONNOUSERSITE": "1", "GIT_CEILING_DIRECTORIES": str(tree.parent)})
    # the hook finds the tree from its own path: a real copy, never a link back into the cache
    own = tree / p.tethering
    text = script.read_bytes()
    own.unlink()
    own.write_bytes(text)
    try:
        res = subprocess.run([str(p.python()), str(own), *files], cwd=tree, env=env, capture_output=True,
                             text=True, timeout=GATE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return Gate("tethering", False, f"the hook took longer than {GATE_TIMEOUT_S:g} s")
    errors = [ln[len("error: "):] for ln in res.stdout.splitlines() if ln.startswith("error: ")]
    new = [f for f in files if f in diff.new_tests()]
    if res.returncode == 0 and not errors:
        return Gate("tethering", True, f"{len(new)} new test file(s), {len(files) - len(new)} changed file(s): "
                                       "each run by a Buildkite job")
    if res.returncode == 1 and errors:
        return Gate("tethering", False, "; ".join(errors[:4]) + (" ..." if len(errors) > 4 else ""))
    last = (res.stderr.strip().splitlines() or res.stdout.strip().splitlines() or ["no output"])[-1]
    return Gate("tethering", False, f"the hook exited {res.returncode}: {last[:200]}")


def diff_texts(p: Any, diff: Any, after_pkg: Path, tree: Path, into: Path) -> tuple[dict, dict] | str:
    """The text of each Python file the diff touches, with it (``after``) and without it (``before``: the
    same files with the diff's parts reversed; None for a file it adds). A string when that fails."""
    after: dict[str, str] = {}
    parts = []
    for f in diff.files:
        if not f.path.endswith(".py"):
            continue
        src = (after_pkg / f.path) if f.path.split("/", 1)[0] == p.package else (tree / f.path)
        if src.is_file():  # a file the diff deletes has no text after it
            after[f.path] = src.read_text(encoding="utf-8")
            parts.append(f.text)
    into.mkdir(parents=True, exist_ok=True)
    for rel, text in after.items():
        (into / rel).parent.mkdir(parents=True, exist_ok=True)
        (into / rel).write_text(text, encoding="utf-8")
    if parts:
        res = subprocess.run(["git", "apply", "-R", "-p1", "--whitespace=nowarn", "-"], cwd=into,
                             input="".join(parts), capture_output=True, text=True, timeout=60)
        if res.returncode != 0:
            first = next((ln for ln in res.stderr.splitlines() if ln.strip()), "no output")
            return f"the diff does not reverse on its own result: {first}"
    before = {rel: ((into / rel).read_text(encoding="utf-8") if (into / rel).is_file() else None) for rel in after}
    return before, after
