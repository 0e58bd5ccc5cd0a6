"""Small but realistic histories per family, built the way a run writes them, and the judge.

* The meta line comes from the runner's own code: a scenario file (YAML text here) is loaded with
  ``harness.schema.load_scenario`` and turned into the meta line by ``Runner._meta``, then each
  fault's ``categories``, ``explains`` and ``tail_s`` are filled from the fault instance and the
  family, as ``_ScenarioRun.execute`` does. So the checks' options, ``not_applicable``, ``expect``,
  ``planned_ops`` and the topology are what a real run of that scenario would save.
* The other records follow the writers: op invoke and completion records as the family's workload
  writes them, fault start/stop records and ``fault_effect`` events as the nemesis does, probes as
  the topology and the workload do (baseline, sample, last, final), ``workload_exit`` and ``end``.
* :func:`judge` writes the run folder (journal, ``logs/``, the family's secret files) and re-checks
  it with ``harness.cli.check.recheck``: the family's real check registry
  (``checks_for(get_family(...))``), ``run_checks`` with the options and applicability saved in
  the meta line, ``verdicts.of_results`` and ``verdicts.outcome``. :func:`judge_inline` is the same
  chain called directly on the records.

Times are ``T0 + seconds``; every history is deterministic.
"""

from __future__ import annotations

import copy
import hashlib
import json
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable

from nodekit import journal as J

T0 = 1000.0
EXT = "prompt_tokens_by_source_total{source=external_kv_transfer}"
LOCAL = "prompt_tokens_by_source_total{source=local_compute}"
GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "journals"

# --------------------------------------------------------------------------- a run in memory


@dataclass
class Run:
    """One scenario/target run folder in memory: the journal's records, its logs (by path in the
    scenario's folder: ``logs/<node>.log``, ``server-logs/<role>.log``, as ``checks.run_logs``
    names them), and the files the family reads its secrets from (pd: prompts.json; lookup:
    preload.txt)."""

    records: list[dict]
    logs: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)

    def copy(self) -> "Run":
        return Run(copy.deepcopy(self.records), dict(self.logs), dict(self.files))

    # ------------------------------------------------------------------ reading
    @property
    def meta(self) -> dict:
        return next(r for r in self.records if r.get("type") == "meta")

    @property
    def end(self) -> dict | None:
        return next((r for r in self.records if r.get("type") == "end"), None)

    def invoke(self, op_id: int) -> dict:
        return next(r for r in self.records if r.get("type") == "op" and r["id"] == op_id and r["phase"] == "invoke")

    def completion(self, op_id: int) -> dict:
        return next(r for r in self.records if r.get("type") == "op" and r["id"] == op_id and r["phase"] != "invoke")

    def ops(self) -> list[dict]:
        """Merged ops, as the checks see them."""
        return J.ops(self.records)

    def windows(self) -> list[dict]:
        return J.fault_windows(self.records)

    def events(self, what: str) -> list[dict]:
        return [r for r in self.records if r.get("type") == "event" and r.get("what") == what]

    def probes(self, node: str | None = None, when: str | None = None) -> list[dict]:
        return [r for r in self.records if r.get("type") == "probe" and (node is None or r.get("node") == node)
                and (when is None or r.get("when") == when)]

    def probe(self, node: str, when: str) -> dict:
        found = self.probes(node, when)
        assert found, f"no {when} probe of {node}"
        return found[-1]

    # ------------------------------------------------------------------ changing
    def add(self, *records: dict) -> None:
        self.records.extend(records)
        self.sort()

    def remove(self, pred: Callable[[dict], bool]) -> int:
        before = len(self.records)
        self.records = [r for r in self.records if r.get("type") == "meta" or not pred(r)]
        return before - len(self.records)

    def retally(self, create: bool = False) -> None:
        """The client's own count of its requests (final probe counters ``ops``/``ops_<outcome>``,
        ``stuck_workers``) as the mutated ops say: a mutant stands for a system that behaved so,
        whose workload counted what it saw, and the runner's count of stalled ops in the end record,
        as it writes it from the history. (A forged history is one that skips this.)"""
        end = self.end
        if end is not None and "stalled" in end:
            end["stalled"] = sum(1 for o in J.ops(self.records) if o.get("outcome") == "stalled")
        for p in self.probes("client", "final"):
            c = p.setdefault("counters", {})
            if not isinstance(c.get("ops"), int) and not create:
                continue
            ops = [o for o in J.ops(self.records) if o.get("f") in (self.meta.get("primary_ops") or [o.get("f")])]
            ended = [o for o in ops if o.get("t_complete") is not None]
            for k in [k for k in c if k.startswith("ops_")]:
                del c[k]
            c["ops"] = len(ended)
            for o in ended:
                c[f"ops_{o.get('outcome')}"] = c.get(f"ops_{o.get('outcome')}", 0) + 1
            p["stuck_workers"] = len(ops) - len(ended)

    def sort(self) -> None:
        """Meta first, end last, the rest by time (as the runner merges the parts)."""
        self.records.sort(key=lambda r: (r.get("type") != "meta", r.get("type") == "end",
                                         r.get("t") if isinstance(r.get("t"), (int, float)) else 0.0))

    def retime(self, op_id: int, elapsed_ms: float) -> None:
        """The op took ``elapsed_ms``: its completion moves, the ops its worker would have sent
        meanwhile go (one call at a time), and when it now ends after the workload's exit, the
        teardown records (final probes, workload_exit, end) move after it."""
        done = self.completion(op_id)
        done["elapsed_ms"] = float(elapsed_ms)
        inv = self.invoke(op_id)
        done["t"] = inv["t"] + elapsed_ms / 1000.0
        # its worker makes one call at a time: what it would have sent meanwhile was never sent
        busy = {r["id"] for r in self.records if r.get("type") == "op" and r.get("phase") == "invoke"
                and r.get("process") == inv.get("process") and inv["t"] < r["t"] < done["t"]}
        self.remove(lambda r: r.get("type") == "op" and r.get("id") in busy)
        self.shift_teardown_after(done["t"])

    def shift_teardown_after(self, t: float) -> None:
        exit_t = max((e["t"] for e in self.events("workload_exit")), default=None)
        client_final = [p for p in self.probes(when="final") if p.get("node") == "client"]
        first = min([p["t"] for p in client_final] + ([exit_t] if exit_t is not None else []), default=None)
        if first is None or t < first:
            return
        dt = t - first + 0.2
        for r in self.records:
            if isinstance(r.get("t"), (int, float)) and r["t"] >= first and r.get("type") in ("probe", "event", "end") \
                    and not (r.get("type") == "probe" and r.get("when") == "sample"):
                r["t"] += dt
        self.sort()


