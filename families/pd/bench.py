"""``pdchaos bench pd``: the P/D normal path, idle waiting and the failure path, upstream vs
hardened, in one run.

Setup: two real P/D pairs started side by side by this command, each as a scenario run would
start it (``PDTopology`` of ``scenarios/pd/baseline.yaml``: a vLLM prefill and decode server and
the project's proxy): ``upstream`` (vLLM's MooncakeConnector) and ``hardened``
(connector_patch's HardenedMooncakeConnector, quiet waiting on). Node logs go to ``--workdir``.

**Normal path, paired**: prompts (unique, ~200 tokens, greedy, 16 output tokens: the baseline
workload's) are sent one at a time; each prompt goes to both pairs' proxies back to back, in a
random order per prompt, ``--gap-s`` apart (upstream's engine and worker busy-poll for 1 s after
their last step: a shorter gap lets that spin slow the next request, whichever pair it goes to).
After ``--warmup`` unmeasured prompts per pair, prompts come in rounds of ``--batch`` pairs until
the 95 % bootstrap interval of the p50 ratio hardened/upstream is at most ``--half-width`` (1 %)
either side, or ``--n-max`` pairs. One sample is the wall time of one completion through the proxy
(P's prefill, D's pull, D's decode); every answer must be HTTP 200 with the reference text (D
alone, greedy), else exit 1. Reported: p50/p99 per target, the ratios with their intervals
(:func:`harness.benchkit.paired_ratio_ci`: pairs resampled together), targets p50 <= 1.02 with
the interval's upper end <= 1.03 and p99 <= 1.05 (``target_met``; a miss is a finding, not a
failure of the command).

**Quiet waiting's own cost** (``--quiet-cost``, on by default): the upstream pair is stopped and a
third, ``hardened-loud`` (the hardened connector with ``quiet_wait_max_ms: 0``: vLLM's engine and
queue as released), is measured against ``hardened`` the same way (two pairs fit in 24 GiB,
three do not).

**Idle-wait CPU**: what a node burns while it only waits on a peer, per pair: D with
``--idle-requests`` requests pulling from a silent peer (a ``pd-fake-prefill`` in mode
``silent``), and P keeping the blocks of requests no D pulls (sent to P alone with
``do_remote_decode``), each read from the node's process tree (``cpu_s``) over ``--idle-window-s``
after 0.5 s.

**P restarted while D waits** (``--restart``, on by default): per pair, P is killed and started
again twice: once with D idle, once while D has ``--idle-requests`` requests waiting on the silent
peer; the time from the kill to P answering ``/health`` is compared (upstream's D spins while it
waits and slows P's start on a 2-core machine; the target is within 10 %).

**Failure path**: the silent peer again; ``--failures`` requests sent straight to each target's
D, all at once, one target after the other; one sample is the time from sending to the HTTP error.
The hardened target must answer within ``kv_load_timeout_ms`` + 500 ms (p99); upstream waits its
DEALER's receive timeout, abort timeout + 60 s (``--abort-timeout-s`` 10: 70 s; vLLM's default
480 s gives 540 s, measured by scenarios/pd-long/), so it gets ``--upstream-failures`` requests
(default 2, in parallel; 0 skips it).

Every node is stopped on every exit path (``PDTopology.close``).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

from harness.errors import HarnessError, UsageError
from harness.benchkit import Terminated, bench_signals, check_save_path, paired_ratio_ci, save_samples

TARGETS = ("upstream", "hardened")
LOUD = "hardened-loud"  # the hardened connector with quiet waiting off (quiet_wait_max_ms: 0)
TARGET_P50 = 1.02
TARGET_P50_HI = 1.03
TARGET_P99 = 1.05
IDLE_CPU_TARGET = 0.05  # of a core, for a hardened node that only waits
FAIL_SLACK_MS = 500.0
BASELINE = Path(__file__).resolve().parents[2] / "scenarios" / "pd" / "baseline.yaml"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n-min", type=int, default=60, help="measured prompt pairs at least (>= 20, default 60)")
    p.add_argument("--n-max", type=int, default=400, help="measured prompt pairs at most (default 400)")
    p.add_argument("--batch", type=int, default=40, help="pairs per round between interval checks (default 40)")
    p.add_argument("--half-width", type=float, default=0.01,
                   help="stop once the p50 ratio's 95%% interval is within this either side (default 0.01)")
    p.add_argument("--warmup", type=int, default=4, help="unmeasured prompts per pair first (default 4)")
    p.add_argument("--gap-s", type=float, default=1.1,
                   help="pause before each request, so upstream's 1 s busy-poll ends first (default 1.1)")
    p.add_argument("--quiet-cost", action=argparse.BooleanOptionalAction, default=True,
                   help="also measure hardened against hardened with quiet waiting off (default on)")
    p.add_argument("--idle-requests", type=int, default=2, help="requests that wait on the silent peer (default 2)")
    p.add_argument("--idle-window-s", type=float, default=3.0, help="idle-wait CPU window (default 3)")
    p.add_argument("--restart", action=argparse.BooleanOptionalAction, default=True,
                   help="also time P's restart with D idle and with D waiting (default on)")
    p.add_argument("--failures", type=int, default=5, help="failure-path requests to the hardened D (default 5)")
    p.add_argument("--upstream-failures", type=int, default=2,
                   help="failure-path requests to the upstream D, which waits abort timeout + 60 s (default 2)")
    p.add_argument("--kv-load-timeout-ms", type=int, default=2000, help="the hardened D's load deadline")
    p.add_argument("--abort-timeout-s", type=int, default=10, help="VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT (default 10)")
    p.add_argument("--seed", type=int, default=0, help="prompts, orders and resamples (default 0)")
    p.add_argument("--workdir", default=None, help="folder for node logs (default: runs/bench-pd-<time>)")
    p.add_argument("--save", metavar="PATH", help="write the raw samples (microseconds) as JSON")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")


def _check(args: argparse.Namespace) -> None:
    if args.n_min < 20 or args.n_max < args.n_min:
        raise UsageError("--n-min: at least 20 prompt pairs, and --n-max at least --n-min")
    if args.batch < 1 or args.gap_s < 0:
        raise UsageError("--batch must be >= 1 and --gap-s >= 0")
    if not 0 < args.half_width < 1:
        raise UsageError("--half-width: a fraction between 0 and 1 (0.01 is +-1 %)")
    if args.warmup < 0 or args.failures < 0 or args.upstream_failures < 0 or args.idle_requests < 0:
        raise UsageError("--warmup, --failures, --upstream-failures and --idle-requests must be >= 0")
    if args.idle_window_s <= 0:
        raise UsageError("--idle-window-s must be > 0")
    if args.kv_load_timeout_ms < 100:
        raise UsageError("--kv-load-timeout-ms: at least 100")
    if args.abort_timeout_s < 1:
        raise UsageError("--abort-timeout-s: at least 1")
    check_save_path(args.save)


def _q(v: list[float], q: float) -> float:
    s = sorted(v)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


def _stats(v: list[float]) -> dict:
    return {"n": len(v), "p50": round(_q(v, 0.5), 1), "p99": round(_q(v, 0.99), 1), "max": round(max(v), 1),
            "mean": round(statistics.fmean(v), 1)} if v else {"n": 0}


def run(args: argparse.Namespace) -> int:
    _check(args)
    from families.pd.family import FAMILY

    why = FAMILY.unavailable(None)
    if why:
        raise HarnessError(f"bench pd: {why}")
    workdir = Path(args.workdir or Path("runs") / time.strftime("bench-pd-%Y%m%d-%H%M%S"))
    workdir.mkdir(parents=True, exist_ok=True)
    topos: dict = {}
    with bench_signals():
        try:
            return _bench(args, workdir, topos)
        except Terminated:
            print("bench pd: stopped (SIGTERM); nodes stopped", file=sys.stderr)
            return 1
        finally:
            for t in topos.values():
                t.close()


def _start(args: argparse.Namespace, workdir: Path, topos: dict, names: tuple[str, ...]) -> None:
    """Start a pair per name, side by side: ``upstream``, ``hardened`` or ``hardened-loud``."""
    from families.pd.topology import PDTopology
    from harness.schema import load_scenario

    sc = load_scenario(BASELINE)
    sc.model.topology.abort_timeout = float(args.abort_timeout_s)
    sc.model.topology.kv_load_timeout = args.kv_load_timeout_ms / 1000.0
    events = open(workdir / "events.jsonl", "a", encoding="utf-8")
    lock = threading.Lock()

    def record(rec: dict) -> None:
        with lock:
            events.write(json.dumps(rec, default=str) + "\n")
            events.flush()

    errors: dict[str, BaseException] = {}

    def one(name: str) -> None:
        d = workdir / name
        d.mkdir(exist_ok=True)
        t = PDTopology(sc, "hardened" if name == LOUD else name, d, record, {})
        if name == LOUD:  # the same connector with quiet waiting switched off
            prof = t.profile.model_copy(deep=True)
            conn = prof.connectors["hardened"]
            conn.extra_config = {**conn.extra_config, "quiet_wait_max_ms": 0}
            t.profile = prof
        topos[name] = t
        try:
            t.start()
        except BaseException as exc:  # noqa: BLE001 - reported below, nodes stopped by run()
            errors[name] = exc

    threads = [threading.Thread(target=one, args=(n,), name=f"start-{n}") for n in names]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        name, exc = next(iter(errors.items()))
        raise HarnessError(f"bench pd: the {name} pair did not start: {exc} (logs in {workdir})")


def _complete(url: str, model: str, prompt: str, max_tokens: int, timeout: float,
              params: dict | None = None) -> tuple[int | None, str | None, float]:
    from families.pd.workload import Deadline, completion_text, post_json

    body: dict = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if params is not None:
        body["kv_transfer_params"] = params
    t0 = time.perf_counter()
    try:
        status, data = post_json(url, body, timeout)
    except (Deadline, OSError):
        return None, None, (time.perf_counter() - t0) * 1e6
    return status, (completion_text(data) if status == 200 else None), (time.perf_counter() - t0) * 1e6


def _paired(args, topos: dict, base: str, other: str, items: list[dict], model: str, rng: random.Random) -> dict:
    """Prompts to both pairs back to back (random order each), rounds of --batch until the p50
    ratio other/base is known to +- --half-width (95 %) or --n-max pairs."""
    urls = {t: topos[t].url("proxy") + "/v1/completions" for t in (base, other)}
    for t in (base, other):  # warm-up, unmeasured
        for item in items[: args.warmup]:
            _complete(urls[t], model, item["prompt"], 16, 60.0)
    lat: dict[str, list[float]] = {base: [], other: []}
    wrong = {base: 0, other: 0}
    pool = items[args.warmup:]
    ci: dict = {}
    i = 0
    while i < args.n_max:
        for _ in range(min(args.batch, args.n_max - i)):
            item = pool[i % len(pool)]
            i += 1
            order = [base, other]
            rng.shuffle(order)
            got = {}
            for t in order:
                time.sleep(args.gap_s)
                status, text, us = _complete(urls[t], model, item["prompt"], 16, 60.0)
                got[t] = us if status == 200 and text == item["expected"] else None
                if got[t] is None:
                    wrong[t] += 1
            if got[base] is not None and got[other] is not None:  # a pair counts only whole
                lat[base].append(got[base])
                lat[other].append(got[other])
        n = len(lat[base])
        if n >= 2:
            ci = {"p50": paired_ratio_ci(lat[base], lat[other], 0.5, seed=args.seed),
                  "p99": paired_ratio_ci(lat[base], lat[other], 0.99, seed=args.seed)}
        if ci:  # progress on stderr: one line per round
            print(f"bench pd: {other}/{base} after {n} pairs: p50 {_ci(ci['p50'])} (+-"
                  f"{ci['p50']['half_width'] * 100:.2f} %), p99 {_ci(ci['p99'])}", file=sys.stderr, flush=True)
        if n >= args.n_min and ci and ci["p50"]["half_width"] <= args.half_width:
            break
    return {"base": base, "other": other, "n": len(lat[base]), "sent": i, "ratio": ci,
            "stats": {t: _stats(v) for t, v in lat.items()}, "wrong": wrong, "samples": lat}


def _cpu_s(topo, role: str) -> float | None:
    st = topo.node_stats(role) or {}
    v = (st.get("counters") or {}).get("cpu_s", st.get("cpu_s"))
    return float(v) if isinstance(v, (int, float)) else None


def _idle_cpu(args, topo, model: str, items: list[dict], silent: dict) -> dict:
    """Fraction of a core D burns while its requests wait on the silent peer, and P while it keeps
    blocks no D pulls; None where a node's CPU time could not be read."""
    out: dict = {}

    def window(role: str) -> float | None:
        time.sleep(0.5)
        a, t0 = _cpu_s(topo, role), time.monotonic()
        time.sleep(args.idle_window_s)
        b, t1 = _cpu_s(topo, role), time.monotonic()
        return round((b - a) / (t1 - t0), 3) if a is not None and b is not None else None

    def send(url: str, params: dict, timeout: float, item: dict) -> threading.Thread:
        th = threading.Thread(target=_complete, args=(url, model, item["prompt"], 1, timeout, params), daemon=True)
        th.start()
        return th

    d_url = topo.url("decode:0") + "/v1/completions"
    ths = [send(d_url, {**silent, "transfer_id": f"idle-{uuid.uuid4().hex}"}, 120.0, items[-10 - k])
           for k in range(args.idle_requests)]
    out["d_waits_on_silent_peer"] = window("decode:0")
    for th in ths:
        th.join(0.1)
    p_url = topo.url("prefill:0") + "/v1/completions"
    for k in range(args.idle_requests):  # P computes, then keeps the blocks for a pull that never comes
        send(p_url, {"do_remote_decode": True, "do_remote_prefill": False,
                     "transfer_id": f"idle-p-{uuid.uuid4().hex}"}, 60.0, items[-20 - k]).join(60.0)
    out["p_keeps_blocks"] = window("prefill:0")
    return out


