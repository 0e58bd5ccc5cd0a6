"""The ``vllm`` node's leak probe counts (families/pd/vllm_node.py ``proc_counts`` and
``VllmNode.stats``), on real processes: a Python child in its own process group that opens fds
and sockets, starts threads and forks a grandchild on command. The counts are read from the real
/proc (nothing here stands in for it). Needs Linux /proc, like the node itself."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Iterator

import pytest

from nodekit.control import ControlServer, control_call
from families.pd.vllm_node import (
    LAZY_DECODE,
    LAZY_PREFILL,
    LAZY_SENDER_WORKERS,
    VllmNode,
    floored,
    group_members,
    lazy_allowance,
    proc_counts,
)

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="not applicable: no Linux /proc here")

CHILD = r"""
import os, socket, subprocess, sys, threading
held, stop = [], threading.Event()
for line in sys.stdin:
    cmd, _, n = line.strip().partition(" ")
    n = int(n or 0)
    if cmd == "fds":
        held += [os.open(os.devnull, os.O_RDONLY) for _ in range(n)]
    elif cmd == "socks":
        held += [socket.socketpair() for _ in range(n)]
    elif cmd == "threads":
        for _ in range(n):
            threading.Thread(target=stop.wait, daemon=True).start()
    elif cmd == "fork":  # a grandchild in the same process group, with nothing open but its stdio
        g = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, close_fds=True)
        g.stdout.readline()  # its start-up (imports, files opened and closed) is over
        held.append(g)
        print(g.pid, flush=True)
        continue
    print("ok", flush=True)
"""


class Child:
    """A Python process, leader of its own process group, driven over its stdin."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, start_new_session=True, close_fds=True)
        self.pid = self.pgid = self.proc.pid

    def do(self, cmd: str, n: int = 0) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{cmd} {n}\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def group(self) -> list[int]:
        return group_members(self.pgid)

    def close(self) -> None:
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


@pytest.fixture
def child() -> Iterator[Child]:
    c = Child()
    try:
        assert c.do("fds", 0) == "ok"  # started and answering
        yield c
    finally:
        c.close()


def settled(pids: list[int], want: dict[str, int], timeout_s: float = 5.0) -> dict[str, int]:
    """proc_counts of ``pids`` once it shows ``want`` (or the last reading after ``timeout_s``):
    a thread just started may not be in /proc for a moment."""
    end = time.monotonic() + timeout_s
    while True:
        got = proc_counts(pids)
        if all(got.get(k) == v for k, v in want.items()) or time.monotonic() >= end:
            return got
        time.sleep(0.02)


@pytest.mark.timeout(30)
def test_counts_grow_with_fds_sockets_threads_and_processes(child: Child) -> None:
    base = proc_counts(child.group())
    assert base["processes"] == 1 and base["threads"] >= 1 and base["fds"] >= 3, base
    assert base["sockets"] >= 0

    assert child.do("fds", 5) == "ok"
    now = proc_counts(child.group())
    assert (now["fds"], now["sockets"], now["threads"]) == (base["fds"] + 5, base["sockets"], base["threads"])

    assert child.do("socks", 3) == "ok"  # 3 socket pairs: 6 fds, all sockets
    now = proc_counts(child.group())
    assert (now["fds"], now["sockets"]) == (base["fds"] + 11, base["sockets"] + 6), now

    assert child.do("threads", 4) == "ok"
    now = settled(child.group(), {"threads": base["threads"] + 4})
    assert now["threads"] == base["threads"] + 4, now

    grandchild = int(child.do("fork"))
    assert os.getpgid(grandchild) == child.pgid and grandchild in child.group()
    alone = proc_counts([grandchild])
    assert alone["processes"] == 1 and alone["threads"] >= 1 and alone["fds"] >= 3, alone
    both = settled(child.group(), {"processes": 2})
    assert both["processes"] == 2
    assert both["fds"] == proc_counts([child.pid])["fds"] + alone["fds"]
    assert both["threads"] == base["threads"] + 4 + alone["threads"]


