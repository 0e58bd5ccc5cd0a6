"""A REAL single-node cluster (runtimes/k8s/realnode.py): pods run under a real kubelet and
containerd, Chaos Mesh's own controller and daemon carry out a pod-kill and a network partition on
them, and stopping it leaves the host as it was.

These tests need root and the optional ``k8s-node`` stack (``pdchaos setup --only k8s-node``; not
part of ``--all``). Without it they are skipped as "not applicable" (so ``PDCHAOS_REQUIRE_ALL=1``,
which makes skips fail, does not demand a stack ``--all`` does not install); with
``PDCHAOS_REAL_KUBELET=1`` a missing stack or missing root FAILS them instead. They run in one
pytest worker, in file order (one cluster for the module; ``--dist loadfile``).
"""

from __future__ import annotations

import os
import time
import uuid

import pytest

from runtimes.k8s import realnode

REQUIRE_ENV = "PDCHAOS_REAL_KUBELET"
SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
           "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes", "net/ipv4/ip_forward")
NS = "real-test"

pytestmark = [pytest.mark.timeout(600)]


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    missing = realnode.stack_missing()
    if missing:
        return f"the k8s-node stack is not installed ({missing}): pdchaos setup --only k8s-node"
    return None


def _sysctls() -> dict[str, str]:
    out = {}
    for s in SYSCTLS:
        try:
            out[s] = open(f"/proc/sys/{s}").read().strip()
        except OSError:
            pass
    return out


def _host_state() -> dict:
    snap = realnode.snapshot()
    return {"mounts": set(snap["mounts"]), "links": set(snap["links"]), "kubepods": snap["kubepods"],
            "chains": {k: set(v) for k, v in snap["chains"].items()}, "sysctls": _sysctls(),
            "run_containerd": os.path.exists("/run/containerd"), "var_lib_cni": os.path.exists("/var/lib/cni"),
            "run_netns": os.path.exists("/run/netns"), "var_log_containers": os.path.exists("/var/log/containers"),
            "var_lib_kubelet": os.path.exists("/var/lib/kubelet")}


@pytest.fixture(scope="module")
def real():
    why = _why_not()
    if why:
        if os.environ.get(REQUIRE_ENV, "").strip() not in ("", "0"):
            pytest.fail(f"{REQUIRE_ENV}=1 and {why}")
        pytest.skip(f"not applicable: the real-kubelet tests are opt-in ({why}; set {REQUIRE_ENV}=1 to demand them)")
    before = _host_state()
    c = realnode.RealCluster()
    t0 = time.monotonic()
    c.start()
    print(f"\nreal cluster up in {time.monotonic() - t0:.1f} s: {c.timings}")
    from kubernetes import client

    api = c.api_client()
    client.CoreV1Api(api).create_namespace({"metadata": {"name": NS}}, _request_timeout=30)
    yield {"cluster": c, "api": api, "before": before}
    api.close()
    c.stop()


def _wait(ok, timeout_s: float, what: str, step_s: float = 0.2):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        got = ok()
        if got:
            return got
        time.sleep(step_s)
    raise AssertionError(f"not within {timeout_s:g} s: {what}")


def _pod_body(c, name: str, labels: dict, command: list[str]) -> dict:
    vols, mounts = c.host_usr_volumes()
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"terminationGracePeriodSeconds": 1, "volumes": vols,
                     "containers": [{"name": "main", "image": c.host_usr_image, "imagePullPolicy": "Never",
                                     "command": command, "volumeMounts": mounts}]}}


def _running(core, name: str):
    def ok():
        p = core.read_namespaced_pod(name, NS, _request_timeout=10)
        return p if p.status.phase == "Running" and all(s.ready for s in (p.status.container_statuses or [])) \
            and p.status.container_statuses else None
    return ok


def _exec(api, name: str, command: list[str]) -> str:
    from kubernetes import client
    from kubernetes.stream import stream

    return stream(client.CoreV1Api(api).connect_get_namespaced_pod_exec, name, NS, command=command,
                  stderr=True, stdin=False, stdout=True, tty=False, _request_timeout=60)


