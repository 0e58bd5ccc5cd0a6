"""The k8s runtime's objects, as data (runtimes/k8s/manifests.py): labels that find a run's
leftovers, one workload per role with the conventional role label, LeaderWorkerSet or Deployment,
NPU resources and the shared model cache, the node's command in its pod, and each fault's Chaos
Mesh object (or none)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtimes.k8s import manifests as M
from runtimes.k8s.settings import ClusterSettings

pytestmark = pytest.mark.timeout(30)
S = ClusterSettings(image="img:1", model_cache_claim="models", npu_per_pod=1)
ARGV = ["/usr/bin/python3.11", "-m", "harness.cli", "node", "vllm", "--port", "8100", "--server-log",
        "/tmp/run-7/server-logs/p.log", "--control", "ipc:///tmp/x/prefill-0-ctl.sock"]
EP = {"http": "http://prefill-0.ns.svc:8100", "bootstrap": "http://prefill-0.ns.svc:8998"}
ROLES = ["prefill:0", "decode:0", "proxy"]


def test_every_object_carries_the_run_and_managed_by_labels() -> None:
    objs = [M.namespace(S, "r1"), M.service_account(S, "r1"),
            *M.workload(S, "r1", "hardened", "prefill:0", "vllm", ARGV, {}, EP, "/tmp/run-7", lws=True),
            M.chaos_object("kill", {"node": "prefill:0"}, ROLES, "r1", S, 0)]
    for o in objs:
        lab = o["metadata"]["labels"]
        assert lab["app.kubernetes.io/managed-by"] == "pd-chaos" and lab[M.RUN_LABEL] == "r1", o["kind"]
        assert o["kind"] == "Namespace" or o["metadata"]["namespace"] == "pdchaos-r1"


def test_a_vllm_role_is_a_leaderworkerset_with_npus_and_the_model_cache() -> None:
    lws, svc = M.workload(S, "r1", "hardened", "prefill:0", "vllm", ARGV, {"A": "1"}, EP, "/tmp/run-7", lws=True)
    assert lws["kind"] == "LeaderWorkerSet" and lws["spec"]["leaderWorkerTemplate"]["size"] == 1
    pod = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    assert pod["metadata"]["labels"]["role"] == "prefill"
    c = pod["spec"]["containers"][0]
    assert c["resources"]["limits"] == {"huawei.com/ascend-1980": "1"}
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "models"}} in pod["spec"]["volumes"]
    assert c["args"][0] == "python3" and c["args"][-1] == "tcp://0.0.0.0:5599"  # the control channel on the pod's port
    assert "/var/run/pdchaos/run/server-logs/p.log" in c["args"]  # the run folder's paths, in the pod
    # ... whose folders exist before the node starts (a fresh emptyDir holds none)
    assert c["command"][2].startswith("mkdir -p /var/run/pdchaos/run /var/run/pdchaos/run/server-logs && ")
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP" and env["PDCHAOS_POD"]["value"] == "1"
    assert sorted(p["port"] for p in svc["spec"]["ports"]) == [5599, 8100, 8998]
    dep, _ = M.workload(S, "r1", "hardened", "prefill:0", "vllm", ARGV, {}, EP, None, lws=False)
    assert dep["kind"] == "Deployment" and dep["spec"]["strategy"] == {"type": "Recreate"}
    proxy, _ = M.workload(S, "r1", "hardened", "proxy", "pd-proxy", ARGV, {}, {}, None, lws=True)
    assert proxy["kind"] == "Deployment"  # only vLLM roles are LeaderWorkerSets
    assert "limits" not in proxy["spec"]["template"]["spec"]["containers"][0]["resources"]


def test_faults_map_to_chaos_mesh_objects_with_their_direction() -> None:
    kill = M.chaos_object("kill", {"node": "prefill:0"}, ROLES, "r1", S, 1)
    assert kill["kind"] == "PodChaos" and kill["spec"]["action"] == "pod-kill" and kill["spec"]["gracePeriod"] == 0
    assert kill["spec"]["selector"]["labelSelectors"][M.ROLE_LABEL] == "prefill-0"
    part = M.chaos_object("partition", {"direction": "client->server"}, ROLES, "r1", S, 2)
    assert part["kind"] == "NetworkChaos" and part["spec"]["direction"] == "to"
    assert part["spec"]["selector"]["expressionSelectors"][0]["values"] == ["decode-0", "proxy"]
    assert part["spec"]["target"]["selector"]["labelSelectors"][M.ROLE_LABEL] == "prefill-0"
    lat = M.chaos_object("latency", {"latency": 2.0, "jitter": 0.0}, ROLES, "r1", S, 0)
    assert lat["spec"]["action"] == "delay" and lat["spec"]["delay"]["latency"] == "2000ms"
    bw = M.chaos_object("bandwidth", {"rate": 64}, ROLES, "r1", S, 0)  # the toxic's KB/s
    assert bw["spec"]["bandwidth"]["rate"] == "512kbit"  # Chaos Mesh's kbps would be kilobytes
    assert M.chaos_object("bandwidth_limit", {"rate_kbit": 512}, ROLES, "r1", S, 0)["spec"]["bandwidth"]["rate"] == "512kbit"
    up = M.chaos_object("latency", {"latency": 1.0, "stream": "upstream"}, ROLES, "r1", S, 0)
    assert up["spec"]["target"]["selector"]["labelSelectors"][M.ROLE_LABEL] == "prefill-0"  # towards P
    assert lat["spec"]["selector"]["labelSelectors"][M.ROLE_LABEL] == "prefill-0"  # downstream: from P
    assert M.chaos_object("latency", {"latency": 1.0, "toxicity": 0.5}, ROLES, "r1", S, 0) is None
    stress = M.chaos_object("cpu_pressure", {"node": "decode:0", "workers": 2, "load": 80}, ROLES, "r1", S, 0)
    assert stress["kind"] == "StressChaos" and stress["spec"]["stressors"]["cpu"] == {"workers": 2, "load": 80}
    assert M.chaos_object("reset_peer", {}, ROLES, "r1", S, 0) is None
    assert M.chaos_object("fake_prefill_peer", {"mode": "silent"}, ROLES, "r1", S, 0) is None
    assert M.chaos_object("kill", {"node": "decode:7"}, ROLES, "r1", S, 0) is None  # no such role


def test_names_are_dns_labels() -> None:
    assert M.dns_name("fake-prefill:0") == "fake-prefill-0" and M.role_class("fake-prefill:0") == "prefill"
    assert len(M.namespace_name(S, "x" * 100)) <= 63


def test_lasting_objects_carry_a_duration_and_faults_are_refused_that_would_mean_another_fault() -> None:
    """A partition, a delay, a bandwidth limit, a CPU stress: each ends by itself ``duration`` after
    it began (the window plus the injection bound), so a harness killed with SIGKILL leaves nothing
    injected past it; a pod-kill has no lasting effect. ``refuse`` (a reset at once) would become a
    silent drop on Chaos Mesh: refused, as are NetworkChaos actions the cluster's kernel lacks."""
    part = M.chaos_object("partition", {"direction": "both", "for": 8.0}, ROLES, "r1", S, 0)
    assert part["spec"]["duration"] == f"{int(8 + M.DURATION_SLACK_S)}s"
    for t, p in (("latency", {"latency": 1.0, "for": 3}), ("bandwidth", {"rate": 64, "for": 3}),
                 ("cpu_pressure", {"node": "decode:0", "for": 3})):
        obj = M.chaos_object(t, p, ROLES, "r1", S, 0)
        assert obj["spec"]["duration"] == f"{int(3 + M.DURATION_SLACK_S)}s", t
    assert "duration" not in M.chaos_object("kill", {"node": "prefill:0", "for": 3}, ROLES, "r1", S, 0)["spec"]
    restart = M.chaos_object("restart", {"node": "decode:0", "for": 1}, ROLES, "r1", S, 0)
    assert restart["spec"]["action"] == "container-kill" and restart["spec"]["containerNames"] == [M.CONTAINER]
    assert M.chaos_object("refuse", {"direction": "both", "for": 3}, ROLES, "r1", S, 0) is None
    assert "silently" in M.why_not("refuse", {}, S)
    no_netem = ClusterSettings(image="img:1", network_actions=["partition", "bandwidth"])
    assert M.chaos_object("latency", {"latency": 1.0, "for": 3}, ROLES, "r1", no_netem, 0) is None
    assert "sch_netem" in M.why_not("latency", {}, no_netem)
    assert M.chaos_object("partition", {"for": 3}, ROLES, "r1", no_netem, 0) is not None


