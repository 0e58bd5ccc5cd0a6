"""``pdchaos doctor --profile k8s`` and ``pdchaos clean --profile k8s``: what the cluster lacks,
one line each, and what killed runs left there.

The RBAC verbs checked are the rules of ``rbac.yaml`` beside this module (what is shipped is what
is checked), each by a SelfSubjectAccessReview for the user of the kubeconfig in use.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import yaml

from harness.errors import HarnessError

RBAC_FILE = Path(__file__).with_name("rbac.yaml")
CHAOS_KINDS = ("PodChaos", "NetworkChaos", "StressChaos")


def rbac_rules() -> list[dict]:
    docs = [d for d in yaml.safe_load_all(RBAC_FILE.read_text()) if d]
    return next(d for d in docs if d["kind"] == "ClusterRole")["rules"]


def _allowed(kube: Any, group: str, resource: str, verb: str) -> bool:
    from kubernetes import client

    sub = None
    if "/" in resource:
        resource, sub = resource.split("/", 1)
    review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
        resource_attributes=client.V1ResourceAttributes(group=group, resource=resource, subresource=sub, verb=verb)))
    out = client.AuthorizationV1Api(kube.api).create_self_subject_access_review(review, _request_timeout=10)
    return bool(out.status.allowed)


def doctor(settings: Any, kubeconfig: str | None) -> list[tuple[str, bool, str, str]]:
    from .client import Kube

    off = "runs under the k8s profile"
    try:
        kube = Kube(kubeconfig)
        version = kube.version()
    except HarnessError as exc:
        return [("k8s-api", False, str(exc), off + " (set PDCHAOS_KUBECONFIG, or a default kubeconfig)")]
    out = [("k8s-api", True, f"API server {version}", off)]
    for kind in CHAOS_KINDS:
        ok = kube.has_kind("chaos-mesh.org/v1alpha1", kind)
        out.append((f"crd-{kind.lower()}", ok, f"{kind} (chaos-mesh.org/v1alpha1) " + ("installed" if ok else "missing"),
                    f"faults carried out as {kind} objects (install Chaos Mesh's CRDs)"))
    lws = kube.has_kind("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
    out.append(("crd-leaderworkerset", lws, "LeaderWorkerSet " + ("installed" if lws else "missing"),
                "nothing: the vLLM roles run as Deployments instead"))
    denied = []
    try:
        for rule in rbac_rules():
            for group in rule["apiGroups"]:
                for res in rule["resources"]:
                    for verb in rule["verbs"]:
                        if not _allowed(kube, group, res, verb):
                            denied.append(f"{verb} {res}" + (f".{group}" if group else ""))
        out.append(("k8s-rbac", not denied, "every verb of runtimes/k8s/rbac.yaml allowed" if not denied else
                    f"denied: {', '.join(denied[:6])}" + (f" and {len(denied) - 6} more" if len(denied) > 6 else ""),
                    off + " (apply runtimes/k8s/rbac.yaml and use its ServiceAccount)"))
    except Exception as exc:  # noqa: BLE001 - one line: the review itself failed
        out.append(("k8s-rbac", False, f"cannot review access: {type(exc).__name__}", off))
    try:
        deps = kube.list("apps/v1", "Deployment", selector="app.kubernetes.io/name=chaos-mesh,"
                                                           "app.kubernetes.io/component=controller-manager")
        ready = [d for d in deps if ((d.get("status") or {}).get("readyReplicas") or 0) > 0]
        out.append(("chaos-mesh-controller", bool(ready),
                    f"{len(ready)} ready of {len(deps)} controller-manager Deployment(s)" if deps else "not found",
                    "Chaos Mesh objects are created but nothing injects them: every such window is a harness error"))
    except HarnessError as exc:
        out.append(("chaos-mesh-controller", False, str(exc), "faults carried out by Chaos Mesh"))
    out += trials(kube, settings)
    trial = next((o for o in out if o[0] == "chaos-mesh-trial"), None)
    if trial is not None and trial[1]:  # a controller that carried out the trial runs, Deployment or not
        out = [("chaos-mesh-controller", True, "it carried out the trial below (no Deployment: run another way)", o[3])
               if o[0] == "chaos-mesh-controller" and not o[1] else o for o in out]
    return out


PROBE_TIMEOUT_S = 90.0


def trials(kube: Any, settings: Any) -> list[tuple[str, bool, str, str]]:
    """What only trying shows, one line each: chaos-daemon runs; the model volume is there; the
    node image starts (a probe pod of the harness's own, with the profile's image and mounts, in a
    namespace made for it and deleted after); the harness reaches that pod (exec); and Chaos Mesh
    carries out a fault on it (a PodChaos container-kill the controller and daemon must inject: the
    container's restart count rises)."""
    import secrets
    import time

    from . import manifests as M
    from .client import KubeError
    from .pods import pod_ready, ready_pod

    off = "runs under the k8s profile"
    out = []
    what = "Chaos Mesh's network and container faults (the daemon on each node carries them out)"
    try:
        daemons = [p for p in kube.list("v1", "Pod", selector="app.kubernetes.io/component=chaos-daemon")
                   if pod_ready(p)]
        out.append(("chaos-daemon", bool(daemons), f"{len(daemons)} ready chaos-daemon pod(s)" if daemons else
                    "no ready pod labelled app.kubernetes.io/component=chaos-daemon", what))
    except HarnessError as exc:
        daemons = []
        out.append(("chaos-daemon", False, str(exc), what))
    if settings is None:
        return out
    if settings.model_cache_claim:
        ns = settings.namespace_prefix
        try:
            claims = kube.list("v1", "PersistentVolumeClaim", selector=None)
            bound = [c for c in claims if c["metadata"]["name"] == settings.model_cache_claim
                     and (c.get("status") or {}).get("phase") == "Bound"]
            out.append(("k8s-model-volume", bool(bound), f"PersistentVolumeClaim {settings.model_cache_claim} "
                        + ("bound" if bound else "missing or not bound"),
                        off + f" (create the claim {settings.model_cache_claim} with the model, in each run namespace "
                        f"{ns}-*, or use host_mounts on a single-node cluster)"))
        except HarnessError as exc:
            out.append(("k8s-model-volume", False, str(exc), off))
    run_id = f"doctor-{secrets.token_hex(3)}"
    ns = M.namespace_name(settings, run_id)
    argv = [settings.python, "-c", "import time; time.sleep(3600)"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "namespace": ns,
                                                          "labels": M.labels(run_id, "probe")},
           "spec": {**M.pod_spec(settings, "probe", "probe", argv, {}, {}, None), "serviceAccountName": "default"}}
    pod["spec"]["containers"][0]["args"] = argv if settings.python != "same" else ["python3", *argv[1:]]
    pod["spec"]["containers"][0].pop("readinessProbe", None)
    pod["spec"]["restartPolicy"] = "Always"
    made = False
    try:
        ns_obj = M.namespace(settings, run_id)
        ns_obj["metadata"]["annotations"] = {M.RUNNER_ANNOTATION: M.runner_id()}
        kube.apply(ns_obj)
        made = True
        # the namespace's default ServiceAccount comes from the controller-manager: wait for it
        kube.wait("v1", "ServiceAccount", ns, lambda items: any(i["metadata"]["name"] == "default" for i in items),
                  30.0, "default ServiceAccount")
        t0 = time.monotonic()
        kube.apply(pod)
        got = ready_pod(kube, ns, f"{M.RUN_LABEL}={M.dns_name(run_id)}", PROBE_TIMEOUT_S, "probe pod ready",
                        pending_s=settings.start_fail_s)
        out.append(("k8s-image", True, f"{settings.image} started in {time.monotonic() - t0:.1f} s", off))
    except HarnessError as exc:
        out.append(("k8s-image", False, str(exc), off + " (build and load the node image: docs/k8s.md)"))
        got = None
    if got is not None:
        from .pods import PodHandle

        h = PodHandle(kube, got, {}, "probe", container=M.CONTAINER)
        try:
            said = h._exec("echo reached").strip()
            out.append(("k8s-reach", said == "reached", "exec into the probe pod answered" if said == "reached"
                        else f"exec answered {said[:40]!r}", off + " (the harness execs to freeze and thaw nodes)"))
        except HarnessError as exc:
            out.append(("k8s-reach", False, str(exc), off + " (RBAC: get and create on pods/exec)"))
        if daemons:
            out.append(_chaos_trial(kube, ns, run_id))
        else:  # nothing could carry it out: said without waiting for it
            out.append(("chaos-mesh-trial", False, "not tried: no chaos-daemon runs",
                        "faults carried out by Chaos Mesh (every such window would be a harness error)"))
    if made:
        try:
            kube.delete_namespace(ns, 120.0)
        except KubeError as exc:
            out.append(("k8s-probe-cleanup", False, str(exc), f"nothing (remove namespace {ns} by hand)"))
    return out


