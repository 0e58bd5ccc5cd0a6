"""A REAL single-node Kubernetes cluster on this machine: pods really run (containerd + runc under a
real kubelet), and Chaos Mesh's own controller-manager and chaos-daemon carry out faults on them.
Binaries from ``pdchaos setup --only k8s-node`` (runtimes/k8s/node_stack.py) and ``--only k8s``.

::

    with RealCluster() as c:                 # as root; ~40 s to a Ready node and a working Chaos Mesh
        api = c.api_client()                 # the official client, as the admin (system:masters)
        # a pod that runs the host's programs: image c.host_usr_image, volumes c.host_usr_volumes()

From the command line: ``pdchaos cluster up`` (leaves it running, prints ``export
PDCHAOS_KUBECONFIG=...``), ``pdchaos cluster status``, ``pdchaos cluster down``.

What runs, all in one temporary folder (``c.dir``): etcd, kube-apiserver (``Node,RBAC``, privileged
pods allowed), kube-controller-manager, kube-scheduler (runtimes/k8s/cluster.py's code), containerd
with its own config, socket, root and state folders (cgroupfs; ``restrict_oom_score_adj = true``, as
this VM's capability bounding set lacks CAP_SYS_RESOURCE; the sandbox image is the local pause image;
CNI plugins from Debian's /usr/lib/cni), the kubelet (cgroupfs, its own root folder, swap allowed; it
never writes host sysctls: node_stack.py builds it so) registering node ``pdchaos-node`` at the
host's address, a CNI bridge ``pdchaos0`` on 10.88.0.0/24 (no IP forwarding, no NAT: the host is
10.88.0.1 on it, and pods reach the host's own address through it, nothing beyond), and Chaos Mesh:
its CRDs, chaos-daemon as a privileged hostNetwork/hostPID DaemonSet pod running from the host-/usr
image behind a headless Service (the controller finds it through its EndpointSlice; mutual TLS), and
chaos-controller-manager as a host process (its webhooks on 127.0.0.1, certificates made here).
Only one runs on a machine at a time (a lock file).

Leaving the host as found (``stop()``, and a watchdog when the owning process dies): the pods are
deleted through the API first (the kubelet tears their networks down), then every process is killed
(components, what is left in the ``kubepods`` cgroups, containerd's shims), the mounts under the
folder and the pods' network namespaces are unmounted (and /run/netns, when it is new and empty),
the veths left on the bridge and the bridge deleted, the ``kubepods`` cgroups removed, any
``KUBE-*``/``CNI-*`` iptables chain that was not there before removed (none is made with this
configuration), and what containerd, the CNI plugins and the kubelet write at fixed paths outside
the folder (``/run/containerd/s``, ``/var/lib/cni``, ``/var/log/containers``,
``/var/lib/kubelet/device-plugins``) removed; what the host had before start is left alone (a
baseline taken at start, ``baseline.json`` in the folder). No sysctl is written.
"""

from __future__ import annotations

import base64
import ctypes
import errno
import fcntl
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from harness.errors import HarnessError
from harness.topology import free_tcp_port

from . import node_stack, stack
from .cluster import REQUEST_TIMEOUT_S, LocalCluster

NODE_NAME = "pdchaos-node"
BRIDGE = "pdchaos0"
POD_SUBNET = "10.88.0.0/24"
BRIDGE_IP = "10.88.0.1"
CHAOS_NAMESPACE = "chaos-mesh"
DAEMON_GRPC_PORT = 31767
DAEMON_HTTP_PORT = 31766
CONTAINERD = "/usr/bin/containerd"
CTR = "/usr/bin/ctr"
READY_TIMEOUT_S = 180.0
STOP_PODS_TIMEOUT_S = 30.0
CMD_TIMEOUT_S = 30.0
# the CRDs whose webhooks Chaos Mesh serves (its helm chart's list): path suffix -> resource
WEBHOOK_CRDS = {"podchaos": "podchaos", "iochaos": "iochaos", "timechaos": "timechaos",
                "networkchaos": "networkchaos", "kernelchaos": "kernelchaos", "stresschaos": "stresschaos",
                "awschaos": "awschaos", "azurechaos": "azurechaos", "gcpchaos": "gcpchaos", "dnschaos": "dnschaos",
                "jvmchaos": "jvmchaos", "schedule": "schedules", "workflow": "workflows", "httpchaos": "httpchaos",
                "blockchaos": "blockchaos", "physicalmachinechaos": "physicalmachinechaos",
                "physicalmachine": "physicalmachines", "statuscheck": "statuschecks", "remotecluster": "remotecluster"}
IPTABLES_TABLES = ("filter", "nat", "mangle", "raw")
OUR_CHAINS = re.compile(r"^(KUBE-|CNI-)")
CGROUP_ROOT = Path("/sys/fs/cgroup")
NETNS_DIRS = ("/run/netns", "/var/run/netns")
# outside the folder: what containerd 1.6 (shim sockets), the CNI plugins (results cache) and the
# kubelet (container log links; its device-plugin socket, /var/lib/kubelet/device-plugins, is fixed
# in k8s.io/kubelet) write at fixed paths
FIXED_DIRS = ("/run/containerd/s", "/run/containerd", "/var/lib/cni/results", "/var/lib/cni", "/var/log/containers",
              "/var/log/pods", "/run/netns", "/var/lib/kubelet/device-plugins", "/var/lib/kubelet")
