"""What every family's workload node shares: its arguments, its configuration file, and the start
signal (the runner sends SIGUSR1 at t0; it is blocked before any thread exists, so none takes it,
and the node waits for it with ``signal.sigtimedwait``)."""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from typing import Any, Callable, Iterator

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


def run_workers(journal: Any, name: str, n: int, work: Callable[[int, float], None], *, t_start: float,
                t_end: float, interval: float, grace: float) -> tuple[list[int], list[str]]:
    """Run ``work(i, first_at)`` for workers ``0..n-1`` (worker ``i`` starts ``i * interval / n``
    after ``t_start``, so paced workers interleave), wait for them until ``t_end + grace``, and
    return the indices of the workers still stuck in a call and the crashes recorded (a bug in a worker is a
    ``workload_crash`` event in the journal, never a quiet run)."""
    crashed: list[str] = []

    def on_crash(args: threading.ExceptHookArgs) -> None:
        crashed.append(f"{args.exc_type.__name__} in {args.thread.name if args.thread else '?'}")
        journal.write({"type": "event", "what": "workload_crash", "t": time.monotonic(), "error": crashed[-1]})

    threading.excepthook = on_crash
    threads = [threading.Thread(target=work, name=f"{name}-{i}", daemon=True, args=(i, t_start + i * interval / n))
               for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(max(0.0, t_end + grace - time.monotonic()))
    return [i for i, th in enumerate(threads) if th.is_alive()], crashed


def paced(t_start: float, t_end: float, interval: float, stop: threading.Event) -> Iterator[int]:
    """Yield 0, 1, 2, ... at ``t_start + k * interval`` (sleeping until each is due) until
    ``t_end``, or until ``stop`` is set (the runner that started the workload died)."""
    k = 0
    while True:
        due = t_start + k * interval
        now = time.monotonic()
        if due >= t_end or now >= t_end:
            return
        if due > now:
            time.sleep(due - now)
        if stop.is_set():
            return
        yield k
        k += 1
