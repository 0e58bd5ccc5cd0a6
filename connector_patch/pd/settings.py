"""The hardened connector's settings and input checks: pure, so they are tested without vLLM.

- :class:`Settings` reads ``kv_connector_extra_config`` once, at start-up, and refuses a bad value
  with one error that names the key (a node must not start with a deadline it cannot keep).
- :func:`remote_prefill_problem` tells whether D can use a request's ``kv_transfer_params`` for a
  remote prefill; upstream logs "Got invalid KVTransferParams" and leaves such a request in
  WAITING_FOR_REMOTE_KVS forever (measured: pd-bad-transfer-params).
- ``quiet_wait_max_ms``: the longest wait between two engine steps that ran nothing
  (:mod:`connector_patch.quiet`; 0 switches quiet waiting off). Upstream's engine steps every 1 ms
  while a request waits for KV or P keeps blocks for D (0.9-2.3 cores measured with nothing running).
- ``eos_hold_ms``: how long P keeps the KV of a prompt answered EOS for D's pull (P's own
  answer; the proxy still sends the request to D). Past it P frees the blocks and a late pull is
  answered at once (the terminal record "expired").
- ``aggregate_failed_early`` (D, TP > 1): a failed load reaches the scheduler once every worker
  reported it failed or finished (:mod:`connector_patch.pd.patch_output_aggregator`); upstream's
  aggregator waits for every worker's *finished*, which the hardened worker reports only once P
  can no longer write. ``false``: upstream's aggregator.
- :class:`FailureLog`: failure counts by code, logged at most once per interval (counts and codes
  only: never request ids, block lists, prompts or addresses).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Mapping

from .ledger import DEFAULT_KV_LOAD_TIMEOUT_MS, validate_kv_load_timeout_ms

DEFAULT_QUIET_WAIT_MAX_MS = 1000  # connector_patch.quiet: empty steps wait 1, 8, 64, ... up to this (a deadline wakes it: quiet.wake_at)
DEFAULT_HEARTBEAT_MS = 500
# P: how long it keeps the KV of a prompt whose one token was EOS for a D that may still pull it
# (issue 30, item 9). Upstream frees such blocks at once (and D's pull then waits the abort timeout);
# the hardened P keeps them, but not for the abort timeout (480 s) that a LENGTH_CAPPED prompt
# gets: twice D's default load deadline, past which no D that gave up still pulls.
DEFAULT_EOS_HOLD_MS = 60000
MAX_QUIET_WAIT_MAX_MS = 1000


def _positive_ms(extra: Mapping[str, Any], key: str, default: int, upper: int | None = None,
                 zero_ok: bool = False) -> int:
    value = extra.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (value == 0 and not zero_ok):
        kind = "a non-negative int (milliseconds; 0: off)" if zero_ok else "a positive int (milliseconds)"
        raise ValueError(f"kv_connector_extra_config.{key} must be {kind}, got {value!r}")
    if upper is not None and value > upper:
        raise ValueError(f"kv_connector_extra_config.{key} must be at most {upper} ms, got {value}")
    return value


def _flag(extra: Mapping[str, Any], key: str, default: bool) -> bool:
    value = extra.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"kv_connector_extra_config.{key} must be true or false, got {value!r}")
    return value


@dataclass(frozen=True)
class Settings:
    kv_load_timeout_ms: int = DEFAULT_KV_LOAD_TIMEOUT_MS
    quiet_wait_max_ms: int = DEFAULT_QUIET_WAIT_MAX_MS
    heartbeat_ms: int = DEFAULT_HEARTBEAT_MS  # ZMQ heartbeat interval; the peer is gone after 3 missed
    eos_hold_ms: int = DEFAULT_EOS_HOLD_MS  # P: the hold of an EOS-answered prompt's KV for D
    # D, TP > 1: a failed load reaches the scheduler once every worker reported it (patch_output_aggregator)
    aggregate_failed_early: bool = True

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None) -> "Settings":
        extra = extra or {}
        if not isinstance(extra, Mapping):
            raise ValueError(f"kv_connector_extra_config must be a mapping, got {type(extra).__name__}")
        timeout = validate_kv_load_timeout_ms(extra.get("kv_load_timeout_ms", DEFAULT_KV_LOAD_TIMEOUT_MS),
                                              "kv_connector_extra_config.kv_load_timeout_ms")
        return cls(kv_load_timeout_ms=timeout,
                   quiet_wait_max_ms=_positive_ms(extra, "quiet_wait_max_ms", DEFAULT_QUIET_WAIT_MAX_MS,
                                                  MAX_QUIET_WAIT_MAX_MS, zero_ok=True),
                   heartbeat_ms=_positive_ms(extra, "heartbeat_ms", DEFAULT_HEARTBEAT_MS, 60000),
                   eos_hold_ms=_positive_ms(extra, "eos_hold_ms", DEFAULT_EOS_HOLD_MS, 3600000),
                   aggregate_failed_early=_flag(extra, "aggregate_failed_early", True))

    @property
    def heartbeat_timeout_ms(self) -> int:
        return 3 * self.heartbeat_ms


REMOTE_PREFILL_KEYS = ("remote_engine_id", "remote_bootstrap_addr", "transfer_id")


def remote_prefill_problem(params: Mapping[str, Any]) -> str | None:
    """None when D can pull this request's prompt KV from P; else a short code saying why not
    (``missing_<key>``, ``bad_<key>``). Only the shape is judged, never the values' content."""
    for key in REMOTE_PREFILL_KEYS:
        if key not in params or params[key] is None:
            return f"missing_{key}"
        value = params[key]
        if not isinstance(value, str) or not value:
            return f"bad_{key}"
    addr = params["remote_bootstrap_addr"]
    if not (addr.startswith("http://") or addr.startswith("https://")):
        return "bad_remote_bootstrap_addr"
    return None


class FailureLog:
    """Failure counts by code since the last summary; :meth:`due` gives a summary at most once per
    ``interval_s`` (the caller logs it), and the totals stay for metrics."""

    def __init__(self, interval_s: float = 10.0):
        self.interval_s = interval_s
        self.totals: dict[str, int] = {}
        self._since: dict[str, int] = {}
        self._last: float | None = None
        self._lock = threading.Lock()

    def note(self, code: str, n: int = 1) -> None:
        if n <= 0:
            return
        with self._lock:
            self.totals[code] = self.totals.get(code, 0) + n
            self._since[code] = self._since.get(code, 0) + n

    def due(self, now: float) -> dict[str, int] | None:
        with self._lock:
            if not self._since or (self._last is not None and now - self._last < self.interval_s):
                return None
            out, self._since, self._last = self._since, {}, now
            return out


def summary(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{code}={n}" for code, n in sorted(counts.items()))
