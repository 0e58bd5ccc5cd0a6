"""The pd family's checks and faults on hand-made histories: each check passes a good history and
fails the bad ones it exists for (no real node needed here; tests/families/pd/test_pd_nodes.py runs real ones)."""

from __future__ import annotations

import json

import pytest

from harness import checks as C
from harness.family import get_family

FAM = get_family("pd")
CHECKS = C.checks_for(FAM)
T0 = 100.0
EXT = "prompt_tokens_by_source_total{source=external_kv_transfer}"


def meta(**kw) -> dict:
    return {"type": "meta", "family": "pd", "target": "upstream", "deadline_ms": 10000.0, "tolerance_ms": 2000.0,
            "t0": T0, "primary_ops": ["complete"], "topology": {"kv_load_failure_policy": "fail"}, **kw}


def op(i: int, t: float, *, phase="ok", value="abc", expected="abc", outcome="ok", elapsed_ms=80.0) -> list[dict]:
    return [{"type": "op", "id": i, "process": 0, "f": "complete", "phase": "invoke", "t": T0 + t,
             "expected": expected},
            {"type": "op", "id": i, "process": 0, "f": "complete", "phase": phase, "t": T0 + t + elapsed_ms / 1000,
             "value": value, "outcome": outcome, "elapsed_ms": elapsed_ms,
             "status": 200 if outcome == "ok" else int(outcome[5:]) if outcome.startswith("http_") else None}]


def vllm(node: str, when: str, t: float = 0.0, pid: int = 1, **counters) -> dict:
    base = {"num_requests_running": 0, "num_requests_waiting": 0, "kv_cache_usage_perc": 0.0}
    return {"type": "probe", "node": node, "kind": "vllm", "when": when, "pid": pid, "t": T0 + t,
            "counters": {**base, **counters}, "alive": True}


def fault(start: float, stop: float) -> list[dict]:
    return [{"type": "fault", "id": 0, "name": "stop", "phase": "start", "t": T0 + start},
            {"type": "fault", "id": 0, "name": "stop", "phase": "stop", "t": T0 + stop}]


def run(name: str, records: list[dict], opts=None) -> C.CheckResult:
    return CHECKS[name](C.CheckInput(records), opts or {})


def test_correct_output() -> None:
    assert run("correct_output", [meta(), *op(1, 0)]).ok is True
    assert run("correct_output", [meta(), *op(1, 0, value="abd")]).ok is False
    assert run("correct_output", [meta(), *op(1, 0, phase="fail", value=None, outcome="http_502")]).ok is False


def test_correct_output_holds_ops_to_http_200_and_prompts_json() -> None:
    """A success without HTTP 200 is none; judged from a run folder, an op's reference is
    prompts.json's for its prompt, so a history that rewrites value and expected together fails."""
    bad_status = op(1, 0)
    bad_status[1]["status"] = 502
    r = run("correct_output", [meta(), *bad_status])
    assert r.ok is False and "without HTTP 200" in r.message

    def judged(records: list[dict], prompts) -> C.CheckResult:
        return CHECKS["correct_output"](C.CheckInput(records, saved={"prompts": prompts}), {})

    good = op(1, 0)
    good[0]["prompt_index"] = 0
    assert judged([meta(), *good], [{"prompt": "p", "expected": "abc"}]).ok is True
    forged = op(1, 0, value="xyz", expected="xyz")
    forged[0]["prompt_index"] = 0
    r = judged([meta(), *forged], [{"prompt": "p", "expected": "abc"}])
    assert r.ok is False and "prompts.json" in r.message
    assert judged([meta(), *good], None).ok is False  # no prompts.json: nothing to compare with
    no_index = op(1, 0)
    assert judged([meta(), *no_index], [{"prompt": "p", "expected": "abc"}]).ok is False


