"""``pdchaos setup``'s steps: install what every installed family's scenarios need, idempotently.

A **step** is any object with

* ``name: str`` — short and unique (``--only NAME`` selects it; a later step with a name already
  listed is the same thing and is not run twice);
* ``check() -> str | None`` — is it already there? A short status (``"v2.12.0 at /usr/local/bin/x"``)
  when it is, None when it is not. Read-only and fast (every subprocess with a timeout);
* ``install() -> str`` — get it; returns one line saying what was done. When it cannot, it raises
  :class:`StepFailed` ``(why, how)``: why it could not, and how to do it by hand (one line each);
* optionally ``plan() -> str`` — what ``install()`` would do (``--dry-run`` prints it); raises
  :class:`StepFailed` like ``install()`` when it already knows it cannot (not root, no Go).

After ``install()`` the runner calls ``check()`` again: a step is done only when ``check()`` says so.
Any other exception from a step is reported as that step failing (one line, no traceback).

**Side by side**: a step marked ``side_by_side = True`` (toxiproxy's Go build: it touches no package
manager) runs in a thread of its own while the others run in order; the progress lines still come
in step order.

**Optional steps** (a step marked ``optional = True``) are opt-in: a plain run only checks them
(``already present``, or ``optional, not selected``) and runs one only when it is picked by name
(``--only NAME``). The core knows no node stack: the families name the stacks they need
(``Family.setup_steps()``, e.g. the pd family's ``pd-node-stack`` from ``stacks/vllm_cpu``).

Core steps: ``toxiproxy-server`` (pinned v2.12.0, built with Go by ``scripts/install-toxiproxy.sh``),
``iptables`` and ``iproute2`` (``ip``, ``tc``; apt-get, as root). A family adds its own by returning
step objects from :meth:`harness.family.Family.setup_steps`, e.g. ``[AptStep("socat", "socat",
("socat",))]`` or an instance of its own class with the three members above.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

SCRIPT = Path(__file__).parent / "scripts" / "install-toxiproxy.sh"
GO_BUILD_TIMEOUT_S = 900.0
APT_UPDATE_TIMEOUT_S = 300.0
APT_INSTALL_TIMEOUT_S = 600.0


class StepFailed(Exception):
    """``install()`` could not do it: ``why`` (the reason) and ``how`` (doing it by hand)."""

    def __init__(self, why: str, how: str = "") -> None:
        super().__init__(why)
        self.why, self.how = why, how


def _run(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd`` with a timeout; StepFailed (with the last output line) when it fails."""
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise StepFailed(f"`{' '.join(cmd)}` did not finish within {timeout:.0f} s") from None
    except OSError as exc:
        raise StepFailed(f"`{cmd[0]}` could not run: {exc.strerror or exc}") from None
    if res.returncode != 0:
        lines = [ln.strip() for ln in (res.stderr + "\n" + res.stdout).splitlines() if ln.strip()]
        raise StepFailed(f"`{' '.join(cmd)}` exited {res.returncode}" + (f": {lines[0]}" if lines else ""))
    return res


# --------------------------------------------------------------------------- toxiproxy-server