# --------------------------------------------------------------------------- meta from a scenario file


@lru_cache(maxsize=None)
def _meta_json(yaml_text: str, target: str) -> str:
    from harness.runner import scenario_meta as runner_meta
    from harness.schema import load_scenario

    with tempfile.TemporaryDirectory(prefix="pdc-mut-") as tmp:
        path = Path(tmp) / "scenario.yaml"
        path.write_text(yaml_text)
        meta = runner_meta(load_scenario(path), target)  # what the runner writes, each fault's effects included
    required = [dict(fm["required"]) for fm in meta["faults"]]
    meta.update(file=f"scenarios/mutants/{meta['scenario']}.yaml", wall_start="2026-12-01T12:00:00+00:00", t0=T0)
    return json.dumps({"meta": meta, "required": required})


def scenario_meta(yaml_text: str, target: str) -> tuple[dict, list[dict]]:
    """(the meta line a run of this scenario and target writes, each fault's required effect)."""
    data = json.loads(_meta_json(yaml_text, target))
    return data["meta"], data["required"]


# --------------------------------------------------------------------------- record makers


def op_records(op_id: int, worker: int, f: str, t_inv: float, elapsed_ms: float, invoke: dict,
               done: dict) -> list[dict]:
    inv = {"type": "op", "id": op_id, "process": worker, "f": f, "phase": "invoke", "t": T0 + t_inv, **invoke}
    comp = {"type": "op", "id": op_id, "process": worker, "f": f, **done, "t": T0 + t_inv + elapsed_ms / 1000.0,
            "elapsed_ms": float(elapsed_ms)}
    return [inv, comp]


def event(what: str, t: float, **fields: Any) -> dict:
    return {"type": "event", "what": what, "t": T0 + t, **fields}


def fault_records(fid: int, name: str, start: float, stop: float, params: dict, effect: dict | None,
                  required: dict) -> list[dict]:
    out = [{"type": "fault", "id": fid, "name": name, "phase": "start", "t": T0 + start, "params": params},
           event("fault_started", start + 0.004, fault=name, id=fid, s=0.004),
           {"type": "fault", "id": fid, "name": name, "phase": "stop", "t": T0 + stop, "healed_by": "schedule"}]
    if effect is not None or required:
        out.append(event("fault_effect", stop + 0.0001, fault=name, id=fid, effect=effect, required=required))
    return out


