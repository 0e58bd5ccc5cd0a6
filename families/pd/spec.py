"""The pd family's ``topology:`` and ``workload:`` blocks."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from faults.base import Duration
from harness.family import Spec, WorkloadSpec


class PDTopologySpec(Spec):
    model: Literal["tiny-llama-v1"] = Field("tiny-llama-v1", description="the locally built model")
    kv_load_failure_policy: Literal["fail", "recompute"] = Field(
        "fail", description="vLLM's kv_load_failure_policy on D: fail (HTTP error) or recompute (D prefills)")
    abort_timeout: Duration = Field(10.0, description="VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT on both nodes; "
                                                     "upstream D waits this + 60 s for a dead P. vLLM's default "
                                                     "is 480 s; scenarios use 10 s to stay short")
    kv_load_timeout: Duration = Field(2.0, description="the hardened target's kv_load_timeout_ms on D: a KV "
                                                      "load fails after this whatever P does (connector default "
                                                      "30 s; scenarios use 2 s)")
    mixed: Literal["none", "upstream_prefill", "upstream_decode"] = Field(
        "none", description="with the hardened target, this role runs vLLM's own MooncakeConnector instead (a "
                            "rolling upgrade half done: the wire format is shared)")
    link: Literal["direct", "toxiproxy", "netns"] = Field(
        "direct", description="toxiproxy: the proxy and D reach P's bootstrap server through a Toxiproxy proxy "
                              "(the toxic faults act on it)")
    engine_id: Literal["random", "fixed"] = Field(
        "random", description="P's Mooncake engine id: random per start (vLLM's default), or fixed, so a "
                              "restarted P comes back under the same engine id")
    proxy_order: Literal["parallel", "sequential"] = Field(
        "parallel", description="parallel: P and D asked at once (upstream's example proxy); sequential: D "
                                "only after P answered (lets a phase hook hold a request in between)")
    proxy_timeout: Duration = Field(60.0, description="the proxy answers every request within this, "
                                                     "with an HTTP error if P, D or the bootstrap did not")
    startup_timeout: Duration = Field(300.0, description="a vLLM server must answer /health within this")
    max_num_seqs: int = Field(8, ge=1, le=64)
    tensor_parallel_size: int = Field(1, ge=1, le=2, description="vLLM's --tensor-parallel-size on both nodes (CPU: "
                                      "one rank per core, VLLM_CPU_OMP_THREADS_BIND 0|1)")
    kv_pool: bool = Field(False, description="the scenario acts on a KV pool's store master (role store): it needs "
                          "a launch profile with one (--profile cpu-store), and is not run under another")
    drain_timeout: Duration = Field(12.0, description="after the run, how long the nodes may take to have "
                                                     "nothing running or waiting before the final probe")

    @model_validator(mode="after")
    def _sane(self) -> "PDTopologySpec":
        if self.abort_timeout < 1.0:
            raise ValueError("abort_timeout must be at least 1s")
        if self.kv_load_timeout < 0.1:
            raise ValueError("kv_load_timeout must be at least 100ms")
        return self


class PauseSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    at: Duration = Field(description="when the pause starts, from the workload's start")
    for_: Duration = Field(alias="for", description="how long no request starts")

    @model_validator(mode="after")
    def _positive(self) -> "PauseSpec":
        if self.at < 0 or self.for_ <= 0:
            raise ValueError("a pause needs at >= 0 and for > 0")
        return self


class ResetSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    at: Duration = Field(description="when the client resets, from the workload's start")
    node: Literal["prefill", "decode"] = Field("decode", description="whose prefix cache is reset, the external "
                                                                     "KV pool included")

    @model_validator(mode="after")
    def _positive(self) -> "ResetSpec":
        if self.at < 0:
            raise ValueError("a reset needs at >= 0")
        return self


class PDWorkloadSpec(WorkloadSpec):
    duration: Duration = Field(10.0, description="how long the workload issues requests")
    concurrency: int = Field(2, ge=1, le=16, description="client workers")
    rate: float = Field(2.0, gt=0, le=100, description="requests/s over all workers")
    prompt_tokens: int = Field(200, ge=8, le=400, description="approximate prompt length in tokens (unique "
                                                            "prompts, so D really pulls)")
    output_tokens: int = Field(16, ge=1, le=64, description="max_tokens, greedy (temperature 0)")
    shared_prefix_tokens: int = Field(0, ge=0, le=384, description="a shared-prefix mix: every prompt starts "
                                      "with one of `prefix_groups` prefixes of about this many tokens (whole "
                                      "words), then words of its own (each prompt is still unique); 0: none")
    prefix_groups: int = Field(1, ge=1, le=8, description="how many shared prefixes (prompts take them in "
                                                         "turn); with shared_prefix_tokens only")
    request_timeout: Duration = Field(30.0, description="the client gives up after this: the op is recorded "
                                                      "as stalled, with how long it hung")
    pauses: list[PauseSpec] = Field(default_factory=list, description="times (from the workload's start, as a "
                                    "fault's at) when no request starts: quiet phases inside fault windows, so "
                                    "no_busy_wait can judge a node that only waits on a peer")
    lead_prompts: list[int] = Field(default_factory=list, max_length=8, description="prompt indices (seeded) "
                                    "sent first, in this order, before the others: a prompt a scenario's claim "
                                    "rests on is sent whatever pace the machine allows (its trigger: "
                                    "prompt_answered)")
    resets: list[ResetSpec] = Field(default_factory=list, description="times when the client resets a server's "
                                    "prefix cache with the external KV pool (`POST /reset_prefix_cache?reset_"
                                    "external=true`, as after a weight update; needs a profile whose servers run "
                                    "in dev mode, VLLM_SERVER_DEV_MODE=1): ops `reset` in the history")

    @model_validator(mode="after")
    def _pauses_inside(self) -> "PDWorkloadSpec":
        for i, p in enumerate(self.pauses):
            if p.at + p.for_ > self.duration:
                raise ValueError(f"pauses[{i}] ends at {p.at + p.for_:g}s, after the workload's duration "
                                 f"({self.duration:g}s)")
        planned = int(self.duration * self.rate)
        for i, x in enumerate(self.lead_prompts):
            if not 0 <= x < planned:
                raise ValueError(f"lead_prompts[{i}] = {x}: not a prompt of this run (0 .. {planned - 1}: "
                                 f"duration x rate)")
        if self.shared_prefix_tokens and self.shared_prefix_tokens > self.prompt_tokens - 8:
            raise ValueError(f"shared_prefix_tokens {self.shared_prefix_tokens}: at most prompt_tokens - 8 "
                             f"({self.prompt_tokens - 8}), so that each prompt keeps words of its own")
        if self.prefix_groups > 1 and not self.shared_prefix_tokens:
            raise ValueError("prefix_groups: needs shared_prefix_tokens")
        if len(set(self.lead_prompts)) != len(self.lead_prompts):
            raise ValueError("lead_prompts: an index is named twice")
        for i, r in enumerate(self.resets):
            if r.at >= self.duration:
                raise ValueError(f"resets[{i}] at {r.at:g}s: not before the workload's end ({self.duration:g}s)")
        return self

    def recovery_gap(self, within: int) -> float:
        return within * self.concurrency / self.rate

    def planned_ops(self) -> float:
        """rate x the time requests may start: no request is due inside a pause (nodekit.workload.paced
        skips the ticks it covers), so a pause's seconds plan none (pd-bad-transfer-params planned 18
        for its 10 ticks, and its upstream run through a cluster's port-forward, 4 ops, fell under a
        quarter of the 18)."""
        paused, reach = 0.0, 0.0
        for a, b in sorted((p.at, p.at + p.for_) for p in self.pauses):  # overlapping pauses count once
            paused += max(0.0, b - max(a, reach))
            reach = max(reach, b)
        return float(self.rate) * max(0.0, self.duration - paused)

    def op_bound(self) -> float:
        return self.request_timeout
