"""The server answers prompt 1 (the scheduler looks it up in the pool over the store connector's
admin channel: worker rank 0 answers). Then `bad_lookup.py` sends three malformed messages to that
channel's socket (a lookup short of frames first). Then prompt 2 is sent, which the scheduler must
look up over the same channel.

    python repro.py --server URL --rpc-dir RPC_DIR
"""
import argparse
import subprocess
import sys

from store_client import complete, result

WAIT_S = 30.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--rpc-dir", required=True, help="the server's VLLM_RPC_BASE_PATH")
    a = ap.parse_args()
    status, _, took = complete(a.server, 1, 120)
    if status != 200:
        print(f"error: prompt 1 was not answered (HTTP {status}) before any fault", flush=True)
        return 2
    print(f"prompt 1: HTTP 200 after {took:.2f} s", flush=True)
    fault = subprocess.run([sys.executable, "bad_lookup.py", a.rpc_dir], capture_output=True, text=True,
                           timeout=120)
    print((fault.stdout + fault.stderr).rstrip(), flush=True)
    if fault.returncode != 0:
        return 2
    status, _, took = complete(a.server, 2, WAIT_S)
    if status is None:
        return result(True, f"prompt 2, sent after the malformed messages, got no answer within {WAIT_S:g} s: "
                            "the admin channel's server thread is gone and the scheduler waits for its "
                            "lookup's reply for ever")
    return result(False, f"prompt 2, sent after the malformed messages, was answered HTTP {status} after "
                         f"{took:.2f} s")


if __name__ == "__main__":
    sys.exit(main())
