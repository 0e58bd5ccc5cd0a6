"""The ``layerwise`` family: vllm-ascend's layerwise (decoder-first) P/D connector, real code on CPU.

Targets: ``upstream`` (vllm-ascend 0.23.0.post1's ``MooncakeLayerwiseConnector`` as released) and
``hardened`` (the same classes with ``connector_patch.layerwise.ascend_connector``'s plugin). Nodes: D
(``layerwise-decode``: the connector's scheduler and worker sides, D's listener on a ROUTER),
P (``layerwise-prefill``: the worker side, P's per-layer sending thread over a fake transfer
engine the nemesis controls), the metaserver (``layerwise-metaserver``: the proxy's endpoint D
POSTs to, which forwards the request to P), and the workload (requests through D). D and P run in
the conformance node env (stacks/ascend_cpu/recipe.py).
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # FAMILY is built on first use: node processes import this package and must not pay for
    # pydantic and the fault registry (the conformance env has neither)
    if name == "FAMILY":
        from .family import FAMILY

        return FAMILY
    raise AttributeError(name)
