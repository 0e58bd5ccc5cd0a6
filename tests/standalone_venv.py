"""Fresh venvs for the standalone reports' real runs: the vLLM CPU node stack linked in, nothing of
pd-chaos importable (no ``pdchaos*`` entries, no ``.pth`` pointing at this tree), and for the
``patched`` target the upstream vLLM series applied to a private copy of vLLM. Shared by the P/D and
the store reports' tests (tests/families/pd/, tests/families/lookup/)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def node_env():
    from stacks.vllm_cpu.recipe import pd_node_env

    return pd_node_env(out=lambda line: None)


def patched_overlay() -> Path:
    """vLLM with the upstream series applied (a private copy; the node stack stays as installed)."""
    from connector_patch.upstream import read_series
    from harness.nodeenv.overlay import series_overlay
    from stacks.vllm_cpu.recipe import VLLM_VERSION

    return series_overlay(node_env().site_packages(), "vllm", lambda: read_series("vllm", VLLM_VERSION),
                          "the patched target")


def fresh_venv(dest: Path, target: str) -> Path:
    """A venv with the node stack and nothing of pd-chaos; its python."""
    env = node_env()
    base = subprocess.run([str(env.bin / "python"), "-c", "import sys; print(sys._base_executable)"],
                          capture_output=True, text=True, timeout=120, check=True).stdout.strip()
    subprocess.run([base, "-m", "venv", "--without-pip", str(dest)], check=True, timeout=300,
                   env={"PATH": "/usr/bin:/bin"})
    site = next(dest.glob("lib/python3*/site-packages"))
    overlay = patched_overlay() if target == "patched" else None
    for entry in env.site_packages().iterdir():
        if entry.name.startswith(("pdchaos", "__pycache__")) or entry.name.endswith(".pth"):
            continue
        src = overlay / "vllm" if (overlay is not None and entry.name == "vllm") else entry
        (site / entry.name).symlink_to(src)
    return dest / "bin" / "python"


def venv_maker(tmp_path_factory, make=None):
    """``get(target)``: one fresh venv per target, made on first use by ``make(dest, target)`` (default
    :func:`fresh_venv`, the vLLM node stack's; a test module's fixture)."""
    make = make or fresh_venv
    made: dict[str, Path] = {}

    def get(target: str) -> Path:
        if target not in made:
            made[target] = make(tmp_path_factory.mktemp(f"venv-{target}"), target)
        return made[target]
    return get


def clean_env() -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8",
            "TMPDIR": os.environ.get("TMPDIR", "/tmp")}
