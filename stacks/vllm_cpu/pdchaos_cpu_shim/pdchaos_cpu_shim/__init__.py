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

``register()`` is idempotent (a second call changes nothing), leaves a host that has an
accelerator untouched, and logs one line when the shim is active.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["register", "patch_accelerator", "MARK"]

# Set on the replacement function, so a second register() (another vLLM process start, or a
# re-import) recognises its own work and does nothing.
MARK = "_pdchaos_cpu_shim"

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
    if patch_accelerator(getattr(torch, "accelerator", None)) == "patched":
        logger.info("pdchaos_cpu_shim active (environment shim, not the system under test): "
                    "no accelerator, so torch.accelerator.current_device_index() returns 0")
    if enable_amx(torch):
        logger.info("pdchaos_cpu_shim: AMX tiles enabled for this process (arch_prctl permission)")


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
