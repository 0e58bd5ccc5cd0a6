"""The installs a workflow job does: ``python3 -m harness.ci.install --profile P [--dry-run]``.

- ``cpu``: pd-chaos with its ``dev`` extra (editable); ``pdchaos setup`` is the workflow's next
  step. Every job that needs no NPU installs this way, also on vllm-ascend's 0-NPU runners: what
  such a job runs of vllm-ascend lives in the conformance node env, which ``pdchaos setup --only
  ascend-conf-stack`` builds with ``SOC_VERSION=ascend910b1 COMPILE_CUSTOM_KERNELS=0`` (CI runs that
  same command on CPU, so this install runs for real there).
- ``ascend`` (the jobs with NPUs), as vllm-ascend's own CI installs (its ``_selected_tests.yaml``):
  Mooncake's system libraries (``libibverbs1 ibverbs-providers librdmacm1 libnuma1``); the Ascend
  and PyTorch CPU package indexes in ``PIP_EXTRA_INDEX_URL``; vLLM from source at the ref the
  vllm-ascend checkout names in ``.github/vllm-release-tag.commit`` (``--vllm-ref auto``), with
  ``VLLM_TARGET_DEVICE=empty``, then ``triton`` removed; vllm-ascend with the runner's
  ``SOC_VERSION`` and ``MAX_JOBS``; ``triton-ascend`` and ``mooncake-transfer-engine-npu`` at
  vllm-ascend's pins; finally the version matrix asked whether the hardened connectors support
  what got installed. The matrix is the system under test's own table (``connector_patch/versions.py``):
  the harness asks it through its command line (``python3 -m connector_patch.versions ...``), never
  by importing it.

  ``--vllm-ascend`` is a release (``0.23.0.post1``: installed from PyPI, vLLM's ref read from
  the release branch ``releases/v0.23.0``) or a git ref (``main``, a tag, a commit: installed from
  that checkout). Before anything is installed, the pair is checked against the matrix: an
  unsupported release, a git ref (whose version no table can know) or a vLLM ref that disagrees
  with the matrix stops the job with one line, unless ``--allow-unsupported`` (the verdicts of the
  hardened target then mean less, and the job says so).

``--dry-run`` (or ``PDCHAOS_CI_DRY_RUN=1`` in the environment, how the tests run a workflow's install
step unchanged) prints each command, with the environment it sets, and runs nothing; a step that
reads a file of a checkout prints what it would read. Exit: the first failing command's exit code;
2 on bad input or an unsupported pair.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

VLLM_REPO = "https://github.com/vllm-project/vllm.git"
VLLM_ASCEND_REPO = "https://github.com/vllm-project/vllm-ascend.git"
# vllm-ascend's CI (releases/v0.23.0 and main, .github/workflows/_selected_tests.yaml)
MOONCAKE_NPU = "mooncake-transfer-engine-npu==0.3.11.post1"
TRITON_ASCEND = "triton-ascend==3.2.2"
MOONCAKE_APT = ("libibverbs1", "ibverbs-providers", "librdmacm1", "libnuma1")
EXTRA_INDEXES = ("https://repo.huaweicloud.com/ascend/repos/pypi", "https://download.pytorch.org/whl/cpu/")
RELEASE_TAG_FILE = ".github/vllm-release-tag.commit"  # what vllm-ascend's CI reads for vLLM's ref
SOCS = ("ascend910b1", "ascend910_9391", "ascend310p1")  # A2, A3, 310P as vllm-ascend's builds name them
_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")
_RELEASE = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+(?:(?:\.post|rc|\.dev)[0-9]+)?$")
_SHA = re.compile(r"^[0-9a-f]{7,40}$")
_TAG = re.compile(r"^v([0-9]+\.[0-9]+\.[0-9]+)(?:[.-].*)?$")


class InstallError(Exception):
    """Bad input or an unsupported pair: one line, exit 2."""


def matrix(*args: str) -> tuple[int, str]:
    """Ask the hardened connectors' version matrix (its command line, from this checkout)."""
    proc = subprocess.run([sys.executable, "-m", "connector_patch.versions", *args], capture_output=True,
                          text=True, timeout=60)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def _pairs_text() -> str:
    return matrix("pairs")[1]