def _chaos_trial(kube: Any, ns: str, run_id: str) -> tuple[str, bool, str, str]:
    """A PodChaos container-kill on the probe pod: injected, and the container restarted."""
    import time

    from . import manifests as M
    from .chaos import condition

    off = "faults carried out by Chaos Mesh (every such window would be a harness error)"
    obj = {"apiVersion": M.CHAOS_API, "kind": "PodChaos",
           "metadata": {"name": "probe-container-kill", "namespace": ns, "labels": M.labels(run_id)},
           "spec": {"action": "container-kill", "mode": "all", "containerNames": [M.CONTAINER],
                    "selector": {"namespaces": [ns], "labelSelectors": {M.RUN_LABEL: M.dns_name(run_id)}}}}
    t0 = time.monotonic()
    try:
        kube.apply(obj)
        kube.wait(M.CHAOS_API, "PodChaos", ns, lambda items: any(condition(i, "AllInjected") for i in items),
                  45.0, "probe PodChaos injected")

        def restarted(items: list[dict]) -> bool:
            return any(st.get("restartCount", 0) > 0 for p in items
                       for st in (p.get("status") or {}).get("containerStatuses") or [])

        kube.wait("v1", "Pod", ns, restarted, 45.0, "probe container restarted")
    except HarnessError as exc:
        return ("chaos-mesh-trial", False, str(exc), off)
    return ("chaos-mesh-trial", True, f"container-kill injected and the container restarted in "
            f"{time.monotonic() - t0:.1f} s", off)


