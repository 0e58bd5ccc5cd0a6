"""A stand-in control channel for a vLLM server the harness did not start (attach mode).

A ``vllm`` node the harness starts answers ``stats`` on its control channel (families/pd/vllm_node.py):
vLLM's ``/metrics`` flattened, and its processes' threads, fds and CPU from /proc. A pod of the
user's deployment has no such channel, and attach mode puts nothing into the user's pods. This
stand-in answers the same ``stats`` on a control socket of the harness's own, from what the
user's server and its runtime serve:

* ``counters``: the server's ``/metrics`` (through the runtime's reach: a port-forward), flattened
  as the vllm node flattens it (:func:`families.pd.metrics.scrape`); ``alive`` is its ``/health``;
* ``threads``, ``fds``, ``processes``, ``cpu_s``: the node handle's :meth:`proc_counts` (a pod:
  /proc through exec), read at most every ``COUNT_EVERY_S`` (exec is not free, and the harness
  samples every 0.5 s) and always for a probe that asks ``fresh``. Where the runtime cannot count,
  they are -1 and the checks that need them cannot judge (they fail, never pass).

Commands of a started node that change it (``rank_signal``) are answered with an error naming
attach mode: a fault that needs them is not one attach mode carries.
"""

from __future__ import annotations

import http.client
import threading
import time
from typing import Any, Callable

from nodekit.control import ControlServer

from .metrics import MetricsError, http_get, scrape

COUNT_EVERY_S = 2.0
SCRAPE_TIMEOUT_S = 2.0


class AttachedControl:
    """``stats`` for the existing vLLM server of ``role`` at ``base_url`` (as the harness reaches it)."""

    def __init__(self, endpoint: str, role: str, base_url: Callable[[], str], handle: Callable[[], Any]) -> None:
        self.role, self._base_url, self._handle = role, base_url, handle
        self._counts: dict | None = None
        self._counted_at = 0.0
        self._lock = threading.Lock()
        self.server = ControlServer(endpoint, {"rank_signal": self._refused, "metrics": self._metrics},
                                    stats=self.stats)

    def start(self) -> "AttachedControl":
        self.server.start()
        return self

    def close(self) -> None:
        self.server.close()

    def _refused(self, msg: dict) -> dict:  # noqa: ARG002
        raise ValueError(f"{self.role} is a server of the user's deployment (attach mode): the harness "
                         "signals no process of it")

    def _metrics(self, msg: dict) -> dict:  # noqa: ARG002
        return {"counters": scrape(self._base_url(), timeout=SCRAPE_TIMEOUT_S)}

    def _alive(self) -> bool:
        try:
            status, _ = http_get(self._base_url().rstrip("/") + "/health", SCRAPE_TIMEOUT_S)
        except (OSError, http.client.HTTPException):
            return False
        return status == 200

    def counts(self, fresh: bool = False) -> dict:
        with self._lock:
            if fresh or self._counts is None or time.monotonic() - self._counted_at >= COUNT_EVERY_S:
                h = self._handle()
                got = h.proc_counts() if h is not None else None
                self._counts = got or {"threads": -1, "fds": -1, "processes": -1, "cpu_s": -1.0}
                self._counted_at = time.monotonic()
            return dict(self._counts)

    def stats(self) -> dict:
        alive = self._alive()
        scraped: dict = {}
        if alive:
            try:
                scraped = scrape(self._base_url(), timeout=SCRAPE_TIMEOUT_S)
            except MetricsError:
                pass
        c = self.counts()
        counters = {**scraped, "metrics_ok": int(bool(scraped)), "cpu_s": c["cpu_s"], "threads": c["threads"],
                    "fds": c["fds"], "processes": c["processes"]}
        return {"alive": alive, "role": self.role, "attached": 1, "cpu_s": c["cpu_s"], "threads": c["threads"],
                "fds": c["fds"], "processes": c["processes"], "counters": counters}
