"""``pdchaos repro SCENARIO [--target T] [--out DIR]``: run one scenario for real against one target
(default ``upstream``; a scenario without that target: its family's baseline, the "before") through
the normal runner, and write a self-contained report folder: README.md with the environment (the
node env's vLLM, vllm-ascend, Mooncake and torch versions, CPU, cores, memory, OS), the launch
command of every node as the harness started it, the steps (the family's requests and faults as
commands a user could run without pd-chaos where one exists, the scenario YAML and the one pdchaos
command), the claim vs what this target did (the checks' measured numbers), the incident
timeline, the plots and a journal excerpt (reports/repro.py says what it may hold); no path of this
machine (relative to the checkout, ``~``, ``$TMPDIR``). Beside it, ``standalone/`` where the
family writes one (its ``repro`` module's ``write_standalone``): the defect reproduced with the
upstream package alone, no pd-chaos (families/pd/standalone.py).

Exit 0: the folder is written and the run ended as its scenario expects; 1: written, but the run
deviated from the expectation (the README says how); 2: bad input (an unknown scenario or target,
a node stack missing: nothing started) or a harness error (the run could not be carried out or
judged: no README is written, the run folder is kept and named); 130: interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import HarnessError, UsageError

ROOT = Path(__file__).resolve().parents[2]
# the distributions whose versions the README names, as found in a node env (prefix match)
WANTED = ("vllm", "vllm-ascend", "mooncake", "torch")
_DIST = re.compile(r"^(vllm([-_](cpu|ascend))?|torch|mooncake[-_a-z0-9.]*)$", re.IGNORECASE)
VERSIONS_PY = ("import importlib.metadata as m, json, re\n"
               "r = re.compile(r'" + _DIST.pattern + "', re.I)\n"
               "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions() "
               "if d.metadata['Name'] and r.match(d.metadata['Name'])}))")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", metavar="SCENARIO",
                   help="a scenario file, or a scenario's name (looked for under scenarios/)")
    p.add_argument("--target", default=None, metavar="TARGET",
                   help="the target to run (default: upstream; a scenario without it: its family's baseline)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="the report folder to write (must not exist or be empty; default: "
                        "repro/<scenario>--<target>--<time>)")


# ------------------------------------------------------------------ input

def find_scenario(arg: str) -> Path:
    """A scenario file: ``arg`` itself, else the one file under scenarios/ (of this checkout, then
    of the current folder) whose ``name:`` is ``arg``. UsageError when there is none."""
    p = Path(arg)
    if p.is_file():
        return p
    if p.is_dir():
        raise UsageError(f"{arg}: a folder; pdchaos repro runs one scenario: name its file or its name")
    pat = re.compile(rf"^name:\s*['\"]?{re.escape(arg)}['\"]?\s*(#.*)?$", re.MULTILINE)
    hits: list[Path] = []
    for root in dict.fromkeys([ROOT / "scenarios", Path.cwd() / "scenarios"]):
        if root.is_dir():
            hits += [f for f in sorted(root.rglob("*.y*ml")) if pat.search(f.read_text(errors="replace"))]
    hits = list(dict.fromkeys(h.resolve() for h in hits))
    if not hits:
        raise UsageError(f"unknown scenario {arg!r}: no such file, and no scenario under scenarios/ has that name "
                         "(`pdchaos list scenarios/` lists them)")
    if len(hits) > 1:
        raise UsageError(f"scenario {arg!r}: {len(hits)} files have that name: {', '.join(map(str, hits[:3]))}")
    return hits[0]


def choose_target(sc: Any, asked: str | None) -> str:
    targets = list(sc.model.targets)
    if asked is not None:
        if asked not in targets:
            raise UsageError(f"--target {asked!r}: unknown for scenario {sc.name}; its targets: {', '.join(targets)}")
        return asked
    if "upstream" in targets:
        return "upstream"
    base = sc.family.baseline_target
    if base in targets:
        return base
    raise UsageError(f"scenario {sc.name} has no upstream target and its family no baseline among "
                     f"{', '.join(targets)}: name one with --target")


def out_dir(asked: str | None, scenario: str, target: str) -> Path:
    if asked is None:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        out = Path("repro") / f"{scenario}--{target}--{stamp}"
    else:
        out = Path(asked)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out}: exists and is not an empty folder (a repro never overwrites one)")
    return out


# ------------------------------------------------------------------ the environment

def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def hardware() -> dict[str, str]:
    cpu = next((ln.split(":", 1)[1].strip() for ln in _read("/proc/cpuinfo").splitlines()
                if ln.lower().startswith("model name")), "") or platform.processor() or platform.machine()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        usable = os.cpu_count() or 0
    mem = next((ln.split(":", 1)[1].strip() for ln in _read("/proc/meminfo").splitlines()
                if ln.startswith("MemTotal")), "")
    if mem.endswith(" kB") and mem[:-3].strip().isdigit():
        mem = f"{int(mem[:-3]) / 1024 / 1024:.1f} GiB"
    osr = dict(re.findall(r'^(\w+)="?([^"\n]*)"?$', _read("/etc/os-release"), re.MULTILINE))
    return {"cpu": f"{cpu} ({platform.machine()})", "cores": f"{os.cpu_count()} ({usable} usable by this process)",
            "memory": mem, "os": osr.get("PRETTY_NAME") or platform.system(), "kernel": platform.release(),
            "python": f"{platform.python_version()} ({sys.executable})"}


def checkout() -> str:
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return str(ROOT)
    if head.returncode != 0:
        return str(ROOT)
    return f"{head.stdout.strip()}{' (with local changes)' if dirty.stdout.strip() else ''} at {ROOT}"


def versions(python: Path) -> dict[str, str]:
    try:
        proc = subprocess.run([str(python), "-c", VERSIONS_PY], capture_output=True, text=True, timeout=120)
        return json.loads(proc.stdout) if proc.returncode == 0 else {}
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}


def node_envs(family: Any, run_dir: Path) -> list[dict]:
    """The family's node envs (its setup steps' venvs) that are installed, with the versions in
    each, and whether this run used it (its path is in one of the run's logs); the harness's own
    interpreter too when it holds any of the distributions (a profile may run vLLM from it)."""
    logs = [p for p in run_dir.rglob("*.log") if p.is_file()]
    text = "\n".join(p.read_text(errors="replace")[:2_000_000] for p in logs)
    out = []
    for step in family.setup_steps():
        env_of = getattr(step, "env", None)
        if not callable(env_of):
            continue
        env = env_of()
        path, py = Path(getattr(env, "path", "")), Path(getattr(env, "python", ""))
        if not py.is_file():
            continue
        out.append({"path": str(path), "versions": versions(py), "used": str(path) in text})
    own = versions(Path(sys.executable))
    if own:
        out.append({"path": sys.prefix, "versions": own, "used": False})
    return out


# ------------------------------------------------------------------ run

def run_one(sc: Any, target: str, runs: Path, profiles: dict) -> tuple[Path, Any, bool]:
    """Run (sc, target) as ``pdchaos run`` does (the same runner, node pool, Toxiproxy and
    reports); (run folder, its Result, interrupted)."""
    from ..outputs import write_summary
    from ..pool import NodePool
    from ..runner import Runner, new_run_dir
    from ..services import start_toxiproxy

    runs.mkdir(parents=True, exist_ok=True)
    run_dir = new_run_dir(runs)
    started_wall = datetime.now(timezone.utc).isoformat()
    t_start = time.monotonic()
    with ExitStack() as stack:
        toxiproxy = start_toxiproxy([sc], stack, run_dir)
        pool = stack.enter_context(NodePool(run_dir))
        runner = Runner(run_dir, targets=[target], toxiproxy=toxiproxy, services={"node_pool": pool},
                        profiles=profiles)
        runner.on_start = lambda s, t: print(f"running {s} [{t}] ...", flush=True)

        def on_signal(signum, frame):  # noqa: ARG001
            runner.interrupt()

        old_int, old_term = signal.signal(signal.SIGINT, on_signal), signal.signal(signal.SIGTERM, on_signal)
        try:
            results = runner.run_plan([(sc, target)])
        finally:
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, old_term)
    write_summary(run_dir, results, started_wall, time.monotonic() - t_start)
    if not results:
        raise HarnessError(f"the run produced no result (run folder {run_dir})")
    import reports

    reports.generate(run_dir)
    return run_dir, results[0], runner.interrupted


def run(args: argparse.Namespace) -> int:
    from ..plan import choose_profiles, missing_setup, split_plan
    from ..schema import load_all

    path = find_scenario(args.scenario)
    (sc,) = load_all([str(path)])
    target = choose_target(sc, args.target)
    profiles = choose_profiles([sc], None, [])
    plan, left_out = split_plan([(sc, target)], profiles)
    if left_out:
        raise UsageError(f"{sc.name} [{target}] cannot run here: {left_out[0][2]}")
    need = missing_setup(plan, profiles)
    if need:
        raise UsageError("a node stack this scenario needs is not installed; nothing was started:\n" + "\n".join(need))
    out = out_dir(args.out, sc.name, target)
    out.mkdir(parents=True, exist_ok=True)
    command = f"pdchaos repro {shlex.quote(str(path))} --target {target} --out {shlex.quote(str(out))}"
    print(f"repro of {sc.name} [{target}] into {out}", flush=True)
    run_dir, res, interrupted = run_one(sc, target, out / "runs", profiles)
    if interrupted:
        print(f"interrupted: every process of the run was stopped; run folder {run_dir}", file=sys.stderr)
        return 130
    if res.verdict in ("error", "skipped"):
        raise HarnessError(f"{sc.name} [{target}]: the run ended in a {'harness error' if res.verdict == 'error' else 'skip'}"
                           f": {res.reason or '?'}; no report written; the run folder: {run_dir}")
    from reports.repro import write_folder

    env = {**hardware(), "pdchaos": checkout(), "wanted": WANTED,
           "node_envs": node_envs(sc.family, run_dir)}  # the whole run folder: pooled nodes log there
    scenario_dir = run_dir / sc.name / target
    steps = sc.family.repro_steps(sc, target, scenario_dir)
    fault_steps = [s for f in sc.faults if (s := generic_fault_step(f)) is not None]
    readme = write_folder(out, run_dir, sc.name, target, command=command, scenario_file=path,
                          description=str(getattr(sc.model, "description", "") or ""), env=env, steps=steps,
                          fault_steps=fault_steps, scenario_expect={t: sc.model.expected(t) for t in sc.model.targets},
                          secrets=sc.family.log_secrets(scenario_dir))
    standalone = write_standalone(sc, out)
    if standalone:
        print(f"standalone reproduction (no pd-chaos needed): {standalone}", flush=True)
    print(f"{res.verdict} ({res.outcome.replace('_', ' ')}): {readme}", flush=True)
    return 0 if res.outcome == "as_expected" else 1


def write_standalone(sc: Any, out: Path) -> Path | None:
    """``out/standalone/``: the defect reproduced with the upstream package alone, written by the
    ``write_standalone(scenario, report_dir)`` of the ``repro`` module beside the family's module
    (families/pd/standalone.py), when it has one; its path, or None."""
    import importlib

    package = type(sc.family).__module__.rpartition(".")[0]
    try:
        mod = importlib.import_module(f"{package}.repro" if package else "repro")
    except ModuleNotFoundError:
        return None
    fn = getattr(mod, "write_standalone", None)
    return fn(sc, out) if callable(fn) else None


# ------------------------------------------------------------------ the generic faults as commands

GENERIC_COMMANDS = {
    "kill": ("the node {node} is killed, then started again with its command above",
             "kill -KILL <pid of {node}>"),
    "stop": ("the node {node} is frozen (its sockets stay bound), then thawed",
             "kill -STOP -<process group of {node}>; sleep {for_}; kill -CONT -<process group of {node}>"),
    "node_down": ("the node {node} is stopped cleanly, then started again with its command above",
                  "kill -TERM <pid of {node}>"),
    "restart": ("the node {node} is stopped and started again at once on the same endpoints",
                "kill -TERM <pid of {node}>; <its command above>"),
    "partition": ("packets between the two sides are dropped ({direction})",
                  "iptables -I INPUT -s <the other side's address> -j DROP   # iptables -D ... to heal"),
    "refuse": ("connections between the two sides are refused at once ({direction})",
               "iptables -I INPUT -p tcp -s <the other side's address> -j REJECT --reject-with tcp-reset"),
    "bandwidth_limit": ("the link is limited to {rate_kbit} kbit/s ({direction})",
                        "tc qdisc add dev <veth> root tbf rate {rate_kbit}kbit burst {burst} latency {queue_latency}"),
    "cpu_pressure": ("busy processes load the machine", "stress-ng --cpu {workers} --cpu-load {load}"),
    "down": ("the proxied link is cut (its listener closed)", "toxiproxy-cli toggle <proxy>"),
}
TOXICS = {"latency", "bandwidth", "timeout", "reset_peer", "slow_close", "slicer", "limit_data"}


def generic_fault_step(f: Any) -> tuple[str, str] | None:
    """A generic fault (faults/) as what it does and the command that does the same outside
    pd-chaos; None for a family's own fault (its ``repro_steps`` says it)."""
    params = f.model_dump(mode="json", exclude={"type", "at", "for_"})
    when = f"at {f.at:g} s for {f.for_:g} s"
    if f.type in TOXICS:
        attrs = " ".join(f"-a {k}={v}" for k, v in params.items() if k not in ("stream", "toxicity") and v is not None)
        stream = params.get("stream") or "downstream"
        return (f"fault {f.type} {when}: a Toxiproxy toxic on the link",
                f"toxiproxy-cli toxic add -t {f.type} --{stream} {attrs} <proxy>   # toxic remove to heal")
    spec = GENERIC_COMMANDS.get(f.type)
    if spec is None:
        return None
    fmt = {**{k: ("" if v is None else v) for k, v in params.items()}, "for_": f"{f.for_:g}"}
    try:
        what, cmd = spec[0].format(**fmt), spec[1].format(**fmt)
    except (KeyError, IndexError):
        what, cmd = spec
    return f"fault {f.type} {when}: {what}", cmd
