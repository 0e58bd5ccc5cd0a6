"""A node as a pod: the handle the topology, the faults and the checks hold (harness/runtime.py).

``instance`` is the pod's uid (a new one per start); ``alive`` is the pod running and not being
deleted; ``stop`` deletes the role's workload (no replacement comes) and waits the pod out;
``kill`` deletes the pod at once (grace 0) and its workload; ``freeze``/``thaw`` run
``kill -STOP -1`` / ``kill -CONT -1`` in the container through exec (every process but the
container's first, the small shell that started the node: manifests.ENTRY), as NVIDIA Dynamo's
fault-tolerance suite stalls processes. Logs come from the API (the container's log).
"""

from __future__ import annotations

from typing import Any

from harness.errors import HarnessError
from harness.runtime import NodeHandle

from .client import Kube, KubeError

STOP_TIMEOUT_S = 60.0


def pod_ready(pod: dict) -> bool:
    st = pod.get("status") or {}
    if st.get("phase") != "Running" or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])


class PodHandle(NodeHandle):
    def __init__(self, kube: Kube, pod: dict, workload: dict, name: str, log_path: str | None = None) -> None:
        self.kube, self.workload, self.name = kube, workload, name
        meta = pod["metadata"]
        self.pod_name, self.namespace, self._uid = meta["name"], meta["namespace"], meta["uid"]
        self.log_path = log_path
        self._ended = False

    @property
    def instance(self) -> str:
        return self._uid

    def _pod(self) -> dict | None:
        try:
            pod = self.kube.get("v1", "Pod", self.pod_name, self.namespace)
        except KubeError:
            return None  # the API server is gone: the node cannot be seen alive
        return pod if pod and pod["metadata"]["uid"] == self._uid else None

    @property
    def alive(self) -> bool:
        if self._ended:
            return False
        pod = self._pod()
        return bool(pod) and (pod.get("status") or {}).get("phase") in ("Pending", "Running") \
            and not pod["metadata"].get("deletionTimestamp")

    def _delete_workload(self) -> None:
        w = self.workload
        self.kube.delete(w["apiVersion"], w["kind"], w["metadata"]["name"], w["metadata"]["namespace"])

    def _wait_gone(self, timeout_s: float) -> None:
        uid = self._uid
        self.kube.wait("v1", "Pod", self.namespace,
                       lambda items: not any(i["metadata"]["uid"] == uid for i in items),
                       timeout_s, f"pod {self.pod_name} gone")

    def _end(self, grace_s: int) -> None:
        """Delete the workload (no replacement comes) and the pod, and see it gone. Only then is the
        handle ended: a delete the API refused, or a pod that outlives the wait, leaves the handle
        asking the API, so ``alive`` stays true and a fault that meant to end it shows no effect."""
        self._save_log()
        try:
            self._delete_workload()
            self.kube.delete("v1", "Pod", self.pod_name, self.namespace, grace_s=grace_s)
            self._wait_gone(STOP_TIMEOUT_S)
        except KubeError:
            return  # never raises: the namespace's deletion at the end of the run removes what is left
        self._ended = True

    def stop(self, timeout_s: float = 5.0) -> int | None:
        if not self._ended:
            self._end(max(0, int(timeout_s)))
        return None

    def kill(self) -> int | None:
        if not self._ended:
            self._end(0)
        return None

    def _save_log(self) -> None:
        """The container's log into the run folder (``log_path``) before the pod goes, so the
        checks that read every node's log (log_hygiene) read this one too."""
        if not self.log_path:
            return
        from kubernetes import client

        try:
            text = client.CoreV1Api(self.kube.api).read_namespaced_pod_log(
                self.pod_name, self.namespace, container="node", _request_timeout=30)
        except Exception:  # noqa: BLE001 - no log served (a simulated node, a pod gone): none is written
            return
        if isinstance(text, str):
            with open(self.log_path, "a", encoding="utf-8", errors="replace") as fh:
                fh.write(text)

    def _exec(self, script: str, timeout_s: float = 15.0) -> str:
        """Run ``script`` in the node's container; its stdout. The exec's status channel is read:
        a command that failed, or an exec the kubelet could not make, is one error, never an
        empty answer taken for success."""
        import json

        from kubernetes import client
        from kubernetes.stream import stream

        what = f"{self.name}: exec in pod {self.pod_name}"
        try:
            ws = stream(client.CoreV1Api(self.kube.api).connect_get_namespaced_pod_exec, self.pod_name,
                        self.namespace, container="node", command=["sh", "-c", script], stderr=True,
                        stdin=False, stdout=True, tty=False, _preload_content=False, _request_timeout=timeout_s)
            try:
                ws.run_forever(timeout=timeout_s)
                out, status = ws.read_stdout() or "", ws.read_channel(3) or ""
            finally:
                ws.close()
        except Exception as exc:  # noqa: BLE001 - one line: the pod cannot be exec'd into
            raise HarnessError(f"{what} failed: {type(exc).__name__}: "
                               f"{str(exc).splitlines()[0][:200] if str(exc) else ''}") from None
        try:
            st = json.loads(status) if status else {}
        except ValueError:
            st = {}
        if st.get("status") != "Success":
            raise HarnessError(f"{what} failed: {(st.get('message') or 'no exit status from the kubelet')[:200]}")
        return out

    def freeze(self) -> bool | None:
        # state T seen in /proc (no ps needed in a slim image); "?" when /proc cannot be read
        out = self._exec("kill -STOP -1; sleep 0.2; n=0; for f in /proc/[0-9]*/stat; do "
                         "s=$(cut -d')' -f2 \"$f\" 2>/dev/null | cut -d' ' -f2); [ \"$s\" = T ] && n=$((n+1)); done; "
                         "echo \"$n\"")
        try:
            return int(out.strip().splitlines()[-1]) > 0
        except (ValueError, IndexError):
            return None

    def thaw(self) -> None:
        if not self.alive:  # nothing left to thaw (the pod is gone)
            return
        self._exec("kill -CONT -1")

    def log_tail(self, n_bytes: int = 2000) -> str:
        from kubernetes import client

        try:
            text = client.CoreV1Api(self.kube.api).read_namespaced_pod_log(
                self.pod_name, self.namespace, container="node", limit_bytes=n_bytes, _request_timeout=10)
        except Exception:  # noqa: BLE001 - no log to show (the pod is gone, or a simulated node)
            return ""
        return text if isinstance(text, str) else ""


