"""The pd family's own faults: phase hooks of the P/D proxy, set through its control channel.

The window between P's answer and D's pull is milliseconds, so mid-transfer faults are made
repeatable by the proxy (families/pd/proxy.py): it can hold a request after P answered,
abort a request while D waits for KV, abort after P answered, or send D incomplete
kv_transfer_params. Process faults on P and D are the generic ones (``kill``, ``stop``,
``restart``, ``node_down`` with ``node: prefill:0`` / ``decode:0``).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from faults.base import Duration, FaultParams, OnceFault, register


# a window's effect is read from the proxy's counters at its heal: the first read waits as long
# as any control call, the one after the clear longer (nothing else waits on it then)
STATS_TIMEOUT_MS = 2000
STATS_RETRY_TIMEOUT_MS = 8000


class HarnessReadError(RuntimeError):
    """A window's counts could not be read: the runner journals the text with ``fault_effect``."""


def _counters(ctx, timeout_ms: int = STATS_TIMEOUT_MS) -> dict:  # noqa: ANN001 - a FaultContext
    return ctx.control("proxy", "stats", timeout_ms=timeout_ms).get("counters") or {}


def _count(counters: dict, key: str) -> float:
    """A proxy counter by dotted key (``aborted_by.decode_wait``)."""
    v: Any = counters
    for part in key.split("."):
        v = v.get(part, 0) if isinstance(v, dict) else 0
    return float(v or 0)


class _ProxyHook(OnceFault):
    family = "pd"
    # the proxy protocols (--protocol, by the launch profile's connector) whose phases this hook
    # acts on: a scenario/target whose proxy speaks another is left out of the run, not run for
    # nothing (PDFamily.excluded)
    proxy_protocols: tuple[str, ...] = ("bootstrap", "kv-params", "layerwise", "store")
    # the proxy counters (families/pd/proxy.py stats) this hook's window must raise
    counts: tuple[str, ...] = ()

    def __init__(self, params, ctx):  # noqa: ANN001
        super().__init__(params, ctx)
        self._before: dict | None = None
        self._effect: dict | None = None
        self._effect_error: str | None = None

    def start(self) -> None:
        self._before = _counters(self.ctx) if self.counts else None
        super().start()

    def stop(self) -> None:
        measure = self._active and self.counts and self._effect is None
        if measure:
            self._read_effect(STATS_TIMEOUT_MS)  # what the window did, read before the hooks are cleared
        super().stop()
        if measure and self._effect is None:
            # the proxy did not answer in time (CI saw one such read on a loaded 2-core machine, the
            # clear after it answered): read again once the hooks are cleared. The counters only
            # grow while a hook is armed, so after the clear they still hold exactly this window's
            # count; a second failure stays unknown and fault_effect says why
            self._read_effect(STATS_RETRY_TIMEOUT_MS)

    def _read_effect(self, timeout_ms: int) -> None:
        try:
            after = _counters(self.ctx, timeout_ms)
        except Exception as exc:  # noqa: BLE001 - unknown: fault_effect fails, naming this error
            self._effect_error = f"the proxy's counters: {type(exc).__name__}: {exc}"
            return
        self._effect = {k: _count(after, k) - _count(self._before or {}, k) for k in self.counts}
        self._effect_error = None

    def effect(self) -> dict | None:
        if self._effect is None and self._effect_error:
            raise HarnessReadError(self._effect_error)
        return self._effect

    def required_effect(self) -> dict[str, float]:
        return {self.counts[0]: 1} if self.counts else {}

    def heal(self) -> None:
        self.ctx.control("proxy", "clear")


class HoldParams(FaultParams):
    count: int = Field(1, ge=1, le=1000, description="how many requests to hold")
    seconds: Duration = Field(..., description="hold each until released at heal, or this long")


