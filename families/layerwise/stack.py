"""Conformance-env side: vllm-ascend's real layerwise connector, built on CPU.

Everything here runs in the conformance node env (vLLM 0.23.0 + vllm-ascend 0.23.0.post1 + CPU
torch; ``stacks/ascend_cpu/recipe.py``), after the NPU stubs (``pdchaos_npu_stubs``). Built
from the real code, nothing of it replaced:

* a real ``VllmConfig`` (a two-layer model described by a hand-written ``config.json``, no weights;
  ``DeviceConfig("cpu")``; ``KVTransferConfig`` naming the connector, role and ``kv_port``);
* vLLM's world/TP groups on one CPU process (gloo, world size 1), as a worker has them;
* the connector, worker role (``MooncakeLayerwiseConnector`` or the hardened subclass), its real
  ``__init__`` and ``register_kv_caches`` over CPU KV tensors: D's ``KVCacheRecvingLayerThread``
  (ROUTER) or P's ``KVCacheSendingLayerThread`` start as they do in vLLM;
* the connector, scheduler role (D's metaserver POST through its own ``httpx`` client).

The transfer engine behind ``global_te`` is :class:`~.fake_engine.FakeTransferEngine`, the
nemesis-controlled peer (the one part that is not vllm-ascend's; the stub's ``TransferEngine`` is
never used). Logs carry counts and codes only.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any

NUM_LAYERS = 2
BLOCK_SIZE = 16
NUM_BLOCKS = 32
KV_HEADS = 2
HEAD_SIZE = 32
UPSTREAM_CLASS = "MooncakeLayerwiseConnector"


def import_stack() -> None:
    """Stubs, then vllm_ascend (the order vllm-ascend's own unit tests use)."""
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")  # get_ip(): loopback only
    os.environ.setdefault("VLLM_PLUGINS", "")  # no platform plugin: the CPU platform (model inspection runs in a subprocess without the stubs)
    import pdchaos_npu_stubs

    pdchaos_npu_stubs.install()
    import vllm_ascend  # noqa: F401

    pdchaos_npu_stubs.after_vllm_ascend()
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    if UPSTREAM_CLASS not in KVConnectorFactory._registry:
        from vllm_ascend.distributed.kv_transfer import register_connector

        register_connector()  # what vllm-ascend's platform plugin does at start-up
    from connector_patch.layerwise.ascend_connector import register

    register()


def layer_names() -> list[str]:
    return [f"model.layers.{i}.self_attn.attn" for i in range(NUM_LAYERS)]


def write_model_dir(folder: Path) -> Path:
    """A model folder holding only a config.json (llama-like, two layers): enough for ModelConfig."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": KV_HEADS * HEAD_SIZE,
           "intermediate_size": 128, "num_attention_heads": KV_HEADS, "num_key_value_heads": KV_HEADS,
           "num_hidden_layers": NUM_LAYERS, "vocab_size": 256, "max_position_embeddings": 512,
           "rms_norm_eps": 1e-6, "torch_dtype": "float32", "tie_word_embeddings": False}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def vllm_config(role: str, kv_port: int, engine_id: str, model_dir: Path, connector: str,
                extra: dict | None = None, policy: str = "fail") -> Any:
    import torch
    from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, ParallelConfig,
                             SchedulerConfig, VllmConfig)

    model = ModelConfig(model=str(model_dir), tokenizer=None, skip_tokenizer_init=True, dtype=torch.float32,
                        max_model_len=512, seed=0)
    kv = KVTransferConfig(kv_connector=connector, kv_role=role, kv_port=kv_port, engine_id=engine_id,
                          kv_connector_extra_config=dict(extra or {}), kv_load_failure_policy=policy)
    # no prefix caching: every request's KV comes from P (the stand-in forward hashes nothing)
    cfg = VllmConfig(model_config=model, cache_config=CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=False),
                     parallel_config=ParallelConfig(), device_config=DeviceConfig("cpu"),
                     scheduler_config=SchedulerConfig(max_model_len=512, is_encoder_decoder=False,
                                                      async_scheduling=False),
                     kv_transfer_config=kv)
    cfg.cache_config.num_gpu_blocks = NUM_BLOCKS
    return cfg


def kv_cache_config() -> Any:
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor

    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=KV_HEADS, head_size=HEAD_SIZE, dtype=torch.float32)
    names = layer_names()
    return KVCacheConfig(num_blocks=NUM_BLOCKS,
                         kv_cache_tensors=[KVCacheTensor(size=spec.page_size_bytes * NUM_BLOCKS, shared_by=[n])
                                           for n in names],
                         kv_cache_groups=[KVCacheGroupSpec(names, spec)])


def kv_caches(shm_prefix: str = "") -> dict:
    """{layer name: (K, V)} CPU tensors; with ``shm_prefix``, each one backed by its own
    shared-memory file ``<prefix>-<layer>-<k|v>`` (D's: what P's fake engine writes into)."""
    import torch

    shape = (NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_SIZE)
    if not shm_prefix:
        return {n: (torch.zeros(shape), torch.zeros(shape)) for n in layer_names()}
    numel = NUM_BLOCKS * BLOCK_SIZE * KV_HEADS * HEAD_SIZE
    return {n: tuple(torch.from_file(f"{shm_prefix}-{i}-{kv}", shared=True, size=numel,
                                     dtype=torch.float32).view(shape) for kv in ("k", "v"))
            for i, n in enumerate(layer_names())}


def kv_pattern(external_id: str, layer: int, kv: int) -> float:
    """The value P's stand-in forward writes into every element of a request's blocks for one
    layer's K (``kv`` 0) or V (1), and D expects there once the load is done: one of its own per
    request, layer and half (exact in float32)."""
    return float(zlib.crc32(external_id.encode()) % (1 << 20)) + 1.0 + layer * 0.25 + kv * 0.125


def shm_files(caches: dict) -> list[tuple[int, int, str]]:
    """(base address, size, file) of each tensor of ``kv_caches(shm_prefix)``, in its order."""
    return [(t.data_ptr(), t.numel() * t.element_size(), t.untyped_storage().filename)
            for pair in caches.values() for t in pair]


def init_distributed(port: int) -> None:
    """vLLM's world and model-parallel groups for one CPU worker (gloo, world size 1)."""
    from vllm.config import set_current_vllm_config  # noqa: F401
    from vllm.distributed.parallel_state import ensure_model_parallel_initialized, init_distributed_environment

    init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}",
                                 local_rank=0, backend="gloo")
    ensure_model_parallel_initialized(1, 1)


