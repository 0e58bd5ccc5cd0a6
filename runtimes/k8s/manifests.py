"""The Kubernetes objects of one run, as plain dicts (pure functions: rendered the same by
``--dry-run``, by the tests and by a real run).

* **Namespace** ``PREFIX-RUNID``: made by the run, deleted at its end; everything else lives in it.
* **One workload per role** (``role: prefill|decode|proxy|store`` labels, as llm-d and SGLang
  deploy them): a LeaderWorkerSet of size 1 for a vLLM role when its CRD is installed (vllm-ascend's
  multi-node nightly), a Deployment (one replica, ``Recreate``) otherwise and for the other roles,
  and a Service naming the role's ports. The container runs ``pdchaos node KIND ARGS`` under a
  small shell that forwards SIGTERM (so ``kill -STOP -1`` through exec freezes the node but not
  the pod's first process).
* **Chaos Mesh objects** for the faults Chaos Mesh has (:func:`chaos_object`): kill -> ``PodChaos``
  pod-kill (a container-kill where peers dial pod addresses), restart -> container-kill; partition and refuse -> ``NetworkChaos`` partition with its direction;
  latency -> ``NetworkChaos`` delay; bandwidth limits -> ``NetworkChaos`` bandwidth; CPU pressure ->
  ``StressChaos``.

Every object carries ``app.kubernetes.io/managed-by: pd-chaos`` and ``pd-chaos.io/run: RUNID``, so
the run's leftovers are found by label (also after Ctrl-C, and by ``pdchaos clean``).
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from .settings import PDCHAOS_ROOT, ClusterSettings

MANAGED_BY = {"app.kubernetes.io/managed-by": "pd-chaos"}
RUN_LABEL = "pd-chaos.io/run"
ROLE_LABEL = "pd-chaos.io/role"
CHAOS_API = "chaos-mesh.org/v1alpha1"
LWS_API = "leaderworkerset.x-k8s.io/v1"
RUN_DIR = "/var/run/pdchaos"  # the run folder inside a pod (an emptyDir): logs, journal parts
READY_FILE = RUN_DIR + "/ready"  # what the node's readiness probe looks for
# made by a stop that keeps the pod (pods.PodHandle, cluster.peers: pod-ip): the first process stays
# when the node has ended, so the pod keeps its address and the node's ports refuse connections
STOPPED_FILE = RUN_DIR + "/stopped"
VLLM_KINDS = ("vllm",)
CONTAINER = "node"  # the node's container in the pods the harness makes (attach mode: the user's own name)
# The first process of the container: starts the node as its child, forwards SIGTERM to it and
# exits with its code. A node that is not PID 1 can be frozen with `kill -STOP -1` through exec.
# When the node ended because the harness stopped it and keeps the pod (STOPPED_FILE), it stays,
# sleeping, until the pod is deleted: no restart brings the node back, the pod's address stays.
ENTRY = ('trap \'kill -TERM "$child" 2>/dev/null\' TERM INT; "$@" & child=$!; '
         'wait "$child"; status=$?; wait "$child" 2>/dev/null; '
         f'if [ -e {STOPPED_FILE} ]; then trap "exit 0" TERM INT; while :; do sleep 3600 & wait $!; done; fi; '
         'exit "$status"')


def dns_name(role: str) -> str:
    """A role as a DNS label: ``prefill:0`` -> ``prefill-0``."""
    return re.sub(r"[^a-z0-9-]", "-", role.lower()).strip("-")[:63]


def role_class(role: str) -> str:
    """The conventional ``role`` label: ``prefill:0`` -> ``prefill``; ``fake-prefill:0`` -> ``prefill``."""
    base = role.split(":")[0]
    return base.removeprefix("fake-")


def namespace_name(settings: ClusterSettings, run_id: str) -> str:
    return f"{settings.namespace_prefix}-{dns_name(run_id)}"[:63].rstrip("-")


def labels(run_id: str, role: str | None = None, target: str | None = None) -> dict[str, str]:
    out = {**MANAGED_BY, RUN_LABEL: dns_name(run_id)}
    if role is not None:
        out.update({ROLE_LABEL: dns_name(role), "role": role_class(role)})
    if target is not None:
        out["pd-chaos.io/target"] = target
    return out


RUNNER_ANNOTATION = "pd-chaos.io/runner"  # HOST/PID of the harness that made it: `pdchaos clean` spares live runs


def runner_id() -> str:
    import os
    import socket

    return f"{socket.gethostname()}/{os.getpid()}"


def namespace(settings: ClusterSettings, run_id: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": namespace_name(settings, run_id), "labels": labels(run_id)}}


def service_account(settings: ClusterSettings, run_id: str) -> dict:
    """The nodes' ServiceAccount in the run's namespace (a pod naming one that is missing is refused)."""
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": settings.service_account, "namespace": namespace_name(settings, run_id),
                         "labels": labels(run_id)}}


def ports_of(endpoints: dict[str, str]) -> dict[str, int]:
    """endpoint name -> port, from addresses such as ``http://127.0.0.1:8000`` or ``tcp://h:5``."""
    out = {}
    for name, addr in sorted(endpoints.items()):
        m = re.search(r":(\d{2,5})(/|$)", addr)
        if m:
            out[dns_name(name)[:15]] = int(m.group(1))
    return out


