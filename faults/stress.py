"""CPU pressure (Jepsen's and Chaos Mesh's StressChaos idea): ``workers`` busy processes, each
busy ``load`` percent of each 100 ms, for the window.

Locally the burners run on this machine beside every node (all nodes share its cores, so the
pressure is on all of them; ``node`` says which node the scenario means). On a cluster the k8s
runtime carries it out as a ``StressChaos`` on the pods of ``node`` (runtimes/k8s/manifests.py).
The window's effect counts the burners still running when it heals: a burner that died early
stressed nothing, and ``fault_effect`` then fails the run as a harness error.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

from pydantic import Field

from .base import FaultParams, OnceFault, register
from .process import NODE_SPEC

# 100 ms periods: busy for load % of each, asleep for the rest (a duty cycle, as stress-ng's --cpu-load)
# (and gone as soon as the harness that started it is: its parent changes)
_BURNER = ("import os,time,sys\nload=float(sys.argv[1])/100\nparent=os.getppid()\nwhile os.getppid()==parent:\n"
           " t=time.monotonic()\n while time.monotonic()-t<0.1*load: pass\n time.sleep(max(0.0,0.1*(1-load)))\n")


class StressParams(FaultParams):
    node: str = Field("all", pattern=NODE_SPEC, description="the node the pressure is meant for (on a cluster: "
                                                           "its pods; locally the whole machine)")
    workers: int = Field(1, ge=1, le=16, description="busy processes")
    load: int = Field(100, ge=1, le=100, description="percent of each 100 ms a worker is busy")


@register
class CpuPressure(OnceFault):
    """Busy processes (workers, each busy load % of every 100 ms) for the window; on a cluster a StressChaos on the node's pods."""

    name = "cpu_pressure"
    Params = StressParams
    may_cause = ("timeout",)  # a starved node may answer late; it need not

    def inject(self) -> None:
        self._procs: list[subprocess.Popen] = []
        for _ in range(self.params.workers):
            self._procs.append(subprocess.Popen([sys.executable, "-c", _BURNER, str(self.params.load)],
                                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                stderr=subprocess.DEVNULL, start_new_session=True))
        self._running = 0
        self.ctx.event("cpu_pressure", workers=len(self._procs), load=self.params.load)

    def heal(self) -> None:
        procs = getattr(self, "_procs", [])
        self._running = sum(1 for p in procs if p.poll() is None)
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                p.wait(timeout=5.0)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
                pass
        self._procs = []

    def effect(self) -> dict[str, Any] | None:
        return {"workers": getattr(self, "_running", 0)}

    def required_effect(self) -> dict[str, float]:
        return {"workers": self.params.workers}