def test_a_pod_runs_logs_and_execs(real):
    from kubernetes import client

    c, api = real["cluster"], real["api"]
    core = client.CoreV1Api(api)
    t0 = time.monotonic()
    core.create_namespaced_pod(NS, _pod_body(c, "hi", {"app": "hi"}, ["sh", "-c", "echo hi; sleep 3600"]),
                               _request_timeout=30)
    pod = _wait(_running(core, "hi"), 120, "pod hi Running")
    print(f"pod Running in {time.monotonic() - t0:.1f} s")
    assert pod.spec.node_name == c.node_name
    assert pod.status.container_statuses[0].container_id.startswith("containerd://")
    assert _wait(lambda: core.read_namespaced_pod_log("hi", NS, _request_timeout=10).strip() == "hi", 30, "log hi")
    assert _exec(api, "hi", ["sh", "-c", "echo $((6 * 7)); cat /proc/1/cmdline | tr '\\0' ' '"]).split()[:2] \
        == ["42", "sh"]



def test_an_exec_session_is_started_before_and_only_signalled_after(real):
    """Placement.start_beside's session (runtimes/k8s/pods.ExecSession): a command kept running in a
    pod through exec, its stdin open; it says it is ready, and a line written later reaches it within
    a fraction of the exec's own start (pd-prefill-side-channel-garbage's sender is started before
    its window and only signalled in it); its last line is read though the exec closes right after;
    a command that ends without a line is one error naming its status."""
    from types import SimpleNamespace

    from harness.errors import HarnessError
    from runtimes.k8s.pods import ExecSession

    c, api = real["cluster"], real["api"]
    kube = SimpleNamespace(api=api)
    from kubernetes import client

    core = client.CoreV1Api(api)
    if not core.list_namespaced_pod(NS, field_selector="metadata.name=hi", _request_timeout=10).items:
        # the pod of the test before, made here when this test runs alone
        core.create_namespaced_pod(NS, _pod_body(c, "hi", {"app": "hi"}, ["sh", "-c", "sleep 3600"]),
                                   _request_timeout=30)
        _wait(_running(core, "hi"), 120, "pod hi Running")
    t0 = time.monotonic()
    sess = ExecSession(kube, NS, "hi", "main", ["sh", "-c", "echo ready; read x; echo got $x"], "session", 30)
    try:
        assert sess.readline(30) == "ready"
        started = time.monotonic() - t0
        t1 = time.monotonic()
        sess.write("go")
        assert sess.readline(30) == "got go"
        signalled = time.monotonic() - t1
    finally:
        sess.close()
    sess.close()  # safe to repeat
    print(f"exec session ready in {started:.3f} s, a signal answered in {signalled:.3f} s")
    assert signalled < started
    bad = ExecSession(kube, NS, "hi", "main", ["sh", "-c", "echo oops >&2; exit 3"], "session", 30)
    with pytest.raises(HarnessError, match=r"session: ended without a line .*"):
        bad.readline(30)
    bad.close()

def test_podchaos_pod_kill_is_carried_out_by_the_real_controller(real):
    from kubernetes import client

    c, api = real["cluster"], real["api"]
    apps, core, custom = client.AppsV1Api(api), client.CoreV1Api(api), client.CustomObjectsApi(api)
    labels = {"app": "victim"}
    tmpl = _pod_body(c, "x", labels, ["sleep", "3600"])
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "victim"},
           "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                    "template": {"metadata": {"labels": labels}, "spec": tmpl["spec"]}}}
    apps.create_namespaced_deployment(NS, dep, _request_timeout=30)

    def one_running():
        pods = [p for p in core.list_namespaced_pod(NS, label_selector="app=victim", _request_timeout=10).items
                if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]
        return pods[0] if len(pods) == 1 else None

    first = _wait(one_running, 120, "the victim Deployment's pod Running")
    chaos = {"apiVersion": "chaos-mesh.org/v1alpha1", "kind": "PodChaos",
             "metadata": {"name": "kill-victim", "namespace": NS},
             "spec": {"action": "pod-kill", "mode": "one", "selector": {"namespaces": [NS], "labelSelectors": labels}}}
    t0 = time.monotonic()
    custom.create_namespaced_custom_object("chaos-mesh.org", "v1alpha1", NS, "podchaos", chaos, _request_timeout=30)

    def replaced():
        p = one_running()
        return p if p is not None and p.metadata.uid != first.metadata.uid else None

    new = _wait(replaced, 120, "the killed pod replaced by a new Running one")
    print(f"pod-kill: replacement Running {time.monotonic() - t0:.1f} s after the PodChaos was created")
    assert new.metadata.name != first.metadata.name
    custom.delete_namespaced_custom_object("chaos-mesh.org", "v1alpha1", NS, "podchaos", "kill-victim",
                                           _request_timeout=30)
    _wait(lambda: not [o for o in custom.list_namespaced_custom_object(
        "chaos-mesh.org", "v1alpha1", NS, "podchaos", _request_timeout=10)["items"]], 60, "the PodChaos deleted")


