"""``pdchaos bench lookup``: real server processes started by the command, real clients.

Small n only: these check the shape, the arithmetic, the answers and the cleanup, not the speed
(the numbers are measured separately and written in docs/measurements.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest


@pytest.fixture
def tmpbase(short_tmp):
    """A short TMPDIR for the bench, so its work folder and server processes can be found."""
    return short_tmp


def _env(tmpbase: str) -> dict:
    return {**os.environ, "TMPDIR": tmpbase}


def _cli(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def _procs_mentioning(text: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line contains ``text``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
            with open(f"/proc/{name}/stat", encoding="ascii") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state not in ("Z", "X"):
            found.append(int(name))
    return found


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _children(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] not in ("Z", "X"):
            out.append(int(name))
    return out


@pytest.mark.timeout(60)
def test_bench_json_shape_values_and_saved_samples(tmpbase):
    save = os.path.join(tmpbase, "samples.json")
    r = _cli("bench", "lookup", "--n", "300", "--warmup", "50", "--json", "--save", save, env=_env(tmpbase))
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1
    s = json.loads(lines[0])
    assert s["n"] == 300 and s["warmup"] == 50
    assert s["hits"] + s["misses"] == 300 and s["hits"] > 50 and s["misses"] > 50
    for name in ("hardened", "legacy"):
        t = s[name]
        assert 0 < t["min_us"] <= t["p50_us"] <= t["p99_us"] <= t["max_us"]
        assert t["min_us"] <= t["mean_us"] <= t["max_us"]
        assert t["wrong"] == 0  # every hit and miss answered correctly by both
    assert s["hardened"]["fail_open"] == 0
    assert s["ratio"]["p50"] > 0 and s["ratio"]["p99"] > 0
    assert s["ratio"]["p50"] == pytest.approx(s["hardened"]["p50_us"] / s["legacy"]["p50_us"], rel=1e-3)
    assert s["ratio"]["p99"] == pytest.approx(s["hardened"]["p99_us"] / s["legacy"]["p99_us"], rel=1e-3)
    assert s["target_met"] == (s["ratio"]["p50"] <= 1.05 and s["ratio"]["p99"] <= 1.10)
    assert s["transport"] == "ipc" and s["backend"] == "memory"

    with open(save, encoding="utf-8") as fh:
        raw = json.load(fh)
    assert raw["unit"] == "us" and raw["n"] == 300
    assert len(raw["hardened"]) == len(raw["legacy"]) == len(raw["kinds"]) == 300
    assert all(x > 0 for x in raw["hardened"] + raw["legacy"])
    assert raw["kinds"].count("hit") == s["hits"]
    srt = sorted(raw["legacy"])
    assert srt[0] == pytest.approx(s["legacy"]["min_us"], abs=0.01)
    assert srt[-1] == pytest.approx(s["legacy"]["max_us"], abs=0.01)

    # cleanup: the work folder is gone and no server of this run is left running
    assert [e for e in os.listdir(tmpbase) if e.startswith("pdc")] == []
    assert _procs_mentioning(tmpbase) == []


@pytest.mark.timeout(60)
def test_bench_text_table(tmpbase):
    r = _cli("bench", "lookup", "--n", "200", "--warmup", "20", "--hashes", "4", env=_env(tmpbase))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "hardened" in out and "legacy" in out and "ratio" in out and "p99 us" in out
    assert "token_len 64" in out  # 4 hashes x block size 16
    assert r.stderr == ""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_stops_the_servers(tmpbase, sig, code):
    # started with SIGINT ignored, as a job started in the background is (CI's test run was: the
    # bench never heard the signal, on two fresh-clone .ci/run runs): it must still stop
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "bench", "lookup", "--n", "2000000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(tmpbase),
                            stdin=subprocess.DEVNULL, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        deadline = time.monotonic() + 20
        kids: list[int] = []
        while time.monotonic() < deadline:  # both servers started and the run under way
            kids = _children(proc.pid)
            if len(kids) == 2 and [e for e in os.listdir(tmpbase) if e.startswith("pdc")]:
                break
            time.sleep(0.05)
        assert len(kids) == 2, "the bench did not start its two servers"
        time.sleep(0.5)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, err
    assert "Traceback" not in err
    assert _procs_mentioning(tmpbase) == []  # both servers stopped
    for pid in kids:
        assert _gone(pid), pid
    assert [e for e in os.listdir(tmpbase) if e.startswith("pdc")] == []  # work folder removed


@pytest.mark.timeout(30)
@pytest.mark.parametrize("args, what", [
    (["--n", "10"], "--n"),
    (["--hashes", "0"], "--hashes"),
    (["--warmup", "-1"], "--warmup"),
    (["--block-size", "0"], "--block-size"),
    (["--timeout-ms", "0"], "--timeout-ms"),
    (["--save", "/nonexistent-pdc-dir/x.json"], "--save"),
    (["--n", "many"], "--n"),
])
def test_bad_input_exits_2_with_one_line(args, what):
    r = _cli("bench", "lookup", *args)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and what in lines[0], r.stderr


def test_a_close_that_hangs_is_bounded(monkeypatch):
    """An interrupt inside a zmq call can leave a socket that term() waits for forever (CI, once):
    the bench's cleanup gives up after CLOSE_BOUND_S instead of hanging."""
    import threading

    from families.lookup import bench as B

    monkeypatch.setattr(B, "CLOSE_BOUND_S", 0.3)
    never = threading.Event()

    class Hangs:
        def close(self):
            never.wait(5)

    class Ctx:
        def destroy(self, linger=0):
            pass

    t0 = time.monotonic()
    with pytest.raises(B._Stuck):
        B._close_bounded(Hangs(), Hangs(), Ctx())
    assert time.monotonic() - t0 < 2
    never.set()
    B._close_bounded(type("Ok", (), {"close": lambda self: None})(), type("Ok", (), {"close": lambda self: None})(),
                     Ctx())  # returns when both close in time