def _restarts(args, topo, model: str, items: list[dict], silent: dict) -> dict:
    """Seconds from killing P to a new P ready, with D idle and with D waiting on the silent peer."""
    def restart() -> float:
        t0 = time.monotonic()
        topo.restart_node("prefill:0", kill=True)
        return round(time.monotonic() - t0, 1)

    out = {"d_idle_s": restart()}
    d_url = topo.url("decode:0") + "/v1/completions"
    for k in range(max(1, args.idle_requests)):
        threading.Thread(target=_complete, args=(d_url, model, items[-30 - k]["prompt"], 1, 120.0,
                                                 {**silent, "transfer_id": f"restart-{uuid.uuid4().hex}"}),
                         daemon=True).start()
    time.sleep(0.5)
    out["d_waiting_s"] = restart()
    out["ratio"] = round(out["d_waiting_s"] / out["d_idle_s"], 3) if out["d_idle_s"] else None
    return out


def _silent_peer(topos: dict, host_name: str) -> dict:
    """Start the silent fake prefill peer on ``host_name``'s topology; its kv_transfer_params."""
    from families.pd.fake_faults import READY_TIMEOUT_S
    from families.pd.metrics import http_get
    from harness.topology import NodeSpec, free_tcp_port

    host = topos[host_name]
    bport, sport = free_tcp_port(), free_tcp_port()
    bootstrap = f"http://127.0.0.1:{bport}"
    host.start_node("fake-prefill:0", NodeSpec("pd-fake-prefill", ["--bootstrap-port", str(bport), "--side-port",
                                                                   str(sport), "--mode", "silent"],
                                               ready_timeout_s=READY_TIMEOUT_S,
                                               endpoints={"bootstrap": bootstrap}))
    status, body = http_get(bootstrap + "/query", 5.0)  # mode silent: the bootstrap answers truly
    engine = json.loads(body)["0"]["engine_id"] if status == 200 else None
    if not engine:
        raise HarnessError("bench pd: the fake prefill peer did not name its engine")
    return {"do_remote_decode": False, "do_remote_prefill": True, "remote_bootstrap_addr": bootstrap,
            "remote_engine_id": engine}


