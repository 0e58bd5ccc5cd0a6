"""One message of 3 frames reaches P's Mooncake side channel (where D's pulls arrive; P's ROUTER
expects [identity, payload]); then a request goes through P and D.

    python repro.py --prefill URL --decode URL --bootstrap URL
"""
import zmq

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
    a = ap.parse_args()
    status, _, took = pd_request(a.prefill, a.decode, a.bootstrap, prompt(1), 16, 60)
    if status != 200:
        print(f"error: the first request (P and D healthy) answered {status}", file=sys.stderr)
        return 2
    print(f"first request through P and D: HTTP 200 in {took:.2f} s", flush=True)
    _, side = engine_info(a.bootstrap)
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 1000)
    s.connect(side)
    s.send_multipart([b"not-a-pull", b"not-a-pull"])  # P's ROUTER receives [identity, frame, frame]
    time.sleep(1.0)
    s.close()
    ctx.term()
    print("sent one 3-frame message to P's side channel", flush=True)
    status, _, took = pd_request(a.prefill, a.decode, a.bootstrap, prompt(2), 16, WAIT_S)
    if status is None:
        return result(True, f"the next request through P and D did not return within {WAIT_S:g} s "
                            "(P's side channel no longer answers pulls)")
    if status != 200:
        return result(True, f"the next request through P and D failed: HTTP {status} after {took:.2f} s")
    return result(False, f"the next request through P and D answered HTTP 200 after {took:.2f} s")


if __name__ == "__main__":
    sys.exit(main())
