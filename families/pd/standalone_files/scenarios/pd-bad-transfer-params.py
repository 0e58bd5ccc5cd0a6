"""D alone gets a request whose kv_transfer_params say "the prompt's KV is on a remote prefill node"
(do_remote_prefill) but lack transfer_id and remote_bootstrap_addr, so no KV can ever be pulled.

    python repro.py --decode http://127.0.0.1:D_PORT
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

WAIT_S = 15.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--decode", required=True)
    a = ap.parse_args()
    params = {"do_remote_decode": False, "do_remote_prefill": True, "remote_engine_id": "engine-never-queried"}
    body = {"model": MODEL, "prompt": prompt(1), "max_tokens": 16, "temperature": 0, "kv_transfer_params": params}
    status, answer, took = post(a.decode + "/v1/completions", body, WAIT_S)
    if status is None:
        return result(True, f"D did not answer within {WAIT_S:g} s; the request stays queued (see "
                            "vllm:num_requests_waiting in D's /metrics) and holds its KV blocks")
    return result(False, f"D answered HTTP {status} after {took:.2f} s"
                         + (f" ({len(text_of(answer) or '')} characters of text)" if status == 200 else ""))


if __name__ == "__main__":
    sys.exit(main())
