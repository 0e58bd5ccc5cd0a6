"""STUBS: the NPU-only modules that cannot exist on a CPU host, replaced where vllm-ascend's own unit
tests replace them (its ``tests/ut/conftest.py``, for a host where ``npu-smi info`` fails).

This is the only place in pd-chaos that stubs anything. What is stubbed, and nothing else:

* ``torch_npu`` (and ``torch_npu._C``, ``torch_npu._C._distributed_c10d``, ``torch_npu._inductor``):
  the Ascend build of torch;
* ``acl`` / ``acl.rt``: CANN's runtime;
* ``triton.runtime``: the device properties an Ascend triton would report;
* ``torch.npu``, the ``npu`` private-use backend name, ``torch.version.cann``,
  ``torch.distributed.is_hccl_available``;
* ``mooncake.engine.TransferEngine`` and ``mooncake.store`` (a store whose ``setup()`` returns 0):
  the Mooncake build for NPUs.

vLLM and vllm-ascend themselves are never stubbed or edited: their real code runs on top of this.
Call :func:`install` before the first import of vllm or vllm_ascend; :func:`after_vllm_ascend`
once vllm_ascend is imported (the conftest sets those after its import too).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from unittest.mock import MagicMock

_installed = False


def _module(name: str, path: bool = False) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.util.spec_from_loader(name, loader=None)
    if path:
        mod.__path__ = []  # type: ignore[attr-defined]
    return mod


class _Store:
    """Mooncake's distributed store as the stub gives it: set up fine, holding nothing."""

    def setup(self, *args, **kwargs) -> int:
        return 0

    def init_all(self, *args, **kwargs) -> int:
        return 0

    def __getattr__(self, name: str):
        return MagicMock(name=f"mooncake.store.{name}")


def install() -> None:
    """Put the stubs in ``sys.modules`` (idempotent)."""
    global _installed
    if _installed:
        return
    triton_runtime = MagicMock()
    triton_runtime.driver.active.utils.get_device_properties.return_value = {"num_aic": 8, "num_vectorcore": 8}
    sys.modules["triton.runtime"] = triton_runtime

    torch_npu = _module("torch_npu", path=True)
    torch_npu.npu = MagicMock()  # type: ignore[attr-defined]
    torch_npu.profiler = MagicMock()  # type: ignore[attr-defined]
    torch_npu.npu_fusion_attention = MagicMock()  # type: ignore[attr-defined]
    torch_npu.npu_format_cast = MagicMock(side_effect=lambda weight, fmt: weight)  # type: ignore[attr-defined]
    torch_npu._C = MagicMock()  # type: ignore[attr-defined]
    torch_npu._C._NPUTaskGroupHandle = MagicMock
    sys.modules["torch_npu"] = torch_npu
    sys.modules["torch_npu._C"] = torch_npu._C
    sys.modules["torch_npu._C._distributed_c10d"] = torch_npu._C._distributed_c10d

    acl_rt = _module("acl.rt")
    acl_rt.memcpy = MagicMock()  # type: ignore[attr-defined]
    acl = _module("acl", path=True)
    acl.rt = acl_rt  # type: ignore[attr-defined]
    sys.modules["acl"], sys.modules["acl.rt"] = acl, acl_rt

    engine = _module("mooncake.engine")
    engine.TransferEngine = MagicMock()  # type: ignore[attr-defined]
    store = _module("mooncake.store")
    store.MooncakeDistributedStore = _Store  # type: ignore[attr-defined]
    store.ReplicateConfig = MagicMock  # type: ignore[attr-defined]
    try:
        import mooncake  # noqa: F401  (a real Mooncake, if one is installed: keep its package)
    except ImportError:
        sys.modules["mooncake"] = _module("mooncake", path=True)
    sys.modules["mooncake.engine"], sys.modules["mooncake.store"] = engine, store

    import torch

    try:
        torch.utils.rename_privateuse1_backend("npu")
    except RuntimeError:
        pass
    torch.npu = MagicMock()  # type: ignore[attr-defined]
    torch.npu.is_available = MagicMock(return_value=False)
    torch.npu.Stream = MagicMock
    torch.version.cann = None  # type: ignore[attr-defined]
    torch.distributed.is_hccl_available = MagicMock(return_value=True)
    _installed = True


def after_vllm_ascend() -> None:
    """What the conftest sets once vllm_ascend is imported."""
    npu = sys.modules["torch_npu"]
    npu.npu.current_device = MagicMock(return_value=0)
    sys.modules["torch_npu._inductor"] = MagicMock()
    for name in ("_npu_flash_attention", "_npu_paged_attention_splitfuse", "_npu_reshape_and_cache",
                 "npu_moe_gating_top_k_softmax", "npu_quant_matmul", "npu_rms_norm", "npu_swiglu",
                 "npu_convert_weight_to_int4pack"):
        setattr(npu, name, MagicMock())