@pytest.mark.timeout(30)
def test_counts_match_what_proc_says_of_a_process(child: Child) -> None:
    assert child.do("threads", 2) == "ok" and child.do("socks", 1) == "ok"
    got = settled([child.pid], {"threads": len(os.listdir(f"/proc/{child.pid}/task"))})
    assert got["threads"] == len(os.listdir(f"/proc/{child.pid}/task"))
    links = [os.readlink(f"/proc/{child.pid}/fd/{n}") for n in os.listdir(f"/proc/{child.pid}/fd")]
    assert got["fds"] == len(links) and got["sockets"] == sum(x.startswith("socket:") for x in links) >= 2


@pytest.mark.timeout(30)
def test_a_vanished_pid_is_skipped_and_nothing_left_is_minus_one(child: Child) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(10)  # reaped: its pid names nothing now (pids are not reused this fast)
    assert not os.path.exists(f"/proc/{gone.pid}")
    live = proc_counts([child.pid])
    assert proc_counts([child.pid, gone.pid]) == live  # skipped, not counted
    assert proc_counts([gone.pid]) == {"processes": 0, "threads": -1, "fds": -1, "sockets": -1}
    assert proc_counts([]) == {"processes": 0, "threads": -1, "fds": -1, "sockets": -1}


@pytest.mark.timeout(30)
def test_a_zombie_is_skipped(child: Child) -> None:
    zombie = int(child.do("fork"))
    os.kill(zombie, signal.SIGKILL)  # its parent (the child) never reaps it: a zombie, still in /proc
    end = time.monotonic() + 10
    while time.monotonic() < end:
        with open(f"/proc/{zombie}/stat") as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.02)
    assert os.path.exists(f"/proc/{zombie}")
    assert zombie not in child.group()  # group_members leaves zombies out too
    assert proc_counts([zombie])["processes"] == 0
    assert proc_counts([child.pid, zombie]) == proc_counts([child.pid])


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_over(child: Child, role: str = "decode", connector: str = "none") -> VllmNode:
    """A VllmNode whose server is ``child`` (no vLLM here: the node's state set by hand, its
    stats() and measure_ready() as they are). Nothing listens on its HTTP port: not healthy, no
    scrape. Its server's processes: the child's group (the node uses its own group)."""
    node = VllmNode.__new__(VllmNode)
    node.role, node.engine_id, node.proc = role, None, child.proc
    node.args = argparse.Namespace(kv_connector=connector)
    node.kv_extra = None
    node.base = f"http://127.0.0.1:{_closed_port()}"
    node.others = child.group
    return node


@pytest.mark.timeout(30)
def test_the_node_stats_answer_carries_the_server_groups_counts(child: Child, short_tmp: str) -> None:
    """Through the real control channel: the ``threads``/``fds`` the runner's probes read are the
    server group's (here: the child's group), the wrapper's own are under ``wrapper_*``."""
    node = node_over(child)
    assert node.allowance() == (0, 0)  # no connector: nothing allowed
    ep = f"ipc://{short_tmp}/ctl.sock"
    server = ControlServer(ep, stats=node.stats).start()
    try:
        assert child.do("threads", 3) == "ok" and child.do("socks", 2) == "ok"
        child.do("fork")
        want = settled(child.group(), {"processes": 2})
        st = control_call(ep, "stats", timeout_ms=5000)
        mine = proc_counts([os.getpid()])  # with the control server still up
    finally:
        server.close()
    assert st["alive"] is False and st["pid"] == os.getpid()
    for k in ("processes", "threads", "fds", "sockets"):
        assert st[k] == want[k] and st["counters"][k] == want[k], (k, st, want)
    assert (st["group_threads"], st["group_fds"]) == (want["threads"], want["fds"])
    assert st["ready_threads"] == st["ready_fds"] == -1  # never measured: no floor
    # the wrapper's own: this test process's (the control server's), not the child's group; loosely
    # (each control_call opens and closes a socket, and ZMQ's threads come and go with it)
    assert abs(st["wrapper_threads"] - mine["threads"]) <= 2 and abs(st["wrapper_fds"] - mine["fds"]) <= 8, (st, mine)
    assert st["counters"]["metrics_ok"] == 0 and st["server_pid"] == child.pid


