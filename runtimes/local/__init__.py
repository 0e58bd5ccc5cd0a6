"""The local runtime: every node is a process on this machine (harness/procs.py's ProcHandle).

Each node starts in a session of its own (its process group: stop, kill, freeze and thaw reach its
children too), optionally inside one side of a network-namespace pair the run made
(faults/netns.py). Everything the harness knows how to do to a process it can do here: this is the
runtime every scenario was written against, and what runs when a launch profile names none.
"""

from __future__ import annotations

from typing import Any

from harness.procs import start_process
from harness.runtime import NODE_OPS, Launch, NodeHandle, Placement, Runtime


class LocalRuntime(Runtime):
    name = "local"
    # node_address: the harness reaches a node at an address the node itself announces (a side
    # channel in a bootstrap answer), not only at the endpoints the topology gave it
    provides = frozenset(NODE_OPS + ("netns", "toxiproxy", "interposer", "node_address"))
    setup_default = True

    def open(self, run_id: str, profile: Any = None, target: str | None = None) -> Placement:
        return _PLACEMENT


class LocalPlacement(Placement):
    """Nothing to make or remove per run: the topology's folder holds the run's sockets."""

    def start(self, launch: Launch, netns: Any = None) -> NodeHandle:
        argv, env = list(launch.argv), dict(launch.env)
        if netns is not None:
            argv = netns.argv(launch.side, argv)
            env["PDCHAOS_NETNS"] = netns.ns[launch.side]  # lets the node bind/connect its veth address
        return start_process(argv, name=launch.name, log_path=launch.log_path,
                             ready_timeout_s=launch.ready_timeout_s, env=env)


_PLACEMENT = LocalPlacement()
RUNTIME = LocalRuntime()