def test_correct_output_compares_tokens_when_both_sides_carry_their_digest() -> None:
    """Found at concurrency 4: a reference whose tokens differed from every serving's. With both
    digests the text and the tokens must both match (a kept digest with garbled text fails; a
    different digest is wrong whatever the text); without both, the text decides; a history
    cannot bring its own reference digest (prompts.json's is the one)."""
    same = op(1, 0)
    same[0]["expected_ids"], same[1]["value_ids"] = "d1", "d1"
    assert run("correct_output", [meta(), *same]).ok is True
    garbled = op(1, 0, value="WRONG TEXT")  # the digest kept, the text garbled (a forged history)
    garbled[0]["expected_ids"], garbled[1]["value_ids"] = "d1", "d1"
    assert run("correct_output", [meta(), *garbled]).ok is False
    other = op(1, 0)
    other[0]["expected_ids"], other[1]["value_ids"] = "d1", "d2"
    r = run("correct_output", [meta(), *other])
    assert r.ok is False and "differ" in r.message
    one_side = op(1, 0, value="\ufffdeven", expected="")
    one_side[1]["value_ids"] = "d1"
    assert run("correct_output", [meta(), *one_side]).ok is False
    forged = op(1, 0, value="x", expected="")
    forged[0].update(prompt_index=0, expected_ids="d9")
    forged[1]["value_ids"] = "d9"
    r = CHECKS["correct_output"](C.CheckInput([meta(), *forged], saved={"prompts": [
        {"prompt": "p", "expected": "", "expected_ids": "d1"}]}), {})
    assert r.ok is False and "prompts.json" in r.message


def test_drained() -> None:
    good = [meta(), vllm("decode:0", "baseline"), vllm("decode:0", "final")]
    assert run("drained", good).ok is True
    waiting = [meta(), vllm("decode:0", "baseline"), vllm("decode:0", "final", num_requests_waiting=1)]
    r = run("drained", waiting)
    assert r.ok is False and "1 waiting" in r.message
    held = [meta(), vllm("prefill:0", "baseline"), vllm("prefill:0", "final", kv_cache_usage_perc=0.001)]
    r = run("drained", held)
    assert r.ok is False and "blocks still held" in r.message
    assert run("drained", [meta()]).ok is False  # no final probe of any vLLM node shows nothing


def test_drained_cannot_judge_a_node_whose_metrics_were_not_read() -> None:
    """A final probe whose /metrics scrape failed (metrics_ok 0, no gauges: seen in a real attach
    run) shows nothing held or freed: drained failed plainly, so a saved upstream run whose D held
    a request read as expected (its expectation names drained) with that probe broken. Now it
    cannot judge; what a readable probe shows held still fails."""
    def unread(node: str, pid: int = 1) -> dict:
        p = vllm(node, "final", pid=pid)
        p["counters"] = {"metrics_ok": 0, "cpu_s": 3.0}
        return p

    r = run("drained", [meta(), vllm("decode:0", "baseline"), unread("decode:0")])
    assert r.ok is False and r.message.startswith(C.UNDECIDED) and "lacks running/waiting" in r.message, r.message
    assert run("drained", [meta()]).message.startswith(C.UNDECIDED)  # no final probe at all
    held = [meta(), vllm("decode:0", "baseline"), unread("decode:0"), vllm("prefill:0", "baseline", pid=2),
            vllm("prefill:0", "final", pid=2, num_requests_waiting=1)]
    r = run("drained", held)
    assert r.ok is False and not r.message.startswith(C.UNDECIDED) and "1 waiting" in r.message, r.message
    # a baseline without its KV usage: a pooled node's usage at the end has nothing to be compared with
    no_base = vllm("decode:0", "baseline")
    del no_base["counters"]["kv_cache_usage_perc"]
    r = run("drained", [meta(), no_base, vllm("decode:0", "final", kv_cache_usage_perc=0.001)])
    assert r.ok is False and r.message.startswith(C.UNDECIDED) and "no baseline usage" in r.message, r.message


def test_drained_at_once_judges_the_samples_with_nothing_in_flight() -> None:
    """at_once: blocks held while no request is in flight (none ended within the bound) fail even
    when they are freed before the end; with no such sample nothing can be judged: it fails."""
    end = [vllm("decode:0", "baseline"), vllm("decode:0", "final", t=30.0)]
    idle = [vllm("decode:0", "sample", t=t) for t in (6.0, 8.0, 10.0)]
    held = [vllm("decode:0", "sample", t=t, kv_cache_usage_perc=0.01, num_requests_waiting=1) for t in (6.0, 8.0)]
    ops = op(1, 0) + op(2, 1)  # both ended by 1.1 s
    assert run("drained", [meta(), *ops, *end, *idle], {"at_once": 2.0}).ok is True
    r = run("drained", [meta(), *ops, *end, *held], {"at_once": 2.0})
    assert r.ok is False and "holding KV blocks" in r.message
    assert run("drained", [meta(), *ops, *end, *held]).ok is True  # without at_once: the end alone
    # a request in flight (or never ended) covers its samples: nothing to judge but the final probe
    stalled = op(3, 2, phase="info", value=None, outcome="stalled", elapsed_ms=40000.0)[:1]
    r = run("drained", [meta(), *ops, *stalled, *end, *held], {"at_once": 2.0})
    assert r.ok is False and "cannot tell" in r.message, r.message


