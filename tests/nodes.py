"""A ``pdchaos node KIND`` process for tests that drive nodes directly (fake peer, interposer)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time


class Node:
    """A ``pdchaos node KIND`` process: started, READY awaited, stopped with a signal (killed if stuck)."""

    def __init__(self, kind: str, args: list[str], workdir: str):
        self.log_path = os.path.join(workdir, f"{kind}-{time.monotonic_ns()}.log")
        self._log = open(self.log_path, "w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "node", kind, *args],
                                     stdout=subprocess.PIPE, stderr=self._log, text=True,
                                     start_new_session=True)
        self.signalled = False

    def wait_ready(self, timeout: float = 10.0) -> "Node":
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            r, _, _ = select.select([self.proc.stdout], [], [], 0.05)
            if r:
                line = self.proc.stdout.readline()
                if line.strip() == "READY":
                    return self
                if line == "" and self.proc.poll() is not None:
                    break
        self.proc.kill()
        self.stop()
        raise AssertionError(f"node not READY: rc={self.proc.returncode} log={self.log()!r}")

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        with open(self.log_path) as fh:
            return fh.read()

    def send(self, sig: int = signal.SIGTERM) -> None:
        """Send ``sig`` once: a second SIGTERM that lands while Python is already shutting down
        (handlers restored to the default) would kill the process instead of stopping it."""
        if self.proc.poll() is None and not self.signalled:
            self.signalled = True
            self.proc.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 5.0) -> int:
        if self.proc.poll() is None:
            self.send(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()
        return self.proc.returncode


def free_tcp_endpoint() -> str:
    from harness.topology import free_tcp_port

    return f"tcp://127.0.0.1:{free_tcp_port()}"


def run_env_helper(argv: list[str], *, env: dict, cwd: str, timeout: float, marker: str) -> tuple[dict, str, str]:
    """Run a test helper script with a node env's python (``argv``), killed at ``timeout``; its
    result is the JSON after ``marker`` on its last such stdout line. Returns (result, out, err);
    a non-zero exit or no result line fails the test with the helper's stderr tail."""
    import json

    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, f"helper exited {proc.returncode}:\n{err[-3000:]}"
    lines = [ln for ln in out.splitlines() if ln.startswith(marker)]
    assert lines, f"no result line from the helper:\n{err[-3000:]}"
    return json.loads(lines[-1][len(marker):]), out, err


def run_pd_env_helper(script: str, *, timeout: float, marker: str, env_extra: dict | None = None) -> dict:
    """Run ``tests/helpers/<script>`` with the P/D node env's python (vLLM, torch, Mooncake), the repo
    as its argument, proxies left out of its environment; skips when that env is not installed.
    Returns the helper's result (:func:`run_env_helper`)."""
    import os
    from pathlib import Path

    import pytest

    from stacks.vllm_cpu.recipe import pd_node_env

    env = pd_node_env(out=lambda line: None)
    if not env.installed():
        pytest.skip("the P/D node stack (vLLM, torch, Mooncake) is not installed here: "
                    "run `pdchaos setup --only pd-node-stack`")
    repo = Path(__file__).resolve().parents[1]
    child_env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    child_env.update(env_extra or {})
    result, _, _ = run_env_helper([str(env.python), str(repo / "tests" / "helpers" / script), str(repo)],
                                  env=child_env, cwd=str(repo), timeout=timeout, marker=marker)
    return result
