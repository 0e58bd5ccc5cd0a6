"""The layerwise family's definition (see the package docstring)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from harness.family import Family

from .nodes import NODE_KINDS
from .spec import LayerwiseTopologySpec, LayerwiseWorkloadSpec, decode_roles

PKG = __name__.rsplit(".", 1)[0]


class LayerwiseFamily(Family):
    name = "layerwise"
    description = ("vllm-ascend's layerwise (decoder-first) P/D connector, real code on CPU: D's listener, P's "
                   "per-layer sender, D's metaserver POST")
    targets = ("upstream", "hardened", "patched")
    default_targets = ("upstream", "hardened")
    # patched: vllm-ascend's own connector with the upstream diffs (connector_patch/upstream/vllm-ascend/)
    # applied to a copy of the conformance env's package, no plugin; it claims what hardened claims
    derived_targets = {"patched": "hardened"}
    baseline_target = "upstream"
    # what a generic fault (a Toxiproxy toxic on the link P dials D through) may cause in this
    # family's workload (workload.py outcomes): a load that fails, or a request D refuses
    generic_explains = dict.fromkeys(("latency", "bandwidth", "slow_close", "timeout", "reset_peer", "slicer",
                                      "limit_data", "down", "kill", "stop", "restart", "node_down"),
                                     ("failed_load", "refused"))
    Topology = LayerwiseTopologySpec
    Workload = LayerwiseWorkloadSpec
    fault_modules = (f"{PKG}.faults",)
    check_modules = (f"{PKG}.checks",)
    primary_ops = ("transfer",)
    failed_words = ("failed", "failed (finished with an error)")
    client_tally = True  # its workload counts its ops per outcome in its final probe (harness_integrity)
    node_kinds = NODE_KINDS

    def requirements(self, scenario: Any) -> set[str]:
        return {"toxiproxy"} if scenario.topology.link == "toxiproxy" else set()

    def unmet(self, scenario: Any, needs: set[str]) -> str | None:
        if "toxiproxy" in needs and scenario.topology.link != "toxiproxy":
            return "a toxic fault needs topology.link: toxiproxy"
        if needs - {"toxiproxy"}:
            return f"the layerwise topology has no {', '.join(sorted(needs - {'toxiproxy'}))} link"
        return None

    def unavailable(self, scenario: Any, profile: Any = None) -> str | None:  # noqa: ARG002
        from stacks.ascend_cpu.steps import ascend_unavailable

        return ascend_unavailable()

    def upstream_projects(self) -> list[Any]:
        from .upstream import vllm_ascend_main_project, vllm_ascend_project

        # the pinned main commit's series first, the release's last (a lookup of the project by name alone,
        # as `pdchaos upstream pr` makes, keeps the last: the release)
        return [vllm_ascend_main_project(), vllm_ascend_project()]

    def setup_steps(self) -> list[Any]:
        from stacks.ascend_cpu import setup_steps as ascend_steps

        from .upstream import MainTestsStep, upstream_tests_step

        return ascend_steps() + [upstream_tests_step(), MainTestsStep()]

    def reuse_group(self, scenario: Any) -> Any:
        t = scenario.topology  # the settings of LayerwiseTopology.pool_key, but ports
        return (t.policy, t.prefill_batch, float(t.recv_timeout), float(t.meta_timeout), float(t.post_timeout),
                float(t.signal_timeout), float(t.write_grace))

    def roles(self, scenario: Any, profile: Any = None) -> list[str]:  # noqa: ARG002
        decodes = decode_roles(scenario.topology.decodes)
        return decodes[:1] + ["prefill", "metaserver"] + decodes[1:]

    def not_applicable(self, scenario: Any, target: str) -> dict[str, str]:  # noqa: ARG002
        out = {"no_leaks": "vLLM's own threads grow on demand here (the scheduler's POST executor, up to 32; "
                           "a socket per metadata query upstream): thread and fd counts measure no leak"}
        if not any(f.type == "listener_garbage" for f in scenario.faults):
            out["listener_answers"] = "no listener_garbage fault is scheduled"
        if not any(getattr(f, "decode", "all") not in (None, "all") for f in scenario.faults):
            out["failed_where_faulted"] = "no fault is aimed at one D (transfer_error with decode)"
        return out

    def topology(self, scenario: Any, target: str, run_dir: Path, record: Callable[[dict], None],
                 services: dict[str, Any], profile: Any = None):
        from .topology import LayerwiseTopology

        return LayerwiseTopology(scenario, target, run_dir, record, services, profile)

    # ------------------------------------------------------------------ launch profile (profile.py)
    def profile_names(self) -> list[str]:
        from .profile import builtin_profiles

        return builtin_profiles()

    def load_profile(self, spec: str | None, sets: list[str]) -> Any:
        from .profile import load_profile

        return load_profile(spec, sets)


FAMILY = LayerwiseFamily()
