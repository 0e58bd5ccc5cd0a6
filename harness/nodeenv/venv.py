"""A pinned node environment: a venv of its own, installed step by step, stamped when complete.

A node of a real P/D pair (vLLM, torch, Mooncake, ...) runs in a venv that is never the harness's
own: its pins are many and strict, and none of them may leak into the environment that runs the
harness. One :class:`NodeEnv` is

* a folder ``${XDG_CACHE_HOME:-~/.cache}/pdchaos/envs/<name>-<hash>/``, where ``<hash>`` is a
  short hash of its **pins** (and the Python version): changing a pin makes a new env next to the
  old one, never a mixed one;
* a venv in that folder, made with the harness's own interpreter (``python -m venv``);
* an ordered list of :class:`Step` s, each with a **key** (what it installs, e.g. a hash of a local
  package's source). A step writes ``steps/<name>.json`` with its key once it finished; the env's
  ``stamp.json`` (pins + every step's key) is written only after the last step. A second
  :meth:`NodeEnv.ensure` reads the stamp and does nothing (milliseconds); after an interrupted
  install it resumes at the first step without a matching marker (pip installs are idempotent, so
  a step that was cut halfway is simply run again). A folder whose venv itself is broken (no
  python, a different interpreter) is removed and made anew. One install at a time per env
  (``<env>.lock`` beside it, flock).

Every subprocess has a timeout and runs in its own session (a timeout kills its whole group);
its output goes to ``install.log`` in the env folder. Progress is one line per step; a failure is
:class:`NodeEnvError`, one line naming the step, why, and the log.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

VENV_TIMEOUT_S = 300.0
STAMP = "stamp.json"
LOG = "install.log"
# Variables that would send a venv's pip somewhere else than the venv (or read the harness's env).
_ENV_DROP = ("PIP_USER", "PIP_TARGET", "PIP_PREFIX", "PIP_ROOT", "PYTHONPATH", "PYTHONHOME",
             "PYTHONUSERBASE", "VIRTUAL_ENV", "CONDA_PREFIX", "PIP_REQUIRE_VIRTUALENV")


class NodeEnvError(Exception):
    """One line: what failed, why, and where the full output is."""


def cache_root() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/pdchaos``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pdchaos"


def pin_hash(pins: Sequence[str], python: tuple[int, int] | None = None) -> str:
    """A short, order-sensitive hash of the pins and the Python version (major.minor)."""
    major, minor = python or sys.version_info[:2]
    text = f"python{major}.{minor}\n" + "\n".join(" ".join(str(p).split()) for p in pins)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def tree_hash(root: Path) -> str:
    """A short hash of every file under ``root`` (relative path and bytes), skipping build
    by-products; the key of a step that installs a local package from source."""
    h = hashlib.sha256()
    skip = {"__pycache__", "build", "dist", ".eggs"}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root)
        if any(part in skip or part.endswith(".egg-info") for part in rel.parts):
            continue
        h.update(str(rel).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a subprocess of a node env: the harness's, minus what would redirect
    pip or Python elsewhere, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in _ENV_DROP}
    env.update(extra or {})
    return env


def run_logged(cmd: Sequence[str], timeout: float, log: Path | None, what: str,
               env: Mapping[str, str] | None = None, cwd: str | None = None) -> str:
    """Run ``cmd`` in its own session with its output appended to ``log`` (and returned).
    NodeEnvError (one line: ``what``, exit code or timeout, the last meaningful output line)."""
    cmd = [str(c) for c in cmd]
    fh = open(log, "ab") if log is not None else None
    try:
        if fh is not None:
            fh.write(f"\n$ {' '.join(cmd)}\n".encode())
            fh.flush()
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=dict(env) if env else child_env(),
                                    cwd=cwd, start_new_session=True)
        except OSError as exc:
            raise NodeEnvError(f"{what}: `{cmd[0]}` could not run: {exc.strerror or exc}") from None
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, _ = proc.communicate()
            if fh is not None:
                fh.write(out or b"")
            raise NodeEnvError(f"{what}: did not finish within {timeout:.0f} s"
                               + (f" (output in {log})" if log else "")) from None
        except BaseException:  # Ctrl-C: leave nothing running
            _kill_group(proc)
            raise
        if fh is not None:
            fh.write(out or b"")
        text = (out or b"").decode(errors="replace")
        if proc.returncode != 0:
            raise NodeEnvError(f"{what}: `{' '.join(cmd[:4])}{' ...' if len(cmd) > 4 else ''}` exited "
                               f"{proc.returncode}: {last_error_line(text)}" + (f" (full output in {log})" if log else ""))
        return text
    finally:
        if fh is not None:
            fh.close()


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def last_error_line(text: str) -> str:
    """The most telling line of a failed command's output: the last ``ERROR``/``error:`` line,
    else the last non-empty line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith(("ERROR", "error:", "E: ")) or "Error:" in ln:
            return ln[:300]
    return (lines[-1] if lines else "(no output)")[:300]