CONNECT = ("import socket,sys\ntry:\n    socket.create_connection((sys.argv[1], 8080), timeout=2).close()\n"
           "    print('connected')\nexcept OSError as e:\n    print('failed', e)\n")


def test_networkchaos_partition_cuts_and_recovers(real):
    from kubernetes import client

    c, api = real["cluster"], real["api"]
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    core.create_namespaced_pod(NS, _pod_body(c, "server", {"app": "server"},
                                             ["python3", "-m", "http.server", "8080"]), _request_timeout=30)
    core.create_namespaced_pod(NS, _pod_body(c, "client", {"app": "client"}, ["sleep", "3600"]), _request_timeout=30)
    server = _wait(_running(core, "server"), 120, "server Running")
    _wait(_running(core, "client"), 120, "client Running")
    ip = server.status.pod_ip
    assert ip and ip.startswith("10.88.0.")

    def connect() -> str:
        return _exec(api, "client", ["python3", "-c", CONNECT, ip]).strip()

    assert _wait(lambda: connect() == "connected", 30, "client connects to server before the partition")
    name = f"part-{uuid.uuid4().hex[:6]}"
    chaos = {"apiVersion": "chaos-mesh.org/v1alpha1", "kind": "NetworkChaos",
             "metadata": {"name": name, "namespace": NS},
             "spec": {"action": "partition", "mode": "all", "direction": "to",
                      "selector": {"namespaces": [NS], "labelSelectors": {"app": "client"}},
                      "target": {"mode": "all", "selector": {"namespaces": [NS], "labelSelectors": {"app": "server"}}}}}
    t0 = time.monotonic()
    custom.create_namespaced_custom_object("chaos-mesh.org", "v1alpha1", NS, "networkchaos", chaos, _request_timeout=30)

    def injected():
        obj = custom.get_namespaced_custom_object("chaos-mesh.org", "v1alpha1", NS, "networkchaos", name,
                                                  _request_timeout=10)
        conds = (obj.get("status") or {}).get("conditions") or []
        return any(x.get("type") == "AllInjected" and x.get("status") == "True" for x in conds)

    _wait(injected, 120, "NetworkChaos AllInjected")
    inject_s = time.monotonic() - t0
    out = connect()
    assert out.startswith("failed"), out
    t1 = time.monotonic()
    custom.delete_namespaced_custom_object("chaos-mesh.org", "v1alpha1", NS, "networkchaos", name,
                                           _request_timeout=30)
    _wait(lambda: not [o for o in custom.list_namespaced_custom_object(
        "chaos-mesh.org", "v1alpha1", NS, "networkchaos", _request_timeout=10)["items"]], 120,
        "the NetworkChaos recovered and deleted (its finalizer removed)")
    assert _wait(lambda: connect() == "connected", 30, "client connects again after recovery")
    print(f"partition: injected in {inject_s:.1f} s, recovered and deleted in {time.monotonic() - t1:.1f} s")


# A harness that creates the scenario's partition the way a run does (runtimes/k8s: chaos_object,
# ChaosMeshFault) between two pods labelled as a run's roles, says "injected" and then waits to be killed.
HARNESS = """
import sys, time
from types import SimpleNamespace
from runtimes.k8s import manifests as M
from runtimes.k8s.chaos import ChaosMeshFault
from runtimes.k8s.client import Kube
from runtimes.k8s.settings import ClusterSettings
M.DURATION_SLACK_S = 3.0  # the window plus 3 s (35 s in a run): the test waits for it
kube = Kube(sys.argv[1])
s = ClusterSettings(image="x", namespace_prefix="sigkill")
obj = M.chaos_object("partition", {"direction": "both", "for": 2.0}, ["prefill:0", "decode:0"], "r", s, 0)
inner = SimpleNamespace(params=None, ctx=SimpleNamespace(event=lambda *a, **k: None), name="partition",
                        expected_categories=lambda: (), possible_categories=lambda: (), required_effect=lambda: {})
fault = ChaosMeshFault(inner, obj, kube)
fault.start()
print("injected", obj["spec"]["duration"], flush=True)
time.sleep(3600)
"""


