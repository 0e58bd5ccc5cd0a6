"""Attach mode (``pdchaos run ... --attach``): the user's own deployment, found by label selectors.

The profile's ``cluster.attach`` names a namespace and, per role, a label selector (``prefill:0:
role=prefill``). Each selector must pick exactly one ready pod, and no pod may serve two roles;
anything else is one clear error before the run starts. The harness then touches nothing it did
not create: the user's pods are never deleted or restarted (stop at teardown only lets go of
them; ``node_down`` and ``restart`` are refused before anything starts), faults reach them through
Chaos Mesh objects and exec; the harness's own pods (fake peers) and objects carry the run label
and are the only things it deletes, at the end of the run or by ``pdchaos clean``.
"""

from __future__ import annotations

from typing import Any

from harness.errors import HarnessError
from harness.runtime import Launch, NodeHandle

from . import manifests as M
from .pods import PodHandle, pod_ready
from .placement import K8sPlacement

OWN_KINDS = (("chaos-mesh.org/v1alpha1", "PodChaos"), ("chaos-mesh.org/v1alpha1", "NetworkChaos"),
             ("chaos-mesh.org/v1alpha1", "StressChaos"), ("apps/v1", "Deployment"),
             ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"), ("v1", "Service"), ("v1", "Pod"))


ROLE_LABELS = ("llm-d.ai/role", "role")  # llm-d's, then the plain one (SGLang's, vllm-ascend's examples)


def selectors_of(attach: Any, roles: list[str]) -> dict[str, list[str]]:
    """role -> the selectors to try, in order: the profile's, else the conventional role labels."""
    out = {r: [s] for r, s in attach.selectors.items()}
    for r in roles:
        if r not in out and M.role_class(r) in ("prefill", "decode"):
            out[r] = [f"{label}={M.role_class(r)}" for label in ROLE_LABELS]
    return out


def select(kube: Any, attach: Any, roles: list[str] | None = None,
           chosen: dict[str, str] | None = None) -> dict[str, dict]:
    """role -> the one ready pod its selector picks in the attach namespace (a role with no
    selector of its own: the first conventional role label that matches any pod); ``chosen``
    gets the selector that picked each."""
    picked: dict[str, dict] = {}
    owner: dict[str, str] = {}
    for role, candidates in selectors_of(attach, list(roles or [])).items():
        selector, pods = candidates[0], []
        for cand in candidates:
            pods = kube.list("v1", "Pod", namespace=attach.namespace, selector=cand)
            selector = cand
            if pods:
                break
        ready = [p for p in pods if pod_ready(p)]
        where = f"attach: role {role}: selector {selector!r} in namespace {attach.namespace}"
        if not ready:
            raise HarnessError(f"{where} matches no ready pod ({len(pods)} pod(s) match, none ready)")
        if len(ready) > 1:
            raise HarnessError(f"{where} matches {len(ready)} ready pods: a node is one pod, narrow the selector")
        uid = ready[0]["metadata"]["uid"]
        if uid in owner:
            raise HarnessError(f"{where} picks pod {ready[0]['metadata']['name']}, already the node of role {owner[uid]}")
        owner[uid] = role
        picked[role] = ready[0]
        if chosen is not None:
            chosen[role] = selector
    return picked


class AttachedPod(PodHandle):
    """A pod of the user's: the harness lets go of it, never deletes it."""

    def stop(self, timeout_s: float = 5.0) -> int | None:
        if not self._ended:
            self._save_log()  # read only: what the node logged during the run
        self._ended = True  # detached: the pod runs on, as the user left it
        return None

    def kill(self) -> int | None:
        # refused before the run (attach mode deletes no pod of the user's; ``restart`` kills its
        # container instead): reaching here is a harness error, and the pod is left alone (the
        # fault then shows no effect)
        return None

    @property
    def alive(self) -> bool:
        return not self._ended and super().alive


def delete_own(kube: Any, namespace: str, selector: str) -> tuple[list[str], list[str]]:
    """Delete the harness's own objects (``selector``: its labels) in the user's namespace."""
    removed, left = [], []
    for api, kind in OWN_KINDS:
        try:
            if not kube.has_kind(api, kind):
                continue
            items = kube.list(api, kind, namespace=namespace, selector=selector)
        except HarnessError as exc:
            left.append(f"{kind} in {namespace}: {exc}")
            continue
        for it in items:
            name = it["metadata"]["name"]
            try:
                if kube.delete(api, kind, name, namespace, grace_s=0 if kind == "Pod" else None):
                    removed.append(f"{kind} {name} in {namespace}")
            except HarnessError as exc:
                left.append(f"{kind} {name} in {namespace}: {exc}")
    return removed, left


class AttachPlacement(K8sPlacement):
    """One run against the user's deployment in ``attach.namespace``."""

    def __init__(self, run_id: str, settings: Any, kubeconfig: str | None = None, kube: Any = None) -> None:
        super().__init__(run_id, settings, kubeconfig, kube)
        self.attach = settings.attach
        self.namespace = self.attach.namespace  # the harness's own objects go there too
        self._picked: dict[str, dict] | None = None
        self._chosen: dict[str, str] = {}  # role -> the selector that picked its pod
        self._own = False
        self._attached: set[str] = set()

    def picked(self) -> dict[str, dict]:
        if self._picked is None:
            # the vLLM roles found by their conventional labels where the profile names no selector
            self._picked = select(self.kube, self.attach, ["prefill:0", "decode:0"], self._chosen)
        return self._picked

    def container_of(self, pod: dict) -> str:
        """The user's serving container: the profile's ``attach.container``, else the pod's first."""
        return self.attach.container or pod["spec"]["containers"][0]["name"]

    def existing(self, role: str) -> dict[str, int] | None:
        """The ports the user's pod of ``role`` serves: the profile's ``attach.ports`` for the role,
        else the named ports its serving container declares (``http``, ``bootstrap``, ...)."""
        pod = self.picked().get(role)
        if pod is None:
            return None  # a node of the harness's own
        if role in self.attach.ports:
            return dict(self.attach.ports[role])
        container = self.container_of(pod)
        ports = {pt["name"]: int(pt["containerPort"])
                 for c in pod["spec"]["containers"] if c["name"] == container
                 for pt in c.get("ports") or [] if pt.get("name")}
        if "http" not in ports:
            raise HarnessError(f"attach: role {role}: pod {pod['metadata']['name']} names no port 'http' in container "
                               f"{container}: give its ports in the profile's cluster.attach.ports.{role}")
        return ports

    def control_endpoint(self, role: str) -> str | None:
        if role in self.picked():
            return None  # a user's pod has no control channel of the harness's: the family's stand-in, locally
        return super().control_endpoint(role)

    def selector(self, role: str) -> str:
        if self._picked is not None and role in self._picked:
            return self._chosen[role]  # the user's pod, by the selector that picked it
        return super().selector(role)

    def _ensure_namespace(self) -> None:
        self._own = True  # the user's namespace: nothing to make, only our own objects to remove

    def objects(self, launch: Launch) -> list[dict]:
        objs = super().objects(launch)
        for o in objs:
            o["metadata"]["namespace"] = self.namespace
            o["metadata"]["labels"].pop("role", None)  # the user's Services select role=...: never our pods
            spec = o.get("spec") or {}
            pod = (spec.get("template") or (spec.get("leaderWorkerTemplate") or {}).get("workerTemplate") or {})
            if pod.get("spec"):  # the namespace's own default ServiceAccount: nothing of ours to make there
                pod["spec"]["serviceAccountName"] = "default"
                pod["metadata"]["labels"].pop("role", None)
        return objs

    def start(self, launch: Launch, netns: Any = None) -> NodeHandle:
        pod = self.picked().get(launch.role)
        if pod is None:  # a node of the harness's own (a fake peer): a pod of its own, removed at close
            return super().start(launch, netns)
        if launch.role in self._attached:  # a restart or a swap (a fake peer in its place): not of a user's pod
            raise HarnessError(f"attach: role {launch.role} is the user's pod {pod['metadata']['name']}: attach mode "
                               "cannot replace or restart it")
        self._attached.add(launch.role)
        container = self.container_of(pod)  # the user's own container
        return AttachedPod(self.kube, pod, {}, f"{launch.name} (attached)", log_path=launch.log_path,
                           container=container)

    def host(self, role: str) -> str | None:
        pod = (self._picked or {}).get(role)
        if pod is not None:
            return (pod.get("status") or {}).get("podIP") or None
        return f"{M.dns_name(role)}.{self.namespace}.svc"

    def wrap_fault(self, fault: Any, spec: Any, index: int = 0) -> Any:
        wrapped = super().wrap_fault(fault, spec, index)
        if wrapped is not fault:  # Chaos Mesh selects the user's pods by their own labels, in their namespace
            build = wrapped._manifest

            def manifest() -> dict:
                obj = build()
                obj["metadata"]["namespace"] = self.namespace
                targets = _retarget(obj["spec"], self.namespace, self.picked(), self.run_id)
                if obj["spec"].get("containerNames"):  # a container-kill: the user's container, by its name
                    obj["spec"]["containerNames"] = sorted({self.container_of(self.picked()[r]) for r in targets})
                return obj

            wrapped._manifest = manifest
            # a partition's probe: from a user's pod, to the serving port of the pod across the cut
            wrapped.container = None  # each pod's own serving container (container_for)
            wrapped.container_for = lambda pod: self.container_of(pod)
            wrapped.probe_port_for = lambda pod: self._port_of(pod)
        return wrapped

    def _port_of(self, pod: dict) -> int | None:
        for role, p in self.picked().items():
            if p["metadata"]["uid"] == pod["metadata"]["uid"]:
                return (self.existing(role) or {}).get("http")
        return None

    def close(self) -> list[str]:
        if not self._own:
            return []
        _, left = delete_own(self.kube, self.namespace, f"{M.RUN_LABEL}={M.dns_name(self.run_id)}")
        self._own = bool(left)
        return left


def _retarget(spec: dict, namespace: str, picked: dict[str, dict], run_id: str) -> list[str]:
    """A Chaos Mesh selector written for a run namespace, rewritten for the user's pods: the roles
    it names become the pods attach mode picked for them, by name (Chaos Mesh's ``pods``
    selector). Returns the roles of the main selector."""
    by_dns = {M.dns_name(r): p["metadata"]["name"] for r, p in picked.items()}
    role_of = {M.dns_name(r): r for r in picked}
    main: list[str] = []
    for sel in [spec.get("selector"), (spec.get("target") or {}).get("selector")]:
        if not sel:
            continue
        roles = []
        if M.ROLE_LABEL in sel.get("labelSelectors", {}):
            roles = [sel["labelSelectors"][M.ROLE_LABEL]]
        for ex in sel.get("expressionSelectors", []):
            roles += ex.get("values", [])
        names = sorted(by_dns[r] for r in roles if r in by_dns)
        if len(names) != len(roles):
            raise HarnessError(f"attach: a Chaos Mesh selector names roles {roles} that are not all the user's pods")
        if sel is spec.get("selector"):
            main = [role_of[r] for r in roles]
        sel.clear()
        sel.update({"namespaces": [namespace], "pods": {namespace: names}})
    return main