@pytest.mark.timeout(30)
def test_the_node_stats_say_minus_one_when_the_server_is_gone(child: Child, short_tmp: str) -> None:
    node = node_over(child, "prefill", "MooncakeConnector")
    node.measure_ready(samples=1)
    child.close()
    st = node.stats()
    assert st["alive"] is False and st["processes"] == 0
    assert st["threads"] == st["fds"] == st["sockets"] == -1  # unknown, never floored into a number
    assert st["group_threads"] == st["group_fds"] == -1


@pytest.mark.timeout(30)
def test_the_floor_takes_in_the_lazy_pools_and_growth_beyond_shows(child: Child) -> None:
    """A decode node's counts at READY plus its allowance are the floor: threads and fds started
    up to the allowance leave ``threads``/``fds`` where the baseline had them, more shows."""
    node = node_over(child, "decode", "MooncakeConnector")
    lazy_t, lazy_f = node.allowance()
    assert (lazy_t, lazy_f) == LAZY_DECODE
    ready = node.measure_ready()
    real = proc_counts(child.group())
    assert ready == {"threads": real["threads"], "fds": real["fds"]}
    base = node.stats()
    assert (base["threads"], base["fds"]) == (ready["threads"] + lazy_t, ready["fds"] + lazy_f)
    assert (base["group_threads"], base["group_fds"]) == (real["threads"], real["fds"])

    assert child.do("threads", lazy_t) == "ok" and child.do("fds", lazy_f) == "ok"  # the lazy pools
    settled(child.group(), {"threads": real["threads"] + lazy_t})
    now = node.stats()
    assert (now["threads"], now["fds"]) == (base["threads"], base["fds"])  # no growth to see
    assert (now["group_threads"], now["group_fds"]) == (real["threads"] + lazy_t, real["fds"] + lazy_f)

    assert child.do("threads", 1) == "ok" and child.do("socks", 1) == "ok"  # beyond: a leak shows
    settled(child.group(), {"threads": real["threads"] + lazy_t + 1})
    leak = node.stats()
    assert (leak["threads"], leak["fds"]) == (base["threads"] + 1, base["fds"] + 2)
    assert leak["sockets"] == base["sockets"] + 2


def test_the_allowance_per_role_and_connector() -> None:
    assert lazy_allowance("decode", "MooncakeConnector", None) == LAZY_DECODE
    assert lazy_allowance("decode", "HardenedMooncakeConnector", {}) == LAZY_DECODE
    assert lazy_allowance("prefill", "MooncakeConnector", None) == (LAZY_PREFILL[0] + LAZY_SENDER_WORKERS,
                                                                     LAZY_PREFILL[1])
    assert lazy_allowance("prefill", "MooncakeConnector", {"num_workers": 3}) == (LAZY_PREFILL[0] + 3, LAZY_PREFILL[1])
    assert lazy_allowance("prefill", "MooncakeConnector", {"num_workers": "x"})[0] == LAZY_PREFILL[0] + 10
    for conn in ("none", "NixlConnector", "MultiConnector"):  # not measured: no allowance
        assert lazy_allowance("prefill", conn, None) == lazy_allowance("decode", conn, None) == (0, 0)
    assert floored(10, 8, 3) == 11 and floored(12, 8, 3) == 12
    assert floored(-1, 8, 3) == -1 and floored(10, -1, 3) == 10
