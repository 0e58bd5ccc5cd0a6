"""``pdchaos``: one entry point, one module per subcommand.

Each subcommand lives in ``harness/cli/<name>.py`` with ``add_arguments(parser)`` and
``run(args) -> int``. Modules are imported only when their command runs, so ``pdchaos node ...``
starts fast and a broken optional dependency only affects the command that needs it.

Exit codes: 0 as expected, 1 a deviation, 2 bad input or a harness error (one line on stderr).
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys

from nodekit.nodeio import NodeUsageError

from ..errors import HarnessError, UsageError

# name -> (module, help)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("harness.cli.run", "run scenarios against each of their targets (e.g. hardened and legacy)"),
    "validate": ("harness.cli.validate", "validate scenario files"),
    "list": ("harness.cli.list", "list scenarios"),
    "schema": ("harness.cli.schema", "print the scenario JSON Schema"),
    "check": ("harness.cli.check", "re-run the checks of a saved run offline"),
    "mutate": ("harness.cli.mutate", "judge the baseline's runs against the hardened target's claims: every "
                                     "claimed gain must be told apart (the mutation score)"),
    "report": ("harness.cli.report", "regenerate plots and summaries of a saved run"),
    "repro": ("harness.cli.repro", "run one scenario against one target (default upstream) and write a self-contained "
                                   "report folder: environment, node commands, steps, claim vs actual, incident timeline"),
    "compare": ("harness.cli.compare", "compare two runs"),
    "doctor": ("harness.cli.doctor", "list the tools present and what their absence disables"),
    "clean": ("harness.cli.clean", "remove what killed runs left under a launch profile's runtime (a cluster's namespaces)"),
    "setup": ("harness.cli.setup", "install what the families' scenarios need (idempotent; toxiproxy-server, iptables)"),
    "lock": ("harness.cli.lock", "resolve the node stacks' lock files (uv, hashes; setup then installs from them)"),
    "measure": ("harness.cli.measure", "measure set-up, the quick path, the main job and the tests on this "
                                       "checkout; write docs/measurements.json and the README's figures"),
    "node": ("harness.cli.node", "run one node of a topology (any family's node kinds)"),
    "fuzz": ("harness.cli.fuzz", "fuzz a live node of a family: pdchaos fuzz FAMILY ..."),
    "docs": ("harness.cli.docs", "generate the per-scenario tables in docs/scenarios/ from the scenario files "
                                 "and recorded runs (--check: fail when stale)"),
    "bench": ("harness.cli.bench", "benchmark a family's normal path, its targets side by side"),
    "upstream": ("harness.cli.upstream", "prove the upstream diffs (connector_patch/upstream/): each diff's tests "
                                         "fail before it and pass after it, and upstream's own tests pass with the series"),
    "explore": ("harness.cli.explore", "generative chaos: draw seeded fault schedules over real nodes, shrink "
                                       "what a target fails to a scenario that reproduces it"),
}
# Commands a family adds (e.g. ``pdchaos lookup``) are found in the families, and those a runtime
# adds (e.g. a local cluster's up/down) in the runtimes, not listed here.


def _family_commands() -> dict[str, tuple[str, str]]:
    from ..family import all_families
    from ..runtime import load_runtime, runtime_names

    out: dict[str, tuple[str, str]] = {}
    owners = [(f"family {fam.name!r}", fam.commands) for fam in all_families()]
    for name in runtime_names():
        try:
            owners.append((f"runtime {name!r}", dict(getattr(load_runtime(name), "commands", {}) or {})))
        except HarnessError:
            continue  # a runtime that does not load adds no command (doctor names it)
    for owner, commands in owners:
        for name, spec in commands.items():
            if name in COMMANDS or name in out:
                raise HarnessError(f"{owner}: command {name!r} already exists")
            out[name] = spec
    return out


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        raise UsageError(f"{self.prog}: {message}")


def _parse(argv: list[str]) -> argparse.Namespace:
    # Build only the parser of the command asked for: node processes start fast.
    parser = _Parser(prog="pdchaos", description="Chaos harness for P/D disaggregated LLM serving.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    wanted = next((a for a in argv if not a.startswith("-")), None)
    commands = dict(COMMANDS)
    if wanted not in COMMANDS:  # family commands: loaded only when asked for (nodes start fast)
        commands.update(_family_commands())
    for name, (module, help_text) in commands.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        if name == wanted:
            importlib.import_module(module).add_arguments(p)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = _parse(argv)
        mod = importlib.import_module(args._module)
        return int(mod.run(args) or 0)
    except NodeUsageError as exc:  # UsageError and the node helpers' own bad-input error
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except HarnessError as exc:
        print(f"harness error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except BrokenPipeError:
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
