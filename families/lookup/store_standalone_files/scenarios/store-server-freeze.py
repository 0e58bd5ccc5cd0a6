"""The server answers prompt 1 (its KV is saved to the pool). Then the Mooncake master is frozen
(SIGSTOP of its process group) for 10 s; 1 s into the freeze prompt 2 is sent, which the scheduler
looks up in the pool (over the admin channel, worker rank 0 asks the master); the master is thawed
(SIGCONT) when the 10 s are over.

    python repro.py --server URL --master-pgid PGID
"""
import argparse
import os
import signal
import sys
import threading
import time

from store_client import complete, result

FREEZE_S = 10.0
SEND_AFTER_S = 1.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--master-pgid", type=int, required=True)
    a = ap.parse_args()
    status, _, took = complete(a.server, 1, 120)
    if status != 200:
        print(f"error: prompt 1 was not answered (HTTP {status}) before any fault", flush=True)
        return 2
    print(f"prompt 1: HTTP 200 after {took:.2f} s", flush=True)
    time.sleep(2.0)  # its KV reaches the pool
    thawed = {}

    def thaw():
        time.sleep(FREEZE_S)
        os.killpg(a.master_pgid, signal.SIGCONT)
        thawed["t"] = time.monotonic()
        print(f"master thawed after {FREEZE_S:g} s", flush=True)

    os.killpg(a.master_pgid, signal.SIGSTOP)
    t_freeze = time.monotonic()
    print(f"master frozen for {FREEZE_S:g} s", flush=True)
    th = threading.Thread(target=thaw, daemon=True)
    th.start()
    try:
        time.sleep(SEND_AFTER_S)
        status, _, took = complete(a.server, 2, FREEZE_S + 40.0)
        t_end = time.monotonic()
    finally:
        th.join()
    if status is None:
        return result(True, f"prompt 2, sent {SEND_AFTER_S:g} s into a {FREEZE_S:g} s freeze of the master, got no "
                            f"answer within {FREEZE_S + 40:g} s")
    after_thaw = t_end - thawed["t"]
    if t_end - t_freeze >= FREEZE_S - 0.5:
        return result(True, f"prompt 2, sent {SEND_AFTER_S:g} s into a {FREEZE_S:g} s freeze of the master, was "
                            f"answered (HTTP {status}) after {took:.1f} s, {after_thaw:.1f} s after the thaw: its "
                            "lookup waited for the master with no deadline")
    return result(False, f"prompt 2, sent {SEND_AFTER_S:g} s into a {FREEZE_S:g} s freeze of the master, was "
                         f"answered (HTTP {status}) after {took:.2f} s, while the master was still frozen")


if __name__ == "__main__":
    sys.exit(main())