def release_branch(release: str) -> str:
    """vllm-ascend's release branch of a release: 0.23.0.post1 -> releases/v0.23.0."""
    return "releases/v" + ".".join(release.split(".")[:3]).split("rc")[0]


def check_vllm_ref(ref: str, ascend_release: str | None, allow: bool) -> str:
    """The vLLM ref, checked: a release tag whose version the matrix pairs with ``ascend_release``."""
    if not _REF.match(ref or "") or ".." in ref:
        raise InstallError(f"vLLM ref {ref!r}: expected a branch, tag or commit")
    if allow:
        return ref
    m = _TAG.match(ref)
    if not m:
        raise InstallError(f"vLLM ref {ref!r} is not a release tag: the hardened connectors support "
                           f"{_pairs_text()} (--allow-unsupported to run anyway)")
    rc, text = matrix("pair", "--vllm-ascend", ascend_release or "git-ref", "--vllm", m.group(1))
    if rc != 0:
        raise InstallError(text.removeprefix("error: "))
    return ref


@dataclass
class Step:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)

    def line(self) -> str:
        return " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items()) + (" " if self.env else "") \
            + shlex.join(self.argv)


@dataclass
class Plan:
    """The steps, and how the vLLM ref is found (``read_ref``: after the step that cloned vllm-ascend)."""

    steps: list[Step]
    read_ref_after: int = -1  # index of the step after which the ref file is read; -1: the ref is known
    ascend_dir: str = ""
    ascend_release: str | None = None


def plan(profile: str, vllm_ref: str, vllm_ascend: str, src: str, soc: str, max_jobs: int,
         allow: bool, python: str = "python3") -> Plan:
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    steps = [Step(pip + ["-e", ".[dev]"])]
    if profile == "cpu":
        return Plan(steps)
    if profile != "ascend":
        raise InstallError(f"--profile {profile!r}: expected cpu or ascend")
    if soc not in SOCS:
        raise InstallError(f"--soc {soc!r}: expected one of {', '.join(SOCS)} (the runner's chip)")
    if not 1 <= max_jobs <= 256:
        raise InstallError(f"--max-jobs {max_jobs}: expected 1..256")
    if not _REF.match(vllm_ascend or "") or ".." in vllm_ascend:
        raise InstallError(f"--vllm-ascend {vllm_ascend!r}: expected a release (0.23.0.post1) or a git ref")
    release = vllm_ascend if _RELEASE.match(vllm_ascend) else None
    if release is None and not allow:
        raise InstallError(f"--vllm-ascend {vllm_ascend!r} is a git ref: its version is not one the matrix "
                           f"can know; supported: {_pairs_text()} (--allow-unsupported to run anyway)")
    if release is not None and not allow:
        rc, text = matrix("pair", "--vllm-ascend", release)
        if rc != 0:
            raise InstallError(text.removeprefix("error: "))
    if vllm_ref != "auto":
        check_vllm_ref(vllm_ref, release, allow)
    index_env = {"PIP_EXTRA_INDEX_URL": " ".join(EXTRA_INDEXES)}
    vllm_dir, va_dir = f"{src}/vllm", f"{src}/vllm-ascend"
    va_ref = release_branch(release) if release else vllm_ascend
    steps += [
        Step(["apt-get", "update", "-q"]),
        Step(["apt-get", "install", "-y", "-q", "--no-install-recommends", *MOONCAKE_APT]),
        Step(["ldconfig"]),
        *clone(VLLM_ASCEND_REPO, va_ref, va_dir),
    ]
    read_after = len(steps) - 1 if vllm_ref == "auto" else -1
    steps += [
        *clone(VLLM_REPO, "{vllm_ref}" if vllm_ref == "auto" else vllm_ref, vllm_dir),
        Step(pip + ["-e", vllm_dir], {"VLLM_TARGET_DEVICE": "empty", **index_env}),
        Step([python, "-m", "pip", "uninstall", "-y", "-q", "triton"]),
        # vllm-ascend builds without isolation (as its CI does): its build and runtime requirements
        # first, from the checkout (its requirements.txt mirrors pyproject's build-system)
        Step(pip + ["-r", f"{va_dir}/requirements.txt"], index_env),
    ]
    build_env = {"SOC_VERSION": soc, "MAX_JOBS": str(max_jobs), **index_env}
    if release:
        steps.append(Step(pip + ["--no-build-isolation", f"vllm-ascend=={release}"], build_env))
    else:
        steps += [Step(["git", "-C", va_dir, "submodule", "update", "--init", "--recursive"]),
                  Step(pip + ["--no-build-isolation", "-e", va_dir], build_env)]
    steps += [
        Step(pip + ["--force-reinstall", "--no-deps", TRITON_ASCEND], index_env),
        Step(pip + ["--no-deps", MOONCAKE_NPU]),
        Step([python, "-m", "connector_patch.versions", "installed"] + (["--allow-unsupported"] if allow else [])),
    ]
    return Plan(steps, read_after, va_dir, release)


