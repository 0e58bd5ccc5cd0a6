"""``pdchaos bench lookup``: the normal path, hardened vs legacy, in one interleaved run.

Setup: two server processes started by this command, each on its own ipc endpoint in a fresh
``/tmp/pdc*`` folder and each holding the same preloaded hashes in a memory backend:
``pdchaos node lookup-server`` (hardened, protocol v1) and ``pdchaos node legacy-server`` (the model
of today's upstream). Clients in this process: ``LookupClient`` and ``LegacyLookupClient``.

Workload: ``--n`` measured lookups per target after ``--warmup`` unmeasured ones. Each op is a hit
(the preloaded ``--hashes`` hashes, token_len = hashes x block size: a full hit) or a miss (as many
hashes that are not stored: hit 0), half and half in a seeded random order. Every op is run on
both targets back to back, in a random order per op (A/B or B/A), so machine drift and cache
effects hit both alike. One op's latency is the wall time of one ``client.lookup()`` call
(``time.perf_counter_ns``), encoding, round trip and reply decoding included.

Every answer is checked (a hit must return token_len, a miss 0): a wrong answer or a hardened
fail-open makes the exit code 1. The latency target (hardened/legacy p50 <= 1.05, p99 <= 1.10) is
reported as ``target_met``; missing it is a finding, not a failure of the command (exit 0).

The servers are stopped (SIGTERM, then SIGKILL) and the folder removed on every exit path:
normal end, error, Ctrl-C, SIGTERM. The legacy client has no timeout by design; so that a dead
legacy server cannot hang the benchmark, its zmq Context gives new sockets a 30 s receive timeout
(a context default: the model's code is unchanged and the per-op cost is the same).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

import zmq

from connector_patch.lookup.legacy import LegacyLookupClient
from connector_patch.lookup import LookupClient
from connector_patch.lookup.protocol import MAX_HASHES

from harness.errors import HarnessError, UsageError
from harness.procs import ProcHandle, start_node
from harness.benchkit import Terminated, bench_signals, check_save_path, save_samples

TARGET_P50 = 1.05
TARGET_P99 = 1.10
_LEGACY_SAFETY_TIMEOUT_MS = 30_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n", type=int, default=5000, help="measured lookups per target (>= 100, default 5000)")
    p.add_argument("--warmup", type=int, default=500, help="unmeasured lookups per target first (default 500)")
    p.add_argument("--hashes", type=int, default=32, help="block hashes per lookup (default 32)")
    p.add_argument("--block-size", type=int, default=16, help="the servers' tokens per block (default 16)")
    p.add_argument("--seed", type=int, default=0, help="order of hits, misses and A/B (default 0)")
    p.add_argument("--timeout-ms", type=int, default=5000, help="the hardened client's deadline (default 5000)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--save", metavar="PATH", help="write the raw per-op latencies (microseconds) as JSON")


def _check_args(args: argparse.Namespace) -> None:
    if args.n < 100:
        raise UsageError(f"--n: must be at least 100 (p99 needs 100 samples), got {args.n}")
    if args.warmup < 0:
        raise UsageError(f"--warmup: must be >= 0, got {args.warmup}")
    if not 1 <= args.hashes <= MAX_HASHES:
        raise UsageError(f"--hashes: must be in 1..{MAX_HASHES}, got {args.hashes}")
    if args.block_size <= 0:
        raise UsageError(f"--block-size: must be a positive integer, got {args.block_size}")
    if args.timeout_ms <= 0:
        raise UsageError(f"--timeout-ms: must be a positive integer, got {args.timeout_ms}")
    check_save_path(args.save)


def _stats(samples: list[float]) -> dict[str, float]:
    q = statistics.quantiles(samples, n=100, method="inclusive")
    return {"p50_us": round(q[49], 2), "p99_us": round(q[98], 2), "mean_us": round(statistics.fmean(samples), 2),
            "max_us": round(max(samples), 2), "min_us": round(min(samples), 2)}


def run(args: argparse.Namespace) -> int:
    _check_args(args)
    # Ctrl-C or kill -INT stops the bench also when it was started with SIGINT ignored (a job
    # started in the background inherits that: CI's test run did, and the bench never heard it)
    with bench_signals():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    base = tempfile.gettempdir()  # honours TMPDIR, unless that would make ipc paths too long
    workdir = tempfile.mkdtemp(prefix="pdc", dir=base if len(base) <= 64 else "/tmp")
    nodes: list[ProcHandle] = []
    stuck = None
    try:
        return _bench(args, workdir, nodes)
    except Terminated:
        print("terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except _Stuck as exc:  # interrupted, and the sockets would not close: see _close_bounded
        stuck = 128 + (signal.SIGTERM if isinstance(exc.__context__, Terminated) else signal.SIGINT)
        print(f"interrupted; the clients' sockets did not close within {CLOSE_BOUND_S:g} s", file=sys.stderr)
        return stuck
    finally:
        for node in nodes:
            node.stop(5.0)
        shutil.rmtree(workdir, ignore_errors=True)
        if stuck is not None:
            sys.stderr.flush()
            os._exit(stuck)


CLOSE_BOUND_S = 5.0


class _Stuck(Exception):
    """The clients' sockets did not close within CLOSE_BOUND_S after an interrupt."""


