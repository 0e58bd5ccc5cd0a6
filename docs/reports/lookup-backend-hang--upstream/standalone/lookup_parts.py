"""What the three lookup reproductions share: vllm-ascend's real LookupKeyServer and LookupKeyClient
(AscendStore's scheduler -> worker rank 0 lookup RPC), a stand-in for the pool worker behind the
server, and the VllmConfig the two read their ipc path from.

The stand-in: vllm-ascend's ``KVPoolWorker`` needs an NPU and a Mooncake store. The server calls one
method of it, ``lookup_scheduler(token_len, hashes, group_ids, use_layerwise=..., hbm_hit_tokens=...)``,
which returns how many of the prompt's tokens the pool holds (whole blocks). ``PoolWorker`` answers it
from a set of preloaded block hashes, and can be told to hang (a store that does not answer).
"""

from __future__ import annotations

import os
import threading
import time

import ut_stubs

ut_stubs.load()  # vllm-ascend's own tests/ut/conftest.py: torch_npu, acl, torch.npu, mooncake.engine

from vllm.config import KVTransferConfig, ParallelConfig, VllmConfig  # noqa: E402
from vllm_ascend import register_connector  # noqa: E402  (vllm-ascend's vllm.general_plugins entry point)
from vllm_ascend.distributed.kv_transfer.kv_pool.ascend_store.ascend_store_connector import (  # noqa: E402
    LookupKeyServer,
)
from vllm_ascend.distributed.kv_transfer.kv_pool.ascend_store.pool_scheduler import (  # noqa: E402
    LookupKeyClient,
    get_zmq_rpc_path_lookup,
)

BLOCK = 16
PORT = 5100
HASHES = [bytes([i]) * 32 for i in range(1, 5)]  # four blocks the pool holds
TOKENS = BLOCK * len(HASHES)
# What vllm-ascend 0.23.0.post1 ignores and the fix reads: the client's deadline per lookup and the
# server's bound on one store call.
FIX_SETTINGS = {"lookup_rpc_timeout_ms": 300, "lookup_backend_timeout_ms": 150}


register_connector()  # AscendStoreConnector in vLLM's connector factory, as the plugin does in a server


def vllm_config() -> VllmConfig:
    kv = KVTransferConfig(kv_connector="AscendStoreConnector", kv_role="kv_both",
                          kv_connector_extra_config={"lookup_rpc_port": PORT, "backend": "mooncake",
                                                     **FIX_SETTINGS})
    return VllmConfig(parallel_config=ParallelConfig(), kv_transfer_config=kv)


class PoolWorker:
    """Stand-in for KVPoolWorker (rank 0): the pool holds HASHES; ``hang_s`` makes the store hang."""

    def __init__(self) -> None:
        self.held = {h.hex() for h in HASHES}
        self.hang_s = 0.0

    def lookup_scheduler(self, token_len, block_hashes, kv_cache_group_ids=None, use_layerwise=False,
                         hbm_hit_tokens=0, **kwargs):
        if self.hang_s:
            time.sleep(self.hang_s)
        hit = 0
        for h in block_hashes:
            if h not in self.held:
                break
            hit += BLOCK
        return min(hit, token_len)


def lookup_path() -> str:
    return get_zmq_rpc_path_lookup(vllm_config())


def start_server(worker: PoolWorker) -> LookupKeyServer:
    return LookupKeyServer(worker, vllm_config())


def client() -> LookupKeyClient:
    return LookupKeyClient(vllm_config())


class Lookup:
    """One lookup of the four held blocks, on a thread of its own (the scheduler's call)."""

    def __init__(self, c: LookupKeyClient) -> None:
        self.out: list = []
        self.thread = threading.Thread(target=self._go, args=(c,), daemon=True)
        self.thread.start()

    def _go(self, c: LookupKeyClient) -> None:
        t0 = time.monotonic()
        try:
            r = c.lookup(TOKENS, HASHES)
        except Exception as e:  # noqa: BLE001
            r = f"raised {type(e).__name__}"
        self.out.append((time.monotonic() - t0, r))

    def wait(self, wait_s: float) -> tuple[float | None, object]:
        """(seconds the lookup took, its answer), or (None, None) when it has not returned within
        ``wait_s`` more (its thread is left waiting: a daemon)."""
        self.thread.join(wait_s)
        return self.out[0] if self.out else (None, None)


def timed_lookup(c: LookupKeyClient, wait_s: float) -> tuple[float | None, object]:
    return Lookup(c).wait(wait_s)


def wait_for_socket(timeout_s: float = 120.0) -> None:
    path = lookup_path().removeprefix("ipc://")
    end = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise SystemExit(f"error: the lookup server's socket did not appear in {timeout_s:.0f} s")
        time.sleep(0.05)
