"""``pdchaos run PATH...``: run scenarios against each of their targets (e.g. the hardened patch
and the legacy baseline).

Exit 0 when every scenario/target run that ran ended as its scenario expects (a skipped run is
reported, and is not a deviation), 1 on any deviation or error, and with ``--strict`` also on any
skipped run; 2 on invalid input or a harness error (nothing is started before every scenario file
validated); 128 + the signal's number when SIGINT, SIGTERM or SIGHUP interrupted it (130, 143,
129: every process of the run stopped, the run under way torn down, its journal ending
``interrupted``). A run the family's launch profile cannot make (``--profile``:
e.g. a fault on a proxy phase the profile's connector does not have) is left out before anything
starts, listed as ``not run: NAME [TARGET]: why`` (and in ``not_run.json``), never counted as a
pass.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..interrupts import Interrupts, sweep_leftovers
from ..progress import Progress
from ..outputs import run_status, write_summary
from ..plan import (WarmOrder, choose_profiles, scratch_topology, missing_setup, order_for_reuse, plan_for_reuse,
                    split_plan, targets_of)
from ..pool import NodePool
from ..runner import Runner, new_run_dir
from ..services import start_toxiproxy
from ..schema import at_concurrency, load_all


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH", help="scenario files or folders")
    p.add_argument("--target", action="append", metavar="TARGET",
                   help="only this target (repeatable; `pdchaos list` shows each scenario's targets)")
    p.add_argument("-k", "--filter", default=None, help="only scenarios whose name contains this text")
    p.add_argument("--runs-dir", default="runs", help="where run folders go (default: runs/)")
    p.add_argument("--no-report", action="store_true", help="skip plots and summaries (journals and checks only)")
    p.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    p.add_argument("--strict", action="store_true",
                   help="a skipped scenario run (a tool or privilege missing here) fails the run: exit 1")
    p.add_argument("--dry-run", action="store_true",
                   help="print every node command, node config and workload config the run would start, per "
                        "scenario and target, and start nothing (ports, temporary paths and this interpreter "
                        "are shown as placeholders, so the output is stable)")
    p.add_argument("--profile", default=None, metavar="NAME|FILE",
                   help="node launch profile of the families that have them, a name or a .yaml file "
                        "(`pdchaos list --families` shows each family's profiles; none: each family's default)")
    p.add_argument("--attach", action="store_true",
                   help="run against a deployment that already exists (the launch profile's cluster.attach selectors): "
                        "deploy nothing but the harness's own fault peers, touch nothing else")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="profile_sets",
                   help="change one field of the profile (repeatable), e.g. --set model=/models/Qwen3-0.6B "
                        "--set devices.decode=3")
    p.add_argument("--quick", action="store_true",
                   help="only the scenarios marked `quick: true` (the first-result path: e.g. a silent prefill "
                        "peer, before and after), then the paths of their before/after plots")
    p.add_argument("--concurrency", type=int, metavar="N", default=None,
                   help="run every selected scenario with at least N workers, its request rate scaled by as "
                        "much (named NAME@cN): the same claims, under N requests at once")
    p.add_argument("--bench", type=int, metavar="N", default=0,
                   help="also run `pdchaos bench FAMILY --n N` first for each selected family that has a "
                        "benchmark, and keep its samples in the run folder (normal-path CDF and ratios in the "
                        "reports)")


def run_bench(run_dir: Path, n: int, family: str, out: Path) -> None:
    """A family's normal-path benchmark as its own process (it starts and stops its own nodes);
    its raw samples go to ``out``, which the reports turn into the CDF and the cost ratios."""
    import subprocess

    cmd = [sys.executable, "-m", "harness.cli", "bench", family, "--n", str(n), "--save", str(out)]
    print(f"bench {family}: {n} ops per target ...", flush=True)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        print(f"warning: bench {family} did not finish within 600 s; no normal-path figures", file=sys.stderr)
        return
    if proc.returncode not in (0, 1) or not out.exists():
        print(f"warning: bench {family} failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}",
              file=sys.stderr)
        return
    (out.with_suffix(".txt")).write_text(proc.stdout)
    print(proc.stdout.strip(), flush=True)


class _Placeholders:
    """Stable names for what changes from one run to the next: ports (``<port:1>``... in order of
    first appearance), the temporary run folder and node tmp folder, the interpreter, the home."""

    def __init__(self, run_dir: Path) -> None:
        import os
        import re

        self._re = re
        self.ports: dict[str, str] = {}
        from ..nodeenv.venv import cache_root

        # the cache as its default place names it (XDG_CACHE_HOME moves it), then the home
        self.paths = [(str(run_dir), "<run_dir>"), (sys.executable, "python3"),
                      (str(cache_root()), "~/.cache/pdchaos"), (os.path.expanduser("~"), "~")]

    def __call__(self, text: str) -> str:
        for real, name in self.paths:
            text = text.replace(real, name)

        def port(m) -> str:
            return m.group(1) + self.ports.setdefault(m.group(2), f"<port:{len(self.ports) + 1}>")

        self.ips: dict[str, str] = getattr(self, "ips", {})
        text = self._re.sub(r"\b(?!127\.0\.0\.1\b)\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}\b",
                            lambda m: self.ips.setdefault(m.group(0), f"<ip:{len(self.ips) + 1}>"), text)
        text = self._re.sub(r"(127\.0\.0\.1:|<ip:\d+>:|\.svc:|--[a-z-]*port )(\d{4,5})\b", port, text)
        return self._re.sub(r"(?<![\w:])(\d{4,5})\b", lambda m: self.ports.get(m.group(1), m.group(1)), text)


def _runtime_objects(sc: Any, target: str, topo: Any, roles: list[str], profile: Any) -> str | None:
    """What the run's runtime would make for it beyond processes (harness/runtime.py: a cluster's
    workloads and fault objects), or None."""
    from ..errors import HarnessError

    launches = []
    for role in roles:
        try:
            spec = topo.node_spec(role)
        except (HarnessError, KeyError, AttributeError):
            continue  # built from a started node: said above
        args = list(spec.args) + (["--control", topo.control_endpoint(role)] if spec.control else [])
        launches.append(topo.launch(spec.kind, args, role=role, side=spec.side, ready_timeout_s=spec.ready_timeout_s,
                                    endpoints=spec.endpoints))
    faults = [(f.type, f.model_dump(mode="json", exclude={"type", "at"}, by_alias=True)) for f in sc.faults]
    return topo.runtime.describe(topo.run_id, target, launches, faults, profile)


def dry_run(scenarios: list, plan: list[tuple], out=None, profiles: dict | None = None) -> int:
    """``--dry-run``: per planned (scenario, target), the family's topology is built (nothing is
    started: no process, no link, no Toxiproxy proxy) and asked how it would start each of its
    roles (``node_spec``) and the workload (``workload_config``); printed as commands and JSON."""
    import json
    import shlex

    from ..errors import HarnessError
    from ..procs import node_command

    out = out or sys.stdout
    for sc, target in plan:
        profile = (profiles or {}).get(sc.family.name)
        with scratch_topology(sc, target, profile) as (tmp, topo):
            ph = _Placeholders(tmp)
            ph.paths.insert(0, (str(topo.tmp), "<node_tmp>"))
            ph.paths.insert(0, (topo.run_id, "<run_id>"))  # from the scratch folder's path: new each time
            print(f"== {sc.name} [{target}] (family {sc.family.name}, {sc.path if hasattr(sc, 'path') else ''})"
                  .replace(", )", ")"), file=out)
            roles = sc.family.roles(sc.model, profile) or []
            for role in roles:
                try:
                    spec = topo.node_spec(role)
                except HarnessError as exc:
                    print(f"node {role}: no fixed command ({exc})", file=out)
                    continue
                except (KeyError, AttributeError) as exc:  # built from a node started before it
                    print(f"node {role}: its command is built from a started node ({type(exc).__name__} "
                          f"{exc}): known only in a real run", file=out)
                    continue
                env = f"PDCHAOS_FAMILY={topo.family_name} "
                print(f"node {role} (side {spec.side}, ready within {spec.ready_timeout_s:g} s):", file=out)
                print("  " + ph(env + shlex.join(node_command(spec.kind, spec.args))), file=out)
                if spec.endpoints:
                    print("  endpoints: " + ph(json.dumps(spec.endpoints, sort_keys=True)), file=out)
            cfg_note = ""
            try:
                cfg = topo.workload_config()
            except NotImplementedError:
                cfg = None
            except (KeyError, AttributeError) as exc:  # holds a started node's control endpoint
                cfg, cfg_note = None, (f"  config: built from a started node ({type(exc).__name__} {exc}): "
                                       "known only in a real run")
            config_path, journal = Path(tmp) / "workload.json", topo.journal_part("workload")
            print("workload:", file=out)
            print("  " + ph(f"PDCHAOS_FAMILY={topo.family_name} "
                            + shlex.join(node_command(topo.workload_kind, topo.workload_args(config_path, journal)))),
                  file=out)
            if cfg_note:
                print(cfg_note, file=out)
            if cfg is not None:
                short = {k: (f"<{len(v)} items>" if isinstance(v, list) and len(v) > 8 else v) for k, v in cfg.items()}
                print("  config: " + ph(json.dumps(short, sort_keys=True)), file=out)
            objects = _runtime_objects(sc, target, topo, roles, profile)
            if objects:
                print("runtime objects:", file=out)
                print(ph(objects).rstrip("\n"), file=out)
            print(file=out)
    print(f"dry run: {len(plan)} scenario/target run(s); nothing was started", file=out)
    return 0


def run(args: argparse.Namespace) -> int:
    scenarios = load_all(args.paths)  # validates everything before anything starts
    if args.quick:
        scenarios = [s for s in scenarios if s.model.quick]
        if not scenarios:
            raise UsageError("--quick: no selected scenario is marked `quick: true`")
    if args.filter:
        scenarios = [s for s in scenarios if args.filter in s.name]
        if not scenarios:
            raise UsageError(f"-k {args.filter!r}: no scenario name contains it")
    if args.concurrency is not None:
        if not 1 <= args.concurrency <= 64:
            raise UsageError(f"--concurrency {args.concurrency}: between 1 and 64")
        scenarios = [at_concurrency(s, args.concurrency) for s in scenarios]
    scenarios = order_for_reuse(scenarios)
    if args.attach:  # the runtime's attach mode (harness/runtime.py: the profile's cluster block says where)
        if not args.profile:
            raise UsageError("--attach: name the launch profile with the deployment's selectors (--profile FILE)")
        args.profile_sets = [*args.profile_sets, "cluster.mode=attach"]
    profiles = choose_profiles(scenarios, args.profile, args.profile_sets)
    if args.target:
        known = {t for s in scenarios for t in targets_of(s, args.target)}
        unknown = [t for t in args.target if t not in known]
        if unknown:
            raise UsageError(f"--target {unknown[0]!r}: no selected scenario has it; targets: {', '.join(sorted(known))}")
    benched = list(dict.fromkeys(s.family.name for s in scenarios if s.family.bench_module))
    if args.bench and args.bench < 100:
        raise UsageError("--bench: at least 100 ops per target")
    if args.bench and not benched:
        raise UsageError("--bench: none of the selected scenarios' families has a benchmark")
    if args.bench and (args.profile or args.profile_sets):
        raise UsageError("--bench: the benchmarks run on each family's default launch profile only; leave out "
                         "--bench or --profile/--set")
    plan, left_out = split_plan([(s, t) for s, t in plan_for_reuse(scenarios, args.target or ())
                                 if not args.target or t in args.target],
                                profiles)
    for sc, target, why in left_out:
        print(f"not run: {sc.name} [{target}]: {why}", flush=True)
    if not plan:
        raise UsageError("nothing to run: every selected scenario/target is left out (see above)")
    if not args.dry_run:
        need = missing_setup(plan, profiles)
        if need:  # before anything starts: one command installs what is missing
            raise UsageError("a node stack these scenarios need is not installed; nothing was started:\n"
                             + "\n".join(need))
    if args.dry_run:
        return dry_run(scenarios, plan, profiles=profiles)
    sweep_leftovers(sys.stderr)  # what a run killed outright left here (its namespaces)
    run_dir = new_run_dir(args.runs_dir)
    if left_out:
        import json

        (run_dir / "not_run.json").write_text(json.dumps(
            [{"scenario": sc.name, "target": t, "why": why} for sc, t, why in left_out], indent=1) + "\n")
    for i, fam in enumerate(benched if args.bench else []):
        # one samples file per family: the first is bench_samples.json, the others bench_samples-<family>.json;
        # the reports show each (reports/load.py: Run.bench_views)
        run_bench(run_dir, args.bench, fam, run_dir / ("bench_samples.json" if i == 0 else f"bench_samples-{fam}.json"))
    # SIGINT, SIGTERM and SIGHUP from here to the end: a clean stop (harness/interrupts.py), also
    # while Toxiproxy, the node pool and the reports start or stop
    with Interrupts() as intr:
        return _run_plan(args, plan, profiles, run_dir, intr)


def _run_plan(args: argparse.Namespace, plan: list, profiles: dict, run_dir: Path, intr: Interrupts) -> int:
    started_wall = datetime.now(timezone.utc).isoformat()
    t_start = time.monotonic()
    n_items = len(plan)
    progress = Progress(n_items, plain=args.plain or not sys.stdout.isatty())
    results: list = []
    with ExitStack() as stack:
        toxiproxy = start_toxiproxy(list(dict.fromkeys(sc for sc, _ in plan)), stack, run_dir)
        pool = stack.enter_context(NodePool(run_dir))  # warm nodes between scenarios; stopped at the end
        runner = Runner(run_dir, targets=args.target, on_result=progress.result, toxiproxy=toxiproxy,
                        services={"node_pool": pool}, profiles=profiles)
        runner.on_start = progress.start
        intr.on(runner.interrupt)  # at once when a signal came while Toxiproxy started
        with progress:
            results = runner.run_plan(plan, choose=WarmOrder.for_plan(plan, profiles, pool).choose)
    elapsed = time.monotonic() - t_start
    write_summary(run_dir, results, started_wall, elapsed)
    if not args.no_report:
        try:
            import reports

            reports.generate(run_dir)
        except Exception as exc:  # noqa: BLE001 - the verdicts stand without the pictures
            print(f"warning: reports not generated: {type(exc).__name__}: {exc}", file=sys.stderr)
    interrupted = intr.signum is not None or runner.interrupted
    progress.final(results, run_dir, elapsed)
    if args.quick and not args.no_report:
        for png in sorted((run_dir / "plots").glob("*--before-after*.png")):
            print(f"before/after: {png}", flush=True)
        if (run_dir / "summary.md").is_file():
            print(f"summary: {run_dir / 'summary.md'}", flush=True)
    if interrupted:
        print(f"interrupted ({intr.name or 'SIGINT'}): every process of the run was stopped; run folder {run_dir}",
              file=sys.stderr)
        return intr.exit_code or 128 + signal.SIGINT
    code, why = run_status((r.outcome for r in results), strict=args.strict)
    print(why, flush=True)
    return code
