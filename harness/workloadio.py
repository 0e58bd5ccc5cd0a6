"""What every family's workload node shares: its arguments, its configuration file, and the start
signal (the runner sends SIGUSR1 at t0; it is blocked before any thread exists, so none takes it,
and the node waits for it with ``signal.sigtimedwait``)."""

from __future__ import annotations

import argparse
import json
import signal

from .errors import UsageError


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="JSON file written by the topology")
    p.add_argument("--journal", required=True, help="journal part to append ops to")
    p.add_argument("--log-level", default="INFO")


def read_config(path: str) -> dict:
    """The workload's configuration; one clear error (exit 2) when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as fh:
            cfg = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"--config: cannot read {path!r}: {exc}") from None
    if not isinstance(cfg, dict):
        raise UsageError(f"--config {path}: expected a JSON object")
    return cfg


def block_start_signal() -> None:
    """Call before starting any thread: the start signal then waits for sigtimedwait."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
