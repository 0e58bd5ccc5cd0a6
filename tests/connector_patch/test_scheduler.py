"""The scheduler shim (upstream get_num_new_matched_tokens rules) around the hardened client, over
real sockets: an RPC failure is (0, False) with no load spec, and healthy hits give exactly the
decisions of a direct computation and of today's upstream (the legacy model). The lookup
workload asks every lookup through it (families/lookup/workload.py ``scheduled_lookup``):
one RPC per op whatever the rules decide, and the decision as the op's ``matched``.
"""

from __future__ import annotations

import time

import pytest

from connector_patch.lookup.legacy import LegacyLookupClient, LegacyLookupServer
from connector_patch.lookup.protocol import LookupRequest
from connector_patch.lookup.scheduler import LoadSpec, PoolRequest, PoolScheduler
from rawpeers import SHORT_DEADLINE_MS, TOLERANCE_S, distinct_hashes, hexes, reply_always

pytestmark = [pytest.mark.usefixtures("log_guard"), pytest.mark.timeout(30)]


def reference(backend, req: PoolRequest, num_computed: int, groups, chunk=16, load_async=False,
              consumer_skips_load=False):
    """Upstream's decision, computed directly from the backend (no RPC)."""
    if consumer_skips_load or req.num_tokens < chunk or num_computed >= req.num_tokens:
        return (0, False), None
    hit = backend.hit_tokens(LookupRequest(req.num_tokens, tuple(groups), num_computed,
                                           tuple(hexes(req.block_hashes))))
    if hit == 0:
        return (0, False), None
    if hit == req.num_tokens:
        hit = req.num_tokens - 1
    need = hit - num_computed
    if need <= 0:
        return (0, False), None
    return (need, load_async), LoadSpec(num_computed, hit, False)


@pytest.mark.parametrize("failure", ["nothing bound", "silent", "malformed", "backend error"])
def test_rpc_failure_means_local_compute(failure, make_endpoint, peer_factory, server_factory,
                                         client_factory):
    ep = make_endpoint()
    if failure == "silent":
        peer_factory(ep, silent=True)
    elif failure == "malformed":
        peer_factory(ep, reply_always([b"\x00\x00\x00\x40"]))  # a legacy 4-byte "64"
    elif failure == "backend error":
        server_factory(ep).backend.set("raise")
    hashes = distinct_hashes(4, "sched-fail")
    sched = PoolScheduler(client_factory(ep, SHORT_DEADLINE_MS))
    req = PoolRequest("req-fail", 64, hashes)
    start = time.monotonic()
    decision = sched.get_num_new_matched_tokens(req, 0)
    elapsed = time.monotonic() - start
    assert decision == (0, False)
    assert sched.load_specs == {}
    assert elapsed <= SHORT_DEADLINE_MS / 1000 + TOLERANCE_S
    # the request goes on: the next scheduling step asks again and gets an answer, no exception
    assert sched.get_num_new_matched_tokens(req, 16) == (0, False)


CASES = {
    # name: (stored blocks per group, num_tokens, num_computed, group ids, scheduler kwargs)
    "zero": ({0: 0}, 64, 0, (0,), {}),
    "partial": ({0: 2}, 64, 0, (0,), {}),
    "partial, some computed": ({0: 3}, 64, 16, (0,), {}),
    "full -> num_tokens - 1": ({0: 4}, 64, 0, (0,), {}),
    "full, ragged last block": ({0: 4}, 60, 0, (0,), {}),
    "computed covers the hit": ({0: 2}, 64, 32, (0,), {}),
    "hbm prefix then pool": ({0: 0, "tail": (2, 4)}, 64, 32, (0,), {}),
    "multi-group": ({0: 4, 1: 2}, 64, 0, (0, 1), {}),
    "multi-group full": ({0: 4, 1: 4}, 64, 0, (0, 1), {}),
    "load async": ({0: 2}, 64, 0, (0,), {"load_async": True}),
    "short prompt": ({0: 1}, 10, 0, (0,), {}),
    "all computed": ({0: 4}, 64, 64, (0,), {}),
    "consumer skips load": ({0: 4}, 64, 0, (0,), {"consumer_skips_load": True}),
}


@pytest.fixture
def both_servers(make_endpoint, server_factory):
    """The hardened server and the legacy model, serving the same backend."""
    hardened = server_factory(make_endpoint())
    legacy = LegacyLookupServer(make_endpoint(), hardened.backend).start()
    try:
        yield hardened, legacy
    finally:
        legacy.close()