def test_no_busy_wait() -> None:
    def samples(cpu_per_s: float, running: int = 0) -> list[dict]:
        return [vllm("decode:0", "sample", t=t, num_requests_waiting=1, num_requests_running=running,
                     cpu_s=10 + cpu_per_s * t) for t in (1.0, 1.5, 2.0, 2.5)]
    assert run("no_busy_wait", [meta(), *fault(0.5, 3.0), *samples(0.02)]).ok is True
    r = run("no_busy_wait", [meta(), *fault(0.5, 3.0), *samples(0.99)])
    assert r.ok is False and "0.99 of a core" in r.message and "no request running" in r.message
    # the same CPU while requests keep coming and going is not judged (the gauges miss short
    # requests; a P/D node spins for each one waiting for KV): with no quiet interval the check
    # cannot tell and fails, saying so
    busy_client = [o for i, t in enumerate((0.9, 1.4, 1.9, 2.4)) for o in op(i, t)]
    r = run("no_busy_wait", [meta(), *fault(0.5, 3.0), *samples(0.99), *busy_client])
    assert r.ok is False and "no quiet interval" in r.message
    # one request in flight all along (a client waiting on the stuck one) leaves it quiet
    stuck = op(9, 0.2, phase="info", value=None, outcome="stalled", elapsed_ms=30000)
    r = run("no_busy_wait", [meta(), *fault(0.5, 3.0), *samples(0.99), *stuck])
    assert r.ok is False and "0.99 of a core" in r.message
    # an op ending just inside the margin before an interval makes that interval not quiet
    late = op(8, 0.0, elapsed_ms=1200)  # ends at 1.2 s: in the first interval, and within the margin of the next
    r = run("no_busy_wait", [meta(), *fault(0.5, 3.0), *samples(0.99)[:3], *late])
    assert r.ok is False and "no quiet interval" in r.message
    assert run("no_busy_wait", [meta(), *fault(0.5, 3.0), *samples(0.99)], {"max_cpu": 1.0}).ok is True
    # a request the nodes served leaves them spinning ~1 s after it (vLLM's shm queue): an interval
    # that starts 0.7 s after one ended is not quiet (CI: D at 0.68 of a core there, a false alarm)
    served = op(7, 0.0, elapsed_ms=300)  # ends at 0.3 s: the 1.0-1.5 interval is in its tail
    r = run("no_busy_wait", [meta(), *fault(0.5, 3.0), *samples(0.99)[:2], *served])
    assert r.ok is False and "no quiet interval" in r.message
    # one the proxy failed before asking any node (P's bootstrap refused) leaves no such tail
    refused = [{**o, "error_phase": "bootstrap"} for o in op(7, 0.0, phase="fail", value=None, outcome="http_502",
                                                               elapsed_ms=300)]
    r = run("no_busy_wait", [meta(), *fault(0.5, 3.0), *samples(0.99)[:2], *refused])
    assert r.ok is False and "0.99 of a core" in r.message
    # a node computing (requests running) is busy for a reason; if every node was, the check cannot
    # tell, and says so by failing
    assert run("no_busy_wait", [meta(), *fault(0.5, 3.0), *samples(0.99, running=1)]).ok is False



