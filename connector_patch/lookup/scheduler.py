"""The scheduler-side decision of upstream ``KVPoolScheduler.get_num_new_matched_tokens``.

Same rules as upstream (vllm-ascend ``182b75ea``,
``vllm_ascend/distributed/kv_transfer/kv_pool/ascend_store/pool_scheduler.py``), around any client with
``lookup(token_len, block_hashes, kv_cache_group_ids, hbm_hit_tokens) -> int``. With the hardened
client a failed RPC is a 0 hit, so the request falls through to local compute: ``(0, False)`` and
no load spec. vLLM's ``Request`` is modelled by :class:`PoolRequest` (vLLM cannot be imported here).
The harness's lookup workload asks every lookup through it and journals the decision (``matched``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence


class _Client(Protocol):
    def lookup(self, token_len: int, block_hashes: Sequence[bytes],
               kv_cache_group_ids: Sequence[int] = (0,), hbm_hit_tokens: int = 0) -> int: ...


@dataclass
class PoolRequest:
    """The fields of vLLM's ``Request`` the decision reads."""

    request_id: str
    num_tokens: int
    block_hashes: list[bytes] = field(default_factory=list)


@dataclass(frozen=True)
class LoadSpec:
    vllm_cached_tokens: int
    kvpool_cached_tokens: int
    can_load: bool = False


class PoolScheduler:
    def __init__(self, client: _Client, *, chunk_size: int = 16, kv_cache_group_ids: Sequence[int] = (0,),
                 load_async: bool = False, consumer_skips_load: bool = False):
        self.client = client
        self.chunk_size = chunk_size
        self.kv_cache_group_ids = tuple(kv_cache_group_ids)
        self.load_async = load_async
        self.consumer_skips_load = consumer_skips_load
        self.load_specs: dict[str, LoadSpec] = {}

    def get_num_new_matched_tokens(self, request: PoolRequest, num_computed_tokens: int) -> tuple[int, bool]:
        if self.consumer_skips_load:
            return 0, False
        token_len = request.num_tokens
        if token_len < self.chunk_size or num_computed_tokens >= token_len:
            return 0, False
        hit = self.client.lookup(token_len, request.block_hashes, self.kv_cache_group_ids,
                                 hbm_hit_tokens=num_computed_tokens)
        if hit == 0:
            return 0, False
        if hit == request.num_tokens:  # the last token is always computed locally
            hit = request.num_tokens - 1
        need = hit - num_computed_tokens
        if need <= 0:
            return 0, False
        self.load_specs[request.request_id] = LoadSpec(num_computed_tokens, hit, False)
        return need, self.load_async
