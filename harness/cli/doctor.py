"""``pdchaos doctor [--json] [--require NAME ...]``: what this machine has, and what each absence disables.

Checks: toxiproxy-server (path, version, pinned v2.12.0, whether it starts and answers on a free
loopback port), go, root, ip, network namespaces (one is created and deleted), iptables, tc, the
tbf and netem qdiscs. Informational: exit 0 whatever is missing, unless a ``--require``d check
fails (exit 1). An unknown ``--require`` name is bad input (exit 2).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
from typing import Any, Callable

from ..errors import UsageError

TOXIPROXY_OFF = "link: toxiproxy scenarios and the toxic faults (latency, bandwidth, slow_close, timeout, " \
                "reset_peer, slicer, limit_data, down) are skipped"
NETNS_OFF = "link: netns scenarios and the partition, refuse and bandwidth_limit faults are skipped"


def _check(name: str, ok: bool, detail: str, disables: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "ok": bool(ok), "detail": detail, "disables": "" if ok else disables, **extra}


def _toxiproxy() -> list[dict]:
    from faults.toxiproxy import ENV_BINARY, PINNED_VERSION, ToxiproxyError, ToxiproxyServer, binary_version, find_binary

    path = find_binary()
    if path is None:
        env = os.environ.get(ENV_BINARY)
        where = (f"${ENV_BINARY}={env} is not an executable" if env else
                 f"toxiproxy-server not found (PATH, ~/go/bin/server, ${ENV_BINARY})")
        return [
            _check("toxiproxy", False, f"{where}; install: bash .ci/install-toxiproxy.sh", TOXIPROXY_OFF,
                   path=None, version=None, pinned=False, answers=False),
            _check("toxiproxy-pinned", False, f"want v{PINNED_VERSION}", "results are not comparable with "
                   f"CI's pinned v{PINNED_VERSION}"),
        ]
    version = binary_version(path)
    try:
        with ToxiproxyServer(path, start_timeout=5.0) as srv:
            answers, how = True, f"answered on 127.0.0.1:{srv.port}"
    except ToxiproxyError as exc:
        answers, how = False, f"did not start: {exc}"
    pinned = version == PINNED_VERSION
    return [
        _check("toxiproxy", answers, f"{path} version {version or 'unknown'}; {how}", TOXIPROXY_OFF,
               path=path, version=version, pinned=pinned, answers=answers),
        _check("toxiproxy-pinned", pinned, f"version {version or 'unknown'}, pinned v{PINNED_VERSION}",
               f"results are not comparable with CI's pinned v{PINNED_VERSION}; "
               "reinstall: bash .ci/install-toxiproxy.sh"),
    ]


def _go() -> dict:
    path = shutil.which("go") or next((p for p in ("/usr/local/go/bin/go", os.path.expanduser("~/go/bin/go"))
                                       if os.access(p, os.X_OK)), None)
    version = None
    if path:
        try:
            version = subprocess.run([path, "version"], capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            version = None
    return _check("go", bool(path), version or "go not found", "building toxiproxy-server from source "
                  "(.ci/install-toxiproxy.sh prints the other ways: release binary, container image)", path=path)


def _tool(name: str, disables: str, version_args: list[str]) -> dict:
    path = shutil.which(name)
    if not path:
        return _check(name, False, f"{name} not found", disables, path=None)
    try:
        res = subprocess.run([path, *version_args], capture_output=True, text=True, timeout=10)
        detail = (res.stdout or res.stderr).strip().splitlines()[0] if (res.stdout or res.stderr).strip() else path
    except (OSError, subprocess.TimeoutExpired):
        detail = path
    return _check(name, True, detail, disables, path=path)


def collect() -> list[dict]:
    from faults import netns

    checks = _toxiproxy()
    checks.append(_go())
    root = netns.is_root()
    checks.append(_check("root", root, f"euid {os.geteuid()}", NETNS_OFF))
    checks.append(_tool("ip", NETNS_OFF, ["-V"]))
    if root and shutil.which("ip"):
        ok, why = netns.netns_supported()
    else:
        ok, why = False, "needs root and ip"
    checks.append(_check("netns", ok, why, NETNS_OFF))
    checks.append(_tool("iptables", "the partition and refuse faults (install: apt-get install iptables, "
                        "as root)", ["--version"]))
    checks.append(_tool("tc", "the bandwidth_limit fault", ["-V"]))
    for kind, off in (("tbf", "the bandwidth_limit fault"),
                      ("netem", "nothing yet: no fault uses netem (bandwidth_limit uses tbf; delays go through Toxiproxy)")):
        if root and shutil.which("tc") and shutil.which("ip"):
            ok, why = netns.qdisc_available(kind)
        else:
            ok, why = False, "needs root, ip and tc"
        checks.append(_check(kind, ok, why, off))
    checks.append(_leftovers())
    checks.extend(_family_steps())
    return checks


def _leftovers() -> dict:
    """What a run killed outright left on this machine (network namespaces with their iptables
    rules, ipc folders): removed when their owner is gone (one line), named when unknown."""
    from ..runtime import load_runtime

    try:
        removed, left = load_runtime().clean()
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback
        return _check("leftovers", False, f"could not look: {type(exc).__name__}: {exc}",
                      "nothing; a killed run's namespaces stay until removed")
    detail = "; ".join(["removed " + line for line in removed] + left) or "nothing left by a killed run"
    return _check("leftovers", not left, detail, "nothing; they keep their addresses, veths and iptables rules "
                  "until removed")


def _family_steps() -> list[dict]:
    """Each family's own set-up pieces (``setup_steps()``; a step with ``pieces()`` is shown piece
    by piece), and what their absence disables: that family's scenarios."""
    from ..family import all_families

    out = []
    for fam in all_families():
        try:
            steps = fam.setup_steps()
        except Exception as exc:  # noqa: BLE001 - a broken family must not break the doctor
            out.append(_check(f"{fam.name}-setup", False, f"{type(exc).__name__}: {exc}", f"the {fam.name} family"))
            continue
        off = f"the {fam.name} family's scenarios and tests (run `pdchaos setup`)"
        for step in steps:
            if hasattr(step, "pieces"):
                out.extend(_check(n, ok, d, off) for n, ok, d in step.pieces())
            else:
                detail = step.check()
                out.append(_check(step.name, detail is not None, detail or f"not installed: {step.plan()}", off))
    return out


