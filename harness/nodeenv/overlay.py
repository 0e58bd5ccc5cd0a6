"""A patched copy of one installed package, put first on a node's ``PYTHONPATH``.

The ``patched`` target runs upstream's own code with a series of upstream diffs applied: never to the
installed files (the node env is shared by every target and every run), but to a copy. The copy is a
folder ``<cache>/patched/<package>-<key>/<package>/`` where every file the diffs leave alone is a hard
link to the installed one (no disk, milliseconds) and every changed file is a real file; ``<key>``
names the installed package's folder and the diffs' text, so a changed diff makes a new copy next to the
old one. It is built in a temporary folder and renamed into place (two runs that race build twice and
one rename wins), and applied with ``git apply`` (in Debian's git, which every machine here has;
``patch`` is not installed everywhere): a hunk that does not apply is an error naming the diff, never a
half-patched copy.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

from .venv import cache_root

APPLY_TIMEOUT_S = 60.0


class OverlayError(Exception):
    """One line: which package, which diff, why."""


def _link_tree(src: Path, dst: Path) -> None:
    """``cp -al``: the same tree of folders, every file a hard link (a copy where links cannot be made).
    Bytecode is linked too: a module left alone keeps its source's mtime, so its ``.pyc`` stays valid
    (a node's first start would otherwise compile all of vLLM again, ~35 s)."""
    for root, dirs, files in os.walk(src):
        rel = Path(root).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for f in files:
            s, d = Path(root) / f, dst / rel / f
            try:
                os.link(s, d)
            except OSError:
                shutil.copy2(s, d)


def overlay_for(site_packages: Path, package: str, patch_text: str, key: str, label: str) -> Path:
    """The folder to put first on ``PYTHONPATH``: ``package`` from ``site_packages`` with ``patch_text``
    (a ``patch -p1`` text whose paths start with ``a/<package>/``) applied. Built once per key."""
    src = site_packages / package
    if not (src / "__init__.py").is_file():
        raise OverlayError(f"{label}: {package} is not installed in {site_packages}")
    if not patch_text.strip():
        raise OverlayError(f"{label}: the series changes nothing in {package}")
    full = hashlib.sha256(f"{src.resolve()}\0{key}".encode()).hexdigest()[:16]
    root = cache_root() / "patched"
    final = root / f"{package}-{full}"
    if (final / ".complete").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{package}-", dir=root))
    try:
        _link_tree(src, tmp / package)
        changed = sorted({ln[6:].split("\t")[0].strip()[2:] for ln in patch_text.splitlines()
                          if ln.startswith("+++ b/")})
        for rel in changed:  # a changed file must not be a link to the installed one
            f = tmp / rel
            own_copy(f)
            for pyc in (f.parent / "__pycache__").glob(f"{f.stem}.*.pyc"):  # Python writes its own
                pyc.unlink()
        diff_file = tmp / "series.diff"
        diff_file.write_text(patch_text, encoding="utf-8")
        try:
            res = subprocess.run(["git", "apply", "-p1", "--whitespace=nowarn", str(diff_file)], cwd=tmp,
                                 capture_output=True, text=True, timeout=APPLY_TIMEOUT_S)
        except FileNotFoundError:
            raise OverlayError(f"{label}: git is not installed (it applies the diffs)") from None
        except subprocess.TimeoutExpired:
            raise OverlayError(f"{label}: git apply took longer than {APPLY_TIMEOUT_S:g} s") from None
        if res.returncode != 0:
            first = next((ln for ln in res.stderr.splitlines() if ln.strip()), "no output")
            raise OverlayError(f"{label}: the diffs do not apply to the installed {package}: {first}")
        diff_file.unlink()
        return publish(tmp, final, f"{package} {key}")
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)



def publish(built: Path, final: Path, stamp: str) -> Path:
    """Mark ``built`` complete (``.complete`` holds ``stamp``) and rename it to ``final``; another
    process that put its copy there first (the same bytes) wins. Returns ``final``."""
    (built / ".complete").write_text(stamp if stamp.endswith("\n") else stamp + "\n")
    try:
        os.rename(built, final)
    except OSError:
        if not (final / ".complete").is_file():
            raise
    return final


def own_copy(f: Path) -> None:
    """Replace ``f`` (a hard link into an installed or cached tree) by a copy of its bytes, so that
    writing to it changes nothing else."""
    if f.exists():
        data = f.read_bytes()
        f.unlink()
        f.write_bytes(data)


def series_overlay(site_packages: Path, package: str, series: Callable[[], list], label: str) -> Path:
    """The patched target's copy for a family: ``package`` in ``site_packages`` with the package part
    of ``series()`` applied (the diffs of connector_patch/upstream/<project>/<version>/, read by the
    family: each has ``package_files(package)`` parts with their ``text``). Raises HarnessError (one
    line, starting with ``label``) when the series cannot be read or does not apply."""
    from ..errors import HarnessError

    try:
        text = "".join(f.text for d in series() for f in d.package_files(package))
        return overlay_for(site_packages, package, text, hashlib.sha256(text.encode()).hexdigest()[:16], label)
    except (OverlayError, ValueError) as e:
        raise HarnessError(str(e)) from None


def overlay_arg_problem(patched: bool, overlay: str, package: str, flag: str = "--upstream-overlay") -> str | None:
    """A node's check of the copy it was given: present exactly for the patched implementation, an
    absolute folder holding ``package``. None when it is fine, else the one-line error."""
    if patched != bool(overlay):
        return f"{flag}: with the patched implementation, and only with it"
    if overlay and not (os.path.isabs(overlay) and os.path.isdir(os.path.join(overlay, package))):
        return f"{flag} {overlay!r}: not an absolute folder holding {package}/"
    return None
