"""The pd family's topology: a prefill node, a decode node and the P/D proxy, on loopback.

Roles: ``prefill:0`` and ``decode:0`` (``vllm`` nodes: a real vLLM server each, from the node
env, pinned to cores 0 and 1), ``proxy`` (``pd-proxy``); the workload (``pd-workload``) sends its
completions through the proxy. P and D start in parallel (each takes 20 s to minutes on 2 cores);
a node that a fault killed is started again on the same ports. Under ``pdchaos run`` P and D are
**reused** between scenarios (harness/pool.py) when a scenario leaves them healthy and drained
and the next one starts them with the same settings; the journal says so (``node_reused``, with
where the server's log is). vLLM's own logs go to ``server-logs/<role>.log`` in the scenario's
folder, or, for a server that may be reused, ``pooled-logs/<role>-<n>.log`` in the run folder
(``server_log`` events name each one; ``log_hygiene`` reads them beside the harness's logs).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from harness.topology import BaseTopology, NodeSpec, free_tcp_port

from .vllm_node import is_hardened

CORES = {"prefill:0": 0, "decode:0": 1}
SIDES = {"prefill:0": "b", "decode:0": "a", "proxy": "a"}  # namespaces, with link: netns


def _busy(stats: dict | None, baseline: dict | None = None) -> bool:
    """Something running or waiting, or more KV blocks in use than at the node's baseline."""
    from .metrics import gauge as _gauge

    c = (stats or {}).get("counters") or {}
    if (_gauge(c, "num_requests_running") or 0) + (_gauge(c, "num_requests_waiting") or 0):
        return True
    base = _gauge((baseline or {}).get("counters") or {}, "kv_cache_usage_perc") or 0.0
    return (_gauge(c, "kv_cache_usage_perc") or 0.0) > base + 1e-6


def host_args(placement: Any, role: str, advertise: bool = True) -> list[str]:
    """``--host`` (and ``--advertise-host``) of a node its runtime puts on a host of its own (a
    pod: every address of it, and the pod's own announced to peers); none where it shares this
    machine (the node's loopback default)."""
    bind = placement.bind_address(role) if placement is not None else None
    if bind is None:
        return []
    announce = placement.advertise_address(role) if advertise else None
    return ["--host", bind] + (["--advertise-host", announce] if announce is not None else [])