POD_IP_ARG = "$(POD_IP)"  # expanded by the kubelet from the container's env (the downward API)


def pod_argv(argv: list[str], control_port: int, workdir: str | None, python: str = "python3",
             run_dir_from_host: bool = False) -> list[str]:
    """The node's command as it runs in its pod: ``python3 -m harness.cli node ...`` (the image's
    Python, or ``same``: the harness's own), the control channel on TCP on every address of the pod
    (ipc sockets do not cross pods; the harness reaches it through a port-forward), the run
    folder's paths under :data:`RUN_DIR` (unless the run folder is mounted from the host)."""
    out = [argv[0] if python == "same" else python] + list(argv[1:])
    for i, a in enumerate(out):
        if out[i - 1] == "--control" and i > 0:
            out[i] = f"tcp://0.0.0.0:{control_port}"
        elif workdir and a.startswith(workdir) and not run_dir_from_host:
            out[i] = RUN_DIR + "/run" + a[len(workdir):]
    return out


def run_folders(args: list[str], workdir: str | None, run_dir_from_host: bool = False) -> list[str]:
    """The folders of the run-folder paths a node's command names (``--server-log``, journal parts),
    as the pod sees them: made before the node starts (a fresh emptyDir holds none of them)."""
    import posixpath

    base = workdir if run_dir_from_host and workdir else RUN_DIR + "/run"
    return sorted({posixpath.dirname(a) for a in args if a.startswith(base + "/")} | {base})


