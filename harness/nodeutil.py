"""Small helpers every node process uses: signal-driven shutdown, readiness and logging
(one implementation, in faults/nodeio.py; faults cannot import harness)."""

from __future__ import annotations

import threading

from faults.nodeio import setup_logging

__all__ = ["announce_ready", "setup_logging", "stop_event"]


def stop_event() -> threading.Event:
    """An Event set by SIGTERM or SIGINT, or when the runner that started us dies."""
    from faults.nodeio import stop_on_signals

    return stop_on_signals()


def announce_ready() -> None:
    print("READY", flush=True)