def test_where_peers_dial_pod_addresses_a_kill_keeps_the_pod_and_node_down_is_refused() -> None:
    """cluster.peers: pod-ip (no Service routing): a pod-kill's new pod would get an address its
    peers never learn, so ``kill`` is a container-kill (the pod and its address stay, the node is
    dead until its container serves again); ``node_down`` (the workload deleted and applied again)
    is refused with that reason. With Services, ``kill`` stays a pod-kill."""
    pod_ip = ClusterSettings(image="img:1", peers="pod-ip")
    kill = M.chaos_object("kill", {"node": "prefill:0", "for": 3}, ROLES, "r1", pod_ip, 0)
    assert kill["spec"]["action"] == "container-kill" and kill["spec"]["containerNames"] == [M.CONTAINER]
    assert kill["spec"]["selector"] == M.chaos_object("kill", {"node": "prefill:0", "for": 3}, ROLES, "r1", S,
                                                      0)["spec"]["selector"]
    assert M.chaos_object("kill", {"node": "prefill:0"}, ROLES, "r1", S, 0)["spec"]["action"] == "pod-kill"
    assert M.why_not("kill", {}, pod_ip) is None
    assert "would not learn" in M.why_not("node_down", {}, pod_ip) and M.why_not("node_down", {}, S) is None


