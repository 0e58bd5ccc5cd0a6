"""Two servers, A and B, run on one host, each with its own Mooncake master and the connector's
default settings (no lookup_rpc_port); A's scheduler connected to the admin channel after B's worker
had bound its socket (run.sh). The lookup sockets in RPC_DIR are counted.
Then A serves prompt 1 twice and B prompt 2 twice (the repeat must find the prompt in the engine's
own pool), then A serves prompt 2 and B prompt 1 (prompts the engine never saw: its own pool does
not hold them). Each step reads the engine's vllm:external_prefix_cache_hits_total before and after.

    python repro.py --a URL --a-admin URL --b URL --b-admin URL --rpc-dir RPC_DIR
"""
import argparse
import glob
import os
import sys
import time

from store_client import complete, master_keys, pool_hits, result

TIMEOUT_S = 60.0


def send(url, i):
    """Prompt i on a server: (status, seconds, pool hit tokens it counted)."""
    before = pool_hits(url)
    status, _, took = complete(url, i, TIMEOUT_S)
    return status, took, pool_hits(url) - before


def saved(admin, before):
    """Wait until the master holds more keys than before (the prompt's KV reached it)."""
    deadline = time.monotonic() + 15.0
    while time.monotonic() < deadline:
        keys = master_keys(admin)
        if keys is not None and keys > before:
            return keys
        time.sleep(0.5)
    return None


def main():
    ap = argparse.ArgumentParser()
    for e in ("a", "b"):
        ap.add_argument(f"--{e}", required=True)
        ap.add_argument(f"--{e}-admin", required=True, help="its master's admin URL")
    ap.add_argument("--rpc-dir", required=True, help="VLLM_RPC_BASE_PATH of both servers")
    a = ap.parse_args()
    socks = sorted(os.path.basename(p) for p in glob.glob(os.path.join(a.rpc_dir, "lookup_rpc_*")))
    print(f"lookup sockets for the two engines: {len(socks)}", flush=True)
    eng = {"A": (a.a, a.a_admin, 1), "B": (a.b, a.b_admin, 2)}
    own, cross = {}, {}
    for name, (url, admin, i) in eng.items():
        keys = master_keys(admin) or 0
        status, took, _ = send(url, i)
        if status != 200 or saved(admin, keys) is None:
            print(f"error: {name} did not answer prompt {i} (HTTP {status}) or its KV never reached "
                  f"{name}'s pool", flush=True)
            return 2
        status, took, own[name] = send(url, i)
        print(f"{name}, prompt {i} again: HTTP {status} after {took:.2f} s; tokens found in the pool: "
              f"{own[name]:g}", flush=True)
    for name, other in (("A", "B"), ("B", "A")):
        url, i = eng[name][0], eng[other][2]
        status, took, cross[name] = send(url, i)
        print(f"{name}, prompt {i} (only {other} served it): HTTP {status} after {took:.2f} s; tokens found "
              f"in the pool: {cross[name]:g}", flush=True)
    wrong = [n for n in eng if own[n] == 0 or cross[n] > 0]
    if wrong:
        n = wrong[0]
        o = "B" if n == "A" else "A"
        return result(True, f"engine {n}'s lookups are answered by engine {o}'s worker ({len(socks)} lookup "
                            f"socket for 2 engines): a repeat of {n}'s own prompt found {own[n]:g} tokens in "
                            f"its pool, a prompt only {o} served found {cross[n]:g}")
    return result(False, f"each engine looks up its own pool ({len(socks)} lookup sockets): repeats found "
                         f"{own['A']:g} (A) and {own['B']:g} (B) tokens, the other engine's prompts 0")


if __name__ == "__main__":
    sys.exit(main())
