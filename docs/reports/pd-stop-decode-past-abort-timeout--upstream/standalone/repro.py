"""One request goes through P and D; then D is frozen (SIGSTOP of its process group) for 16 s,
longer than P's abort timeout (10 s), while a second request goes through P and D; then D is
thawed (SIGCONT).

    python repro.py --prefill URL --decode URL --bootstrap URL --decode-pgid PGID --abort-timeout-s 10
"""
import os
import signal
import threading

import argparse
import sys
import time

from pd_client import MODEL, decode, engine_info, pd_request, post, prefill, result, text_of  # noqa: F401

# any text of about 200 tokens of the tiny model (each request its own: nothing comes from a cache)
WORDS = ("the quick brown fox jumps over the lazy dog while the prefill node sends blocks to the "
         "decode node and every request waits for its turn in the queue before it runs").split()


def prompt(i):
    return f"request {i}: " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(170))

FREEZE_S = 16.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefill", required=True)
    ap.add_argument("--decode", required=True)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--decode-pgid", type=int, required=True)
    ap.add_argument("--abort-timeout-s", type=float, required=True)
    a = ap.parse_args()
    status, _, took = pd_request(a.prefill, a.decode, a.bootstrap, prompt(1), 16, 60)
    if status != 200:
        print(f"error: the first request (P and D healthy) answered {status}", file=sys.stderr)
        return 2
    print(f"first request through P and D: HTTP 200 in {took:.2f} s", flush=True)
    os.killpg(a.decode_pgid, signal.SIGSTOP)
    thaw = threading.Timer(FREEZE_S, os.killpg, (a.decode_pgid, signal.SIGCONT))
    thaw.start()
    try:
        status, _, took = pd_request(a.prefill, a.decode, a.bootstrap, prompt(2), 16, FREEZE_S + a.abort_timeout_s + 30)
    finally:
        thaw.cancel()
        os.killpg(a.decode_pgid, signal.SIGCONT)
    late = took - FREEZE_S
    what = "no answer" if status is None else f"HTTP {status}"
    print(f"D frozen {FREEZE_S:g} s (P's abort timeout {a.abort_timeout_s:g} s); the request sent during the "
          f"freeze: {what} after {took:.2f} s", flush=True)
    if status is None or late > 5.0:
        return result(True, f"the request ended {late:.1f} s after D thawed (D waited for a KV that P had "
                            "already freed)")
    return result(False, f"the request ended {late:.1f} s after D thawed")


if __name__ == "__main__":
    sys.exit(main())
