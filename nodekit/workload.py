"""What every family's workload node shares: its arguments, its configuration file, the start
signal (the runner sends SIGUSR1 at t0; it is blocked before any thread exists, so none takes it,
and the node waits for it with ``signal.sigtimedwait``) and the horizon (when to stop issuing ops:
the end of the duration, or later when the runner extends it, see :class:`Horizon`)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import math
import threading
import time
from typing import Any, Callable, Iterator, Sequence, Union

from .control import process_stats
from .nodeio import NodeUsageError as UsageError, setup_logging


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


class Horizon:
    """When a workload stops issuing ops: ``t_end`` (``time.monotonic()``, the end of its duration),
    or later when the runner says so. The runner writes its word to the file ``horizon_path`` of
    the workload's configuration before the start signal and after the last heal:

    * ``hold``: a fault the ``recovery`` check must see healed may outlast the duration. At the
      duration's end the workers pause (no op, as if the run had ended: a vLLM server that keeps
      blocks for every request it was sent spins its engine and starves a node restarting beside
      it) but do not leave;
    * a float of ``time.monotonic()`` seconds (the machine's clock, the same in every process):
      the end, never before the duration's. After a pause the workers go on from the moment they
      read it, paced as before, so ``recovery`` sees their first ops after the last heal.

    The file is read at most every ``REREAD_S``; a missing or unreadable file leaves the
    duration's end."""

    REREAD_S = 0.2

    def __init__(self, t_end: float, path: str | None = None):
        self._base, self._path, self._read_at = float(t_end), path, 0.0
        self._said = float("nan")  # the runner's end, once read
        self._held = False

    def _read(self) -> None:
        now = time.monotonic()
        if not self._path or now - self._read_at < self.REREAD_S:
            return
        self._read_at = now
        try:
            with open(self._path, encoding="ascii") as fh:
                text = fh.read().strip()
        except OSError:
            text = ""
        self._held = text == "hold"
        try:
            self._said = float("nan") if self._held else float(text or "nan")
        except ValueError:
            self._said = float("nan")

    def end(self) -> float:
        self._read()
        return self._base if not self._said > self._base else self._said  # NaN compares false

    def held(self) -> bool:
        """The runner holds the workers past the end they have now (they pause, not leave)."""
        self._read()
        return self._held

    def wait(self, stop: threading.Event, poll_s: float = 0.1) -> bool:
        """Pause until the runner lets go (True) or ``stop`` is set (False)."""
        while self.held():
            if stop.wait(poll_s):
                return False
        return True


End = Union[float, Horizon]


class Tally:
    """The workload's own count of its primary ops per outcome, written into its final probe as
    ``ops`` and ``ops_<outcome>``: harness_integrity holds the journal to it (an op lost,
    deleted, duplicated or relabelled shows). Thread-safe."""

    def __init__(self, primary: str) -> None:
        self.primary = primary
        self._lock = threading.Lock()
        self._n: dict[str, int] = {}

    def count(self, done: dict) -> None:
        """Count one op's completion record (as written to the journal)."""
        if done.get("f") != self.primary:
            return
        with self._lock:
            key = f"ops_{done.get('outcome')}"
            self._n[key] = self._n.get(key, 0) + 1

    def counters(self) -> dict[str, int]:
        with self._lock:
            return {**self._n, "ops": sum(self._n.values())}


def end_of(t_end: End) -> float:
    return t_end.end() if isinstance(t_end, Horizon) else float(t_end)


def run_workers(journal: Any, name: str, n: int, work: Callable[[int, float], None], *, t_start: float,
                t_end: End, interval: float, grace: float) -> tuple[list[int], list[str]]:
    """Run ``work(i, first_at)`` for workers ``0..n-1`` (worker ``i`` starts ``i * interval / n``
    after ``t_start``, so paced workers interleave), wait for them until the horizon ``t_end``
    (a time, or a :class:`Horizon` the runner may extend) plus ``grace``, and return the indices
    of the workers still stuck in a call and the crashes recorded (a bug in a worker is a
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
        while th.is_alive():
            left = end_of(t_end) + grace - time.monotonic()
            if left <= 0 and not (isinstance(t_end, Horizon) and t_end.held()):
                break
            th.join(min(max(left, 0.05), 0.5))  # the horizon may move on meanwhile
    return [i for i, th in enumerate(threads) if th.is_alive()], crashed


def paced(t_start: float, t_end: End, interval: float, stop: threading.Event,
          pauses: Sequence[tuple[float, float]] = ()) -> Iterator[int]:
    """Yield 0, 1, 2, ... at ``t_start + k * interval`` (sleeping until each is due) until the
    horizon ``t_end`` (a time or a :class:`Horizon`: held there, pause until the runner's word,
    then go on from that moment), or until ``stop`` is set (the runner that started the workload
    died). No op is due inside a pause (``(start, end)`` in ``time.monotonic()`` seconds): the
    ticks it covers are skipped, and pacing goes on at the first tick after it; nor is one yielded
    inside a pause when the caller comes late for a tick due before it (its last call overran)."""
    def pause_end(t: float) -> float | None:
        return next((b for a, b in pauses if a <= t < b), None)

    k = 0
    while True:
        due = t_start + k * interval
        held = pause_end(due)
        if held is not None:
            k = max(k + 1, int(math.ceil((held - t_start) / interval)))
            continue
        now = time.monotonic()
        end = end_of(t_end)
        if due >= end or now >= end:
            if not (isinstance(t_end, Horizon) and t_end.held()):
                return
            if not t_end.wait(stop):
                return
            t_start, k = time.monotonic(), 0  # paced from now: no burst of the ops the pause skipped
            continue
        if due > now:
            time.sleep(due - now)
            now = time.monotonic()
        # a worker behind schedule (its last call overran) reaches a tick due before a pause only
        # once the pause has begun: no op starts inside a pause, whenever it was due
        held = pause_end(now)
        if held is not None:
            k = max(k + 1, int(math.ceil((held - t_start) / interval)))
            continue
        if stop.is_set():
            return
        yield k
        k += 1


STUCK_EXIT = 3  # a worker was still in a call when the grace ended: left behind, its op has no completion
CRASHED_EXIT = 4  # a worker raised: a workload_crash event is in the journal


def start_node(args: argparse.Namespace, check: Callable[[dict], str | None] | None = None) -> dict:
    """The common opening of a workload node: read and check ``--config`` (a bad one is one
    UsageError naming the file), set up logging and block the start signal before any thread
    exists. Returns the configuration."""
    cfg = read_config(args.config)
    why = check(cfg) if check else None
    if why:
        raise UsageError(f"--config {args.config}: {why}")
    setup_logging(args.log_level)
    block_start_signal()  # before any thread: none may take it
    return cfg


def finish(journal: Any, stuck: list[int], crashed: list[str], **final: Any) -> int:
    """The common ending of a workload node: write the client's final probe (``final`` adds its
    counters and kind), close the journal, and end with 0, or ``CRASHED_EXIT`` when a worker
    raised, or leave at once with ``STUCK_EXIT`` when a worker is stuck in a call (nothing can
    join it; the runner records its op as stalled)."""
    journal.write({"type": "probe", "node": "client", "when": "final", "t": time.monotonic(), **process_stats(),
                   **final, "stuck_workers": len(stuck), "alive": True})
    journal.close()
    if stuck:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(STUCK_EXIT)
    return CRASHED_EXIT if crashed else 0
