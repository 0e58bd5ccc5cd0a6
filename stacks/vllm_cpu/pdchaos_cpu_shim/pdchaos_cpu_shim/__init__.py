"""pd-chaos CPU shim: an **environment shim**, not part of the system under test.

It is a vLLM *general plugin* (entry point group ``vllm.general_plugins``), so vLLM loads it in
every one of its processes (API server, engine core, workers), and it is installed in the node
environment of **every target alike** — upstream vLLM today and, later, the hardened connector —
so whatever a run finds is about the target, never about this shim.

What it does, and only that: (1) when ``torch.accelerator.is_available()`` is false, it makes
``torch.accelerator.current_device_index()`` return 0 instead of raising. vLLM 0.32.0's
``MooncakeConnectorWorker.__init__``
(``vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py``, about line 1186)
calls it unconditionally, so without an accelerator the Mooncake connector cannot even start on a
CPU-only host. Nothing else in that connector is tied to CUDA (its protocol comes from
``kv_connector_extra_config.mooncake_protocol``, memory is registered by host pointer).

(2) on a CPU with AMX it requests the AMX tile permission for the process (see
:func:`enable_amx`): without it a vLLM server whose first step is small dies with SIGILL.

(3) it starts vLLM's engine core and workers by ``fork``, as vLLM does on a GPU host by default
(``VLLM_WORKER_MULTIPROC_METHOD``'s default), instead of the ``spawn`` that vLLM 0.32.0's CPU
platform sets (``CpuPlatform.check_and_update_config``, "Environment variables for CPU executor"):
each spawned process imports torch and vLLM again, ~7-8 s of a 2-core machine's time each, so a
node was ready in ~25 s by spawn and is in ~12-14 s by fork (see :func:`start_by_fork`). The CPU
worker still binds its OpenMP threads itself, after the fork. ``PDCHAOS_CPU_SPAWN=1`` keeps vLLM's
``spawn``.

``register()`` is idempotent (a second call changes nothing), leaves a host that has an
accelerator untouched, and logs one line when the shim is active.
"""

from __future__ import annotations

import logging
import os
from typing import Any

__all__ = ["register", "patch_accelerator", "start_by_fork", "MARK", "SPAWN_ENV"]

# Set on the replacement function, so a second register() (another vLLM process start, or a
# re-import) recognises its own work and does nothing.
MARK = "_pdchaos_cpu_shim"
SPAWN_ENV = "PDCHAOS_CPU_SPAWN"  # "1": leave vLLM's CPU platform starting its processes by spawn

logger = logging.getLogger("vllm.pdchaos_cpu_shim")


def patch_accelerator(accelerator: Any) -> str:
    """Patch ``accelerator`` (``torch.accelerator``, or a stand-in with ``is_available`` and
    ``current_device_index``). Returns what happened: ``"patched"``, ``"already patched"``,
    ``"accelerator present"`` (nothing touched) or ``"no torch.accelerator"``."""
    if accelerator is None or not callable(getattr(accelerator, "current_device_index", None)):
        return "no torch.accelerator"
    current = accelerator.current_device_index
    if getattr(current, MARK, False):
        return "already patched"
    if accelerator.is_available():
        return "accelerator present"

    def current_device_index() -> int:
        # Decided per call: should an accelerator show up, the real function answers.
        if accelerator.is_available():
            return current()
        return 0

    setattr(current_device_index, MARK, True)
    current_device_index.__wrapped__ = current  # type: ignore[attr-defined]
    current_device_index.__doc__ = ("pdchaos_cpu_shim: 0 when no accelerator is available, else "
                                    "torch.accelerator.current_device_index()")
    accelerator.current_device_index = current_device_index
    return "patched"


def register() -> None:
    """The ``vllm.general_plugins`` entry point."""
    try:
        import torch
    except ImportError:  # no torch: nothing to shim
        return
    said = []
    if patch_accelerator(getattr(torch, "accelerator", None)) == "patched":
        said.append("pdchaos_cpu_shim active (environment shim, not the system under test): "
                    "no accelerator, so torch.accelerator.current_device_index() returns 0")
    if enable_amx(torch):
        said.append("pdchaos_cpu_shim: AMX tiles enabled for this process (arch_prctl permission)")
    accelerator = getattr(torch, "accelerator", None)
    if os.environ.get(SPAWN_ENV, "") != "1" and not (accelerator is not None and accelerator.is_available()):
        try:
            from vllm.platforms import cpu as cpu_platform
        except ImportError:  # not vLLM's CPU build: nothing to change
            cpu_platform = None
        if cpu_platform is not None and start_by_fork(cpu_platform.CpuPlatform) == "patched":
            # the API server loads its plugins before vLLM's logging is set up, and the processes it
            # forks do not load them again: said when vLLM configures the engine, where it shows
            _PENDING.extend(said + ["pdchaos_cpu_shim: engine core and workers start by fork, as on a GPU "
                                    f"host ({SPAWN_ENV}=1 keeps spawn)"])
            return
    for line in said:
        logger.info(line)


_PENDING: list[str] = []


def start_by_fork(platform: Any) -> str:
    """Wrap ``platform.check_and_update_config`` (vLLM's ``CpuPlatform``) so that, after it set
    ``VLLM_WORKER_MULTIPROC_METHOD=spawn``, the variable is ``fork`` again. Returns ``"patched"``,
    ``"already patched"`` or ``"no check_and_update_config"``. vLLM's own ``_maybe_force_spawn``
    still forces spawn where fork is unsafe (an initialised accelerator, a Ray actor, NUMA binding)."""
    current = getattr(platform, "check_and_update_config", None)
    if not callable(current):
        return "no check_and_update_config"
    if getattr(current, MARK, False):
        return "already patched"
    original = current.__func__ if hasattr(current, "__func__") else current

    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        while _PENDING:
            logger.info(_PENDING.pop(0))
        original(cls, vllm_config)
        if os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") == "spawn" and os.environ.get(SPAWN_ENV, "") != "1":
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    setattr(check_and_update_config, MARK, True)
    check_and_update_config.__wrapped__ = original  # type: ignore[attr-defined]
    platform.check_and_update_config = classmethod(check_and_update_config)
    return "patched"


def enable_amx(torch: Any) -> bool:
    """Ask Linux for AMX tile permission in this process, where the CPU has AMX.

    Measured here: vLLM 0.32.0's CPU attention picks its AMX kernels on an AMX CPU, but nothing
    requests the permission (arch_prctl ARCH_REQ_XCOMP_PERM) unless an earlier large batch went
    through oneDNN, which does. A server whose first step is small (D right after a KV pull)
    dies with SIGILL. PyTorch's own call does the request; nothing else changes."""
    cpu = getattr(getattr(torch, "_C", None), "_cpu", None)
    supported = getattr(getattr(torch, "cpu", None), "_is_amx_tile_supported", None)
    init = getattr(cpu, "_init_amx", None)
    if not callable(supported) or not callable(init):
        return False
    try:
        return bool(supported()) and bool(init())
    except Exception:  # noqa: BLE001 - an old kernel refuses: vLLM then runs as it would without
        return False