def probe(node: str, kind: str | None, when: str, t: float, pid: int, threads: int, fds: int,
          counters: dict | None = None, alive: bool | None = True) -> dict:
    p = {"type": "probe", "node": node, "when": when, "t": T0 + t, "pid": pid, "threads": threads, "fds": fds,
         "counters": dict(counters or {})}
    if kind is not None:
        p["kind"] = kind
    if alive is not None:
        p["alive"] = alive
    return p


def _words(seed: int, n: int) -> str:
    vocab = ("river", "stone", "lantern", "copper", "meadow", "signal", "harbor", "violet", "engine", "summit",
             "pepper", "canvas", "thunder", "orchid", "marble", "falcon", "quartz", "willow", "ember", "glacier",
             "saddle", "pillar", "cobalt", "tundra", "beacon", "walnut", "sparrow", "mosaic", "prairie", "anchor")
    return " ".join(vocab[(seed * 7 + k * 3 + k * k) % len(vocab)] for k in range(n))


# --------------------------------------------------------------------------- pd

PD_STOP_YAML = """\
name: mut-pd-stop-prefill
family: pd
description: P frozen (SIGSTOP) for 6 s while completions flow; the hardened D fails the one pull in flight.
seed: 7
deadline: 10s
tolerance: 2s
cap: 400s
targets: [{target}]
topology: {{kv_load_failure_policy: {policy}}}
workload: {{duration: 14s, concurrency: 2, rate: 1, request_timeout: 30s}}
faults:
  - {{type: stop, node: "prefill:0", at: 2.5s, for: 6s}}
triggers:
  - {{type: ops_in_window, fault: 0, min: 2}}
expect: {{{target}: pass}}
"""

PD_BASELINE_YAML = """\
name: mut-pd-baseline
family: pd
description: no fault; 16 completions through the P/D proxy.
seed: 101
deadline: 10s
tolerance: 2s
cap: 600s
targets: [{target}]
workload: {{duration: 8s, concurrency: 2, rate: 2, request_timeout: 30s}}
triggers:
  - {{type: prompt_answered, index: 3}}
expect: {{{target}: pass}}
"""

PD_PIDS = {"prefill:0": 4101, "decode:0": 4102, "proxy": 4103, "client": 4104}
PD_WINDOW = (2.5, 8.5)  # the stop fault, seconds after t0
PD_TAIL_END = 14.6  # the workload's last op ended before this
TOKENS_PER_PULL = 150


def pd_prompts(n: int) -> list[dict]:
    return [{"prompt": f"{_words(i, 40)} {i}", "expected": " " + _words(i + 101, 12), "prompt_tokens": 41}
            for i in range(n)]


def _pd_ops(plan: list[tuple], prompts: list[dict]) -> list[dict]:
    """plan: (id, worker, t_invoke, elapsed_ms, result) with result "ok" or (outcome, error_phase)."""
    out = []
    for op_id, worker, t_inv, elapsed, result in plan:
        idx = op_id - 1
        inv = {"prompt_index": idx, "expected": prompts[idx]["expected"]}
        if result == "ok":
            done = {"value": prompts[idx]["expected"], "status": 200, "completion_tokens": 16, "phase": "ok",
                    "outcome": "ok", "code": ""}
        else:
            outcome, phase = result
            status = int(outcome.split("_")[1]) if outcome.startswith("http_") else None
            done = {"value": None, "status": status, "completion_tokens": None, "phase": "fail", "outcome": outcome,
                    "code": "bad_status" if status else "ConnectionRefusedError"}
            if phase:
                done["error_phase"] = phase
        out += op_records(op_id, worker, "complete", t_inv, elapsed, inv, done)
    return out


def _vllm_counters(cpu_s: float, ext: float, local: float, **over: Any) -> dict:
    c = {"num_requests_running": 0, "num_requests_waiting": 0, "num_requests_waiting_by_reason{reason=capacity}": 0,
         "num_requests_kv_fetch_by_stage{stage=in_progress}": 0, "kv_cache_usage_perc": 0.0,
         "prompt_tokens_total": ext + local, EXT: ext, LOCAL: local, "generation_tokens_total": 0,
         "cpu_s": round(cpu_s, 3), "rss_mib": 612.5, "metrics_ok": 1, "sockets": 14, "processes": 3,
         "wrapper_threads": 3, "wrapper_fds": 11}
    c.update(over)
    return c


