"""Failure counters and rate-limited warnings for the lookup RPC.

Counters are plain ints behind a lock, readable as a dict; when ``prometheus_client`` is
importable each increment is mirrored to a process-wide Counter labelled by side and category.
Warnings are rate-limited per category: at most one line per category per interval, and the
next line says how many were suppressed in between.

Log policy (DESIGN.md, "Counters and log policy"): a line carries the category, the error code,
the phase, the elapsed milliseconds and counts (tokens, hashes, groups). Callers pass only those;
this module formats nothing else.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterable

CLIENT_CATEGORIES = ("ok", "timeout", "transport", "protocol", "server_error", "backend_error", "bad_call",
                     "socket_rebuilds", "reset_ok", "reset_failed")
SERVER_CATEGORIES = ("requests", "ok", "timeout", "transport", "protocol", "server_error", "backend_error",
                     "socket_rebuilds", "resets")

_prom_lock = threading.Lock()
_prom_counters: dict[str, object] = {}


def _prom_counter(side: str):
    """One process-wide prometheus Counter per side, created on first use; None if unavailable."""
    with _prom_lock:
        if side in _prom_counters:
            return _prom_counters[side]
        counter = None
        try:
            from prometheus_client import Counter  # optional dependency

            counter = Counter(
                f"vllm_ascend_lookup_rpc_{side}_events",
                f"AscendStore lookup RPC {side} events by category",
                ["category"],
            )
        except Exception:  # not installed, or registered under another name: counters stay local
            counter = None
        _prom_counters[side] = counter
        return counter


class Counters:
    """Thread-safe per-category counters; ``snapshot()`` returns a plain dict."""

    def __init__(self, side: str, categories: Iterable[str]):
        self._side = side
        self._lock = threading.Lock()
        self._values = {c: 0 for c in categories}
        self._prom = _prom_counter(side)

    def inc(self, category: str, n: int = 1) -> None:
        with self._lock:
            self._values[category] = self._values.get(category, 0) + n
        if self._prom is not None:
            self._prom.labels(category=category).inc(n)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)


class RateLimitedWarner:
    """At most one warning per category per ``interval_s``; counts what it held back."""

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic):
        self._logger = logger
        self._interval = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warn(self, category: str, code: str, phase: str, elapsed_ms: float, **counts: int) -> bool:
        """Log one line unless this category logged within the interval. Returns True if logged."""
        now = self._clock()
        with self._lock:
            last = self._last.get(category)
            if last is not None and now - last < self._interval:
                self._suppressed[category] = self._suppressed.get(category, 0) + 1
                return False
            self._last[category] = now
            suppressed = self._suppressed.pop(category, 0)
        extra = " ".join(f"{k}={int(v)}" for k, v in counts.items())
        self._logger.warning(
            "lookup rpc %s: code=%s phase=%s elapsed_ms=%.1f %s suppressed=%d",
            category, code, phase, elapsed_ms, extra, suppressed,
        )
        return True
