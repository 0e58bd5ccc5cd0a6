"""The topology of one scenario run: the lookup server and whatever sits in the link, as OS processes.

Server (worker rank 0) and client (the scheduler's workload) run as separate processes, as in a
deployment, on ipc or tcp loopback. The link is ``direct``, through the ZMQ ``interposer``, or
through a Toxiproxy proxy (tcp only). Every process is started in its own process group with a
parent-death signal, so nothing outlives the runner, even when it is killed; ``close()`` stops
them all and removes the run's ipc folder. This object is the FaultContext of faults/base.py.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from faults.control import ControlClient, ControlError

from .errors import HarnessError
from .procs import ProcHandle, node_command, start_process

SERVER_KIND = {"hardened": "lookup-server", "legacy": "legacy-server"}


def sweep_stale_tmp() -> None:
    """Remove ipc folders of runners that no longer exist (killed before their teardown)."""
    for d in Path(tempfile.gettempdir()).glob("pdc-*-*"):
        pid = d.name.split("-")[1]
        if not pid.isdigit() or not d.is_dir():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:
            pass


def free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Topology:
    def __init__(self, scenario: Any, target: str, run_dir: Path, preload_path: Path,
                 record: Callable[[dict], None], *, toxiproxy: Any = None):
        self.scenario = scenario
        self.topo = scenario.topology
        self.target = target
        self.run_dir = run_dir
        self.logs = run_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.preload_path = preload_path
        self._record = record
        self.rng = random.Random(scenario.seed)
        self.deadline = scenario.deadline  # seconds: faults judge what a delay should cause
        sweep_stale_tmp()
        # short (unix socket paths max 107 bytes), and named after the runner's pid so a folder
        # left by a runner that was killed outright can be recognised and swept by the next run
        self.tmp = Path(tempfile.mkdtemp(prefix=f"pdc-{os.getpid()}-"))
        self.server: ProcHandle | None = None
        self.server_baseline: dict | None = None
        self._stopped: list[ProcHandle] = []  # servers replaced or stopped during the run
        self.interposer: ProcHandle | None = None
        self.toxiproxy = toxiproxy
        self.proxy_name = "lookup"
        self._n = 0
        self.server_control_ep = f"ipc://{self.tmp}/server-ctl.sock"
        self.interposer_control_ep = f"ipc://{self.tmp}/interposer-ctl.sock"
        self._server_ctl = ControlClient(self.server_control_ep)
        self._interposer_ctl = ControlClient(self.interposer_control_ep)
        self.netns = None  # a faults.netns.NetnsPair with link: netns (client in "a", server in "b")
        if self.topo.link == "netns":
            from faults.netns import NetnsPair

            self.netns = NetnsPair().create()
            self.server_endpoint = f"tcp://{self.netns.ip_b}:{free_tcp_port()}"
        elif self.topo.transport == "ipc":
            self.server_endpoint = f"ipc://{self.tmp}/lookup.sock"
        else:
            self.server_endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"
        self.client_endpoint = self.server_endpoint

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.start_server()
        if self.topo.link == "interposer":
            listen = (f"ipc://{self.tmp}/interposer.sock" if self.topo.transport == "ipc"
                      else f"tcp://127.0.0.1:{free_tcp_port()}")
            self.interposer = self._spawn("interposer", [
                "--listen", listen, "--upstream", self.server_endpoint, "--control", self.interposer_control_ep,
            ])
            self.client_endpoint = listen
        elif self.topo.link == "toxiproxy":
            if self.toxiproxy is None:
                raise HarnessError("link toxiproxy: no toxiproxy-server running")
            listen_port = free_tcp_port()
            upstream = self.server_endpoint[len("tcp://"):]
            self.toxiproxy.create_proxy(self.proxy_name, listen=f"127.0.0.1:{listen_port}", upstream=upstream)
            self.client_endpoint = f"tcp://127.0.0.1:{listen_port}"

    def close(self) -> None:
        for proc in (self.interposer, self.server):
            if proc is not None:
                proc.stop(2.0)
        self.interposer = self.server = None
        if self.toxiproxy is not None and self.topo.link == "toxiproxy":
            try:
                self.toxiproxy.delete_proxy(self.proxy_name)
            except Exception:  # the server may be gone already; the run's teardown stops it
                pass
        self._server_ctl.close()
        self._interposer_ctl.close()
        if self.netns is not None:
            self.netns.cleanup()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def handles(self) -> list[ProcHandle]:
        """Every process this topology started and still holds (check them after close())."""
        return [p for p in (self.server, self.interposer) if p is not None] + list(self._stopped)

    def leftovers(self) -> list[str]:
        """What close() could not remove: the ipc folder."""
        return [str(self.tmp)] if self.tmp.exists() else []

    # ------------------------------------------------------------ helpers
    def _spawn(self, kind: str, args: list[str], *, side: str = "b", log_name: str | None = None,
               ready_timeout_s: float = 10.0) -> ProcHandle:
        """Start a node; with link netns inside its namespace ("a" client side, "b" server side).
        ipc control sockets live in the file system, so they work across network namespaces."""
        self._n += 1
        log = self.logs / (log_name or f"{self._n:02d}-{kind}.log")
        argv = node_command(kind, args)
        env = None
        if self.netns is not None:
            argv = self.netns.argv(side, argv)
            env = {"PDCHAOS_NETNS": self.netns.ns[side]}  # lets the node bind/connect its veth address
        proc = start_process(argv, name=f"node {kind}", log_path=str(log), ready_timeout_s=ready_timeout_s, env=env)
        self.event("process_start", kind=kind, pid=proc.pid)
        return proc

    def spawn_client(self, args: list[str], log_name: str) -> ProcHandle:
        """The workload (the scheduler side), on the client side of the link."""
        return self._spawn("workload", args, side="a", log_name=log_name, ready_timeout_s=15.0)

    def _server_args(self) -> list[str]:
        t = self.topo
        return ["--endpoint", self.server_endpoint, "--control", self.server_control_ep,
                "--preload", str(self.preload_path), "--block-size", str(t.block_size), "--groups", str(t.groups)]

    def event(self, what: str, **fields: Any) -> None:
        self._record({"type": "event", "what": what, "t": time.monotonic(), **fields})

    def probe_server(self, when: str, stats: dict | None = None) -> dict | None:
        """Record the server's threads, fds, counters and liveness; None if it does not answer."""
        stats = stats or self.server_stats()
        if stats is None:
            return None
        probe = {"type": "probe", "node": "server", "when": when, "t": time.monotonic(),
                 "pid": stats.get("pid"), "threads": stats.get("threads"), "fds": stats.get("fds"),
                 "counters": stats.get("counters", {}), "alive": bool(stats.get("alive", True)),
                 "kind": self.server.name if self.server else None}
        self._record(probe)
        if when == "baseline":
            self.server_baseline = probe
        return probe

    # ------------------------------------------------------------ FaultContext
    def start_server(self) -> None:
        if self.server is not None and self.server.alive:
            return
        kind = SERVER_KIND[self.target]
        args = self._server_args()
        if kind == "lookup-server":
            args += ["--backend-timeout-ms", str(max(1, int(self.topo.backend_timeout * 1000)))]
        self.server = self._spawn(kind, args)
        self.probe_server("baseline")

    def stop_server(self) -> None:
        if self.server is not None:
            self._stopped.append(self.server)
            self.server.stop(2.0)
            self.event("process_stop", kind=self.server.name, pid=self.server.pid,
                       returncode=self.server.returncode)
            self.server = None

    def kill_server(self) -> None:
        if self.server is not None:
            self._stopped.append(self.server)
            self.server.kill()
            self.event("process_kill", kind=self.server.name, pid=self.server.pid)
            self.server = None

    def signal_server(self, sig: int) -> None:
        if self.server is None:
            raise HarnessError("signal_server: no server running")
        os.kill(self.server.pid, sig)
        self.event("process_signal", kind=self.server.name, pid=self.server.pid, signal=signal.Signals(sig).name)

    def swap_server(self, kind: str, args: list[str]) -> None:
        self.stop_server()
        self.server = self._spawn(kind, self._server_args() + list(args))
        self.probe_server("baseline")

    def restore_server(self) -> None:
        self.stop_server()
        self.start_server()

    def server_control(self, cmd: str, **fields: Any) -> dict:
        return self._server_ctl.call(cmd, **fields)

    def interposer_control(self, cmd: str, **fields: Any) -> dict:
        if self.interposer is None:
            raise HarnessError("this fault needs topology.link: interposer")
        return self._interposer_ctl.call(cmd, **fields)

    def server_stats(self, timeout_ms: int = 1000) -> dict | None:
        """Stats of the current server, or None if it is down or does not answer."""
        if self.server is None or not self.server.alive:
            return None
        try:
            return self._server_ctl.call("stats", timeout_ms=timeout_ms)
        except ControlError:
            return None

    def final_probe(self, timeout_s: float = 1.0) -> dict | None:
        """Record the final server probe once threads and fds are back to ``baseline`` (threads of
        a healed fault wind down for a moment) or ``timeout_s`` passed, whichever is first."""
        deadline = time.monotonic() + timeout_s
        baseline = self.server_baseline
        stats = self.server_stats()
        while stats is not None and baseline is not None and stats.get("pid") == baseline.get("pid") \
                and time.monotonic() < deadline \
                and (stats.get("threads", 0) > baseline.get("threads", 0) or stats.get("fds", 0) > baseline.get("fds", 0)):
            time.sleep(0.05)
            stats = self.server_stats()
        return self.probe_server("final", stats) if stats is not None else None
