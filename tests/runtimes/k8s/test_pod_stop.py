"""A stop that keeps the pod (runtimes/k8s/pods.py, ``cluster.peers: pod-ip``): the node's processes
end, the container's first process (manifests.ENTRY) stays, so the pod keeps its address and the
node's port refuses connections, as a stopped node's port does on a host.

A pod here is what a container is to the kernel: a new pid namespace (``unshare``) whose first
process runs the very entry shell the manifests render, and exec is ``nsenter`` into it (a process
whose parent is outside the namespace, as runc's exec). Needs root (unshare, nsenter)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtimes.k8s import manifests as M
from runtimes.k8s import pods

pytestmark = pytest.mark.timeout(60)


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (a pid namespace: unshare, nsenter)"
    missing = [t for t in ("unshare", "nsenter", "sh") if shutil.which(t) is None]
    return f"{', '.join(missing)} not found" if missing else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 2).close()
    except ConnectionRefusedError:
        return True
    return False


class Pod:
    """The entry shell as a pid namespace's first process, running ``node``; ``exec`` runs a shell
    script in the namespace from outside."""

    def __init__(self, tmp: Path, node: list[str]) -> None:
        self.dir = str(tmp)
        entry = self.fix(f"rm -f {M.READY_FILE} {M.STOPPED_FILE} && {M.ENTRY}")
        self.proc = subprocess.Popen(["unshare", "-fp", "--mount-proc", "sh", "-c", entry, "pdchaos-node", *node])
        end = time.monotonic() + 10
        self.init = None
        while self.init is None and time.monotonic() < end:
            kids = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout.split()
            self.init = int(kids[0]) if kids else None
            time.sleep(0.05)
        assert self.init, "the namespace's first process did not start"

    def fix(self, script: str) -> str:  # the pod's run folder is this test's folder
        return script.replace(M.RUN_DIR, self.dir)

    def exec(self, script: str) -> str:
        out = subprocess.run(["nsenter", "-t", str(self.init), "-p", "-m", "sh", "-c", self.fix(script)],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def comms(self) -> list[str]:
        out = self.exec("for f in /proc/[0-9]*/comm; do read -r c < $f; echo \"${f#/proc/} $c\"; done")
        return sorted(line for line in out.splitlines() if not line.startswith(("self", "thread-self")))

    def close(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.init, signal.SIGKILL)  # the namespace's init: every process in it goes
            self.proc.wait(10)


def _node(port: int, ignore_term: bool) -> list[str]:
    """A node with a child of its own (as vLLM's engine core) that serves TCP on ``port``."""
    code = ("import signal, subprocess, socket, time\n"
            + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else "")
            + "subprocess.Popen([__import__('sys').executable, '-c', 'import time; time.sleep(600)'])\n"
            f"s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            f"s.bind(('127.0.0.1', {port})); s.listen()\n"
            "while True:\n    s.accept()[0].close()\n")
    return [sys.executable, "-c", code]


@pytest.fixture
def pod_of(tmp_path):
    why = _why_not()
    if why:
        pytest.skip(why)
    made: list[Pod] = []

    def make(node: list[str]) -> Pod:
        made.append(Pod(tmp_path, node))
        return made[-1]

    yield make
    for p in made:
        p.close()


def _until(ok, timeout_s: float = 10.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if ok():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("ignore_term", [False, True], ids=["term", "term-ignored"])
def test_a_stop_ends_the_node_keeps_the_first_process_and_the_port_refuses(pod_of, tmp_path, ignore_term):
    port = _free_port()
    pod = pod_of(_node(port, ignore_term))
    assert _until(lambda: not _refused(port)), "the node serves before the stop"
    assert pod.exec(pods.STOPPED_CHECK).strip() == "-1"  # not stopped: no mark
    t0 = time.monotonic()
    assert pod.exec(pods.stop_script(1.0)).strip() == "0"  # no process of the node left
    took = time.monotonic() - t0
    assert (took > 1.0) if ignore_term else (took < 1.0), took  # SIGKILL after the grace only for one that stays
    assert _refused(port), "a stopped node's port refuses"
    assert pod.proc.poll() is None, "the entry shell stays: the pod keeps its address"
    assert (tmp_path / "stopped").exists() and not (tmp_path / "ready").exists()
    assert pod.exec(pods.STOPPED_CHECK).strip() == "0"
    left = [c for c in pod.comms() if not c.endswith((" sh", " sleep"))]  # the entry shell, its sleep, this exec
    assert left == [], left
    time.sleep(1.5)  # nothing brings the node back (the entry shell only sleeps)
    assert _refused(port)
    os.kill(pod.init, signal.SIGTERM)  # the pod deleted: the kubelet's SIGTERM ends the entry shell at once
    pod.proc.wait(5)


def test_a_kill_is_sigkill_at_once(pod_of):
    port = _free_port()
    pod = pod_of(_node(port, ignore_term=True))
    assert _until(lambda: not _refused(port))
    t0 = time.monotonic()
    assert pod.exec(pods.stop_script(0.0)).strip() == "0"
    assert time.monotonic() - t0 < 1.0 and _refused(port)


def test_without_a_stop_the_entry_shell_ends_with_its_node(pod_of):
    """A node that ends by itself (a crash) still ends its container with its code: the kubelet
    restarts it, as before; only the harness's stop keeps the container's first process."""
    pod = pod_of([sys.executable, "-c", "import sys; sys.exit(7)"])
    pod.proc.wait(10)
    assert pod.proc.returncode == 7
