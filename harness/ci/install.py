"""The installs a workflow job does: ``python3 -m harness.ci.install --profile P [--dry-run]``.

- ``cpu``: pd-chaos with its ``dev`` extra (editable), then ``pdchaos setup`` is the workflow's next step.
- ``ascend``: the same, then vLLM from source at ``--vllm-ref`` with ``VLLM_TARGET_DEVICE=empty``
  (vllm-ascend supplies the device), vllm-ascend from source at ``--vllm-ascend-ref``, and
  ``mooncake-transfer-engine-npu`` pinned (``MOONCAKE_NPU``).

``--dry-run`` (or ``PDCHAOS_CI_DRY_RUN=1`` in the environment, how the tests run a workflow's install
step unchanged) prints each command, with the environment it sets, and runs nothing. Exit: the first
failing command's exit code; 2 on bad input.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys

MOONCAKE_NPU = "mooncake-transfer-engine-npu==0.3.13.post1"
VLLM_REPO = "https://github.com/vllm-project/vllm.git"
VLLM_ASCEND_REPO = "https://github.com/vllm-project/vllm-ascend.git"
_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")


def commands(profile: str, vllm_ref: str, vllm_ascend_ref: str, src: str, python: str = "python3"
             ) -> list[tuple[dict[str, str], list[str]]]:
    """(extra environment, argv) per step, in order."""
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    out: list[tuple[dict[str, str], list[str]]] = [({}, pip + ["-e", ".[dev]"])]
    if profile == "cpu":
        return out
    for name, ref in (("--vllm-ref", vllm_ref), ("--vllm-ascend-ref", vllm_ascend_ref)):
        if not _REF.match(ref or "") or ".." in ref:
            raise ValueError(f"{name} {ref!r}: expected a branch, tag or commit")
    vllm_dir, va_dir = f"{src}/vllm", f"{src}/vllm-ascend"
    out += [
        ({}, ["git", "clone", "--filter=blob:none", VLLM_REPO, vllm_dir]),
        ({}, ["git", "-C", vllm_dir, "checkout", "--detach", vllm_ref]),
        ({"VLLM_TARGET_DEVICE": "empty"}, pip + ["-e", vllm_dir]),
        ({}, ["git", "clone", "--filter=blob:none", VLLM_ASCEND_REPO, va_dir]),
        ({}, ["git", "-C", va_dir, "checkout", "--detach", vllm_ascend_ref]),
        ({}, ["git", "-C", va_dir, "submodule", "update", "--init", "--recursive"]),
        ({}, pip + ["-e", va_dir]),
        ({}, pip + [MOONCAKE_NPU]),
    ]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m harness.ci.install", description=__doc__.splitlines()[0])
    p.add_argument("--profile", choices=("cpu", "ascend"), default="cpu")
    p.add_argument("--vllm-ref", default="", help="vLLM branch, tag or commit (profile ascend)")
    p.add_argument("--vllm-ascend-ref", default="main", help="vllm-ascend branch, tag or commit (profile ascend)")
    p.add_argument("--src", default="../pdchaos-src", help="where the sources are cloned (profile ascend)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = p.parse_args(argv)
    args.dry_run = args.dry_run or os.environ.get("PDCHAOS_CI_DRY_RUN") == "1"
    try:
        steps = commands(args.profile, args.vllm_ref, args.vllm_ascend_ref, args.src)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for env, argv_ in steps:
        line = " ".join(f"{k}={v}" for k, v in env.items()) + (" " if env else "") + shlex.join(argv_)
        print(("would run: " if args.dry_run else "+ ") + line, flush=True)
        if args.dry_run:
            continue
        rc = subprocess.run(argv_, env={**os.environ, **env}).returncode
        if rc != 0:
            print(f"error: exit {rc}: {line}", file=sys.stderr)
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
