"""Worker rank 0's side alone, in a process of its own: vllm-ascend's LookupKeyServer over the
stand-in pool worker (lookup_parts.py), serving until it is killed. ``repro.py`` starts it, freezes
it with SIGSTOP and thaws it with SIGCONT, as a worker stalled by the OS, a debugger or a long GC
pause would be."""

import time

from lookup_parts import PoolWorker, start_server

if __name__ == "__main__":
    server = start_server(PoolWorker())
    print("repro: lookup server serving", flush=True)
    while True:
        time.sleep(60)
