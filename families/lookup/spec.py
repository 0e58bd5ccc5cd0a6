"""The lookup family's ``topology:`` and ``workload:`` blocks."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from faults.base import Duration
from harness.family import Spec, WorkloadSpec


class LookupTopologySpec(Spec):
    transport: Literal["ipc", "tcp"] = "ipc"
    link: Literal["direct", "interposer", "toxiproxy", "netns"] = "direct"
    block_size: int = Field(16, ge=1, le=4096)
    groups: int = Field(1, ge=1, le=16)
    preload_blocks: int = Field(64, ge=1, le=100_000)
    backend_timeout: Duration = Field(4.0, description="the hardened server's backend_timeout_ms")
    stack: Literal["standalone", "vllm-ascend", "vllm-store"] = Field(
        "standalone", description="which channel and code: AscendStore's lookup RPC with connector_patch alone "
                                  "(standalone) or inside real vllm-ascend code (conformance env); or vLLM's "
                                  "MooncakeStoreConnector admin channel, its real client and server (vllm-store: "
                                  "P/D node env); the real stacks are ipc only")
    twin: bool = Field(False, description="vllm-store only: a second engine's server on the same host, started "
                                          "after the first with its own keys (two servers must never cross-talk)")

    @model_validator(mode="after")
    def _links(self) -> "LookupTopologySpec":
        if self.link in ("toxiproxy", "netns") and self.transport != "tcp":
            raise ValueError(f"link {self.link!r} needs transport: tcp")
        if self.stack == "vllm-ascend" and self.transport != "ipc":
            raise ValueError("stack: vllm-ascend derives an ipc path (vllm-ascend's lookup RPC has no tcp): "
                             "needs transport: ipc")
        if self.stack == "vllm-store" and (self.transport != "ipc" or self.link != "direct" or self.groups != 1):
            raise ValueError("stack: vllm-store (vLLM's store admin channel) derives an ipc path from the engine and "
                             "has one key space: needs transport: ipc, link: direct, groups: 1")
        if self.twin and self.stack != "vllm-store":
            raise ValueError("twin: a second engine on the host is a vllm-store topology (stack: vllm-store)")
        return self


class Mix(Spec):
    full: int = Field(3, ge=0)
    partial: int = Field(2, ge=0)
    miss: int = Field(1, ge=0)
    hbm: int = Field(1, ge=0)
    multigroup: int = Field(1, ge=0)

    @model_validator(mode="after")
    def _some(self) -> "Mix":
        if sum(self.model_dump().values()) == 0:
            raise ValueError("at least one op kind needs a positive weight")
        return self


class LookupWorkloadSpec(WorkloadSpec):
    concurrency: int = Field(2, ge=1, le=64, description="client workers (one REQ client each)")
    rate: float = Field(40.0, gt=0, le=20_000, description="ops/s over all workers")
    mix: Mix = Field(default_factory=Mix)
    prompt_blocks: tuple[int, int] = (2, 12)
    reset_at: Duration | None = Field(None, description="one admin reset at this time (needs concurrency 1: "
                                                        "every later op then expects a miss)")

    @model_validator(mode="after")
    def _ranges(self) -> "LookupWorkloadSpec":
        lo, hi = self.prompt_blocks
        if not 1 <= lo <= hi <= 4096:
            raise ValueError("prompt_blocks must be [lo, hi] with 1 <= lo <= hi <= 4096")
        if self.duration <= 0:
            raise ValueError("duration must be positive")
        if self.reset_at is not None and (self.concurrency != 1 or self.reset_at >= self.duration):
            raise ValueError("reset_at needs concurrency: 1 and a time within the duration")
        return self

    def recovery_gap(self, within: int) -> float:
        # each worker issues rate/concurrency ops per second
        return within * self.concurrency / self.rate
