"""``pdchaos cluster up|down|status``: a REAL single-node Kubernetes cluster on this machine
(runtimes/k8s/realnode.py: a kubelet running pods under containerd, Chaos Mesh's own controller
and daemon), for ``runtime: k8s`` launch profiles. As root; needs ``pdchaos setup --only k8s-node``.

* ``up`` starts it in a background process and returns once the node is Ready and Chaos Mesh
  answers (~1 min); prints ``export PDCHAOS_KUBECONFIG=...``; its state (kubeconfig, folder, pids)
  is in ``~/.cache/pdchaos/k8s/realnode-state.json``.
* ``status`` says whether one is up, its node and pids, and whether its API server answers.
* ``down`` stops it and leaves the host as found (processes, mounts, the bridge, cgroups, iptables
  chains; realnode.py says what exactly); a cluster whose background process died is cleaned too.

Exit codes: 0 done; 1 ``status`` with no cluster up, or ``down`` that could not undo everything;
2 bad input, the stack missing (``run pdchaos setup --only k8s-node``), or ``up`` failing (one line
naming the component and the end of its log).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness.errors import HarnessError

UP_TIMEOUT_S = 420.0
DOWN_TIMEOUT_S = 150.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("up", "down", "status"), help="start, stop or show the local real cluster")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help=f"how long up waits for the cluster ({UP_TIMEOUT_S:g} s) or down for it to stop "
                        f"({DOWN_TIMEOUT_S:g} s)")


def _read_state(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is no live cluster
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (OSError, IndexError):
        return True


def run(args: argparse.Namespace) -> int:
    from . import realnode

    if args.timeout is not None and args.timeout <= 0:
        raise HarnessError(f"--timeout {args.timeout:g}: must be above 0")
    return {"up": _up, "down": _down, "status": _status}[args.action](realnode, args)


def _up(realnode, args: argparse.Namespace) -> int:
    why = realnode.stack_missing()
    if why:
        raise HarnessError(f"cluster up: the k8s-node stack is not installed ({why}): "
                           "run `pdchaos setup --only k8s-node`")
    if os.geteuid() != 0:
        raise HarnessError("cluster up: needs root (containerd, the kubelet, a bridge, cgroups, iptables)")
    path = realnode.state_path()
    state = _read_state(path)
    if state and state.get("state") == "up" and _alive(int(state.get("pid", 0))):
        print(f"cluster: already up (pid {state['pid']}, node {state.get('node')})")
        print(f"export PDCHAOS_KUBECONFIG={state['kubeconfig']}")
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    log = path.with_name("realnode-serve.log")
    timeout = args.timeout or UP_TIMEOUT_S
    root = str(Path(__file__).resolve().parents[2])
    code = (f"import sys; sys.path.insert(0, {root!r}); from runtimes.k8s.realnode import serve; "
            f"sys.exit(serve({str(path)!r}))")
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=fh, stderr=fh,
                                start_new_session=True)
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        state = _read_state(path)
        if state and state.get("pid") == proc.pid:
            if state.get("state") == "up":
                took = time.monotonic() - t0
                print(f"cluster: up in {took:.0f} s: node {state['node']} ({state['node_ip']}) Ready, Chaos Mesh "
                      f"answering; images {state['host_usr_image']}, {state['pause_image']}; logs {state['logs']}")
                print(f"export PDCHAOS_KUBECONFIG={state['kubeconfig']}")
                return 0
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            path.unlink(missing_ok=True)
            raise HarnessError(f"cluster up: {state.get('error')}")
        if proc.poll() is not None:
            tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-1:]
            raise HarnessError(f"cluster up: its background process exited {proc.returncode}"
                               + (f": {tail[0][:300]}" if tail else ""))
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)  # it stops the half-started cluster and cleans up
    try:
        proc.wait(timeout=DOWN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
    raise HarnessError(f"cluster up: not up within {timeout:g} s (log: {log})")


def _down(realnode, args: argparse.Namespace) -> int:
    path = realnode.state_path()
    state = _read_state(path)
    if not state:
        print("cluster: none is up")
        return 0
    pid, folder = int(state.get("pid", 0)), state.get("dir")
    timeout = args.timeout or DOWN_TIMEOUT_S
    if pid and _alive(pid):
        os.kill(pid, signal.SIGTERM)
        end = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < end:
            time.sleep(0.3)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)  # its watchdog then cleans the host
            print(f"cluster: its process {pid} did not stop within {timeout:g} s: killed (its watchdog cleans up)",
                  file=sys.stderr)
            time.sleep(2)
    problems = realnode.clean_host(folder) if folder and os.path.isdir(folder) else []
    path.unlink(missing_ok=True)
    if problems:
        for p in problems:
            print(f"cluster down: not undone: {p}", file=sys.stderr)
        return 1
    print("cluster: down; the host is as it was before it started")
    return 0


def _status(realnode, args: argparse.Namespace) -> int:
    state = _read_state(realnode.state_path())
    if not state or state.get("state") != "up" or not _alive(int(state.get("pid", 0))):
        print("cluster: none is up" + (" (a stale state file: `pdchaos cluster down` cleans it)" if state else ""))
        return 1
    from kubernetes import client, config

    try:
        api = config.new_client_from_config(config_file=state["kubeconfig"])
        try:
            nodes = client.CoreV1Api(api).list_node(_request_timeout=5).items
            pods = client.CoreV1Api(api).list_pod_for_all_namespaces(_request_timeout=5).items
        finally:
            api.close()
        ready = [n.metadata.name for n in nodes
                 if any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))]
        answer = f"API server answers; nodes Ready: {', '.join(ready) or 'none'}; pods: {len(pods)}"
    except Exception as exc:  # noqa: BLE001 - one line
        answer = f"API server does not answer: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}"
    print(f"cluster: up (pid {state['pid']}, folder {state['dir']}); {answer}")
    print(f"  pids: {', '.join(f'{k} {v}' for k, v in state.get('pids', {}).items())}"
          + (f"; DEAD: {', '.join(state['dead'])}" if state.get("dead") else ""))
    print(f"export PDCHAOS_KUBECONFIG={state['kubeconfig']}")
    return 0