def pod_spec(settings: ClusterSettings, role: str, kind: str, argv: list[str], env: dict[str, str],
             ports: dict[str, int], workdir: str | None) -> dict:
    vllm = kind in VLLM_KINDS
    resources: dict[str, Any] = {"requests": {"cpu": settings.cpu, "memory": settings.memory}}
    if vllm and settings.npu_per_pod:
        n = str(settings.npu_per_pod)
        resources["requests"][settings.npu_resource] = n
        resources["limits"] = {settings.npu_resource: n}
    container_ports = [{"name": n, "containerPort": p} for n, p in ports.items()]
    container_ports.append({"name": "control", "containerPort": settings.control_port})
    mounts = [{"name": "run", "mountPath": RUN_DIR}]
    volumes: list[dict] = [{"name": "run", "emptyDir": {}}]
    if settings.run_dir_from_host and workdir:
        mounts.append({"name": "run-folder", "mountPath": workdir})
        volumes.append({"name": "run-folder", "hostPath": {"path": workdir, "type": "Directory"}})
    for i, path in enumerate(settings.host_mounts):
        mounts.append({"name": f"host-{i}", "mountPath": path, "readOnly": True})
        volumes.append({"name": f"host-{i}", "hostPath": {"path": path, "type": "Directory"}})
    args = pod_argv(argv, settings.control_port, workdir, settings.python, settings.run_dir_from_host)
    mkdir = "mkdir -p " + " ".join(shlex.quote(d) for d in run_folders(args, workdir, settings.run_dir_from_host))
    pod_env = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
               # the node says it serves (nodekit's announce_ready) in this file: the readiness probe
               {"name": "PDCHAOS_READY_FILE", "value": READY_FILE},
               # the node's endpoint rules (nodekit/nodeio.py): a node in a pod may listen on its pod's
               # addresses and name its peers by their Services
               {"name": "PDCHAOS_POD", "value": "1"}]
    if PDCHAOS_ROOT in settings.host_mounts:
        # the pod runs the pd-chaos mounted from this machine, the one the harness runs from: not
        # whatever checkout the interpreter's own install (an editable one) names, which may be
        # another folder, not mounted
        pod_env.append({"name": "PYTHONPATH", "value": PDCHAOS_ROOT})
    if vllm:
        mounts += [{"name": "model-cache", "mountPath": settings.model_cache_path},
                   {"name": "dshm", "mountPath": "/dev/shm"}]
        volumes += [{"name": "model-cache", **({"persistentVolumeClaim": {"claimName": settings.model_cache_claim}}
                                               if settings.model_cache_claim else {"emptyDir": {}})},
                    {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}]
    return {
        "serviceAccountName": settings.service_account,
        "terminationGracePeriodSeconds": 10,
        "containers": [{
            "name": CONTAINER,
            "image": settings.image,
            "imagePullPolicy": settings.image_pull_policy,
            # a restarted container starts not ready (the emptyDir keeps the last one's file)
            "command": ["sh", "-c", f"{mkdir} && rm -f {READY_FILE} {STOPPED_FILE} && {ENTRY}", "pdchaos-node"],
            "args": args,
            "env": pod_env + [{"name": k, "value": v} for k, v in sorted(env.items())],
            "ports": container_ports,
            # ready when the node said so (as the local runtime waits for its READY line), not when
            # its control port opens (a vLLM node opens it long before vLLM serves)
            "readinessProbe": {"exec": {"command": ["test", "-e", READY_FILE]}, "periodSeconds": 1},
            "resources": resources,
            "volumeMounts": mounts,
        }],
        "volumes": volumes,
    }


def workload(settings: ClusterSettings, run_id: str, target: str, role: str, kind: str, argv: list[str],
             env: dict[str, str], endpoints: dict[str, str], workdir: str | None, lws: bool) -> list[dict]:
    """The workload of one role and its Service."""
    ns = namespace_name(settings, run_id)
    name = dns_name(role)
    lab = labels(run_id, role, target)
    ports = ports_of(endpoints)
    template = {"metadata": {"labels": lab}, "spec": pod_spec(settings, role, kind, argv, env, ports, workdir)}
    meta = {"name": name, "namespace": ns, "labels": lab}
    if kind in VLLM_KINDS and lws:
        obj = {"apiVersion": LWS_API, "kind": "LeaderWorkerSet", "metadata": meta,
               "spec": {"replicas": 1, "startupPolicy": "LeaderCreated",
                        # size 1: the leader is the only pod, made from workerTemplate (LWS requires it;
                        # a leaderTemplate only where the leader differs from its workers)
                        "leaderWorkerTemplate": {"size": 1, "restartPolicy": "None", "workerTemplate": template}}}
    else:
        obj = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
               "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                        "selector": {"matchLabels": {RUN_LABEL: lab[RUN_LABEL], ROLE_LABEL: lab[ROLE_LABEL]}},
                        "template": template}}
    svc_ports = [{"name": n, "port": p, "targetPort": p} for n, p in ports.items()]
    svc_ports.append({"name": "control", "port": settings.control_port, "targetPort": settings.control_port})
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": meta,
           "spec": {"selector": {RUN_LABEL: lab[RUN_LABEL], ROLE_LABEL: lab[ROLE_LABEL]}, "ports": svc_ports}}
    return [obj, svc]


def command_line(obj: dict) -> str:
    """The node command a workload runs, as one shell line (for reports)."""
    spec = obj["spec"]
    pod = spec.get("template") or spec["leaderWorkerTemplate"]["workerTemplate"]
    return shlex.join(pod["spec"]["containers"][0]["args"])


# --------------------------------------------------------------------------- Chaos Mesh


