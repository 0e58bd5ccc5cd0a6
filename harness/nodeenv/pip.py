"""What a node-stack recipe uses to install into a node env with pip (stacks/*/recipe.py): pinned
requirements read from a wheel's METADATA, local wheel folders offered with ``--find-links``, a
local package installed from a clean copy, and the final import check."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from .venv import NodeEnv, NodeEnvError, Step, tree_hash

FIND_LINKS_ENV = "PDCHAOS_NODEENV_FIND_LINKS"
WARM_WHEELS = Path("~/.cache/pdchaos-warm/wheels")
VERIFY_TIMEOUT_S = 600.0   # `import vllm` takes 10-60 s on a busy 2-core machine
INSTALL_TIMEOUT_S = 900.0


def canonical(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


_REQ_NAME = re.compile(r"\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)")
_EXTRA_MARKER = re.compile(r"""(^|[\s(])extra\s*==""")


def requires_from_metadata(text: str, drop: tuple[str, ...] = ()) -> list[str]:
    """The ``Requires-Dist`` requirements of a METADATA text (its headers only), without those
    that apply only to an extra (``extra == ...`` in the marker) and without the distributions
    in ``drop``. Environment markers are kept as written (pip evaluates them for the target
    interpreter); exact duplicates are dropped, order is kept."""
    dropped = {canonical(d) for d in drop}
    out: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            break  # the end of the headers: the rest is the description
        key, sep, value = line.partition(":")
        if not sep or key.strip().lower() != "requires-dist":
            continue
        req = " ".join(value.split())
        _spec, _, marker = req.partition(";")
        if _EXTRA_MARKER.search(marker):
            continue
        m = _REQ_NAME.match(req)
        if m is None or canonical(m.group(1)) in dropped:
            continue
        if req not in out:
            out.append(req)
    return out


def find_links() -> list[str]:
    """Folders offered to pip as ``--find-links`` (only those that exist)."""
    dirs = [d for d in os.environ.get(FIND_LINKS_ENV, "").split(os.pathsep) if d]
    dirs.append(str(WARM_WHEELS.expanduser()))
    out = []
    for d in dirs:
        if os.path.isdir(d) and d not in out:
            out.append(d)
    return out


def links_args() -> list[str]:
    return [a for d in find_links() for a in ("--find-links", d)]


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


def pip_install(env: NodeEnv, spec: str, timeout: float, *, no_deps: bool = False) -> str:
    """``pip install [--no-deps] SPEC`` into ``env`` with the local wheel folders offered; the step's key."""
    flags = ["--no-deps"] if no_deps else []
    env.pip([*flags, *links_args(), spec], timeout, " ".join(["pip install", *flags, spec]))
    return " ".join([spec, *flags])


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
