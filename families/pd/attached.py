"""A stand-in control channel for a vLLM server the harness did not start (attach mode).

A ``vllm`` node the harness starts answers ``stats`` on its control channel (families/pd/vllm_node.py):
vLLM's ``/metrics`` flattened, and its processes' threads, fds and CPU from /proc. A pod of the
user's deployment has no such channel, and attach mode puts nothing into the user's pods. This
stand-in answers the same ``stats`` on a control socket of the harness's own, from what the
user's server and its runtime serve:

* ``counters``: the server's ``/metrics`` (through the runtime's reach: a port-forward), flattened
  as the vllm node flattens it (:func:`families.pd.metrics.scrape`); ``alive`` is its ``/health``;
* ``threads``, ``fds``, ``processes``, ``cpu_s``, ``started`` (another value: the server's container
  was started again, and its CPU time counts from 0): the node handle's :meth:`proc_counts` (a pod:
  /proc through exec), read at most every ``COUNT_EVERY_S`` (an exec is not free, and the harness
  samples every 0.5 s); the answer's ``t_sampled`` says when they were read, and the probe carries
  that time (a CPU rate over two probes is then over the time between the two readings). Where the
  runtime cannot count, they are -1 and the checks that need them cannot judge (they fail, never
  pass). ``threads`` and ``fds`` are floored as a started node floors them (vllm_node.py
  :func:`floored`): the counts after :meth:`warm_up` plus what the connector's lazy pools add with
  the first transfers (:func:`lazy_allowance`), so a server's first scenario does not read as a leak.

:meth:`warm_up` is the warm-up a started node does before READY (one plain completion of the same
fixed prompt, never a workload's): a fresh server's first forward step starts threads and costs
seconds that would otherwise land in the first scenario.

A server that does not answer ``/health`` gets no answer on this channel either, as a node that is
down: its probe is silent and the sampler skips it. Commands of a started node that change it (``rank_signal``) are answered with an error naming
attach mode: a fault that needs them is not one attach mode carries.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from typing import Any, Callable

from nodekit.control import ControlServer

from .metrics import MetricsError, http_get, scrape
from .vllm_node import WARM_UP_PROMPT, floored, lazy_allowance

COUNT_EVERY_S = 2.0
SCRAPE_TIMEOUT_S = 2.0
FIRST_CALL_TIMEOUT_S = 15.0


class AttachedControl:
    """``stats`` for the existing vLLM server of ``role`` at ``base_url`` (as the harness reaches it)."""

    def __init__(self, endpoint: str, role: str, base_url: Callable[[], str], handle: Callable[[], Any],
                 connector: str = "", extra: dict | None = None) -> None:
        self.role, self._base_url, self._handle = role, base_url, handle
        self.lazy = lazy_allowance(role.split(":")[0], connector, extra)  # (threads, fds)
        self.ready: dict[str, int] = {"threads": -1, "fds": -1}  # set by warm_up()
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
        """The handle's counts and ``t`` (monotonic) when they were read."""
        with self._lock:
            if fresh or self._counts is None or time.monotonic() - self._counted_at >= COUNT_EVERY_S:
                h = self._handle()
                t = time.monotonic()
                got = h.proc_counts() if h is not None else None
                self._counts = got or {"threads": -1, "fds": -1, "processes": -1, "cpu_s": -1.0}
                self._counted_at = t
            return {**self._counts, "t": self._counted_at}

    def warm_up(self, timeout_s: float = 120.0) -> str | None:
        """One plain completion of the started nodes' fixed warm-up prompt (the model the server
        names at /v1/models) and a first scrape, before the node's baseline probe (whose counts the
        floors start from). None when done; else why not."""
        from .workload import post_json

        base = self._base_url().rstrip("/")
        try:  # the first request through a runtime's forward also makes it: a longer bound
            status, body = http_get(base + "/v1/models", FIRST_CALL_TIMEOUT_S)
        except (OSError, http.client.HTTPException) as exc:
            return f"{self.role}: GET /v1/models: {type(exc).__name__}"
        try:
            model = json.loads(body)["data"][0]["id"] if status == 200 else None
        except (ValueError, KeyError, IndexError, TypeError):
            model = None
        if model is None:
            return f"{self.role}: the server names no model at /v1/models (HTTP {status})"
        try:
            status, _ = post_json(base + "/v1/completions", {"model": model, "prompt": WARM_UP_PROMPT, "max_tokens": 2,
                                                             "temperature": 0}, timeout_s)
        except Exception as exc:  # noqa: BLE001 - the reason the node is not taken
            return f"{self.role}: the warm-up completion failed: {type(exc).__name__}"
        if status != 200:
            return f"{self.role}: the warm-up completion answered HTTP {status}"
        try:
            scrape(base, timeout=SCRAPE_TIMEOUT_S)  # the first scrape starts a thread in vLLM's API server
        except MetricsError:
            pass
        return None

    def stats(self) -> dict:
        alive = self._alive()
        if not alive:  # as a node that is down: no answer (the probe is silent, the sampler skips it)
            raise ValueError(f"{self.role}: the server does not answer /health")
        scraped: dict = {}
        if alive:
            try:
                scraped = scrape(self._base_url(), timeout=SCRAPE_TIMEOUT_S)
            except MetricsError:
                pass
        c = self.counts()
        held = {"threads": c["threads"], "fds": c["fds"]}
        if self.ready["threads"] < 0 and min(held.values()) >= 0:  # the first counts (the baseline's, after
            self.ready = dict(held)                                  # the warm-up) are the floors' start
        floor = {k: floored(held[k], self.ready[k], lazy) for k, lazy in zip(("threads", "fds"), self.lazy)}
        counters = {**scraped, "metrics_ok": int(bool(scraped)), "cpu_s": c["cpu_s"], **floor,
                    "started": c.get("started", -1),
                    "group_threads": held["threads"], "group_fds": held["fds"], "processes": c["processes"]}
        return {"alive": alive, "role": self.role, "attached": 1, "cpu_s": c["cpu_s"], **floor,
                "processes": c["processes"], "ready_threads": self.ready["threads"], "ready_fds": self.ready["fds"],
                "lazy_threads": self.lazy[0], "lazy_fds": self.lazy[1], "t_sampled": c["t"], "counters": counters}