def _selector(ns: str, run_id: str, roles: list[str]) -> dict:
    sel: dict[str, Any] = {"namespaces": [ns], "labelSelectors": {RUN_LABEL: dns_name(run_id)}}
    if len(roles) == 1:
        sel["labelSelectors"][ROLE_LABEL] = dns_name(roles[0])
    else:
        sel["expressionSelectors"] = [{"key": ROLE_LABEL, "operator": "In", "values": sorted(map(dns_name, roles))}]
    return sel


def _matching(spec: str, roles: list[str]) -> list[str]:
    """The roles a fault's node spec names (``prefill:0``, ``prefill:*``, ``all``), as the
    topology reads it (harness/topology.py ``roles``)."""
    return [r for r in roles if spec == "all" or r == spec or (spec.endswith(":*") and r.startswith(spec[:-1]))]


def _ms(seconds: float) -> str:
    return f"{int(round(seconds * 1000))}ms"


# A fault of the harness -> how Chaos Mesh does the same. The side of a partition: the harness's
# namespace pair puts P on side b and D, the proxy and the client on side a (families' topologies);
# on a cluster every pod is a host of its own, so a partition cuts P's pods from D's and the proxy's.
SIDE_A = ("decode", "proxy", "store")
SIDE_B = ("prefill",)
DIRECTION = {"both": "both", "client->server": "to", "server->client": "from"}


# A Chaos Mesh object with a lasting effect (a partition, a delay, a stress) carries ``duration``:
# if the harness dies (SIGKILL) before it deletes the object at heal, Chaos Mesh recovers it by
# itself when that time is up. The window is the fault's ``for``; the controller may take up to the
# harness's injection bound (chaos.INJECT_TIMEOUT_S) to report it injected, so the duration is the
# window plus that bound plus a margin: never shorter than the window, never for ever.
DURATION_SLACK_S = 35.0
# The NetworkChaos actions each needs of the pods' kernel: delay (and loss, duplicate, corrupt) use
# netem, bandwidth uses tbf, partition uses iptables and ipset (ClusterSettings.network_actions).
NETWORK_ACTIONS = ("partition", "delay", "bandwidth")


def chaos_duration(params: dict) -> str:
    """``duration`` of a lasting object for a fault whose window is ``params["for"]`` seconds."""
    import math

    window = float(params.get("for") or params.get("for_") or 0.0)
    return f"{int(math.ceil(window + DURATION_SLACK_S))}s"


def why_not(fault_type: str, params: dict, settings: ClusterSettings) -> str | None:
    """Why this fault has no Chaos Mesh object that means what the scenario says, or None."""
    if fault_type == "refuse":
        return ("refuse is a TCP reset at once; Chaos Mesh's partition drops packets silently (a timeout), "
                "which is another fault")
    if fault_type == "node_down" and settings.peers == "pod-ip":
        return ("node_down replaces the node's pod, and on this cluster (cluster.peers: pod-ip, no Service "
                "routing) its peers would not learn the new pod's address")
    action = {"partition": "partition", "latency": "delay", "bandwidth": "bandwidth",
              "bandwidth_limit": "bandwidth"}.get(fault_type)
    if action and action not in settings.network_actions:
        return (f"NetworkChaos {action} is not available on this cluster (cluster.network_actions: "
                f"{', '.join(settings.network_actions) or 'none'}; "
                + ("delay needs the kernel's sch_netem" if action == "delay" else "bandwidth needs sch_tbf"
                   if action == "bandwidth" else "partition needs iptables and ipset") + ")")
    return None