UNSCHEDULABLE_GRACE_S = 20.0


def ready_pod(kube: Kube, namespace: str, selector: str, timeout_s: float, what: str,
              not_uid: str | None = None, cancel: Any = None) -> dict:
    """The first ready pod of ``selector`` (another than ``not_uid``), within ``timeout_s``. A pod
    the scheduler keeps refusing (a claim that does not exist, resources no node has) is one error
    with the scheduler's reason after a short grace, not a wait to the deadline."""
    import time

    since: dict[str, float] = {}

    def found(items: list[dict]) -> Any:
        for p in items:
            if p["metadata"]["uid"] == not_uid:
                continue
            if pod_ready(p):
                return p
            cond = next((c for c in (p.get("status") or {}).get("conditions") or []
                         if c.get("type") == "PodScheduled" and c.get("status") == "False"), None)
            if cond and cond.get("reason") == "Unschedulable":
                first = since.setdefault(p["metadata"]["uid"], time.monotonic())
                if time.monotonic() - first > UNSCHEDULABLE_GRACE_S:
                    raise HarnessError(f"{what}: pod {p['metadata']['name']} cannot be scheduled: "
                                       f"{(cond.get('message') or '')[:300]}")
        return None

    return kube.wait("v1", "Pod", namespace, found, timeout_s, what, selector=selector, cancel=cancel)
