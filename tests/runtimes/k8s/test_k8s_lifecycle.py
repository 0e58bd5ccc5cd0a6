"""The k8s runtime against a real API server on this machine (etcd, kube-apiserver, the controller
manager and scheduler built by `pdchaos setup --only k8s`; kwok plays the kubelet): every object the
P/D suite would make passes the server's validation against the pinned CRDs; a run's whole object
lifecycle (namespace, workloads, pods ready, a Chaos Mesh object injected and recovered, teardown)
and attach mode's selection, error paths included, with nothing left behind.

Chaos Mesh's controller does not run here: tests/chaos_mesh_standin.py stands in for it
(conditions and finalizer only; it never touches a pod). No container runs either: kwok marks pods
running, so what a fault does to a process is not seen here (docs/k8s.md says what is verified).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from chaos_mesh_standin import ChaosMeshStandIn
from harness.errors import HarnessError
from harness.runtime import Launch

REPO = Path(__file__).resolve().parents[3]
IMAGE = "registry.invalid/pd-chaos/pd-node:test"  # kwok pulls nothing


@pytest.fixture(scope="module")
def cluster():
    from runtimes.k8s import stack

    if stack.step().check() is None:
        pytest.skip("k8s stack not built: run `pdchaos setup --only k8s`")
    from runtimes.k8s.cluster import LocalCluster

    with LocalCluster() as c:
        c.apply_crds([stack.crd_file("chaos-mesh"), stack.crd_file("lws")])
        yield c


@pytest.fixture(scope="module")
def kube(cluster):
    from runtimes.k8s.client import Kube

    return Kube(cluster.kubeconfig)


def settings(**kw):
    from runtimes.k8s.settings import ClusterSettings

    return ClusterSettings(image=IMAGE, workload="deployment", ready_timeout_s=60, **kw)


def launch(role: str, kind: str = "vllm") -> Launch:
    return Launch(role=role, kind=kind, argv=[sys.executable, "-m", "harness.cli", "node", kind, "--port", "8100",
                                              "--control", "ipc:///tmp/x.sock"],
                  name=f"node {kind}", endpoints={"http": f"http://{role}:8100"}, ready_timeout_s=60)


def leftovers(kube, run_id: str) -> list[str]:
    from runtimes.k8s.manifests import RUN_LABEL, dns_name

    sel = f"{RUN_LABEL}={dns_name(run_id)}"
    out = [f"namespace {n}" for n in kube.run_namespaces(run_id)]
    for api, kind in (("apps/v1", "Deployment"), ("v1", "Service"), ("v1", "Pod"),
                      ("chaos-mesh.org/v1alpha1", "PodChaos"), ("chaos-mesh.org/v1alpha1", "NetworkChaos")):
        out += [f"{kind} {o['metadata']['name']}" for o in kube.list(api, kind, selector=sel)
                if not (o["metadata"].get("deletionTimestamp"))]
    return out


class Ctx:
    """What a fault reads of the topology: the run's roles and its event log."""

    def __init__(self, roles):
        self.nodes = dict.fromkeys(roles)
        self.events: list[tuple] = []
        self.target, self.deadline = "hardened", 4.0

    def event(self, what, **fields):
        self.events.append((what, fields))