def chaos_object(fault_type: str, params: dict, roles: list[str], run_id: str, settings: ClusterSettings,
                 index: int, target: str | None = None) -> dict | None:
    """The Chaos Mesh object that carries out this fault on the run's pods, or None when Chaos
    Mesh has no equivalent (:func:`why_not` says why). ``roles``: the run's roles; ``params``: the
    fault's YAML fields, ``for`` (its window, seconds) included."""
    if why_not(fault_type, params, settings):
        return None
    ns = namespace_name(settings, run_id)
    side_a = [r for r in roles if role_class(r) in SIDE_A]
    side_b = [r for r in roles if role_class(r) in SIDE_B]
    meta = {"name": f"{dns_name(fault_type)}-{index}", "namespace": ns, "labels": labels(run_id, target=target)}
    lasting = {"duration": chaos_duration(params)}
    if fault_type in ("kill", "restart") and params.get("node"):
        spec = params["node"]
        hit = _matching(spec, roles)
        if not hit:
            return None
        # restart: started again at once in place, so the container, not the pod, is killed. So is a
        # kill where peers dial the pod's own address (pod-ip): a new pod's address its peers would not
        # learn, where the kubelet's restart keeps it; the node is dead (its ports refuse) until its
        # container serves again, which the heal waits for, as a local kill's heal waits for the node
        # it starts again (a vLLM server's start, 30-100 s, against a window of seconds)
        if fault_type == "restart" or settings.peers == "pod-ip":
            return {"apiVersion": CHAOS_API, "kind": "PodChaos", "metadata": meta,
                    "spec": {"action": "container-kill", "mode": "all", "containerNames": [CONTAINER],
                             "selector": _selector(ns, run_id, hit)}}
        return {"apiVersion": CHAOS_API, "kind": "PodChaos", "metadata": meta,
                "spec": {"action": "pod-kill", "mode": "all", "gracePeriod": 0, "selector": _selector(ns, run_id, hit)}}
    if fault_type == "partition" and side_a and side_b:
        return {"apiVersion": CHAOS_API, "kind": "NetworkChaos", "metadata": meta,
                "spec": {"action": "partition", "mode": "all", "selector": _selector(ns, run_id, side_a),
                         "direction": DIRECTION[params.get("direction", "both")],
                         "target": {"mode": "all", "selector": _selector(ns, run_id, side_b)}, **lasting}}
    if float(params.get("toxicity", 1.0)) < 1.0:
        return None  # a toxic on some connections only: Chaos Mesh acts on every packet
    # a Toxiproxy toxic sits in front of P: its downstream is P -> the client side, upstream the other way
    sender, receiver = (side_a, side_b) if params.get("stream") == "upstream" else (side_b, side_a)
    if fault_type == "latency" and side_a and side_b:
        delay = {"latency": _ms(float(params.get("latency", 0.0))), "correlation": "100"}
        if params.get("jitter"):
            delay["jitter"] = _ms(float(params["jitter"]))
        return {"apiVersion": CHAOS_API, "kind": "NetworkChaos", "metadata": meta,
                "spec": {"action": "delay", "mode": "all", "selector": _selector(ns, run_id, sender),
                         "direction": "to", "target": {"mode": "all", "selector": _selector(ns, run_id, receiver)},
                         "delay": delay, **lasting}}
    if fault_type in ("bandwidth_limit", "bandwidth") and side_a and side_b:
        # Chaos Mesh's rate units: "kbit" is kilobits, "kbps" kiloBYTES per second (its CRD says so)
        if "rate_kbit" in params:  # the netns link's tc limit, by direction
            kbit, sel, direction, tgt = int(params["rate_kbit"]), side_a, DIRECTION[params.get("direction", "both")], side_b
        else:  # the toxic's KB/s, by stream
            kbit, sel, direction, tgt = int(params.get("rate", 128)) * 8, sender, "to", receiver
        return {"apiVersion": CHAOS_API, "kind": "NetworkChaos", "metadata": meta,
                "spec": {"action": "bandwidth", "mode": "all", "selector": _selector(ns, run_id, sel),
                         "direction": direction, "target": {"mode": "all", "selector": _selector(ns, run_id, tgt)},
                         "bandwidth": {"rate": f"{kbit}kbit", "limit": 20971520, "buffer": 10000}, **lasting}}
    if fault_type == "cpu_pressure":
        spec = params.get("node", "all")
        hit = _matching(spec, roles)
        if not hit:
            return None
        return {"apiVersion": CHAOS_API, "kind": "StressChaos", "metadata": meta,
                "spec": {"mode": "all", "selector": _selector(ns, run_id, hit),
                         "stressors": {"cpu": {"workers": int(params.get("workers", 1)),
                                               "load": int(params.get("load", 100))}}, **lasting}}
    return None


TRANSLATED = ("kill", "restart", "partition", "latency", "bandwidth_limit", "bandwidth", "cpu_pressure")
# faults a cluster cannot carry as the scenario means them: refused before anything starts (why_not)
REFUSED = ("refuse",)
