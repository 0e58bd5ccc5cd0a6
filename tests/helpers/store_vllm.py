"""vLLM 0.32.0's MooncakeStoreConnector admin channel, upstream's and the hardened one, side by side
in the P/D node env's python (run by tests/connector_patch/test_store_vllm.py). argv: REPO TMPDIR.
Prints one line ``PDCHAOS-STORE-RESULT {json}`` (booleans, counts and times only).

Real here: upstream's ``LookupKeyServer`` and ``LookupKeyClient`` and ``get_zmq_rpc_path_lookup``
as installed, vLLM's ``MooncakeLookupResult``, the hardened classes of connector_patch/store,
real ipc sockets. Stand-ins: ``vllm_config`` (a namespace with the fields the channel reads) and
the store worker (``lookup`` over a dict, ``kv_send_thread.request_queue``, ``store.remove_all``
returning what a Mooncake store returns: a count, or a negative code when the master is gone).
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
import types

sys.path.insert(0, sys.argv[1])
os.environ["VLLM_RPC_BASE_PATH"] = sys.argv[2]

import zmq  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store import worker as up  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.data import MooncakeLookupResult  # noqa: E402

from connector_patch.store import vllm_store as hs  # noqa: E402

out: dict = {}


def config(engine_id: str, port: int = 0, **extra) -> types.SimpleNamespace:
    kv = types.SimpleNamespace(engine_id=engine_id, kv_connector_extra_config={"lookup_rpc_port": port, **extra})
    return types.SimpleNamespace(kv_transfer_config=kv, parallel_config=types.SimpleNamespace(data_parallel_index=0))


class Store:
    def __init__(self) -> None:
        self.keys = {b"k" * 32}
        self.rc = 0  # remove_all's return: >= 0 removed, < 0 an error code (master gone)

    def remove_all(self, force: bool = False) -> int:  # noqa: ARG002
        if self.rc < 0:
            return self.rc
        n = len(self.keys)
        self.keys.clear()
        return n

    def remove_by_regex(self, pattern: str, force: bool = False) -> int:  # every key here is "tiny"'s
        import re

        self.patterns = getattr(self, "patterns", []) + [pattern]
        return self.remove_all(force) if re.match(pattern, "pfx@tiny@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@h") else 0


class StoreWorker:
    def __init__(self) -> None:
        self.store = Store()
        self.token_dbs = [types.SimpleNamespace(metadata=types.SimpleNamespace(
            model_name="tiny", cache_prefix="pfx", store_namespace=""))]
        self.kv_send_thread = types.SimpleNamespace(request_queue=queue.Queue())
        self.raise_next = False
        self.slow_next_s = 0.0  # the next lookup takes this long (a store that answers late)

    def lookup(self, num_tokens, block_hashes):
        if self.slow_next_s:
            delay, self.slow_next_s = self.slow_next_s, 0.0
            time.sleep(delay)
        if self.raise_next:
            self.raise_next = False
            raise RuntimeError("store lookup failed")
        hit = 16 if block_hashes and bytes(block_hashes[0]) in self.store.keys else 0
        return MooncakeLookupResult(min(hit, num_tokens))


def raw(endpoint: str, frames: list, timeout_ms: int = 1500):
    s = zmq.Context.instance().socket(zmq.REQ)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    try:
        s.send_multipart(frames)
        return s.recv_multipart() if s.poll(timeout_ms) else None
    finally:
        s.close()


GOOD = [b"lookup", (64).to_bytes(4, "big"), (32).to_bytes(2, "big"), b"k" * 32]

# --- upstream: the thread dies on a short lookup; every later message goes unanswered
w = StoreWorker()
cfg = config("engine-a", 7001)
server = up.LookupKeyServer(w, cfg)
path = up.get_zmq_rpc_path_lookup(cfg)
out["upstream_good"] = raw(path, GOOD) is not None
out["upstream_reply_to_short_lookup"] = raw(path, [b"lookup"]) is not None
time.sleep(0.2)
out["upstream_thread_alive_after_short_lookup"] = server.thread.is_alive()
out["upstream_answers_after"] = raw(path, GOOD) is not None

# --- upstream: remove_all failing (master gone) still reports success
w2 = StoreWorker()
cfg2 = config("engine-b", 7002)
server2 = up.LookupKeyServer(w2, cfg2)
w2.store.rc = -1
client2 = up.LookupKeyClient(cfg2)
out["upstream_reset_with_master_gone"] = client2.reset()
out["upstream_keys_left_after_that_reset"] = len(w2.store.keys)

# --- upstream: two servers with the same port on one host share one path
out["upstream_same_path_two_engines"] = up.get_zmq_rpc_path_lookup(config("x", 0)) == \
    up.get_zmq_rpc_path_lookup(config("y", 0))

# --- the store workload's upstream client (families/lookup/store_workload.py): after a lookup its
# executor thread exists; close() must leave the process with the threads it had before the client
# (the workload's final probe counts them at once)
from families.lookup.store_workload import _Client  # noqa: E402

threads_before = threading.active_count()
wclient = _Client("upstream", cfg2)
out["workload_upstream_lookup"] = wclient.lookup(64, [b"k" * 32])
out["workload_upstream_threads_while_open"] = threading.active_count() - threads_before
# a thread slow to end (as on a busy 2-core host, where the probe once ran before it ended): the
# executor is busy for 0.3 s more when close() is called
busy = wclient.client.executor.submit(time.sleep, 0.3)
while not busy.running() and not busy.done():
    time.sleep(0.005)
wclient.close()
out["workload_upstream_threads_after_close"] = threading.active_count() - threads_before

# --- hardened: answers everything, the thread survives, the reset tells the truth
hw = StoreWorker()
hcfg = config("engine-c", 7003, lookup_rpc_timeout_ms=500)
hserver = hs.HardenedStoreLookupKeyServer(hw, hcfg)
hclient = hs.HardenedStoreLookupKeyClient(hcfg)
out["hardened_good_hit"] = hclient.lookup("r1", 64, [b"k" * 32]).hit_length
codes = []
for frames in ([b"lookup"], [b"lookup", b"\x00"], [b"lookup", b"\x00", b"\x00"], [b"reset", b"x"], [b"zz"]):
    reply = raw(hserver.endpoint, frames)
    codes.append(None if reply is None else json.dumps(len(reply)))
out["hardened_replies_to_malformed"] = sum(c is not None for c in codes)
hw.raise_next = True
out["hardened_lookup_when_store_raises"] = hclient.lookup("r2", 64, [b"k" * 32]).hit_length
out["hardened_hit_after_all_that"] = hclient.lookup("r3", 64, [b"k" * 32]).hit_length
hw.slow_next_s = 0.1  # the first poll finds it in flight by construction (upstream too returns a lookup done by then)
out["hardened_async_first_poll_none"] = hclient.lookup("r4", 64, [b"k" * 32], non_block=True) is None
time.sleep(0.4)
res = hclient.lookup("r4", 64, [b"k" * 32], non_block=True)
out["hardened_async_then_hit"] = None if res is None else res.hit_length
hw.store.rc = -1
out["hardened_reset_with_master_gone"] = hclient.reset()
hw.store.rc = 0
hw.kv_send_thread.request_queue.put("pending put")  # a put that never lands: the drain is bounded
t0 = time.monotonic()
out["hardened_reset_with_stuck_put"] = hclient.reset()
out["hardened_reset_with_stuck_put_s"] = round(time.monotonic() - t0, 2)
hw.kv_send_thread.request_queue.get()
hw.kv_send_thread.request_queue.task_done()
out["hardened_reset_ok"] = hclient.reset()
out["hardened_keys_left"] = len(hw.store.keys)
out["hardened_reset_patterns"] = list(hw.store.patterns)
# refused, nothing removed: another rank stores too; a store without remove_by_regex
hw.store.keys.add(b"k" * 32)
hw.tp_size = 2
out["hardened_reset_two_ranks"] = hclient.reset()
hw.tp_size = 1
regex = Store.remove_by_regex
del Store.remove_by_regex
out["hardened_reset_no_regex"] = hclient.reset()
Store.remove_by_regex = regex
out["hardened_keys_left_after_refusals"] = len(hw.store.keys)
hw.store.keys.clear()
out["hardened_miss_after_reset"] = hclient.lookup("r5", 64, [b"k" * 32]).hit_length

# --- hardened: a frozen/dead server costs one deadline per lookup, never more
hserver.close()
t0 = time.monotonic()
out["hardened_lookup_server_gone"] = hclient.lookup("r6", 64, [b"k" * 32]).hit_length
out["hardened_lookup_server_gone_s"] = round(time.monotonic() - t0, 2)

# --- hardened: engines never share a path; a live path is never taken over
out["hardened_paths_differ"] = hs.lookup_path(config("x")) != hs.lookup_path(config("y"))
live = hs.HardenedStoreLookupKeyServer(StoreWorker(), config("engine-d"))
try:
    hs.HardenedStoreLookupKeyServer(StoreWorker(), config("engine-d"))
    out["hardened_second_server_on_live_path"] = "bound"
except RuntimeError as exc:
    out["hardened_second_server_on_live_path"] = str(exc)
live.close()

# --- settings: a bad deadline fails at start, naming its key
for name, bad in (("zero", {"lookup_rpc_timeout_ms": 0}), ("reset_under_drain", {"lookup_reset_timeout_ms": 1000}),
                  ("backend_over_client", {"lookup_rpc_timeout_ms": 1000, "lookup_backend_timeout_ms": 4000})):
    try:
        hs.settings(config("e", **bad))
        out[f"settings_{name}"] = "accepted"
    except ValueError as exc:
        out[f"settings_{name}"] = str(exc)

out["settings_backend_default"] = hs.settings(config("e"))["lookup_backend_timeout_ms"]  # below the client's 1000
out["threads_left"] = sorted({t.name.split("-")[0] for t in threading.enumerate() if t is not threading.main_thread()})
hclient.close()
print("PDCHAOS-STORE-RESULT " + json.dumps(out), flush=True)
os._exit(0)  # upstream's servers' threads wait in recv: close() would abort the process (libzmq)
