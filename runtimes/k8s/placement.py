"""One scenario run on a cluster: its namespace, its nodes' workloads, its Chaos Mesh objects.

Nothing touches the cluster before the first node starts (``--dry-run`` and the planner build
placements freely); the namespace is made then, and deleted with everything in it at
:meth:`K8sPlacement.close` (the namespace carries the run's label, so ``pdchaos clean`` finds it
after a killed run).
"""

from __future__ import annotations

import threading
from typing import Any

import yaml

from harness.errors import HarnessError
from harness.runtime import Launch, NodeHandle, Placement

from . import manifests as M
from .settings import ClusterSettings

NAMESPACE_DELETE_TIMEOUT_S = 120.0


class K8sPlacement(Placement):
    harness_links = False  # the pods' network is the link; Chaos Mesh cuts it
    shared_host = False  # each pod is a host of its own: nothing pins cores
    lends_nodes = False  # the run's namespace goes at its end, and its pods with it
    pids_unique = False  # each pod numbers its own processes: the journal names a node's process by its pod
    control_grace_s = 10.0  # a first control call opens a port-forward through the API server and the kubelet

    def __init__(self, run_id: str, settings: ClusterSettings, kubeconfig: str | None = None,
                 kube: Any = None) -> None:
        self.run_id, self.settings, self.kubeconfig = run_id, settings, kubeconfig
        self.shared_host = settings.shared_host  # a single-node cluster on this machine shares its cores
        self.namespace = M.namespace_name(settings, run_id)
        self._kube = kube
        self._made_ns = False
        self._lws: bool | None = None
        self._lock = threading.Lock()
        self._forwards = None
        self.handles: list = []  # every pod started: their logs are saved at close
        self.target: str | None = None

    @property
    def kube(self):
        if self._kube is None:
            from .client import Kube

            self._kube = Kube(self.kubeconfig)
        return self._kube

    def uses_lws(self) -> bool:
        if self.settings.workload != "auto":
            return self.settings.workload == "lws"
        if self._lws is None:
            self._lws = self.kube.has_kind(M.LWS_API, "LeaderWorkerSet")
        return self._lws

    def _ensure_namespace(self) -> None:
        with self._lock:
            if not self._made_ns:
                from .client import KubeError

                try:
                    ns = M.namespace(self.settings, self.run_id)
                    ns["metadata"]["annotations"] = {M.RUNNER_ANNOTATION: M.runner_id()}
                    self.kube.apply(ns)
                except KubeError as exc:
                    self._made_ns = exc.status is None  # no answer: it may exist, so close() tries to remove it
                    raise
                self._made_ns = True
                self.kube.apply(M.service_account(self.settings, self.run_id))

    # ------------------------------------------------------------------ nodes
    def objects(self, launch: Launch) -> list[dict]:
        return M.workload(self.settings, self.run_id, self.target or "", launch.role, launch.kind, launch.argv,
                          launch.env, launch.endpoints, launch.workdir, self.uses_lws())

    def start(self, launch: Launch, netns: Any = None) -> NodeHandle:
        from .pods import PodHandle, ready_pod

        if netns is not None:
            raise HarnessError("runtime k8s: a network-namespace pair cannot hold pods")
        self._ensure_namespace()
        objs = self.objects(launch)
        for h in self.handles:  # the role's earlier pod, kept by a stop (its address): it goes now
            if h.workload.get("metadata", {}).get("name") == objs[0]["metadata"]["name"]:
                h.end_kept()
        for obj in objs:
            self.kube.apply(obj)
        selector = self.selector(launch.role)
        # a cluster schedules and pulls images: its own bound, never shorter than the node's
        timeout = max(float(launch.ready_timeout_s or 0.0), self.settings.ready_timeout_s)
        try:
            pod = ready_pod(self.kube, self.namespace, selector, timeout, f"{launch.name} ({launch.role}) ready",
                            cancel=self.cancel, pending_s=self.settings.start_fail_s)
        except HarnessError:
            self._save_failed_logs(launch, selector)  # why it did not come up: its log, before it goes
            for obj in objs:  # nothing of a node that did not come up is left running
                try:
                    self.kube.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"], self.namespace)
                except HarnessError:
                    pass
            raise
        # where peers dial a node's pod address, a stop keeps the pod (pods.py): a deleted pod's
        # address blackholes, where a stopped node's ports refuse (locally, or a Service's)
        handle = PodHandle(self.kube, pod, objs[0], launch.name, log_path=launch.log_path, container=M.CONTAINER,
                           keep_pod=self.settings.peers == "pod-ip")
        self.handles.append(handle)
        return handle

    def _save_failed_logs(self, launch: Launch, selector: str) -> None:
        from .pods import PodHandle

        if not launch.log_path:
            return
        try:
            pods = self.kube.list("v1", "Pod", namespace=self.namespace, selector=selector)
        except HarnessError:
            return
        for p in pods:  # a handle only to read its logs (no follower)
            PodHandle(self.kube, p, {}, launch.name, log_path=launch.log_path, container=M.CONTAINER,
                      follow=False).save_log()

    def host(self, role: str) -> str | None:
        if self.settings.peers == "pod-ip" and self._kube is not None:
            ip = self.pod_ip(role)
            if ip:
                return ip
        return f"{M.dns_name(role)}.{self.namespace}.svc"

    def pod_ip(self, role: str) -> str | None:
        """The address of ``role``'s ready pod, or None (none is ready, or none was started)."""
        from .pods import pod_ready

        if not self._made_ns:
            return None
        try:
            pods = self.kube.list("v1", "Pod", namespace=self.namespace, selector=self.selector(role))
        except HarnessError:
            return None
        ready = [p for p in pods if pod_ready(p)]
        return ((ready[0].get("status") or {}).get("podIP") or None) if ready else None

    def bind_address(self, role: str) -> str | None:
        # every address of the pod: peers come to its own, port-forwards (the kubelet dials the
        # pod's localhost) to its loopback
        return "0.0.0.0"

    def advertise_address(self, role: str) -> str | None:
        # the pod's own address (the downward API's status.podIP, expanded by the kubelet in the
        # container's args): VLLM_HOST_IP, a fake peer's side channel
        return M.POD_IP_ARG

    def selector(self, role: str) -> str:
        return f"{M.RUN_LABEL}={M.dns_name(self.run_id)},{M.ROLE_LABEL}={M.dns_name(role)}"

    @property
    def forwards(self):
        """Port-forwards through the API server (forward.py): made at the first use."""
        with self._lock:
            if self._forwards is None:
                from .forward import Forwards

                self._forwards = Forwards(lambda: self.kube, self.namespace, self.selector)
            return self._forwards

    def control_endpoint(self, role: str) -> str | None:
        # the node binds its control channel on the pod's port (manifests.pod_argv); the harness
        # reaches it through a port-forward on this machine's loopback
        return f"tcp://127.0.0.1:{self.forwards.local_port(role, self.settings.control_port)}"

    def reach(self, role: str, url: str) -> str:
        return self.forwards.url(role, url)

    def _beside(self, role: str, module: str, args: list[str], what: str) -> tuple[str, list[str]]:
        """The role's ready pod and the command that runs ``python -m MODULE ARGS`` there, with the
        interpreter its node runs under (pd-chaos installed)."""
        import sys

        from .pods import pod_ready

        try:
            pods = [p for p in self.kube.list("v1", "Pod", namespace=self.namespace, selector=self.selector(role))
                    if pod_ready(p)]
        except HarnessError as exc:
            raise HarnessError(f"{what} {role}: {exc}") from None
        if not pods:
            raise HarnessError(f"{what} {role}: no ready pod of the role")
        python = sys.executable if self.settings.python == "same" else self.settings.python
        return pods[0]["metadata"]["name"], [python, "-m", module, *args]

    def run_beside(self, role: str, module: str, args: list[str], timeout_s: float) -> str | None:
        from .pods import exec_in

        pod, argv = self._beside(role, module, args, "run beside")
        return exec_in(self.kube, self.namespace, pod, M.CONTAINER, argv, f"run beside {role} ({module})", timeout_s)

    def start_beside(self, role: str, module: str, args: list[str], timeout_s: float) -> Any | None:
        # as run_beside, kept running: an exec with its stdin open (pods.ExecSession)
        from .pods import ExecSession

        pod, argv = self._beside(role, module, args, "start beside")
        return ExecSession(self.kube, self.namespace, pod, M.CONTAINER, argv, f"beside {role} ({module})", timeout_s)

    # ------------------------------------------------------------------ faults
    def wrap_fault(self, fault: Any, spec: Any, index: int = 0) -> Any:
        if spec.type not in M.TRANSLATED:
            return fault
        from .chaos import ChaosMeshFault

        params = spec.model_dump(mode="json", exclude={"type", "at"}, by_alias=True)  # "for": the duration's floor

        def manifest() -> dict:  # named by its place in the schedule, as the dry run names it
            obj = M.chaos_object(spec.type, params, list(fault.ctx.nodes), self.run_id, self.settings,
                                 index, self.target)
            if obj is None:
                raise HarnessError(f"fault {spec.type}: no Chaos Mesh object fits this run's roles")
            return obj

        return ChaosMeshFault(fault, manifest, self.kube_lazy, probe_port=self.settings.control_port,
                              container=M.CONTAINER)

    def kube_lazy(self):
        self._ensure_namespace()
        return self.kube

    # ------------------------------------------------------------------ teardown
    def close(self) -> list[str]:
        for h in self.handles:  # every container's log, current and previous, before the namespace goes
            h.save_log()
        if self._forwards is not None:
            self._forwards.close()
        if not self._made_ns:
            return []
        try:
            self.kube.delete_namespace(self.namespace, NAMESPACE_DELETE_TIMEOUT_S)
        except HarnessError as exc:
            return [f"namespace {self.namespace} ({exc}); `pdchaos clean --profile k8s` removes it"]
        self._made_ns = False
        return []


