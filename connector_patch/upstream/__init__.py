"""The upstream diffs (README.md beside this file): one series per project release.

Standard library only: the harness reads the series to build the ``patched`` target's package copy and
to run ``pdchaos upstream check``; nothing here imports vLLM or anything of pd-chaos.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIELDS = ("Subject", "Defect", "Guarantee", "Scenarios", "Tests", "Tests-changed", "Depends", "Related", "Notes",
          "User-facing", "Size")
REQUIRED = ("Subject", "Defect", "Guarantee", "Scenarios", "Tests")
_NAME = re.compile(r"^(\d\d)-[a-z0-9][a-z0-9-]*\.diff$")


class SeriesError(ValueError):
    """A diff of a series that cannot be read: names the file and what is wrong."""


@dataclass(frozen=True)
class FileDiff:
    """The part of one diff that changes one file."""
    path: str  # relative to the project's source tree, e.g. vllm/distributed/.../mooncake_connector.py
    text: str  # from its ``diff --git`` line (or ``---`` line) to the next file's
    new_file: bool


@dataclass(frozen=True)
class Diff:
    path: Path
    number: int
    header: dict[str, str]
    files: tuple[FileDiff, ...] = field(default=())

    @property
    def name(self) -> str:
        return self.path.name

    def package_files(self, package: str) -> list[FileDiff]:
        return [f for f in self.files if f.path.split("/", 1)[0] == package]

    def test_files(self) -> list[FileDiff]:
        return [f for f in self.files if f.path.startswith("tests/")]

    def new_tests(self) -> list[str]:
        return [f.path for f in self.files if f.path.startswith("tests/") and f.new_file]

    def other_files(self, package: str) -> list[FileDiff]:
        """The parts outside the package and ``tests/`` (e.g. ``.buildkite/`` test areas)."""
        return [f for f in self.files if f.path.split("/", 1)[0] != package and not f.path.startswith("tests/")]

    def source_lines(self) -> int:
        """Lines the diff adds or removes outside ``tests/`` (its ``+``/``-`` lines, file headers apart)."""
        return sum(1 for f in self.files if not f.path.startswith("tests/")
                   for ln in f.text.splitlines() if ln[:1] in "+-" and not ln.startswith(("+++ ", "--- ")))

    def depends(self) -> list[int] | None:
        """The diff numbers its ``Depends:`` field names (``none``: an empty list); None without the field.
        Raises SeriesError for a field that is neither ``none`` nor diff numbers (``01``, ``01-slug.diff``)."""
        raw = self.header.get("Depends")
        if raw is None:
            return None
        words = [w for w in re.split(r"[,\s]+", raw.split("(", 1)[0].strip()) if w]
        if [w.lower() for w in words] == ["none"]:
            return []
        nums = []
        for w in words:
            m = re.fullmatch(r"(\d\d)(?:-[a-z0-9-]+(?:\.diff)?)?", w)
            if not m:
                raise SeriesError(f"{self.path}: Depends: {w!r} is neither 'none' nor a diff number (e.g. 01)")
            nums.append(int(m.group(1)))
        if not nums:
            raise SeriesError(f"{self.path}: Depends: is empty (write 'none' for a diff that applies alone)")
        return sorted(set(nums))


def series_dir(project: str, version: str) -> Path:
    return HERE / project / version


def read_diff(path: Path) -> Diff:
    """One diff: its header fields (before the first file) and its per-file parts."""
    m = _NAME.match(path.name)
    if not m:
        raise SeriesError(f"{path}: a diff is named NN-slug.diff (two digits, lowercase slug)")
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    starts = [i for i, ln in enumerate(lines) if ln.startswith("diff --git ")]
    if not starts:  # plain unified diff: files start at '--- '
        starts = [i for i, ln in enumerate(lines)
                  if ln.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")]
    if not starts:
        raise SeriesError(f"{path}: no file is changed (no 'diff --git' or '---/+++' lines)")
    header: dict[str, str] = {}
    key = None
    for ln in lines[:starts[0]]:
        mm = re.match(r"^([A-Z][A-Za-z-]*):\s?(.*)$", ln.rstrip("\n"))
        if mm and mm.group(1) in FIELDS:
            key = mm.group(1)
            header[key] = mm.group(2).strip()
        elif key and ln.startswith((" ", "\t")) and ln.strip():  # a continued field
            header[key] += " " + ln.strip()
    missing = [k for k in REQUIRED if not header.get(k)]
    if missing:
        raise SeriesError(f"{path}: header lacks {', '.join(missing)} (connector_patch/upstream/README.md)")
    files = []
    for n, i in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        part = lines[i:end]
        target = next((ln[4:].strip() for ln in part if ln.startswith("+++ ")), None)
        source = next((ln[4:].strip() for ln in part if ln.startswith("--- ")), None)
        if target is None or source is None:
            raise SeriesError(f"{path}: a file part without ---/+++ lines (line {i + 1})")
        new = source == "/dev/null"
        rel = (source if target == "/dev/null" else target).split("\t")[0]
        if not rel.startswith(("a/", "b/")):
            raise SeriesError(f"{path}: {rel!r}: paths start with a/ and b/ (patch -p1)")
        files.append(FileDiff(rel[2:], "".join(part), new))
    return Diff(path, int(m.group(1)), header, tuple(files))


def read_series(project: str, version: str) -> list[Diff]:
    """The diffs of one project release, in the order they apply (``*.diff.wip`` are not part of it)."""
    d = series_dir(project, version)
    diffs = [read_diff(p) for p in sorted(d.glob("*.diff"))] if d.is_dir() else []
    seen: dict[int, str] = {}
    for x in diffs:
        if x.number in seen:
            raise SeriesError(f"{x.path}: number {x.number:02d} is taken by {seen[x.number]}")
        seen[x.number] = x.name
    return diffs


def package_patch(diffs: list[Diff], package: str) -> str:
    """The package part of a series, as one text ``patch -p1`` applies (tests left out)."""
    return "".join(f.text for d in diffs for f in d.package_files(package))


def series_key(diffs: list[Diff], package: str) -> str:
    """A short key of what a series changes in ``package`` (the patched copy is cached under it)."""
    h = hashlib.sha256()
    for d in diffs:
        for f in d.package_files(package):
            h.update(f.path.encode() + b"\0" + f.text.encode() + b"\0")
    return h.hexdigest()[:16]
