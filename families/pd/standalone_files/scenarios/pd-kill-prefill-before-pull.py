"""One request goes through P and D; a second is prefilled by P, then P is killed (SIGKILL) before D
pulls the prompt's KV; then the second request goes to D, which pulls from the dead P.

    python repro.py --prefill URL --decode URL --bootstrap URL --prefill-pgid PGID
"""
import os
import signal
import urllib.request

import argparse
import sys
import time

from pd_client import MODEL, decode, engine_info, pd_request, post, prefill, result, text_of  # noqa: F401

# any text of about 200 tokens of the tiny model (each request its own: nothing comes from a cache)
WORDS = ("the quick brown fox jumps over the lazy dog while the prefill node sends blocks to the "
         "decode node and every request waits for its turn in the queue before it runs").split()


def prompt(i):
    return f"request {i}: " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(170))

WAIT_S = 20.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefill", required=True)
    ap.add_argument("--decode", required=True)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--prefill-pgid", type=int, required=True)
    a = ap.parse_args()
    status, _, took = pd_request(a.prefill, a.decode, a.bootstrap, prompt(1), 16, 60)
    if status != 200:
        print(f"error: the first request (P and D healthy) answered {status}", file=sys.stderr)
        return 2
    print(f"first request through P and D: HTTP 200 in {took:.2f} s", flush=True)
    engine_id, _ = engine_info(a.bootstrap)
    status, _, _ = prefill(a.prefill, prompt(2), "transfer-2", 60)
    if status != 200:
        print(f"error: P's prefill of the second request answered {status}", file=sys.stderr)
        return 2
    os.killpg(a.prefill_pgid, signal.SIGKILL)
    for _ in range(100):  # until P's HTTP port refuses
        try:
            urllib.request.urlopen(a.prefill + "/health", timeout=1)
        except OSError:
            break
        time.sleep(0.1)
    print("P killed (SIGKILL) after prefilling the second request; sending it to D", flush=True)
    status, _, took = decode(a.decode, prompt(2), 16, a.bootstrap, engine_id, "transfer-2", WAIT_S)
    if status is None:
        return result(True, f"D did not answer within {WAIT_S:g} s of the dead P (it waits "
                            "VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT + 60 s)")
    return result(False, f"D answered HTTP {status} after {took:.2f} s")


if __name__ == "__main__":
    sys.exit(main())