def clone(repo: str, ref: str, dest: str) -> list[Step]:
    """A checkout of ``ref``: a branch or tag is cloned by name (a fresh clone has no local branch
    but its default one, so ``checkout <branch>`` would fail); a commit is fetched, then checked out."""
    if _SHA.match(ref):
        return [Step(["git", "clone", "--filter=blob:none", "--no-checkout", repo, dest]),
                Step(["git", "-C", dest, "checkout", "--detach", ref])]
    return [Step(["git", "clone", "--filter=blob:none", "--branch", ref, repo, dest])]


def read_vllm_ref(ascend_dir: str) -> str:
    """vLLM's ref as vllm-ascend's CI reads it: the first word of its release-tag file."""
    path = Path(ascend_dir) / RELEASE_TAG_FILE
    try:
        words = path.read_text(encoding="utf-8").split()
    except OSError as exc:
        raise InstallError(f"{path}: {exc.strerror or exc} (give --vllm-ref)") from None
    if not words:
        raise InstallError(f"{path}: empty (give --vllm-ref)")
    return words[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m harness.ci.install", description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="cpu", help="cpu or ascend")
    p.add_argument("--vllm-ascend", "--vllm-ascend-ref", dest="vllm_ascend", default="0.23.0.post1",
                   help="vllm-ascend release (from PyPI) or git ref (profile ascend)")
    p.add_argument("--vllm-ref", default="auto",
                   help=f"vLLM tag, branch or commit; auto: the vllm-ascend checkout's {RELEASE_TAG_FILE}")
    p.add_argument("--soc", default="ascend910b1", help=f"SOC_VERSION of the runner's chip ({', '.join(SOCS)})")
    p.add_argument("--max-jobs", type=int, default=16, help="MAX_JOBS for vllm-ascend's build")
    p.add_argument("--src", default="../pdchaos-src", help="where the sources are cloned (profile ascend)")
    p.add_argument("--allow-unsupported", action="store_true",
                   help="install a pair the hardened connectors do not support")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = p.parse_args(argv)
    args.dry_run = args.dry_run or os.environ.get("PDCHAOS_CI_DRY_RUN") == "1"
    try:
        pl = plan(args.profile, args.vllm_ref, args.vllm_ascend, args.src, args.soc, args.max_jobs,
                  args.allow_unsupported)
    except InstallError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.allow_unsupported and args.profile == "ascend":
        print("warning: --allow-unsupported: the pair is not checked against the hardened connectors' matrix",
              file=sys.stderr)
    vllm_ref = args.vllm_ref
    for i, step in enumerate(pl.steps):
        st = Step([a.replace("{vllm_ref}", vllm_ref) for a in step.argv], step.env)
        print(("would run: " if args.dry_run else "+ ") + st.line(), flush=True)
        if not args.dry_run:
            rc = subprocess.run(st.argv, env={**os.environ, **st.env}).returncode
            if rc != 0:
                print(f"error: exit {rc}: {st.line()}", file=sys.stderr)
                return rc
        if i == pl.read_ref_after:
            if args.dry_run:
                print(f"would read: vLLM's ref from {pl.ascend_dir}/{RELEASE_TAG_FILE}, and check it", flush=True)
                vllm_ref = "<" + RELEASE_TAG_FILE + ">"
                continue
            try:
                vllm_ref = check_vllm_ref(read_vllm_ref(pl.ascend_dir), pl.ascend_release, args.allow_unsupported)
            except InstallError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            print(f"vLLM ref {vllm_ref} (from {RELEASE_TAG_FILE})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
