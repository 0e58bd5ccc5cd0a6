"""Small helpers every node process uses: signal-driven shutdown and readiness."""

from __future__ import annotations

import logging
import sys
import threading


def stop_event() -> threading.Event:
    """An Event set by SIGTERM or SIGINT, or when the runner that started us dies."""
    from faults.nodeio import stop_on_signals

    return stop_on_signals()


def announce_ready() -> None:
    print("READY", flush=True)


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
