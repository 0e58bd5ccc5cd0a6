"""The lookup family's definition (see the package docstring)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from harness.family import Family

from .nodes import NODE_KINDS
from .spec import LookupTopologySpec, LookupWorkloadSpec

PKG = __name__.rsplit(".", 1)[0]


# faults that speak one channel's protocol (the others are protocol-blind: a process, a backend, silence)
STANDALONE_ONLY = {"malformed_requests": "malformed_store_requests", "malformed_reply": "legacy_peer or silent_peer"}
STORE_ONLY = {"malformed_store_requests", "stuck_puts"}


class LookupFamily(Family):
    name = "lookup"
    description = "AscendStore lookup RPC: scheduler -> worker rank 0 over ZMQ REQ/REP"
    targets = ("hardened", "legacy", "upstream", "patched")
    # ``upstream`` runs vllm-ascend's real code and needs the conformance env: named by a scenario
    default_targets = ("hardened", "legacy")
    # patched: upstream's own code with the upstream diffs applied to a copy of the node env's package,
    # no plugin; it claims what hardened claims (`--target patched`): vLLM's store connector
    # (connector_patch/upstream/vllm/, topology.stack: vllm-store) or vllm-ascend's AscendStore lookup
    # RPC (connector_patch/upstream/vllm-ascend/, topology.stack: vllm-ascend)
    derived_targets = {"patched": "hardened"}
    baseline_target = "legacy"
    failed_words = ("fail-open", "fail-open (returned 0)")  # the lookup failed; the scheduler computes
    Topology = LookupTopologySpec
    Workload = LookupWorkloadSpec
    fault_modules = (f"{PKG}.fault_server", f"{PKG}.fault_peers", f"{PKG}.fault_backend", f"{PKG}.fault_requests",
                     f"{PKG}.fault_close", f"{PKG}.fault_store")
    check_modules = (f"{PKG}.checks",)
    primary_ops = ("lookup",)
    op_kinds = ("lookup", "reset")  # reset: the admin reset (workload.reset_at)
    client_tally = True  # its workload counts its ops per outcome in its final probe (harness_integrity)
    node_kinds = NODE_KINDS
    bench_module = f"{PKG}.bench"
    fuzz_module = f"{PKG}.fuzz"
    commands = {"lookup": (f"{PKG}.cli_lookup", "send one lookup and print the result as JSON")}
    # a block hash is 64 hex digits; any 32+ hex-digit run in a log is treated as one
    log_pattern = r"[0-9a-fA-F]{32,}"

    def validate(self, scenario: Any) -> None:
        from .topology import runs_ascend, runs_store

        store = runs_store(scenario.topology)
        if scenario.workload.reset_at is not None and not store and {"legacy", "upstream"} & set(scenario.targets):
            raise ValueError("workload.reset_at: AscendStore's protocol today (legacy, upstream) has no reset; "
                             "use targets: [hardened] (or topology.stack: vllm-store, whose upstream has one)")
        if "upstream" in scenario.targets and scenario.topology.transport != "ipc":
            raise ValueError("targets: upstream (vllm-ascend's lookup RPC) is ipc only: needs topology.transport: ipc")
        if any(f.type == "server_close" for f in scenario.faults) and not all(
                store or runs_ascend(scenario.topology, t) for t in scenario.targets):
            raise ValueError("faults: server_close acts on real servers: needs targets that run them "
                             "(upstream; hardened with topology.stack: vllm-ascend or vllm-store)")
        if scenario.topology.stack != "standalone" and "legacy" in scenario.targets:
            raise ValueError(f"targets: legacy is the standalone model of today's code; with topology.stack: "
                             f"{scenario.topology.stack} use upstream (the real code)")
        if store:
            mix = scenario.workload.mix
            if mix.hbm or mix.multigroup:
                raise ValueError("workload.mix: vLLM's store channel has no hbm_hit_tokens and one key space: "
                                 "set hbm: 0 and multigroup: 0")
            for i, f in enumerate(scenario.faults):
                if f.type in STANDALONE_ONLY:
                    raise ValueError(f"faults[{i}] ({f.type}): speaks AscendStore's lookup protocol; with topology."
                                     f"stack: vllm-store use {STANDALONE_ONLY[f.type]}")
        elif any(f.type in STORE_ONLY for f in scenario.faults):
            raise ValueError(f"faults: {', '.join(sorted({f.type for f in scenario.faults} & STORE_ONLY))} act on "
                             f"vLLM's store channel: needs topology.stack: vllm-store")
        from .wire import NAMED_REWRITES

        for i, f in enumerate(scenario.faults):
            named = getattr(getattr(f, "rewrite", None), "named", None)
            if named is not None and named not in NAMED_REWRITES:
                raise ValueError(f"faults[{i}].rewrite.named: unknown rewrite {named!r}; known: "
                                 f"{', '.join(sorted(NAMED_REWRITES))}")

    def excluded(self, scenario: Any, target: str, profile: Any = None) -> str | None:  # noqa: ARG002
        stack = scenario.topology.stack
        if target == "patched" and stack == "standalone":
            return "patched is upstream's code with the diffs: the standalone stack runs no upstream code"
        return None

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
        from .topology import runs_ascend, runs_store

        if runs_store(scenario.topology):
            from stacks.vllm_cpu.steps import PdStackStep

            if PdStackStep().check() is None:
                from harness.setup import MissingSetup

                return MissingSetup("the P/D node env (vLLM 0.32.0) is not installed (pd-node-stack)", "pdchaos setup")
            return None
        if any(runs_ascend(scenario.topology, t) for t in scenario.targets):
            from stacks.ascend_cpu.steps import ascend_unavailable

            return ascend_unavailable("lookup")
        return None

    def setup_steps(self) -> list[Any]:
        from stacks.ascend_cpu import setup_steps as ascend_steps
        from stacks.vllm_cpu.steps import PdStackStep

        return ascend_steps() + [PdStackStep()]

    def roles(self, scenario: Any, profile: Any = None) -> list[str]:  # noqa: ARG002
        return (["server"] + (["interposer"] if scenario.topology.link == "interposer" else [])
                + (["twin"] if scenario.topology.twin else []))

    def not_applicable(self, scenario: Any, target: str) -> dict[str, str]:
        out: dict[str, str] = {}
        if not any(f.type == "server_close" for f in scenario.faults):
            out["clean_close"] = "no server_close fault is scheduled"
        if scenario.workload.reset_at is None:
            out["reset_done"] = "the workload resets nothing (workload.reset_at)"
        if target not in ("legacy", "upstream"):
            return out
        who = ("the legacy model" if target == "legacy" else "vLLM's store code" if scenario.topology.stack == "vllm-store"
               else "vllm-ascend's code")
        why = f"{who} keeps no counters"
        out["metrics_match"] = f"{who}: its client keeps no failure counters"
        if not any(f.type in ("malformed_requests", "malformed_store_requests") for f in scenario.faults):
            out["exactly_one_reply"] = f"{why}, and no malformed_requests fault counts replies itself"
        return out

    def topology(self, scenario: Any, target: str, run_dir: Path, record: Callable[[dict], None],
                 services: dict[str, Any], profile: Any = None):
        from .topology import LookupTopology

        return LookupTopology(scenario, target, run_dir, record, services)

    def log_secrets(self, run_dir: Path) -> list[str]:
        return [k for name in ("preload.txt", "twin-preload.txt") if (run_dir / name).exists()
                for k in (run_dir / name).read_text().split()]


FAMILY = LookupFamily()