class PDTopology(BaseTopology):
    workload_kind = "pd-workload"
    workload_ready_timeout_s = 300.0  # it computes the reference outputs (cached per machine) first
    sample_interval_s = 0.5  # node gauges over time: waiting, running, KV usage, CPU

    def __init__(self, scenario: Any, target: str, run_dir: Path, record: Callable[[dict], None],
                 services: dict[str, Any] | None = None, profile: Any = None):
        super().__init__(scenario, target, run_dir, record, services)
        self.topo = scenario.topology
        self.ports = {"prefill:0": free_tcp_port(), "decode:0": free_tcp_port(), "proxy": free_tcp_port()}
        self.bootstrap = {"prefill:0": free_tcp_port(), "decode:0": free_tcp_port()}
        self.kv_ports = {"prefill:0": free_tcp_port(), "decode:0": free_tcp_port()}  # profiles with kv_port
        self.bootstrap_hostport = f"{self.host('prefill:0')}:{self.bootstrap['prefill:0']}"  # set again at start()
        if profile is None:
            from .profile import profile_for

            profile = profile_for(scenario)
        self.profile = profile  # where and how vLLM starts (profile.py)
        self.store_ports = {"rpc": free_tcp_port(), "admin": free_tcp_port()}  # profiles with a store master
        self.fault_bound_s = self.topo.startup_timeout + 45.0  # a heal may restart a vLLM server
        self.server_logs = run_dir / "server-logs"
        self.server_logs.mkdir(parents=True, exist_ok=True)
        # vLLM servers that may serve later scenarios log in the run folder, not in this scenario's
        self._server_log: dict[str, str | None] = {}
        self.pooled_logs = self.pool.log_folder(self.server_logs) if self.pool is not None else self.server_logs
        self._existing: set[str] = set()  # roles whose node already runs (attach mode): find_existing()
        self._standins: list = []  # their stand-in control channels (attached.py)

    def host(self, role: str) -> str:
        """Where the node of ``role`` listens: loopback, or with ``link: netns`` P on the veth
        address of namespace b and D on that of namespace a (the proxy and the workload sit in a
        beside D, on a's loopback), so every byte between P and D, the transfer engine's
        included, crosses the veth that the partition faults cut."""
        placed = self.placement.host(role)
        if placed is not None:  # a node of another machine (a pod's Service)
            return placed
        if self.netns is None or role == "proxy":
            return "127.0.0.1"
        return self.netns.ip_b if role == "prefill:0" else self.netns.ip_a

    def connector(self, role: str) -> str:
        """Which connector the vLLM node of ``role`` runs: the target's, except the role that
        ``mixed`` keeps on vLLM's own (upstream)."""
        if self.target in ("hardened", "patched") and self.topo.mixed == f"upstream_{role.split(':')[0]}":
            return "upstream"
        return self.target

    def url(self, role: str) -> str:
        return f"http://{self.host(role)}:{self.ports[role]}"

    def connector_profile(self, role: str):
        """The launch profile's connector for the node of ``role`` (families/pd/profile.py)."""
        return self.profile.connectors[self.connector(role)]

    def proxy_protocol(self) -> str:
        """How the proxy pairs P and D: both connectors must speak the same protocol."""
        from harness.errors import HarnessError

        p, d = self.connector_profile("prefill:0"), self.connector_profile("decode:0")
        if p.proxy != d.proxy:
            raise HarnessError(f"profile {self.profile.name}: P's {p.name} speaks {p.proxy} and D's {d.name} "
                               f"{d.proxy} to the proxy: they cannot be paired (topology.mixed)")
        return p.proxy

    def find_existing(self) -> None:
        """The nodes that already run (attach mode: the user's P, D and router), on the ports they
        serve; a stand-in control channel (attached.py) for each vLLM server among them."""
        from .attached import AttachedControl

        for role in (*CORES, "proxy"):
            ports = self.placement.existing(role)
            if ports is None or role in self._existing:
                continue
            self._existing.add(role)
            self.ports[role] = ports["http"]
            if role in CORES and "bootstrap" in ports:
                self.bootstrap[role] = ports["bootstrap"]
            if role in CORES:
                conn = self.connector_profile(role)
                ctl = AttachedControl(self.control_endpoint(role), role,
                                      lambda r=role: self.placement.reach(r, self.url(r)),
                                      lambda r=role: getattr(self.nodes.get(r), "handle", None),
                                      conn.name, conn.extra_config).start()
                self._standins.append(ctl)
            self.event("node_existing", role=role, ports=dict(ports))

    def warm_up_existing(self) -> None:
        """The started nodes' warm-up, for each existing vLLM server (attached.py), before its
        baseline probe: the counts its floors and the leak checks start from."""
        from harness.errors import HarnessError

        for ctl in self._standins:
            why = ctl.warm_up(self.topo.startup_timeout)
            if why:
                raise HarnessError(f"attach: {why}")

    def close(self) -> None:
        try:
            super().close()
        finally:
            for ctl in self._standins:
                ctl.close()
            self._standins.clear()

    def node_spec(self, role: str) -> NodeSpec:
        t = self.topo
        if role in self._existing:  # started by nobody here: the runtime hands over the user's pod
            return NodeSpec("vllm" if role in CORES else "pd-proxy", [], side=SIDES[role], control=role in CORES,
                            ready_timeout_s=t.startup_timeout + 30.0,
                            endpoints={"http": self.url(role), **({"bootstrap": f"http://{self.host(role)}:"
                                                                   f"{self.bootstrap[role]}"} if role in CORES else {})})
        if role in CORES:
            kind = role.split(":")[0]
            prof, conn = self.profile, self.connector_profile(role)
            args = ["--role", kind, "--port", str(self.ports[role]), "--bootstrap-port", str(self.bootstrap[role]),
                    "--policy", t.kv_load_failure_policy, "--abort-timeout-s", str(max(1, int(t.abort_timeout))),
                    "--startup-timeout-s", str(int(t.startup_timeout)),
                    "--max-num-seqs", str(t.max_num_seqs), "--server-log", str(self.server_log_path(role))]
            if t.tensor_parallel_size > 1:
                args += ["--tensor-parallel-size", str(t.tensor_parallel_size)]
            if prof.device == "cpu":
                if t.tensor_parallel_size == 1 and self.placement.shared_host:  # two ranks bind to cores 0|1 (vllm_node.py)
                    args += ["--cpu-core", str(CORES[role])]
            else:
                args += ["--device", prof.device, "--visible-devices", prof.devices[kind]]
            if prof.vllm != "node-env":
                args += ["--vllm-from", prof.vllm]
            if prof.model:
                args += ["--model", prof.model]
            if prof.plugin_path:
                args += ["--plugin-path", prof.plugin_path]
            if (prof.dtype, prof.max_model_len) != ("bfloat16", 512):
                args += ["--dtype", prof.dtype, "--max-model-len", str(prof.max_model_len)]
            env = dict(prof.env)
            if prof.store is not None:  # AscendStore's pool: the master's address, one block hash for both
                env.update({"MOONCAKE_CONFIG_PATH": str(self.store_config()), "PYTHONHASHSEED": "0"})
            for k, v in sorted(env.items()):
                args += ["--env", f"{k}={v}"]
            if conn.kv_port:
                args += ["--kv-port", str(self.kv_ports[role])]
            args += ["--kv-connector", conn.name,
                     "--kv-extra", json.dumps(conn.extra_config, sort_keys=True, separators=(",", ":"))]
            if conn.upstream_series:  # the patched target: upstream's code with the upstream diffs applied
                args += ["--upstream-overlay", str(self.upstream_overlay(conn.upstream_series))]
            if is_hardened(conn.name) or conn.upstream_series or "$KV_LOAD_TIMEOUT_MS" in json.dumps(conn.extra_config):
                args += ["--kv-load-timeout-ms", str(int(t.kv_load_timeout * 1000))]
            if t.engine_id == "fixed":
                args += ["--engine-id", f"pdchaos-{role.replace(':', '-')}"]
            if self.netns is not None:
                args += ["--host", self.host(role)]
            else:  # a host of its own (a pod): its addresses
                args += host_args(self.placement, role)
            return NodeSpec("vllm", args, side=SIDES[role], ready_timeout_s=t.startup_timeout + 30.0,
                            endpoints={"http": self.url(role),
                                       "bootstrap": f"http://{self.host(role)}:{self.bootstrap[role]}"})
        if role == "store":
            store = self.profile.store
            args = ["--rpc-port", str(self.store_ports["rpc"]), "--metrics-port", str(self.store_ports["admin"]),
                    "--server-log", str(self.server_logs / "store.log"), "--master-from", store.master]
            return NodeSpec("mooncake-master", args, side="a", ready_timeout_s=45.0,
                            endpoints={"rpc": f"tcp://127.0.0.1:{self.store_ports['rpc']}",
                                       "admin": f"http://127.0.0.1:{self.store_ports['admin']}"})
        if role == "proxy":
            args = ["--port", str(self.ports["proxy"]), "--protocol", self.proxy_protocol(), "--prefill", self.url("prefill:0"),
                    "--prefill-bootstrap", f"http://{self.bootstrap_hostport}",
                    "--decode", self.url("decode:0"), "--timeout-s", f"{t.proxy_timeout:g}",
                    "--order", "sequential" if self.proxy_protocol() in ("kv-params", "store") else t.proxy_order]
            args += host_args(self.placement, role, advertise=False)  # it announces no address of its own
            return NodeSpec("pd-proxy", args, side=SIDES[role], endpoints={"http": self.url("proxy")})
        return super().node_spec(role)

    def upstream_overlay(self, series: str) -> Path:
        """The folder of the patched target's package copy (harness/nodeenv/overlay.py): the node env's
        ``vllm`` with connector_patch/upstream/<series>/ applied; built once per series text."""
        from connector_patch.upstream import read_series
        from harness.nodeenv.overlay import series_overlay
        from stacks.vllm_cpu.recipe import pd_node_env

        project, version = series.split("/", 1)
        return series_overlay(pd_node_env(out=lambda line: None).site_packages(), project.replace("-", "_"),
                              lambda: read_series(project, version), f"the patched target ({series})")

    def store_config(self) -> Path:
        """The ``mooncake.json`` both servers read (``MOONCAKE_CONFIG_PATH``): the store master's
        address on loopback, the peers found by handshake, the profile's protocol and segment."""
        path = self.run_dir / "mooncake.json"
        if not path.exists():
            store = self.profile.store
            path.write_text(json.dumps({
                "metadata_server": "P2PHANDSHAKE", "protocol": store.protocol, "device_name": "",
                "master_server_address": f"127.0.0.1:{self.store_ports['rpc']}",
                "global_segment_size": store.global_segment_size, "preferred_segment": False,
                "prefer_alloc_in_same_node": True, "enable_ssd_offload": False}, indent=2) + "\n")
        return path

    def server_log_path(self, role: str) -> Path:
        if self.pool_key(role) is None or self.pool is None:
            path = self.server_logs / f"{role.replace(':', '-')}.log"
        else:
            n = len(list(self.pooled_logs.glob(f"{role.replace(':', '-')}-*.log"))) + 1
            path = self.pooled_logs / f"{role.replace(':', '-')}-{n}.log"
        self._server_log[role] = str(path)
        self.event("server_log", role=role, path=str(path))  # log_hygiene reads it (vLLM's own log)
        return path

    def phase_files(self) -> dict[str, Path]:
        """P's and D's phase journals (node_instruments/pdchaos_waf/phases.py, beside each server's
        log; vllm_node.py sets ``PDCHAOS_PHASE_FILE`` on every Mooncake node on CPU): the current
        server log of each role, so a node started again (a new pooled log) is followed."""
        return {role: Path(log + ".phases.jsonl") for role, log in self._server_log.items()
                if role in CORES and log}

    # ------------------------------------------------------------------ warm reuse (harness/pool.py)
    def pool_key(self, role: str) -> tuple | None:
        """P and D are pooled under every setting they were started with (ports aside: a pooled
        node brings its own); a netns link never pools (its namespaces die with the run)."""
        if (role not in CORES or self.topo.link == "netns" or self.profile.store is not None
                or not self.placement.lends_nodes):
            return None  # (a store master lives as long as its run: servers that know it neither)
        t = self.topo
        return ("vllm", self.connector(role), self.profile.key(), self.connector_profile(role).model_dump_json(), role, t.model, t.kv_load_failure_policy, int(t.abort_timeout),
                int(t.startup_timeout), t.max_num_seqs, t.engine_id, int(t.kv_load_timeout * 1000),
                t.tensor_parallel_size)

    def pool_extra(self, role: str) -> dict:
        return {"port": self.ports[role], "bootstrap": self.bootstrap[role], "kv_port": self.kv_ports[role],
                "server_log": self._server_log.get(role)}

    def stale_peers(self, role: str) -> list[str]:
        """P writes the KV blocks into D's memory through its Mooncake transfer engine, which keeps
        what it learned of D's segment and connections to D's transfer port. A D started again on
        the same endpoints (kill, node_down) invalidates that: P's first transfer to the new D can
        fail (CI: a reused P failed the next scenario's first request, HTTP 502 at D, before any
        fault). So P is not lent on once D was replaced."""
        return [r for r in self.nodes if r.startswith("prefill")] if role.startswith("decode") else []

    def reusable(self, role: str, stats: dict) -> str | None:
        """Healthy and drained: nothing running or waiting, no KV block held (a request a fault
        left behind, or blocks P keeps for a pull that never came, would leak into the next
        scenario's verdicts)."""
        from .metrics import gauge as _gauge

        if not stats.get("alive"):
            return "not healthy"
        c = stats.get("counters") or {}
        if not c.get("metrics_ok"):
            return "its /metrics did not answer"
        busy = (_gauge(c, "num_requests_running") or 0) + (_gauge(c, "num_requests_waiting") or 0)
        if busy:
            return f"{busy:g} requests running or waiting"
        usage = _gauge(c, "kv_cache_usage_perc") or 0
        if usage > 0:
            return f"KV cache {usage * 100:.2f}% in use"
        return None

    def start(self) -> None:
        if not self.placement.lends_nodes:  # nodes elsewhere may see this machine's cache read-only (a pod's
            from .plugin_site import instrument_site, plugin_site  # host mount): its plugin folders made here

            plugin_site()
            instrument_site()
        if self.topo.link == "netns" and self.netns is None:
            self.make_netns()
            self.event("link", kind="netns", to="P in namespace b; D, the proxy and the workload in namespace a")
        if self.profile.store is not None:
            self.start_node("store")  # the KV pool's master, before the servers that register with it
        self.find_existing()
        fresh = []
        for role in CORES:  # warm P and D from an earlier scenario, on their own ports
            pooled = self.take_pooled(role)
            if pooled is not None:
                self.ports[role], self.bootstrap[role] = pooled.extra["port"], pooled.extra["bootstrap"]
                self.kv_ports[role] = pooled.extra.get("kv_port", self.kv_ports[role])
                if self.adopt(role, pooled) is not None:
                    self._server_log[role] = pooled.extra.get("server_log")
                    self.event("server_log", role=role, path=self._server_log[role])
                    continue
                self.ports[role], self.bootstrap[role] = free_tcp_port(), free_tcp_port()
            fresh.append(role)
        self.warm_up_existing()
        self.start_nodes(fresh)
        self.bootstrap_hostport = f"{self.host('prefill:0')}:{self.bootstrap['prefill:0']}"
        if self.topo.link == "toxiproxy":  # the proxy, and D (the proxy hands D this address), via Toxiproxy
            self.bootstrap_hostport = self.toxiproxy_link("pd_bootstrap", self.bootstrap_hostport)
            self.event("link", kind="toxiproxy", to="P's bootstrap server")
        self.start_node("proxy")

    def workload_config(self) -> dict:
        from stacks.vllm_cpu.tiny_model import model_dir

        w = self.scenario.workload
        pauses = {"pauses": [[p.at, p.for_] for p in w.pauses]} if w.pauses else {}
        if w.resets:
            pauses["resets"] = [[r.at, self.placement.reach(f"{r.node}:0", self.url(f"{r.node}:0"))] for r in w.resets]
        if w.lead_prompts:
            pauses["lead_prompts"] = list(w.lead_prompts)
        if w.shared_prefix_tokens:
            pauses.update(shared_prefix_tokens=w.shared_prefix_tokens, prefix_groups=w.prefix_groups)
        # the workload runs beside the harness: it reaches the nodes as the harness does (a cluster's
        # port-forwards; the same URLs locally)
        return {**pauses, "proxy_url": self.placement.reach("proxy", self.url("proxy")),
                "decode_url": self.placement.reach("decode:0", self.url("decode:0")), "duration_s": w.duration,
                "concurrency": w.concurrency, "rate": w.rate, "prompt_tokens": w.prompt_tokens,
                "output_tokens": w.output_tokens, "request_timeout_s": w.request_timeout, "seed": self.scenario.seed,
                "model": self.profile.model or str(model_dir()), "prompts_path": str(self.run_dir / "prompts.json")}

    def final_probe(self, timeout_s: float = 1.0) -> None:
        """Give the vLLM nodes up to ``drain_timeout`` to finish what they hold and free the KV
        blocks they kept (a request a fault left waiting, or blocks P keeps for a pull that never
        comes, is exactly what ``drained`` must catch, so the wait is bounded), then probe."""
        deadline = time.monotonic() + self.topo.drain_timeout
        waited = 0.0
        while time.monotonic() < deadline and any(_busy(self.node_stats(r), self.nodes[r].baseline)
                                                  for r in CORES if r in self.nodes):
            time.sleep(0.25)
            waited += 0.25
        if waited:
            self.event("drain_wait", seconds=round(waited, 2))
        super().final_probe(timeout_s)

