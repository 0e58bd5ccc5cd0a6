"""Endpoint rules for every command: ipc:// paths and tcp:// on loopback only (faults/nodeio.py).

A bad endpoint raises ``faults.nodeio.NodeUsageError`` (the base of ``harness.errors.UsageError``):
one ``error:`` line, exit 2.
"""

from faults.nodeio import check_endpoint

__all__ = ["check_endpoint"]
