"""The layerwise family's ``topology:`` and ``workload:`` blocks."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from faults.base import Duration
from harness.family import Spec, WorkloadSpec


DECODE_ROLES = ("decode", "decode2")  # the D roles of ``decodes: 1`` and ``decodes: 2``, in order


def decode_roles(decodes: int) -> list[str]:
    """The D roles of a topology with ``decodes`` Ds (none for a count the spec does not allow)."""
    return list(DECODE_ROLES[:decodes]) if 1 <= decodes <= len(DECODE_ROLES) else []


class LayerwiseTopologySpec(Spec):
    link: Literal["direct", "toxiproxy"] = Field(
        "direct", description="how P reaches D's listener (metadata query, DONE/FAILED): directly or through a "
                              "Toxiproxy proxy the toxic faults act on")
    recv_timeout: Duration = Field(2.0, description="hardened: how long D waits for a request's DONE/FAILED "
                                                    "(layerwise_recv_timeout_s)")
    meta_timeout: Duration = Field(1.0, description="hardened: P's bound on one metadata query "
                                                    "(layerwise_meta_timeout_s)")
    signal_timeout: Duration = Field(1.0, description="hardened: P's bound on one DONE/FAILED signal "
                                                      "(layerwise_signal_timeout_s)")
    write_grace: Duration = Field(3.0, description="hardened: how long after a request's write-by time D still "
                                                   "holds the blocks of a request it failed itself, unless P's last "
                                                   "word came first (layerwise_write_grace_s)")
    post_timeout: Duration = Field(1.0, description="hardened: D's bound on one metaserver POST "
                                                    "(metaserver_timeout_s)")
    decodes: int = Field(1, ge=1, le=2, description="D nodes (roles decode, decode2), each with its own listener and "
                                                    "KV memory, served by the one P: with prefill_batch > 1 one "
                                                    "forward pass (one send task) holds several D sessions")
    prefill_batch: int = Field(1, ge=1, le=16, description="P: requests per forward pass at most (those that "
                                                            "arrive within 50 ms of the first run together)")
    policy: Literal["fail", "recompute"] = Field(
        "fail", description="kv_load_failure_policy of D's vLLM scheduler: fail (vLLM's default: a request whose "
                            "blocks failed to load finishes with an error) or recompute (D computes it itself)")
    metaserver: Literal["pdchaos", "upstream-example"] = Field(
        "pdchaos", description="how the proxy's metaserver answers D's POST: pdchaos (200 once P queued the "
                               "request, 502 when the forward failed) or upstream-example (vllm-ascend's example "
                               "proxy: waits for P's completion, re-sends a failed forward, always 200)")

    @model_validator(mode="after")
    def _one_link(self) -> "LayerwiseTopologySpec":
        if self.decodes > 1 and self.link != "direct":
            raise ValueError("decodes: 2 needs link: direct (the Toxiproxy link stands before the first D only)")
        return self


class LayerwiseWorkloadSpec(WorkloadSpec):
    concurrency: int = Field(2, ge=1, le=8, description="workers, each with one request in flight")
    rate: float = Field(2.0, gt=0, le=50, description="requests/s over all workers")
    tokens: int = Field(64, ge=16, le=256, description="prompt tokens per request (16 per block)")
    start: Duration = Field(0.0, description="when the first request is issued (after a fault that must be in "
                                             "place first)")
    wait: Duration = Field(4.5, description="how long an op watches its request before recording it stalled "
                                            "(still in WAITING_FOR_REMOTE_KVS)")

    def op_bound(self) -> float:
        return float(self.wait)

    def recovery_gap(self, within: int) -> float:
        return within * self.concurrency / self.rate
