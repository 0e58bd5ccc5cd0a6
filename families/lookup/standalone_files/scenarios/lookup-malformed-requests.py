"""Three malformed lookup requests reach worker rank 0's lookup server (``bad_requests.py``: a
missing frame, group ids or hashes that are not msgpack). vllm-ascend's LookupKeyServer decodes the
frames on its only thread with no check and no exception handler: the first one raises, the thread
ends, and every later lookup of the scheduler waits forever in recv().

It starts vllm-ascend's LookupKeyServer over the stand-in pool worker and a LookupKeyClient on the
same ipc path, looks up a prompt of 4 blocks the pool holds (64 tokens: a hit), runs
``bad_requests.py`` against the server's path, then looks the same prompt up again and waits up to
10 s for the answer.
"""

import subprocess
import sys

from lookup_parts import TOKENS, PoolWorker, client, lookup_path, start_server, timed_lookup, wait_for_socket

WAIT_S = 10.0


def main() -> int:
    start_server(PoolWorker())
    wait_for_socket()
    c = client()
    took, hit = timed_lookup(c, 60.0)
    if took is None or hit != TOKENS:
        print(f"RESULT: set-up failed: the healthy lookup answered {hit!r}, expected {TOKENS}")
        return 2
    print(f"repro: healthy lookup: {hit} tokens hit in {took * 1000:.1f} ms", flush=True)
    subprocess.run([sys.executable, "bad_requests.py", lookup_path()], check=True, timeout=120)
    took, hit = timed_lookup(c, WAIT_S)
    if took is None:
        print(f"RESULT: defect seen: after the malformed requests the next well-formed lookup had no answer "
              f"within {WAIT_S:g} s (the server's thread is gone; the lookup waits forever)")
        return 1
    if hit != TOKENS:
        print(f"RESULT: defect seen: after the malformed requests the next lookup answered {hit!r} in "
              f"{took:.2f} s, expected {TOKENS}")
        return 1
    print(f"RESULT: defect not seen: after the malformed requests the next lookup answered {hit} tokens "
          f"in {took * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
