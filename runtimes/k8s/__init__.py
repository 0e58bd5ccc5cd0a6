"""The k8s runtime: every node is a pod, made and watched through the Kubernetes API.

A launch profile selects it with ``runtime: k8s`` and says where and how in its ``cluster:`` block
(settings.py: image, resources, model cache, workload kind, attach selectors). Each scenario run
gets a namespace of its own (``PREFIX-RUNID``), one workload per role and a Service per role
(manifests.py), all labelled with the run id; the run deletes the namespace at its end, and
``pdchaos clean --profile k8s`` deletes what a killed run left. Faults Chaos Mesh has become Chaos
Mesh objects (chaos.py); freeze/thaw go through exec in the container (pods.py); faults with no
cluster equivalent yet (Toxiproxy toxics other than latency and bandwidth, the side-channel
interposer) are refused before anything starts, listed like any other exclusion.

What this machine verifies (no container runtime here): the objects' schemas against a real API
server and the pinned CRDs, their lifecycle (create, watch until ready, Chaos Mesh objects until
injected and recovered through a stand-in controller, delete, nothing left behind, the error
paths) with kwok simulating nodes and pods. What only a real cluster verifies: the faults' effects
on running pods, and anything on RDMA (docs/k8s.md).
"""

from __future__ import annotations

import os
from typing import Any

from harness.errors import HarnessError
from harness.runtime import Launch, NodeHandle, Placement, Runtime

from .manifests import TRANSLATED

KUBECONFIG_ENV = "PDCHAOS_KUBECONFIG"


class K8sRuntime(Runtime):
    name = "k8s"
    commands = {"cluster": ("runtimes.k8s.cli", "a real single-node Kubernetes cluster on this machine (kubelet, "
                            "containerd, Chaos Mesh): up, status, down (needs `pdchaos setup --only k8s-node`)")}
    # every pod is a host of its own: the run's "netns" link exists by construction; node_address:
    # what must reach the addresses nodes announce to each other runs in a pod (run_beside)
    provides = frozenset(("stop", "kill", "freeze", "restart", "netns", "node_address"))
    runs_here = False  # the image holds vLLM and the node stack; the model is in the cluster's cache

    def settings(self, data: Any) -> Any:
        from pydantic import ValidationError

        from .settings import ClusterSettings

        if data is None:
            raise ValueError("cluster: the k8s runtime needs its settings (at least cluster.image)")
        try:
            return ClusterSettings.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(x) for x in err["loc"])
            where = f"cluster.{loc}" if loc else "cluster"
            raise ValueError(f"{where}: {err['msg'].removeprefix('Value error, ')}") from None

    def setup_steps(self) -> list[Any]:
        from harness.setup import AptStep

        from . import node_stack
        from .stack import step

        # openssl makes the test cluster's certificates (runtimes/k8s/cluster.py); k8s-node (a real
        # kubelet, containerd, Chaos Mesh's controller and daemon: realnode.py) is optional: only
        # `pdchaos setup --only k8s-node` builds it, `--all` only checks it
        return [AptStep("openssl", "openssl", ("openssl",)), step(), node_stack.step()]

    def translates(self, fault_type: str) -> bool:
        return fault_type in TRANSLATED

    def refuses(self, fault_types, needs, profile: Any = None, scenario: Any = None) -> str | None:
        needs = dict(needs)
        settings = getattr(profile, "cluster", None)
        if scenario is not None and settings is not None:  # each Chaos Mesh object must fit this run's roles
            from .manifests import chaos_object, why_not

            roles = list(scenario.family.roles(scenario.model, profile) or [])
            for i, f in enumerate(scenario.faults):
                params = f.model_dump(mode="json", exclude={"type", "at"}, by_alias=True)
                reason = why_not(f.type, params, settings)
                if reason:
                    return f"runtime k8s: fault {f.type!r}: {reason}"
                if self.translates(f.type) and chaos_object(f.type, params, roles, "plan", settings, i) is None:
                    return (f"runtime k8s: fault {f.type!r} has no Chaos Mesh object for this scenario "
                            f"(its roles {', '.join(roles) or 'none'}, or parameters Chaos Mesh cannot carry out)")
        if settings is not None and settings.mode == "attach":  # never delete a user's pod or workload
            for t, req in needs.items():
                if "node_address" in req:
                    return (f"runtime k8s, attach mode: fault {t!r} runs pd-chaos's code beside a node, in its "
                            "pod, and the user's pods have no pd-chaos in them")
                # node_down deletes the workload, kill the pod (a PodChaos pod-kill); restart (the
                # container SIGKILLed, the kubelet starting it again in its pod) and freeze act inside it
                bad = [r for r in req if r in ("stop", "kill")]
                if t != "topology" and bad:
                    return (f"runtime k8s, attach mode: fault {t!r} would delete a pod or workload of the user's "
                            "deployment, and attach mode deletes nothing it did not create (`restart` kills "
                            "the serving container in its pod instead)")
        topo = set(needs.pop("topology", ()))
        topo.discard("root")  # the harness makes no namespace or rule on this machine
        if "toxiproxy" in topo:  # a Toxiproxy link stands in front of one port of a node (P's bootstrap server)
            toxics = [t for t, req in needs.items() if "toxiproxy" in req]
            if toxics:
                return (f"runtime k8s: fault {toxics[0]!r} is a Toxiproxy toxic on one link (one port of a node); "
                        "Chaos Mesh's NetworkChaos selects pods, not ports, so it would slow or cut all of "
                        "that pod's traffic: another fault")
            topo.discard("toxiproxy")
        return super().refuses(fault_types, {"topology": tuple(topo), **needs})

    def open(self, run_id: str, profile: Any = None, target: str | None = None) -> Placement:
        from .placement import K8sPlacement

        settings = getattr(profile, "cluster", None)
        if settings is None:
            raise HarnessError("runtime k8s: the launch profile has no cluster settings")
        kubeconfig = os.environ.get(KUBECONFIG_ENV) or None
        if settings.mode == "attach":
            from .attach import AttachPlacement

            placement = AttachPlacement(run_id, settings, kubeconfig=kubeconfig)
        else:
            placement = K8sPlacement(run_id, settings, kubeconfig=kubeconfig)
        placement.target = target
        return placement

    def doctor(self, profile: Any = None) -> list[tuple[str, bool, str, str]]:
        from .checks import doctor

        return doctor(getattr(profile, "cluster", None), os.environ.get(KUBECONFIG_ENV) or None)

    def clean(self, profile: Any = None) -> tuple[list[str], list[str]]:
        from .checks import clean

        return clean(getattr(profile, "cluster", None), os.environ.get(KUBECONFIG_ENV) or None)

    def describe(self, run_id: str, target: str, launches: list[Launch], faults: list[tuple[str, dict]],
                 profile: Any = None) -> str | None:
        from .placement import render_run

        return render_run(run_id, target, launches, faults, getattr(profile, "cluster", None))


RUNTIME = K8sRuntime()

__all__ = ["RUNTIME", "K8sRuntime", "NodeHandle"]
