"""The Kubernetes API, through the official ``kubernetes`` client: server-side apply, watches with
deadlines, deletion by label, and one clear error per failure (never a client traceback).

Everything the k8s runtime does to a cluster goes through :class:`Kube`; nothing shells out to
kubectl. Every call has a timeout (``_request_timeout``), every wait a deadline.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from harness.errors import HarnessError

from .manifests import MANAGED_BY, RUN_LABEL, dns_name

FIELD_MANAGER = "pd-chaos"
REQUEST_TIMEOUT_S = 15.0


class KubeError(HarnessError):
    """One line: what was asked, of which object, and what the API server said (or that it is gone)."""

    def __init__(self, msg: str, status: int | None = None) -> None:
        super().__init__(msg)
        self.status = status


def _what(obj: dict) -> str:
    meta = obj.get("metadata", {})
    where = f" in namespace {meta['namespace']}" if meta.get("namespace") else ""
    return f"{obj.get('kind', '?')} {meta.get('name', '?')}{where}"


def explain(exc: BaseException, doing: str) -> KubeError:
    """A client exception as one line. 403: the RBAC verb missing; 404 on a kind: its CRD is not
    installed; no connection: the API server is gone."""
    from kubernetes.client.exceptions import ApiException
    from kubernetes.dynamic.exceptions import DynamicApiError, ResourceNotFoundError

    if isinstance(exc, ResourceNotFoundError):
        return KubeError(f"{doing}: the cluster has no such kind (is its CRD installed? `pdchaos doctor --profile k8s`)",
                         404)
    status = getattr(exc, "status", None)
    if isinstance(exc, (ApiException, DynamicApiError)) and status:
        reason = getattr(exc, "reason", "") or ""
        body = getattr(exc, "body", "") or ""
        msg = ""
        try:
            import json

            msg = json.loads(body).get("message", "") if body else ""
        except (ValueError, AttributeError):
            msg = ""
        if status == 403:
            return KubeError(f"{doing}: forbidden by RBAC (403): {msg or reason} "
                             "(the harness's role: runtimes/k8s/rbac.yaml)", 403)
        return KubeError(f"{doing}: API server answered {status} {reason}: {msg[:300]}".rstrip(": "), status)
    return KubeError(f"{doing}: the API server cannot be reached ({type(exc).__name__}: "
                     f"{str(exc).splitlines()[0][:200] if str(exc) else ''})")


EXTRA_HINT = "pip install -e '.[k8s]'"


def require_client() -> None:
    """The official Kubernetes client is an optional extra (``.[k8s]``): a user who never touches a
    cluster does not install it. Its absence is one line naming the extra, never an ImportError."""
    try:
        import kubernetes  # noqa: F401
    except ImportError:
        raise KubeError(f"runtime k8s: the official Kubernetes client is not installed ({EXTRA_HINT}, "
                        "or pip install 'kubernetes>=33')") from None


class Kube:
    """One cluster, from a kubeconfig file (None: the default one, or in-cluster config)."""

    def __init__(self, kubeconfig: str | None = None, context: str | None = None) -> None:
        require_client()
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException

        try:
            if kubeconfig is None and _in_cluster():
                config.load_incluster_config()
                self.api = client.ApiClient()
            else:
                self.api = config.new_client_from_config(config_file=kubeconfig, context=context)
        except (ConfigException, OSError, TypeError, ValueError) as exc:
            raise KubeError(f"kubeconfig {kubeconfig or '(default)'}: cannot be used: {exc}") from None
        self.kubeconfig = kubeconfig
        self._dyn = None

    # ------------------------------------------------------------------ plumbing
    @property
    def dyn(self):
        if self._dyn is None:
            from kubernetes.dynamic import DynamicClient

            try:
                self._dyn = DynamicClient(self.api)
            except Exception as exc:  # noqa: BLE001 - discovery failed: the server is gone or refuses
                raise explain(exc, "API discovery") from None
        return self._dyn

    def resource(self, api_version: str, kind: str):
        try:
            return self.dyn.resources.get(api_version=api_version, kind=kind)
        except Exception as exc:  # noqa: BLE001
            raise explain(exc, f"{kind} ({api_version})") from None

    def has_kind(self, api_version: str, kind: str) -> bool:
        try:
            self.resource(api_version, kind)
            return True
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise

    def version(self) -> str:
        from kubernetes import client

        try:
            return client.VersionApi(self.api).get_code(_request_timeout=REQUEST_TIMEOUT_S).git_version
        except Exception as exc:  # noqa: BLE001
            raise explain(exc, "API server version") from None

    # ------------------------------------------------------------------ objects
    def apply(self, obj: dict, dry_run: bool = False) -> dict:
        """Server-side apply (create or update, owned by field manager ``pd-chaos``). With
        ``dry_run`` the server validates it against its schema and admission and stores nothing."""
        res = self.resource(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        kw: dict[str, Any] = {"field_manager": FIELD_MANAGER, "force_conflicts": True,
                              "_request_timeout": REQUEST_TIMEOUT_S}
        if dry_run:
            kw["dry_run"] = "All"
        try:
            out = res.server_side_apply(body=obj, name=meta["name"], namespace=meta.get("namespace"), **kw)
        except Exception as exc:  # noqa: BLE001
            raise explain(exc, ("dry run of " if dry_run else "apply ") + _what(obj)) from None
        return out.to_dict()

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict | None:
        res = self.resource(api_version, kind)
        try:
            return res.get(name=name, namespace=namespace, _request_timeout=REQUEST_TIMEOUT_S).to_dict()
        except Exception as exc:  # noqa: BLE001
            if getattr(exc, "status", None) == 404:
                return None
            raise explain(exc, f"get {kind} {name}") from None

    def list(self, api_version: str, kind: str, namespace: str | None = None, selector: str | None = None) -> list[dict]:
        res = self.resource(api_version, kind)
        try:
            out = res.get(namespace=namespace, label_selector=selector, _request_timeout=REQUEST_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001
            raise explain(exc, f"list {kind}" + (f" in {namespace}" if namespace else "")) from None
        return [i.to_dict() for i in out.items]

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None,
               grace_s: int | None = None) -> bool:
        """Delete (foreground for owners); False when it was not there."""
        res = self.resource(api_version, kind)
        body = {"propagationPolicy": "Background"}
        if grace_s is not None:
            body["gracePeriodSeconds"] = grace_s
        try:
            res.delete(name=name, namespace=namespace, body=body, _request_timeout=REQUEST_TIMEOUT_S)
            return True
        except Exception as exc:  # noqa: BLE001
            if getattr(exc, "status", None) == 404:
                return False
            raise explain(exc, f"delete {kind} {name}") from None

    def wait(self, api_version: str, kind: str, namespace: str | None, until: Callable[[list[dict]], Any],
             timeout_s: float, what: str, selector: str | None = None, cancel: Any = None) -> Any:
        """Watch the objects of ``kind`` (by ``selector``) until ``until(items)`` is truthy; its value.
        A list, then a watch from that list's version; each watch ends within the deadline, and
        within 2 s when ``cancel`` (an Event: the run was interrupted) may end the wait early."""
        from kubernetes import watch

        res = self.resource(api_version, kind)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                got = res.get(namespace=namespace, label_selector=selector, _request_timeout=REQUEST_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001
                raise explain(exc, f"watch {kind} ({what})") from None
            items = {i.metadata.name: i.to_dict() for i in got.items}
            value = until(list(items.values()))
            if value:
                return value
            left = deadline - time.monotonic()
            if cancel is not None and cancel.is_set():
                raise KubeError(f"{what}: interrupted")
            if left <= 0:
                raise KubeError(f"{what}: not within {timeout_s:g} s")
            w = watch.Watch()
            try:
                chunk = max(1, int(min(left, 2 if cancel is not None else 30)))
                # the server ends the watch after `chunk` s; the client's own read timeout ends it
                # too when a server stops answering without closing the connection
                for ev in w.stream(res.get, namespace=namespace, label_selector=selector,
                                   resource_version=got.metadata.resourceVersion, timeout_seconds=chunk,
                                   serialize=False, _request_timeout=(5, chunk + 5)):
                    d = ev.get("raw_object") or (ev.get("object") if isinstance(ev.get("object"), dict) else {}) or {}
                    name = (d.get("metadata") or {}).get("name")
                    if ev["type"] == "ERROR":  # e.g. 410 Gone: the version is too old, list again
                        break
                    if ev["type"] == "DELETED":
                        items.pop(name, None)
                    elif name:
                        items[name] = d
                    value = until(list(items.values()))
                    if value:
                        return value
                    if time.monotonic() >= deadline or (cancel is not None and cancel.is_set()):
                        break
            except Exception as exc:  # noqa: BLE001 - a watch that broke: list again (or give up below)
                if time.monotonic() >= deadline:
                    raise explain(exc, f"watch {kind} ({what})") from None
                if getattr(exc, "status", None) not in (None, 410):
                    raise explain(exc, f"watch {kind} ({what})") from None
                time.sleep(0.2)
            finally:
                w.stop()

    # ------------------------------------------------------------------ runs
    def run_namespaces(self, run_id: str | None = None, with_meta: bool = False) -> list:
        """The namespaces pd-chaos made (of one run): names, or with ``with_meta`` their metadata."""
        sel = ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())
        if run_id is not None:
            sel += f",{RUN_LABEL}={dns_name(run_id)}"
        items = self.list("v1", "Namespace", selector=sel)
        return [n["metadata"] if with_meta else n["metadata"]["name"] for n in items]

    def delete_namespace(self, name: str, timeout_s: float = 60.0) -> None:
        """Delete a namespace the harness made, and wait until it is gone."""
        if not self.delete("v1", "Namespace", name):
            return
        self.wait("v1", "Namespace", None, lambda items: not any(i["metadata"]["name"] == name for i in items),
                  timeout_s, f"namespace {name} deleted")


def _in_cluster() -> bool:
    import os

    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(
        "/var/run/secrets/kubernetes.io/serviceaccount/token")