# removed whole when they were not there before (nothing else writes in them)
OWN_WHEN_NEW = ("/var/lib/cni", "/var/log/containers", "/var/log/pods", "/var/lib/kubelet/device-plugins",
                "/var/lib/kubelet")


class StackMissing(HarnessError):
    """The k8s-node stack (or the k8s control plane) is not installed."""


def lock_path() -> Path:
    return node_stack.k8s_root() / "realnode.lock"


def state_path() -> Path:
    """Where ``pdchaos cluster up`` writes the running cluster's kubeconfig, folder and pids."""
    return node_stack.k8s_root() / "realnode-state.json"


def stack_missing() -> str | None:
    """None when everything a RealCluster needs is installed, else what is missing."""
    left = [m for m in node_stack.missing() if m != "stamp"]
    return ", ".join(left) if left else None


# ============================================================================ the host, before and after

def _run(cmd: list[str], timeout: float = CMD_TIMEOUT_S, check: bool = False) -> subprocess.CompletedProcess:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        if check:
            raise HarnessError(f"real cluster: `{' '.join(cmd[:4])}` failed: {exc}") from None
        return subprocess.CompletedProcess(cmd, 1, "", str(exc))
    if check and res.returncode != 0:
        last = (res.stderr.strip().splitlines() or res.stdout.strip().splitlines() or ["?"])[-1]
        raise HarnessError(f"real cluster: `{' '.join(cmd[:4])}` exited {res.returncode}: {last[:300]}")
    return res


def mountpoints() -> list[str]:
    out = []
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) > 4:
                    out.append(parts[4].replace("\\040", " "))
    except OSError:
        pass
    return out


def links() -> list[str]:
    try:
        return sorted(os.listdir("/sys/class/net"))
    except OSError:
        return []


def iptables_chains() -> dict[str, list[str]]:
    """``"iptables/filter" -> [chains]`` for IPv4 and IPv6."""
    out: dict[str, list[str]] = {}
    for tool in ("iptables", "ip6tables"):
        for table in IPTABLES_TABLES:
            res = _run([tool, "-w", "5", "-t", table, "-S"])
            if res.returncode == 0:
                out[f"{tool}/{table}"] = sorted(ln.split()[1] for ln in res.stdout.splitlines()
                                               if ln.startswith("-N ") and len(ln.split()) > 1)
    return out


def bridge_ports(bridge: str = BRIDGE) -> list[str]:
    """The links enslaved to ``bridge`` (the pods' host-side veths)."""
    return _listing(f"/sys/class/net/{bridge}/brif")


def kubepods_cgroups() -> list[str]:
    return sorted(str(p) for p in CGROUP_ROOT.glob("*/kubepods") if p.is_dir())


