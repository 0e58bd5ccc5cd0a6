"""``pdchaos bench pd``: the P/D normal path and failure path, upstream vs hardened, in one run.

Setup: two real P/D pairs started side by side by this command, each as a scenario run would
start it (``PDTopology`` of ``scenarios/pd/baseline.yaml``: a vLLM prefill and decode server and
the project's proxy): ``upstream`` (vLLM's MooncakeConnector) and ``hardened``
(connector_patch's HardenedMooncakeConnector). Node logs go to ``--workdir``.

**Normal path**: ``--n`` prompts (unique, ~200 tokens, greedy, 16 output tokens: the baseline
workload's), sent one at a time in blocks of ``--block``: each block to both pairs' proxies, in a
random order per block (A/B or B/A), after ``--warmup`` unmeasured ones per pair. Before each block
the bench waits ``--pause-s`` (vLLM's engine and worker busy-loop for 1 s after their last step, so
two pairs served back to back on 2 cores would slow each other). One sample is the wall time of one completion through
the proxy (P's prefill, D's pull, D's decode). Every answer must be HTTP 200 with the reference
text (D alone, greedy): anything else makes the exit code 1. Reported: p50/p99 per target and
the ratios hardened/upstream, with the targets p50 <= 1.02 and p99 <= 1.05 (``target_met``; a
miss is a finding, not a failure of the command). The noise floor is measured in the same run:
the ratio of the two halves of upstream's own samples (even vs odd prompts).

**Failure path**: a ``pd-fake-prefill`` peer in mode ``silent`` (takes D's pull, never answers:
a P that hangs after the handshake). ``--failures`` requests are sent straight to each target's D
with ``kv_transfer_params`` naming that peer, all at once, one target after the other; one sample is the time from sending
to the HTTP error. The hardened target must answer within ``kv_load_timeout_ms`` + 500 ms (p99);
upstream waits its DEALER's receive timeout, abort timeout + 60 s (``--abort-timeout-s`` 10:
70 s; vLLM's default 480 s gives 540 s, measured by scenarios/pd-long/), so it gets
``--upstream-failures`` requests (default 2, in parallel; 0 skips it).

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
from harness.benchkit import Terminated, bench_signals, check_save_path, save_samples

TARGETS = ("upstream", "hardened")
TARGET_P50 = 1.02
TARGET_P99 = 1.05
FAIL_SLACK_MS = 500.0
BASELINE = Path(__file__).resolve().parents[2] / "scenarios" / "pd" / "baseline.yaml"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n", type=int, default=60, help="measured prompts per target (>= 20, default 60)")
    p.add_argument("--warmup", type=int, default=4, help="unmeasured prompts per target first (default 4)")
    p.add_argument("--block", type=int, default=10, help="prompts per A/B block (default 10)")
    p.add_argument("--pause-s", type=float, default=1.5,
                   help="quiet time before each block, so the other pair's engines stop spinning (default 1.5)")
    p.add_argument("--failures", type=int, default=5, help="failure-path requests to the hardened D (default 5)")
    p.add_argument("--upstream-failures", type=int, default=2,
                   help="failure-path requests to the upstream D, which waits abort timeout + 60 s (default 2)")
    p.add_argument("--kv-load-timeout-ms", type=int, default=2000, help="the hardened D's load deadline")
    p.add_argument("--abort-timeout-s", type=int, default=10, help="VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT (default 10)")
    p.add_argument("--seed", type=int, default=0, help="prompts and A/B order (default 0)")
    p.add_argument("--workdir", default=None, help="folder for node logs (default: runs/bench-pd-<time>)")
    p.add_argument("--save", metavar="PATH", help="write the raw samples (microseconds) as JSON")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")


def _check(args: argparse.Namespace) -> None:
    if args.n < 20:
        raise UsageError("--n: at least 20 prompts per target")
    if args.block < 1 or args.pause_s < 0:
        raise UsageError("--block must be >= 1 and --pause-s >= 0")
    if args.warmup < 0 or args.failures < 0 or args.upstream_failures < 0:
        raise UsageError("--warmup, --failures and --upstream-failures must be >= 0")
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


def _start(args: argparse.Namespace, workdir: Path, topos: dict) -> None:
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

    def one(target: str) -> None:
        d = workdir / target
        d.mkdir(exist_ok=True)
        t = PDTopology(sc, target, d, record, {})
        topos[target] = t
        try:
            t.start()
        except BaseException as exc:  # noqa: BLE001 - reported below, nodes stopped by run()
            errors[target] = exc

    threads = [threading.Thread(target=one, args=(t,), name=f"start-{t}") for t in TARGETS]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        target, exc = next(iter(errors.items()))
        raise HarnessError(f"bench pd: the {target} pair did not start: {exc} (logs in {workdir})")


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


def _bench(args: argparse.Namespace, workdir: Path, topos: dict) -> int:
    from families.pd.workload import prepare
    from stacks.vllm_cpu.tiny_model import model_dir

    t_setup = time.monotonic()
    _start(args, workdir, topos)
    setup_s = time.monotonic() - t_setup
    model = str(model_dir())
    up, hard = topos["upstream"], topos["hardened"]
    wl = {"decode_url": up.url("decode:0"), "model": model, "prompt_tokens": 200, "output_tokens": 16,
          "seed": args.seed, "duration_s": args.n + args.warmup, "rate": 1.0, "concurrency": 0,
          "prompts_path": str(workdir / "prompts.json"), "prepare_timeout_s": 600, "request_timeout_s": 60}
    items, _ = prepare(wl)
    rng = random.Random(args.seed)
    lat: dict[str, list[float]] = {t: [] for t in TARGETS}
    wrong: dict[str, int] = {t: 0 for t in TARGETS}
    urls = {t: topos[t].url("proxy") + "/v1/completions" for t in TARGETS}
    for t in TARGETS:  # warm-up, unmeasured
        for item in items[: args.warmup]:
            _complete(urls[t], model, item["prompt"], 16, 60.0)
    measured = items[args.warmup: args.warmup + args.n]
    for b in range(0, len(measured), args.block):
        order = list(TARGETS)
        rng.shuffle(order)  # A/B or B/A per block: drift hits both alike
        for t in order:
            time.sleep(args.pause_s)  # vLLM's engine and worker spin for 1 s after their last step
            for item in measured[b: b + args.block]:
                status, text, us = _complete(urls[t], model, item["prompt"], 16, 60.0)
                if status != 200 or text != item["expected"]:
                    wrong[t] += 1
                else:
                    lat[t].append(us)
    s = {t: _stats(v) for t, v in lat.items()}
    ratio = {k: round(s["hardened"][k] / s["upstream"][k], 3) if lat["hardened"] and lat["upstream"] else None
             for k in ("p50", "p99")}
    ev, od = lat["upstream"][0::2], lat["upstream"][1::2]
    noise = {k: round(_q(ev, q) / _q(od, q), 3) if ev and od else None for k, q in (("p50", 0.5), ("p99", 0.99))}
    failure = _failure_path(args, topos, items, model)
    limit_ms = args.kv_load_timeout_ms + FAIL_SLACK_MS
    hard_fail = failure.get("hardened", {})
    summary = {
        "n": args.n, "setup_s": round(setup_s, 1), "normal_us": s, "ratio": ratio, "noise_floor": noise,
        "targets": {"p50": TARGET_P50, "p99": TARGET_P99, "failure_p99_ms": limit_ms},
        "target_met": bool(ratio["p50"] is not None and ratio["p50"] <= TARGET_P50 and ratio["p99"] <= TARGET_P99),
        "wrong": wrong, "failure_ms": failure,
        "failure_target_met": bool(hard_fail.get("n") and hard_fail.get("errors") == hard_fail.get("n")
                                   and hard_fail["p99"] <= limit_ms),
        "workdir": str(workdir)}
    if args.save:
        save_samples(args.save, "pd", "request", {t: [round(x, 1) for x in lat[t]] for t in TARGETS},
                     n=args.n, seed=args.seed)
        with open(Path(args.save).with_suffix(".failure.json"), "w", encoding="utf-8") as fh:
            json.dump(failure, fh)
    if args.json:
        print(json.dumps(summary))
    else:
        _print(summary)
    return 1 if any(wrong.values()) or (args.failures and not summary["failure_target_met"]) else 0


def _failure_path(args: argparse.Namespace, topos: dict, items: list[dict], model: str) -> dict:
    from families.pd.fake_faults import READY_TIMEOUT_S
    from families.pd.metrics import http_get
    from harness.topology import NodeSpec, free_tcp_port

    counts = {"hardened": args.failures, "upstream": args.upstream_failures}
    if not any(counts.values()):
        return {}
    host = topos["hardened"]
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
    out: dict = {}
    results: dict[str, list] = {t: [] for t in TARGETS}
    wait_s = {"hardened": args.kv_load_timeout_ms / 1000.0 + 30.0, "upstream": args.abort_timeout_s + 90.0}
    k = 0
    for t in ("hardened", "upstream"):  # one target at a time: upstream's D spins while it waits
        threads = []
        time.sleep(args.pause_s)
        for _ in range(counts[t]):
            item = items[-1 - k]
            k += 1
            params = {"do_remote_decode": False, "do_remote_prefill": True, "remote_bootstrap_addr": bootstrap,
                      "remote_engine_id": engine, "transfer_id": f"bench-{uuid.uuid4().hex}"}
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


def _print(s: dict) -> None:
    n, r, nf = s["normal_us"], s["ratio"], s["noise_floor"]
    print(f"P/D normal path: {s['n']} prompts per target through the proxy, interleaved (pairs started in "
          f"{s['setup_s']} s)")
    print(f"{'target':10s} {'n':>5s} {'p50 ms':>9s} {'p99 ms':>9s} {'max ms':>9s}  wrong")
    for t in TARGETS:
        x = n[t]
        if x.get("n"):
            print(f"{t:10s} {x['n']:5d} {x['p50'] / 1000:9.1f} {x['p99'] / 1000:9.1f} {x['max'] / 1000:9.1f}  "
                  f"{s['wrong'][t]}")
    print(f"hardened/upstream: p50 {r['p50']} (target <= {TARGET_P50}), p99 {r['p99']} (target <= {TARGET_P99}); "
          f"noise floor (upstream even/odd prompts): p50 {nf['p50']}, p99 {nf['p99']}; "
          f"target {'met' if s['target_met'] else 'NOT met'}")
    f = s["failure_ms"]
    if f:
        print(f"Failure path (D pulls from a silent P): time to HTTP error, target hardened p99 <= "
              f"{s['targets']['failure_p99_ms']:.0f} ms")
        for t in TARGETS:
            x = f.get(t)
            if x and x.get("n"):
                print(f"{t:10s} n={x['n']} p50 {x['p50']:.0f} ms  p99 {x['p99']:.0f} ms  errors {x['errors']}  "
                      f"hung {x['hung']}  ok {x['ok']}")
        print(f"({f['upstream_default_note']}); failure target {'met' if s['failure_target_met'] else 'NOT met'}")
    print(f"node logs: {s['workdir']}")