class ToxiproxyStep:
    """toxiproxy-server at the pinned version, built from source with Go (the only way that needs
    nothing but the Go module proxy); without Go, the failure names the other ways."""

    name = "toxiproxy-server"
    # A Go build touches no package manager: it runs beside the other steps (apt, the node envs),
    # which on 2 cores is faster than one after the other (see run_setup).
    side_by_side = True

    def __init__(self, go_search: Iterable[str] | None = None) -> None:
        # None: go on PATH, then /usr/local/go/bin/go and ~/go/bin/go; else only these paths
        self.go_search = None if go_search is None else tuple(go_search)

    @property
    def pin(self) -> str:
        from faults.toxiproxy import PINNED_VERSION

        return PINNED_VERSION

    def check(self) -> str | None:
        from faults.toxiproxy import binary_version, find_binary

        path = find_binary()
        if path is None:
            return None
        version = binary_version(path)
        return f"v{version} at {path}" if version == self.pin else None

    def find_go(self) -> str | None:
        if self.go_search is None:
            cands = [shutil.which("go") or "", "/usr/local/go/bin/go", os.path.expanduser("~/go/bin/go")]
        else:
            cands = list(self.go_search)
        return next((c for c in cands if c and os.path.isfile(c) and os.access(c, os.X_OK)), None)

    def how(self, have_go: bool = False) -> str:
        arch = {"aarch64": "arm64", "arm64": "arm64"}.get(platform.machine(), "amd64")
        url = f"https://github.com/Shopify/toxiproxy/releases/tag/v{self.pin}"
        first = ("let Go reach its module proxy (proxy.golang.org) and rerun `pdchaos setup`" if have_go
                 else "install Go and rerun `pdchaos setup`")
        return (f"{first}; or take toxiproxy-server-linux-{arch} from {url}, "
                f"chmod +x it and put it on PATH as toxiproxy-server (or set PDCHAOS_TOXIPROXY_SERVER to it); "
                f"or install the .deb from the same release; or copy it out of ghcr.io/shopify/toxiproxy:{self.pin}")

    def _blocker(self) -> StepFailed | None:
        from faults.toxiproxy import ENV_BINARY

        env = os.environ.get(ENV_BINARY)
        if env:
            return StepFailed(f"${ENV_BINARY}={env} is not an executable toxiproxy-server v{self.pin} "
                              "(an explicit choice: nothing is installed over it)",
                              f"point ${ENV_BINARY} at a toxiproxy-server v{self.pin}, or unset it and rerun "
                              "`pdchaos setup`")
        if self.find_go() is None:
            return StepFailed(f"Go is not installed, so toxiproxy-server v{self.pin} cannot be built here",
                              self.how())
        return None

    def plan(self) -> str:
        blocker = self._blocker()
        if blocker is not None:
            raise blocker
        return f"build v{self.pin} with {self.find_go()} (bash {SCRIPT.name})"

    def install(self) -> str:
        blocker = self._blocker()
        if blocker is not None:
            raise blocker
        if not SCRIPT.is_file():
            raise StepFailed(f"{SCRIPT} is missing (a broken install of pd-chaos)",
                             "reinstall: python3 -m pip install -e '.[dev]'")
        go = self.find_go()
        env = {**os.environ, "PATH": f"{os.path.dirname(go)}{os.pathsep}{os.environ.get('PATH', '')}"}
        try:
            res = _run(["bash", str(SCRIPT)], GO_BUILD_TIMEOUT_S, env=env)
        except StepFailed as exc:
            raise StepFailed(exc.why, self.how(have_go=True)) from None
        done = [ln for ln in res.stdout.splitlines() if "installed toxiproxy-server" in ln]
        where = done[-1].split(" at ", 1)[-1].strip() if done else "?"
        if self.check() is None:
            raise StepFailed(f"built and installed at {where}, but it is not the toxiproxy-server found "
                             "(not on PATH, or an older one comes first)",
                             f"put {where} first on PATH, or set PDCHAOS_TOXIPROXY_SERVER={where}")
        return f"installed v{self.pin} at {where}"


# --------------------------------------------------------------------------- apt packages

_apt_updated = False


class AptStep:
    """Debian/Ubuntu package ``package`` providing the commands ``tools``; installed as root only."""

    def __init__(self, name: str, package: str, tools: Iterable[str]) -> None:
        self.name, self.package, self.tools = name, package, tuple(tools)

    def missing(self) -> list[str]:
        return [t for t in self.tools if shutil.which(t) is None]

    def check(self) -> str | None:
        if self.missing():
            return None
        return ", ".join(shutil.which(t) or t for t in self.tools)

    def how(self) -> str:
        return f"as root: apt-get update && apt-get install -y {self.package} (or this system's package manager)"

    def _blocker(self) -> StepFailed | None:
        need = ", ".join(self.missing()) or "it"
        if os.geteuid() != 0:
            return StepFailed(f"{need} not found and not root, so apt-get cannot install {self.package}", self.how())
        if shutil.which("apt-get") is None:
            return StepFailed(f"{need} not found and there is no apt-get", self.how())
        return None

    def plan(self) -> str:
        blocker = self._blocker()
        if blocker is not None:
            raise blocker
        return f"apt-get update -qq && apt-get install -y -qq {self.package}"

    def install(self) -> str:
        global _apt_updated
        blocker = self._blocker()
        if blocker is not None:
            raise blocker
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        try:
            if not _apt_updated:
                _run(["apt-get", "update", "-qq"], APT_UPDATE_TIMEOUT_S, env=env)
                _apt_updated = True
            _run(["apt-get", "install", "-y", "-qq", self.package], APT_INSTALL_TIMEOUT_S, env=env)
        except StepFailed as exc:
            raise StepFailed(exc.why, self.how(have_go=True)) from None
        still = self.missing()
        if still:
            raise StepFailed(f"apt-get installed {self.package} but {', '.join(still)} is still not on PATH",
                             f"find where {self.package} put {still[0]} (dpkg -L {self.package}) and add it to PATH")
        return f"installed {self.package} ({', '.join(shutil.which(t) or t for t in self.tools)})"