def render_run(run_id: str, target: str, launches: list[Launch], faults: list[tuple[str, dict]],
               settings: ClusterSettings | None) -> str:
    """The objects of one planned run as YAML documents, each fault said (``--dry-run``)."""
    if settings is None:
        raise HarnessError("runtime k8s: the launch profile has no cluster settings")
    lws = settings.workload in ("auto", "lws")
    out = [f"# namespace {M.namespace_name(settings, run_id)}; vLLM roles as "
           + ("LeaderWorkerSets" + (" (auto: Deployments where the LeaderWorkerSet CRD is not installed)"
                                    if settings.workload == "auto" else "") if lws else "Deployments")]
    docs = [M.namespace(settings, run_id), M.service_account(settings, run_id)]
    for la in launches:
        docs += M.workload(settings, run_id, target, la.role, la.kind, la.argv, la.env, la.endpoints, la.workdir, lws)
    roles = [la.role for la in launches]
    notes = []
    for i, (ftype, params) in enumerate(faults):
        obj = M.chaos_object(ftype, params, roles, run_id, settings, i, target)
        if obj is not None:
            notes.append(f"# fault {i} {ftype}: Chaos Mesh {obj['kind']} {obj['metadata']['name']}")
            docs.append(obj)
        elif ftype == "stop":
            notes.append(f"# fault {i} {ftype}: exec in the pod of {params.get('node')}: kill -STOP -1, at heal kill -CONT -1")
        elif ftype in ("node_down",):
            notes.append(f"# fault {i} {ftype}: the workload of {params.get('node')} deleted, applied again at heal")
        else:
            notes.append(f"# fault {i} {ftype}: pd-chaos's own (its fake peers, proxy hooks or side channel), "
                         "through the nodes' control channels or run in a pod beside a node")
    text = "\n".join(out + notes) + "\n"
    return text + "".join("---\n" + yaml.dump(d, Dumper=_NoAliases, sort_keys=False, width=120) for d in docs)


class _NoAliases(yaml.SafeDumper):
    """Every object written out in full (no ``&id001`` anchors for labels used twice)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def run_objects(run_id: str, target: str, launches: list[Launch], faults: list[tuple[str, dict]],
                settings: ClusterSettings) -> list[dict]:
    """The same objects as :func:`render_run`, as dicts (for a server-side dry run)."""
    text = render_run(run_id, target, launches, faults, settings)
    return [d for d in yaml.safe_load_all(text) if d]