def test_no_busy_wait_cannot_be_fooled_by_readings_at_one_instant_or_a_start_no_fault_made() -> None:
    """Attach mode's stand-in reads a pod's /proc every 2 s, so probes share a time; two readings at
    one instant that disagree on CPU, or a node whose processes 'started again' (counters.started)
    with no fault restarting it, would let a spinning interval go unjudged: both cannot be judged."""
    def spin(t: float, **c) -> dict:
        return vllm("decode:0", "sample", t=t, num_requests_waiting=1, cpu_s=10 + 0.99 * t, **c)

    honest = [spin(t, started=5) for t in (1.0, 1.5, 2.0, 2.5)]
    assert run("no_busy_wait", [meta(), *fault(0.5, 3.0), *honest]).ok is False  # 0.99 of a core
    hidden = [spin(1.0), {**spin(2.0), "t": T0 + 1.0}, spin(2.0), spin(2.5)]  # 2.0's reading stamped 1.0
    r = run("no_busy_wait", [meta(), *fault(0.5, 3.0), *hidden])
    assert r.ok is False and "disagree on its CPU time" in r.message, r.message
    restarted = [spin(t, started=int(t * 10)) for t in (1.0, 1.5, 2.0, 2.5)]  # a new 'start' every sample
    r = run("no_busy_wait", [meta(), *fault(0.5, 3.0), *restarted])
    assert r.ok is False and "no fault restarting it" in r.message, r.message
    # a restart fault of that node between the two samples: the pair is two processes, not judged
    restart = [{"type": "fault", "id": 1, "name": "restart", "phase": "start", "t": T0 + 1.6, "params": {"node": "decode:0"}},
               {"type": "fault", "id": 1, "name": "restart", "phase": "stop", "t": T0 + 1.9, "params": {"node": "decode:0"}}]
    new = [spin(1.0, started=1), spin(1.5, started=1), vllm("decode:0", "sample", t=2.0, num_requests_waiting=1,
                                                            cpu_s=0.5, started=2), vllm("decode:0", "sample", t=2.5,
                                                            num_requests_waiting=1, cpu_s=0.51, started=2)]
    r = run("no_busy_wait", [meta(), *fault(0.5, 3.0), *restart, *new])
    assert r.ok is False and "0.99 of a core" in r.message, r.message  # 1.0 -> 1.5 judged, the restart pair not

def test_no_busy_wait_speaks_for_every_node_or_cannot_judge() -> None:
    """A pass is a claim about every vLLM node: a node with no quiet interval of its own judged
    (its samples missing then, or its running-requests gauge unreadable, read before as 0 requests)
    while another node's were cannot be vouched for; a node a fault froze or killed is excused."""
    def samples(node: str, cpu_per_s: float, pid: int = 1, **c) -> list[dict]:
        return [vllm(node, "sample", t=t, pid=pid, num_requests_waiting=1, cpu_s=10 + cpu_per_s * t, **c)
                for t in (1.0, 1.5, 2.0, 2.5)]

    quiet_p = samples("prefill:0", 0.02, pid=2)
    assert run("no_busy_wait", [meta(), *fault(0.5, 3.0), *quiet_p, *samples("decode:0", 0.02)]).ok is True
    unread = [{**p, "counters": {k: v for k, v in p["counters"].items() if k != "num_requests_running"}}
              for p in samples("decode:0", 0.99)]  # D spinning, its metrics read failing
    r = run("no_busy_wait", [meta(), *fault(0.5, 3.0), *quiet_p, *unread])
    assert r.ok is False and "decode:0" in r.message and "unknown" in r.message, r.message
    one_sample = samples("decode:0", 0.99)[:1]  # D's probes did not answer during the fault
    r = run("no_busy_wait", [meta(), *fault(0.5, 3.0), *quiet_p, *one_sample])
    assert r.ok is False and "decode:0" in r.message and "unknown" in r.message, r.message
    frozen = [{**rec, "params": {"node": "decode:0"}} for rec in fault(0.5, 3.0)]  # the fault froze D
    assert run("no_busy_wait", [meta(), *frozen, *quiet_p, *one_sample]).ok is True


