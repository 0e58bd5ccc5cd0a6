"""``pdchaos bench FAMILY ...`` and ``pdchaos fuzz FAMILY ...``: a family's own benchmark or fuzzer.

The family names the module (``Family.bench_module`` / ``Family.fuzz_module``); the options after
FAMILY are that module's own (``pdchaos bench lookup --help``).
"""

from __future__ import annotations

import argparse
import importlib

from ..errors import UsageError


def make(tool: str):
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("family", metavar="FAMILY", help=f"whose {tool} to run (`pdchaos list --families`)")
        p.add_argument("options", nargs=argparse.REMAINDER, help=f"the family's {tool} options (FAMILY --help)")

    def run(args: argparse.Namespace) -> int:
        from .main import _Parser
        from ..family import get_family

        fam = get_family(args.family)
        module = getattr(fam, f"{tool}_module")
        if not module:
            raise UsageError(f"{tool}: family {fam.name!r} has no {tool}")
        mod = importlib.import_module(module)
        parser = _Parser(prog=f"pdchaos {tool} {fam.name}", description=(mod.__doc__ or "").strip().splitlines()[0])
        mod.add_arguments(parser)
        return int(mod.run(parser.parse_args(args.options)) or 0)

    return add_arguments, run
