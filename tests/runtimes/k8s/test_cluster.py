"""The k8s stack (runtimes/k8s/stack.py) and the local cluster built from it (runtimes/k8s/cluster.py),
for real: the setup step's check/plan/idempotent install, a Deployment's pod Running on a kwok
node (watched), namespace deletion completing, RBAC denying a user with no role, the pinned Chaos
Mesh and LWS CRDs validating chaos objects server-side, a component that cannot start named with
its log, and stop() leaving no process and no folder.

One cluster for the module (started once, ~5 s); the stop tests start their own.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from harness.errors import HarnessError
from runtimes.k8s import stack

REPO = Path(__file__).resolve().parents[3]
SKIP = "k8s stack not built: run `pdchaos setup --only k8s`"
IMAGE = "registry.invalid/pd-chaos/none:test"  # kwok pulls nothing


def need_stack() -> None:
    if stack.step().check() is None:
        pytest.skip(SKIP)


@pytest.fixture(scope="module")
def cluster():
    need_stack()
    from runtimes.k8s.cluster import LocalCluster

    with LocalCluster() as c:
        c.apply_crds([stack.crd_file("chaos-mesh"), stack.crd_file("lws")])
        yield c


@pytest.fixture(scope="module")
def api(cluster):
    client = cluster.api_client()
    yield client
    client.close()


@pytest.fixture
def namespace(api):
    from kubernetes import client

    name = f"t-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(api).create_namespace({"metadata": {"name": name}}, _request_timeout=30)
    yield name
    try:
        client.CoreV1Api(api).delete_namespace(name, _request_timeout=30)
    except client.ApiException as exc:
        if exc.status != 404:
            raise


def gone(pid: int) -> bool:
    """No such process, or only its zombie (reaped by its parent later)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


# --------------------------------------------------------------------------- the setup step

@pytest.mark.timeout(60)
def test_step_protocol_and_an_empty_cache_reads_absent(tmp_path, monkeypatch) -> None:
    from harness.setup import StepFailed, is_step

    st = stack.step()
    assert is_step(st) and st.name == "k8s" and st.side_by_side is True
    monkeypatch.setenv("PDCHAOS_K8S_HOME", str(tmp_path))
    assert stack.k8s_home().parent == tmp_path and stack.binary("etcd").parent.name == "bin"
    assert st.check() is None
    assert set(stack.missing()) >= {"etcd", "kube-apiserver", "kwok", "chaos-mesh", "lws", "kwok-stages", "stamp"}
    if stack.find_go() is None:
        with pytest.raises(StepFailed, match="Go is not installed"):
            st.plan()
    else:
        assert st.plan().startswith("build/fetch etcd, kube-apiserver")


@pytest.mark.timeout(60)
def test_step_present_reports_the_pins_and_a_second_install_rebuilds_nothing() -> None:
    need_stack()
    st = stack.step()
    status = st.check()
    assert f"etcd {stack.ETCD}" in status
    assert f"kube-apiserver/controller-manager/scheduler {stack.KUBERNETES}" in status
    assert f"kwok {stack.KWOK}" in status and str(stack.k8s_home() / "crds") in status
    before = {n: stack.binary(n).stat().st_mtime_ns for n in stack.VERSIONS}
    t0 = time.monotonic()
    assert "nothing rebuilt" in st.install()
    assert time.monotonic() - t0 < 10
    assert before == {n: stack.binary(n).stat().st_mtime_ns for n in stack.VERSIONS}
    assert st.plan().startswith("nothing to build")


# --------------------------------------------------------------------------- the cluster

