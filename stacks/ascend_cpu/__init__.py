"""The conformance node stack: vLLM 0.23.0, vllm-ascend 0.23.0.post1 and torch 2.11.0 on CPU, with
the NPU stubs (``pdchaos_npu_stubs/``, where vllm-ascend's own unit tests stub them) in the node
env ``ascend-conf-<hash>`` (:mod:`.recipe`): vllm-ascend's real connector code runs on a host
without an NPU."""

from __future__ import annotations

from typing import Any


def setup_steps() -> list[Any]:
    """Its ``pdchaos setup`` step."""
    from .steps import AscendStackStep

    return [AscendStackStep()]


def unavailable() -> str | None:
    """Why the conformance env cannot be used here (not installed), or None."""
    from .steps import ascend_unavailable

    return ascend_unavailable()
