"""The write-after-free watcher's pure rules (families/pd/node_instruments/pdchaos_waf/tracker.py)
and the pd check that reads its counts (no_write_after_free), on hand-made steps and histories."""

from __future__ import annotations

from families.pd.node_instruments.pdchaos_waf.tracker import FreedLoads
from test_pd_checks import meta, run, vllm


def test_a_failed_load_is_watched_once_the_request_finished_and_the_load_was_reported() -> None:
    """The hardened D: the failure first (invalid blocks, the blocks kept), the request finished
    next step, finished_recving once P cannot write: then its blocks are freed, and watched."""
    t = FreedLoads()
    assert t.step_start({"a": [1, 2, 3]}, {1, 2, 3}, ()) == (set(), {1, 2, 3})
    t.step_end((), {2}, ())  # failed: invalid blocks, no finished_recving
    assert t.step_start({}, set(), {"a"}) == (set(), set())  # finished, not reported: still held
    t.step_end({"a"}, (), ())  # released
    watch, out = t.step_start({}, {3}, ())  # block 3 handed out again in this very step
    assert (watch, out) == ({1, 2}, {3}) and t.loads == {}


def test_upstreams_failure_frees_with_its_report() -> None:
    t = FreedLoads()
    t.step_start({"a": [5, 6]}, {5, 6}, ())
    t.step_end({"a"}, {5}, ())  # failed and reported in one output: vLLM fails and frees it
    assert t.step_start({}, set(), {"a"})[0] == {5, 6}


def test_an_abort_while_loading_frees_on_the_report() -> None:
    t = FreedLoads()
    t.step_start({"a": [7]}, {7}, ())
    t.step_start({}, set(), {"a"})  # aborted: finished before its load was reported
    t.step_end({"a"}, (), ())  # the report (P acknowledged the cancel): freed now
    assert t.step_start({}, set(), ())[0] == {7}


def test_a_completed_load_and_a_recomputing_one_are_never_watched() -> None:
    t = FreedLoads()
    t.step_start({"ok": [1, 2], "re": [3]}, {1, 2, 3}, ())
    t.step_end({"ok"}, (), ())  # completed: its blocks may be prefix-cached
    t.step_end({"re"}, {3}, ())  # failed, policy recompute: the request goes on in place
    assert t.step_start({}, set(), {"ok"})[0] == set()
    assert t.step_start({}, set(), ())[0] == set()
    assert "ok" not in t.loads and "re" in t.loads


def test_a_freed_block_handed_out_at_once_is_reassigned_unless_its_new_owner_loads() -> None:
    """Issue 43, item 7a: most freed blocks go to a new request in the very next step, where the
    poison cannot stay; the watcher compares those between steps instead. A block whose new owner
    loads from P is left out (P writes it between steps, rightly)."""
    t = FreedLoads()
    t.step_start({"a": [1, 2, 3, 4]}, {1, 2, 3, 4}, ())
    t.step_end({"a"}, {1}, ())  # failed and reported in one output
    watch, out = t.step_start({"z": [4]}, {2, 3, 4}, {"a"})  # freed; 2, 3 to a request, 4 to a load
    assert (watch, t.reassigned) == ({1}, {2, 3}) and t.counters["freed_handed_out_at_once"] == 3
    assert t.step_start({}, set(), ())[0] == set() and t.reassigned == set()  # this step's only


def decode(when, t, pid=7, **kw) -> dict:
    base = {"waf_watching": 1, "waf_ok": 1, "waf_tensors": 4, "waf_late_writes": 0, "waf_poisoned": 0,
            "waf_errors": 0}
    return vllm("decode:0", when, t, pid, **{**base, **kw})


def test_the_check_passes_only_on_counts_it_can_read() -> None:
    opts = {"enabled": True}
    good = [meta(), decode("baseline", 0), decode("sample", 1, waf_poisoned=3), decode("final", 2, waf_poisoned=3)]
    r = run("no_write_after_free", good, opts)
    assert r.ok is True and "3 block(s)" in r.message
    late = [meta(), decode("baseline", 0, waf_late_writes=2), decode("final", 2, waf_late_writes=3, waf_poisoned=4)]
    r = run("no_write_after_free", late, opts)
    assert r.ok is False and "1 block(s) written after" in r.message
    for bad in ([meta()],  # no decode probe
                [meta(), decode("final", 2)],  # one probe
                [meta(), decode("baseline", 0, waf_watching=0), decode("final", 2, waf_watching=0)],
                [meta(), decode("baseline", 0), decode("final", 2, waf_ok=0)],  # the file not read
                [meta(), decode("baseline", 0), decode("final", 2, waf_tensors=0)],  # no KV tensor held
                [meta(), decode("baseline", 0), decode("final", 2, waf_errors=1)],  # the watcher failed
                [meta(), decode("baseline", 0, waf_late_writes=5), decode("final", 2, waf_late_writes=1)]):
        r = run("no_write_after_free", bad, opts)
        assert r.ok is False and r.message.startswith("cannot judge"), (bad[-1], r.message)