@pytest.mark.timeout(120)
def test_a_deployment_pod_runs_on_a_kwok_node_and_namespace_deletion_completes(cluster, api, namespace) -> None:
    from kubernetes import client, watch

    assert cluster.server.startswith("https://127.0.0.1:") and os.path.isfile(cluster.kubeconfig)
    assert (cluster.started_s or 99) < 30
    version = client.VersionApi(api).get_code(_request_timeout=10)
    assert (version.git_version, version.major, version.minor) == (stack.KUBERNETES, "1", "34")
    sa = client.CoreV1Api(api).read_namespaced_service_account("default", "default", _request_timeout=10)
    assert sa.metadata.name == "default"
    labels = {"app": "one"}
    client.AppsV1Api(api).create_namespaced_deployment(namespace, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "one"},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "c", "image": IMAGE}]}}}}, _request_timeout=30)
    running = None
    w = watch.Watch()
    for ev in w.stream(client.CoreV1Api(api).list_namespaced_pod, namespace, timeout_seconds=60,
                       _request_timeout=70):
        pod = ev["object"]
        if pod.status.phase == "Running":
            running = pod
            w.stop()
    assert running is not None, "no pod Running within 60 s"
    assert running.spec.node_name in cluster.nodes
    assert running.metadata.owner_references[0].kind == "ReplicaSet"

    core = client.CoreV1Api(api)
    core.delete_namespace(namespace, _request_timeout=30)
    end = time.monotonic() + 90
    while True:
        try:
            core.read_namespace(namespace, _request_timeout=10)
        except client.ApiException as exc:
            assert exc.status == 404
            break
        assert time.monotonic() < end, f"namespace {namespace} still there after 90 s"
        time.sleep(0.5)


@pytest.mark.timeout(60)
def test_a_user_with_no_role_is_denied_and_a_bound_group_only_what_it_was_given(cluster, api) -> None:
    from kubernetes import client

    nobody = cluster.api_client(cluster.user_kubeconfig("nobody"))
    try:
        with pytest.raises(client.ApiException) as denied:
            client.CoreV1Api(nobody).list_namespaced_pod("default", _request_timeout=10)
        assert denied.value.status == 403 and "nobody" in denied.value.body
    finally:
        nobody.close()

    client.RbacAuthorizationV1Api(api).create_cluster_role_binding({
        "metadata": {"name": "pdchaos-test-viewers"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "pdchaos:viewers"}]},
        _request_timeout=10)
    viewer = cluster.api_client(cluster.user_kubeconfig("viewer", groups=("pdchaos:viewers",)))
    try:
        client.CoreV1Api(viewer).list_namespaced_pod("default", _request_timeout=10)
        with pytest.raises(client.ApiException) as denied:
            client.CoreV1Api(viewer).create_namespace({"metadata": {"name": "nope"}}, _request_timeout=10)
        assert denied.value.status == 403
    finally:
        viewer.close()
    with pytest.raises(ValueError):
        cluster.user_kubeconfig("a/b")


