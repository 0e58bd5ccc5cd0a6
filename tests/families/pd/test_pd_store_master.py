"""The ``mooncake-master`` node: a real ``mooncake_master`` (the one the P/D node env ships with
mooncake-transfer-engine) started, probed, killed and stopped as the pd family's ``store`` role
under a KV-pool launch profile (profile ascend-store)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nodekit.control import control_call
from families.pd.store_master import master_binary, parse_gauges
from harness.procs import start_node
from harness.topology import free_tcp_port

pytestmark = pytest.mark.skipif(not master_binary("node-env").exists(),
                                reason="the P/D node env (mooncake_master) is not installed: run `pdchaos setup`")


def listeners(pid: int) -> list[str]:
    """The TCP listen addresses of ``pid`` (from ss)."""
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, timeout=10).stdout
    return [line.split()[3] for line in out.splitlines() if f"pid={pid}," in line]


@pytest.mark.timeout(90)
def test_master_serves_on_loopback_answers_stats_and_stops_with_the_node(tmp_path: Path) -> None:
    rpc, admin = free_tcp_port(), free_tcp_port()
    ctl = f"ipc://{tmp_path}/m.ctl"
    h = start_node("mooncake-master", ["--rpc-port", str(rpc), "--metrics-port", str(admin), "--server-log",
                                       str(tmp_path / "store.log"), "--control", ctl],
                   log_path=str(tmp_path / "node.log"), ready_timeout_s=45)
    try:
        st = control_call(ctl, "stats", timeout_ms=5000)
        assert st["alive"] is True and st["counters"]["metrics_ok"] == 1
        assert "master_allocated_bytes" in st["counters"] and len(st["counters"]) <= 41
        master = st["server_pid"]
        assert sorted(listeners(master)) == sorted([f"127.0.0.1:{rpc}", f"127.0.0.1:{admin}"])  # loopback only
    finally:
        rc = h.stop(20)
    assert rc == 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.path.exists(f"/proc/{master}"):
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{master}")  # the master went with its node


@pytest.mark.timeout(90)
def test_a_master_that_dies_ends_the_node_with_exit_1(tmp_path: Path) -> None:
    ctl = f"ipc://{tmp_path}/m.ctl"
    h = start_node("mooncake-master", ["--rpc-port", str(free_tcp_port()), "--metrics-port", str(free_tcp_port()),
                                       "--server-log", str(tmp_path / "store.log"), "--control", ctl],
                   log_path=str(tmp_path / "node.log"), ready_timeout_s=45)
    try:
        master = control_call(ctl, "stats", timeout_ms=5000)["server_pid"]
        os.kill(master, signal.SIGKILL)
        h.proc.wait(15)
        assert h.proc.returncode == 1
        assert "exited on its own" in (tmp_path / "node.log").read_text()
    finally:
        h.stop(10)


@pytest.mark.parametrize("bad, message", [
    (["--rpc-port", "70000", "--metrics-port", "1"], "--rpc-port: 70000 is not a TCP port"),
    (["--rpc-port", "5000", "--metrics-port", "5000"], "--rpc-port and --metrics-port must differ"),
    (["--rpc-port", "5000", "--metrics-port", "5001", "--master-from", "bin/m"], "--master-from: 'bin/m' is not"),
    (["--rpc-port", "5000", "--metrics-port", "5001", "--master-from", "/nonexistent/mooncake_master"],
     "no mooncake_master at /nonexistent/mooncake_master"),
])
def test_bad_master_options_are_one_error_line(tmp_path: Path, bad: list[str], message: str) -> None:
    res = subprocess.run([sys.executable, "-m", "harness.cli", "node", "mooncake-master", *bad, "--server-log",
                          str(tmp_path / "s.log")], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_parse_gauges_keeps_unlabelled_master_numbers_only() -> None:
    text = ("# HELP master_keys keys\n# TYPE master_keys gauge\nmaster_keys 3\n"
            'master_put{kind="x"} 9\nother_metric 1\nmaster_bad nan-ish\nmaster_clients 2 1700000000\n')
    assert parse_gauges(text) == {"master_keys": 3.0, "master_clients": 2.0}
    assert parse_gauges("master_x 1\nmaster_x 2\n") == {"master_x": 2.0}  # a repeated name: one key, the last
    many = "".join(f"master_g{i} {i}\n" for i in range(60))
    assert len(parse_gauges(many)) == 40  # at most 40 counters