CHECK_NAMES = ("toxiproxy", "toxiproxy-pinned", "go", "root", "ip", "netns", "iptables", "tc", "tbf", "netem",
               "leftovers")


def profile_runtimes(spec: str) -> list[tuple[Any, Any]]:
    """(runtime, profile) of each family that has the launch profile ``spec`` (a built-in name or
    a .yaml file); a usage error when none has it."""
    from ..family import all_families
    from ..runtime import runtime_of

    out, known = [], []
    for fam in all_families():
        names = fam.profile_names()
        known += names
        if names and (spec in names or spec.endswith((".yaml", ".yml"))):
            profile = fam.load_profile(spec, [])
            out.append((runtime_of(profile), profile))
    if not out:
        raise UsageError(f"--profile {spec!r}: no family has this launch profile (profiles: "
                         f"{', '.join(sorted(set(known))) or 'none'})")
    return out


def runtime_checks(spec: str) -> list[dict]:
    """The checks of the runtime the profile names (``pdchaos doctor --profile k8s``: the cluster,
    its CRDs, the RBAC verbs the harness needs, Chaos Mesh's controller), one line each."""
    out: list[dict] = []
    seen = set()
    for rt, profile in profile_runtimes(spec):
        if rt.name in seen:
            continue
        seen.add(rt.name)
        for name, ok, detail, disables in rt.doctor(profile):
            out.append(_check(name, ok, detail, disables))
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.add_argument("--profile", default=None, metavar="NAME|FILE",
                   help="also check what this launch profile's runtime needs (a cluster profile: the API server, CRDs, "
                        "RBAC verbs, Chaos Mesh's controller)")
    p.add_argument("--require", action="append", default=[], metavar="NAME",
                   help=f"exit 1 unless this check passes (repeatable): {', '.join(CHECK_NAMES)}")


def _print_table(checks: list[dict], out: Callable[[str], None] = print) -> None:
    width = max(len(c["name"]) for c in checks)
    for c in checks:
        out(f"{'ok ' if c['ok'] else 'NO '} {c['name']:<{width}}  {c['detail']}")
        if not c["ok"]:
            out(f"    {'':<{width}}  disables: {c['disables']}")


def run(args: argparse.Namespace) -> int:
    checks = collect() + (runtime_checks(args.profile) if args.profile else [])
    names = list(CHECK_NAMES) + [c["name"] for c in checks if c["name"] not in CHECK_NAMES]
    unknown = [r for r in args.require if r not in names]
    if unknown:
        raise UsageError(f"--require: unknown check {unknown[0]!r}; known: {', '.join(names)}")
    failed = [c["name"] for c in checks if c["name"] in args.require and not c["ok"]]
    if args.json:
        print(json.dumps({"checks": checks, "required": list(args.require), "required_failed": failed}, indent=2))
    else:
        _print_table(checks)
        if failed:
            print(f"required but missing: {', '.join(failed)}")
    return 1 if failed else 0
