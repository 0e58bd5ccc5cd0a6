"""The ``lookup`` family: the AscendStore lookup RPC (scheduler -> worker rank 0 over ZMQ REQ/REP).

Targets: ``hardened`` (connector_patch.lookup) and ``legacy`` (connector_patch.lookup.legacy, a model of
vllm-ascend ``182b75ea``). Nodes: the lookup server (hardened or legacy), a fake peer that a fault
swaps in, the ZMQ interposer, and the workload (the scheduler side). Its checks are in
``checks.py``, its faults in ``fault_*.py``.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # FAMILY is built on first use: node processes import this package for their own module
    # (fake_peer, server_node, workload) and must not pay for pydantic and the fault registry
    if name == "FAMILY":
        from .family import FAMILY

        return FAMILY
    raise AttributeError(name)
