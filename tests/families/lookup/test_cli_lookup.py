"""``pdchaos lookup`` against a real ``pdchaos node lookup-server`` process, and bad input."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time

import pytest

from rawpeers import SHORT_DEADLINE_MS, TOLERANCE_S, distinct_hashes, hexes

pytestmark = [pytest.mark.usefixtures("log_guard"), pytest.mark.timeout(40)]

PDCHAOS = [sys.executable, "-m", "harness.cli"]  # the console script's own entry: harness.cli:main
START_S = 15.0  # a node process must print READY within this (python start-up on a loaded box)


def write_hashes(dirpath: str, name: str, hashes) -> str:
    path = os.path.join(dirpath, name)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("# block hashes, one per line\n" + "\n".join(hexes(hashes)) + "\n")
    return path


class Node:
    """A ``pdchaos node lookup-server`` subprocess; killed at teardown whatever happens."""

    def __init__(self, endpoint: str, preload: str):
        self.endpoint = endpoint
        self.proc = subprocess.Popen(
            [*PDCHAOS, "node", "lookup-server", "--endpoint", endpoint, "--preload", preload],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_S
        line = ""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.1)
            if ready:
                line = self.proc.stdout.readline()
                if line.strip() == "READY":
                    return
                if not line:
                    break
        self.proc.kill()
        raise AssertionError(f"node not READY (last line {line!r}): {self.proc.stderr.read()[-500:]}")

    def stop(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGTERM)
        try:
            _, err = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise
        return self.proc.returncode, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def files(ipc_dir, request):
    d = os.path.join(ipc_dir, f"cli-{request.node.name}".replace("[", "-").replace("]", ""))
    os.makedirs(d, exist_ok=True)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def run_lookup(*args: str, timeout: float = 20.0) -> subprocess.CompletedProcess:
    return subprocess.run([*PDCHAOS, "lookup", *args], capture_output=True, text=True, timeout=timeout)


def test_lookup_against_a_node(make_endpoint, transport, files):
    stored = distinct_hashes(3, "cli-stored")
    preload = write_hashes(files, "preload.txt", stored)
    query = write_hashes(files, "query.txt", stored + distinct_hashes(1, "cli-absent"))
    miss = write_hashes(files, "miss.txt", distinct_hashes(2, "cli-absent"))
    node = Node(make_endpoint(), preload)
    try:
        node.wait_ready()
        hit = run_lookup("--endpoint", node.endpoint, "--token-len", "64", "--hashes-file", query)
        missed = run_lookup("--endpoint", node.endpoint, "--token-len", "32", "--hashes-file", miss,
                            "--timeout-ms", "3000")
        code, err = node.stop()
    finally:
        node.kill()
    for proc in (hit, missed):
        assert proc.returncode == 0, proc.stderr
        assert len(proc.stdout.splitlines()) == 1
    out = json.loads(hit.stdout)
    assert out["hit_tokens"] == 48 and out["outcome"] == "ok"
    assert isinstance(out["elapsed_ms"], (int, float)) and 0 <= out["elapsed_ms"] < 3000
    out = json.loads(missed.stdout)
    assert out["hit_tokens"] == 0 and out["outcome"] == "ok"  # a real miss
    assert code == 0, err
    assert "Traceback" not in err
    if transport == "ipc":
        assert not os.path.exists(node.endpoint[len("ipc://"):])


def test_fail_open_result_is_not_an_error(make_endpoint, files):
    query = write_hashes(files, "q.txt", distinct_hashes(2, "cli-timeout"))
    proc = run_lookup("--endpoint", make_endpoint(), "--token-len", "32", "--hashes-file", query,
                      "--timeout-ms", str(SHORT_DEADLINE_MS))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["hit_tokens"] == 0 and out["outcome"] == "timeout"
    assert out["elapsed_ms"] <= SHORT_DEADLINE_MS + TOLERANCE_S * 1000


def bad_cases(files: str, ok_endpoint: str) -> dict[str, list[str]]:
    good = write_hashes(files, "good.txt", distinct_hashes(1, "cli-bad"))
    nonhex = os.path.join(files, "nonhex.txt")
    with open(nonhex, "w") as fh:
        fh.write("zz-not-hex\n")
    unreadable = os.path.join(files, "unreadable.txt")
    with open(unreadable, "w") as fh:
        fh.write("00\n")
    os.chmod(unreadable, 0)
    base = ["--token-len", "16"]
    cases = {
        "endpoint off loopback": ["--endpoint", "tcp://10.1.2.3:5555", *base, "--hashes-file", good],
        "endpoint scheme": ["--endpoint", "udp://127.0.0.1:5555", *base, "--hashes-file", good],
        "endpoint no port": ["--endpoint", "tcp://127.0.0.1", *base, "--hashes-file", good],
        "endpoint folder missing": ["--endpoint", "ipc:///nonexistent-pdc-dir/x.sock", *base, "--hashes-file", good],
        "hashes file missing": ["--endpoint", ok_endpoint, *base, "--hashes-file", os.path.join(files, "nope")],
        "hashes file is a folder": ["--endpoint", ok_endpoint, *base, "--hashes-file", files],
        "hashes file not hex": ["--endpoint", ok_endpoint, *base, "--hashes-file", nonhex],
        "timeout zero": ["--endpoint", ok_endpoint, *base, "--hashes-file", good, "--timeout-ms", "0"],
        "timeout negative": ["--endpoint", ok_endpoint, *base, "--hashes-file", good, "--timeout-ms", "-5"],
        "timeout float": ["--endpoint", ok_endpoint, *base, "--hashes-file", good, "--timeout-ms", "1.5"],
        "timeout text": ["--endpoint", ok_endpoint, *base, "--hashes-file", good, "--timeout-ms", "soon"],
    }
    if os.geteuid() != 0:  # root reads a mode-000 file anyway
        cases["hashes file unreadable"] = ["--endpoint", ok_endpoint, *base, "--hashes-file", unreadable]
    return cases


def test_bad_input_exits_2_with_one_line(ipc_endpoint, files):
    cases = bad_cases(files, ipc_endpoint())
    # start them all at once (each is a python start-up), then check each
    procs = {name: subprocess.Popen([*PDCHAOS, "lookup", *args], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
             for name, args in cases.items()}
    problems = []
    for name, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            problems.append(f"{name}: did not exit")
            continue
        lines = err.strip().splitlines()
        if proc.returncode != 2 or len(lines) != 1 or "Traceback" in err or out:
            problems.append(f"{name}: rc={proc.returncode} stdout={out!r} stderr={err!r}")
    assert not problems, "\n".join(problems)


def test_node_bad_preload_exits_2(ipc_endpoint, files):
    proc = subprocess.run([*PDCHAOS, "node", "lookup-server", "--endpoint", ipc_endpoint(), "--preload",
                           os.path.join(files, "missing.txt")], capture_output=True, text=True, timeout=20)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "--preload" in proc.stderr
    assert "Traceback" not in proc.stderr and "READY" not in proc.stdout


def test_console_script_is_installed():
    exe = shutil.which("pdchaos")
    if exe is None:
        pytest.skip("pdchaos console script not on PATH (package not installed with pip install -e .)")
    proc = subprocess.run([exe, "lookup", "--endpoint", "bogus", "--token-len", "1", "--hashes-file", "x"],
                          capture_output=True, text=True, timeout=20)
    assert proc.returncode == 2 and "--endpoint" in proc.stderr and "Traceback" not in proc.stderr