def test_a_sigkilled_harness_leaves_nothing_injected_past_the_duration(real, tmp_path):
    """Every Chaos Mesh object with a lasting effect carries ``duration``: the harness is killed
    with SIGKILL right after its partition is injected (no heal ever runs), and Chaos Mesh's own
    controller recovers it when the duration is up: the pods reach each other again, nothing is
    left injected."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from kubernetes import client

    from runtimes.k8s import manifests as M
    from runtimes.k8s.settings import ClusterSettings

    c, api = real["cluster"], real["api"]
    core = client.CoreV1Api(api)
    s = ClusterSettings(image="x", namespace_prefix="sigkill")
    ns = M.namespace_name(s, "r")
    core.create_namespace({"metadata": {"name": ns}}, _request_timeout=30)
    for role, cmd in (("prefill:0", ["python3", "-m", "http.server", "8080"]), ("decode:0", ["sleep", "3600"])):
        body = _pod_body(c, M.dns_name(role), M.labels("r", role), cmd)
        core.create_namespaced_pod(ns, body, _request_timeout=30)
    global NS
    ns_before, NS = NS, ns
    try:
        p = _wait(_running(core, "prefill-0"), 120, "P's pod Running")
        _wait(_running(core, "decode-0"), 120, "D's pod Running")

        def connect() -> str:
            return _exec(api, "decode-0", ["python3", "-c", CONNECT, p.status.pod_ip]).strip()

        assert _wait(lambda: connect() == "connected", 30, "D reaches P before the fault")
        root = str(Path(__file__).resolve().parents[3])
        harness = subprocess.Popen([sys.executable, "-c", HARNESS, c.kubeconfig], cwd=root, stdout=subprocess.PIPE,
                                   text=True, env={**os.environ, "PYTHONPATH": root})
        try:
            line = harness.stdout.readline()
            assert line.startswith("injected 5s"), line
            assert connect().startswith("failed"), "the partition is in place"
        finally:
            harness.send_signal(signal.SIGKILL)  # no heal runs: only the duration ends it
            harness.wait(timeout=10)
        t0 = time.monotonic()
        assert _wait(lambda: connect() == "connected", 60, "D reaches P again, with no harness to heal it")
        print(f"recovered by Chaos Mesh {time.monotonic() - t0:.1f} s after the harness was killed")
        custom = client.CustomObjectsApi(api)
        obj = custom.list_namespaced_custom_object("chaos-mesh.org", "v1alpha1", ns, "networkchaos",
                                                   _request_timeout=10)["items"][0]
        assert obj["spec"]["duration"] == "5s"
    finally:
        NS = ns_before
        core.delete_namespace(ns, _request_timeout=30)


def test_the_shipped_rbac_lets_its_service_account_exec_and_port_forward(real, tmp_path):
    """runtimes/k8s/rbac.yaml applied as shipped; a token of its ServiceAccount; the harness's own
    exec (a websocket: authorised as get) and a port-forward into a pod, as that user; a user with
    no role is refused both."""
    import yaml
    from kubernetes import client
    from kubernetes.stream import portforward

    from runtimes.k8s.client import Kube
    from runtimes.k8s.forward import _quiet_client_threads

    _quiet_client_threads()  # the client's stream thread ends with a reset when the pod's side closes
    c, api = real["cluster"], real["api"]
    admin = Kube(c.kubeconfig)
    docs = [d for d in yaml.safe_load_all(open(Path_rbac()).read()) if d]
    for d in docs:
        admin.apply(d)
    tok = client.CoreV1Api(api).create_namespaced_service_account_token(
        "pdchaos-harness", "pdchaos-system", {"spec": {"expirationSeconds": 600}}, _request_timeout=30).status.token
    cfg = yaml.safe_load(open(c.kubeconfig).read())
    cfg["users"] = [{"name": "harness", "user": {"token": tok}}]
    cfg["contexts"] = [{"name": "harness", "context": {"cluster": cfg["clusters"][0]["name"], "user": "harness"}}]
    cfg["current-context"] = "harness"
    kc = tmp_path / "harness.kubeconfig"
    kc.write_text(yaml.safe_dump(cfg))
    as_harness = Kube(str(kc))
    out = _exec(as_harness.api, "server", ["sh", "-c", "echo reached"]).strip()
    assert out == "reached"
    pf = portforward(client.CoreV1Api(client.ApiClient(as_harness.api.configuration)).connect_get_namespaced_pod_portforward,
                     "server", NS, ports="8080", _request_timeout=30)
    sock = pf.socket(8080)
    sock.settimeout(10)
    sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
    assert sock.recv(12).startswith(b"HTTP/1.0 200")
    pf.close()
    nobody = Kube(c.user_kubeconfig("nobody"))
    with pytest.raises(Exception, match="403|Forbidden|forbidden"):
        _exec(nobody.api, "server", ["sh", "-c", "echo reached"])


def Path_rbac():
    from pathlib import Path

    return Path(__file__).resolve().parents[3] / "runtimes" / "k8s" / "rbac.yaml"


ATTACH_NS = "tiny-pd"  # the namespace families/pd/profiles/k8s-attach-local.yaml names


@pytest.mark.timeout(2700)  # two vLLM servers start and one restarts: minutes, more on a loaded machine
def test_attach_mode_drives_three_scenarios_against_a_plain_deployment(real, tmp_path):
    """A P/D deployment made first with plain manifests (tests/runtimes/k8s/plain_pd.py: vLLM's own
    MooncakeConnector, llm-d's role labels, a router; no pd-chaos label anywhere), then
    ``pdchaos run scenarios/pd-attach/ --attach``: a container kill (restart), a freeze and a
    partition, carried out by Chaos Mesh and exec, requests through the user's router. Every
    scenario gives its expected verdict; the user's objects are the same ones after (same
    Deployments and generations, same pods: only P's container restarted, once); nothing of the
    harness's is left; the servers' logs are in the run folder. Long (two vLLM servers start, one
    restarts): run where the real-kubelet tests are demanded (the nightly), not in .ci/run."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from kubernetes import client

    if os.environ.get(REQUIRE_ENV, "").strip() in ("", "0"):
        pytest.skip(f"not applicable: the attach-mode run takes ~6 min: it runs where {REQUIRE_ENV}=1 "
                    "demands the real-kubelet tests (the CPU nightly's real-kubelet job)")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import plain_pd

    c, api = real["cluster"], real["api"]
    core = client.CoreV1Api(api)
    root = Path(__file__).resolve().parents[3]
    t0 = time.monotonic()
    pods = plain_pd.deploy(api, c, ATTACH_NS, timeout_s=900.0)
    print(f"\nthe user's deployment ready in {time.monotonic() - t0:.1f} s")
    try:
        before = plain_pd.inventory(api, ATTACH_NS)
        runs = tmp_path / "runs"
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "harness.cli", "run", "scenarios/pd-attach/", "--profile",
                              "families/pd/profiles/k8s-attach-local.yaml", "--attach", "--target", "upstream",
                              "--strict", "--plain", "--runs-dir", str(runs)],
                             cwd=root, capture_output=True, text=True, timeout=1700,
                             env={**os.environ, "PDCHAOS_KUBECONFIG": c.kubeconfig})
        print(f"attach run: {time.monotonic() - t0:.1f} s\n{out.stdout[-3000:]}\n{out.stderr[-2000:]}")
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        (run_dir,) = [d for d in runs.iterdir() if d.is_dir()]
        summary = json.loads((run_dir / "summary.json").read_text())
        results = summary["results"]
        assert len(results) == 3 and all(r["as_expected"] for r in results), results
        after = plain_pd.inventory(api, ATTACH_NS)
        assert after["Deployment"] == before["Deployment"], "the user's Deployments are untouched"
        assert set(after["Pod"]) == set(before["Pod"]), "no pod of the user's was deleted or added"
        for name, (uid, restarts) in after["Pod"].items():
            assert uid == before["Pod"][name][0]
            grew = restarts[0] - before["Pod"][name][1][0]
            assert grew == (1 if name == pods["prefill"].metadata.name else 0), (name, grew)
        for kind in ("Service", "ConfigMap", "ServiceAccount"):
            assert after[kind] == before[kind], f"no {kind} made or left"
        custom = client.CustomObjectsApi(api)
        for plural in ("podchaos", "networkchaos", "stresschaos"):
            left = custom.list_namespaced_custom_object("chaos-mesh.org", "v1alpha1", ATTACH_NS, plural,
                                                        _request_timeout=10)["items"]
            assert not left, f"{plural} left: {[o['metadata']['name'] for o in left]}"
        logs = list(run_dir.rglob("*.log"))
        served = [p for p in logs if "Starting vLLM" in p.read_text(errors="replace")
                  or "vLLM API server" in p.read_text(errors="replace")]
        assert served, f"the servers' logs are in the run folder ({len(logs)} logs)"
    finally:
        core.delete_namespace(ATTACH_NS, _request_timeout=30)