@dataclass
class Step:
    """One install step: ``run(env)`` does it (raising NodeEnvError); ``key`` says what it
    installs (a changed key makes the step run again, in the same env); ``timeout`` bounds it
    (``run`` passes it on to its subprocesses)."""

    name: str
    key: str
    run: Callable[["NodeEnv"], str | None]
    timeout: float = 600.0


@dataclass
class NodeEnv:
    """A pinned venv under ``cache_root()/envs``. ``pins`` name the env (a new hash, a new
    folder); ``steps`` fill it."""

    name: str
    pins: Sequence[str]
    steps: Sequence[Step] = field(default_factory=list)
    root: Path | None = None  # default: cache_root()/"envs"
    out: Callable[[str], None] = print

    # ------------------------------------------------------------------ paths
    @property
    def hash(self) -> str:
        return pin_hash(self.pins)

    @property
    def path(self) -> Path:
        return (self.root or cache_root() / "envs") / f"{self.name}-{self.hash}"

    @property
    def python(self) -> Path:
        """The venv's interpreter (whether or not it exists yet)."""
        return self.path / "bin" / "python"

    @property
    def bin(self) -> Path:
        return self.path / "bin"

    @property
    def log(self) -> Path:
        return self.path / LOG

    def site_packages(self) -> Path:
        major, minor = sys.version_info[:2]
        return self.path / "lib" / f"python{major}.{minor}" / "site-packages"

    def _marker(self, step: Step) -> Path:
        return self.path / "steps" / f"{step.name}.json"

    # ------------------------------------------------------------------ state
    def wanted_stamp(self) -> dict:
        return {"name": self.name, "pins": list(self.pins), "hash": self.hash,
                "python": "%d.%d" % sys.version_info[:2],
                "steps": {s.name: s.key for s in self.steps}}

    def stamp(self) -> dict | None:
        """The stamp on disk, or None (absent or unreadable)."""
        try:
            return json.loads((self.path / STAMP).read_text())
        except (OSError, ValueError):
            return None

    def installed(self) -> bool:
        """Complete and current: the stamp says so and the venv's python is there. Fast, no
        subprocess."""
        stamp = self.stamp()
        if stamp is None or not self.python.exists():
            return False
        want = self.wanted_stamp()
        return all(stamp.get(k) == want[k] for k in ("pins", "hash", "python", "steps"))

    def pending(self) -> list[str]:
        """The steps that would run now (all of them when there is no venv)."""
        if not self.python.exists():
            return [s.name for s in self.steps]
        return [s.name for s in self.steps if not self._step_done(s)]

    def _step_done(self, step: Step) -> bool:
        try:
            return json.loads(self._marker(step).read_text()).get("key") == step.key
        except (OSError, ValueError):
            return False

    # ------------------------------------------------------------------ install
    def _venv_ok(self) -> bool:
        """The venv exists and was made from this interpreter's version."""
        cfg = self.path / "pyvenv.cfg"
        if not self.python.exists() or not cfg.is_file():
            return False
        want = "%d.%d." % sys.version_info[:2]
        for line in cfg.read_text(errors="replace").splitlines():
            k, _, v = line.partition("=")
            if k.strip() in ("version", "version_info"):
                return v.strip().startswith(want)
        return False

    def ensure(self) -> str:
        """Install what is missing; return one line saying what was done. Idempotent; one
        install at a time per env (a second one waits for the first, then finds it done)."""
        if self.installed():
            return f"already installed at {self.path}"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.parent / f"{self.path.name}.lock", "w") as lock:
            waited = self._lock(lock)
            if self.installed():
                return f"already installed at {self.path} (by another install, waited {waited:.0f} s)"
            return self._install()

    def _lock(self, fh) -> float:
        t0, said = time.monotonic(), False
        limit = VENV_TIMEOUT_S + sum(s.timeout for s in self.steps)
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return time.monotonic() - t0
            except BlockingIOError:
                if not said:
                    self.out(f"  {self.name}: another install of {self.path} is running: waiting for it")
                    said = True
                if time.monotonic() - t0 > limit:
                    raise NodeEnvError(f"another install of {self.path} held its lock for {limit:.0f} s") from None
                time.sleep(1.0)

    def _install(self) -> str:
        t0 = time.monotonic()
        if self.path.exists() and not self._venv_ok():
            self.out(f"  {self.name}: {self.path} holds no usable venv: removing it and starting over")
            shutil.rmtree(self.path)
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / STAMP).unlink(missing_ok=True)  # whatever comes next, the env is not complete
        if not self._venv_ok():
            self.out(f"  {self.name}: creating venv {self.path} ({sys.executable} -m venv)")
            run_logged([sys.executable, "-m", "venv", str(self.path)], VENV_TIMEOUT_S, None, "python -m venv")
            if not self._venv_ok():
                raise NodeEnvError(f"python -m venv made no usable venv at {self.path}")
        self._check_isolated()
        (self.path / "steps").mkdir(exist_ok=True)
        ran = []
        for i, step in enumerate(self.steps, 1):
            if self._step_done(step):
                self.out(f"  {self.name}: [{i}/{len(self.steps)}] {step.name}: done before")
                continue
            self.out(f"  {self.name}: [{i}/{len(self.steps)}] {step.name} (up to {step.timeout:.0f} s) ...")
            ts = time.monotonic()
            try:
                said = step.run(self)
            except NodeEnvError as exc:
                raise NodeEnvError(f"{self.name}: step {step.name}: {exc}") from None
            self._marker(step).write_text(json.dumps({"key": step.key, "at": time.time()}) + "\n")
            ran.append(step.name)
            self.out(f"  {self.name}: [{i}/{len(self.steps)}] {step.name}: ok in {time.monotonic() - ts:.0f} s"
                     + (f" ({said})" if said else ""))
        tmp = self.path / (STAMP + ".tmp")
        tmp.write_text(json.dumps(self.wanted_stamp(), indent=1) + "\n")
        os.replace(tmp, self.path / STAMP)
        return (f"installed {self.name} at {self.path} in {time.monotonic() - t0:.0f} s"
                f" ({len(ran)} of {len(self.steps)} steps run)")

    def _check_isolated(self) -> None:
        """The venv's interpreter must not be the harness's: its packages go to the venv only."""
        here = Path(sys.prefix).resolve()
        try:
            prefix = run_logged([self.python, "-c", "import sys; print(sys.prefix)"], 60, None,
                                "venv python").strip().splitlines()[-1]
        except (NodeEnvError, IndexError):
            raise NodeEnvError(f"the venv's python {self.python} does not run") from None
        if Path(prefix).resolve() != self.path.resolve() or Path(prefix).resolve() == here:
            raise NodeEnvError(f"the venv's python reports sys.prefix={prefix}, not {self.path}: refusing "
                               "to install into another environment")

    # ------------------------------------------------------------------ helpers for steps
    def pip(self, args: Sequence[str], timeout: float, what: str) -> str:
        """``<venv python> -m pip install ...`` (only ever the venv's pip), output to the log."""
        cmd = [str(self.python), "-m", "pip", "--disable-pip-version-check", "install", *args]
        return run_logged(cmd, timeout, self.log, what, env=child_env({"PYTHONNOUSERSITE": "1"}))

    def run(self, args: Sequence[str], timeout: float, what: str, env: Mapping[str, str] | None = None,
            cwd: str | None = None) -> str:
        """Run the venv's python with ``args``; output to the log and returned."""
        return run_logged([str(self.python), *args], timeout, self.log, what,
                          env=child_env({"PYTHONNOUSERSITE": "1", **(env or {})}), cwd=cwd)

    def size_bytes(self) -> int:
        return tree_bytes(self.path)


def tree_bytes(root: Path) -> int:
    """Apparent size of every file under ``root``, each inode once (uv hard-links from its cache)."""
    seen, total = set(), 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            try:
                st = os.lstat(os.path.join(dirpath, f))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total
