"""The lookup family's topology: one lookup server (worker rank 0) and what sits in its link.

Roles: ``server`` (the target's server: hardened ``lookup-server`` or ``legacy-server``; a fault
may swap in a ``fake-peer`` on the same endpoint), ``interposer`` with ``link: interposer``; the
workload (the scheduler side) is the client. The link is ``direct``, through the ZMQ interposer,
through a Toxiproxy proxy (tcp), or across two network namespaces (client in "a", server in "b").
"""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any, Callable

from harness.topology import BaseTopology, NodeSpec, free_tcp_port

SERVER_KIND = {"hardened": "lookup-server", "legacy": "legacy-server"}
# Targets that run vllm-ascend's real code in the conformance node env (stacks/ascend_cpu/recipe.py):
# ``upstream`` always; ``hardened`` with ``stack: vllm-ascend`` (the plugin's server and client);
# ``patched`` with ``stack: vllm-ascend`` (upstream's server and client with the diffs, no plugin).
ASCEND_SERVER, ASCEND_WORKLOAD = "ascend-lookup-server", "ascend-workload"
ASCEND_READY_S = 180.0  # torch + vLLM + vllm-ascend imports: 10-60 s on a busy 2-core host
SERVER_RPC_PORT, CLIENT_RPC_PORT = 5100, 5101  # vllm-ascend's lookup_rpc_port: a name in the ipc path


# vLLM's store connector (stack: vllm-store): both targets run vLLM 0.32.0's code in the P/D node env
STORE_SERVER, STORE_WORKLOAD = "store-lookup-server", "store-workload"
ENGINE_ID, TWIN_ENGINE_ID = "pdchaos-engine-a", "pdchaos-engine-b"


def runs_store(topo: Any) -> bool:
    return getattr(topo, "stack", "standalone") == "vllm-store"


def runs_ascend(topo: Any, target: str) -> bool:
    """Whether this target's server and client are vllm-ascend's real code (conformance env)."""
    return target == "upstream" or (target in ("hardened", "patched")
                                    and getattr(topo, "stack", "standalone") == "vllm-ascend")
GRACE_S = 1.0  # the workload's grace after its duration, on top of deadline + tolerance


def preload_keys(seed: int, n: int) -> list[str]:
    rng = random.Random(seed ^ 0x5EED)
    return [rng.getrandbits(256).to_bytes(32, "big").hex() for _ in range(n)]