def test_a_stopped_node_keeps_its_pod_and_its_ports_refuse(real, tmp_path):
    """Where peers dial a node's pod address (``cluster.peers: pod-ip``), a stop ends the node and
    keeps its pod: a connection to its port is refused at once from another pod (a deleted pod's
    address answers nothing: a blackhole), the pod is no longer ready, the handle not alive, and
    starting the role again replaces the kept pod. The node is the fake prefill peer, whose stop is
    what pd-fake-prefill-silent's heal does."""
    from kubernetes import client

    from harness.procs import node_command
    from harness.runtime import Launch
    from runtimes.k8s.placement import K8sPlacement
    from runtimes.k8s.pods import pod_ready
    from runtimes.k8s.settings import ClusterSettings

    c, api = real["cluster"], real["api"]
    core = client.CoreV1Api(api)
    s = ClusterSettings(image=c.host_usr_image, image_pull_policy="Never", workload="deployment", cpu="100m",
                        memory="256Mi", python="same", host_mounts=["/usr", "/etc/alternatives", "{pdchaos}",
                                                                     "{python}"],
                        peers="pod-ip", run_dir_from_host=True, ready_timeout_s=120)
    core.create_namespaced_pod(NS, _pod_body(c, "dialer", {"app": "dialer"}, ["sleep", "3600"]), _request_timeout=30)
    _wait(_running(core, "dialer"), 120, "dialer Running")
    role, side = "fake-prefill:0", 8311
    args = ["--bootstrap-port", "8310", "--side-port", str(side), "--mode", "silent", "--host", "0.0.0.0",
            "--advertise-host", "$(POD_IP)", "--control", "ipc:///tmp/unused.sock"]
    launch = Launch(role=role, kind="pd-fake-prefill", argv=node_command("pd-fake-prefill", args),
                    name="node pd-fake-prefill", log_path=str(tmp_path / "fake.log"), ready_timeout_s=120,
                    env={"PDCHAOS_FAMILY": "pd"}, workdir=str(tmp_path))
    pl = K8sPlacement(f"keep{os.getpid()}", s, kubeconfig=c.kubeconfig)
    dial = ("import socket,sys\ntry:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()\n"
            "    print('connected')\nexcept OSError as e:\n    print(type(e).__name__)\n")
    try:
        h = pl.start(launch)
        ip = pl.pod_ip(role)
        assert ip and h.alive and h.keep_pod

        def connect() -> str:
            return _exec(api, "dialer", ["python3", "-c", dial, ip, str(side)]).strip()

        assert _wait(lambda: connect() == "connected", 30, "the fake peer's side port answers from another pod")
        t0 = time.monotonic()
        h.stop(2.0)
        took = time.monotonic() - t0
        assert h.kept and not h.alive and h.gone(0.0)
        t1 = time.monotonic()
        assert connect() == "ConnectionRefusedError", "a stopped node's port refuses, its address stays"
        refused_in = time.monotonic() - t1
        pod = core.read_namespaced_pod(h.pod_name, h.namespace, _request_timeout=10).to_dict()
        assert pod["status"]["pod_ip"] == ip and pod["metadata"]["uid"] == h.instance
        assert pod["status"]["container_statuses"][0]["restart_count"] == 0, "nothing restarted the node"
        _wait(lambda: not pod_ready(pl.kube.get("v1", "Pod", h.pod_name, h.namespace)), 10, "the kept pod not ready")
        print(f"stop in {took:.1f} s, a connection refused in {refused_in:.2f} s (through exec)")
        h2 = pl.start(launch)  # the role again: the kept pod goes first
        assert h2.instance != h.instance and h2.alive
        assert pl.kube.get("v1", "Pod", h.pod_name, h.namespace) is None
    finally:
        assert pl.close() == []
        core.delete_namespaced_pod("dialer", NS, grace_period_seconds=0, _request_timeout=30)


