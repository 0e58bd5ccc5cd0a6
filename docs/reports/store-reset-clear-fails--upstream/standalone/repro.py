"""The server answers prompt 1 and saves its KV to the pool (the master's key count rises). Then
the Mooncake master is killed (SIGKILL of its process group), and the server is asked to reset its
prefix cache and the KV pool, as an RL loop does after a weight update: POST
/reset_prefix_cache?reset_external=true (vLLM's dev API, VLLM_SERVER_DEV_MODE=1).

    python repro.py --server URL --master-pgid PGID --master-admin URL
"""
import argparse
import os
import signal
import sys
import time

from store_client import complete, master_keys, post, result

RESET_WAIT_S = 60.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--master-pgid", type=int, required=True)
    ap.add_argument("--master-admin", required=True, help="the master's admin URL (its -metrics_port)")
    a = ap.parse_args()
    status, _, took = complete(a.server, 1, 120)
    if status != 200:
        print(f"error: prompt 1 was not answered (HTTP {status}) before any fault", flush=True)
        return 2
    keys, deadline = master_keys(a.master_admin), time.monotonic() + 15.0
    while not keys and time.monotonic() < deadline:
        time.sleep(0.5)
        keys = master_keys(a.master_admin)
    if not keys:
        print("error: prompt 1's KV never reached the pool (the master's key count stayed 0)", flush=True)
        return 2
    print(f"prompt 1: HTTP 200 after {took:.2f} s; the master holds {keys} keys", flush=True)
    os.killpg(a.master_pgid, signal.SIGKILL)
    time.sleep(1.0)
    print("master killed", flush=True)
    status, answer, took = post(a.server + "/reset_prefix_cache?reset_external=true", {}, RESET_WAIT_S)
    if status is None:
        print(f"error: the reset got no answer within {RESET_WAIT_S:g} s", flush=True)
        return 2
    success = answer.get("success") if isinstance(answer, dict) else None
    if status == 200 and success is True:
        return result(True, f'the reset answered {{"success": true}} after {took:.1f} s with the master dead: '
                            f"none of the pool's {keys} keys was removed")
    return result(False, f"the reset answered HTTP {status} {answer} after {took:.1f} s with the master dead")


if __name__ == "__main__":
    sys.exit(main())
