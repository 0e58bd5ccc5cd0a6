"""The pd family's definition (see the package docstring)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from harness.family import Family

from .nodes import NODE_KINDS
from .profile import profile_for
from .spec import PDTopologySpec, PDWorkloadSpec

PKG = __name__.rsplit(".", 1)[0]


class PDFamily(Family):
    name = "pd"
    description = ("real vLLM prefill + decode on CPU, over TCP: vLLM's MooncakeConnector (upstream) or "
                   "connector_patch's HardenedMooncakeConnector (hardened), the project's P/D proxy")
    targets = ("upstream", "hardened", "patched")
    default_targets = ("upstream", "hardened")
    # patched: vLLM's own connector with the upstream diffs (connector_patch/upstream/vllm/) applied to a
    # copy of the node env's vLLM, no plugin; it claims what hardened claims (`--target patched`)
    derived_targets = {"patched": "hardened"}
    baseline_target = "upstream"
    Topology = PDTopologySpec
    Workload = PDWorkloadSpec
    fault_modules = (f"{PKG}.faults", f"{PKG}.fake_faults", f"{PKG}.side_faults", f"{PKG}.port_faults")
    check_modules = (f"{PKG}.checks",)
    primary_ops = ("complete",)
    op_kinds = ("complete", "reset")  # reset: the workload's prefix-cache resets (workload.resets)
    failed_words = ("failed fast", "failed fast (an HTTP error)")  # e.g. the load deadline's 502
    setup_default = True  # `pdchaos setup` installs its node stack: the README's main job runs it
    client_tally = True  # the workload counts its requests per outcome in its final probe (harness_integrity)
    node_kinds = NODE_KINDS
    bench_module = f"{PKG}.bench"
    explore_module = f"{PKG}.explore"
    # protocol phases the nodes journal (node_instruments/pdchaos_waf/phases.py; harness/phases.py):
    # a fault may be keyed on one (``upon: {phase: p_write_started, offset: 0ms}``)
    phases = {
        "p_pull_served": "P: a pull from D was taken off P's queue and is being served (send_kv_to_decode entered)",
        "p_pull_answered": "P: done with that pull, its last answer to D sent (send_kv_to_decode returned)",
        "p_write_started": "P: its transfer engine starts writing a pull's KV into D's blocks (_send_blocks)",
        "p_write_done": "P: that write returned, either way",
        "d_bootstrap_query_out": "D: its query to P's bootstrap server is out (an engine D does not know, or "
                                 "marked stale)",
        "d_pull_out": "D: a pull to one P worker is opened (receive_kv_from_single_worker)",
        "d_cancel_sent": "D: a cancel round to P is out (the hardened worker's _cancel_round)",
    }
    phase_targets = {"d_cancel_sent": ("hardened",)}  # upstream never cancels; patched's rounds are not wrapped
    # vLLM's gauges (kv_cache_usage_perc is a fraction: 1 = every block in use) and CPU per node
    gauges = (("num_requests_waiting", "waiting requests"),
              ("num_requests_running", "running requests"),
              ("kv_cache_usage_perc", "KV cache usage (1 = full)"),
              ("num_requests_kv_fetch_by_stage{stage=in_progress}", "KV fetches in progress"),
              ("rate(cpu_s)", "CPU (fraction of a core)"))

    # What a generic fault (faults/) may cause in this family's client, in its vocabulary
    # (workload.py: outcome http_<status>, connect, stalled; @error_phase where the proxy named
    # it): a node a fault stops, kills, freezes or cuts off makes the proxy answer 502 (refused,
    # bad answer) or 504 (its timeout), the client's connection fail, or, with a connector that
    # waits forever, the request stall; a reset of the KV pool whose store master a fault took
    # away is refused (``{"success": false}``: a truthful answer, not a failure of the server).
    # Mooncake's transfer engine pools up to 4 TCP connections per peer pair and opens new ones to a
    # restarted peer: a warm vLLM node's fds grow by up to 4 in a scenario that is healthy (measured
    # on P: +2 to +4 per scenario, also in pd-baseline); growth beyond that is still a leak
    # no_write_after_free is opt-in: only the CPU profile's decode nodes run its watcher
    check_defaults = {"no_leaks": {"slack": 4}, "no_write_after_free": {"enabled": False}}
    generic_explains = dict.fromkeys(
        ("kill", "stop", "restart", "node_down", "partition", "refuse", "bandwidth_limit", "latency", "bandwidth",
         "slow_close", "timeout", "reset_peer", "slicer", "limit_data", "down"),
        ("http_500", "http_502", "http_503", "http_504", "connect", "stalled", "reset_refused"))

    def requirements(self, scenario: Any) -> set[str]:
        link = scenario.topology.link
        return set() | ({"toxiproxy"} if link == "toxiproxy" else {"netns", "root"} if link == "netns" else set())

    def unavailable(self, scenario: Any, profile: Any = None) -> str | None:
        from stacks.vllm_cpu.steps import PdStackStep, TinyModelStep

        prof = profile_for(scenario, profile)
        if scenario.topology.kv_pool and prof.store is None:
            return (f"topology.kv_pool: this scenario needs a launch profile with a KV pool (a store master); "
                    f"profile {prof.name} has none: run it without --profile (cpu-store) or with one that has")
        from harness.runtime import runtime_of

        if not runtime_of(prof).runs_here:  # the nodes run elsewhere (pods): their image holds vLLM and the model
            return None
        steps = ([PdStackStep()] if prof.vllm == "node-env" else []) + ([TinyModelStep()] if not prof.model else [])
        for step in steps:
            if step.check() is None:
                from harness.setup import MissingSetup

                return MissingSetup(f"the P/D node stack is not installed ({step.name})", "pdchaos setup")
        vllm = vllm_beside_python() if prof.vllm == "path" else Path(prof.vllm) if prof.vllm != "node-env" else None
        if vllm is not None and not vllm.exists():
            return f"profile {prof.name}: no vllm command at {vllm}: install vLLM there"
        if prof.model and not (Path(prof.model) / "config.json").is_file():
            return f"profile {prof.name}: model folder {prof.model!r} holds no config.json"
        return None

    def excluded(self, scenario: Any, target: str, profile: Any = None) -> str | None:
        from faults.base import load_registry

        prof = profile_for(scenario, profile)
        t = scenario.topology
        from harness.runtime import runtime_of

        if prof.store is not None and not runtime_of(prof).runs_here:
            return (f"profile {prof.name}: a KV pool's store master is configured by a file on this machine "
                    "(mooncake.json, the master on loopback), which nodes elsewhere cannot read")
        mixes = target in ("hardened", "patched") and t.mixed != "none"
        why = prof.connectors[target].unavailable or (prof.connectors["upstream"].unavailable if mixes else None)
        if why:
            return f"profile {prof.name}, target {target}: {why}"
        series = prof.connectors[target].upstream_series
        if series:
            from connector_patch.upstream import read_series

            if not read_series(*series.split("/", 1)):
                return f"profile {prof.name}, target {target}: no upstream diffs in connector_patch/upstream/{series}/"
        keyed = [f.type for f in getattr(scenario, "faults", []) if getattr(f, "upon", None) is not None]
        if keyed and (prof.device != "cpu" or prof.store is not None or not runtime_of(prof).runs_here):
            # the phase journal (node_instruments/pdchaos_waf/phases.py) wraps vLLM's Mooncake worker on CPU,
            # in processes of this machine: elsewhere the keyed fault's phase would never come. A property of
            # the profile, not of what is installed: left out and listed before anything starts, not skipped
            return (f"faults keyed on a protocol phase ({', '.join(keyed)}): the phase journal runs only in "
                    f"Mooncake nodes on CPU on this machine; profile {prof.name} has none")
        conns = [prof.connectors[target]]
        if mixes:
            conns.append(prof.connectors["upstream"])
        protocols = {c.proxy for c in conns}
        if len(protocols) > 1:
            return (f"topology.mixed: under profile {prof.name} the two connectors speak "
                    f"{' and '.join(sorted(protocols))} to the proxy: they cannot be paired")
        proto = protocols.pop()
        if t.link == "toxiproxy" and proto != "bootstrap":
            return f"topology.link toxiproxy sits on P's bootstrap server; under profile {prof.name} the proxy speaks {proto}"
        registry = load_registry(self.name)
        for f in scenario.faults:
            allowed = getattr(registry.get(f.type), "proxy_protocols", None)
            if allowed is not None and proto not in allowed:
                return (f"fault {f.type} acts on the proxy's {'/'.join(allowed)} protocol; under profile "
                        f"{prof.name} target {target}'s proxy speaks {proto}")
        return None

    # ------------------------------------------------------------------ launch profiles (profile.py)
    def profile_names(self) -> list[str]:
        from .profile import builtin_profiles

        return builtin_profiles()

    def load_profile(self, spec: str | None, sets: list[str]) -> Any:
        from .profile import load_profile

        return load_profile(spec, sets)

    def not_applicable(self, scenario: Any, target: str) -> dict[str, str]:
        na = {} if scenario.faults else {"no_busy_wait": "no fault is scheduled: no node waits on a peer"}
        if not scenario.workload.resets:
            na["reset_truth"] = "the workload resets nothing"
        return na

    def reuse_group(self, scenario: Any) -> Any:
        t = scenario.topology  # the settings of PDTopology.pool_key, but ports
        return (t.link == "netns", t.model, t.kv_load_failure_policy, int(t.abort_timeout), int(t.startup_timeout),
                t.max_num_seqs, t.engine_id, int(t.kv_load_timeout * 1000), t.mixed)

    def roles(self, scenario: Any, profile: Any = None) -> list[str]:
        # a launch profile with a KV pool adds its store master (validation runs before a profile
        # is chosen: there, the default's roles)
        store = profile.store is not None if profile is not None else bool(scenario.topology.kv_pool)
        return (["store"] if store else []) + ["prefill:0", "decode:0", "proxy"]

    def validate(self, scenario: Any) -> None:
        if scenario.topology.mixed != "none" and "upstream" in scenario.targets:
            raise ValueError("topology.mixed: only the hardened target mixes connectors; use targets: [hardened]")

    def unmet(self, scenario: Any, needs: set[str]) -> str | None:
        link = scenario.topology.link
        if "toxiproxy" in needs and link != "toxiproxy":
            return "a toxic fault needs topology.link: toxiproxy"
        if "netns" in needs and link != "netns":
            return "a partition fault needs topology.link: netns"
        return None

    def topology(self, scenario: Any, target: str, run_dir: Path, record: Callable[[dict], None],
                 services: dict[str, Any], profile: Any = None):
        from .topology import PDTopology

        return PDTopology(scenario, target, run_dir, record, services, profile_for(scenario, profile))

    def log_secrets(self, run_dir: Path) -> list[str]:
        p = run_dir / "prompts.json"  # the workload's prompts and reference outputs: never in a log
        if not p.exists():
            return []
        data = json.loads(p.read_text())
        return [x for item in data for x in (item.get("prompt", ""), item.get("expected", "")) if len(x) >= 16]

    def saved_inputs(self, run_dir: Path) -> dict | None:
        """``{"prompts": [...]}``: the workload's prompts and reference outputs (prompts.json), the
        reference ``correct_output`` holds each op's ``expected`` to; ``None`` inside when the file
        is missing or unreadable (then nothing can be compared: the check fails)."""
        p = run_dir / "prompts.json"
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            return {"prompts": None}
        return {"prompts": data if isinstance(data, list) else None}

    def setup_steps(self) -> list[Any]:
        from harness.upstream import UpstreamTestsStep
        from stacks.vllm_cpu import setup_steps as pd_steps
        from stacks.vllm_cpu.steps import PdStackStep

        from .upstream import vllm_project

        return pd_steps() + [UpstreamTestsStep(vllm_project(),
                                               lambda: None if PdStackStep().check() else "pd-node-stack")]

    def upstream_projects(self) -> list[Any]:
        from .upstream import vllm_project

        return [vllm_project()]


def vllm_beside_python() -> Path:
    """The ``vllm`` command of the Python that runs the harness (profile ``vllm: path``)."""
    import sys

    return Path(sys.executable).parent / "vllm"


FAMILY = PDFamily()