def core_steps() -> list[Any]:
    return [ToxiproxyStep(), AptStep("iptables", "iptables", ("iptables",)),
            AptStep("iproute2", "iproute2", ("ip", "tc"))]


# --------------------------------------------------------------------------- collecting and running

def is_step(obj: Any) -> bool:
    return (isinstance(getattr(obj, "name", None), str) and bool(obj.name)
            and callable(getattr(obj, "check", None)) and callable(getattr(obj, "install", None)))


class MissingSetup(str):
    """A reason a scenario cannot run that one ``pdchaos setup`` command fixes (a family's node
    stack is not installed): ``pdchaos run`` stops with it before anything starts (exit 2),
    where other reasons skip the run. ``command`` is that command."""

    command: str

    def __new__(cls, why: str, command: str) -> "MissingSetup":
        obj = super().__new__(cls, f"{why}: run `{command}`")
        obj.command = command
        return obj


def all_steps(families: Iterable[str] | None = None, every: bool = True) -> tuple[list[Any], list[str]]:
    """The core steps, then the families' (``Family.setup_steps()``): every family's when
    ``every``, else those that set up by default (``Family.setup_default``: what the README's main
    job needs) and those named in ``families``; first of each name kept (a family naming a step
    another marked optional makes it a default one); and the problems found collecting them (a
    family that does not load, a non-step)."""
    steps, problems = core_steps(), []
    try:
        from .family import all_families

        loaded = all_families()
    except Exception as exc:  # a broken plugin family: say so, still set up the rest
        return steps, problems + [f"families: could not load: {exc}"]
    named = set(families or ())
    unknown = sorted(named - {f.name for f in loaded})
    if unknown:
        from .errors import UsageError

        raise UsageError(f"--family {unknown[0]!r}: no such family; families: "
                         f"{', '.join(sorted(f.name for f in loaded))}")
    for fam in loaded:
        if not (every or getattr(fam, "setup_default", False) or fam.name in named):
            continue
        try:
            extra = list(fam.setup_steps() or [])
        except Exception as exc:
            problems.append(f"family {fam.name!r}: setup_steps() raised {type(exc).__name__}: {exc}")
            continue
        for obj in extra:
            same = [s for s in steps if s.name == getattr(obj, "name", None)]
            if not is_step(obj):
                problems.append(f"family {fam.name!r}: setup_steps() returned {obj!r}, not a step "
                                "(needs name, check(), install(); see harness/setup.py)")
            elif not same:
                steps.append(obj)
            elif getattr(same[0], "optional", False):
                same[0].optional = False
    if every:  # the runtimes' own (a cluster's control plane for the tests), what CI sets up
        steps += _runtime_steps(problems, [s.name for s in steps])
    return steps, problems


def _runtime_steps(problems: list[str], taken: list[str]) -> list[Any]:
    """The steps of every runtime that does not set up by default (harness/runtime.py)."""
    from .runtime import load_runtime, runtime_names

    out = []
    for name in runtime_names():
        try:
            rt = load_runtime(name)
            if rt.setup_default:
                continue
            steps = list(rt.setup_steps() or [])
        except Exception as exc:  # noqa: BLE001 - a broken runtime: say so, set up the rest
            problems.append(f"runtime {name!r}: could not list its set-up steps: {type(exc).__name__}: {exc}")
            continue
        for obj in steps:
            if not is_step(obj):
                problems.append(f"runtime {name!r}: setup_steps() returned {obj!r}, not a step")
            elif obj.name not in taken:
                out.append(obj)
                taken.append(obj.name)
    return out


@dataclass
class Result:
    name: str
    state: str  # "present", "installed", "would install", "cannot install" (dry run), "failed", "optional"
    detail: str
    how: str = ""
    seconds: float = 0.0  # how long the step took (check and install)

    def __post_init__(self) -> None:  # one line each, whatever a step's message holds
        self.detail, self.how = " ".join(str(self.detail).split()), " ".join(str(self.how).split())

    @property
    def ok(self) -> bool:
        return self.state in ("present", "installed", "optional")


def _failure(exc: BaseException) -> tuple[str, str]:
    if isinstance(exc, StepFailed):
        return exc.why, exc.how
    if isinstance(exc, ImportError):
        return f"{type(exc).__name__}: {exc}", "install pd-chaos's dependencies: python3 -m pip install -e '.[dev]'"
    return f"{type(exc).__name__}: {exc}", ""


def run_step(step: Any, dry_run: bool = False, selected: bool = True) -> Result:
    """check(), then (unless present, ``dry_run`` or not ``selected``) install() and check() again;
    the result says how long that took."""
    t0 = time.monotonic()
    r = _run_step(step, dry_run, selected)
    r.seconds = time.monotonic() - t0
    return r


