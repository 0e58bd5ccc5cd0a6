"""``pdchaos node KIND ...``: one node of a topology, as its own OS process.

Every node serves until SIGTERM or SIGINT, then closes cleanly and exits 0; when its runner dies
(the parent watch, nodekit/nodeio.py) it stops as on SIGTERM and its whole process group is
killed as the command ends (or ``ORPHAN_GRACE_S`` after, when its own stop is slower). With ``--control``
it also answers the harness's control channel (nodekit/control.py). When ready it prints one line
``READY`` on stdout (the runner's readiness signal, together with a control ping).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
from pathlib import Path

from .main import _Parser
from ..errors import UsageError

# generic kinds: kind -> (module with add_node_arguments(parser, kind) and run_node(args) -> int, help);
# each family adds its own (harness/family.py, ``node_kinds``)
KINDS: dict[str, tuple[str, str]] = {
    "interposer": ("faults.interposer", "a ZMQ man-in-the-middle between client and server"),
}


def _builtin_dir() -> Path:
    """The folder of the built-in families, found without importing them nor harness.family."""
    spec = importlib.util.find_spec("families")
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) if locations else Path("/nonexistent")


def _family_kinds(name: str) -> dict[str, tuple[str, str]]:
    """A family's node kinds from its light ``nodes`` module (``NODE_KINDS``), without loading the
    family (pydantic, its faults and checks): node processes start often and must start fast.
    The family module is found as harness/family.py resolves names: built-in folder, then an
    entry point of the group ``pdchaos.families``, then the name as a module path."""
    candidates = [f"families.{name}"] if "." not in name else []
    if "." not in name and not (_builtin_dir() / name).is_dir():
        from importlib.metadata import entry_points

        candidates += [ep.value.split(":")[0] for ep in entry_points(group="pdchaos.families")
                       if ep.name == name]
    candidates.append(name)
    for module in candidates:
        try:
            return dict(importlib.import_module(f"{module}.nodes").NODE_KINDS)
        except ModuleNotFoundError as exc:
            if not (exc.name and f"{module}.nodes".startswith(exc.name)):
                raise
    return {}


def all_kinds() -> dict[str, tuple[str, str]]:
    """Generic kinds, then those of the family that started this node (PDCHAOS_FAMILY, set by
    the topology), then those of every built-in family."""
    kinds = dict(KINDS)
    here = _builtin_dir()
    builtin = sorted(p.name for p in here.iterdir() if (p / "nodes.py").exists()) if here.is_dir() else []
    names = [n for n in [os.environ.get("PDCHAOS_FAMILY")] if n] + builtin
    for name in dict.fromkeys(names):
        for kind, spec in _family_kinds(name).items():
            kinds.setdefault(kind, spec)
    return kinds


def _find(kind: str) -> tuple[str, str] | None:
    if kind in KINDS:
        return KINDS[kind]
    fam = os.environ.get("PDCHAOS_FAMILY")
    if fam:
        spec = _family_kinds(fam).get(kind)
        if spec:
            return spec
    return all_kinds().get(kind)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    kinds = ", ".join(all_kinds())
    parser.add_argument("kind", metavar="KIND", help=f"one of: {kinds}")
    parser.add_argument("options", nargs=argparse.REMAINDER, help="the node's own options (KIND --help)")
    parser.epilog = "kinds: " + "; ".join(f"{k}: {h}" for k, (_, h) in all_kinds().items())


def run(args: argparse.Namespace) -> int:
    found = _find(args.kind)
    if found is None:
        raise UsageError(f"node: unknown kind {args.kind!r}; expected one of {', '.join(all_kinds())}")
    module_name, help_text = found
    mod = importlib.import_module(module_name)  # only the kind asked for: nodes start fast
    parser = _Parser(prog=f"pdchaos node {args.kind}", description=help_text)
    mod.add_node_arguments(parser, args.kind)
    node_args = parser.parse_args(args.options)
    node_args.kind = args.kind
    try:
        return int(mod.run_node(node_args) or 0)
    finally:
        from nodekit.nodeio import reap_if_orphaned

        reap_if_orphaned()  # the runner died: what this node started goes with it