class LookupTopology(BaseTopology):
    def __init__(self, scenario: Any, target: str, run_dir: Path, record: Callable[[dict], None],
                 services: dict[str, Any] | None = None):
        super().__init__(scenario, target, run_dir, record, services)
        self.topo = scenario.topology
        self.preload = preload_keys(scenario.seed, self.topo.preload_blocks)
        self.preload_path = run_dir / "preload.txt"
        self.preload_path.write_text("\n".join(self.preload) + "\n")
        self.ascend = runs_ascend(self.topo, target)
        self.store = runs_store(self.topo)
        if self.store:
            # each derives its path from the config: upstream's from the host (the same for every
            # engine on it), the hardened one's from the engine id
            from .store_server import hardened_path, patched_path, upstream_path

            def path(engine_id: str) -> str:
                if target == "patched":
                    return patched_path(str(self.tmp), engine_id)
                return upstream_path(str(self.tmp)) if target == "upstream" else hardened_path(str(self.tmp), engine_id)

            self.server_endpoint, self.twin_endpoint = path(ENGINE_ID), path(TWIN_ENGINE_ID)
            self.workload_kind = STORE_WORKLOAD
            self.workload_ready_timeout_s = ASCEND_READY_S
            if self.topo.twin:  # the second engine's own keys
                self.twin_preload_path = run_dir / "twin-preload.txt"
                self.twin_preload_path.write_text("\n".join(preload_keys(scenario.seed + 1, self.topo.preload_blocks))
                                                  + "\n")
        elif self.ascend:
            # vllm-ascend derives the path from VLLM_RPC_BASE_PATH and lookup_rpc_port (ipc only);
            # the client's differs from the server's only when an interposer sits between them
            from .ascend_server import lookup_path

            self.server_endpoint = lookup_path(str(self.tmp), SERVER_RPC_PORT)
            self.workload_kind = ASCEND_WORKLOAD
            self.workload_ready_timeout_s = ASCEND_READY_S
        elif self.topo.link == "netns":
            self.make_netns()
            self.server_endpoint = f"tcp://{self.netns.ip_b}:{free_tcp_port()}"
        elif self.topo.transport == "ipc":
            self.server_endpoint = f"ipc://{self.tmp}/lookup.sock"
        else:
            self.server_endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"
        self.client_endpoint = self.server_endpoint

    # ------------------------------------------------------------ family hooks
    def node_spec(self, role: str) -> NodeSpec:
        t = self.topo
        if role in ("server", "twin") and self.store:
            twin = role == "twin"
            args = ["--endpoint", self.twin_endpoint if twin else self.server_endpoint,
                    "--preload", str(self.twin_preload_path if twin else self.preload_path),
                    "--block-size", str(t.block_size), "--groups", "1",
                    "--impl", self.target, "--engine-id", TWIN_ENGINE_ID if twin else ENGINE_ID,
                    "--deadline-ms", str(int(round(self.scenario.deadline * 1000))),
                    "--backend-timeout-ms", str(max(1, int(t.backend_timeout * 1000)))]
            if self.target == "patched":
                args += ["--upstream-overlay", str(self.upstream_overlay())]
            return NodeSpec(STORE_SERVER, args, endpoints={"lookup": args[1]}, ready_timeout_s=ASCEND_READY_S)
        if role == "server":
            args = self._peer_args()
            if self.ascend:
                args += ["--impl", self.target, "--backend-timeout-ms", str(self.backend_timeout_ms())]
                if self.target == "patched":
                    args += ["--deadline-ms", str(int(round(self.scenario.deadline * 1000))),
                             "--upstream-overlay", str(self.upstream_overlay())]
                return NodeSpec(ASCEND_SERVER, args, endpoints={"lookup": self.server_endpoint},
                                ready_timeout_s=ASCEND_READY_S)
            kind = SERVER_KIND[self.target]
            if kind == "lookup-server":
                args += ["--backend-timeout-ms", str(max(1, int(t.backend_timeout * 1000)))]
            return NodeSpec(kind, args, endpoints={"lookup": self.server_endpoint})
        if role == "interposer":
            # the lookup wire knowledge (named rewrites) is this family's codec: faults know no protocol
            return NodeSpec("interposer", ["--listen", self._interposer_listen, "--upstream", self.server_endpoint,
                                           "--codec", f"{__package__}.wire"])
        return super().node_spec(role)

    def start(self) -> None:
        if not (self.ascend or self.store):  # a real stack's server starts beside the workload (start_workload)
            self.start_node("server")
        if self.topo.link == "interposer":
            if self.ascend:
                from .ascend_server import lookup_path

                self._interposer_listen = lookup_path(str(self.tmp), CLIENT_RPC_PORT)
            else:
                self._interposer_listen = (f"ipc://{self.tmp}/interposer.sock" if self.topo.transport == "ipc"
                                           else f"tcp://127.0.0.1:{free_tcp_port()}")
            self.start_node("interposer")
            self.client_endpoint = self._interposer_listen
        elif self.topo.link == "toxiproxy":
            listen = self.toxiproxy_link("lookup", self.server_endpoint[len("tcp://"):])
            self.client_endpoint = f"tcp://{listen}"

    def start_workload(self, journal_part: Path) -> Any:
        """With vllm-ascend's code on both sides, the server and the workload each import torch,
        vLLM and vllm-ascend (~10 s apiece here): they start side by side (ZMQ connects lazily, and
        the workload sends nothing before the runner's start signal, which comes after both are
        ready). The first failure is raised once both ended."""
        if not (self.ascend or self.store):
            return super().start_workload(journal_part)
        if self.store and self.topo.twin:
            # in this order, every time: the second engine's server binds after the first's, and
            # the workload (engine A's scheduler) connects after both
            self.start_node("server")
            self.start_node("twin")
            return super().start_workload(journal_part)
        out: dict[str, Any] = {}

        def server() -> None:
            try:
                self.start_node("server")
            except BaseException as exc:  # noqa: BLE001 - raised below
                out["error"] = exc

        th = threading.Thread(target=server, name="start-server")
        th.start()
        try:
            out["workload"] = super().start_workload(journal_part)
        finally:
            th.join()
        if "error" in out:
            if "workload" in out:
                out["workload"].stop(2.0)
            raise out["error"]
        return out["workload"]

    def workload_config(self) -> dict:
        m, w = self.scenario, self.scenario.workload
        return {"endpoint": self.client_endpoint, "target": self.target, "deadline_ms": int(round(m.deadline * 1000)),
                "concurrency": w.concurrency, "rate": w.rate, "duration_s": w.duration,
                "grace_s": m.deadline + m.tolerance + GRACE_S, "mix": w.mix.model_dump(),
                "prompt_blocks": list(w.prompt_blocks), "seed": m.seed, "preload": self.preload,
                "block_size": self.topo.block_size, "groups": self.topo.groups, "reset_at_s": w.reset_at,
                "engine_id": ENGINE_ID, "backend_timeout_ms": self.backend_timeout_ms(),
                **({"upstream_overlay": str(self.upstream_overlay())} if self.target == "patched" else {})}

    def backend_timeout_ms(self) -> int:
        """The server's deadline for one store lookup: ``topology.backend_timeout``. On vllm-ascend's
        patched release, where it is ``lookup_backend_timeout_ms`` and must be below the client's
        deadline, a scenario that does not set it gets that release's default instead (three quarters
        of ``deadline``, as diff 11's ``backend_timeout_ms`` computes it when the key is unset)."""
        if self.ascend and self.target == "patched" and "backend_timeout" not in self.topo.model_fields_set:
            return max(1, int(round(self.scenario.deadline * 1000)) * 3 // 4)
        return max(1, int(self.topo.backend_timeout * 1000))

    def upstream_overlay(self) -> Path:
        """The patched target's package copy (harness/nodeenv/overlay.py, built once per series text):
        with ``stack: vllm-store``, the P/D node env's vLLM with connector_patch/upstream/vllm/ applied
        (the store stack runs vLLM 0.32.0 from that env); with ``stack: vllm-ascend``, the conformance
        env's vllm_ascend with connector_patch/upstream/vllm-ascend/ applied."""
        from connector_patch.upstream import read_series
        from harness.nodeenv.overlay import series_overlay

        if self.ascend:
            from stacks.ascend_cpu.recipe import ASCEND_VERSION, ascend_conf_env

            return series_overlay(ascend_conf_env(out=lambda line: None).site_packages(), "vllm_ascend",
                                  lambda: read_series("vllm-ascend", ASCEND_VERSION),
                                  f"the patched target (vllm-ascend/{ASCEND_VERSION})")
        from stacks.vllm_cpu.recipe import VLLM_VERSION, pd_node_env

        return series_overlay(pd_node_env(out=lambda line: None).site_packages(), "vllm",
                              lambda: read_series("vllm", VLLM_VERSION), f"the patched target (vllm/{VLLM_VERSION})")

    # ------------------------------------------------------------ what the lookup faults use
    def _peer_args(self) -> list[str]:
        """What the server and any peer swapped in for it share: endpoint and keys."""
        t = self.topo
        return ["--endpoint", self.server_endpoint, "--preload", str(self.preload_path),
                "--block-size", str(t.block_size), "--groups", str(t.groups)] + \
            (["--dialect", "store"] if self.store else [])

    def swap_server(self, kind: str, args: list[str]) -> None:
        self.swap_node("server", NodeSpec(kind, self._peer_args() + list(args)))

    def restore_server(self) -> None:
        self.restore_node("server")

    def server_control(self, cmd: str, **fields: Any) -> dict:
        return self.control("server", cmd, **fields)