def _listing(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def snapshot() -> dict[str, Any]:
    """What the host has now, of what a cluster changes."""
    return {"mounts": sorted(set(mountpoints())), "links": links(), "chains": iptables_chains(),
            "kubepods": kubepods_cgroups(),
            "dirs": {d: os.path.isdir(d) for d in FIXED_DIRS},
            "listings": {d: _listing(d) for d in FIXED_DIRS}}


def _kill_pids(pids: set[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _cgroup_pids(root: Path) -> set[int]:
    pids: set[int] = set()
    for dirpath, _dirs, files in os.walk(root):
        if "cgroup.procs" in files:
            try:
                pids |= {int(x) for x in Path(dirpath, "cgroup.procs").read_text().split()}
            except (OSError, ValueError):
                pass
    return pids


def _shim_pids(folder: str) -> set[int]:
    """containerd's shims of the containerd whose socket is in ``folder``."""
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and b"containerd-shim" in cmd[0] and any(folder.encode() in c for c in cmd):
            out.add(int(entry))
    return out


def processes_of(folder: str) -> list[int]:
    """Processes whose command line names ``folder`` (the components, the shims), but not us."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if folder.encode() in cmd and b"realnode" not in cmd:
            out.append(int(entry))
    return out


_libc = ctypes.CDLL(None, use_errno=True)
MNT_DETACH = 2


def _umount(path: str) -> bool:
    if _libc.umount2(path.encode(), MNT_DETACH) == 0:
        return True
    return ctypes.get_errno() in (errno.EINVAL, errno.ENOENT)  # not (or no longer) a mount point


def _ours(mount: str, folder: str, before: set[str]) -> bool:
    if mount in before:
        return False
    if mount == folder or mount.startswith(folder + "/"):
        return True
    return any(mount.startswith(d + "/cni-") for d in NETNS_DIRS)  # the pods' network namespaces


def _remove_chain(tool: str, table: str, chain: str) -> None:
    listing = _run([tool, "-w", "5", "-t", table, "-S"]).stdout.splitlines()
    for rule in listing:  # every rule that jumps to it
        try:
            parts = shlex.split(rule)
        except ValueError:
            continue
        if parts[:1] == ["-A"] and ("-j" in parts and parts[parts.index("-j") + 1] == chain
                                    or "-g" in parts and parts[parts.index("-g") + 1] == chain):
            _run([tool, "-w", "5", "-t", table, "-D", *parts[1:]])
    _run([tool, "-w", "5", "-t", table, "-F", chain])
    _run([tool, "-w", "5", "-t", table, "-X", chain])


def _rmdir_tree(root: Path) -> None:
    for dirpath, _dirs, _files in sorted(os.walk(root), key=lambda x: -len(x[0])):
        try:
            os.rmdir(dirpath)
        except OSError:
            pass


def clean_host(folder: str, baseline: dict[str, Any] | None = None, bridge: str = BRIDGE) -> list[str]:
    """Undo what a cluster in ``folder`` did to the host (see the module's doc), against
    ``baseline`` (default: ``folder``/baseline.json). Idempotent, bounded; returns what it could
    not undo (one line each), empty when the host is as it was."""
    import shutil

    folder = folder.rstrip("/")
    if baseline is None:
        try:
            baseline = json.loads(Path(folder, "baseline.json").read_text())
        except (OSError, ValueError):
            baseline = None
    if baseline is None:  # no baseline: remove only what is certainly ours
        baseline = {"mounts": [], "links": [], "chains": {}, "kubepods": [], "dirs": {d: True for d in FIXED_DIRS},
                    "listings": {d: _listing(d) for d in FIXED_DIRS}}
    problems: list[str] = []
    # 1. processes: the pods' (all in the kubepods cgroups), then the shims, then anything naming the folder
    new_kubepods = [Path(p) for p in kubepods_cgroups() if p not in baseline["kubepods"]]
    for _ in range(50):
        pids = set().union(*(_cgroup_pids(p) for p in new_kubepods)) if new_kubepods else set()
        if not pids:
            break
        _kill_pids(pids)
        time.sleep(0.1)
    for _ in range(30):
        pids = _shim_pids(folder) | set(processes_of(folder))
        if not pids:
            break
        _kill_pids(pids)
        time.sleep(0.1)
    # 2. mounts (deepest first; lazily: a busy one goes when its last user does)
    before = set(baseline["mounts"])
    for _ in range(5):
        ours = sorted({m for m in mountpoints() if _ours(m, folder, before)}, key=len, reverse=True)
        if not ours:
            break
        for m in ours:
            _umount(m)
    left = sorted({m for m in mountpoints() if _ours(m, folder, before)})
    if left:
        problems.append(f"still mounted: {', '.join(left[:5])}")
    for d in NETNS_DIRS:  # the pods' network namespace files
        for name in _listing(d):
            if name.startswith("cni-") and name not in baseline["listings"].get(d, []) and os.path.isfile(f"{d}/{name}"):
                try:
                    os.unlink(f"{d}/{name}")
                except OSError:
                    pass
    # containerd (as `ip netns` does) bind-mounts /run/netns on itself: undone when it was not
    # there before and nothing else lives in it now (another program's namespaces stay untouched)
    netns = os.path.realpath("/run/netns")
    if not baseline["dirs"].get("/run/netns", True) and os.path.isdir(netns) and not _listing(netns):
        if netns in mountpoints() and netns not in before:
            _umount(netns)
    # 3. links: the veths still on the bridge (a pod whose network was not torn down), then the bridge
    if bridge not in baseline["links"] and bridge in links():
        for name in bridge_ports(bridge):
            _run(["ip", "link", "del", name])
        _run(["ip", "link", "del", bridge])
    if bridge not in baseline["links"] and bridge in links():
        problems.append(f"link left: {bridge}")
    # 4. cgroups
    for p in new_kubepods:
        for _ in range(20):
            _rmdir_tree(p)
            if not p.exists():
                break
            time.sleep(0.1)
        if p.exists():
            problems.append(f"cgroup left: {p}")
    # 5. iptables chains the kubelet and the CNI plugins added
    for key, chains in iptables_chains().items():
        tool, table = key.split("/")
        had = set(baseline["chains"].get(key, []))
        for chain in chains:
            if chain not in had and OUR_CHAINS.match(chain):
                _remove_chain(tool, table, chain)
    for key, chains in iptables_chains().items():
        extra = [c for c in chains if c not in set(baseline["chains"].get(key, [])) and OUR_CHAINS.match(c)]
        if extra:
            problems.append(f"{key} chains left: {', '.join(extra)}")
    # 6. files at fixed paths outside the folder, deepest first
    for d in FIXED_DIRS:
        if not os.path.isdir(d):
            continue
        if not baseline["dirs"].get(d, True):
            if d in OWN_WHEN_NEW:
                shutil.rmtree(d, ignore_errors=True)
                continue
        had = set(baseline["listings"].get(d, []))
        for name in _listing(d):
            p = os.path.join(d, name)
            if name in had or (os.path.isdir(p) and not os.path.islink(p)):
                continue
            try:
                os.unlink(p)
            except OSError:
                pass
        if not baseline["dirs"].get(d, True):
            try:
                os.rmdir(d)
            except OSError:
                pass
    # 7. the folder itself, only when nothing is mounted under it (rmtree would cross into a mount)
    if not any(m == folder or m.startswith(folder + "/") for m in mountpoints()):
        shutil.rmtree(folder, ignore_errors=True)
    else:
        problems.append(f"{folder} kept: something is still mounted under it")
    return problems


def _watchdog_main() -> None:
    """The watchdog process: reads the component process groups on stdin; "bye" means stop()
    cleaned up; end of input without it (the owner died) kills the groups and cleans the host."""
    folder, groups = sys.argv[1], []
    for line in sys.stdin:
        if line.strip() == "bye":
            return
        try:
            groups.append(int(line))
        except ValueError:
            pass
    for g in groups:
        try:
            os.killpg(g, signal.SIGKILL)
        except OSError:
            pass
    try:  # the owner's lock is gone with it: hold it while cleaning, so no new cluster starts meanwhile
        fh = open(lock_path(), "a")  # noqa: SIM115
        fcntl.flock(fh, fcntl.LOCK_EX)
    except OSError:
        fh = None
    clean_host(folder)
    try:
        state = json.loads(state_path().read_text())
        if state.get("dir") == folder:
            state_path().unlink()
    except (OSError, ValueError):
        pass
    if fh is not None:
        fh.close()


# ============================================================================ the cluster

class RealCluster(LocalCluster):
    """Start with ``with RealCluster() as c`` (or ``start()``/``stop()``), once, as root. From
    start(): ``kubeconfig`` (admin), ``node_name``, ``node_ip``, ``host_usr_image`` and
    ``pause_image`` (both already in containerd), ``dir``, ``logs_dir`` (one log per component),
    ``timings`` (seconds per phase). ``chaos=False`` leaves Chaos Mesh out."""

    components = ("etcd", "kube-apiserver", "containerd", "kube-controller-manager", "kube-scheduler", "kubelet",
                  "chaos-controller-manager")
    authorization_mode = "Node,RBAC"
    label = "real cluster"

    def __init__(self, ready_timeout_s: float = READY_TIMEOUT_S, chaos: bool = True) -> None:
        super().__init__(nodes=0, ready_timeout_s=ready_timeout_s)
        self.nodes = (NODE_NAME,)
        self.node_name = NODE_NAME
        self.node_ip = ""
        self.chaos = chaos
        self.host_usr_image = node_stack.HOST_USR_IMAGE
        self.pause_image = node_stack.PAUSE_IMAGE
        self.chaos_namespace = CHAOS_NAMESPACE
        self.containerd_socket = ""
        self.timings: dict[str, float] = {}
        self.cleanup_problems: list[str] = []
        self._lock: Any = None

    # ------------------------------------------------------------------ what pods need
    @staticmethod
    def host_usr_volumes(extra_paths: tuple[str, ...] = ()) -> tuple[list[dict], list[dict]]:
        """(volumes, volumeMounts) for a container of ``host_usr_image``: the host's /usr and
        /etc/alternatives read-only, and each of ``extra_paths`` (a venv, a model folder, pyenv's
        Python: e.g. ``~/.cache/pdchaos/envs/...``, ``~/.pyenv``) read-only at the same path."""
        paths = ["/usr", "/etc/alternatives", *extra_paths]
        vols, mounts = [], []
        for i, p in enumerate(paths):
            vols.append({"name": f"host-{i}", "hostPath": {"path": p, "type": "Directory"}})
            mounts.append({"name": f"host-{i}", "mountPath": p, "readOnly": True})
        return vols, mounts

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "RealCluster":
        self._only_once()
        why = stack_missing()
        if why:
            raise StackMissing(f"real cluster: the k8s-node stack is not installed ({why}): "
                               "run `pdchaos setup --only k8s-node`")
        if os.geteuid() != 0:
            raise HarnessError("real cluster: needs root (containerd, the kubelet, a bridge, cgroups, iptables)")
        lock_path().parent.mkdir(parents=True, exist_ok=True)
        self._lock = open(lock_path(), "a")  # noqa: SIM115 - held until stop()
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.close()
            self._lock = None
            self._stopped = True
            raise HarnessError("real cluster: another one is up on this machine (`pdchaos cluster status`; "
                               "`pdchaos cluster down` stops it)") from None
        if BRIDGE in links():
            self.stop()
            raise HarnessError(f"real cluster: a link {BRIDGE} exists already (left over? `ip link del {BRIDGE}`)")
        return self._start_or_stop()

    def _binary(self, name: str) -> str:
        if name == "containerd":
            return CONTAINERD
        if name in node_stack.BINARIES:
            return str(node_stack.node_binary(name))
        return str(stack.binary(name))

    def _watchdog_argv(self) -> list[str]:
        root = str(Path(__file__).resolve().parents[2])
        code = (f"import sys; sys.path.insert(0, {root!r}); "
                "from runtimes.k8s.realnode import _watchdog_main; _watchdog_main()")
        return [sys.executable, "-c", code, str(self.dir)]

    def _apiserver_extra(self) -> list[str]:
        p = self.pki
        return ["--kubelet-client-certificate", str(p / "apiserver-kubelet.crt"),
                "--kubelet-client-key", str(p / "apiserver-kubelet.key"),
                "--kubelet-preferred-address-types", "InternalIP", "--allow-privileged=true"]

    def _phase(self, name: str, t0: float) -> float:
        now = time.monotonic()
        self.timings[name] = round(now - t0, 2)
        return now

    def _start(self) -> None:
        t = time.monotonic()
        self.node_ip = host_ip()
        self._open_folder("pdchaos-real-")
        (self.dir / "baseline.json").write_text(json.dumps(snapshot()))
        self._certs()
        self._node_certs()
        t = self._phase("certs", t)
        sched_port = self._control_plane()
        t = self._phase("control plane", t)
        self._containerd()
        t = self._phase("containerd and images", t)
        self._kubelet()
        api = self.api_client()
        try:
            self._wait({"kube-controller-manager": lambda: self._default_sa(api),
                        "kube-scheduler": lambda: self._https_healthz(sched_port),
                        "kubelet": lambda: self._nodes_ready(api)})
            t = self._phase("kubelet to node Ready", t)
            if self.chaos:
                self._chaos_mesh(api)
                self._phase("Chaos Mesh", t)
        finally:
            api.close()

    def stop(self) -> None:
        """Delete the pods, kill every component, leave the host as found (clean_host), remove the
        folder. Idempotent, bounded, never raises; what could not be undone is in
        ``cleanup_problems``."""
        if self._stopped:
            return
        self._stopped = True
        if self.dir is not None:
            try:
                self._delete_pods()
            except Exception:  # noqa: BLE001 - best effort: clean_host below kills what is left
                pass
        for name in reversed(self.components):
            h = self.procs.pop(name, None)
            if h is not None:
                h.kill()
        if self.dir is not None:
            self.cleanup_problems = clean_host(str(self.dir))
        if self._watchdog is not None:
            try:
                self._watchdog.communicate("bye\n", timeout=5)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                self._watchdog.kill()
                try:
                    self._watchdog.wait(timeout=5)
                except subprocess.TimeoutExpired:  # pragma: no cover
                    pass
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        import atexit

        atexit.unregister(self.stop)

    def _delete_pods(self) -> None:
        """The graceful part of stop(): no controller recreates them, the pods are deleted at once,
        and the kubelet stops their sandboxes (its CNI DEL removes their veths and addresses)."""
        for name in ("chaos-controller-manager", "kube-controller-manager"):
            h = self.procs.pop(name, None)
            if h is not None:
                h.kill()
        if "kubelet" not in self.procs or not self.procs["kubelet"].alive or "kube-apiserver" not in self.procs:
            return
        from kubernetes import client

        api = self.api_client()
        try:
            core = client.CoreV1Api(api)
            for pod in core.list_pod_for_all_namespaces(_request_timeout=10).items:
                try:
                    core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0,
                                               _request_timeout=10)
                except Exception:  # noqa: BLE001 - gone already
                    pass
        finally:
            api.close()
        end = time.monotonic() + STOP_PODS_TIMEOUT_S
        while time.monotonic() < end:
            res = _run([CTR, "-a", self.containerd_socket, "-n", "k8s.io", "tasks", "ls", "-q"], timeout=10)
            if res.returncode != 0 or not res.stdout.strip():
                break
            time.sleep(0.5)

    # ------------------------------------------------------------------ pieces
    def _node_certs(self) -> None:
        ip = self.node_ip
        self._sign("kubelet", f"/O=system:nodes/CN=system:node:{NODE_NAME}", "clientAuth")
        self._write_kubeconfig(str(self.dir / "kubelet.kubeconfig"), "kubelet")
        self._sign("kubelet-serving", f"/CN={NODE_NAME}", "serverAuth", f"subjectAltName=IP:{ip},DNS:{NODE_NAME}")
        self._sign("apiserver-kubelet", "/O=system:masters/CN=kube-apiserver-kubelet-client", "clientAuth")
        self._sign("webhook", "/CN=chaos-mesh-webhook", "serverAuth", "subjectAltName=IP:127.0.0.1,DNS:localhost")
        self._sign("daemon", "/CN=chaos-daemon", "serverAuth,clientAuth",
                   f"subjectAltName=IP:{ip},IP:127.0.0.1,DNS:localhost,DNS:chaos-daemon,DNS:chaos-daemon.chaos-mesh.org")
        self._sign("daemon-client", "/CN=chaos-controller-manager", "clientAuth")
        webhook = self.dir / "webhook-certs"
        webhook.mkdir()
        (webhook / "tls.crt").write_bytes((self.pki / "webhook.crt").read_bytes())
        (webhook / "tls.key").write_bytes((self.pki / "webhook.key").read_bytes())
        daemon = self.dir / "daemon-cert"
        daemon.mkdir()
        for src, dst in (("ca.crt", "ca.crt"), ("daemon.crt", "tls.crt"), ("daemon.key", "tls.key")):
            (daemon / dst).write_bytes((self.pki / src).read_bytes())

    def _containerd(self) -> None:
        d = self.dir / "containerd"
        for sub in ("root", "state", "opt"):
            (d / sub).mkdir(parents=True)
        cni = self.dir / "cni"
        (cni / "net.d").mkdir(parents=True)
        (cni / "ipam").mkdir()
        self.containerd_socket = str(d / "containerd.sock")
        runc_root = self.dir / "runc"
        runc_root.mkdir()
        (d / "config.toml").write_text(f"""version = 2
root = "{d / 'root'}"
state = "{d / 'state'}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{self.containerd_socket}"

[ttrpc]
  address = "{self.containerd_socket}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d / 'opt'}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{self.pause_image}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{node_stack.CNI_BIN_DIR}"
    conf_dir = "{cni / 'net.d'}"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{runc_root}"
""")
        # the bridge, made here so that the host has an address on it (10.88.0.1): the host reaches
        # the pods, the pods reach the host's own address through it; the plugin adds the veths
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"], check=True)
        _run(["ip", "addr", "add", f"{BRIDGE_IP}/24", "dev", BRIDGE], check=True)
        _run(["ip", "link", "set", BRIDGE, "up"], check=True)
        conflist = {"cniVersion": "0.4.0", "name": f"pdchaos-{self.dir.name}", "plugins": [{
            "type": "bridge", "bridge": BRIDGE, "isGateway": False, "isDefaultGateway": False, "ipMasq": False,
            "hairpinMode": False, "promiscMode": False,
            "ipam": {"type": "host-local", "dataDir": str(cni / "ipam"),
                     "ranges": [[{"subnet": POD_SUBNET, "rangeStart": "10.88.0.10", "rangeEnd": "10.88.0.250"}]],
                     "routes": [{"dst": f"{self.node_ip}/32", "gw": BRIDGE_IP}]}}]}
        (cni / "net.d" / "10-pdchaos.conflist").write_text(json.dumps(conflist, indent=1))
        self._spawn("containerd", ["--config", str(d / "config.toml")])

        def up() -> bool:
            return os.path.exists(self.containerd_socket) and _run(
                [CTR, "-a", self.containerd_socket, "version"], timeout=10).returncode == 0

        self._wait({"containerd": up})
        for name in ("pause", "host-usr"):
            res = _run([CTR, "-a", self.containerd_socket, "-n", "k8s.io", "images", "import",
                        str(node_stack.image_tar(name))], timeout=120)
            if res.returncode != 0:
                last = (res.stderr.strip().splitlines() or ["?"])[-1]
                raise HarnessError(f"real cluster: containerd: importing {node_stack.image_tar(name)} failed: {last}")
        listed = _run([CTR, "-a", self.containerd_socket, "-n", "k8s.io", "images", "ls", "-q"], timeout=10).stdout
        for image in (self.pause_image, self.host_usr_image):
            if image not in listed.split():
                raise HarnessError(f"real cluster: containerd: {image} is not listed after its import")

    def _kubelet(self) -> None:
        k = self.dir / "kubelet"
        k.mkdir()
        conf = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs", "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "address": self.node_ip, "port": free_tcp_port(), "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": free_tcp_port(),
            "tlsCertFile": str(self.pki / "kubelet-serving.crt"),
            "tlsPrivateKeyFile": str(self.pki / "kubelet-serving.key"),
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(self.pki / "ca.crt")}},
            "authorization": {"mode": "Webhook"},
            "podLogsDir": str(self.dir / "pod-logs"), "makeIPTablesUtilChains": False,
            "volumePluginDir": str(k / "volume-plugins"),
            "protectKernelDefaults": False, "serializeImagePulls": False,
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "clusterDomain": "cluster.local", "resolvConf": "/etc/resolv.conf",
            "localStorageCapacityIsolation": True, "rotateCertificates": False, "serverTLSBootstrap": False,
            "syncFrequency": "5s", "nodeStatusUpdateFrequency": "5s", "fileCheckFrequency": "5s",
        }
        (k / "config.yaml").write_text(yaml.safe_dump(conf))
        self._spawn("kubelet", [
            "--config", str(k / "config.yaml"), "--kubeconfig", str(self.dir / "kubelet.kubeconfig"),
            "--root-dir", str(k / "root"), "--cert-dir", str(k / "pki"), "--node-ip", self.node_ip,
            "--hostname-override", NODE_NAME, "--v", "1"])

    # ------------------------------------------------------------------ Chaos Mesh
    def _chaos_mesh(self, api: Any) -> None:
        from kubernetes import client

        self.apply_crds([node_stack.node_crd_file()])
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        self._api(lambda: core.create_namespace({"metadata": {"name": CHAOS_NAMESPACE}},
                                                _request_timeout=REQUEST_TIMEOUT_S), "create namespace")
        labels = {"app.kubernetes.io/component": "chaos-daemon", "app.kubernetes.io/name": "chaos-mesh"}
        vols, mounts = self.host_usr_volumes()
        vols += [{"name": "node-bin", "hostPath": {"path": str(node_stack.node_home() / "bin"), "type": "Directory"}},
                 {"name": "helpers", "hostPath": {"path": str(node_stack.daemon_bin_dir()), "type": "Directory"}},
                 {"name": "runtime", "hostPath": {"path": str(self.dir / "containerd"), "type": "Directory"}},
                 {"name": "cert", "hostPath": {"path": str(self.dir / "daemon-cert"), "type": "Directory"}}]
        mounts += [{"name": "node-bin", "mountPath": "/pdchaos-node/bin", "readOnly": True},
                   {"name": "helpers", "mountPath": "/usr/local/bin", "readOnly": True},
                   {"name": "runtime", "mountPath": "/host-run"},
                   {"name": "cert", "mountPath": "/etc/chaos-daemon/cert", "readOnly": True}]
        ds = {"apiVersion": "apps/v1", "kind": "DaemonSet",
              "metadata": {"name": "chaos-daemon", "namespace": CHAOS_NAMESPACE, "labels": labels},
              "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {
                  "hostNetwork": True, "hostPID": True, "hostIPC": True, "automountServiceAccountToken": False,
                  "terminationGracePeriodSeconds": 1, "volumes": vols,
                  "containers": [{
                      "name": "chaos-daemon", "image": self.host_usr_image, "imagePullPolicy": "Never",
                      "command": ["/pdchaos-node/bin/chaos-daemon", "--runtime", "containerd",
                                  "--runtime-socket-path", "/host-run/containerd.sock",
                                  "--grpc-port", str(DAEMON_GRPC_PORT), "--http-port", str(DAEMON_HTTP_PORT),
                                  "--ca", "/etc/chaos-daemon/cert/ca.crt",
                                  "--cert", "/etc/chaos-daemon/cert/tls.crt",
                                  "--key", "/etc/chaos-daemon/cert/tls.key"],
                      "env": [{"name": "TZ", "value": "UTC"}],
                      "securityContext": {"privileged": True}, "volumeMounts": mounts,
                      "ports": [{"name": "grpc", "containerPort": DAEMON_GRPC_PORT}]}]}}}}
        self._api(lambda: apps.create_namespaced_daemon_set(CHAOS_NAMESPACE, ds, _request_timeout=REQUEST_TIMEOUT_S),
                  "create the chaos-daemon DaemonSet")
        svc = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "chaos-daemon", "namespace": CHAOS_NAMESPACE, "labels": labels},
               "spec": {"clusterIP": "None", "selector": labels,
                        "ports": [{"name": "grpc", "port": DAEMON_GRPC_PORT, "targetPort": DAEMON_GRPC_PORT}]}}
        self._api(lambda: core.create_namespaced_service(CHAOS_NAMESPACE, svc, _request_timeout=REQUEST_TIMEOUT_S),
                  "create the chaos-daemon Service")
        webhook_port, metrics_port = free_tcp_port(), free_tcp_port()
        env = {"KUBECONFIG": self.kubeconfig, "NAMESPACE": CHAOS_NAMESPACE, "ENABLE_LEADER_ELECTION": "false",
               "CERTS_DIR": str(self.dir / "webhook-certs"), "WEBHOOK_HOST": "127.0.0.1",
               "WEBHOOK_PORT": str(webhook_port), "METRICS_HOST": "127.0.0.1", "METRICS_PORT": str(metrics_port),
               "POD_FAILURE_PAUSE_IMAGE": self.pause_image, "CHAOS_DAEMON_SERVICE_PORT": str(DAEMON_GRPC_PORT),
               "CHAOS_MESH_CA_CERT": str(self.pki / "ca.crt"),
               "CHAOS_DAEMON_CLIENT_CERT": str(self.pki / "daemon-client.crt"),
               "CHAOS_DAEMON_CLIENT_KEY": str(self.pki / "daemon-client.key"),
               "SECURITY_MODE": "false", "CHAOSD_SECURITY_MODE": "false", "TZ": "UTC"}
        self._spawn("chaos-controller-manager", [], env=env)
        self._wait({"chaos-controller-manager": lambda: self._tls_listening(webhook_port),
                    "kubelet": lambda: self._daemon_ready(api)})
        ca = base64.b64encode((self.pki / "ca.crt").read_bytes()).decode()

        def hooks(kind: str) -> list[dict]:
            return [{"name": f"{kind[0]}{crd}.kb.io", "sideEffects": "None", "failurePolicy": "Fail",
                     "timeoutSeconds": 10, "admissionReviewVersions": ["v1", "v1beta1"],
                     "clientConfig": {"url": f"https://127.0.0.1:{webhook_port}/{kind}-chaos-mesh-org-v1alpha1-{crd}",
                                      "caBundle": ca},
                     "rules": [{"apiGroups": ["chaos-mesh.org"], "apiVersions": ["v1alpha1"],
                                "operations": ["CREATE", "UPDATE"], "resources": [res]}]}
                    for crd, res in WEBHOOK_CRDS.items()]

        adm = client.AdmissionregistrationV1Api(api)
        self._api(lambda: adm.create_mutating_webhook_configuration(
            {"metadata": {"name": "pdchaos-chaos-mesh-mutation"}, "webhooks": hooks("mutate")},
            _request_timeout=REQUEST_TIMEOUT_S), "create Chaos Mesh's mutating webhooks")
        self._api(lambda: adm.create_validating_webhook_configuration(
            {"metadata": {"name": "pdchaos-chaos-mesh-validation"}, "webhooks": hooks("validate")},
            _request_timeout=REQUEST_TIMEOUT_S), "create Chaos Mesh's validating webhooks")
        self._wait({"chaos-controller-manager": lambda: self._webhook_answers(api)})

    @staticmethod
    def _tls_listening(port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            return False

    def _daemon_ready(self, api: Any) -> bool:
        """A chaos-daemon pod Ready and in its Service's EndpointSlice (how the controller finds it)."""
        from kubernetes import client

        try:
            slices = client.DiscoveryV1Api(api).list_namespaced_endpoint_slice(
                CHAOS_NAMESPACE, label_selector="kubernetes.io/service-name=chaos-daemon", _request_timeout=5).items
        except Exception:  # noqa: BLE001 - retried until the deadline
            return False
        return any(ep.node_name == NODE_NAME and ep.conditions and ep.conditions.ready
                   for s in slices for ep in (s.endpoints or []))

    def _webhook_answers(self, api: Any) -> bool:
        """A server-side dry-run of a PodChaos passes through the controller's webhooks."""
        from kubernetes import client

        body = {"apiVersion": "chaos-mesh.org/v1alpha1", "kind": "PodChaos",
                "metadata": {"name": "pdchaos-probe", "namespace": CHAOS_NAMESPACE},
                "spec": {"action": "pod-kill", "mode": "one",
                         "selector": {"namespaces": [CHAOS_NAMESPACE], "labelSelectors": {"none": "none"}}}}
        try:
            client.CustomObjectsApi(api).create_namespaced_custom_object(
                "chaos-mesh.org", "v1alpha1", CHAOS_NAMESPACE, "podchaos", body, dry_run="All", _request_timeout=10)
            return True
        except Exception:  # noqa: BLE001 - the webhook not serving yet
            return False

    def _tail(self, name: str) -> str:
        if name not in self.procs:
            return ""
        return super()._tail(name)


def host_ip() -> str:
    """The host's address on its default route (the kubelet refuses a loopback node address)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("10.255.255.254", 9))  # a UDP connect: no packet is sent, the route picks the address
        ip = s.getsockname()[0]
    except OSError:
        ip = ""
    finally:
        s.close()
    if not ip or ip.startswith("127."):
        raise HarnessError("real cluster: this host has no non-loopback IPv4 address on a route; the kubelet "
                           "needs one for its node address")
    return ip


# ============================================================================ `pdchaos cluster up` in the background

def serve(state_file: str, ready_timeout_s: float = READY_TIMEOUT_S) -> int:
    """Run a RealCluster until SIGTERM/SIGINT (``pdchaos cluster up``'s background process): write
    ``state_file`` when it is up (or failed), stop it and remove the file at the end."""
    path = Path(state_file)
    stopping: list[int] = []

    def on_signal(sig: int, _frame: Any) -> None:
        stopping.append(sig)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    c = RealCluster(ready_timeout_s=ready_timeout_s)
    try:
        c.start()
    except Exception as exc:  # noqa: BLE001 - the CLI shows the one line
        path.write_text(json.dumps({"state": "failed", "error": str(exc).splitlines()[0] if str(exc) else
                                    type(exc).__name__, "pid": os.getpid(),
                                    "missing": isinstance(exc, StackMissing)}))
        return 1
    state = {"state": "up", "pid": os.getpid(), "kubeconfig": c.kubeconfig, "dir": str(c.dir), "server": c.server,
             "node": c.node_name, "node_ip": c.node_ip, "host_usr_image": c.host_usr_image,
             "pause_image": c.pause_image, "pids": c.pids(), "started_s": round(c.started_s or 0, 1),
             "timings": c.timings, "logs": str(c.logs_dir)}
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(state, indent=1))
    os.replace(part, path)
    try:
        while not stopping:
            time.sleep(0.5)
            dead = [n for n, h in c.procs.items() if not h.alive]
            if dead:  # a component died: say so in the state, keep the rest up until `down`
                state["dead"] = dead
                path.write_text(json.dumps(state, indent=1))
    finally:
        c.stop()
        try:
            if json.loads(path.read_text()).get("pid") == os.getpid():
                path.unlink()
        except (OSError, ValueError):
            pass
    return 0