@pytest.mark.timeout(300)
def test_every_object_of_the_p_d_suite_passes_the_server_s_validation(kube) -> None:
    """Each planned run's objects (the dry run's, with real ports) in a server-side dry run against
    the pinned Chaos Mesh and LeaderWorkerSet CRDs and the built-in kinds; and the validation
    can fail: a PodChaos with an action Chaos Mesh does not have is refused with the allowed ones."""
    from families.pd.profile import load_profile
    from harness.cli.run import _runtime_objects
    from harness.plan import scratch_topology, split_plan
    from harness.schema import load_all
    from runtimes.k8s.client import KubeError

    prof = load_profile("k8s")
    scenarios = load_all([str(REPO / "scenarios" / "pd")])
    keep, left = split_plan([(sc, t) for sc in scenarios for t in sc.model.targets], {"pd": prof})
    # left out on both targets: the two toxics on P's bootstrap link (the side-channel garbage, which needs
    # node_address, runs in D's pod: vLLM binds its side channel on the pod's own address), and the freeze
    # keyed on P's write (the phase journal runs in processes of this machine only)
    assert len(keep) >= 40 and len(left) == 6, [f"{sc.name} {t}" for sc, t, _ in left]
    ns = "pdchaos-validate"
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    kinds, n = set(), 0
    try:
        for sc, target in keep:
            with scratch_topology(sc, target, prof) as (_, topo):
                text = _runtime_objects(sc, target, topo, sc.family.roles(sc.model, prof), prof)
            for obj in yaml.safe_load_all(text):
                if not obj or obj["kind"] == "Namespace":
                    continue
                obj["metadata"]["namespace"] = ns
                spec = obj.get("spec") or {}
                for sel in (spec.get("selector"), (spec.get("target") or {}).get("selector")):
                    if isinstance(sel, dict) and "namespaces" in sel:
                        sel["namespaces"] = [ns]
                kube.apply(obj, dry_run=True)
                kinds.add(obj["kind"])
                n += 1
        assert {"LeaderWorkerSet", "Service", "ServiceAccount", "PodChaos", "NetworkChaos"} <= kinds, kinds
        assert n > 200
        bad = {"apiVersion": "chaos-mesh.org/v1alpha1", "kind": "PodChaos",
               "metadata": {"name": "bad", "namespace": ns},
               "spec": {"action": "explode", "mode": "all", "selector": {"namespaces": [ns]}}}
        with pytest.raises(KubeError, match="pod-kill"):
            kube.apply(bad, dry_run=True)
        assert kube.list("apps/v1", "Deployment", namespace=ns) == []  # a dry run stores nothing
    finally:
        kube.delete_namespace(ns)


@pytest.mark.timeout(300)
def test_a_run_s_objects_live_and_go_with_it(kube, cluster) -> None:
    """Namespace and nodes made at the first start, pods ready (kwok), a kill carried out as a
    PodChaos that the controller stand-in reports injected then recovered (both in the journal's
    events), a node killed and stopped through its handle, and close() leaves nothing."""
    from faults.base import load_registry
    from harness.runner import make_fault
    from harness.schema import load_scenario
    from runtimes.k8s.placement import K8sPlacement

    run_id = f"life{os.getpid()}"
    pl = K8sPlacement(run_id, settings(), kubeconfig=cluster.kubeconfig)
    pl.target = "hardened"
    try:
        handles = {r: pl.start(launch(r, k)) for r, k in (("prefill:0", "vllm"), ("decode:0", "vllm"),
                                                           ("proxy", "pd-proxy"))}
        assert all(h.alive for h in handles.values())
        assert len({h.instance for h in handles.values()}) == 3
        assert pl.host("prefill:0") == f"prefill-0.{pl.namespace}.svc"
        assert kube.get("v1", "ServiceAccount", "pdchaos-node", pl.namespace) is not None

        sc = load_scenario(REPO / "scenarios" / "pd" / "kill-prefill-before-pull.yaml")
        spec = next(f for f in sc.faults if f.type == "kill")
        ctx = Ctx(handles)
        inner = make_fault(load_registry("pd"), spec, ctx)
        fault = pl.wrap_fault(inner, spec)
        assert fault is not inner and fault.expected_categories() == inner.expected_categories()
        with ChaosMeshStandIn(kube, pl.namespace) as standin:
            fault.start()
            fault.stop()
        assert [e[0] for e in ctx.events] == ["chaos_created", "chaos_injected", "chaos_recovered"]
        assert fault.effect() == {"acted": 1, "seen": 1, "injected": 1, "recovered": 1}
        assert standin.injected and standin.recovered
        assert kube.list("chaos-mesh.org/v1alpha1", "PodChaos", namespace=pl.namespace) == []

        with pytest.raises(HarnessError, match="exec in pod"):  # kwok runs no container to exec into
            handles["decode:0"].freeze()
        handles["prefill:0"].kill()
        assert not handles["prefill:0"].alive
        assert kube.get("apps/v1", "Deployment", "prefill-0", pl.namespace) is None  # no replacement comes
        handles["decode:0"].stop(1.0)
        assert not handles["decode:0"].alive and handles["decode:0"].stop() is None  # idempotent
    finally:
        left = pl.close()
    assert left == [] and leftovers(kube, run_id) == []