def test_fail_fast() -> None:
    def run_as(m: dict, *ops: list[dict]):
        return run("fail_fast", [m, *[r for o in ops for r in o]])

    hardened = meta(target="hardened", topology={"kv_load_failure_policy": "fail", "kv_load_timeout": 2.0})
    fast = op(2, 1, phase="fail", value=None, outcome="http_502", elapsed_ms=2500.0)
    assert run_as(hardened, op(1, 0), fast).ok is True  # within kv_load_timeout 2 s + the 2 s margin
    slow = op(2, 1, phase="fail", value=None, outcome="http_502", elapsed_ms=4500.0)
    r = run_as(hardened, op(1, 0), slow)
    assert r.ok is False and "longer than 4 s" in r.message
    # a bound the scenario declares for a target (measured) replaces the default
    assert run("fail_fast", [hardened, *op(1, 0), *slow], {"fail_within": {"hardened": 5.0}}).ok is True
    # upstream promises no load deadline: the scenario's deadline + tolerance (12 s here) bounds it
    assert run_as(meta(), op(1, 0), fast).ok is True
    late = op(2, 1, phase="fail", value=None, outcome="http_502", elapsed_ms=12500.0)
    r = run_as(meta(), op(1, 0), late)
    assert r.ok is False and "deadline + tolerance" in r.message
    r = run_as(meta(deadline_ms=0, tolerance_ms=0), op(1, 0), fast)
    assert r.ok is False and "no bound declared for target upstream" in r.message
    assert run("fail_fast", [meta(), *op(1, 0), *fast], {"fail_within": {"upstream": 3.0}}).ok is True
    assert run_as(meta(), op(1, 0)).ok is True  # nothing failed
    # a hang made visible: the proxy's own 504 at its timeout, or the client giving up
    r = run_as(hardened, op(3, 1, phase="fail", value=None, outcome="http_504", elapsed_ms=1000.0))
    assert r.ok is False and "504" in r.message
    hung = [meta(), *op(1, 0, phase="info", value=None, outcome="stalled", elapsed_ms=30000)]
    assert run("fail_fast", hung).ok is False
    # timed from when D was asked where the proxy says (decode_ms): an op sent into a partition
    # reached P 12.6 s later (TCP's retransmission after the heal), D failed its load at once
    def failed_load(elapsed_ms: float, error_phase: str, decode_ms: float) -> list[dict]:
        o = op(4, 1, phase="fail", value=None, outcome="http_502", elapsed_ms=elapsed_ms)
        o[1].update(error_phase=error_phase, decode_ms=decode_ms)
        return o

    assert run_as(hardened, failed_load(13157.0, "decode", 90.0)).ok is True  # reached P late, failed at once
    assert run_as(hardened, failed_load(13157.0, "decode", 4500.0)).ok is False  # slow at D
    # only for a failure at D, and never longer than the op itself (else the whole op is timed)
    assert run_as(hardened, failed_load(13157.0, "prefill", 90.0)).ok is False
    assert run_as(hardened, failed_load(4500.0, "decode", 9000.0)).ok is False
    # recompute: a failure after D was asked fails; one before (P's bootstrap) is another check's
    recompute = meta(topology={"kv_load_failure_policy": "recompute"})
    assert run_as(recompute, op(1, 0, phase="fail", value=None, outcome="http_500")).ok is False
    before_d = op(1, 0, phase="fail", value=None, outcome="http_502")
    before_d[1]["error_phase"] = "bootstrap"
    assert run_as(recompute, before_d).ok is True


def test_kv_transferred() -> None:
    hist = [meta(), *op(1, 0), vllm("decode:0", "baseline", **{EXT: 0}), vllm("decode:0", "final", **{EXT: 197})]
    assert run("kv_transferred", hist).ok is True
    local = [meta(), *op(1, 0), vllm("decode:0", "baseline", **{EXT: 0}), vllm("decode:0", "final", **{EXT: 0})]
    r = run("kv_transferred", local)
    assert r.ok is False and "no KV transfer" in r.message



def test_kv_transferred_cannot_judge_without_both_readings_of_the_counter() -> None:
    """The counter is cumulative over a pooled node's earlier runs: a baseline without it once read
    as 0, so a D that pulled nothing in this run passed on what earlier runs had pulled."""
    no_base = [meta(), *op(1, 0), vllm("decode:0", "baseline"), vllm("decode:0", "final", **{EXT: 3189})]
    r = run("kv_transferred", no_base)
    assert r.ok is False and r.message.startswith(C.UNDECIDED) and "no baseline reading" in r.message, r.message
    no_end = [meta(), *op(1, 0), vllm("decode:0", "baseline", **{EXT: 3189}), vllm("decode:0", "final")]
    r = run("kv_transferred", no_end)
    assert r.ok is False and r.message.startswith(C.UNDECIDED) and "no end reading" in r.message, r.message