def test_host_mounts_and_the_run_folder_from_the_host() -> None:
    """A single-node cluster: the node env, the model and pd-chaos mounted read-only at their own
    paths, the harness's interpreter, and the run folder itself, so every log lands there."""
    s = ClusterSettings(image="host-usr:1", python="same", host_mounts=["/root/.cache/pdchaos"],
                        run_dir_from_host=True)
    dep, _ = M.workload(s, "r1", "hardened", "proxy", "pd-proxy", ARGV, {}, {}, "/tmp/run-7", lws=False)
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["args"][0] == "/usr/bin/python3.11" and "/tmp/run-7/server-logs/p.log" in c["args"]
    assert {"name": "host-0", "mountPath": "/root/.cache/pdchaos", "readOnly": True} in c["volumeMounts"]
    assert {"name": "run-folder", "hostPath": {"path": "/tmp/run-7", "type": "Directory"}} in pod["volumes"]
    assert "mkdir -p /tmp/run-7 /tmp/run-7/server-logs" in c["command"][2]
    assert not any(e["name"] == "PYTHONPATH" for e in c["env"])  # pd-chaos is not mounted: the image's own


def test_a_pod_imports_the_mounted_pd_chaos_not_the_interpreter_s_install() -> None:
    """With ``{pdchaos}`` mounted, the pod's Python imports pd-chaos from that folder (the checkout
    the harness runs from): the host interpreter's editable install may name another checkout,
    which the pod does not see (a clean clone's run found `No module named 'harness'`)."""
    s = ClusterSettings(image="host-usr:1", python="same", host_mounts=["{pdchaos}", "/usr"], run_dir_from_host=True)
    assert M.PDCHAOS_ROOT in s.host_mounts and (Path(M.PDCHAOS_ROOT) / "harness" / "cli").is_dir()
    dep, _ = M.workload(s, "r1", "hardened", "proxy", "pd-proxy", ARGV, {}, {}, "/tmp/run-7", lws=False)
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "PYTHONPATH", "value": M.PDCHAOS_ROOT} in c["env"]


def test_attach_finds_roles_by_llm_d_s_label_then_the_plain_one() -> None:
    from runtimes.k8s.attach import selectors_of
    from runtimes.k8s.settings import Attach

    a = Attach(namespace="user", selectors={"decode:0": "app=my-decode"}, container="vllm")
    got = selectors_of(a, ["prefill:0", "decode:0", "proxy"])
    assert got == {"decode:0": ["app=my-decode"], "prefill:0": ["llm-d.ai/role=prefill", "role=prefill"]}