@pytest.mark.timeout(120)
def test_a_chaos_object_nobody_injects_is_a_harness_error_not_a_window(kube, cluster, monkeypatch) -> None:
    from faults.base import load_registry
    from harness.runner import make_fault
    from harness.schema import load_scenario
    from runtimes.k8s import chaos
    from runtimes.k8s.client import KubeError
    from runtimes.k8s.placement import K8sPlacement

    monkeypatch.setattr(chaos, "INJECT_TIMEOUT_S", 2.0)
    run_id = f"nobody{os.getpid()}"
    pl = K8sPlacement(run_id, settings(), kubeconfig=cluster.kubeconfig)
    try:
        sc = load_scenario(REPO / "scenarios" / "pd" / "partition-prefill-decode.yaml")
        spec = next(f for f in sc.faults if f.type == "partition")
        ctx = Ctx(["prefill:0", "decode:0", "proxy"])
        fault = pl.wrap_fault(make_fault(load_registry("pd"), spec, ctx), spec)
        with pytest.raises(KubeError, match="injected: not within 2 s"):
            fault.start()
        assert fault.effect() == {"injected": 0, "recovered": 0}  # partition declares no count of its own
        fault.stop()  # heals what it created: the object goes
    finally:
        assert pl.close() == []
    assert leftovers(kube, run_id) == []


@pytest.mark.timeout(120)
def test_rbac_denied_and_a_missing_crd_are_one_line_each_and_leave_nothing(kube, cluster) -> None:
    from runtimes.k8s.client import Kube, KubeError
    from runtimes.k8s.placement import K8sPlacement

    run_id = f"denied{os.getpid()}"
    pl = K8sPlacement(run_id, settings(), kubeconfig=cluster.user_kubeconfig("nobody"))
    with pytest.raises(KubeError, match=r"forbidden by RBAC \(403\)") as err:
        pl.start(launch("prefill:0"))
    assert "\n" not in str(err.value)
    assert pl.close() == []  # refused: nothing was made, nothing to remove
    assert leftovers(kube, run_id) == []
    with pytest.raises(KubeError, match="CRD installed"):
        Kube(cluster.kubeconfig).apply({"apiVersion": "chaos-mesh.org/v1alpha9", "kind": "PodChaos",
                                        "metadata": {"name": "x", "namespace": "default"}, "spec": {}})


@pytest.mark.timeout(300)
def test_attach_mode_selects_the_user_s_pods_and_touches_nothing_else(kube, cluster) -> None:
    """A user's deployment in a namespace of its own: each selector picks one ready pod; a selector
    that picks none, or two, is one clear error; the harness's own node (a fake peer) is a pod it
    makes there and removes at close; the user's pods keep running, the same ones."""
    from runtimes.k8s.attach import AttachPlacement, select
    from runtimes.k8s.settings import Attach

    ns = f"serving-{os.getpid()}"
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    try:
        for role in ("prefill", "decode"):
            kube.apply({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": f"vllm-{role}", "namespace": ns},
                        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "vllm", "role": role}},
                                 "template": {"metadata": {"labels": {"app": "vllm", "role": role}},
                                              "spec": {"containers": [{"name": "vllm", "image": IMAGE}]}}}})
        attach = Attach(namespace=ns, selectors={"prefill:0": "app=vllm,role=prefill", "decode:0": "app=vllm,role=decode"})
        kube.wait("v1", "Pod", ns, lambda items: sum(1 for p in items if (p.get("status") or {}).get("phase") == "Running") == 2,
                  60, "user pods running")
        time.sleep(1.0)  # kwok's Ready condition follows Running
        picked = select(kube, attach)
        assert picked["prefill:0"]["metadata"]["labels"]["role"] == "prefill"
        user_uids = sorted(p["metadata"]["uid"] for p in picked.values())
        with pytest.raises(HarnessError, match="matches no ready pod"):
            select(kube, Attach(namespace=ns, selectors={"prefill:0": "role=router"}))
        with pytest.raises(HarnessError, match="matches 2 ready pods"):
            select(kube, Attach(namespace=ns, selectors={"prefill:0": "app=vllm"}))
        with pytest.raises(HarnessError, match="already the node of role"):
            select(kube, Attach(namespace=ns, selectors={"prefill:0": "role=prefill", "decode:0": "role=prefill"}))

        pl = AttachPlacement(f"att{os.getpid()}", settings(attach=attach, mode="attach"), kubeconfig=cluster.kubeconfig)
        try:
            p = pl.start(launch("prefill:0"))
            fake = pl.start(launch("fake-prefill:0", "pd-fake-prefill"))  # the harness's own: made here
            assert p.instance in user_uids and fake.instance not in user_uids and fake.alive
            p.stop()
            p.kill()  # attach mode never deletes a user's pod
        finally:
            assert pl.close() == []
        after = sorted(p["metadata"]["uid"] for p in kube.list("v1", "Pod", namespace=ns)
                       if not p["metadata"].get("deletionTimestamp"))
        assert after == user_uids  # the user's pods, untouched; the fake peer's pod gone
        assert kube.get("apps/v1", "Deployment", "fake-prefill-0", ns) is None
        assert [d["metadata"]["name"] for d in kube.list("apps/v1", "Deployment", namespace=ns)] == \
            ["vllm-decode", "vllm-prefill"]
    finally:
        kube.delete_namespace(ns)