def test_no_busy_wait_is_not_applicable_without_faults(tmp_path) -> None:
    from harness.schema import load_scenario

    f = tmp_path / "b.yaml"
    f.write_text("name: b\nfamily: pd\nworkload: {duration: 5s}\nexpect: {upstream: pass, hardened: pass}\n"
                 "triggers: {none: baseline}\n")
    sc = load_scenario(f)
    assert "no_busy_wait" in FAM.not_applicable(sc, "upstream")
    f.write_text("name: b\nfamily: pd\nworkload: {duration: 5s}\nexpect: {upstream: pass, hardened: pass}\n"
                 "faults:\n  - {type: stop, node: 'prefill:0', at: 1s, for: 1s}\n"
                 "triggers: [{type: ops_in_window, fault: 0}]\n")
    na = FAM.not_applicable(load_scenario(f), "upstream")
    assert "no_busy_wait" not in na and "reset_truth" in na  # reset_truth: only where the workload resets
    f.write_text("name: b\nfamily: pd\nworkload: {duration: 5s, resets: [{at: 2s}]}\n"
                 "expect: {upstream: pass, hardened: pass}\ntriggers: [{type: ops_completed, f: reset}]\n")
    assert "reset_truth" not in FAM.not_applicable(load_scenario(f), "upstream")


def reset_op(i: int, t: float, *, phase="ok", outcome="ok", elapsed_ms=50.0) -> list[dict]:
    return [{"type": "op", "id": i, "process": -1, "f": "reset", "phase": "invoke", "t": T0 + t, "node": "decode"},
            {"type": "op", "id": i, "process": -1, "f": "reset", "phase": phase, "t": T0 + t + elapsed_ms / 1000,
             "value": phase == "ok", "outcome": outcome, "elapsed_ms": elapsed_ms, "status": 200, "node": "decode"}]


def master(t: float, keys, *, pid: int = 9, when: str = "sample", ok: int = 1) -> dict:
    counters = {"metrics_ok": ok} if keys is None else {"master_key_count": keys, "metrics_ok": ok}
    return {"type": "probe", "node": "store", "kind": "mooncake-master", "when": when, "pid": pid, "t": T0 + t,
            "counters": counters, "alive": True}


def window(name: str, start: float | None, stop: float, node: str = "store") -> list[dict]:
    out = [] if start is None else [{"type": "fault", "id": 0, "name": name, "phase": "start", "t": T0 + start,
                                     "params": {"node": node}}]
    return out + [
        {"type": "fault", "id": 0, "name": name, "phase": "stop", "t": T0 + stop, "params": {"node": node}}]