@pytest.mark.parametrize("name", list(CASES))
def test_hits_unchanged(name, both_servers, client_factory):
    hardened, legacy = both_servers
    stored, num_tokens, computed, groups, kw = CASES[name]
    hashes = distinct_hashes(4, f"sched-{name}")
    for g, n in stored.items():
        if g == "tail":
            hardened.backend.put(hexes(hashes[n[0]:n[1]]), groups=list(groups))
        elif n:
            hardened.backend.put(hexes(hashes[:n]), groups=[g])
    req = PoolRequest(f"req-{name}", num_tokens, hashes)
    expected, spec = reference(hardened.backend, req, computed, groups, **kw)

    new = PoolScheduler(client_factory(hardened.endpoint, 2000), kv_cache_group_ids=groups, **kw)
    old_client = LegacyLookupClient(legacy.endpoint)
    try:
        old = PoolScheduler(old_client, kv_cache_group_ids=groups, **kw)
        assert new.get_num_new_matched_tokens(req, computed) == expected
        assert old.get_num_new_matched_tokens(req, computed) == expected
    finally:
        old_client.close()
    assert new.load_specs == old.load_specs == ({} if spec is None else {req.request_id: spec})
    assert new.client.counters["timeout"] == new.client.counters["protocol"] == 0


def test_reference_cases_are_not_trivial(both_servers):
    """The table above really covers zero, partial, full (capped) and multi-group outcomes."""
    hardened, _ = both_servers
    seen = set()
    for name, (stored, num_tokens, computed, groups, kw) in CASES.items():
        b = type(hardened.backend)(groups=2)
        try:
            hashes = distinct_hashes(4, f"sched-{name}")
            for g, n in stored.items():
                if g == "tail":
                    b.put(hexes(hashes[n[0]:n[1]]), groups=list(groups))
                elif n:
                    b.put(hexes(hashes[:n]), groups=[g])
            seen.add(reference(b, PoolRequest("r", num_tokens, hashes), computed, groups, **kw)[0])
        finally:
            b.close()
    assert {(0, False), (32, False), (63, False), (59, False), (31, False), (32, True)} <= seen


class _Fixed:
    """A client answering ``hit`` to every lookup, counting the calls."""

    def __init__(self, hit: int):
        self.hit, self.calls = hit, []

    def lookup(self, token_len, block_hashes, kv_cache_group_ids=(0,), hbm_hit_tokens=0):
        self.calls.append((token_len, tuple(kv_cache_group_ids), hbm_hit_tokens))
        return self.hit


@pytest.mark.parametrize("hit, token_len, hbm, matched", [
    (64, 64, 0, 63),  # full hit: the last token is computed locally
    (48, 64, 16, 32),  # the pool adds what HBM does not have
    (0, 64, 0, 0),  # a miss, or the hardened client failing open
    (16, 64, 32, 0),  # HBM already covers the pool's hit
    (64, 64, 64, 0),  # everything computed: the scheduler asks nothing, the workload still sends it
])
def test_the_workload_asks_through_the_scheduler_and_always_sends_the_rpc(hit, token_len, hbm, matched):
    from families.lookup.workload import OpSpec, scheduled_lookup

    spec = OpSpec("full", token_len, tuple(distinct_hashes(4, "wl")), (0, 1), hbm, expected=hit)
    client = _Fixed(hit)
    assert scheduled_lookup(client, spec, "op-1", block_size=16) == (hit, matched)
    assert client.calls == [(token_len, (0, 1), hbm)]  # exactly one RPC per op, with the op's own fields


def test_the_workloads_scheduler_view_over_a_real_server(make_endpoint, server_factory, client_factory):
    from families.lookup.workload import OpSpec, scheduled_lookup

    server = server_factory(make_endpoint())
    hashes = distinct_hashes(4, "wl-real")
    server.backend.put(hexes(hashes[:2]))
    client = client_factory(server.endpoint, 2000)
    spec = OpSpec("partial", 64, tuple(hashes), (0,), 0, expected=32)
    assert scheduled_lookup(client, spec, "op-2", block_size=16) == (32, 32)
    server.backend.set("raise")  # an RPC failure: a 0 hit, local compute
    assert scheduled_lookup(client, spec, "op-3", block_size=16) == (0, 0)
    assert client.last_outcome == "backend_error"