@pytest.mark.timeout(90)
def test_chaos_mesh_and_lws_crds_are_established_and_validate_chaos_objects(cluster, api, namespace, tmp_path) -> None:
    from kubernetes.dynamic import DynamicClient
    from kubernetes.dynamic.exceptions import DynamicApiError

    names = cluster.apply_crds([stack.crd_file("lws")])  # again: server-side apply is idempotent
    assert names == ["leaderworkersets.leaderworkerset.x-k8s.io"]
    dyn = DynamicClient(api, cache_file=str(tmp_path / "discovery.json"))
    crds = dyn.resources.get(api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition")
    for name in ("podchaos.chaos-mesh.org", "networkchaos.chaos-mesh.org", names[0]):
        conds = crd_conditions(crds.get(name=name, _request_timeout=10))
        assert conds.get("Established") == "True", name

    def sel(role: str) -> dict:
        return {"namespaces": [namespace], "labelSelectors": {"role": role}}

    pod_chaos = {"apiVersion": "chaos-mesh.org/v1alpha1", "kind": "PodChaos",
                 "metadata": {"name": "kill-prefill", "namespace": namespace},
                 "spec": {"action": "pod-kill", "mode": "one", "selector": sel("prefill")}}
    net_chaos = {"apiVersion": "chaos-mesh.org/v1alpha1", "kind": "NetworkChaos",
                 "metadata": {"name": "cut-decode", "namespace": namespace},
                 "spec": {"action": "partition", "mode": "all", "selector": sel("prefill"), "direction": "to",
                          "target": {"mode": "all", "selector": sel("decode")}}}
    for obj in (pod_chaos, net_chaos):
        res = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        out = res.create(body=obj, namespace=namespace, dry_run="All", _request_timeout=10)
        assert out.metadata.name == obj["metadata"]["name"]
        assert res.get(namespace=namespace, _request_timeout=10)["items"] == []  # a dry run stores nothing
    bad = {**pod_chaos, "spec": {**pod_chaos["spec"], "action": "pod-explode"}}
    with pytest.raises(DynamicApiError) as rejected:
        dyn.resources.get(api_version="chaos-mesh.org/v1alpha1", kind="PodChaos").create(
            body=bad, namespace=namespace, dry_run="All", _request_timeout=10)
    assert rejected.value.status == 422 and "pod-explode" in str(rejected.value.body)


def crd_conditions(crd) -> dict:
    return {c["type"]: c["status"] for c in (crd.to_dict().get("status") or {}).get("conditions") or []}


# --------------------------------------------------------------------------- failing and stopping

@pytest.mark.timeout(60)
def test_a_missing_stack_is_named_with_the_setup_command(tmp_path, monkeypatch) -> None:
    from runtimes.k8s.cluster import LocalCluster

    monkeypatch.setenv("PDCHAOS_K8S_HOME", str(tmp_path))
    c = LocalCluster()
    with pytest.raises(HarnessError, match=r"is missing: run `pdchaos setup --only k8s`"):
        c.start()
    assert c.dir is None and c.pids() == {}
    with pytest.raises(HarnessError, match="starts once"):
        c.start()


@pytest.mark.timeout(90)
def test_a_component_that_cannot_start_is_named_with_its_last_log_lines() -> None:
    need_stack()
    from runtimes.k8s.cluster import LocalCluster

    c = LocalCluster()
    with socket.socket() as taken:  # the API server's port, taken: it exits at once
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", c.port))
        taken.listen(1)
        t0 = time.monotonic()
        with pytest.raises(HarnessError) as err:
            c.start()
    msg = str(err.value)
    assert "kube-apiserver exited" in msg and "last log lines:" in msg and "\n" not in msg
    assert "address already in use" in msg.lower()
    assert time.monotonic() - t0 < 30
    assert not c.dir.exists() and c.pids() == {}


@pytest.mark.timeout(120)
def test_stop_apiserver_then_stop_leaves_no_process_and_no_folder() -> None:
    need_stack()
    from kubernetes import client

    from runtimes.k8s.cluster import COMPONENTS, LocalCluster

    with LocalCluster(nodes=1) as c:
        pids = c.pids()
        assert set(pids) == set(COMPONENTS)
        c.stop_apiserver()
        assert gone(pids["kube-apiserver"]) and set(c.pids()) == set(COMPONENTS) - {"kube-apiserver"}
        api = c.api_client()
        t0 = time.monotonic()
        with pytest.raises(Exception) as err:  # refused at once: urllib3's MaxRetryError, not a hang
            client.CoreV1Api(api).list_namespace(_request_timeout=5)
        assert time.monotonic() - t0 < 30 and not isinstance(err.value, client.ApiException)
        api.close()
        folder = c.dir
        t0 = time.monotonic()
        c.stop()
        assert time.monotonic() - t0 < 15
        c.stop()  # idempotent
    assert all(gone(p) for p in pids.values())
    assert not folder.exists() and c.pids() == {}


@pytest.mark.timeout(120)
def test_a_cluster_whose_owner_dies_without_stop_is_removed_by_its_watchdog() -> None:
    """The owner exits hard (os._exit, as pytest-timeout does): nothing of the cluster stays."""
    need_stack()
    owner = ("import json, os, sys\n"
             "from runtimes.k8s.cluster import LocalCluster\n"
             "c = LocalCluster(nodes=1).start()\n"
             "print(json.dumps({'pids': c.pids(), 'dir': str(c.dir)}), flush=True)\n"
             "os._exit(3)\n")
    res = subprocess.run([sys.executable, "-c", owner], capture_output=True, text=True, timeout=90,
                         cwd=REPO)
    assert res.returncode == 3, res.stderr[-500:]
    left = json.loads(res.stdout.strip().splitlines()[-1])
    end = time.monotonic() + 15
    while not (all(gone(p) for p in left["pids"].values()) and not os.path.exists(left["dir"])):
        assert time.monotonic() < end, f"still there 15 s after its owner died: {left}"
        time.sleep(0.2)
