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
    return out


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
