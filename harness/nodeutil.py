"""Small helpers every node process uses: signal-driven shutdown and readiness."""

from __future__ import annotations

import logging
import signal
import sys
import threading


def stop_event() -> threading.Event:
    """An Event set by SIGTERM or SIGINT (installed in the main thread)."""
    ev = threading.Event()

    def handler(signum, frame):  # noqa: ARG001
        ev.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return ev


def announce_ready() -> None:
    print("READY", flush=True)


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
