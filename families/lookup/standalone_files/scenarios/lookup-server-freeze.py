"""Worker rank 0 stops for 3 s (SIGSTOP, then SIGCONT) while the scheduler looks up a prompt.
vllm-ascend's LookupKeyClient sends the lookup and waits in recv() with no timeout: the scheduler's
lookup, made on the engine's scheduling step, takes as long as the worker is stopped.

It starts vllm-ascend's LookupKeyServer over the stand-in pool worker in a process of its own
(``lookup_server.py``) and a LookupKeyClient here on the same ipc path, looks up a prompt of 4 blocks
the pool holds (64 tokens: a hit), then stops the server's process for 3 s and looks the same prompt
up again, timing it.
"""

import os
import signal
import subprocess
import sys
import time

from lookup_parts import FIX_SETTINGS, TOKENS, Lookup, client, timed_lookup, wait_for_socket

FREEZE_S = 3.0
LIMIT_S = FIX_SETTINGS["lookup_rpc_timeout_ms"] / 1000 + 0.5  # the fix's deadline, with room for a busy host


def main() -> int:
    server = subprocess.Popen([sys.executable, "lookup_server.py"])
    try:
        wait_for_socket(300.0)
        c = client()
        took, hit = timed_lookup(c, 120.0)
        if took is None or hit != TOKENS:
            print(f"RESULT: set-up failed: the healthy lookup answered {hit!r}, expected {TOKENS}")
            return 2
        print(f"repro: healthy lookup: {hit} tokens hit in {took * 1000:.1f} ms", flush=True)
        os.kill(server.pid, signal.SIGSTOP)
        print(f"repro: the lookup server's process is stopped for {FREEZE_S:g} s", flush=True)
        t0 = time.monotonic()
        lookup = Lookup(c)
        time.sleep(FREEZE_S)
        os.kill(server.pid, signal.SIGCONT)
        print(f"repro: thawed after {time.monotonic() - t0:.2f} s", flush=True)
        took, hit = lookup.wait(10.0)
    finally:
        server.kill()
        server.wait(30)
    if took is None:
        print("RESULT: defect seen: the lookup had not returned 10 s after the server thawed")
        return 1
    if took > LIMIT_S:
        print(f"RESULT: defect seen: the scheduler's lookup waited {took:.2f} s, the whole {FREEZE_S:g} s the "
              f"worker was stopped (answer {hit!r}); nothing bounds it")
        return 1
    print(f"RESULT: defect not seen: the lookup returned {hit!r} after {took:.2f} s while the worker was "
          f"stopped (a miss: the request is computed locally)")
    return 0



if __name__ == "__main__":
    sys.exit(main())
