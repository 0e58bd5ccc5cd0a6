"""A STAND-IN for Chaos Mesh's controller, for the tests only (never shipped, never the real thing).

There is no container runtime on the test machines, so nothing can be injected for real. This
thread plays the controller's part of the API protocol only: for each Chaos Mesh object it sees in
one namespace it adds a finalizer and sets the ``AllInjected`` condition; when the object is being
deleted it sets ``AllRecovered`` and removes its finalizer, so the object goes. It never touches a
pod. What it proves: the harness creates, watches and deletes Chaos Mesh objects and takes its
fault windows from their conditions. What it cannot: that any fault had an effect on a pod.
"""

from __future__ import annotations

import threading
import time
from typing import Any

FINALIZER = "chaos-mesh.org/records"  # the name is the stand-in's choice: an object it holds until recovered
KINDS = ("PodChaos", "NetworkChaos", "StressChaos")
API = "chaos-mesh.org/v1alpha1"


def _cond(kind: str, status: str) -> dict:
    return {"type": kind, "status": status, "reason": "", "lastTransitionTime": None}


class ChaosMeshStandIn:
    """``with ChaosMeshStandIn(kube, namespace, inject_after_s=0.2):`` — polls every 0.1 s (a
    watch per kind would do the same; polling keeps the stand-in small)."""

    def __init__(self, kube: Any, namespace: str, inject_after_s: float = 0.2, inject: bool = True) -> None:
        self.kube, self.namespace, self.delay, self.inject = kube, namespace, inject_after_s, inject
        self.seen: dict[str, float] = {}
        self.injected: list[str] = []
        self.recovered: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chaos-mesh-standin", daemon=True)

    def __enter__(self) -> "ChaosMeshStandIn":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5.0)
        for kind in KINDS:  # let go of everything it holds: a namespace must be able to go
            try:
                for obj in self.kube.list(API, kind, namespace=self.namespace):
                    fins = obj["metadata"].get("finalizers") or []
                    if FINALIZER in fins:
                        self._finalizers(kind, obj, [f for f in fins if f != FINALIZER])
            except Exception:  # noqa: BLE001 - the namespace or the server is gone already
                continue

    def _status(self, kind: str, obj: dict, conditions: list[dict]) -> None:
        # Chaos Mesh's CRDs (at the pinned commit) declare no status subresource: the controller
        # writes status on the object itself
        res = self.kube.resource(API, kind)
        body = {"status": {"conditions": conditions, "experiment": {"desiredPhase": "Run"}}}
        res.patch(body=body, name=obj["metadata"]["name"], namespace=self.namespace,
                  content_type="application/merge-patch+json")

    def _finalizers(self, kind: str, obj: dict, finalizers: list[str]) -> None:
        res = self.kube.resource(API, kind)
        res.patch(body={"metadata": {"finalizers": finalizers}}, name=obj["metadata"]["name"],
                  namespace=self.namespace, content_type="application/merge-patch+json")

    def _loop(self) -> None:
        while not self._stop.is_set():
            for kind in KINDS:
                try:
                    items = self.kube.list(API, kind, namespace=self.namespace)
                except Exception:  # noqa: BLE001 - the namespace or the server went: try again
                    continue
                for obj in items:
                    key = f"{kind}/{obj['metadata']['name']}"
                    meta = obj["metadata"]
                    try:
                        if meta.get("deletionTimestamp"):
                            if key not in self.recovered:
                                self._status(kind, obj, [_cond("AllInjected", "False"), _cond("AllRecovered", "True")])
                                self.recovered.append(key)
                            self._finalizers(kind, obj, [f for f in meta.get("finalizers") or [] if f != FINALIZER])
                            continue
                        first = self.seen.setdefault(key, time.monotonic())
                        if self.inject and key not in self.injected and time.monotonic() - first >= self.delay:
                            # the finalizer first, as the controller does: the object cannot go before
                            # its recovery is reported
                            self._finalizers(kind, obj, [*(meta.get("finalizers") or []), FINALIZER])
                            self._status(kind, obj, [_cond("AllInjected", "True"), _cond("AllRecovered", "False")])
                            self.injected.append(key)
                    except Exception:  # noqa: BLE001 - a conflict or a vanished object: next round
                        continue
            self._stop.wait(0.1)
