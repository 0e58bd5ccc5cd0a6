"""Node ``echo-workload``: paced workers, one REQ socket each; every echo is an op."""

from __future__ import annotations

import argparse
import json
import random
import signal
import threading
import time

import zmq

from nodekit.control import process_stats
from nodekit.journal import JournalWriter
from nodekit.nodeio import watch_parent


def add_node_arguments(p: argparse.ArgumentParser, kind: str) -> None:  # noqa: ARG001
    p.add_argument("--config", required=True)
    p.add_argument("--journal", required=True)


def run_node(args: argparse.Namespace) -> int:
    cfg = json.loads(open(args.config, encoding="utf-8").read())
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    orphaned = threading.Event()
    watch_parent(orphaned)  # the runner died (SIGKILL): stop issuing ops (before the baseline: its thread counts)
    jw = JournalWriter(args.journal)
    jw.write({"type": "probe", "node": "client", "kind": "echo-workload", "when": "baseline",
              "t": time.monotonic(), **process_stats(), "counters": {}})
    print("READY", flush=True)
    if signal.sigtimedwait({signal.SIGUSR1}, 30.0) is None:
        return 0
    n, rate, timeout = int(cfg["concurrency"]), float(cfg["rate"]), int(cfg["deadline_ms"])
    t_end = time.monotonic() + float(cfg["duration_s"])
    ids = iter(range(1, 1_000_000))
    lock = threading.Lock()
    ctx = zmq.Context()

    def worker(w: int) -> None:
        rng = random.Random(cfg["seed"] * 100 + w)
        sock = None
        nxt = time.monotonic()
        while time.monotonic() < t_end and not orphaned.is_set():
            if sock is None:
                sock = ctx.socket(zmq.REQ)
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(cfg["endpoint"])
            with lock:
                i = next(ids)
            word = f"w{w}-{rng.randrange(10**6)}"
            t = time.monotonic()
            jw.write({"type": "op", "id": i, "process": w, "f": "echo", "phase": "invoke", "t": t,
                      "expected": word.upper() if cfg["shout"] else word})
            sock.send_string(word)
            if sock.poll(timeout):
                value, phase, outcome = sock.recv_string(), "ok", "ok"
            else:
                value, phase, outcome = None, "fail", "timeout"
                sock.close(0)
                sock = None
            now = time.monotonic()
            jw.write({"type": "op", "id": i, "process": w, "f": "echo", "phase": phase, "t": now, "value": value,
                      "outcome": outcome, "code": "", "elapsed_ms": (now - t) * 1000})
            nxt += n / rate
            time.sleep(max(0.0, nxt - time.monotonic()))
        if sock is not None:
            sock.close(0)

    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    ctx.term()
    jw.write({"type": "probe", "node": "client", "kind": "echo-workload", "when": "final", "t": time.monotonic(),
              **process_stats(), "counters": {}, "alive": True})
    jw.close()
    return 0
