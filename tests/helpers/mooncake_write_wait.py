"""What P's write costs P while D takes no bytes: two REAL Mooncake transfer engines over TCP on
127.0.0.1 (the P/D node env's Mooncake), the receiver a process of its own that is stopped with
SIGSTOP while the sender writes, as a frozen D is.

Run by tests/connector_patch/test_pd_write_wait.py with the node env's python:
``python mooncake_write_wait.py REPO``. For each way of writing, alternating, ROUNDS times: the
receiver is stopped, the write starts in a thread of this process, and for STOP_S the CPU time of
this whole process (every thread: the writer, Mooncake's own) is read; then the receiver goes on,
the write must end with 0 and its bytes must be in the receiver's buffer (it says so, reading them).

Ways: ``sync`` is upstream's ``batch_transfer_sync_write`` (what the hardened P did before, one
call per chunk), ``hardened`` the hardened P's ``write.submit_and_wait`` (one submit per
descriptor, polled with sleeps), ``hardened_many`` and ``sync_many`` the same bytes as 2048
descriptors (Mooncake's TCP lane rejects what is queued past its limit to a peer that takes
nothing: "TCP lane queue-full rejection", so those writes may fail, either way). Prints one line: MARKER + JSON.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time

MARKER = "PDCHAOS-WRITE-WAIT "
STOP_S = 2.0  # the receiver is stopped this long while the write waits on it
ROUNDS = 3
DESCS = 16  # descriptors of 4 KiB each, as a small pull of a tiny model's blocks
DESC_BYTES = 4096
MANY = 2048  # the hardened write again with the same bytes as this many descriptors


def _engine():
    from mooncake.engine import TransferEngine

    te = TransferEngine()
    if te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        raise RuntimeError("TransferEngine.initialize failed")
    return te


def _registered(te, size: int):  # noqa: ANN001, ANN202 - a TransferEngine
    """A zeroed buffer of ``size`` bytes registered with ``te``: (the buffer, its address)."""
    buf = ctypes.create_string_buffer(size)
    addr = ctypes.addressof(buf)
    if te.register_memory(addr, size) != 0:
        raise RuntimeError("register_memory failed")
    return buf, addr


def receiver() -> None:
    """The receiving engine: a registered buffer; answers 'check N' with whether every byte of
    the buffer is N, 'fill N' by filling it with N, 'quit' by leaving."""
    te = _engine()
    size = DESCS * DESC_BYTES
    buf, addr = _registered(te, size)
    print(f"READY 127.0.0.1:{te.get_rpc_port()} {addr}", flush=True)
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "quit":
            return
        if cmd == "fill":
            ctypes.memset(addr, int(arg), size)
            print("OK", flush=True)
        elif cmd == "check":
            print("OK" if buf.raw == bytes([int(arg)]) * size else "BAD", flush=True)


def _cpu_of_process() -> float:
    t = os.times()
    return t.user + t.system


def main(repo: str) -> dict:
    sys.path.insert(0, repo)
    from connector_patch.pd.write import submit_and_wait

    child = subprocess.Popen([sys.executable, __file__, "--receiver"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        ready = child.stdout.readline().split()
        if not ready or ready[0] != "READY":
            raise RuntimeError(f"the receiver did not start: {ready!r}")
        session, dst0 = ready[1], int(ready[2])

        def ask(line: str) -> str:
            child.stdin.write(line + "\n")
            child.stdin.flush()
            return child.stdout.readline().strip()

        te = _engine()
        size = DESCS * DESC_BYTES
        src_buf, src0 = _registered(te, size)  # noqa: F841 - kept alive while the engine reads it
        src = [src0 + i * DESC_BYTES for i in range(DESCS)]
        dst = [dst0 + i * DESC_BYTES for i in range(DESCS)]
        lengths = [DESC_BYTES] * DESCS
        # the same bytes as MANY descriptors: a big pull's chunk (a stalled D must cost one poll, not one a descriptor)
        step = size // MANY
        m_src = [src0 + i * step for i in range(MANY)]
        m_dst = [dst0 + i * step for i in range(MANY)]
        ways = {
            "sync": lambda: te.batch_transfer_sync_write(session, src, dst, lengths),
            "hardened": lambda: submit_and_wait(te, session, src, dst, lengths),
            "hardened_many": lambda: submit_and_wait(te, session, m_src, m_dst, [step] * MANY),
            "sync_many": lambda: te.batch_transfer_sync_write(session, m_src, m_dst, [step] * MANY),
        }
        # the connection (segment handle, TCP) exists before D freezes, as between a P and its D
        ctypes.memset(src0, 1, size)
        warm = ways["sync"]()
        if warm != 0 or ask("check 1") != "OK":
            raise RuntimeError(f"the warm-up write failed: {warm}")
        out: dict = {"stop_s": STOP_S, "bytes": size, "descriptors": DESCS, "rounds": []}
        value = 1
        # the 16-descriptor ways alternate, ROUNDS each; the 2048-descriptor ones come last, once each
        # (a lane that rejected a queue-full write fails the next writes for a while: not this test's subject)
        plan = [w for rnd in range(ROUNDS) for w in (("sync", "hardened") if rnd % 2 == 0 else ("hardened", "sync"))]
        for way in plan + ["hardened_many", "sync_many"]:
            value += 1
            if ask("fill 0") != "OK":
                raise RuntimeError("the receiver did not clear its buffer")
            ctypes.memset(src0, value, size)
            res: dict = {}
            os.kill(child.pid, signal.SIGSTOP)
            c0, t0 = _cpu_of_process(), time.monotonic()
            th = threading.Thread(target=lambda: res.update(ret=ways[way](), t=time.monotonic()), daemon=True)
            th.start()
            time.sleep(STOP_S)
            c1, t1 = _cpu_of_process(), time.monotonic()
            waited = th.is_alive()  # the write had to wait for the receiver
            os.kill(child.pid, signal.SIGCONT)
            th.join(30.0)
            landed = ask(f"check {value}") == "OK" if not th.is_alive() else False
            out["rounds"].append({"way": way, "cores": round((c1 - c0) / (t1 - t0), 3),
                                  "waited_whole_stop": waited, "ret": res.get("ret"),
                                  "ended_after_cont_s": round(res["t"] - t1, 3) if "t" in res else None,
                                  "bytes_landed": landed})
        for way in ways:
            cores = sorted(r["cores"] for r in out["rounds"] if r["way"] == way)
            out[way] = {"cores_min": cores[0], "cores_max": cores[-1]}
        ask("quit")
        return out
    finally:
        try:
            os.kill(child.pid, signal.SIGCONT)
        except OSError:
            pass
        child.kill()
        child.wait(10)


if __name__ == "__main__":
    if sys.argv[1:] == ["--receiver"]:
        receiver()
    else:
        signal.alarm(240)  # a watchdog: the test's own timeout is longer
        print(MARKER + json.dumps(main(sys.argv[1])), flush=True)
