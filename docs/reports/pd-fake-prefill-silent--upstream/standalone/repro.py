"""D gets one request whose prefill node (fake_prefill.py, same folder) takes D's KV pull on its side
channel and never answers it: a prefill node that hangs after the handshake.

    python repro.py --decode http://127.0.0.1:D_PORT --bootstrap http://127.0.0.1:FAKE_BOOTSTRAP_PORT
"""
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
    ap.add_argument("--decode", required=True)
    ap.add_argument("--bootstrap", required=True)
    a = ap.parse_args()
    engine_id, _ = engine_info(a.bootstrap)
    status, _, took = decode(a.decode, prompt(1), 16, a.bootstrap, engine_id, "transfer-1", WAIT_S)
    if status is None:
        return result(True, f"D did not answer within {WAIT_S:g} s (it waits for the pull's reply until its "
                            "receive timeout, VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT + 60 s)")
    return result(False, f"D answered HTTP {status} after {took:.2f} s")


if __name__ == "__main__":
    sys.exit(main())