def _close_bounded(hardened: Any, legacy: Any, ctx: Any) -> None:
    """Close both clients and the legacy context on a helper thread, waiting at most
    CLOSE_BOUND_S: a Ctrl-C or SIGTERM that lands inside a zmq call can leave a socket that
    ``term()`` waits for forever (CI, once in a full test run: the bench ignored SIGINT for 20 s).
    Past the bound the bench gives up on them (``_Stuck``): run() stops the servers, removes its
    folder and ends the process at once, so an interpreter exit cannot wait on that context."""
    def close() -> None:
        hardened.close()
        legacy.close()
        ctx.destroy(linger=0)

    t = threading.Thread(target=close, name="bench-close", daemon=True)
    t.start()
    t.join(CLOSE_BOUND_S)
    if t.is_alive():
        raise _Stuck()


def _bench(args: argparse.Namespace, workdir: str, nodes: list[ProcHandle]) -> int:
    rng = random.Random(args.seed)
    k, bs = args.hashes, args.block_size
    token_len = k * bs
    stored = [rng.randbytes(32) for _ in range(k)]
    misses = [[rng.randbytes(32) for _ in range(k)] for _ in range(16)]  # never stored
    preload = os.path.join(workdir, "preload.txt")
    with open(preload, "w", encoding="utf-8") as fh:
        fh.write("\n".join(h.hex() for h in stored) + "\n")
    ep_h, ep_l = f"ipc://{workdir}/hardened", f"ipc://{workdir}/legacy"
    common = ["--backend", "memory", "--block-size", str(bs), "--preload", preload, "--log-level", "WARNING"]
    nodes.append(start_node("lookup-server", ["--endpoint", ep_h, *common],
                            log_path=os.path.join(workdir, "hardened.log")))
    nodes.append(start_node("legacy-server", ["--endpoint", ep_l, *common],
                            log_path=os.path.join(workdir, "legacy.log")))

    legacy_ctx = zmq.Context()
    legacy_ctx.setsockopt(zmq.RCVTIMEO, _LEGACY_SAFETY_TIMEOUT_MS)
    legacy_ctx.setsockopt(zmq.LINGER, 0)
    hardened = LookupClient(ep_h, args.timeout_ms)
    legacy = LegacyLookupClient(ep_l, context=legacy_ctx)
    total = args.warmup + args.n
    kinds = ["hit" if rng.random() < 0.5 else "miss" for _ in range(total)]
    orders = [rng.random() < 0.5 for _ in range(total)]
    miss_pick = [rng.randrange(len(misses)) for _ in range(total)]
    lat = {"hardened": [0.0] * args.n, "legacy": [0.0] * args.n}
    wrong = {"hardened": 0, "legacy": 0}
    clients = {"hardened": hardened, "legacy": legacy}
    pc = time.perf_counter_ns
    start = time.monotonic()
    try:
        gc.collect()
        for i in range(total):
            if kinds[i] == "hit":
                hashes, expected = stored, token_len
            else:
                hashes, expected = misses[miss_pick[i]], 0
            for name in (("hardened", "legacy") if orders[i] else ("legacy", "hardened")):
                client = clients[name]
                t0 = pc()
                try:
                    hit = client.lookup(token_len, hashes)
                except zmq.Again:  # only the legacy client raises; see the module docstring
                    raise HarnessError(f"bench: the {name} server did not answer within "
                                       f"{_LEGACY_SAFETY_TIMEOUT_MS // 1000} s") from None
                t1 = pc()
                if hit != expected:
                    wrong[name] += 1
                if i >= args.warmup:
                    lat[name][i - args.warmup] = (t1 - t0) / 1000.0
        counters = hardened.counters
    finally:
        _close_bounded(hardened, legacy, legacy_ctx)
    elapsed = time.monotonic() - start
    for node in nodes:
        if not node.alive:
            raise HarnessError(f"bench: {node.name} exited during the run (code {node.returncode})")

    h, lg = _stats(lat["hardened"]), _stats(lat["legacy"])
    ratio = {"p50": round(h["p50_us"] / lg["p50_us"], 4), "p99": round(h["p99_us"] / lg["p99_us"], 4),
             "mean": round(h["mean_us"] / lg["mean_us"], 4)}
    measured_kinds = kinds[args.warmup:]
    summary = {
        "target_name": "lookup",
        "hardened": {**h, "wrong": wrong["hardened"], "fail_open": sum(
            v for c, v in counters.items() if c not in ("ok", "socket_rebuilds", "reset_ok"))},
        "legacy": {**lg, "wrong": wrong["legacy"]},
        "ratio": ratio,
        "delta_us": {"p50": round(h["p50_us"] - lg["p50_us"], 2), "p99": round(h["p99_us"] - lg["p99_us"], 2)},
        "target": {"p50": TARGET_P50, "p99": TARGET_P99},
        "target_met": ratio["p50"] <= TARGET_P50 and ratio["p99"] <= TARGET_P99,
        "n": args.n,
        "warmup": args.warmup,
        "hits": measured_kinds.count("hit"),
        "misses": measured_kinds.count("miss"),
        "hashes": k,
        "block_size": bs,
        "token_len": token_len,
        "transport": "ipc",
        "backend": "memory",
        "seed": args.seed,
        "elapsed_s": round(elapsed, 3),
    }
    if args.save:
        save_samples(args.save, "lookup", "lookup", {t: [round(x, 3) for x in lat[t]] for t in ("hardened", "legacy")},
                     n=args.n, seed=args.seed, hashes=k, token_len=token_len, kinds=measured_kinds)
    if args.json:
        print(json.dumps(summary))
    else:
        _print_table(summary)
    return 0 if wrong["hardened"] == 0 and wrong["legacy"] == 0 else 1


def _print_table(s: dict) -> None:
    print(f"bench lookup  n={s['n']} per target (+{s['warmup']} warmup)  hashes={s['hashes']} "
          f"(token_len {s['token_len']})  hits={s['hits']} misses={s['misses']}  ipc, memory backend")
    print(f"  {'':9} {'p50 us':>9} {'p99 us':>9} {'mean us':>9} {'max us':>9} {'wrong':>6}")
    for name in ("hardened", "legacy"):
        r = s[name]
        print(f"  {name:9} {r['p50_us']:9.1f} {r['p99_us']:9.1f} {r['mean_us']:9.1f} {r['max_us']:9.1f} "
              f"{r['wrong']:6d}")
    ra = s["ratio"]
    met = "met" if s["target_met"] else "NOT met"
    print(f"  {'ratio':9} {ra['p50']:9.3f} {ra['p99']:9.3f} {ra['mean']:9.3f}")
    print(f"target hardened/legacy p50 <= {TARGET_P50}, p99 <= {TARGET_P99}: {met}  "
          f"({s['elapsed_s']:.1f} s)")
