from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from pydantic import Field

from faults.base import FaultParams, OnceFault, register
from harness.checks import CheckInput, CheckResult
from harness.family import Family, Spec, WorkloadSpec
from harness.topology import BaseTopology, NodeSpec

from .nodes import NODE_KINDS


class EchoTopologySpec(Spec):
    socket: str = Field("echo.sock", pattern=r"^[a-z.]{1,20}$", description="ipc socket file name")
    start_delay: float = Field(0.0, ge=0, le=30, description="seconds the server's start takes (a slow cold start)")
    ready_delay: float = Field(0.0, ge=0, le=120, description="seconds the server process takes to print READY")
    stubborn_child: bool = Field(False, description="the server starts a child that ignores SIGTERM (as vLLM's)")


class EchoWorkloadSpec(WorkloadSpec):
    concurrency: int = Field(1, ge=1, le=8)
    rate: float = Field(20.0, gt=0, le=1000)

    def recovery_gap(self, within: int) -> float:
        return within * self.concurrency / self.rate


class EchoTopology(BaseTopology):
    workload_kind = "echo-workload"

    def node_spec(self, role: str) -> NodeSpec:
        if role == "server":
            args = ["--endpoint", self.endpoint, "--journal", str(self.journal_part("server")),
                    "--phases", str(self.run_dir / "server.phases.jsonl")]
            args += ["--uppercase"] if self.target == "shouting" else []
            t = self.scenario.topology
            args += ["--ready-delay", str(t.ready_delay)] if t.ready_delay else []
            args += ["--stubborn-child"] if t.stubborn_child else []
            return NodeSpec("echo-server", args, ready_timeout_s=10.0 + t.ready_delay)
        return super().node_spec(role)

    def phase_files(self) -> dict[str, Path]:
        return {"server": self.run_dir / "server.phases.jsonl"}

    def start(self) -> None:
        self.endpoint = f"ipc://{self.tmp}/{self.scenario.topology.socket}"
        time.sleep(self.scenario.topology.start_delay)  # a node whose cold start is slow (tests only)
        self.start_node("server")

    def workload_config(self) -> dict:
        w = self.scenario.workload
        return {"endpoint": self.endpoint, "duration_s": w.duration, "concurrency": w.concurrency, "rate": w.rate,
                "deadline_ms": int(self.scenario.deadline * 1000), "seed": self.scenario.seed,
                "shout": self.target == "shouting"}


class EchoFamily(Family):
    name = "echo_family"
    description = "a toy echo server (tests only)"
    targets = ("plain", "shouting")
    baseline_target = "plain"
    Topology = EchoTopologySpec
    Workload = EchoWorkloadSpec
    fault_modules = (__name__,)
    primary_ops = ("echo",)
    node_kinds = NODE_KINDS
    log_pattern = r"SECRET-[0-9]+"
    # what the generic process faults cause in the echo workload: a worker's REQ socket times out
    # (failures_explained accepts these in such a fault's window and tail)
    # protocol phases its server journals (harness/phases.py); echo_never is declared and never
    # written (tests/harness/test_phases.py: a phase that never comes)
    phases = {"echo_served": "the server sent an echo back", "echo_never": "never written (tests only)",
              "echo_shouted": "seen only on the shouting target (tests only: never written either)"}
    phase_targets = {"echo_shouted": ("shouting",)}
    generic_explains = dict.fromkeys(("kill", "stop", "restart", "node_down"), ("timeout",))

    def topology(self, scenario: Any, target: str, run_dir: Path, record: Callable[[dict], None],
                 services: dict[str, Any], profile: Any = None) -> BaseTopology:
        return EchoTopology(scenario, target, run_dir, record, services)

    def not_applicable(self, scenario: Any, target: str) -> dict[str, str]:
        return {"echo_matches": "the shouting target changes the text"} if target == "shouting" else {}


FAMILY = EchoFamily()


@FAMILY.checks.check("echo_matches")
def echo_matches(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    ok = [o for o in inp.ops if o.get("phase") == "ok"]
    wrong = [o for o in ok if o.get("value") != o.get("expected")]
    if wrong:
        return CheckResult("", False, f"{len(wrong)} of {len(ok)} echoes differ; op {wrong[0]['id']}")
    if not ok:
        return CheckResult("", False, "no echo came back")
    return CheckResult("", True, f"all {len(ok)} echoes equal what was sent")


@register
class EchoGarble(OnceFault):
    """The server garbles every reply while active."""

    name = "echo_garble"
    family = "echo_family"
    Params = FaultParams

    def prepare(self) -> None:  # the runner calls it before t0; recorded so tests/harness/test_families.py sees when
        self.ctx.event("echo_garble_prepare")

    def release(self) -> None:  # at teardown, after the heal
        self.ctx.event("echo_garble_release")

    def inject(self) -> None:
        self.ctx.control("server", "garble", on=True)

    def heal(self) -> None:
        self.ctx.control("server", "garble", on=False)
