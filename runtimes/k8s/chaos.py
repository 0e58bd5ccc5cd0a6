"""A harness fault carried out by Chaos Mesh: the fault's window starts when its object reports
``AllInjected`` and ends when it reports ``AllRecovered`` (or is gone), both times journalled.

:class:`ChaosMeshFault` wraps the fault the scenario names (``kill``, ``partition``, ...): what
that fault declares (the failure categories it causes, its tail) stays the same, so the checks
judge the history as they do locally; only the injection differs. Its effect counts what the
controller reported (``injected``, ``recovered``): a window whose object never reported injected
did nothing, and ``fault_effect`` fails it as a harness error, never as a pass. A partition's own
count (``dropped``, the iptables counters locally) comes from a probe once it is injected: a
connection tried from a pod on one side to a pod's port on the other, through exec, that must not
get through (Chaos Mesh reports no packet counts); one that got through, or could not be tried,
leaves the count 0 or missing, and ``fault_effect`` fails the window.
"""

from __future__ import annotations

import time
from typing import Any

from faults.base import Fault

INJECT_TIMEOUT_S = 30.0
RECOVER_TIMEOUT_S = 60.0
RESTART_READY_TIMEOUT_S = 600.0  # a vLLM server loading its model again on a loaded machine


def condition(obj: dict | None, name: str) -> bool:
    """Whether a Chaos Mesh object's status has condition ``name`` ("AllInjected",
    "AllRecovered") with status "True"."""
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == name and str(c.get("status")) == "True":
            return True
    return False


def label_selector(sel: dict) -> str:
    """A Chaos Mesh selector's labels as a Kubernetes label selector string."""
    parts = [f"{k}={v}" for k, v in sorted((sel.get("labelSelectors") or {}).items())]
    for ex in sel.get("expressionSelectors") or []:
        if ex.get("operator") == "In":
            parts.append(f"{ex['key']} in ({','.join(ex.get('values') or [])})")
    return ",".join(parts)


CUT_PROBE = ("import socket,sys\ntry:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1).close()\n"
             "    print('through')\nexcept OSError:\n    print('cut')\n")