def _pd_node_records(records_ops: list[dict], end_at: float, frozen: tuple[float, float] | None) -> list[dict]:
    """Process starts, baseline/sample/final probes of P, D, the proxy and the client."""
    oks = sorted(r["t"] - T0 for r in records_ops if r.get("phase") == "ok")

    def pulled(t: float) -> int:
        return TOKENS_PER_PULL * sum(1 for x in oks if x <= t)

    def vllm(role: str, when: str, t: float) -> dict:
        n = pulled(t)
        cpu = 41.0 + 0.03 * (t + 1.0) + 0.002 * n
        ext, local = (n, 0) if role == "decode:0" else (0, n)
        return probe(role, "vllm", when, t, PD_PIDS[role], 71, 96, _vllm_counters(cpu, ext, local))

    out = []
    for i, (role, kind) in enumerate((("prefill:0", "vllm"), ("decode:0", "vllm"), ("proxy", "pd-proxy"))):
        out.append(event("process_start", -40.0 + i, kind=kind, pid=PD_PIDS[role]))
        out.append(event("server_log", -39.5 + i, role=role, path=f"server-logs/{role.replace(':', '-')}.log")
                   if kind == "vllm" else event("link", -39.5 + i, kind="direct", to="proxy"))
    out += [vllm("prefill:0", "baseline", -2.0), vllm("decode:0", "baseline", -2.0),
            probe("proxy", "pd-proxy", "baseline", -1.9, PD_PIDS["proxy"], 4, 13, {"requests": 0})]
    out.append(event("process_start", -1.5, kind="pd-workload", pid=PD_PIDS["client"]))
    out.append(probe("client", "pd-workload", "baseline", -1.4, PD_PIDS["client"], 1, 5, {}))
    t = 0.5
    while t < end_at - 0.3:
        for role in ("prefill:0", "decode:0"):
            if role == "prefill:0" and frozen and frozen[0] < t < frozen[1]:
                continue  # a frozen node is not sampled
            out.append(vllm(role, "sample", t))
        t = round(t + 0.5, 3)
    n_ops = len({r["id"] for r in records_ops})
    tally: dict = {"ops": n_ops}
    for r in records_ops:  # the workload's own count per outcome (ops_ok, ops_http_502, ...)
        if r.get("phase") != "invoke":
            tally[f"ops_{r['outcome']}"] = tally.get(f"ops_{r['outcome']}", 0) + 1
    out.append(probe("client", "pd-workload", "final", end_at - 0.4, PD_PIDS["client"], 1, 5,
                     {**tally, "prompts_reused": 0}))
    out[-1]["stuck_workers"] = 0
    out.append(event("workload_exit", end_at - 0.3, returncode=0))
    out += [vllm("prefill:0", "final", end_at - 0.2), vllm("decode:0", "final", end_at - 0.2),
            probe("proxy", "pd-proxy", "final", end_at - 0.15, PD_PIDS["proxy"], 4, 13,
                  {"requests": n_ops})]
    return out


def pd_logs() -> dict[str, str]:
    return {"logs/01-vllm.log": "vllm node prefill:0: server up on port 41001 (pid 4101)\n",
            "logs/02-vllm.log": "vllm node decode:0: server up on port 41002 (pid 4102)\n",
            "logs/03-pd-proxy.log": "pd-proxy: listening; protocol bootstrap; order parallel\n",
            "logs/client-pd-workload.log": "pd-workload: prompts 20, tokens_min 41; 12 requests in 14.0 s: ok 11\n",
            "server-logs/prefill-0.log": "INFO vLLM API server version 0.32.0\nINFO Started server process\n",
            "server-logs/decode-0.log": "INFO vLLM API server version 0.32.0\nINFO Started server process\n"}