@pytest.mark.timeout(180)
def test_ctrl_c_during_a_run_and_pdchaos_clean_leave_nothing(kube, cluster, tmp_path) -> None:
    """`pdchaos run --profile k8s` interrupted while its nodes start: exit 130 and its namespace
    gone; a namespace a killed run left is found by its label and removed by `pdchaos clean`."""
    env = {**os.environ, "PDCHAOS_KUBECONFIG": cluster.kubeconfig, "PYTHONPATH": str(REPO)}
    before = set(kube.run_namespaces())
    child = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", "scenarios/pd/baseline.yaml", "--profile", "k8s",
                              "--set", "cluster.workload=deployment", "--set", f"cluster.image={IMAGE}", "--set", "cluster.model_cache_claim=",
                              "--target", "hardened", "--runs-dir", str(tmp_path / "runs"), "--plain"],
                             cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (set(kube.run_namespaces()) - before):
            time.sleep(0.2)
        assert set(kube.run_namespaces()) - before, "the run made no namespace"
        child.send_signal(signal.SIGINT)
        out, _ = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 130, out[-2000:]
    assert set(kube.run_namespaces()) - before == set(), out[-2000:]

    from runtimes.k8s.manifests import labels

    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "pdchaos-killed", "labels": labels("killed")}})
    from runtimes.k8s.manifests import RUNNER_ANNOTATION, runner_id

    kube.apply({"apiVersion": "v1", "kind": "Namespace",  # a run still going (this process): spared
                "metadata": {"name": "pdchaos-live", "labels": labels("live"), "annotations": {RUNNER_ANNOTATION: runner_id()}}})
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "clean", "--profile", "k8s"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=150)
    assert proc.returncode == 1 and "removed: namespace pdchaos-killed" in proc.stdout, proc.stdout + proc.stderr
    assert "left: namespace pdchaos-live: its run is still going" in proc.stdout
    kube.delete_namespace("pdchaos-live")
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "clean", "--profile", "k8s"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "nothing left behind" in proc.stdout


@pytest.mark.timeout(120)
def test_doctor_says_what_the_cluster_lacks_one_line_each(cluster) -> None:
    env = {**os.environ, "PDCHAOS_KUBECONFIG": cluster.kubeconfig, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "harness.cli", "doctor", "--profile", "k8s"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=100).stdout
    line = {ln.split()[1]: ln for ln in out.splitlines() if ln[:3] in ("ok ", "NO ")}
    assert line["k8s-api"].startswith("ok ") and "v1.34.4" in line["k8s-api"]
    assert line["crd-podchaos"].startswith("ok ") and line["crd-leaderworkerset"].startswith("ok ")
    assert line["k8s-rbac"].startswith("ok ")
    assert line["chaos-mesh-controller"].startswith("NO ")  # only a stand-in runs here, and only in tests
    env["PDCHAOS_KUBECONFIG"] = cluster.user_kubeconfig("nobody")
    out = subprocess.run([sys.executable, "-m", "harness.cli", "doctor", "--profile", "k8s"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=100).stdout
    assert any(ln.startswith("NO ") and "k8s-rbac" in ln and "denied: get namespaces" in ln for ln in out.splitlines()), out


@pytest.mark.timeout(180)
def test_an_api_server_gone_mid_run_is_said_not_hung(tmp_path) -> None:
    """The API server dies under a run: a node's handle reads not alive (no hang, no traceback)
    and close() names the namespace it could not remove and the command that will."""
    from runtimes.k8s import stack
    from runtimes.k8s.cluster import LocalCluster
    from runtimes.k8s.placement import K8sPlacement

    if stack.step().check() is None:
        pytest.skip("k8s stack not built: run `pdchaos setup --only k8s`")
    with LocalCluster() as c:
        pl = K8sPlacement(f"gone{os.getpid()}", settings(), kubeconfig=c.kubeconfig)
        h = pl.start(launch("proxy", "pd-proxy"))
        assert h.alive
        c.stop_apiserver()
        t0 = time.monotonic()
        assert not h.alive
        left = pl.close()
        assert time.monotonic() - t0 < 60
        assert len(left) == 1 and "pdchaos clean --profile k8s" in left[0] and "\n" not in left[0]