class ChaosMeshFault(Fault):
    """``inner``'s fault through a Chaos Mesh object: ``manifest`` and ``kube`` are the object and
    the cluster, or callables that give them when the window opens (the run's roles are known then)."""

    def __init__(self, inner: Fault, manifest: Any, kube: Any, probe_port: int | None = None,
                 container: str = "node") -> None:
        super().__init__(inner.params, inner.ctx)
        self.inner, self._manifest, self._kube = inner, manifest, kube
        # a partition's effect: a connection tried across the cut, from a source pod to a target
        # pod's port (its control channel), that does not get through while the window lasts
        self.probe_port, self.container = probe_port, container
        # attach mode: each user pod's serving container and port (the harness's pods: ``container``
        # and the control port)
        self.container_for: Any = None
        self.probe_port_for: Any = None
        self._before: dict[str, int] = {}  # a container-kill's pods: uid -> restarts before it
        self.manifest: dict | None = manifest if isinstance(manifest, dict) else None
        self.kube = None if callable(kube) and not hasattr(kube, "apply") else kube
        self.name = inner.name
        self._created = False
        self._counts = {"injected": 0, "recovered": 0}

    # what the scenario's fault declares, unchanged
    def expected_categories(self) -> tuple[str, ...]:
        return self.inner.expected_categories()

    def possible_categories(self) -> tuple[str, ...]:
        return self.inner.possible_categories()

    def tail_after_heal(self) -> float | None:
        return None

    def required_effect(self) -> dict[str, float]:
        return {**self.inner.required_effect(), "injected": 1, "recovered": 1}

    def effect(self) -> dict[str, Any] | None:
        # A pod-kill's own counts (kill's acted/seen, which the journal's meta line names) are what
        # the controller reports: AllInjected means it killed every selected pod. A network fault's
        # count (packets stopped) has no such report: it stays missing, and fault_effect then
        # judges the window a harness error rather than take the object's word for packets.
        out = {}
        if (self.manifest or {}).get("kind") == "PodChaos":
            out = {k: self._counts["injected"] for k in self.inner.required_effect()}
        if "cut" in self._counts:  # a partition: the connections it stopped, seen by a probe across it
            out = {k: self._counts["cut"] for k in self.inner.required_effect()}
        return {**out, **self._counts}

    def _ref(self) -> tuple[str, str, str, str]:
        m = self.manifest
        return m["apiVersion"], m["kind"], m["metadata"]["name"], m["metadata"]["namespace"]

    def start(self) -> None:
        if self.manifest is None:
            self.manifest = self._manifest()
        if self.kube is None:
            self.kube = self._kube()
        api, kind, name, ns = self._ref()
        if self._container_kill():
            self._before = self._restarts(ns)
        self._created = True
        self.kube.apply(self.manifest)
        self.ctx.event("chaos_created", kind=kind, name=name)
        self.kube.wait(api, kind, ns, lambda items: any(i["metadata"]["name"] == name and condition(i, "AllInjected")
                                                        for i in items),
                       INJECT_TIMEOUT_S, f"{kind} {name} injected")
        self._counts["injected"] = 1
        self.ctx.event("chaos_injected", kind=kind, name=name, t_wall=time.time())
        if kind == "NetworkChaos" and self.manifest["spec"].get("action") == "partition" \
                and (self.probe_port or self.probe_port_for):
            self._counts["cut"] = self._probe_cut()
            self.ctx.event("chaos_probe", kind=kind, name=name, cut=self._counts["cut"])

    def stop(self) -> None:
        if not self._created:
            return
        api, kind, name, ns = self._ref()
        self.kube.delete(api, kind, name, ns)
        # Chaos Mesh recovers what it injected when the object goes (its finalizer): the window
        # ends when the object says AllRecovered or is gone
        self.kube.wait(api, kind, ns, lambda items: not any(i["metadata"]["name"] == name and not condition(i, "AllRecovered")
                                                            for i in items),
                       RECOVER_TIMEOUT_S, f"{kind} {name} recovered")
        if self._container_kill():
            # a restart: the kill acted at the injection; the heal ends once the node serves again
            # (the kubelet starts the container in its pod, its readiness says when it serves), so
            # the requests it failed meanwhile fall in the fault's window
            self._wait_restarted(ns, self._before)
        self._created = False
        self._counts["recovered"] = 1
        self.ctx.event("chaos_recovered", kind=kind, name=name, t_wall=time.time())

    def _probe_cut(self) -> int:
        """1 when a connection from a source pod to a target pod's port does not get through (the cut
        acts), 0 when it does; -1 when it could not be tried (no pod, no exec): fault_effect fails then."""
        from .pods import exec_in, pod_ready

        spec = self.manifest["spec"]
        ns = self.manifest["metadata"]["namespace"]
        try:
            src = [p for p in self._pods(ns, spec["selector"]) if pod_ready(p)]
            dst = [p for p in self._pods(ns, spec["target"]["selector"]) if pod_ready(p)]
            if not src or not dst or not (dst[0].get("status") or {}).get("podIP"):
                return -1
            port = self.probe_port_for(dst[0]) if self.probe_port_for else self.probe_port
            container = self.container_for(src[0]) if self.container_for else self.container
            if not port:
                return -1
            out = exec_in(self.kube, ns, src[0]["metadata"]["name"], container,
                          ["python3", "-c", CUT_PROBE, dst[0]["status"]["podIP"], str(port)],
                          "partition probe", 15.0)
        except Exception:  # noqa: BLE001 - could not try: the effect stays unproven (fault_effect fails)
            return -1
        return 1 if out.strip() == "cut" else 0

    def _container_kill(self) -> bool:
        return self.manifest["kind"] == "PodChaos" and self.manifest["spec"].get("action") == "container-kill"

    def _restarts(self, ns: str) -> dict[str, int]:
        """Pod uid -> its containers' restart count, for the pods the object selects."""
        try:
            pods = self._pods(ns, self.manifest["spec"]["selector"])
        except Exception:  # noqa: BLE001 - unknown: the wait after the kill then waits for readiness only
            return {}
        return {p["metadata"]["uid"]: _restart_count(p) for p in pods}

    def _wait_restarted(self, ns: str, before: dict[str, int]) -> None:
        from .pods import pod_ready

        def back(items: list[dict]) -> bool:
            picked = [p for p in items if p["metadata"]["uid"] in before] if before else items
            if not picked:
                return False
            for p in picked:
                if not pod_ready(p) or (before and _restart_count(p) <= before[p["metadata"]["uid"]]):
                    return False
            return True

        t0 = time.monotonic()
        sel = self.manifest["spec"]["selector"]
        names = (sel.get("pods") or {}).get(ns)
        self.kube.wait("v1", "Pod", ns, lambda items: back([p for p in items if not names or p["metadata"]["name"] in names]),
                       RESTART_READY_TIMEOUT_S, "the killed container started again and ready",
                       selector=None if names else label_selector(sel))
        # the kubelet's restart counts of the selected pods before the kill and now: what fault_effect
        # takes as evidence that the container started again (the object's conditions are not)
        after = self._restarts(ns) if before else {}
        counts = {"restarts_before": sum(before.values()), "restarts_after": sum(after.get(u, 0) for u in before)} \
            if before and set(before) <= set(after) else {}
        self.ctx.event("chaos_restarted", kind="PodChaos", name=self.manifest["metadata"]["name"],
                       seconds=round(time.monotonic() - t0, 2), **counts)

    def _pods(self, ns: str, sel: dict) -> list[dict]:
        """The pods a Chaos Mesh selector picks: by name (``pods``, attach mode) or by labels."""
        names = (sel.get("pods") or {}).get(ns)
        if names:
            return [p for p in self.kube.list("v1", "Pod", namespace=ns) if p["metadata"]["name"] in names]
        return self.kube.list("v1", "Pod", namespace=ns, selector=label_selector(sel))


def _restart_count(pod: dict) -> int:
    """How many times the kubelet started a container of ``pod`` again (all its containers)."""
    return sum(int(c.get("restartCount") or 0) for c in (pod.get("status") or {}).get("containerStatuses") or [])