def test_stop_leaves_the_host_as_found(real):
    c, before = real["cluster"], real["before"]
    folder = str(c.dir)
    t0 = time.monotonic()
    c.stop()
    print(f"stopped and cleaned in {time.monotonic() - t0:.1f} s")
    assert c.cleanup_problems == []
    _assert_as_before(before, _host_state(), folder)
    assert realnode.processes_of(folder) == []
    assert not os.path.exists(folder)


def _assert_as_before(before: dict, after: dict, folder: str) -> None:
    """Nothing of the cluster's is left. Other programs may change the host meanwhile (the suite
    runs in parallel: `ip netns` makes /run/netns, other tests add links), so mounts and links are
    judged by whose they are: under the cluster's folder, the pods' cni-* namespaces, the bridge."""
    new_mounts = after["mounts"] - before["mounts"]
    assert [m for m in new_mounts if m.startswith(folder) or "/netns/cni-" in m] == []
    assert realnode.BRIDGE not in after["links"] - before["links"]
    assert after["kubepods"] == before["kubepods"]
    for key, chains in after["chains"].items():
        assert chains - before["chains"].get(key, set()) == set(), key
    for key in ("sysctls", "run_containerd", "var_lib_cni", "var_log_containers", "var_lib_kubelet"):
        assert after[key] == before[key], key


