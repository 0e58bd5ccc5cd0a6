"""The pd family's checks (generic ones are in harness/checks.py)."""

from __future__ import annotations

import math

from pydantic import Field

from faults.base import Duration
from harness.checks import (CheckInput, CheckOptions, CheckResult, _first, _r, final_too_early, finite, op_elapsed_ms,
                            retired_pids, same_output, undecided)

from harness.triggers import Fired, TriggerParams

from .family import FAMILY
from .metrics import gauge as _gauge

check = FAMILY.checks.check


@check("correct_output")
def correct_output(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """Every HTTP 200 carries exactly the reference output of its prompt (the greedy output of the
    same model without disaggregation; its tokens when both the reference and the answer carry
    their digest, else its text): a wrong KV transfer shows here. An op that reads as a
    success without HTTP 200 is no success; judged from a run folder, each op's reference is the
    one prompts.json holds for its prompt (a history cannot bring its own)."""
    ok_ops = [o for o in inp.ops if o.get("phase") == "ok"]
    not_200 = [o for o in ok_ops if o.get("status") != 200]
    if not_200:
        o = not_200[0]
        return _r(False, f"{len(not_200)} ops read as successes without HTTP 200; first: op {o['id']} "
                         f"(status {o.get('status')!r})", not_200=_first([x["id"] for x in not_200]))
    if inp.saved is not None:
        prompts = inp.saved.get("prompts")
        if not prompts:
            return undecided("no readable prompts.json in the run folder: no reference to compare the outputs with")
        forged = [o for o in inp.ops if not (isinstance(o.get("prompt_index"), int)
                                             and 0 <= o["prompt_index"] < len(prompts)
                                             and o.get("expected") == prompts[o["prompt_index"]].get("expected")
                                             and o.get("expected_ids") == prompts[o["prompt_index"]].get("expected_ids"))]
        if forged:
            return _r(False, f"{len(forged)} ops expect another text than prompts.json's reference for their "
                             f"prompt (or name no prompt of it); first: op {forged[0]['id']}",
                      forged=_first([o["id"] for o in forged]))
    wrong = [o for o in ok_ops if not same_output(o)]
    if wrong:
        return _r(False, f"{len(wrong)} of {len(ok_ops)} completions differ from the reference; first: op "
                         f"{wrong[0]['id']}", wrong=_first([o["id"] for o in wrong]))
    if not ok_ops:
        return _r(False, "no completion succeeded: nothing to compare with the reference")
    by_ids = sum(1 for o in ok_ops if o.get("value_ids") and o.get("expected_ids"))
    return _r(True, f"all {len(ok_ops)} completions equal the reference output ({by_ids} by their tokens, "
                    f"{len(ok_ops) - by_ids} by their text)", by_tokens=by_ids)



def _vllm_probes(inp: CheckInput, when: str) -> list[dict]:
    return [p for p in inp.probes if p.get("kind") == "vllm" and p.get("when") == when]


class DrainedOptions(CheckOptions):
    at_once: Duration | None = Field(None, description="also during the run, every vLLM node holds no KV block "
                                     "and no request whenever no request was in flight or ended within this "
                                     "long (keep it below P's abort timeout): what a node held is freed at "
                                     "once, not when a timeout runs out")


@check("drained", DrainedOptions)
def drained(inp: CheckInput, opts: dict) -> CheckResult:
    """After the run (the topology waits a bounded time for it), every vLLM node has no request
    running or waiting (none stuck in WAITING_FOR_REMOTE_KVS) and its KV cache usage is back to
    its baseline: no leaked blocks, on P and on D. That wait outlasts P's abort timeout, so it
    shows what a node keeps for good. With ``at_once: S`` the scenario asserts more: every sample
    taken during the run when no request was in flight and none ended within S seconds shows the
    node holding nothing, so blocks kept until a timeout frees them fail too (and a
    run with no such sample cannot be judged: it fails). A final probe taken before the last fault
    healed shows a node under the fault, not after the run: it cannot judge."""
    finals = _vllm_probes(inp, "final")
    if not finals:
        return undecided("no final probe of any vLLM node: nothing shows whether they drained")
    early = final_too_early(inp, finals)  # a probe before the last heal shows a node under a fault
    if early:
        return undecided(early)
    gone = retired_pids(inp)
    unseen = [b for b in _vllm_probes(inp, "baseline")
              if b.get("pid") not in gone and not any(f.get("pid") == b.get("pid") for f in finals)]
    if unseen:
        return _r(False, f"{unseen[0].get('node')} (pid {unseen[0].get('pid')}) started as a vLLM node but has no "
                         f"final vLLM probe and was not stopped: nothing shows it drained")
    base = _base_usage(inp)
    problems, seen, unread = [], [], []
    for p in finals:
        c = p.get("counters") or {}
        running, waiting = _gauge(c, "num_requests_running"), _gauge(c, "num_requests_waiting")
        usage = _gauge(c, "kv_cache_usage_perc")
        if running is None or waiting is None or usage is None:
            # its /metrics scrape failed at the end (metrics_ok 0: seen in a real attach run): what
            # it held is unknown, which is no failure an expectation naming drained could mean
            unread.append(f"{p.get('node')} (pid {p.get('pid')}): its final probe lacks running/waiting/KV usage")
            continue
        seen.append(p.get("node"))
        if running or waiting:
            problems.append(f"{p.get('node')}: {running:g} running, {waiting:g} waiting at the end")
        start = base.get(p.get("pid"))
        if usage > (start or 0.0) + 1e-6:
            if start is None:
                unread.append(f"{p.get('node')} (pid {p.get('pid')}): KV cache usage {usage:.4f} at the end and no "
                              f"baseline usage to compare it with (a pooled node keeps what earlier runs left)")
            else:
                problems.append(f"{p.get('node')}: KV cache usage {usage:.4f} at the end, {start:.4f} at start "
                                f"(blocks still held)")
    if problems:  # what the readable probes show held is a failure whatever the others could not show
        return _r(False, "; ".join(problems[:3]), problems=problems)
    if unread:
        return undecided("; ".join(unread[:3]))
    at_once = opts.get("at_once")
    if at_once is None:
        return _r(True, f"{', '.join(str(s) for s in seen)}: nothing running or waiting, KV usage back to baseline")
    return _drained_at_once(inp, float(at_once), base)


def _base_usage(inp: CheckInput) -> dict:
    """{pid: KV cache usage at its baseline probe, None when the probe lacks it} of the vLLM nodes."""
    return {b.get("pid"): _gauge(b.get("counters") or {}, "kv_cache_usage_perc")
            for b in _vllm_probes(inp, "baseline")}


def _drained_at_once(inp: CheckInput, within: float, base: dict) -> CheckResult:
    busy = [(o["t_invoke"] - QUIET_MARGIN_S, o["t_complete"] + within if finite(o.get("t_complete")) else math.inf)
            for o in inp.all_ops if finite(o.get("t_invoke"))]
    idle, held = 0, []
    for p in (x for x in inp.probes if x.get("kind") == "vllm" and x.get("when") == "sample"):
        t = p.get("t")
        if not finite(t) or any(a <= t <= b for a, b in busy):
            continue
        c = p.get("counters") or {}
        usage = _gauge(c, "kv_cache_usage_perc")
        running, waiting = _gauge(c, "num_requests_running"), _gauge(c, "num_requests_waiting")
        if usage is None or running is None or waiting is None:
            return undecided(f"at_once: a sample of {p.get('node')} lacks running/waiting/KV usage")
        idle += 1
        start = base.get(p.get("pid"))
        if start is None and usage > 1e-6 and not (running or waiting):
            return undecided(f"at_once: {p.get('node')} (pid {p.get('pid')}) shows KV cache usage {usage:.4f} and has no "
                             f"baseline usage to compare it with")
        if usage > (start or 0.0) + 1e-6 or running or waiting:
            ended = [o["t_complete"] for o in inp.all_ops if finite(o.get("t_complete")) and o["t_complete"] <= t]
            since = t - max(ended) if ended else t - (inp.meta.get("t0") or t)
            held.append((since, str(p.get("node"))))
    if idle == 0:
        return undecided(f"at_once {within:g} s: no sample of a vLLM node was taken with no request in flight and "
                         f"none ended within {within:g} s: cannot tell whether the nodes free what they hold at once")
    if held:
        since, node = max(held)
        return _r(False, f"{len(held)} of {idle} samples with no request in flight (none ended within {within:g} s) "
                         f"show a node holding KV blocks or requests; {node} still {since:.1f} s after the last "
                         f"request ended", held=len(held), idle=idle)
    return _r(True, f"nothing held in any of {idle} samples with no request in flight (none ended within "
                    f"{within:g} s), nor at the end", idle=idle)


QUIET_MARGIN_S = 0.5  # an op that starts or ends this close to an interval makes it not quiet
# A vLLM node keeps burning a core after a request it served has ended: its engine core spins on
# the worker's shared-memory queue for 1 s after every read (vLLM's shm_broadcast SpinCondition;
# measured on CI journals: ~1 core up to 0.7 s after the client's answer, 0.5-0.7 of a core up to
# ~1.2 s). So an op that reached the nodes makes the NODE_TAIL_S after its end not quiet; one that
# failed before any node was asked (error phase bootstrap: P's bootstrap did not answer; proxy: a
# bad body) leaves only QUIET_MARGIN_S.
NODE_TAIL_S = 1.5
NO_NODE_PHASES = ("bootstrap", "proxy")


def _tail(o: dict) -> float:
    if o.get("phase") == "fail" and o.get("error_phase") in NO_NODE_PHASES:
        return QUIET_MARGIN_S
    return NODE_TAIL_S


def _quiet(ops: list[dict], a_t: float, b_t: float) -> bool:
    """No op started between ``a_t - QUIET_MARGIN_S`` and ``b_t``, and none ended between ``a_t``
    less its tail (``_tail``) and ``b_t``: whatever a node burned then was not serving a request
    that came or went (requests here take ~0.1 s), so it was waiting or spinning. (vLLM's
    running/waiting gauges, sampled every 0.5 s, miss requests shorter than that; and a P/D node
    spins its engine loop for every request that waits for KV, so under steady traffic a node is
    never idle in the gauges' sense.)"""
    for o in ops:
        t = o.get("t_invoke")
        if t is not None and a_t - QUIET_MARGIN_S <= t <= b_t:
            return False
        t = o.get("t_complete")
        if t is not None and a_t - _tail(o) <= t <= b_t:
            return False
    return True


# A node that only waits sleeps: the hardened nodes measured at most 0.18 of a core in any judged
# interval of the P/D suite (P keeping blocks through a partition, its transfer engine's threads
# included; 0.05-0.10 elsewhere), upstream's spinning nodes 1.4-1.7 (issue 30, item 14: 0.5 let a
# node burn ten times the claim)
NO_BUSY_WAIT_MAX_CPU = 0.3


class NoBusyWaitOptions(CheckOptions):
    max_cpu: float | None = Field(None, gt=0, le=64, description="most of a core a waiting node may burn "
                                  "during a fault (default 0.3)")


RESTARTING = ("restart", "kill", "node_down")  # faults after which a node's processes are new ones


def _names(window: dict, node: str) -> bool:
    """Whether the fault of ``window`` acts on ``node`` (its ``node`` parameter: a role, ``ROLE:*``, ``all``)."""
    spec = str((window.get("params") or {}).get("node", ""))
    return spec == "all" or spec == node or (spec.endswith(":*") and node.startswith(spec[:-1]))


@check("no_busy_wait", NoBusyWaitOptions)
def no_busy_wait(inp: CheckInput, opts: dict) -> CheckResult:
    """While a fault is active and the client is quiet (no request starts or ends; e.g. every
    client waits on a request a dead or frozen peer holds), no vLLM node that has no request
    running burns more than ``max_cpu`` of a core (default 0.3, :data:`NO_BUSY_WAIT_MAX_CPU`) between two samples: a node
    waiting on a peer, or keeping blocks for one, must sleep. A scenario whose faults leave no
    quiet interval cannot be judged: that fails; such a scenario gives its workload a pause inside
    the fault window (``workload: {pauses: [...]}``), or disables the check when nothing waits."""
    limit = float(opts.get("max_cpu") or NO_BUSY_WAIT_MAX_CPU)
    samples = sorted((p for p in inp.probes if p.get("kind") == "vllm" and p.get("when") == "sample"),
                     key=lambda p: p.get("t", 0))
    if not inp.windows:
        return _r(False, "no fault window: nothing was waited on")
    by_node: dict = {}
    for p in samples:
        by_node.setdefault((p.get("node"), p.get("pid")), []).append(p)
    worst, judged, quiet_s, unread = None, 0, 0.0, 0
    judged_nodes: set = set()
    for (node, _), ps in by_node.items():
        for a, b in zip(ps, ps[1:]):
            in_fault = any(w["start"] <= a["t"] and b["t"] <= w["stop"] for w in inp.windows)
            gauges = [_gauge(x.get("counters") or {}, "num_requests_running") for x in (a, b)]
            running = max(g or 0 for g in gauges)
            cpu_a, cpu_b = (a.get("counters") or {}).get("cpu_s"), (b.get("counters") or {}).get("cpu_s")
            if not finite(cpu_a) or not finite(cpu_b):
                if in_fault:
                    return undecided(f"{node}: a sample during a fault has no CPU time ({cpu_a!r} -> {cpu_b!r}): "
                                     f"whether it waited quietly is unknown")
                continue
            started = [(x.get("counters") or {}).get("started") for x in (a, b)]
            if started[0] != started[1]:
                # a node whose processes started again (a pod's container the kubelet restarted: the
                # same pid, its CPU counted anew): not one series, and only where a fault restarted it
                if not any(w.get("name") in RESTARTING and _names(w, node) and w["start"] <= b["t"]
                           and a["t"] <= w["stop"] for w in inp.windows):
                    return undecided(f"{node}: its processes started again between two samples ({a['t']:.2f} -> "
                                     f"{b['t']:.2f} s) with no fault restarting it then")
                continue
            if b["t"] <= a["t"] and cpu_b != cpu_a:
                return undecided(f"{node}: two readings at one instant ({a['t']:.2f} s) disagree on its CPU time "
                                 f"({cpu_a!r}, {cpu_b!r})")
            if cpu_b < cpu_a:
                return undecided(f"{node}: its CPU time went backwards ({cpu_a!r} -> {cpu_b!r}): the samples are not "
                                 f"one process's")
            if not in_fault or running or b["t"] <= a["t"] \
                    or not _quiet(inp.all_ops, a["t"], b["t"]):
                continue
            if None in gauges:  # whether it served a request then is unknown: not an interval to judge by
                unread += 1
                continue
            judged += 1
            judged_nodes.add(node)
            quiet_s += b["t"] - a["t"]
            frac = (cpu_b - cpu_a) / (b["t"] - a["t"])
            if worst is None or frac > worst[0]:
                worst = (frac, node)
    if judged == 0:
        return undecided("no quiet interval during a fault (requests kept starting or ending); "
                         "give the workload a pause in the fault window (workload: {pauses: [...]}) or disable "
                         "no_busy_wait for this scenario")
    if worst[0] > limit:
        return _r(False, f"{worst[1]} burned {worst[0]:.2f} of a core during a fault with no request running or "
                         f"coming (limit {limit:g})", worst_cpu=round(worst[0], 3))
    # a pass speaks for every vLLM node: one with no judged interval while others had some was not
    # seen waiting (its samples missing or unreadable then), unless a fault froze, stopped or killed it
    unseen = sorted({str(n) for n, _ in by_node} - {str(n) for n in judged_nodes}
                    - {str(n) for n, _ in by_node if any(_names(w, str(n)) for w in inp.windows)})
    if unseen:
        return undecided(f"{', '.join(unseen)}: no quiet interval of its own during a fault was judged "
                         f"({judged} of the other nodes' were; {unread} with a running-requests gauge unreadable): "
                         f"whether it waited quietly is unknown")
    return _r(True, f"at most {worst[0]:.2f} of a core when nothing ran or came during faults ({judged} "
                    f"intervals, {quiet_s:.1f} s node-time" + (f"; {unread} with a gauge unreadable, not judged"
                                                               if unread else "") + ")",
              worst_cpu=round(worst[0], 3))


@check("no_write_after_free")
def no_write_after_free(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """No KV write lands in a decode node's blocks after vLLM freed them from a load that failed or
    was aborted (P's late write: Mooncake is push, so only D's memory shows it; correct_output sees
    only final text). The watcher (families/pd/node_instruments/pdchaos_waf) in D's worker fills
    such blocks with a NaN pattern when they are freed and looks at them until vLLM hands them out
    again; its counts reach the probes (``waf_*``). Judged on every decode node's counts between
    its first and last probe of the run; a decode node the watcher does not report from, or whose
    counts are missing, unreadable or show the watcher failing, cannot be judged (it fails).
    Opt-in per scenario (``checks: {no_write_after_free: {enabled: true}}``): the CPU profile's
    TP=1 Mooncake decode nodes run the watcher; others (NPUs, TP=2, the store connector) do not."""
    probes = sorted((p for p in inp.probes if p.get("kind") == "vllm" and str(p.get("node", "")).startswith("decode")
                     and finite(p.get("t"))), key=lambda p: p["t"])
    if not probes:
        return undecided("no probe of a decode node")
    by_pid: dict = {}
    for p in probes:
        by_pid.setdefault((p.get("node"), p.get("pid")), []).append(p)
    freed = 0
    for (node, pid), ps in by_pid.items():
        first, last = ps[0].get("counters") or {}, ps[-1].get("counters") or {}
        if len(ps) < 2:
            return undecided(f"{node} (pid {pid}): one probe only: nothing to compare")
        for c, which in ((first, "first"), (last, "last")):
            if c.get("waf_watching") != 1:
                return undecided(f"{node} (pid {pid}) does not run the write-after-free watcher (its {which} probe): "
                                 f"only the CPU profile's TP=1 Mooncake decode nodes do")
            if c.get("waf_ok") != 1 or not isinstance(c.get("waf_late_writes"), int) \
                    or not isinstance(c.get("waf_tensors"), int) or c.get("waf_tensors", 0) < 1:
                return undecided(f"{node} (pid {pid}): the watcher's counts are missing or it holds no KV tensor "
                                 f"({which} probe): it did not load in the worker")
        if last.get("waf_errors", 0) > first.get("waf_errors", 0):
            return undecided(f"{node} (pid {pid}): the watcher failed {last['waf_errors'] - first['waf_errors']} "
                             f"time(s) during the run")
        late = last["waf_late_writes"] - first["waf_late_writes"]
        if late < 0:
            return undecided(f"{node} (pid {pid}): its late-write count went backwards: not one watcher's counts")
        if late:
            return _r(False, f"{node}: {late} block(s) written after vLLM freed them from a failed or aborted load "
                             f"(of {last.get('waf_poisoned', 0) - first.get('waf_poisoned', 0)} watched)",
                      late_writes=late)
        freed += last.get("waf_poisoned", 0) - first.get("waf_poisoned", 0)
    return _r(True, f"no write after free: {freed} block(s) freed from failed or aborted loads were watched "
                    f"until handed out again, none written", watched=freed)


FAIL_MARGIN_S = 2.0  # the hardened D's failed load reaches the client within kv_load_timeout + this
BEFORE_D = ("bootstrap", "prefill", "proxy")  # proxy phases that end before D is asked: no KV load involved


def _fail_bound(inp: CheckInput, opts: dict) -> tuple[float | None, str]:
    """(bound in seconds, where it comes from) for a failed request of this run's target: the
    scenario's ``fail_within`` for the target (measured), else the hardened D's promise
    (kv_load_timeout + FAIL_MARGIN_S), else the scenario's deadline + tolerance (None without)."""
    target = inp.meta.get("target")
    topo = inp.meta.get("topology") or {}
    declared = (opts.get("fail_within") or {}).get(target)
    if declared is not None:
        return float(declared), f"the scenario's fail_within for {target}"
    if target == "hardened" and topo.get("mixed", "none") != "upstream_decode":
        load = float(topo.get("kv_load_timeout", 2.0))
        return load + FAIL_MARGIN_S, f"kv_load_timeout {load:g} s + {FAIL_MARGIN_S:g} s margin"
    limit = (float(inp.meta.get("deadline_ms") or 0) + float(inp.meta.get("tolerance_ms") or 0)) / 1000.0
    if limit > 0:
        return limit, f"the scenario's deadline + tolerance ({target} promises no load deadline)"
    return None, f"no bound declared for target {target} (checks: fail_fast: fail_within: {{{target}: ...}})"


def _load_s(o: dict) -> float:
    """How long a failed request took, as fail_fast times it: from when D was asked when it
    failed at D and the proxy said when (``decode_ms``), else from the client's send. Before D
    is asked the request is not a KV load: an op sent as a partition began reached P only on
    TCP's next retransmission after the heal (12.6 s after the send for an 8 s cut; found at
    concurrency 4), which bounded_return times, not the load deadline."""
    d_ms = o.get("decode_ms")
    if o.get("error_phase") == "decode" and finite(d_ms) and 0 <= d_ms <= op_elapsed_ms(o):
        return float(d_ms) / 1000
    return op_elapsed_ms(o) / 1000


class FailFastOptions(CheckOptions):
    fail_within: dict[str, Duration] = Field(default_factory=dict, description="per target, the most a failed "
                                             "request may take (measured); hardened's default is "
                                             "kv_load_timeout + 2 s")


@check("fail_fast", FailFastOptions)
def fail_fast(inp: CheckInput, opts: dict) -> CheckResult:
    """A failed KV load ends the request promptly, as the failure policy says.

    ``fail``: every failed request (but those the proxy's own hooks aborted: their timing is the
    hook's) came back as an HTTP error, timed from when D was asked where the proxy says
    (``decode_ms``; else from the client's send), within the bound its target
    promises: what the scenario declares from measurement in ``fail_within`` for the target, else
    for hardened its load deadline ``kv_load_timeout`` plus FAIL_MARGIN_S, else (upstream promises
    no load deadline) the scenario's own deadline + tolerance. A proxy's 504 (its own timeout ran out) or a request the
    client gave up on is a hang made visible, never a fast failure.
    ``recompute``: no request whose failure involved a KV load (the proxy had asked D) failed: D
    computed the prompt itself. Failures before D was asked (P's bootstrap, P) are other checks'."""
    policy = (inp.meta.get("topology") or {}).get("kv_load_failure_policy", "fail")
    if not inp.ops:
        return _r(False, "no request in the history")
    failed = [o for o in inp.ops if o.get("phase") != "ok"]
    if policy == "recompute":
        # a failure counts unless the proxy said it ended before D was asked
        loads = [o for o in failed if o.get("error_phase") not in BEFORE_D]
        if loads:
            o = loads[0]
            return _r(False, f"policy recompute, but {len(loads)} requests failed after D was asked; op {o['id']} "
                             f"{o.get('outcome')} (phase {o.get('error_phase')})", failed=_first([x["id"] for x in loads]))
        return _r(True, f"policy recompute: no request failed after D was asked ({len(failed)} failed before)")
    hung = [o for o in failed if o.get("outcome") in ("stalled", "http_504")]
    if hung:
        o = hung[0]
        how = "the client gave up" if o.get("outcome") == "stalled" else "the proxy's own timeout answered 504"
        return _r(False, f"{len(hung)} requests hung until {how} (op {o['id']} after "
                         f"{op_elapsed_ms(o) / 1000:.1f} s) instead of failing",
                  hung=_first([x["id"] for x in hung]))
    # a request the proxy itself aborted (its phase hooks: the client leaving while D waits, or
    # never asking D) is no failed load: when it ends is the hook's doing. Timed with the rest it
    # also counted the time the request waited before D was asked (found by pdchaos explore: a
    # request held 6 s at the proxy's bootstrap query of a frozen P, then aborted 0.1 s after D
    # was asked, read as a slow failure)
    proxy_aborted = [o for o in failed if o.get("code") == "aborted"]
    failed = [o for o in failed if o.get("code") != "aborted"]
    if not failed:
        also = f" ({len(proxy_aborted)} aborted by the proxy's hooks, not timed)" if proxy_aborted else ""
        return _r(True, "policy fail: no request failed" + also)
    bound, source = _fail_bound(inp, opts)
    worst = max(_load_s(o) for o in failed)
    if bound is None:
        return undecided(f"{len(failed)} requests failed (worst {worst:.2f} s) and {source}: whether they "
                         f"failed fast is unknown")
    late = [o for o in failed if _load_s(o) > bound]
    if late:
        return _r(False, f"{len(late)} of {len(failed)} failed requests took longer than {bound:g} s ({source}); "
                         f"worst {worst:.2f} s", late=_first([o["id"] for o in late]), worst_s=round(worst, 3))
    return _r(True, f"policy fail: {len(failed)} failed requests, each an HTTP error within {bound:g} s ({source}; "
                    f"worst {worst:.2f} s)", worst_s=round(worst, 3))


@check("kv_transferred")
def kv_transferred(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """The run was really disaggregated: D's prompt tokens from external KV transfer grew (from its
    baseline, per D process) when any completion succeeded, so D pulled P's KV cache rather than
    computing the prompts itself."""
    ok = [o for o in inp.ops if o.get("phase") == "ok"]
    if not ok:
        return _r(False, "no completion succeeded: nothing shows a KV transfer")
    pulled, unread = 0.0, []
    key = "prompt_tokens_by_source_total{source=external_kv_transfer}"
    for fin in (p for p in _vllm_probes(inp, "final") + [p for p in inp.probes if p.get("kind") == "vllm"
                                                        and p.get("when") == "last"]
                if str(p.get("node", "")).startswith("decode")):
        base = next((b for b in _vllm_probes(inp, "baseline") if b.get("pid") == fin.get("pid")), None)
        after = _gauge(fin.get("counters") or {}, key)
        before = _gauge((base or {}).get("counters") or {}, key)
        if after is None or before is None:
            # the counter is cumulative over a pooled node's earlier runs: without both readings of
            # this process what this run pulled is unknown (a missing baseline once read as 0 passed
            # on what earlier runs had pulled)
            unread.append(f"{fin.get('node')} (pid {fin.get('pid')}): no {'baseline' if after is not None else 'end'} "
                          f"reading of its external KV transfer count")
            continue
        pulled += after - before
    if pulled <= 0 and unread:
        return undecided(f"{len(ok)} completions succeeded and whether D pulled their prompts is unknown: "
                         + "; ".join(unread[:3]))
    if pulled <= 0:
        return _r(False, f"{len(ok)} completions succeeded but D pulled no prompt token from P (no KV transfer)")
    return _r(True, f"D pulled {pulled:g} prompt tokens from P over {len(ok)} successful completions")



STORE_KEYS = "master_key_count"  # mooncake_master's own gauge (families/pd/store_master.py stats)
# faults that take the master and its keys away: a reset cannot have removed anything meanwhile (a
# frozen master, stop, may run the remove when it thaws: its key count judges that)
STORE_DOWN = ("kill", "node_down", "restart")
SAMPLE_AFTER_S = 1.0  # a probe's time is taken after its metrics were read (up to ~0.8 s): judge later ones


def _hits_store(w: dict) -> bool:
    node = str((w.get("params") or {}).get("node") or "")
    return node in ("store", "all", "store:*")


@check("reset_truth")
def reset_truth(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """A reset the server reported done (``{"success": true}``) left the KV pool empty: the store
    master's own key count (``master_key_count``, an integer read from the master) is 0 at its
    first sample at least SAMPLE_AFTER_S after the answer, taken from the same master process as
    the last sample before the reset, with no other request or reset in flight from the reset's
    start to that sample. A reported success with keys left is the stale-cache hole seed 002
    closes: a later prompt can load KV computed before the reset (upstream's reset never reads
    ``remove_all``'s result). A success reported while the master was dead or restarted (a kill,
    node_down or restart window on node ``store`` or ``all`` over the reset) is false whatever the
    count says later (a restarted master is empty anyway); a frozen one (stop) may run the remove
    when it thaws, so there the key count decides. A reset that failed or hung is other checks'
    (bounded_return, no_stall, failures_explained). Whatever cannot be judged fails: a success
    without a finite time, no later sample, another master process, a request in flight."""
    resets = [o for o in inp.all_ops if o.get("f") == "reset"]
    if not resets:
        return undecided("no reset in the history (workload: {resets: [...]})")
    claimed = [o for o in resets if o.get("phase") == "ok"]
    bad_t = [o for o in claimed if not finite(o.get("t_complete")) or not finite(o.get("t_invoke"))]
    if bad_t:
        return undecided(f"reset op {bad_t[0].get('id')} reported success without a finite start and end time")
    if not claimed:
        return _r(True, f"{len(resets)} resets, none reported success: no claim to hold")
    masters = [p for p in inp.probes if p.get("kind") == "mooncake-master" and finite(p.get("t"))]
    if not masters:
        return undecided("no store master in the run: whether a reset emptied the pool is unknown")
    samples = sorted((p for p in masters if (p.get("counters") or {}).get("metrics_ok", 1)
                      and finite((p.get("counters") or {}).get(STORE_KEYS))), key=lambda p: p["t"])
    down = [w for w in inp.windows if w.get("name") in STORE_DOWN and _hits_store(w)]
    for o in claimed:
        w = next((w for w in down if (w["start"] if finite(w.get("start")) else float("-inf")) <= o["t_complete"]
                  and o["t_invoke"] <= (w["stop"] if finite(w.get("stop")) else float("inf"))), None)
        if w is not None:
            return _r(False, f"reset op {o['id']} reported success while the store master was down ({w['name']} "
                             f"window): nothing can have been removed")
    # every other op's span (a request or a reset still open at the end spans to the end)
    spans = [(o["t_invoke"], o["t_complete"] if finite(o.get("t_complete")) else float("inf"), o)
             for o in inp.all_ops if finite(o.get("t_invoke"))]
    worst = None
    for o in claimed:
        ti, tc = o["t_invoke"], o["t_complete"]
        after = next((p for p in samples if p["t"] >= tc + SAMPLE_AFTER_S), None)
        if after is None:
            return undecided(f"reset op {o['id']} reported success and no sample of the master's key count "
                             f"{SAMPLE_AFTER_S:g} s or more after it exists: whether it emptied the pool is unknown")
        before = [p for p in masters if p["t"] < ti]
        if not before or before[-1].get("pid") != after.get("pid") or any(
                p.get("pid") != after.get("pid") or p.get("when") == "baseline" for p in masters
                if ti <= p["t"] <= after["t"]):
            return undecided(f"reset op {o['id']}: the master's key count after it is not from the master process "
                             f"sampled before it (restarted, or never sampled before): nothing to compare")
        busy = next((x for a, b, x in spans if x is not o and a <= after["t"] and b >= ti), None)
        if busy is not None:
            return undecided(f"reset op {o['id']}: op {busy.get('id')} ({busy.get('f')}) was in flight between the "
                             f"reset and the master's next key count: give the workload a pause around the reset")
        raw = after["counters"][STORE_KEYS]
        if float(raw) != int(raw) or raw < 0:
            return undecided(f"reset op {o['id']}: the master's key count {raw!r} is not a count")
        keys = int(raw)
        if keys and (worst is None or keys > worst[0]):
            worst = (keys, o["id"], after["t"] - tc)
    if worst is not None:
        return _r(False, f"reset op {worst[1]} reported success but the master still held {worst[0]} keys "
                         f"{worst[2]:.1f} s later", keys_left=worst[0])
    return _r(True, f"{len(claimed)} resets reported success, and the master held no key after each")


# --------------------------------------------------------------------------- triggers (harness/triggers.py)

class PromptAnswered(TriggerParams):
    index: int = Field(ge=0, le=10000, description="the prompt's index in the run's prompts (seeded: the same "
                                                   "prompt for the same seed and topology)")
    expect: str | None = Field(None, description="the prompt's reference answer must be this (\"\": an EOS at "
                                                 "once), in prompts.json and in the op: the prompt is the one the "
                                                 "claim is about")


@FAMILY.triggers.trigger("prompt_answered", PromptAnswered)
def prompt_answered(inp: CheckInput, params: dict) -> Fired:
    """The prompt at ``index`` was sent and the proxy answered it with an HTTP status (it went
    through P and D, whatever they made of it): a claim about one prompt (e.g. one whose greedy
    answer is EOS at once) rests on it."""
    idx = params["index"]
    mine = [o for o in inp.ops if o.get("prompt_index") == idx]
    answered = [o for o in mine if isinstance(o.get("status"), int) and not isinstance(o.get("status"), bool)]
    if not mine:
        return Fired(False, f"prompt {idx} was never sent ({len(inp.ops)} requests in the run)")
    if not answered:
        return Fired(False, f"prompt {idx} was sent {len(mine)} times, never answered with an HTTP status")
    o = answered[0]
    want = params.get("expect")
    if want is not None:
        prompts = (getattr(inp, "saved", None) or {}).get("prompts")
        ref = prompts[idx].get("expected") if isinstance(prompts, list) and idx < len(prompts) \
            and isinstance(prompts[idx], dict) else None
        if ref is None:
            return Fired(False, f"prompt {idx}: no readable reference in prompts.json: whether it is the prompt the "
                                f"claim is about is unknown")
        if ref != want or o.get("expected") != want:
            return Fired(False, f"prompt {idx}'s reference answer is not the one the claim is about "
                                f"({len(ref)} characters, {len(want)} expected)")
    return Fired(True, f"prompt {idx} sent as op {o.get('id')}, answered HTTP {o.get('status')}"
                       + ("" if want is None else f", its reference answer {len(want)} characters as claimed"))
