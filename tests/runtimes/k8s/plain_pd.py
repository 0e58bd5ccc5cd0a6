"""A user's P/D deployment, as a user writes it: plain Deployments, no pd-chaos labels.

What attach mode is tested against (test_real_kubelet.py): a prefill and a decode vLLM server
(``vllm serve`` of the P/D node env with vLLM's MooncakeConnector, the tiny model), each a
Deployment labelled the way llm-d labels its pods (``llm-d.ai/role: prefill|decode``), its serving
container named ``vllm`` with named ports ``http`` and ``bootstrap``; and a router Deployment (the
P/D proxy, started as a plain program: ``python -m harness.cli node pd-proxy`` with no control
channel) that the client sends its completions to. This machine's cluster has no DNS and no
Service routing, so the router is made after P and D are ready, with their pod addresses
(a container-kill keeps a pod's address; a pod-kill would not).

The pods run the local host-/usr image and mount the node env, the model and pd-chaos read-only
from this machine, as the k8s-local profile's pods do (no multi-GB image).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

APP = "tiny-pd"
HTTP, BOOTSTRAP, ROUTER = 8000, 8998, 8080
ABORT_TIMEOUT_S = 10  # VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT, as the P/D suite's topology sets it


def _paths() -> tuple[Path, Path, Path, Path]:
    from stacks.vllm_cpu.recipe import pd_node_env
    from stacks.vllm_cpu.tiny_model import model_dir

    repo = Path(__file__).resolve().parents[3]
    return pd_node_env(out=lambda *a: None).path, model_dir(), repo, Path(os.path.realpath(sys.executable))


def _volumes(cluster) -> tuple[list[dict], list[dict]]:
    env, model, repo, python = _paths()
    pyroot = python.parents[1]  # pyenv's version folder: the venvs' python points into it
    return cluster.host_usr_volumes((str(env), str(model), str(repo), str(pyroot)))


def vllm_deployment(cluster, role: str, core: int) -> dict:
    env, model, _, _ = _paths()
    kv = {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
          "kv_load_failure_policy": "fail", "kv_connector_extra_config": {"mooncake_protocol": "tcp"}}
    vols, mounts = _volumes(cluster)
    # vLLM's shared-memory queues need more than a container's 64 MiB /dev/shm (as every vLLM manifest has it)
    vols = [*vols, {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}]
    mounts = [*mounts, {"name": "dshm", "mountPath": "/dev/shm"}]
    labels = {"app": APP, "llm-d.ai/role": role}
    container = {
        "name": "vllm", "image": cluster.host_usr_image, "imagePullPolicy": "Never",
        "command": [str(env / "bin" / "vllm"), "serve", str(model), "--host", "0.0.0.0", "--port", str(HTTP),
                    "--dtype", "bfloat16", "--max-model-len", "512", "--max-num-seqs", "8", "--enforce-eager",
                    "--no-enable-prefix-caching", "--kv-transfer-config", json.dumps(kv, separators=(",", ":"))],
        "env": [{"name": "VLLM_HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "VLLM_MOONCAKE_BOOTSTRAP_PORT", "value": str(BOOTSTRAP)},
                {"name": "VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT", "value": str(ABORT_TIMEOUT_S)},
                {"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"},
                {"name": "VLLM_CPU_OMP_THREADS_BIND", "value": str(core)},
                {"name": "HF_HUB_OFFLINE", "value": "1"}, {"name": "TRANSFORMERS_OFFLINE", "value": "1"},
                {"name": "VLLM_NO_USAGE_STATS", "value": "1"}, {"name": "PYTHONNOUSERSITE", "value": "1"}],
        "ports": [{"name": "http", "containerPort": HTTP}, {"name": "bootstrap", "containerPort": BOOTSTRAP}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": HTTP}, "periodSeconds": 1, "failureThreshold": 2},
        "resources": {"requests": {"cpu": "100m", "memory": "2Gi"}},
        "volumeMounts": mounts}
    return _deployment(f"{APP}-{role}", labels, container, vols, grace_s=5)


def router_deployment(cluster, p_ip: str, d_ip: str) -> dict:
    _, _, repo, python = _paths()
    vols, mounts = _volumes(cluster)
    labels = {"app": APP, "app.kubernetes.io/component": "router"}
    container = {
        "name": "router", "image": cluster.host_usr_image, "imagePullPolicy": "Never",
        "command": [str(python), "-m", "harness.cli", "node", "pd-proxy", "--host", "0.0.0.0", "--port", str(ROUTER),
                    "--prefill", f"http://{p_ip}:{HTTP}", "--prefill-bootstrap", f"http://{p_ip}:{BOOTSTRAP}",
                    "--decode", f"http://{d_ip}:{HTTP}", "--timeout-s", "20", "--order", "parallel"],
        "workingDir": str(repo),
        "env": [{"name": "PDCHAOS_POD", "value": "1"}, {"name": "PDCHAOS_FAMILY", "value": "pd"},
                {"name": "PYTHONPATH", "value": str(repo)}, {"name": "PYTHONNOUSERSITE", "value": "1"}],
        "ports": [{"name": "http", "containerPort": ROUTER}],
        "readinessProbe": {"tcpSocket": {"port": ROUTER}, "periodSeconds": 1},
        "volumeMounts": mounts}
    return _deployment(f"{APP}-router", labels, container, vols, grace_s=1)


def _deployment(name: str, labels: dict, container: dict, volumes: list[dict], grace_s: int) -> dict:
    """One replica of one container, as a user writes a Deployment."""
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"terminationGracePeriodSeconds": grace_s, "volumes": volumes,
                                           "containers": [container]}}}}


def _ready_pod(core, ns: str, selector: str, timeout_s: float) -> dict:
    end = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < end:
        pods = core.list_namespaced_pod(ns, label_selector=selector, _request_timeout=10).items
        for p in pods:
            last = p
            st = p.status
            if st.phase == "Running" and st.container_statuses and all(c.ready for c in st.container_statuses):
                return p
        time.sleep(1.0)
    raise AssertionError(f"no ready pod for {selector} in {ns} within {timeout_s:g} s "
                         f"(last: {last.status.phase if last else 'none'})")


def deploy(api, cluster, ns: str, timeout_s: float = 420.0) -> dict:
    """Make the deployment in namespace ``ns`` (made here); returns the ready pods by role."""
    from kubernetes import client

    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    core.create_namespace({"metadata": {"name": ns}}, _request_timeout=30)
    for role, c in (("prefill", 0), ("decode", 1)):
        apps.create_namespaced_deployment(ns, vllm_deployment(cluster, role, c), _request_timeout=30)
    p = _ready_pod(core, ns, "llm-d.ai/role=prefill", timeout_s)
    d = _ready_pod(core, ns, "llm-d.ai/role=decode", timeout_s)
    apps.create_namespaced_deployment(ns, router_deployment(cluster, p.status.pod_ip, d.status.pod_ip),
                                      _request_timeout=30)
    r = _ready_pod(core, ns, "app.kubernetes.io/component=router", 120.0)
    return {"prefill": p, "decode": d, "router": r}


def inventory(api, ns: str) -> dict:
    """Every object of the namespace a run could touch, by kind: name -> (uid, generation or
    restart counts), to compare before and after a run."""
    from kubernetes import client

    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    out: dict = {"Deployment": {}, "Pod": {}, "Service": {}, "ConfigMap": {}, "ServiceAccount": {}}
    for d in apps.list_namespaced_deployment(ns, _request_timeout=10).items:
        out["Deployment"][d.metadata.name] = (d.metadata.uid, d.metadata.generation)
    for p in core.list_namespaced_pod(ns, _request_timeout=10).items:
        out["Pod"][p.metadata.name] = (p.metadata.uid, tuple(c.restart_count for c in p.status.container_statuses or []))
    for s in core.list_namespaced_service(ns, _request_timeout=10).items:
        out["Service"][s.metadata.name] = (s.metadata.uid, None)
    for s in core.list_namespaced_config_map(ns, _request_timeout=10).items:
        out["ConfigMap"][s.metadata.name] = (s.metadata.uid, None)
    for s in core.list_namespaced_service_account(ns, _request_timeout=10).items:
        out["ServiceAccount"][s.metadata.name] = (s.metadata.uid, None)
    return out