def test_the_watchdog_cleans_up_when_the_owner_is_killed(real):
    """`pdchaos cluster up`'s background process (realnode.serve) SIGKILLed with a pod running:
    its watchdog kills the components and the pod and leaves the host as found."""
    import json
    import signal
    import subprocess
    import sys
    import tempfile

    before = _host_state()
    state = os.path.join(tempfile.mkdtemp(prefix="pdchaos-real-test-"), "state.json")
    code = f"from runtimes.k8s.realnode import serve; serve({state!r})"
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        up = _wait(lambda: os.path.exists(state) and json.load(open(state)), 240, "the background cluster up")
        assert up["state"] == "up", up
        from kubernetes import client, config

        api = config.new_client_from_config(config_file=up["kubeconfig"])
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": NS}}, _request_timeout=30)
        vols, mounts = realnode.RealCluster.host_usr_volumes()
        body = {"metadata": {"name": "orphan"}, "spec": {"terminationGracePeriodSeconds": 1, "volumes": vols,
                "containers": [{"name": "main", "image": up["host_usr_image"], "imagePullPolicy": "Never",
                                "command": ["sleep", "3600"], "volumeMounts": mounts}]}}
        core.create_namespaced_pod(NS, body, _request_timeout=30)
        _wait(_running(core, "orphan"), 120, "pod orphan Running")
        api.close()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    folder = up["dir"]
    _wait(lambda: not os.path.exists(folder), 120, "the watchdog removed the cluster's folder")
    _assert_as_before(before, _host_state(), folder)
    assert realnode.processes_of(folder) == []
    if os.path.exists(state):
        os.unlink(state)
    os.rmdir(os.path.dirname(state))


def test_a_component_not_ready_in_time_is_one_line_and_leaves_nothing(real):
    before = _host_state()
    c = realnode.RealCluster(ready_timeout_s=0.3)
    with pytest.raises(realnode.HarnessError, match=r"^real cluster: [\w-]+ not ready within 0.3 s; last log lines: "):
        c.start()
    assert c.cleanup_problems == []
    _assert_as_before(before, _host_state(), str(c.dir))
    assert not c.dir.exists()


def test_cli_up_status_down(real):
    """`pdchaos cluster up` returns with the cluster running in the background and prints the
    kubeconfig to export; `status` sees it; `up` again says so; `down` leaves the host as found."""
    import subprocess
    import sys

    def cli(*args, timeout=300):
        return subprocess.run([sys.executable, "-m", "harness.cli", "cluster", *args], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    before = _host_state()
    up = cli("up")
    assert up.returncode == 0, up.stderr
    export = [ln for ln in up.stdout.splitlines() if ln.startswith("export PDCHAOS_KUBECONFIG=")]
    assert export and os.path.isfile(export[0].split("=", 1)[1])
    folder = os.path.dirname(export[0].split("=", 1)[1])
    try:
        status = cli("status", timeout=60)
        assert status.returncode == 0 and "nodes Ready: pdchaos-node" in status.stdout, status.stdout + status.stderr
        again = cli("up", timeout=60)
        assert again.returncode == 0 and "already up" in again.stdout
    finally:
        down = cli("down")
    assert down.returncode == 0, down.stderr
    assert cli("status", timeout=60).returncode == 1
    _assert_as_before(before, _host_state(), folder)
    assert realnode.processes_of(folder) == []