def test_reset_truth_holds_a_reported_success_to_the_masters_key_count() -> None:
    good = [meta(), *op(1, 0), master(0.5, 6), *reset_op(2, 1.0), master(1.5, 3), master(2.5, 0), *op(3, 3.0)]
    assert run("reset_truth", good).ok is True  # judged by the sample >= 1 s after (1.5 s may predate it)
    # upstream's hole: the reset said success and the master kept its keys
    r = run("reset_truth", [meta(), *op(1, 0), master(0.5, 6), *reset_op(2, 1.0), master(2.5, 6)])
    assert r.ok is False and "still held 6 keys" in r.message
    # no (readable) sample of the master after the reset: cannot judge, fails
    for late in ([master(2.5, None)], [master(2.5, 0, ok=0)], []):
        r = run("reset_truth", [meta(), *op(1, 0), master(0.5, 6), *reset_op(2, 1.0), *late])
        assert r.ok is False and "unknown" in r.message
    # a request (or another reset) in flight between the reset and the count: cannot judge, fails
    r = run("reset_truth", [meta(), master(0.5, 6), *reset_op(2, 1.0), *op(3, 1.2), master(2.5, 0)])
    assert r.ok is False and "in flight" in r.message
    r = run("reset_truth", [meta(), master(0.5, 6), *op(3, 0.9, elapsed_ms=400.0), *reset_op(2, 1.0), master(2.5, 1)])
    assert r.ok is False and "in flight" in r.message  # not a false "still held": its puts may land after
    other = reset_op(3, 1.1, phase="fail", outcome="reset_refused")
    for x in other:
        x["node"] = "server"
    r = run("reset_truth", [meta(), master(0.5, 6), *reset_op(2, 1.0), *other, master(2.5, 0)])
    assert r.ok is False and "in flight" in r.message
    # no store master in the run at all
    r = run("reset_truth", [meta(), *reset_op(2, 1.0)])
    assert r.ok is False and "no store master" in r.message
    # refused or hung resets claim nothing (bounded_return and failures_explained judge them)
    refused = reset_op(2, 1.0, phase="fail", outcome="reset_refused")
    assert run("reset_truth", [meta(), master(0.5, 6), *refused, master(2.5, 6)]).ok is True
    # a claimed success without a finite time is undecidable
    nan = reset_op(2, 1.0)
    nan[1]["t"] = float("nan")
    r = run("reset_truth", [meta(), master(0.5, 6), *nan, master(2.5, 0)])
    assert r.ok is False and "finite" in r.message
    # success while the master was dead or restarted is false, whatever the restarted master counts
    for name, node in (("kill", "store"), ("restart", "store"), ("node_down", "store"), ("kill", "all")):
        r = run("reset_truth", [meta(), master(0.5, 6), *window(name, 0.8, 3.0, node), *reset_op(2, 1.0),
                                master(3.5, 0, pid=10, when="baseline"), master(4.0, 0, pid=10)])
        assert r.ok is False and f"while the store master was down ({name} window)" in r.message, (name, node)
    r = run("reset_truth", [meta(), master(0.5, 6), *window("kill", None, 3.0), *reset_op(2, 1.0), master(4.0, 0)])
    assert r.ok is False and "down (kill window)" in r.message  # a window without its start record covers from 0
    r = run("reset_truth", [meta(), master(0.5, 6), *window("kill", 0.8, 3.0, "prefill:0"), *reset_op(2, 1.0),
                            master(3.5, 0)])
    assert r.ok is True
    # a master restarted (another process) between the reset and its count: nothing to compare
    r = run("reset_truth", [meta(), master(0.5, 6), *reset_op(2, 1.0), master(1.6, 0, pid=10, when="baseline"),
                            master(2.5, 0, pid=10)])
    assert r.ok is False and "not from the master process" in r.message
    # a key count that is not a count; a sample with no time is ignored, not sorted in
    r = run("reset_truth", [meta(), master(0.5, 6), *reset_op(2, 1.0), master(2.5, 0.9)])
    assert r.ok is False and "not a count" in r.message
    no_t = master(1.2, 0)
    no_t["t"] = float("nan")
    r = run("reset_truth", [meta(), master(0.5, 6), *reset_op(2, 1.0), no_t, master(2.5, 6)])
    assert r.ok is False and "still held 6 keys" in r.message
    # a history without any reset cannot be judged (scenarios without resets never run it)
    assert run("reset_truth", [meta(), *op(1, 0)]).ok is False


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

        self.counters: dict = {}  # the proxy's stats counters, as the test moves them

    def control(self, role: str, cmd: str, timeout_ms: int = 2000, **fields) -> dict:
        if cmd == "stats":
            return {"counters": json.loads(json.dumps(self.counters))}
        self.calls.append((role, cmd, fields))
        return {}


@pytest.mark.parametrize("name, params, first", [
    ("hold_after_prefill", {"count": 2, "seconds": "3s"}, ("proxy", "hold", {"phase": "after_prefill", "count": 2,
                                                                           "seconds": 3.0})),
    ("abort_while_decode_waits", {"count": 1, "after": "250ms"}, ("proxy", "abort", {"phase": "decode_wait",
                                                                                  "count": 1, "after_ms": 250})),
    ("abort_after_prefill", {"count": 3}, ("proxy", "abort", {"phase": "after_prefill", "count": 3})),
    ("bad_transfer_params", {"count": 1}, ("proxy", "bad_params", {"count": 1,
                                                                   "drop": ["transfer_id", "remote_bootstrap_addr"]})),
])
def test_proxy_hook_faults_set_and_clear_their_hook(name, params, first) -> None:
    from faults.base import load_registry

    cls = load_registry("pd")[name]
    ctx = Recorder()
    fault = cls(cls.Params(**params), ctx)
    key = next(iter(fault.required_effect()))  # the proxy counter its window must raise
    ctx.counters = {"aborted_by": {"decode_wait": 4, "after_prefill": 2}, "held": 1, "bad_params": 0}
    fault.start()
    assert ctx.calls == [first]
    head, _, leaf = key.rpartition(".")
    where = ctx.counters[head] if head else ctx.counters
    where[leaf] = where.get(leaf, 0) + 2  # two requests took the hook during the window
    fault.stop()
    fault.stop()  # healed once
    assert ctx.calls[-1][:2] == ("proxy", "clear") and len([c for c in ctx.calls if c[1] == "clear"]) == 1
    assert fault.effect()[key] == 2  # counted from the proxy's own counters, before and after


