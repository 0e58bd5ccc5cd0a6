"""The hardened layerwise worker's start, its metadata skip and its sending thread's failures (run by
tests/connector_patch/test_layerwise_worker.py in the conformance env, under the NPU stubs).
argv: REPO. Prints one line ``PDCHAOS-LWSTART-RESULT {json}`` (booleans, type names, times).

Real: vllm-ascend 0.23.0.post1's layerwise module, the hardened thread classes and worker method.
Stand-ins: the worker object (``object.__new__``: only the fields ``register_kv_caches`` reads) and
upstream's ``register_kv_caches`` where a case says what upstream would build.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import types

sys.path.insert(0, sys.argv[1])
import pdchaos_npu_stubs  # noqa: E402

pdchaos_npu_stubs.install()
import vllm_ascend  # noqa: E402,F401

pdchaos_npu_stubs.after_vllm_ascend()
from vllm_ascend.distributed.kv_transfer.kv_p2p import mooncake_layerwise_connector as up  # noqa: E402

from connector_patch.layerwise import ascend_connector as H  # noqa: E402

out: dict = {}
UP_RECV = up.KVCacheRecvingLayerThread  # upstream's class, held before any swap

# 1. the listener: an exception before the ready event that is not a bind error (metadata msgspec
#    cannot encode): ready is set at once, the cause kept
ev = threading.Event()
t = H.HardenedRecvingLayerThread(0, 1, 1, 1, "engine", object(), ev, recv_timeout_s=5.0)
t.daemon = True
t0 = time.monotonic()
t.start()
out["recv_ready_s"] = round(time.monotonic() - t0, 3) if ev.wait(5) else None
out["recv_error"] = type(getattr(t, "bind_error", None)).__name__

# 2. the sender: device setup raising before its ready event
snd = object.__new__(H.HardenedSendingLayerThread)
snd.ready_event = threading.Event()
saved = up.get_world_group
up.get_world_group = lambda: (_ for _ in ()).throw(RuntimeError("no world group"))
try:
    th = threading.Thread(target=H.HardenedSendingLayerThread.run, args=(snd,), daemon=True)
    th.start()
    th.join(5)
finally:
    up.get_world_group = saved
out["send_ready"] = snd.ready_event.is_set()
out["send_error"] = type(getattr(snd, "start_error", None)).__name__


def worker(consumer: bool, producer: bool):
    w = object.__new__(H.HardenedLayerwiseWorker)
    w.recv_timeout_s, w.grace_s = 5.0, 3.0
    w.handshake_port = 1
    w.vllm_config = types.SimpleNamespace(kv_transfer_config=types.SimpleNamespace(
        is_kv_consumer=consumer, is_kv_producer=producer))
    return w


def outcome(w) -> str:
    try:
        w.register_kv_caches({})
        return "ok"
    except Exception as exc:  # noqa: BLE001 - the test reads the type and message
        return f"{type(exc).__name__}: {exc}"


orig = up.MooncakeLayerwiseConnectorWorker.register_kv_caches
try:
    # 3. upstream builds its threads without looking the names up (the swap does nothing)
    def builds_upstream(self, kv_caches):
        self.kv_recv_layer_thread = object.__new__(UP_RECV)  # named directly, not looked up
    up.MooncakeLayerwiseConnectorWorker.register_kv_caches = builds_upstream
    out["not_swapped"] = outcome(worker(True, False))

    # 4. upstream builds through the names (as 0.23.0.post1 does): the listener's start failure is raised
    def builds_swapped(self, kv_caches):
        self.kv_recv_layer_thread = t  # the listener of case 1, its cause kept
    up.MooncakeLayerwiseConnectorWorker.register_kv_caches = builds_swapped
    out["listener_failed"] = outcome(worker(True, False))

    def builds_sender(self, kv_caches):
        self.kv_send_layer_thread = snd
        self.kv_recv_layer_thread = None
    up.MooncakeLayerwiseConnectorWorker.register_kv_caches = builds_sender
    out["sender_failed"] = outcome(worker(False, True))
finally:
    up.MooncakeLayerwiseConnectorWorker.register_kv_caches = orig
# 5. P: a request whose metadata query failed, its D's metadata cached since by another request:
#    its later layers are skipped (never sent: no DONE from upstream's sender to race its FAILED)
p = object.__new__(H.HardenedLayerwiseWorker)
p.counters = {"meta_skips": 0, "meta_queries": 0, "meta_failures": 0}
p._meta_failed = {"req-a": time.monotonic()}
p.engine_id = "p-engine"
p.remote_layer_metadata = {"d-engine": {5555: {"layer": "meta"}}}
p.remote_te_port = {"d-engine": {5555: 7777}}
p._query_metadata = lambda *a: (_ for _ in ()).throw(AssertionError("cache hit: no query"))
meta = lambda: types.SimpleNamespace(remote_engine_id="d-engine", remote_port=5555)  # noqa: E731
try:
    p.update_decoder_info("req-a", meta())
    out["failed_req_with_cache"] = "sent"
except RuntimeError as exc:
    out["failed_req_with_cache"] = f"skipped: {exc}"
other = p.update_decoder_info("req-b", meta())
out["other_req_with_cache"] = [other.remote_te_rpc_port, other.remote_layer_metadata]
out["meta_skips"] = p.counters["meta_skips"]
# 6. P's sending thread, upstream's _transfer_kv_cache run for real: one task, two D sessions, the
#    first session's write fails. Upstream marks a leftover loop variable failed (the second
#    session's request, whose write succeeded); here exactly the failed session's request fails.
ns = types.SimpleNamespace


def sender(write, signals: list):
    """The hardened sending thread without its thread: one layer, ``write`` as the engine's write,
    the DONE/FAILED signals it sends appended to ``signals``."""
    s = object.__new__(H.HardenedSendingLayerThread)
    s.counters = {"layers": 0, "transfer_errors": 0, "task_errors": 0, "failed_signals": 0,
                  "stale_adds_dropped": 0, "past_write_by": 0}
    s.failed_reqs = H._FailedRequests(s.counters)
    s.sessions, s._signalled, s.total_layers, s.pd_head_ratio = {}, set(), 1, 1
    s.task_requests = {}
    s.layer_metadata = {"layer0": ns(tensor_group_idx=[0])}
    s.get_transfer_meta = lambda task, rid, meta, group: ([1], [2], [3])
    s.callback_func = lambda rid, meta, group, trans_flag=True: signals.append((rid, trans_flag))
    s.engine = H._GuardedEngine(ns(batch_transfer_sync_write=write), s)
    return s


signals: list = []
writes = {"h1:1": -1, "h2:2": 0}
s6 = sender(lambda sid, *a: writes[sid], signals)
task = ns(layer_name="layer0", layer_idx=0, k_cache=None, v_cache=None, k_quant_cache=None,
          wait_event=ns(synchronize=lambda: None),
          send_request={"req-a": ns(remote_host="h1", remote_te_rpc_port=1, chunk_finish=True),
                        "req-b": ns(remote_host="h2", remote_te_rpc_port=2, chunk_finish=True)})
s6._handle_request(task)
out["two_sessions_signals"] = sorted(signals)
out["stale_adds_dropped"] = s6.counters["stale_adds_dropped"]
# 7. D's POST to the metaserver: tried again only when no connection was made (the POST is not
#    idempotent: a retry after a timeout or an answer could send the request to P twice)
import httpx  # noqa: E402


def post_with(*outcomes):
    sch = object.__new__(H.HardenedLayerwiseScheduler)
    sch.counters, sch._failed_posts, sch._posts_lock = {"posts": 0, "post_failures": 0, "post_timeouts": 0}, {}, \
        threading.Lock()
    sch.post_timeout_s = 1.0
    sch.recv_timeout_s, sch._alloc_time = 30.0, {"r1": 1000.0}
    calls = []

    def post(url, json):
        calls.append(url)
        sent.append(json)
        o = outcomes[min(len(calls), len(outcomes)) - 1]
        if isinstance(o, Exception):
            raise o
        return ns(status_code=o)
    sch.metaserver_client = ns(post=post)
    sch._access_metaserver("http://ms/v1/metaserver", {"request_id": "r1"})
    return [len(calls), sorted(sch._failed_posts.items())]


sent: list = []


req = httpx.Request("POST", "http://ms/v1/metaserver")
out["post_timeout"] = post_with(httpx.ReadTimeout("slow", request=req), 200)
out["post_refused_then_ok"] = post_with(httpx.ConnectError("refused", request=req), 200)
out["post_500"] = post_with(500, 200)
out["post_refused_twice"] = post_with(httpx.ConnectError("refused", request=req))
out["post_write_by"] = sorted({m.get(H.WRITE_BY_KEY) for m in sent})  # alloc time 1000 + recv timeout 30
# 8. P's sending thread, upstream's _transfer_kv_cache run for real, last layer: a request past the
#    write-by time D sent is never written and told FAILED; one before it is written and told DONE
signals8: list = []
written: list = []
s8 = sender(lambda sid, src, *a: written.append(len(src)) or 0, signals8)
now = time.time()
task8 = ns(layer_name="layer0", layer_idx=0, k_cache=None, v_cache=None, k_quant_cache=None,
           wait_event=ns(synchronize=lambda: None),
           send_request={"late": ns(remote_host="h1", remote_te_rpc_port=1, chunk_finish=True, write_by=now - 1),
                         "in-time": ns(remote_host="h1", remote_te_rpc_port=1, chunk_finish=True, write_by=now + 60),
                         "no-limit": ns(remote_host="h1", remote_te_rpc_port=1, chunk_finish=True)})
s8._handle_request(task8)
out["write_by_signals"] = sorted(signals8)
out["write_by_written"] = written  # one write of the two requests' ranges
out["past_write_by"] = s8.counters["past_write_by"]
# 8b. the write-by time is checked at each write: a slow write to one D (0.4 s) pushes the next D's
#     write past that D's write-by (0.2 s from now): never written, told FAILED (issue 30, item 7)
signals8b: list = []
written8b: list = []


def slow_first(sid, src, *a):
    written8b.append(sid)
    if sid == "h1:1":
        time.sleep(0.4)
    return 0


s8b = sender(slow_first, signals8b)
now = time.time()
task8b = ns(layer_name="layer0", layer_idx=0, k_cache=None, v_cache=None, k_quant_cache=None,
            wait_event=ns(synchronize=lambda: None),
            send_request={"slow-d": ns(remote_host="h1", remote_te_rpc_port=1, chunk_finish=True, write_by=now + 60),
                          "next-d": ns(remote_host="h2", remote_te_rpc_port=2, chunk_finish=True, write_by=now + 0.2)})
s8b._handle_request(task8b)
out["per_write_signals"] = sorted(signals8b)
out["per_write_written"] = written8b
out["per_write_past"] = s8b.counters["past_write_by"]
# 9. P's scheduler side carries the write-by time from the transfer params into the ReqMeta
m9 = up.MooncakeLayerwiseConnectorMetadata()
m9.add_new_req(request_id="r9", local_block_ids=[[1]], kv_transfer_params={H.WRITE_BY_KEY: 123.5})
m9.add_new_req(request_id="r10", local_block_ids=[[2]], kv_transfer_params={})
H.tag_write_by(m9, {"r9": {H.WRITE_BY_KEY: 123.5}, "r10": {}})
out["tagged"] = [m9.requests["r9"].write_by, m9.requests["r10"].write_by]
# 10. the start-up mutants (tests/mutants/system/site): each must fail the case its fix passes
sys.path.insert(0, str(__import__("pathlib").Path(sys.argv[1]) / "tests" / "mutants" / "system" / "site"))
# 3. several P senders per D rank (trans_count > 1; issue 30, item 8), on the listener's message
#    path (answer(), the wire tuples a P sends), the thread not started
import msgspec  # noqa: E402

_dec = msgspec.msgpack.Decoder(type=tuple)


def listener():
    return H.HardenedRecvingLayerThread(0, 1, 1, 1, "engine", object(), threading.Event(), recv_timeout_s=30.0,
                                        grace_s=30.0)


def say(rt, kind, req, count, sender):
    frame = msgspec.msgpack.encode((H.DONE if kind == "done" else H.FAILED, req, count, sender))
    return rt.answer([b"id", frame], _dec, b"meta")


# a. one sender's FAILED while the other may still write: D fails the request but holds its blocks
#    until the other's last word
rt = listener()
rt.expect("a")
say(rt, "failed", "a", 2, "p1:1")
out["multi_failed_reported"] = "a" in rt.failed_requests
out["multi_failed_held"] = rt.holds.holding("a")
say(rt, "done", "a", 2, "p2:1")  # the other sender's last word: it writes no more
out["multi_failed_released_on_last_word"] = (not rt.holds.holding("a")) and rt.holds.take_released() == ["a"]
# the only sender's FAILED (count 1, or upstream's FAILED without a count): nothing else writes
rt.expect("a1")
say(rt, "failed", "a1", 1, "p1:1")
out["single_failed_held"] = rt.holds.holding("a1")
# b. both senders' DONE before the worker waits: replayed, the request completes
rt = listener()
say(rt, "done", "b", 2, "p1:1")
say(rt, "done", "b", 2, "p2:1")
rt.expect("b")
out["early_dones_complete"] = "b" in rt.done_requests
# c. a DONE checked against "waiting" just as the worker starts waiting (its expect() runs in
#    that gap, on another thread): the DONE must be neither lost nor ignored
rt = listener()
_orig_waiting = rt.deadlines.waiting
_gap = {"done": False}


def waiting_with_a_gap(req_id):
    result = _orig_waiting(req_id)
    if req_id == "c" and not _gap["done"]:
        _gap["done"] = True
        th = threading.Thread(target=rt.expect, args=("c",), daemon=True)
        th.start()
        th.join(0.5)  # the fix: expect() waits for the listener's lock; before, it ran in the gap
    return result


rt.deadlines.waiting = waiting_with_a_gap
say(rt, "done", "c", 1, "p1:1")
time.sleep(0.2)
out["gap_done_complete"] = "c" in rt.done_requests
# d. the deadline passes after one of two senders said DONE: the hold ends at the other's word
rt = listener()
rt.deadlines.timeout_s = 0.05
rt.expect("d")
say(rt, "done", "d", 2, "p1:1")
time.sleep(0.1)
rt.expire()
out["expired_held"] = rt.holds.holding("d")
say(rt, "done", "d", 2, "p2:1")
out["expired_released_on_last_word"] = not rt.holds.holding("d")

from pdchaos_mutants import layerwise as M  # noqa: E402

ev10 = threading.Event()
t10 = M.StartupMutantBindErrorOnly(0, 1, 1, 1, "engine", object(), ev10, recv_timeout_s=5.0)
t10.daemon = True
t10.start()
out["mutant_bind_error_only_ready"] = ev10.wait(3)  # the fix: ready at once; the mutant: never
orig10 = up.MooncakeLayerwiseConnectorWorker.register_kv_caches
try:
    def builds_upstream10(self, kv_caches):
        self.kv_recv_layer_thread = object.__new__(UP_RECV)
    up.MooncakeLayerwiseConnectorWorker.register_kv_caches = builds_upstream10
    w10 = worker(True, False)
    w10.__class__ = M.StartupMutantNoSwapCheck
    out["mutant_no_swap_check"] = outcome(w10)  # the fix: RuntimeError; the mutant: "ok"
finally:
    up.MooncakeLayerwiseConnectorWorker.register_kv_caches = orig10
out["swap_lock_free"] = H._SWAP_LOCK.acquire(timeout=1)
out["names_restored"] = (up.KVCacheSendingLayerThread.__module__ == up.__name__
                         and up.KVCacheRecvingLayerThread.__module__ == up.__name__)
print("PDCHAOS-LWSTART-RESULT " + json.dumps(out), flush=True)
