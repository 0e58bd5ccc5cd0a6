"""The vLLM CPU node stack: torch, vLLM's CPU build, Mooncake's TransferEngine, libibverbs and the
CPU shim (``pdchaos_cpu_shim/``) in the node env ``pd-node-<hash>`` (:mod:`.recipe`), and a tiny
random-weight Llama built locally (:mod:`.tiny_model`, no hub). ``python3 -m stacks.vllm_cpu.smoke``
serves it for real and asks for a completion."""

from __future__ import annotations

from typing import Any


def setup_steps() -> list[Any]:
    """Its ``pdchaos setup`` steps, in the order they must run: the env, then the model."""
    from .steps import PdStackStep, TinyModelStep

    return [PdStackStep(), TinyModelStep()]