def _bench(args: argparse.Namespace, workdir: Path, topos: dict) -> int:
    from families.pd.workload import prepare
    from stacks.vllm_cpu.tiny_model import model_dir

    t_setup = time.monotonic()
    _start(args, workdir, topos, TARGETS)
    setup_s = time.monotonic() - t_setup
    model = str(model_dir())
    n_prompts = args.warmup + args.n_max + 40
    wl = {"decode_url": topos["upstream"].url("decode:0"), "model": model, "prompt_tokens": 200,
          "output_tokens": 16, "seed": args.seed, "duration_s": n_prompts, "rate": 1.0, "concurrency": 0,
          "prompts_path": str(workdir / "prompts.json"), "prepare_timeout_s": 900, "request_timeout_s": 60}
    items, _ = prepare(wl)
    rng = random.Random(args.seed)
    main = _paired(args, topos, "upstream", "hardened", items, model, rng)
    silent = _silent_peer(topos, "hardened")
    idle = {t: _idle_cpu(args, topos[t], model, items, silent) for t in TARGETS}
    failure = _failure_path(args, topos, items, model, silent)
    restarts = {t: _restarts(args, topos[t], model, items, silent) for t in TARGETS} if args.restart else {}
    quiet: dict | None = None
    if args.quiet_cost:
        topos.pop("upstream").close()  # two pairs fit in memory, three do not
        _start(args, workdir, topos, (LOUD,))
        quiet = _paired(args, topos, LOUD, "hardened", items, model, rng)
        idle[LOUD] = _idle_cpu(args, topos[LOUD], model, items, silent)
    r = main["ratio"]
    limit_ms = args.kv_load_timeout_ms + FAIL_SLACK_MS
    hard_fail = failure.get("hardened", {})
    hard_idle = list(idle["hardened"].values())
    summary = {
        "setup_s": round(setup_s, 1), "normal": {k: v for k, v in main.items() if k != "samples"},
        "quiet_cost": {k: v for k, v in quiet.items() if k != "samples"} if quiet else None,
        "targets": {"p50": TARGET_P50, "p50_hi": TARGET_P50_HI, "p99": TARGET_P99, "failure_p99_ms": limit_ms,
                    "idle_cpu": IDLE_CPU_TARGET, "half_width": args.half_width},
        "target_met": bool(r and r["p50"]["ratio"] <= TARGET_P50 and r["p50"]["hi"] <= TARGET_P50_HI
                           and r["p99"]["ratio"] <= TARGET_P99),
        "half_width_met": bool(r and r["p50"]["half_width"] <= args.half_width),
        "idle_cpu": idle,
        "idle_target_met": bool(hard_idle and all(v is not None and v <= IDLE_CPU_TARGET for v in hard_idle)),
        "failure_ms": failure,
        "restart": restarts,
        "restart_target_met": bool(restarts and (restarts["hardened"].get("ratio") or 9) <= 1.10),
        "failure_target_met": bool(hard_fail.get("n") and hard_fail.get("errors") == hard_fail.get("n")
                                   and hard_fail["p99"] <= limit_ms),
        "workdir": str(workdir)}
    if args.save:
        samples = {t: [round(x, 1) for x in main["samples"][t]] for t in TARGETS}
        if quiet:
            samples[LOUD] = [round(x, 1) for x in quiet["samples"][LOUD]]
        save_samples(args.save, "pd", "request", samples, n=main["n"], seed=args.seed)
        with open(Path(args.save).with_suffix(".failure.json"), "w", encoding="utf-8") as fh:
            json.dump({"failure_ms": failure, "idle_cpu": idle, "restart": restarts}, fh)
    if args.json:
        print(json.dumps(summary))
    else:
        _print(summary)
    wrong = sum(main["wrong"].values()) + (sum(quiet["wrong"].values()) if quiet else 0)
    return 1 if wrong or (args.failures and not summary["failure_target_met"]) else 0


