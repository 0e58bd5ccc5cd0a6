"""harness/procs.py: real processes, real signals, real process groups (no mocks)."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import textwrap
import time

import pytest

from harness.errors import HarnessError
from harness.procs import start_node, start_process


@pytest.fixture
def tmpdir_short():
    d = tempfile.mkdtemp(prefix="pdc", dir="/tmp")  # short: unix socket paths are limited to 107 bytes
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (absent, or a zombie waiting for a reaper we do not own)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def _wait_gone(pid: int, timeout_s: float = 3.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if _gone(pid):
            return True
        time.sleep(0.02)
    return _gone(pid)


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


@pytest.mark.timeout(20)
def test_node_starts_ready_and_stops_cleanly(tmpdir_short):
    sock_path = os.path.join(tmpdir_short, "srv")
    log = os.path.join(tmpdir_short, "srv.log")
    h = start_node("lookup-server", ["--endpoint", f"ipc://{sock_path}"], log_path=log, ready_timeout_s=10)
    try:
        assert h.alive and h.pid == h.proc.pid and h.returncode is None
        assert os.path.exists(sock_path)  # bound before READY
        assert os.getpgid(h.pid) == h.pid  # its own process group
        assert os.getpgid(h.pid) != os.getpgid(0)
    finally:
        code = h.stop(5.0)
    assert code == 0  # SIGTERM -> clean exit 0
    assert not h.alive
    assert not os.path.exists(sock_path)  # the server unlinked its ipc file on the way out
    assert h.stop(1.0) == 0  # idempotent
    with open(log, encoding="utf-8") as fh:
        assert "READY" in fh.read()


@pytest.mark.timeout(20)
def test_node_that_exits_before_ready_raises_with_its_reason():
    t0 = time.monotonic()
    with pytest.raises(HarnessError) as err:
        # refused by check_endpoint before any socket exists: no traffic leaves loopback
        start_node("lookup-server", ["--endpoint", "tcp://10.1.2.3:5555"], ready_timeout_s=10)
    msg = str(err.value)
    assert "exited (code 2) before it was ready" in msg
    assert "not on loopback" in msg  # the node's own stderr line is carried into the error
    assert time.monotonic() - t0 < 8


@pytest.mark.timeout(20)
def test_ready_timeout_raises_and_kills(tmpdir_short):
    pid_file = os.path.join(tmpdir_short, "pid")
    t0 = time.monotonic()
    with pytest.raises(HarnessError, match="not ready within 0.5 s"):
        start_process(_py(f"""
            import os, time
            open({pid_file!r}, "w").write(str(os.getpid()))
            time.sleep(30)
        """), ready_timeout_s=0.5)
    assert time.monotonic() - t0 < 5
    with open(pid_file, encoding="ascii") as fh:
        pid = int(fh.read())
    assert _wait_gone(pid)


@pytest.mark.timeout(20)
def test_stop_escalates_to_sigkill_when_sigterm_is_ignored():
    h = start_process(_py("""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("READY", flush=True)
        time.sleep(30)
    """), ready_timeout_s=10)
    t0 = time.monotonic()
    code = h.stop(0.5)
    elapsed = time.monotonic() - t0
    assert code == -signal.SIGKILL
    assert 0.4 < elapsed < 4.0
    assert not h.alive


@pytest.mark.timeout(20)
def test_stop_and_kill_take_the_whole_process_group(tmpdir_short):
    pid_file = os.path.join(tmpdir_short, "child")
    prog = _py(f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({pid_file!r}, "w").write(str(child.pid))
        print("READY", flush=True)
        time.sleep(60)
    """)
    for how in ("stop", "kill"):
        h = start_process(prog, ready_timeout_s=10)
        with open(pid_file, encoding="ascii") as fh:
            child = int(fh.read())
        assert not _gone(child)
        code = h.stop(2.0) if how == "stop" else h.kill()
        assert code is not None and not h.alive
        assert _wait_gone(child), f"{how}: the node's child survived"


@pytest.mark.timeout(20)
def test_kill_is_immediate(tmpdir_short):
    h = start_node("lookup-server", ["--endpoint", f"ipc://{tmpdir_short}/k"])
    t0 = time.monotonic()
    assert h.kill() == -signal.SIGKILL
    assert time.monotonic() - t0 < 2
    assert not h.alive
    assert h.kill() == -signal.SIGKILL  # idempotent


@pytest.mark.timeout(20)
def test_frozen_node_still_stops_cleanly(tmpdir_short):
    h = start_node("lookup-server", ["--endpoint", f"ipc://{tmpdir_short}/f"])
    try:
        os.kill(h.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        code = h.stop(3.0)
        assert code == 0  # SIGCONT after SIGTERM: a clean exit, not a SIGKILL
        assert time.monotonic() - t0 < 3.0
    finally:
        h.kill()


@pytest.mark.timeout(20)
def test_unknown_program_is_a_harness_error():
    with pytest.raises(HarnessError, match="cannot start"):
        start_process(["/nonexistent/pdc-no-such-program"], ready_timeout_s=1)
