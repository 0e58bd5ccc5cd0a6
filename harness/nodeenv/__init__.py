"""Node environments: what real P/D nodes run in, kept apart from the harness's own environment.

* :mod:`.venv` — a generic pinned venv under ``${XDG_CACHE_HOME:-~/.cache}/pdchaos/envs/``,
  installed step by step and stamped when complete (idempotent, resumable).
* :mod:`.pd_stack` — the P/D node stack in such a venv: torch, vLLM's CPU build, Mooncake's
  TransferEngine, libibverbs and the CPU shim (``nodeplugins/pdchaos_cpu_shim``).
* :mod:`.ascend_stack` — the conformance stack in such a venv: vLLM 0.23.0, vllm-ascend 0.23.0.post1,
  torch 2.11.0 and the NPU stubs (``nodeplugins/pdchaos_npu_stubs``); :mod:`.exec_node` runs a node's
  own module in a node env.
* :mod:`.tiny_model` — a tiny random-weight Llama and its tokenizer, built locally (no hub).
* :mod:`.smoke` — ``python3 -m harness.nodeenv.smoke``: a real ``vllm serve`` of the tiny model
  answers a completion, and starts with the Mooncake connector.

:func:`pd_steps` gives the two ``pdchaos setup`` steps (harness/setup.py), ``pd-node-stack`` and
``pd-tiny-model``; they are opt-in (``pdchaos setup --only pd-node-stack --only pd-tiny-model``).
"""

from __future__ import annotations

from typing import Any


def pd_steps() -> list[Any]:
    """The setup steps of the P/D node stack, in the order they must run."""
    from .steps import PdStackStep, TinyModelStep

    return [PdStackStep(), TinyModelStep()]


def ascend_steps() -> list[Any]:
    """The setup step of the conformance env (vllm-ascend's real code on CPU)."""
    from .steps import AscendStackStep

    return [AscendStackStep()]
