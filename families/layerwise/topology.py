"""The layerwise family's topology: D, P, the metaserver, and the link P dials D through.

Roles: ``decode`` (``layerwise-decode``), ``prefill`` (``layerwise-prefill``), ``metaserver``
(``layerwise-metaserver``). D and P start together (each imports torch + vLLM + vllm-ascend);
then, with ``link: toxiproxy``, a Toxiproxy proxy in front of D's listener, which the metaserver
gives P as D's address (the toxic faults then act on P's metadata queries and DONE/FAILED
signals); then the metaserver. The workload drives requests through D.

D and P are **reused** between scenarios of one target (harness/pool.py) when a run leaves them
alive and drained: no request still waiting at D, nothing queued at P. A pooled D keeps its
listener port and the metaserver port its scheduler POSTs to (the next run's metaserver binds that
port); P's metadata cache of D is keyed by the address it dials, which a Toxiproxy link makes new
per run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from harness.topology import BaseTopology, NodeSpec, free_tcp_port

from .node import READY_TIMEOUT_S
from .spec import decode_roles

METASERVER_PATH = "/v1/metaserver"
POOLED = ("decode", "prefill")
GRACE_S = 2.0


class LayerwiseTopology(BaseTopology):
    workload_kind = "layerwise-workload"
    workload_ready_timeout_s = 30.0
    fault_bound_s = 15.0

    def __init__(self, scenario: Any, target: str, run_dir: Path, record: Callable[[dict], None],
                 services: dict[str, Any] | None = None, profile: Any = None):
        super().__init__(scenario, target, run_dir, record, services)
        self.topo = scenario.topology
        # a mutation run's hardened class (profile.py); None: connector_patch's
        self.hardened_class = getattr(profile, "hardened_class", None) if target == "hardened" else None
        self.plugin_path = getattr(profile, "plugin_path", None) if target == "hardened" else None
        self.kv_port = free_tcp_port()
        self.ms_port = free_tcp_port()
        self.dist_ports = {"decode": free_tcp_port(), "prefill": free_tcp_port(), "decode2": free_tcp_port()}
        self.kv_port2 = free_tcp_port()  # the second D's listener (decodes: 2; never pooled)
        self.decode_listener = f"tcp://127.0.0.1:{self.kv_port}"
        self.decode_via = ""

    def _connector_args(self, role: str) -> list[str]:
        t = self.topo
        return ["--impl", self.target, "--dist-port", str(self.dist_ports[role]),
                "--recv-timeout", f"{t.recv_timeout:g}", "--meta-timeout", f"{t.meta_timeout:g}",
                "--post-timeout", f"{t.post_timeout:g}", "--signal-timeout", f"{t.signal_timeout:g}",
                "--write-grace", f"{t.write_grace:g}", "--policy", t.policy] \
            + (["--hardened-class", self.hardened_class] if self.hardened_class else []) \
            + (["--plugin-path", self.plugin_path] if self.plugin_path else []) \
            + (["--upstream-overlay", str(self.upstream_overlay())] if self.target == "patched" else [])

    def upstream_overlay(self) -> Path:
        """The patched target's package copy: the conformance env's vllm_ascend with
        connector_patch/upstream/vllm-ascend/<version>/ applied (harness/nodeenv/overlay.py), built
        once per series text."""
        from connector_patch.upstream import read_series
        from harness.nodeenv.overlay import series_overlay
        from stacks.ascend_cpu.recipe import ASCEND_VERSION, ascend_conf_env

        return series_overlay(ascend_conf_env(out=lambda line: None).site_packages(), "vllm_ascend",
                              lambda: read_series("vllm-ascend", ASCEND_VERSION), f"the patched target (vllm-ascend/{ASCEND_VERSION})")

    def node_spec(self, role: str) -> NodeSpec:
        if role == "decode":
            args = self._connector_args(role) + ["--kv-port", str(self.kv_port), "--metaserver",
                                                 f"http://127.0.0.1:{self.ms_port}{METASERVER_PATH}"]
            return NodeSpec("layerwise-decode", args, endpoints={"listener": self.decode_listener},
                            ready_timeout_s=READY_TIMEOUT_S)
        if role == "decode2":  # started after the pooled D: it POSTs to the same metaserver port
            args = self._connector_args(role) + ["--kv-port", str(self.kv_port2), "--engine-id", "decode2-0",
                                                 "--metaserver", f"http://127.0.0.1:{self.ms_port}{METASERVER_PATH}"]
            return NodeSpec("layerwise-decode", args, endpoints={"listener": f"tcp://127.0.0.1:{self.kv_port2}"},
                            ready_timeout_s=READY_TIMEOUT_S)
        if role == "prefill":
            args = self._connector_args(role) + ["--kv-port", str(free_tcp_port()), "--batch",
                                                 str(self.topo.prefill_batch)]
            return NodeSpec("layerwise-prefill", args, ready_timeout_s=READY_TIMEOUT_S)
        if role == "metaserver":
            args = ["--port", str(self.ms_port), "--prefill-control", self.nodes["prefill"].control_ep or "",
                    "--behaviour", self.topo.metaserver]
            if self.decode_via:
                args += ["--decode-via", self.decode_via]
            return NodeSpec("layerwise-metaserver", args,
                            endpoints={"metaserver": f"http://127.0.0.1:{self.ms_port}{METASERVER_PATH}"})
        return super().node_spec(role)

    # ------------------------------------------------------------------ warm reuse
    def pool_key(self, role: str) -> tuple | None:
        if role not in POOLED:
            return None
        t = self.topo
        return ("layerwise", role, self.target, self.hardened_class, self.plugin_path, t.recv_timeout,
                t.meta_timeout, t.post_timeout, t.signal_timeout,
                t.write_grace, t.policy, t.prefill_batch if role == "prefill" else 1)

    def pool_extra(self, role: str) -> dict:
        return {"kv_port": self.kv_port, "ms_port": self.ms_port} if role == "decode" else {}

    def reusable(self, role: str, stats: dict) -> str | None:
        if not stats.get("alive"):
            return "not alive"
        c = stats.get("counters") or {}
        if role == "decode" and c.get("waiting"):
            return f"{c['waiting']} requests still in WAITING_FOR_REMOTE_KVS"
        if role == "decode" and c.get("blocks_initial") != c.get("free_blocks"):
            return "its scheduler has not got back every KV block"
        if role == "prefill" and (c.get("queue") or c.get("send_queue")):
            return "requests still queued"
        return None

    def start(self) -> None:
        fresh = []
        for role in POOLED:
            pooled = self.take_pooled(role)
            if pooled is not None:
                if role == "decode":
                    self.kv_port, self.ms_port = pooled.extra["kv_port"], pooled.extra["ms_port"]
                    self.decode_listener = f"tcp://127.0.0.1:{self.kv_port}"
                if self.adopt(role, pooled) is not None:
                    continue
                if role == "decode":
                    self.kv_port, self.ms_port = free_tcp_port(), free_tcp_port()
                    self.decode_listener = f"tcp://127.0.0.1:{self.kv_port}"
            fresh.append(role)
        fresh += decode_roles(self.topo.decodes)[1:]  # a second D is never pooled
        self.start_nodes(fresh)
        if self.topo.link == "toxiproxy":
            self.decode_via = self.toxiproxy_link("layerwise", f"127.0.0.1:{self.kv_port}")
        self.start_node("metaserver")

    def final_probe(self, timeout_s: float = 1.0) -> None:
        """Before the final probes: a hardened D may still hold the blocks of requests it failed
        itself, until P's last word or their write-by time plus the grace (at most the receive
        deadline plus the grace from now). Waits that long at most for D to hold none, so the
        block pool is judged once D could have given everything back; recorded as an event."""
        t0 = time.monotonic()
        bound = t0 + float(self.topo.recv_timeout) + float(self.topo.write_grace) + 1.0
        for role in [r for r in decode_roles(self.topo.decodes) if r in self.nodes]:
            held = None
            while time.monotonic() < bound:
                stats = self.node_stats(role)
                held = ((stats or {}).get("counters") or {}).get("listener_held_now")
                if not held:
                    break
                time.sleep(0.1)
            if held is not None:
                self.event("decode_holds_drained", role=role, held=held,
                           waited_ms=round((time.monotonic() - t0) * 1000, 1))
        super().final_probe(timeout_s)

    def workload_config(self) -> dict:
        m, w = self.scenario, self.scenario.workload
        return {"decode_controls": {r: self.nodes[r].control_ep for r in decode_roles(self.topo.decodes) if r in self.nodes},
                "target": self.target, "seed": m.seed,
                "concurrency": w.concurrency, "rate": w.rate, "duration_s": w.duration, "tokens": w.tokens,
                "wait_s": w.wait, "grace_s": w.wait + GRACE_S, "start_s": w.start}