def _run_step(step: Any, dry_run: bool, selected: bool) -> Result:
    try:
        status = step.check()
        if status is not None:
            return Result(step.name, "present", str(status))
    except Exception as exc:
        why, how = _failure(exc)
        return Result(step.name, "failed", f"check() failed: {why}", how)
    if not selected:
        return Result(step.name, "optional", f"pdchaos setup --only {step.name}")
    if dry_run:
        try:
            plan = step.plan() if callable(getattr(step, "plan", None)) else "install"
            return Result(step.name, "would install", str(plan))
        except Exception as exc:
            why, how = _failure(exc)
            return Result(step.name, "cannot install", why, how)
    try:
        done = step.install()
        status = step.check()
        if status is None:
            return Result(step.name, "failed", f"install() finished ({done}) but check() still finds nothing")
        return Result(step.name, "installed", str(done or status))
    except Exception as exc:
        why, how = _failure(exc)
        return Result(step.name, "failed", why, how)


def describe(r: Result) -> str:
    """The progress line's tail: ``already present: ...``, ``installed ...``, ``FAILED: ...``."""
    return {"present": f"already present: {r.detail}", "installed": r.detail,
            "would install": f"would install: {r.detail}", "cannot install": f"cannot install: {r.detail}",
            "failed": f"FAILED: {r.detail}", "optional": f"optional, not selected ({r.detail})"}[r.state]


def _picked(steps: list[Any], selected: Iterable[str] | None) -> set[str]:
    """The names of the optional steps in ``steps`` that run. ``selected``: the names picked
    with ``--only``; None infers it: a list holding every core step is the full list (nothing
    optional picked), any other list is a pick by name (``--only``)."""
    if selected is not None:
        return set(selected)
    names = {s.name for s in steps}
    return set() if {s.name for s in core_steps()} <= names else names


def run_setup(steps: list[Any], dry_run: bool = False, problems: Iterable[str] = (),
              out: Callable[[str], None] = print, err: Callable[[str], None] | None = None,
              selected: Iterable[str] | None = None) -> int:
    """Run ``steps`` in order, one progress line each, then one line per missing piece; an
    optional step only when picked (``selected``, see :func:`_picked`).
    Exit code: 0 all present; 2 something missing (``--dry-run``: 1 incomplete)."""
    err = err or (lambda s: print(s, file=sys.stderr))
    picked = _picked(steps, selected)
    results: list[Result | None] = [None] * len(steps)
    printed = 0

    def one(i: int) -> None:
        step = steps[i]
        results[i] = run_step(step, dry_run, selected=not getattr(step, "optional", False) or step.name in picked)

    def flush() -> None:  # the steps' lines in their order, each as soon as it and those before it are done
        nonlocal printed
        while printed < len(steps) and results[printed] is not None:
            r = results[printed]
            out(f"setup: {r.name} ... {describe(r)} [{r.seconds:.1f} s]")
            printed += 1

    # A step marked side_by_side (a build that needs no package manager) runs in a thread of its
    # own while the others run one after the other: their order matters (apt's lock, a node env
    # before the model built with it), its does not.
    beside = [i for i, s in enumerate(steps) if getattr(s, "side_by_side", False) and not dry_run]
    threads = [threading.Thread(target=one, args=(i,), name=f"setup-{steps[i].name}", daemon=True) for i in beside]
    for th in threads:
        th.start()
    for i in range(len(steps)):
        if i not in beside:
            one(i)
            flush()
    for th in threads:
        th.join()
    flush()
    results = [r for r in results if r is not None]
    problems = list(problems)
    missing = [r for r in results if not r.ok]
    if not missing and not problems:
        skipped = [r.name for r in results if r.state == "optional"]
        n = len(results) - len(skipped)
        out(f"setup: complete ({n} of {n} present)" + (f"; optional, not selected: {', '.join(skipped)}"
                                                         if skipped else ""))
        return 0
    if dry_run and not problems and all(r.state == "would install" for r in missing):
        out(f"setup: dry run: {len(missing)} of {len(results)} would be installed: "
            f"{', '.join(r.name for r in missing)}")
        return 1
    for r in missing:
        if r.state in ("failed", "cannot install"):
            err(f"missing: {r.name}: {r.detail}" + (f"; by hand: {r.how}" if r.how else ""))
    for p in problems:
        err(f"setup problem: {p}")
    out(f"setup: incomplete: {len(missing)} of {len(results)} missing"
        + (f", {len(problems)} problem(s)" if problems else ""))
    return 1 if dry_run else 2
