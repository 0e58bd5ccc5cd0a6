"""What a node-stack recipe uses besides its lock (stacks/*/recipe.py): a local package installed
from a clean copy with the env's pip, and the final import check."""

from __future__ import annotations

import shutil
from pathlib import Path

from .venv import NodeEnv, NodeEnvError, Step, tree_hash

VERIFY_TIMEOUT_S = 600.0   # `import vllm` takes 10-60 s on a busy 2-core machine
INSTALL_TIMEOUT_S = 900.0


def install_local_package(env: NodeEnv, src: Path, what: str) -> None:
    """Install the local package ``src`` (a folder with pyproject.toml) into ``env``, from a copy:
    pip builds a local folder in place (build/, *.egg-info), and the checkout must stay clean. No
    build isolation (the venv has setuptools), so nothing is fetched to build it."""
    if not (src / "pyproject.toml").is_file():
        raise NodeEnvError(f"{what}'s source is not at {src} (install pd-chaos from its checkout: "
                           "python3 -m pip install -e .)")
    copy = env.path / "src" / src.name
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(src, copy, ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__"))
    env.pip(["--no-deps", "--no-build-isolation", "--force-reinstall", str(copy)], INSTALL_TIMEOUT_S,
            f"pip install {src}")


def source_key(src: Path) -> str:
    """The key of a step that installs the local package ``src`` (its tree's hash; "missing")."""
    return tree_hash(src) if src.is_dir() else "missing"


def import_check(key: str, code: str) -> Step:
    """The last step of a node env: ``code`` runs with the env's python (see :func:`verify_imports`)."""
    return Step("import-check", f"v1 {key}", lambda env: verify_imports(env, code), VERIFY_TIMEOUT_S)


def verify_imports(env: NodeEnv, code: str) -> str:
    """Run ``code`` with the env's python (hubs offline, no vLLM plugin); its last output line."""
    out = env.run(["-c", code], VERIFY_TIMEOUT_S, "import check", env={"HF_HUB_OFFLINE": "1", "VLLM_PLUGINS": ""})
    return out.strip().splitlines()[-1] if out.strip() else "imports ok"