def pd_stop_run(target: str = "hardened", policy: str = "fail") -> Run:
    """P frozen with SIGSTOP from 2.5 s to 8.5 s, two workers at 1 request/s overall.

    op 4 was pulling when P froze: under ``fail`` the hardened D fails it at its load deadline
    (HTTP 502, error_phase decode, 2.15 s); under ``recompute`` D computes it. Ops 5 and 6 wait at
    the proxy (P's bootstrap is frozen) until the thaw, so from ~6.1 s to 8.5 s nothing starts or
    ends: D's samples there are the quiet intervals no_busy_wait judges (D idle, 0.03 of a core)."""
    meta, required = scenario_meta(PD_STOP_YAML.format(target=target, policy=policy), target)
    prompts = pd_prompts(20)
    fail4 = ("http_502", "decode") if policy == "fail" else "ok"
    plan = [(1, 0, 0.05, 160, "ok"), (2, 1, 1.05, 150, "ok"), (3, 0, 2.05, 170, "ok"),
            (4, 1, 2.45, 2150, fail4), (5, 0, 4.05, 4600, "ok"), (6, 1, 5.05, 3650, "ok"),
            (7, 0, 9.05, 160, "ok"), (8, 1, 9.55, 150, "ok"), (9, 0, 11.05, 155, "ok"),
            (10, 1, 11.55, 165, "ok"), (11, 0, 13.05, 150, "ok"), (12, 1, 13.55, 160, "ok")]
    ops = _pd_ops(plan, prompts)
    start, stop = PD_WINDOW
    recs = [meta, event("fault_prepared", -1.6, fault="stop", id=0, s=0.0), *ops,
            *fault_records(0, "stop", start, stop, {"node": "prefill:0"}, {"acted": 1, "seen": 1, "unseen": 0},
                           required[0]),
            event("process_signal", start + 0.002, kind="vllm", role="prefill:0", pid=PD_PIDS["prefill:0"],
                  signal="SIGSTOP"),
            event("process_signal", stop - 0.001, kind="vllm", role="prefill:0", pid=PD_PIDS["prefill:0"],
                  signal="SIGCONT"),
            *_pd_node_records(ops, PD_TAIL_END + 0.6, PD_WINDOW),
            {"type": "end", "t": T0 + PD_TAIL_END + 0.8, "reason": "done", "stalled": 0}]
    run = Run(recs, pd_logs(), {"prompts.json": json.dumps(prompts)})
    run.sort()
    return run


def pd_baseline_run(target: str = "upstream") -> Run:
    """No fault: 16 completions, all the reference text, D pulling each prompt's KV from P."""
    meta, _ = scenario_meta(PD_BASELINE_YAML.format(target=target), target)
    prompts = pd_prompts(20)
    plan = [(i, (i - 1) % 2, 0.05 + 0.5 * (i - 1), 150 + 5 * (i % 3), "ok") for i in range(1, 17)]
    ops = _pd_ops(plan, prompts)
    recs = [meta, *ops, *_pd_node_records(ops, 9.0, None), {"type": "end", "t": T0 + 9.2, "reason": "done",
                                                             "stalled": 0}]
    run = Run(recs, pd_logs(), {"prompts.json": json.dumps(prompts)})
    run.sort()
    return run


# --------------------------------------------------------------------------- lookup

LOOKUP_KILL_YAML = """\
name: mut-lookup-server-kill
family: lookup
description: the server is SIGKILLed mid-run and restarted on the same endpoint.
seed: 7
deadline: 200ms
targets: [hardened]
workload: {{duration: 3s, concurrency: 2, rate: 20}}
faults:
  - {{type: server_kill, at: 800ms, for: 700ms}}
triggers: [{{type: ops_in_window, fault: 0, min: 2}}]
{checks}expect: {{hardened: pass}}
"""

LOOKUP_PIDS = {"server": 501, "server2": 502, "client": 509}
LOOKUP_WINDOW = (0.8, 1.5)
LOOKUP_KINDS = (("full", 112), ("partial", 16), ("miss", 0), ("full", 48), ("hbm", 32), ("multigroup", 64))


def lookup_preload() -> list[str]:
    return [hashlib.sha256(f"mut-block-{i}".encode()).hexdigest() for i in range(8)]


def _server_counters(requests: int) -> dict:
    return {"requests": requests, "replies": requests, "replies_watchdog": 0, "send_failed": 0, "ok": requests,
            "timeout": 0, "transport": 0, "protocol": 0, "server_error": 0, "backend_error": 0,
            "socket_rebuilds": 0, "resets": 0}