def _alive(pid: int) -> bool:
    from .cli import _alive as alive  # one definition (a zombie is no live process)

    return alive(pid)


def clean(settings: Any, kubeconfig: str | None) -> tuple[list[str], list[str]]:
    """Delete every namespace pd-chaos made (its label), and in attach mode the harness's own
    objects in the attached namespace (nothing else there)."""
    from .client import Kube
    from .manifests import MANAGED_BY

    from .manifests import RUNNER_ANNOTATION

    kube = Kube(kubeconfig)
    removed, left = [], []
    host = socket.gethostname()
    for meta in kube.run_namespaces(with_meta=True):
        ns = meta["name"]
        runner = (meta.get("annotations") or {}).get(RUNNER_ANNOTATION, "")
        rhost, _, rpid = runner.partition("/")
        if rhost == host and rpid.isdigit() and _alive(int(rpid)):
            left.append(f"namespace {ns}: its run is still going (pid {rpid} here): not touched")
            continue
        if runner and rhost != host:
            left.append(f"namespace {ns}: made by a run on {rhost}, which this machine cannot see: "
                        "`pdchaos clean` there (or delete the namespace)")
            continue
        try:
            kube.delete_namespace(ns, 120.0)
            removed.append(f"namespace {ns}")
        except HarnessError as exc:
            left.append(f"namespace {ns}: {exc}")
    if settings is not None and settings.attach is not None:
        from .attach import delete_own

        done, failed = delete_own(kube, settings.attach.namespace, ",".join(f"{k}={v}" for k, v in MANAGED_BY.items()))
        removed += done
        left += failed
    return removed, left
