"""A container-kill's heal records the kubelet's restart counts of the pods it selected, before the
kill and once they serve again (``chaos_restarted``: what fault_effect takes as evidence that the
container started again; harness/checks.py). The cluster's answers come from a small in-memory
stand-in for the API server's list and wait (the kubelet that restarts a container cannot run in a
unit test; tests/runtimes/k8s/test_real_kubelet.py drives a real one)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from runtimes.k8s import manifests as M
from runtimes.k8s.chaos import ChaosMeshFault
from runtimes.k8s.settings import ClusterSettings

pytestmark = pytest.mark.timeout(20)


class Cluster:
    """The API server's answers for one pod and one chaos object: ``restarts`` is what the kubelet
    does to the container when the container-kill acts (0: it never starts it again)."""

    def __init__(self, restarts: int) -> None:
        self.restarts = restarts
        self.pod = {"metadata": {"name": "prefill-0", "uid": "u1"},
                    "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                               "containerStatuses": [{"name": "node", "restartCount": 2}]}}
        self.chaos: list[dict] = []

    def apply(self, obj: dict) -> dict:
        self.chaos = [{**obj, "status": {"conditions": [{"type": "AllInjected", "status": "True"}]}}]
        self.pod["status"]["containerStatuses"][0]["restartCount"] += self.restarts
        return obj

    def delete(self, api: str, kind: str, name: str, ns: str | None = None) -> None:  # noqa: ARG002
        self.chaos = []

    def list(self, api: str, kind: str, namespace: str | None = None, selector: str | None = None) -> list[dict]:  # noqa: ARG002
        return [self.pod] if kind == "Pod" else self.chaos

    def wait(self, api: str, kind: str, ns: str | None, until, timeout_s: float, what: str,  # noqa: ANN001
             selector: str | None = None) -> None:  # noqa: ARG002
        if not until(self.list(api, kind, ns)):
            raise TimeoutError(what)


def run_restart(cluster: Cluster) -> list[tuple[str, dict]]:
    events: list[tuple[str, dict]] = []
    s = ClusterSettings(image="x", namespace_prefix="t")
    obj = M.chaos_object("restart", {"node": "prefill:0", "kill": True, "for": 1.0}, ["prefill:0", "decode:0"], "r", s, 3)
    inner = SimpleNamespace(params=None, ctx=SimpleNamespace(event=lambda what, **kw: events.append((what, kw))),
                            name="restart", expected_categories=lambda: (), possible_categories=lambda: (),
                            required_effect=lambda: {"acted": 1, "seen": 1})
    fault = ChaosMeshFault(inner, obj, cluster)
    fault.start()
    fault.stop()
    return events


def test_the_heal_records_the_restart_counts_before_and_after() -> None:
    got = dict(run_restart(Cluster(restarts=1)))["chaos_restarted"]
    assert got["name"] == "restart-3" and got["restarts_before"] == 2 and got["restarts_after"] == 3


def test_a_container_that_never_started_again_is_not_waited_for_forever() -> None:
    with pytest.raises(TimeoutError, match="started again"):
        run_restart(Cluster(restarts=0))
