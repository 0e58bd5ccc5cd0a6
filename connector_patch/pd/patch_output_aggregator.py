"""Runtime patch of ``vllm.distributed.kv_transfer.kv_connector.utils.KVOutputAggregator.aggregate``
(vLLM 0.32.0): with more than one worker (TP > 1), a failed KV load reaches the scheduler once
every worker has reported the request failed or finished, not only once every worker has reported
it *finished*.

Why: a model with several KV cache groups (HMA) cannot report a failed load by block ids (the
scheduler refuses them), so the connector names the request in ``failed_recving``; upstream's
aggregator forwards that only together with the request's ``finished_recving`` from every worker.
The hardened worker reports ``finished_recving`` (which frees the blocks) only once P can no longer
write into them: for a frozen P, after upstream's own bound (abort timeout + 60 s, 540 s by
default). So under TP > 1 the client's error waited that long, where with one worker it comes at
the load's deadline (issue 30, item 6). With this patch the scheduler fails the request at the
deadline and keeps its blocks until every worker's ``finished_recving``, as it does with one worker.

Active only in an engine of the hardened P/D target (installed by its scheduler-side connector, in
the engine core process where the executor aggregates), switched off with
``aggregate_failed_early: false``; refused (upstream's code kept) when the function differs from
the one below. The upstream diff it stands for: ``connector_patch/upstream/vllm/0.32.0/03-kv-output-aggregator-failed-early.diff``.
"""

from __future__ import annotations

import importlib
import threading

from connector_patch.quiet import source_sha256  # the same fingerprint the quiet-wait patches check

TARGET = ("vllm.distributed.kv_transfer.kv_connector.utils", "KVOutputAggregator", "aggregate")
UPSTREAM_SHA256 = {"0.32.0": "44ec1f79343018edd1e239301f9f6994cdc36cdf84e4d81a6d14f664c86b0bd6"}
_STATE = "_pdchaos_reported"  # per aggregator: request -> workers that reported it failed or finished
_lock = threading.Lock()
_installed: dict[str, object] = {}


class EarlyFailures:
    """Which workers have reported a request failed or finished (pure: no vLLM)."""

    def __init__(self) -> None:
        self.reported: dict[str, set[int]] = {}

    def seen(self, worker: int, failed, finished) -> None:
        for r in (*(failed or ()), *(finished or ())):
            self.reported.setdefault(r, set()).add(worker)

    def due(self, pending, expected: int) -> set[str]:
        """The pending failures every worker has now reported (each failed it, or finished it)."""
        return {r for r in pending if len(self.reported.get(r, ())) >= expected}

    def forget(self, finished) -> None:
        """Requests every worker finished: upstream's own bookkeeping ends them too (a request some
        worker never reports stays, as it does in upstream's own counts)."""
        for r in (finished or ()):
            self.reported.pop(r, None)


def build(original):
    def aggregate(self, outputs, output_rank: int = 0):
        early = self.__dict__.get(_STATE)
        if early is None:
            early = self.__dict__[_STATE] = EarlyFailures()
        if outputs[output_rank]:  # upstream's body returns None without reading the others
            for worker, out in enumerate(outputs):
                kvo = getattr(out, "kv_connector_output", None)
                if kvo:
                    early.seen(worker, kvo.failed_recving, kvo.finished_recving)
        result = original(self, outputs, output_rank)
        if result is None or result.kv_connector_output is None:
            return result
        kvo = result.kv_connector_output
        due = early.due(self._failed_recving_pending, self._expected_finished_count)
        if due:
            self._failed_recving_pending -= due
            kvo.failed_recving = set(kvo.failed_recving or ()) | due
        early.forget(kvo.finished_recving)
        return result

    aggregate.__doc__ = original.__doc__
    aggregate.__pdchaos_patch__ = __name__
    return aggregate


def install(version: str) -> str:
    """Apply the patch in this process (idempotent), ``version`` being the running vLLM's. Returns
    what was done, for the node's log."""
    with _lock:
        if _installed:
            return "failed loads reported early under TP > 1 (already installed)"
        version = version.split("+")[0]
        want = UPSTREAM_SHA256.get(version)
        if want is None:
            return f"aggregator patch not installed: vLLM {version} is not one it supports"
        module, cls, name = TARGET
        try:
            owner = getattr(importlib.import_module(module), cls)
        except (ImportError, AttributeError) as e:
            return f"aggregator patch not installed: {type(e).__name__}"
        original = owner.__dict__[name]
        original = getattr(original, "__pdchaos_original__", original)
        if source_sha256(original) != want:
            return f"aggregator patch not installed: {'.'.join(TARGET)} differs from vLLM {version}'s as released"
        new = build(original)
        new.__pdchaos_original__ = original
        setattr(owner, name, new)
        _installed[".".join(TARGET)] = original
        return "failed loads reported early under TP > 1 (KVOutputAggregator.aggregate patched)"
