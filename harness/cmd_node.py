"""``pdchaos node KIND ...``: one node of a topology, as its own OS process.

Every node serves until SIGTERM or SIGINT, then closes cleanly and exits 0. With ``--control``
it also answers the harness's control channel (faults/control.py). When ready it prints one line
``READY`` on stdout (the runner's readiness signal, together with a control ping).
"""

from __future__ import annotations

import argparse
import importlib

from .cli import _Parser
from .errors import UsageError

# kind -> (module with add_arguments(parser) and run(args) -> int, help)
KINDS: dict[str, tuple[str, str]] = {
    "lookup-server": ("harness.node_server", "the hardened lookup server (worker rank 0)"),
    "legacy-server": ("harness.node_server", "a model of today's upstream lookup server"),
    "fake-peer": ("faults.fake_peer", "a misbehaving lookup peer: slow, silent, malformed, legacy"),
    "interposer": ("faults.interposer", "a ZMQ man-in-the-middle between client and server"),
    "workload": ("harness.workload", "the scheduler side: runs lookups and records them"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    kinds = ", ".join(KINDS)
    parser.add_argument("kind", metavar="KIND", help=f"one of: {kinds}")
    parser.add_argument("options", nargs=argparse.REMAINDER, help="the node's own options (KIND --help)")
    parser.epilog = "kinds: " + "; ".join(f"{k}: {h}" for k, (_, h) in KINDS.items())


def run(args: argparse.Namespace) -> int:
    if args.kind not in KINDS:
        raise UsageError(f"node: unknown kind {args.kind!r}; expected one of {', '.join(KINDS)}")
    module_name, help_text = KINDS[args.kind]
    mod = importlib.import_module(module_name)  # only the kind asked for: nodes start fast
    parser = _Parser(prog=f"pdchaos node {args.kind}", description=help_text)
    mod.add_node_arguments(parser, args.kind)
    node_args = parser.parse_args(args.options)
    node_args.kind = args.kind
    return int(mod.run_node(node_args) or 0)