@register
class HoldAfterPrefill(_ProxyHook):
    """The proxy holds the next ``count`` requests after P answered and before D is asked (so a
    fault on P lands while D has yet to pull); released at heal."""

    name = "hold_after_prefill"
    proxy_protocols = ("bootstrap", "kv-params", "store")  # layerwise: P is asked by D's POST, no phase in between
    Params = HoldParams
    counts = ("held", "hold_released", "hold_expired")

    def inject(self) -> None:
        self.ctx.control("proxy", "hold", phase="after_prefill", count=self.params.count,
                         seconds=self.params.seconds)

    def heal(self) -> None:
        self.ctx.control("proxy", "release")
        super().heal()


class AbortParams(FaultParams):
    count: int = Field(1, ge=1, le=1000, description="how many requests")
    after: Duration = Field(0.2, description="decode_wait: cancel D's request this long after it was sent")


@register
class AbortWhileDecodeWaits(_ProxyHook):
    """The client of D (the proxy) disconnects ``after`` into the next ``count`` requests, while D
    waits for the KV of P: D must free its blocks and tell P."""

    name = "abort_while_decode_waits"
    Params = AbortParams
    categories = ("http_502",)
    counts = ("aborted_by.decode_wait", "abort_missed")

    def inject(self) -> None:
        self.ctx.control("proxy", "abort", phase="decode_wait", count=self.params.count,
                         after_ms=int(self.params.after * 1000))


class CountParams(FaultParams):
    count: int = Field(1, ge=1, le=1000, description="how many requests")


@register
class AbortAfterPrefill(_ProxyHook):
    """The proxy drops the next ``count`` requests after P answered, never asking D: P holds the
    blocks it prefilled until its abort timeout."""

    name = "abort_after_prefill"
    proxy_protocols = ("bootstrap", "kv-params", "store")
    Params = CountParams
    categories = ("http_502",)
    counts = ("aborted_by.after_prefill",)

    def inject(self) -> None:
        self.ctx.control("proxy", "abort", phase="after_prefill", count=self.params.count)


@register
class BadTransferParams(_ProxyHook):
    """D gets kv_transfer_params without ``transfer_id`` and ``remote_bootstrap_addr`` for the next
    ``count`` requests (today vLLM then leaves the request waiting forever)."""

    name = "bad_transfer_params"
    proxy_protocols = ("bootstrap",)  # the keys it drops exist in vLLM's Mooncake protocol only
    Params = CountParams
    counts = ("bad_params",)
    may_cause = ("http_500", "http_502", "http_504", "stalled")  # upstream D then waits for ever

    def inject(self) -> None:
        self.ctx.control("proxy", "bad_params", count=self.params.count,
                         drop=["transfer_id", "remote_bootstrap_addr"])


class RankParams(FaultParams):
    node: str = Field(..., pattern=r"^(prefill|decode):[0-9]+$", description="the vLLM node (prefill:0, decode:0)")
    rank: int = Field(..., ge=0, le=7, description="its tensor-parallel rank whose worker process is frozen")


@register
class StopRank(OnceFault):
    """One tensor-parallel rank of a vLLM node (its worker process, found by the node itself:
    ``rank_signal`` on its control channel) is frozen with SIGSTOP and thawed at heal; the other
    ranks run on, so one rank's KV transfer stalls while the others' complete."""

    name = "stop_rank"
    Params = RankParams

    def inject(self) -> None:
        self._out = self.ctx.control(self.params.node, "rank_signal", rank=self.params.rank, signal="STOP")
        self._stopped = True

    def effect(self) -> dict[str, Any] | None:
        out = getattr(self, "_out", None) or {}
        return {"frozen": float(out.get("stopped", 0)), "pids": float(len(out.get("pids") or ()))}

    def required_effect(self) -> dict[str, float]:
        return {"frozen": 1, "pids": 1}

    def heal(self) -> None:
        if getattr(self, "_stopped", False):
            self.ctx.control(self.params.node, "rank_signal", rank=self.params.rank, signal="CONT")
            self._stopped = False
