"""Only for a host with no GPU (vLLM's CPU build). Not part of the bug.

vLLM 0.32.0's MooncakeConnectorWorker.__init__ calls torch.accelerator.current_device_index(),
which raises when the host has no accelerator, so the Mooncake connector cannot start on a CPU-only
host at all. run.sh puts this folder on PYTHONPATH of the vLLM servers only: Python imports this
file in every vLLM process, and it makes that one call return 0 when no accelerator exists (and,
on a CPU with AMX tiles, asks Linux for the AMX permission, without which vLLM's CPU attention can
die with SIGILL on a small first step). On a GPU host it changes nothing; drop it there.
"""

try:
    import torch

    _acc = getattr(torch, "accelerator", None)
    if _acc is not None and not _acc.is_available():
        _real = _acc.current_device_index

        def _current_device_index():
            return _real() if _acc.is_available() else 0

        _acc.current_device_index = _current_device_index
    try:
        if torch.cpu._is_amx_tile_supported():
            torch._C._cpu._init_amx()
    except Exception:
        pass
except ImportError:
    pass
