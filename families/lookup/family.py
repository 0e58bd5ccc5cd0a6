"""The lookup family's definition (see the package docstring)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from harness.family import Family

from .nodes import NODE_KINDS
from .spec import LookupTopologySpec, LookupWorkloadSpec

PKG = __name__.rsplit(".", 1)[0]


class LookupFamily(Family):
    name = "lookup"
    description = "AscendStore lookup RPC: scheduler -> worker rank 0 over ZMQ REQ/REP"
    targets = ("hardened", "legacy", "upstream")
    # ``upstream`` runs vllm-ascend's real code and needs the conformance env: named by a scenario
    default_targets = ("hardened", "legacy")
    baseline_target = "legacy"
    Topology = LookupTopologySpec
    Workload = LookupWorkloadSpec
    fault_modules = (f"{PKG}.fault_server", f"{PKG}.fault_peers", f"{PKG}.fault_backend", f"{PKG}.fault_requests",
                     f"{PKG}.fault_close")
    check_modules = (f"{PKG}.checks",)
    primary_ops = ("lookup",)
    client_tally = True  # its workload counts its ops per outcome in its final probe (harness_integrity)
    node_kinds = NODE_KINDS
    bench_module = f"{PKG}.bench"
    fuzz_module = f"{PKG}.fuzz"
    commands = {"lookup": (f"{PKG}.cli_lookup", "send one lookup and print the result as JSON")}
    # a block hash is 64 hex digits; any 32+ hex-digit run in a log is treated as one
    log_pattern = r"[0-9a-fA-F]{32,}"

    def validate(self, scenario: Any) -> None:
        if scenario.workload.reset_at is not None and {"legacy", "upstream"} & set(scenario.targets):
            raise ValueError("workload.reset_at: today's protocol (legacy, upstream) has no reset; "
                             "use targets: [hardened]")
        if "upstream" in scenario.targets and scenario.topology.transport != "ipc":
            raise ValueError("targets: upstream (vllm-ascend's lookup RPC) is ipc only: needs topology.transport: ipc")
        from .topology import runs_ascend

        if any(f.type == "server_close" for f in scenario.faults) and not all(
                runs_ascend(scenario.topology, t) for t in scenario.targets):
            raise ValueError("faults: server_close acts on vllm-ascend's real servers: needs targets that run it "
                             "(upstream; hardened with topology.stack: vllm-ascend)")
        if scenario.topology.stack == "vllm-ascend" and "legacy" in scenario.targets:
            raise ValueError("targets: legacy is the standalone model of today's code; with topology.stack: "
                             "vllm-ascend use upstream (the real code)")
        from .wire import NAMED_REWRITES

        for i, f in enumerate(scenario.faults):
            named = getattr(getattr(f, "rewrite", None), "named", None)
            if named is not None and named not in NAMED_REWRITES:
                raise ValueError(f"faults[{i}].rewrite.named: unknown rewrite {named!r}; known: "
                                 f"{', '.join(sorted(NAMED_REWRITES))}")

    def requirements(self, scenario: Any) -> set[str]:
        link = scenario.topology.link
        return {"toxiproxy"} if link == "toxiproxy" else {"netns", "root"} if link == "netns" else set()

    def unmet(self, scenario: Any, needs: set[str]) -> str | None:
        link = scenario.topology.link
        if "interposer" in needs and link != "interposer":
            return "a fault needs topology.link: interposer"
        if "toxiproxy" in needs and link != "toxiproxy":
            return "a toxic fault needs topology.link: toxiproxy"
        if "netns" in needs and link != "netns":
            return "a partition fault needs topology.link: netns"
        return None

    def unavailable(self, scenario: Any, profile: Any = None) -> str | None:  # noqa: ARG002
        from .topology import runs_ascend

        if any(runs_ascend(scenario.topology, t) for t in scenario.targets):
            from stacks.ascend_cpu.steps import ascend_unavailable

            return ascend_unavailable()
        return None

    def setup_steps(self) -> list[Any]:
        from stacks.ascend_cpu import setup_steps as ascend_steps

        return ascend_steps()

    def roles(self, scenario: Any, profile: Any = None) -> list[str]:  # noqa: ARG002
        return ["server"] + (["interposer"] if scenario.topology.link == "interposer" else [])

    def not_applicable(self, scenario: Any, target: str) -> dict[str, str]:
        out: dict[str, str] = {}
        if not any(f.type == "server_close" for f in scenario.faults):
            out["clean_close"] = "no server_close fault is scheduled"
        if target not in ("legacy", "upstream"):
            return out
        who = "the legacy model" if target == "legacy" else "vllm-ascend's code"
        why = f"{who} keeps no counters"
        out["metrics_match"] = f"{who}: its client keeps no failure counters"
        if not any(f.type == "malformed_requests" for f in scenario.faults):
            out["exactly_one_reply"] = f"{why}, and no malformed_requests fault counts replies itself"
        return out

    def topology(self, scenario: Any, target: str, run_dir: Path, record: Callable[[dict], None],
                 services: dict[str, Any], profile: Any = None):
        from .topology import LookupTopology

        return LookupTopology(scenario, target, run_dir, record, services)

    def log_secrets(self, run_dir: Path) -> list[str]:
        p = run_dir / "preload.txt"
        return p.read_text().split() if p.exists() else []


FAMILY = LookupFamily()