class SlowStats(Recorder):
    """The proxy's control channel misses ``misses`` stats reads at the heal (CI once saw a read
    time out on a loaded 2-core machine while the proxy still served and then took the clear)."""

    def __init__(self, misses: int) -> None:
        super().__init__()
        self.misses, self.started = misses, False

    def control(self, role: str, cmd: str, timeout_ms: int = 2000, **fields) -> dict:
        if cmd == "stats" and self.started and self.misses > 0:
            self.misses -= 1
            self.calls.append((role, "stats-missed", {"timeout_ms": timeout_ms}))
            from nodekit.control import ControlError
            raise ControlError(f"control stats: no answer within {timeout_ms} ms")
        return super().control(role, cmd, timeout_ms=timeout_ms, **fields)


def _abort_window(ctx: Recorder):  # noqa: ANN202
    from faults.base import load_registry

    cls = load_registry("pd")["abort_while_decode_waits"]
    fault = cls(cls.Params(count=40, after="25ms"), ctx)
    ctx.counters = {"aborted_by": {"decode_wait": 4}}
    fault.start()
    ctx.started = True
    ctx.counters["aborted_by"]["decode_wait"] += 23  # 23 requests took the hook during the window
    fault.stop()
    return fault


def test_a_proxy_hook_reads_its_effect_again_after_the_clear() -> None:
    """One missed read at the heal is no harness error: the counters are read again after the
    clear (they cannot grow once the hook is gone), with a longer wait."""
    ctx = SlowStats(misses=1)
    fault = _abort_window(ctx)
    assert [c[1] for c in ctx.calls[1:]] == ["stats-missed", "clear"]
    assert fault.effect() == {"aborted_by.decode_wait": 23, "abort_missed": 0}


def test_a_proxy_hook_whose_counts_cannot_be_read_names_why() -> None:
    """Two missed reads leave the effect unknown: effect() raises with the reason, which the runner
    journals with fault_effect (the check then fails the run naming it, never passes it)."""
    from families.pd.faults import HarnessReadError

    ctx = SlowStats(misses=2)
    fault = _abort_window(ctx)
    assert [c[1] for c in ctx.calls[1:]] == ["stats-missed", "clear", "stats-missed"]
    assert ctx.calls[-1][2]["timeout_ms"] > ctx.calls[1][2]["timeout_ms"]
    with pytest.raises(HarnessReadError, match="no answer within"):
        fault.effect()


def test_a_reference_is_kept_only_when_two_computations_agree() -> None:
    """A fresh D once answered a reference prompt with other tokens than every later serving: one
    computation is not a reference. Two agreeing answers are; the third decides a disagreement;
    three different answers are an error, never a reference."""
    from families.pd.workload import PrepareError, agreed_reference

    def answers(*outs):
        it = iter(outs)
        return lambda: next(it)

    assert agreed_reference(answers(("a", "d1"), ("a", "d1"))) == (("a", "d1"), False)
    assert agreed_reference(answers(("", "d0"), ("a", "d1"), ("a", "d1"))) == (("a", "d1"), True)
    assert agreed_reference(answers(("a", "d1"), ("b", "d2"), ("a", "d1"))) == (("a", "d1"), True)
    assert agreed_reference(answers(("a", "d1"), ("a", "d2"), ("a", "d2")))[0] == ("a", "d2")  # tokens count
    with pytest.raises(PrepareError, match="3 different outputs"):
        agreed_reference(answers(("a", "1"), ("b", "2"), ("c", "3")))