def connector_class(impl: str, hardened_class: str = "", plugin_path: str = "") -> type:
    """The connector class of ``impl``; ``hardened_class`` (``module:Class``, imported with
    ``plugin_path`` first on ``sys.path``) replaces the hardened one: it must subclass it, and is
    registered with vLLM's connector factory under its own name (D's scheduler builds it there)."""
    if impl == "hardened":
        from connector_patch.layerwise.ascend_connector import HardenedMooncakeLayerwiseConnector

        if not hardened_class:
            return HardenedMooncakeLayerwiseConnector
        import importlib
        import sys

        if plugin_path and plugin_path not in sys.path:
            sys.path.insert(0, plugin_path)
        module, _, name = hardened_class.partition(":")
        cls = getattr(importlib.import_module(module), name, None)
        if not (isinstance(cls, type) and issubclass(cls, HardenedMooncakeLayerwiseConnector)):
            raise TypeError(f"--hardened-class {hardened_class}: not a subclass of HardenedMooncakeLayerwiseConnector")
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

        if name not in KVConnectorFactory._registry:
            KVConnectorFactory.register_connector(name, module, name)
        return cls
    from vllm_ascend.distributed.kv_transfer.kv_p2p.mooncake_layerwise_connector import MooncakeLayerwiseConnector

    return MooncakeLayerwiseConnector


def send_meta_tagger(impl: str) -> Any:
    """What P's scheduler side of ``impl`` adds to the connector metadata it builds from requests'
    transfer params (the stand-in P engine builds that metadata: it calls this as the scheduler
    would): the hardened one carries D's write-by time; upstream's adds nothing (None)."""
    if impl != "hardened":
        return None
    from connector_patch.layerwise.ascend_connector import tag_write_by

    return tag_write_by


def build(impl: str, kv_role: str, kv_port: int, engine_id: str, model_dir: Path, dist_port: int, engine: Any,
          extra: dict | None = None, policy: str = "fail", scheduler_side: bool = True, hardened_class: str = "",
          plugin_path: str = "", shm_prefix: str = "") -> tuple[Any, Any, Any, dict]:
    """(vllm_config, worker connector, scheduler connector or None, KV caches) for ``kv_role``
    ("kv_consumer": D, with its scheduler side unless ``scheduler_side`` is False, when vLLM's
    Scheduler builds its own; "kv_producer": P). ``policy``: ``kv_load_failure_policy``."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm_ascend.ascend_config import init_ascend_config
    from vllm_ascend.distributed.kv_transfer.utils.mooncake_transfer_engine import global_te

    cls = connector_class(impl, hardened_class, plugin_path)
    name = cls.__name__ if impl == "hardened" else UPSTREAM_CLASS
    cfg = vllm_config(kv_role, kv_port, engine_id, model_dir, name, extra, policy)
    global_te.transfer_engine = engine  # the nemesis-controlled peer, where upstream keeps its engine
    with set_current_vllm_config(cfg):
        init_ascend_config(cfg)
        init_distributed(dist_port)
        kcc = kv_cache_config()
        worker = cls(cfg, KVConnectorRole.WORKER, kcc)
        caches = kv_caches(shm_prefix)
        worker.register_kv_caches(caches)
        sched = cls(cfg, KVConnectorRole.SCHEDULER, kcc) if kv_role == "kv_consumer" and scheduler_side else None
    return cfg, worker, sched, caches
