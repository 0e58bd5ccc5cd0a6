"""The lookup family's topology: one lookup server (worker rank 0) and what sits in its link.

Roles: ``server`` (the target's server: hardened ``lookup-server`` or ``legacy-server``; a fault
may swap in a ``fake-peer`` on the same endpoint), ``interposer`` with ``link: interposer``; the
workload (the scheduler side) is the client. The link is ``direct``, through the ZMQ interposer,
through a Toxiproxy proxy (tcp), or across two network namespaces (client in "a", server in "b").
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Callable

from harness.topology import BaseTopology, NodeSpec, free_tcp_port

SERVER_KIND = {"hardened": "lookup-server", "legacy": "legacy-server"}
GRACE_S = 1.0  # the workload's grace after its duration, on top of deadline + tolerance


def preload_keys(seed: int, n: int) -> list[str]:
    rng = random.Random(seed ^ 0x5EED)
    return [rng.getrandbits(256).to_bytes(32, "big").hex() for _ in range(n)]


class LookupTopology(BaseTopology):
    def __init__(self, scenario: Any, target: str, run_dir: Path, record: Callable[[dict], None],
                 services: dict[str, Any] | None = None):
        super().__init__(scenario, target, run_dir, record, services)
        self.topo = scenario.topology
        self.preload = preload_keys(scenario.seed, self.topo.preload_blocks)
        self.preload_path = run_dir / "preload.txt"
        self.preload_path.write_text("\n".join(self.preload) + "\n")
        if self.topo.link == "netns":
            self.make_netns()
            self.server_endpoint = f"tcp://{self.netns.ip_b}:{free_tcp_port()}"
        elif self.topo.transport == "ipc":
            self.server_endpoint = f"ipc://{self.tmp}/lookup.sock"
        else:
            self.server_endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"
        self.client_endpoint = self.server_endpoint

    # ------------------------------------------------------------ family hooks
    def node_spec(self, role: str) -> NodeSpec:
        t = self.topo
        if role == "server":
            args = self._peer_args()
            kind = SERVER_KIND[self.target]
            if kind == "lookup-server":
                args += ["--backend-timeout-ms", str(max(1, int(t.backend_timeout * 1000)))]
            return NodeSpec(kind, args, endpoints={"lookup": self.server_endpoint})
        if role == "interposer":
            # the lookup wire knowledge (named rewrites) is this family's codec: faults know no protocol
            return NodeSpec("interposer", ["--listen", self._interposer_listen, "--upstream", self.server_endpoint,
                                           "--codec", f"{__package__}.wire"])
        return super().node_spec(role)

    def start(self) -> None:
        self.start_node("server")
        if self.topo.link == "interposer":
            self._interposer_listen = (f"ipc://{self.tmp}/interposer.sock" if self.topo.transport == "ipc"
                                       else f"tcp://127.0.0.1:{free_tcp_port()}")
            self.start_node("interposer")
            self.client_endpoint = self._interposer_listen
        elif self.topo.link == "toxiproxy":
            listen = self.toxiproxy_link("lookup", self.server_endpoint[len("tcp://"):])
            self.client_endpoint = f"tcp://{listen}"

    def workload_config(self) -> dict:
        m, w = self.scenario, self.scenario.workload
        return {"endpoint": self.client_endpoint, "target": self.target, "deadline_ms": int(round(m.deadline * 1000)),
                "concurrency": w.concurrency, "rate": w.rate, "duration_s": w.duration,
                "grace_s": m.deadline + m.tolerance + GRACE_S, "mix": w.mix.model_dump(),
                "prompt_blocks": list(w.prompt_blocks), "seed": m.seed, "preload": self.preload,
                "block_size": self.topo.block_size, "groups": self.topo.groups, "reset_at_s": w.reset_at}

    # ------------------------------------------------------------ what the lookup faults use
    def _peer_args(self) -> list[str]:
        """What the server and any peer swapped in for it share: endpoint and keys."""
        t = self.topo
        return ["--endpoint", self.server_endpoint, "--preload", str(self.preload_path),
                "--block-size", str(t.block_size), "--groups", str(t.groups)]

    def swap_server(self, kind: str, args: list[str]) -> None:
        self.swap_node("server", NodeSpec(kind, self._peer_args() + list(args)))

    def restore_server(self) -> None:
        self.restore_node("server")

    def server_control(self, cmd: str, **fields: Any) -> dict:
        return self.control("server", cmd, **fields)
