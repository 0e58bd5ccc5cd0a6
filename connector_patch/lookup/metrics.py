"""Failure counters and rate-limited warnings for the lookup RPC.

Counters are plain ints behind a lock, readable as a dict; when ``prometheus_client`` is
importable, one collector exports the process-wide totals per side and category at scrape time.
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
import weakref
from typing import Callable, Iterable

CLIENT_CATEGORIES = ("ok", "timeout", "transport", "protocol", "server_error", "backend_error", "bad_call",
                     "socket_rebuilds", "reset_ok", "reset_failed")
SERVER_CATEGORIES = ("requests", "replies", "replies_watchdog", "send_failed", "ok", "timeout", "transport", "protocol",
                     "server_error", "backend_error", "socket_rebuilds", "resets")

_HELP = {"client": "AscendStore lookup RPC client events by category",
         "server": "AscendStore lookup RPC server events by category"}
_live: dict[str, "weakref.WeakSet[Counters]"] = {"client": weakref.WeakSet(), "server": weakref.WeakSet()}
_retired: dict[str, dict[str, int]] = {"client": {}, "server": {}}
_registry_lock = threading.Lock()
_registered = False


def _retire(side: str, values: dict[str, int], lock: threading.Lock) -> None:
    """A Counters object went away: keep its totals, so exported counters never go down."""
    with lock:
        snapshot = dict(values)
    with _registry_lock:
        for k, v in snapshot.items():
            _retired[side][k] = _retired[side].get(k, 0) + v


def totals(side: str) -> dict[str, int]:
    """Process-wide totals of one side: live instances plus retired ones."""
    with _registry_lock:
        out = dict(_retired[side])
        live = list(_live[side])
    for c in live:
        for k, v in c.snapshot().items():
            out[k] = out.get(k, 0) + v
    return out


def _register_prometheus() -> None:
    """Export through prometheus_client when it is installed: a custom collector reads the plain
    counters at scrape time, so the request path never touches prometheus (a labelled Counter
    costs microseconds per increment)."""
    global _registered
    with _registry_lock:
        if _registered:
            return
        _registered = True
    try:
        from prometheus_client.core import REGISTRY, CounterMetricFamily
    except Exception:  # optional dependency
        return

    class _Collector:
        def collect(self):
            for side in ("client", "server"):
                fam = CounterMetricFamily(f"vllm_ascend_lookup_rpc_{side}_events", _HELP[side], labels=["category"])
                for category, value in sorted(totals(side).items()):
                    fam.add_metric([category], value)
                yield fam

        def describe(self):
            return []

    try:
        REGISTRY.register(_Collector())
    except Exception:  # already registered under these names by someone else: stay local
        pass


class Counters:
    """Thread-safe per-category counters; ``snapshot()`` returns a plain dict."""

    def __init__(self, side: str, categories: Iterable[str]):
        self._side = side
        self._lock = threading.Lock()
        self._values = {c: 0 for c in categories}
        _register_prometheus()
        with _registry_lock:
            _live[side].add(self)
        weakref.finalize(self, _retire, side, self._values, self._lock)

    def inc(self, category: str, n: int = 1) -> None:
        with self._lock:
            self._values[category] = self._values.get(category, 0) + n

    def inc_unlocked(self, category: str) -> None:
        """For a category only one thread ever increments (the caller's own lock or thread
        guarantees it): skips the lock on the request path. A concurrent snapshot may see the
        value from just before."""
        self._values[category] += 1

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
