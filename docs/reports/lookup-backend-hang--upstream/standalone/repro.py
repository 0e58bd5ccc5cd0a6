"""The pool store behind worker rank 0's lookup server hangs for 3 s while the scheduler looks up a
prompt. vllm-ascend's LookupKeyServer calls the store on its only thread with no bound, and
LookupKeyClient waits in recv() with no timeout: the scheduler's lookup (made on the engine's
scheduling step) takes as long as the store hangs.

It starts vllm-ascend's LookupKeyServer over the stand-in pool worker and a LookupKeyClient on the
same ipc path, looks up a prompt of 4 blocks the pool holds (64 tokens: a hit), then makes the store
hang for 3 s and looks the same prompt up again, timing it.
"""

import sys
import time

from lookup_parts import FIX_SETTINGS, TOKENS, PoolWorker, client, start_server, timed_lookup, wait_for_socket

HANG_S = 3.0
LIMIT_S = FIX_SETTINGS["lookup_rpc_timeout_ms"] / 1000 + 0.5  # the fix's deadline, with room for a busy host


def main() -> int:
    worker = PoolWorker()
    start_server(worker)
    wait_for_socket()
    c = client()
    took, hit = timed_lookup(c, 60.0)
    if took is None or hit != TOKENS:
        print(f"RESULT: set-up failed: the healthy lookup answered {hit!r}, expected {TOKENS}")
        return 2
    print(f"repro: healthy lookup: {hit} tokens hit in {took * 1000:.1f} ms", flush=True)
    worker.hang_s = HANG_S
    print(f"repro: the store hangs {HANG_S:g} s per call from now on", flush=True)
    took, hit = timed_lookup(c, HANG_S + 10.0)
    worker.hang_s = 0.0
    if took is None:
        print(f"RESULT: defect seen: the lookup had not returned {HANG_S + 10:g} s after it was sent")
        return 1
    if took > LIMIT_S:
        print(f"RESULT: defect seen: the scheduler's lookup waited {took:.2f} s for the hung store "
              f"(answer {hit!r}); nothing bounds it")
        return 1
    print(f"RESULT: defect not seen: the lookup returned {hit!r} after {took:.2f} s while the store hung "
          f"(a miss: the request is computed locally)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
