"""The local runtime: every node is a process on this machine (harness/procs.py's ProcHandle).

Each node starts in a session of its own (its process group: stop, kill, freeze and thaw reach its
children too), optionally inside one side of a network-namespace pair the run made
(faults/netns.py). Everything the harness knows how to do to a process it can do here: this is the
runtime every scenario was written against, and what runs when a launch profile names none.

A harness that dies leaves nothing running: a signal (SIGINT, SIGTERM, SIGHUP) interrupts a node's
start at once (the placement's ``cancel``) and the run tears down; after a SIGKILL each node sees
its parent gone and stops its whole group (nodekit/nodeio.py), and :meth:`LocalRuntime.clean`
(called by the next run, ``pdchaos doctor`` and ``pdchaos clean``) removes its namespaces.
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
        return LocalPlacement()  # one per run: its ``cancel`` is that run's interrupt

    def clean(self, profile: Any = None) -> tuple[list[str], list[str]]:
        """What runs killed outright (SIGKILL: no teardown) left here, removed: their network
        namespaces (with the veths, iptables rules and qdiscs inside) and ipc folders. Their nodes
        stop themselves (the parent watch, nodekit/nodeio.py). Namespaces of unknown owner (no
        record: an older pd-chaos, or made by hand) are left alone and named."""
        from faults import netns
        from harness.topology import sweep_stale_tmp

        sweep_stale_tmp()
        removed, unknown = netns.sweep_stale()
        unknown = [n for n in unknown if not n.startswith("pdc-probe-")]  # doctor's own, gone within its call
        done = ([f"{len(removed)} network namespace(s) a killed run left (its iptables rules and qdiscs with "
                 f"them): {', '.join(removed)}"] if removed else [])
        left = ([f"{len(unknown)} network namespace(s) of unknown owner (an older pd-chaos, or made by hand; "
                 f"`ip netns del NAME` once no run uses them): {', '.join(unknown)}"] if unknown else [])
        return done, left


class LocalPlacement(Placement):
    """Nothing to make or remove per run: the topology's folder holds the run's sockets."""

    def start(self, launch: Launch, netns: Any = None) -> NodeHandle:
        argv, env = list(launch.argv), dict(launch.env)
        if netns is not None:
            argv = netns.argv(launch.side, argv)
            env["PDCHAOS_NETNS"] = netns.ns[launch.side]  # lets the node bind/connect its veth address
        # an interrupted run stops waiting for a node's READY at once (a vLLM start takes minutes)
        return start_process(argv, name=launch.name, log_path=launch.log_path,
                             ready_timeout_s=launch.ready_timeout_s, env=env, cancel=self.cancel)


RUNTIME = LocalRuntime()