def lookup_kill_run(recovery: bool = True) -> Run:
    """The lookup server killed at 0.8 s and restarted at 1.5 s; two workers at 20 lookups/s.
    Lookups issued while it is down time out (a fail-open 0 after 201 ms); the rest hit."""
    checks = "" if recovery else "checks: {recovery: {enabled: false}}\n"
    meta, required = scenario_meta(LOOKUP_KILL_YAML.format(checks=checks), "hardened")
    start, stop = LOOKUP_WINDOW
    plan = []
    for w in (0, 1):
        t = 0.02 + 0.05 * w
        while t < 3.0:
            plan.append((round(t, 4), w, start <= t < stop))
            t += 0.202 if start <= t < stop else 0.1
    plan.sort()
    ops: list[dict] = []
    before = after = n_ok = n_to = 0
    for i, (t, w, down) in enumerate(plan, start=1):
        kind, expected = LOOKUP_KINDS[i % len(LOOKUP_KINDS)]
        inv = {"kind": kind, "token_len": expected + 2, "hashes": max(1, expected // 16), "groups": [0],
               "hbm_hit_tokens": 32 if kind == "hbm" else 0, "expected": expected}
        if down:
            done = {"matched": 0, "phase": "fail", "value": 0, "outcome": "timeout", "code": "TIMEOUT"}
            ops += op_records(i, w, "lookup", t, 201.4, inv, done)
            n_to += 1
        else:
            done = {"matched": expected, "phase": "ok", "value": expected, "outcome": "ok", "code": ""}
            ops += op_records(i, w, "lookup", t, 1.6, inv, done)
            n_ok += 1
            before, after = (before + 1, after) if t < start else (before, after + 1)
    srv, srv2, cli = LOOKUP_PIDS["server"], LOOKUP_PIDS["server2"], LOOKUP_PIDS["client"]
    recs = [meta, event("process_start", -0.24, kind="lookup-server", pid=srv),
            probe("server", "lookup-server", "baseline", -0.235, srv, 5, 19, _server_counters(0)),
            event("fault_prepared", -0.234, fault="server_kill", id=0, s=0.0),
            probe("client", None, "baseline", -0.06, cli, 2, 5, {}, alive=None),
            event("process_start", -0.001, kind="workload", pid=cli), *ops,
            *fault_records(0, "server_kill", start, stop, {}, {"acted": 1, "seen": 1, "unseen": 0}, required[0]),
            probe("server", "lookup-server", "last", start + 0.002, srv, 5, 21, _server_counters(before)),
            event("process_kill", start + 0.003, kind="lookup-server", role="server", pid=srv),
            event("process_start", stop - 0.1, kind="lookup-server", pid=srv2),
            probe("server", "lookup-server", "baseline", stop - 0.0001, srv2, 5, 21, _server_counters(0)),
            probe("client", None, "final", 3.29, cli, 2, 5,
                  {"ok": n_ok, "timeout": n_to, "transport": 0, "protocol": 0, "server_error": 0, "backend_error": 0,
                   "bad_call": 0, "socket_rebuilds": n_to, "reset_ok": 0, "reset_failed": 0}),
            event("workload_exit", 3.31, returncode=0),
            probe("server", "lookup-server", "final", 3.32, srv2, 5, 19, _server_counters(after)),
            {"type": "end", "t": T0 + 3.45, "reason": "done", "stalled": 0}]
    recs[-4]["stuck_workers"] = 0
    logs = {"logs/01-lookup-server.log": "ready\n", "logs/03-lookup-server.log": "ready\n",
            "logs/client-workload.log": f"lookup workload: {len(plan)} ops; ok {n_ok}, timeout {n_to}; socket rebuilds "
                                   f"{n_to}\n"}
    run = Run(recs, logs, {"preload.txt": "\n".join(lookup_preload()) + "\n"})
    run.sort()
    return run


# The saved pd runs failed no_leaks (vLLM's own threads and fds grew by 2-4 over the run: under
# investigation, not what these mutants probe): they are judged against what they showed, or pass.
GOLDEN_EXPECT = {"pd-baseline-upstream.jsonl": "fail[no_leaks]|pass",
                 "pd-abort-while-decode-waits-hardened.jsonl": "fail[no_leaks]|pass"}
# Their runs came before scenarios had to declare triggers: what their scenario files declare today
# (scenarios/pd/baseline.yaml, pd/abort-while-decode-waits.yaml, lookup/server-kill.yaml)
GOLDEN_TRIGGERS = {"pd-baseline-upstream.jsonl": {"none": "baseline without faults"},
                   "pd-abort-while-decode-waits-hardened.jsonl": [{"type": "ops_in_window", "fault": 0}],
                   "lookup-server-kill.jsonl": [{"type": "ops_in_window", "fault": 0}]}


def prompts_of(records: list[dict]) -> list[dict]:
    """A prompts.json for a history: each op's reference at its prompt index (the prompts
    themselves are not in a journal)."""
    refs = {r["prompt_index"]: r.get("expected") for r in records if r.get("type") == "op"
            and r.get("phase") == "invoke" and isinstance(r.get("prompt_index"), int)}
    return [{"prompt": "", "expected": refs.get(i, "")} for i in range(max(refs, default=-1) + 1)]


def golden_run(name: str) -> Run:
    """A real journal saved in tests/golden/journals (see the README there). Logs and secret
    files were not kept: benign logs stand in for every log the run names (``server_log``
    events too), and for pd a prompts.json holding the reference outputs the journal carries
    (the prompts themselves are not in a journal), so log_hygiene has the run's secrets."""
    records = J.read_journal(GOLDEN / name)
    m = J.meta(records)
    # a golden journal is judged by its own saved meta line: its run predates the current scenario
    # files (which pdchaos check would otherwise rebuild the meta line from)
    m["file"] = f"(golden: {name})"
    m["scenario"] = f"golden-{m.get('scenario')}"  # no scenario of that name: judged by the saved line
    if name in GOLDEN_EXPECT:
        m["expect"] = GOLDEN_EXPECT[name]
    if not m.get("triggers") and name in GOLDEN_TRIGGERS:
        m["triggers"] = GOLDEN_TRIGGERS[name]
        if isinstance(m["triggers"], dict):  # as harness.runner.not_applicable says it for such a scenario
            m.setdefault("not_applicable", {})["triggers"] = f"none declared: {m['triggers']['none']}"
    if m.get("family") == "pd" and not (m.get("workload") or {}).get("resets"):
        # reset_truth came after these runs: what the family says today for a workload without resets
        m.setdefault("not_applicable", {})["reset_truth"] = "the workload resets nothing"
    logs = {"logs/client-workload.log": "workload: done\n"}
    files: dict[str, str] = {}
    if m.get("family") == "pd":
        logs["logs/01-pd-proxy.log"] = "pd-proxy: listening; protocol bootstrap\n"
        for e in records:
            if e.get("type") == "event" and e.get("what") == "server_log" and e.get("path"):
                logs[f"server-logs/{Path(str(e['path'])).name}"] = "INFO vLLM API server version 0.32.0\n"
        files["prompts.json"] = json.dumps(prompts_of(records))
    else:
        logs["logs/01-lookup-server.log"] = "ready\n"
    return Run(records, logs, files)


# --------------------------------------------------------------------------- layerwise

LAYERWISE_YAML = """\
name: mut-layerwise-listener-garbage
family: layerwise
description: malformed messages to D's listener while requests flow; the hardened listener NACKs each.
seed: 201
deadline: 3s
tolerance: 1s
cap: 120s
targets: [hardened]
workload: {duration: 6s, concurrency: 2, rate: 2}
faults:
  - {type: listener_garbage, at: 1s, for: 3.5s}
triggers:
  - {type: listener_probed, fault: 0, min: 5}
  - {type: ops_in_window, fault: 0, since_start: true}
expect: {hardened: pass}
"""

LAYERWISE_PIDS = {"decode": 701, "prefill": 702, "metaserver": 703, "client": 704}
LAYERWISE_PROBES = ("not_msgpack", "not_a_tuple", "unknown_type", "missing_fields", "two_payloads")


def layerwise_run() -> Run:
    meta, required = scenario_meta(LAYERWISE_YAML, "hardened")
    ops: list[dict] = []
    for i in range(1, 13):
        w, t = (i - 1) % 2, 0.05 + 0.5 * (i - 1)
        ops += op_records(i, w, "transfer", t, 120.0 + i, {"expected": "done", "tokens": 64},
                          {"phase": "ok", "value": "done", "outcome": "ok", "code": "", "blocks": 4,
                           "blocks_reported": 0})
    nodes = (("decode", "layerwise-decode", 9, 18), ("prefill", "layerwise-prefill", 7, 15),
             ("metaserver", "layerwise-metaserver", 4, 9))
    recs = [meta]
    for i, (role, kind, th, fds) in enumerate(nodes):
        pid = LAYERWISE_PIDS[role]
        c = {"partial_sends": 0, "sends": 0} if role == "prefill" else \
            {"free_blocks": 31, "blocks_initial": 31, "blocks_live": 0, "blocks_held_finished": 0,
             "content_checked": 40, "content_bad": 0, "freed_after_failure": 3, "writes_after_free": 0} \
            if role == "decode" else {"posts": 12, "forwarded": 12, "repeat_posts": 0}
        recs += [event("process_start", -3.0 + i, kind=kind, pid=pid),
                 probe(role, kind, "baseline", -2.9 + i, pid, th, fds, c),
                 probe(role, kind, "final", 6.9, pid, th, fds,
                       {**c, **({"sends": 12} if role == "prefill" else
                                {"content_checked": 52, "freed_after_failure": 5} if role == "decode" else {})})]
    recs += [probe("client", None, "baseline", -0.2, LAYERWISE_PIDS["client"], 3, 8, {}, alive=None), *ops,
             *fault_records(0, "listener_garbage", 1.0, 4.5, {"tries": 3, "try_timeout": 1.0}, None, required[0]),
             *[event("listener_probe", 1.01 + 0.001 * k, probe=p, answered=True, reply="NACK bad_message", tries=1,
                     elapsed_ms=2.4 + k) for k, p in enumerate(LAYERWISE_PROBES)],
             probe("client", None, "final", 6.6, LAYERWISE_PIDS["client"], 3, 8, {}),
             event("workload_exit", 6.7, returncode=0),
             {"type": "end", "t": T0 + 7.1, "reason": "done", "stalled": 0}]
    recs[-3]["stuck_workers"] = 0
    run = Run(recs, {"logs/01-layerwise-decode.log": "D ready\n", "logs/02-layerwise-prefill.log": "P ready\n",
                     "logs/client-workload.log": "layerwise workload: 12 requests\n"})
    run.sort()
    return run


# --------------------------------------------------------------------------- judging


@dataclass
class Judgement:
    verdict: str
    failing: tuple[str, ...]
    outcome: str
    checks: dict[str, dict]
    reason: str

    def why(self) -> str:
        bad = "; ".join(f"{n}: {c['message']}" for n, c in self.checks.items() if c["ok"] is False)
        return f"{self.verdict} {self.outcome} failing={list(self.failing)} {self.reason} -- {bad}"


def write_run(run: Run, run_dir: Path) -> Path:
    """The run folder ``pdchaos check`` reads: RUN_DIR/<scenario>/<target>/journal.jsonl + logs/."""
    m = run.meta
    d = run_dir / str(m.get("scenario") or "scenario") / str(m.get("target") or "target")
    (d / "logs").mkdir(parents=True, exist_ok=True)
    J.write_journal(d / "journal.jsonl", run.records)
    for name, text in run.logs.items():  # "logs/<node>.log", "server-logs/<role>.log"
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(text)
    for name, text in run.files.items():
        (d / name).write_text(text)
    return d


def judge(run: Run, root: Path | None = None) -> Judgement:
    """Re-check the run from its files, as ``pdchaos check RUN_DIR`` does."""
    from harness.cli.check import recheck

    with tempfile.TemporaryDirectory(prefix="pdc-mut-", dir=root) as tmp:
        run_dir = Path(tmp) / "run"
        write_run(run, run_dir)
        # these histories' scenarios live in the tests, not under scenarios/: judged by their meta line
        rows = recheck(run_dir, trust_saved_meta=True)
    assert len(rows) == 1, rows
    row = rows[0]
    return Judgement(row["verdict"], tuple(row.get("failing") or ()), row["outcome"],
                     {c["name"]: c for c in row["checks"]}, row.get("reason", ""))


def judge_inline(run: Run, checks: dict | None = None) -> Judgement:
    """The same chain called directly: the family's registry, run_checks with the saved options and
    applicability, of_results, outcome. ``checks`` replaces the registry (a checker that raises)."""
    from harness import checks as C
    from harness import verdicts as V
    from harness.family import get_family

    fam = get_family(run.meta.get("family") or "lookup")
    with tempfile.TemporaryDirectory(prefix="pdc-mut-") as tmp:
        for name, text in run.files.items():
            (Path(tmp) / name).write_text(text)
        secrets = fam.log_secrets(Path(tmp))
        saved = fam.saved_inputs(Path(tmp))
    from harness.cli.check import judged_by_file

    records, _ = judged_by_file(run.records)  # as pdchaos check: the meta line from the scenario if here
    m = J.meta(records)
    from harness.triggers import registry_for

    inp = C.CheckInput(records, dict(run.logs), secrets, fam.log_pattern, saved, triggers=registry_for(fam))
    from harness.saved import saved_config

    results = C.run_checks(inp, saved_config(m), checks if checks is not None else C.checks_for(fam),
                           m.get("not_applicable") or {})
    verdict, failing = V.of_results(results)
    return Judgement(verdict, tuple(failing), V.outcome(verdict, m.get("expect"), failing),
                     {r.name: r.to_dict() for r in results}, "")


def names(checks: Iterable[str]) -> set[str]:
    return set(checks)