def _failure_path(args: argparse.Namespace, topos: dict, items: list[dict], model: str, silent: dict) -> dict:
    counts = {"hardened": args.failures, "upstream": args.upstream_failures}
    if not any(counts.values()):
        return {}
    out: dict = {}
    results: dict[str, list] = {t: [] for t in TARGETS}
    wait_s = {"hardened": args.kv_load_timeout_ms / 1000.0 + 30.0, "upstream": args.abort_timeout_s + 90.0}
    k = 0
    for t in ("hardened", "upstream"):  # one target at a time: upstream's D spins while it waits
        threads = []
        time.sleep(args.gap_s)
        for _ in range(counts[t]):
            item = items[-1 - k]
            k += 1
            params = {**silent, "transfer_id": f"bench-{uuid.uuid4().hex}"}
            url = topos[t].url("decode:0") + "/v1/completions"

            def one(t=t, url=url, item=item, params=params) -> None:
                results[t].append(_complete(url, model, item["prompt"], 16, wait_s[t], params))

            th = threading.Thread(target=one, daemon=True)
            th.start()
            threads.append(th)
        for th in threads:
            th.join(wait_s[t] + 10.0)
    for t in TARGETS:
        r = results[t]
        if not r:
            continue
        ms = [us / 1000.0 for _, _, us in r]
        out[t] = {**_stats(ms), "errors": sum(1 for st, _, _ in r if st is not None and st >= 400),
                  "hung": sum(1 for st, _, _ in r if st is None), "ok": sum(1 for st, _, _ in r if st == 200)}
    out["upstream_default_note"] = "vLLM's default abort timeout (480 s) makes upstream wait 540 s"
    return out


def _ci(x: dict) -> str:
    return f"{x['ratio']:.3f} [{x['lo']:.3f}, {x['hi']:.3f}]"


def _print(s: dict) -> None:
    def pairs(block: dict, title: str) -> None:
        b, o, r = block["base"], block["other"], block["ratio"]
        print(f"{title}: {block['n']} prompt pairs ({block['sent']} sent), each to both pairs back to back, "
              f"random order")
        print(f"{'pair':14s} {'n':>5s} {'p50 ms':>9s} {'p99 ms':>9s} {'max ms':>9s}  wrong")
        for t in (b, o):
            x = block["stats"][t]
            if x.get("n"):
                print(f"{t:14s} {x['n']:5d} {x['p50'] / 1000:9.1f} {x['p99'] / 1000:9.1f} {x['max'] / 1000:9.1f}  "
                      f"{block['wrong'][t]}")
        if r:
            print(f"{o}/{b} (95 % bootstrap interval): p50 {_ci(r['p50'])} (+-{r['p50']['half_width'] * 100:.1f} %), "
                  f"p99 {_ci(r['p99'])}")

    t = s["targets"]
    print(f"pairs started in {s['setup_s']} s")
    pairs(s["normal"], "P/D normal path")
    print(f"targets p50 <= {t['p50']} with upper end <= {t['p50_hi']}, p99 <= {t['p99']}: "
          f"{'met' if s['target_met'] else 'NOT met'}; interval within +-{t['half_width'] * 100:g} %: "
          f"{'yes' if s['half_width_met'] else 'no (--n-max reached)'}")
    if s["quiet_cost"]:
        pairs(s["quiet_cost"], "Quiet waiting's own cost (hardened vs hardened with quiet_wait_max_ms 0)")
    print(f"Idle-wait CPU (fraction of a core, whole node: API server, engine core, worker), target hardened <= "
          f"{t['idle_cpu']}:")
    for name, x in s["idle_cpu"].items():
        print(f"{name:14s} D waiting on a silent peer {x.get('d_waits_on_silent_peer')}   "
              f"P keeping blocks no D pulls {x.get('p_keeps_blocks')}")
    print(f"idle target {'met' if s['idle_target_met'] else 'NOT met'}")
    if s["restart"]:
        print("P restarted (kill to ready), with D idle and with D waiting on a silent peer; target hardened "
              "within 10 %:")
        for name, x in s["restart"].items():
            print(f"{name:14s} D idle {x['d_idle_s']} s   D waiting {x['d_waiting_s']} s   ratio {x['ratio']}")
        print(f"restart target {'met' if s['restart_target_met'] else 'NOT met'}")
    f = s["failure_ms"]
    if f:
        print(f"Failure path (D pulls from a silent P): time to HTTP error, target hardened p99 <= "
              f"{t['failure_p99_ms']:.0f} ms")
        for name in TARGETS:
            x = f.get(name)
            if x and x.get("n"):
                print(f"{name:14s} n={x['n']} p50 {x['p50']:.0f} ms  p99 {x['p99']:.0f} ms  errors {x['errors']}  "
                      f"hung {x['hung']}  ok {x['ok']}")
        print(f"({f['upstream_default_note']}); failure target {'met' if s['failure_target_met'] else 'NOT met'}")
    print(f"node logs: {s['workdir']}")
