"""A real, local Kubernetes API server for the k8s runtime's tests: etcd, kube-apiserver (RBAC on),
kube-controller-manager (default ServiceAccounts, Deployments making pods, namespace deletion),
kube-scheduler, and kwok playing the kubelet of fake nodes (pods get scheduled and marked Running;
nothing runs in them). Binaries from ``pdchaos setup --only k8s`` (runtimes/k8s/stack.py).

Everything listens on 127.0.0.1 only, on free ports, in a temporary folder that goes with it; from
nothing to ready in ~10 s::

    with LocalCluster() as c:
        c.apply_crds([crd_file("chaos-mesh"), crd_file("lws")])
        api = c.api_client()           # the official client, as the admin (system:masters)

Certificates come from the ``openssl`` command (a CA, the server's certificate, an admin client
certificate in ``system:masters``, the service-account key, one client certificate per
``user_kubeconfig``). A watchdog process removes the cluster if this process dies without
``stop()`` (a killed pytest worker must not leave API servers behind).
"""

from __future__ import annotations

import atexit
import json
import secrets
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from harness.errors import HarnessError
from harness.procs import ProcHandle, start_process
from harness.topology import free_tcp_port

from .stack import binary, kwok_stages

READY_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 30.0
FIELD_MANAGER = "pdchaos-local-cluster"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"  # kwok manages the nodes carrying it (=fake)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's when there: ~10x faster on 3 MB
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")

# Kills the process groups it is told about and removes the folder when its stdin closes without
# "bye" (our process died: os._exit from a pytest timeout, SIGKILL); "bye" means stop() did it.
_WATCHDOG = r"""
import os, shutil, signal, sys
groups, folder = [], sys.argv[1]
for line in sys.stdin:
    if line.strip() == "bye":
        sys.exit(0)
    groups.append(int(line))
for g in groups:
    try:
        os.killpg(g, signal.SIGKILL)
    except OSError:
        pass
shutil.rmtree(folder, ignore_errors=True)
"""


class LocalCluster:
    """Start with ``with LocalCluster() as c`` (or ``start()``/``stop()``), once. From start():
    ``kubeconfig``, an admin kubeconfig file; ``logs_dir``, one log per component; ``dir``, the
    temporary folder holding them (removed by stop()). ``server``: the https URL."""

    label = "local cluster"  # how its errors begin
    components: tuple[str, ...] = COMPONENTS  # stop() kills them in reverse order
    authorization_mode = "RBAC"

    def __init__(self, nodes: int = 2, ready_timeout_s: float = READY_TIMEOUT_S) -> None:
        self.dir: Path | None = None
        self.pki = self.logs_dir = Path()
        self.kubeconfig = ""
        self.nodes = tuple(f"kwok-node-{i}" for i in range(nodes))
        self.ready_timeout_s = ready_timeout_s
        self.port = free_tcp_port()
        self.etcd_port = free_tcp_port()
        self.server = f"https://127.0.0.1:{self.port}"
        self.procs: dict[str, ProcHandle] = {}
        self.started_s: float | None = None  # start() to ready, seconds
        self._watchdog: subprocess.Popen | None = None
        self._stopped = False

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> "LocalCluster":
        """Start every component and wait until each is ready; on any failure everything stops
        and HarnessError names the component and its last log lines."""
        self._only_once()
        missing = [n for n in COMPONENTS if not binary(n).is_file()]
        if missing or not kwok_stages().is_file():
            self.stop()
            raise HarnessError(f"local cluster: {binary(missing[0]) if missing else kwok_stages()} is missing: "
                               "run `pdchaos setup --only k8s`")
        return self._start_or_stop()

    def _only_once(self) -> None:
        if self.dir is not None or self._stopped:
            raise HarnessError(f"{self.label}: a {type(self).__name__} starts once (make a new one)")

    def _start_or_stop(self):
        """:meth:`_start`, timed (``started_s``); on any failure everything started stops first."""
        t0 = time.monotonic()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.started_s = time.monotonic() - t0
        return self

    def _start(self) -> None:
        self._open_folder("pdchaos-k8s-")
        self._certs()
        sched_port = self._control_plane()
        # no --node-ip: the nodes get no address, so exec/logs/port-forward fail at once in the API
        # server (500, no kubelet to dial) instead of it dialling an address where no kubelet runs
        self._spawn("kwok", [
            "--kubeconfig", self.kubeconfig, "--config", str(kwok_stages()), "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
            "--server-address", f"127.0.0.1:{free_tcp_port()}",
            "--node-lease-duration-seconds", "40", "--cidr", "10.1.0.0/16"])
        api = self.api_client()
        try:
            self._create_nodes(api)
            self._wait({"kube-controller-manager": lambda: self._default_sa(api),
                        "kube-scheduler": lambda: self._https_healthz(sched_port),
                        "kwok": lambda: self._nodes_ready(api)})
        finally:
            api.close()

    def _watchdog_argv(self) -> list[str]:
        return [sys.executable, "-c", _WATCHDOG, str(self.dir)]

    def _open_folder(self, prefix: str) -> None:
        """The temporary folder (pki/, logs/), the exit hook and the watchdog."""
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.pki, self.logs_dir = self.dir / "pki", self.dir / "logs"
        self.kubeconfig = str(self.dir / "admin.kubeconfig")
        self.pki.mkdir()
        self.logs_dir.mkdir()
        atexit.register(self.stop)
        try:
            self._watchdog = subprocess.Popen(self._watchdog_argv(), stdin=subprocess.PIPE,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                              start_new_session=True, text=True)
        except OSError as exc:
            raise HarnessError(f"{self.label}: cannot start its watchdog ({sys.executable}): {exc}") from None

    def _control_plane(self) -> int:
        """etcd, the API server (waited for), kube-controller-manager and kube-scheduler (started);
        returns the scheduler's health port."""
        peer = free_tcp_port()
        self._spawn("etcd", [
            "--name", "local", "--data-dir", str(self.dir / "etcd"), "--unsafe-no-fsync", "--log-level", "warn",
            "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"local=http://127.0.0.1:{peer}",
            "--listen-metrics-urls", f"http://127.0.0.1:{free_tcp_port()}"])
        self._wait({"etcd": self._etcd_healthy})
        self.start_apiserver()
        common = ["--kubeconfig", self.kubeconfig, "--leader-elect=false", "--bind-address", "127.0.0.1"]
        self._spawn("kube-controller-manager", [
            *common, "--secure-port", str(free_tcp_port()), "--use-service-account-credentials=false",
            "--service-account-private-key-file", str(self.pki / "sa.key"), "--root-ca-file", str(self.pki / "ca.crt"),
            "--controllers", "*,-nodeipam"])
        sched_port = free_tcp_port()
        self._spawn("kube-scheduler", [*common, "--secure-port", str(sched_port)])
        return sched_port

    def start_apiserver(self) -> None:
        """Start the API server (again, after :meth:`stop_apiserver`) and wait until it is ready."""
        p = self.pki
        self._spawn("kube-apiserver", [
            "--etcd-servers", f"http://127.0.0.1:{self.etcd_port}", "--bind-address", "127.0.0.1",
            "--advertise-address", "127.0.0.1", "--secure-port", str(self.port),
            "--tls-cert-file", str(p / "apiserver.crt"), "--tls-private-key-file", str(p / "apiserver.key"),
            "--client-ca-file", str(p / "ca.crt"), "--authorization-mode", self.authorization_mode,
            "--service-account-key-file", str(p / "sa.pub"), "--service-account-signing-key-file", str(p / "sa.key"),
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-cluster-ip-range", "10.0.0.0/24", "--endpoint-reconciler-type", "none",
            "--enable-priority-and-fairness=false", "--profiling=false", *self._apiserver_extra()])
        api = self.api_client()
        try:
            self._wait({"kube-apiserver": lambda: self._apiserver_ready(api)})
        finally:
            api.close()

    def _apiserver_extra(self) -> list[str]:
        """More API server flags (a subclass's: RealCluster's kubelet client certificate)."""
        return []

    def stop_apiserver(self) -> None:
        """Kill the API server alone (SIGKILL; the tests' "API server gone mid-run")."""
        h = self.procs.pop("kube-apiserver", None)
        if h is not None:
            h.kill()

    def stop(self) -> None:
        """Kill every component's process group and remove the folder. Idempotent, bounded
        (SIGKILL: nothing to wait for but the kernel), never raises."""
        if self._stopped:
            return
        self._stopped = True
        for name in reversed(self.components):
            h = self.procs.pop(name, None)
            if h is not None:
                h.kill()
        if self._watchdog is not None:
            try:
                self._watchdog.communicate("bye\n", timeout=5)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                self._watchdog.kill()
                try:
                    self._watchdog.wait(timeout=5)
                except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
                    pass
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
        atexit.unregister(self.stop)

    def pids(self) -> dict[str, int]:
        """The running components' pids (each its own process group)."""
        return {n: h.pid for n, h in self.procs.items() if h.alive}

    # ------------------------------------------------------------------ clients
    def api_client(self, kubeconfig: str | None = None) -> Any:
        """An official-client ``ApiClient`` for ``kubeconfig`` (default: the admin's); close it."""
        from kubernetes import config

        return config.new_client_from_config(config_file=kubeconfig or self.kubeconfig)

    def user_kubeconfig(self, name: str, groups: Iterable[str] = ()) -> str:
        """A kubeconfig of user ``name`` (client certificate CN=name, O=each group): no role is
        bound to it, so RBAC denies it unless the test binds one."""
        groups = tuple(groups)
        if any(c in x for x in (name, *groups) for c in "/,=+\\\"") or not name:
            raise ValueError(f"user {name!r} / groups {groups!r}: no '/', ',', '=', '+', quotes in a name")
        self._sign(f"user-{name}", "".join(f"/O={g}" for g in groups) + f"/CN={name}", "clientAuth")
        path = str(self.dir / f"user-{name}.kubeconfig")
        self._write_kubeconfig(path, f"user-{name}")
        return path

    # ------------------------------------------------------------------ CRDs
    def apply_crds(self, paths: Iterable[str | Path], timeout_s: float = READY_TIMEOUT_S) -> list[str]:
        """Install the CRDs in ``paths`` by server-side apply (Chaos Mesh's file is 3 MB: a
        client-side apply's last-applied annotation would exceed the size limit) and wait until
        each is Established. Returns their names."""
        from kubernetes.dynamic import DynamicClient

        docs = []
        for path in paths:
            try:
                found = [d for d in yaml.load_all(Path(path).read_text(), Loader=_LOADER) if d]
            except (OSError, yaml.YAMLError) as exc:
                raise HarnessError(f"{self.label}: cannot read CRDs from {path}: {exc}") from None
            crds = [d for d in found if d.get("kind") == "CustomResourceDefinition"]
            if not crds:
                raise HarnessError(f"{self.label}: {path} holds no CustomResourceDefinition")
            docs += crds
        api = self.api_client()
        try:
            res = DynamicClient(api, cache_file=str(self.dir / "discovery.json")).resources.get(
                api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition")
            for doc in docs:
                self._api(lambda: res.server_side_apply(body=doc, field_manager=FIELD_MANAGER, force_conflicts=True,
                                                        _request_timeout=REQUEST_TIMEOUT_S),
                          f"apply CRD {doc['metadata']['name']}")
            pending = [d["metadata"]["name"] for d in docs]

            def established() -> bool:
                for name in list(pending):
                    crd = self._api(lambda: res.get(name=name, _request_timeout=REQUEST_TIMEOUT_S), f"read CRD {name}")
                    conds = (crd.to_dict().get("status") or {}).get("conditions") or []
                    if any(c.get("type") == "Established" and c.get("status") == "True" for c in conds):
                        pending.remove(name)
                return not pending

            self._poll(established, timeout_s, lambda: f"CRDs not Established within {timeout_s:g} s: "
                                                       f"{', '.join(pending[:3])}{' ...' if len(pending) > 3 else ''}")
        finally:
            api.close()
        return [d["metadata"]["name"] for d in docs]

    # ------------------------------------------------------------------ pieces
    def _binary(self, name: str) -> str:
        return str(binary(name))

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        self.procs[name] = start_process([self._binary(name), *args], name=name, ready_timeout_s=None,
                                         log_path=str(self.logs_dir / f"{name}.log"), env=env)
        if self._watchdog is not None and self._watchdog.stdin is not None:
            self._watchdog.stdin.write(f"{self.procs[name].pid}\n")
            self._watchdog.stdin.flush()

    def _wait(self, checks: dict[str, Callable[[], bool]]) -> None:
        """Until every check holds; HarnessError when a component exits or one is not ready in time."""
        pending = dict(checks)
        end = time.monotonic() + self.ready_timeout_s
        while pending:
            for name in list(pending):
                h = self.procs[name]
                if not h.alive:
                    raise HarnessError(f"{self.label}: {name} exited (code {h.returncode}) before it was ready"
                                       f"{self._tail(name)}")
                if pending[name]():
                    del pending[name]
            if pending and time.monotonic() > end:
                name = next(iter(pending))
                raise HarnessError(f"{self.label}: {name} not ready within {self.ready_timeout_s:g} s"
                                   f"{self._tail(name)}")
            if pending:
                time.sleep(0.1)

    def _tail(self, name: str) -> str:
        lines = [ln.strip() for ln in self.procs[name].log_tail(3000).splitlines() if ln.strip()]
        return "; last log lines: " + " | ".join(lines[-3:]) if lines else ""

    def _poll(self, ok: Callable[[], bool], timeout_s: float, why: Callable[[], str]) -> None:
        end = time.monotonic() + timeout_s
        while not ok():
            if time.monotonic() > end:
                raise HarnessError(f"{self.label}: {why()}")
            time.sleep(0.2)

    def _api(self, call: Callable[[], Any], doing: str) -> Any:
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - any client failure: one line, no client traceback
            body = getattr(exc, "body", None)
            try:
                msg = json.loads(body).get("message", "") if body else ""
            except (ValueError, AttributeError):
                msg = ""
            text = str(exc).strip()
            detail = msg or (text.splitlines()[0] if text else type(exc).__name__)
            raise HarnessError(f"{self.label}: {doing}: {getattr(exc, 'status', '') or ''} {detail[:300]}") from None

    # readiness probes: etcd's and the scheduler's own health endpoints are plain HTTP(S) outside the
    # Kubernetes API, so urllib; everything in the API goes through the official client
    def _etcd_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.etcd_port}/health", timeout=2) as r:
                return json.loads(r.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    @staticmethod
    def _https_healthz(port: int) -> bool:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # its own self-signed cert, on loopback
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", timeout=2, context=ctx) as r:
                return r.status == 200
        except OSError:
            return False

    def _apiserver_ready(self, api: Any) -> bool:
        try:  # /readyz is no API object: the client's raw call (its TLS and client certificate)
            r = api.call_api("GET", f"{self.server}/readyz", _request_timeout=2)
            return r.status == 200
        except Exception:  # noqa: BLE001 - not up yet: refused, reset, 500 while post-start hooks run
            return False

    def _default_sa(self, api: Any) -> bool:
        from kubernetes import client

        try:
            client.CoreV1Api(api).read_namespaced_service_account("default", "default", _request_timeout=2)
            return True
        except Exception:  # noqa: BLE001 - 404 until the controller made it
            return False

    def _create_nodes(self, api: Any) -> None:
        from kubernetes import client

        # Nodes may carry their status on create; kwok's node-initialize stage fills in the rest
        res = {"cpu": "32", "memory": "256Gi", "pods": "110"}
        for name in self.nodes:
            body = {"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "annotations": {KWOK_ANNOTATION: "fake"},
                                 "labels": {"type": "kwok", "kubernetes.io/hostname": name,
                                            "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}},
                    "status": {"allocatable": res, "capacity": res}}
            self._api(lambda: client.CoreV1Api(api).create_node(body, _request_timeout=REQUEST_TIMEOUT_S),
                      f"create node {name}")

    def _nodes_ready(self, api: Any) -> bool:
        from kubernetes import client

        try:
            nodes = client.CoreV1Api(api).list_node(_request_timeout=5).items
        except Exception:  # noqa: BLE001 - retried until the deadline
            return False
        ready = {n.metadata.name for n in nodes
                 if any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))}
        return set(self.nodes) <= ready

    # ------------------------------------------------------------------ certificates
    def _openssl(self, *args: str) -> None:
        try:
            res = subprocess.run(["openssl", *args], cwd=self.pki, capture_output=True, text=True, timeout=30,
                                 stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise HarnessError(f"{self.label}: openssl {args[0]}: {exc}") from None
        if res.returncode != 0:
            last = (res.stderr.strip().splitlines() or ["?"])[-1]
            raise HarnessError(f"{self.label}: openssl {args[0]} exited {res.returncode}: {last}")

    def _certs(self) -> None:
        ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
        self._openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
                      "-subj", "/CN=pdchaos-local-ca")
        self._sign("apiserver", "/CN=kube-apiserver", "serverAuth",
                   "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
                   "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local")
        self._sign("admin", "/O=system:masters/CN=pdchaos-admin", "clientAuth")
        self._write_kubeconfig(self.kubeconfig, "admin")
        self._openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", "sa.key")
        self._openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub")

    def _sign(self, name: str, subject: str, usage: str, san: str = "") -> None:
        ext = self.pki / f"{name}.ext"
        ext.write_text(f"extendedKeyUsage={usage}\nkeyUsage=critical,digitalSignature\n" + (san + "\n" if san else ""))
        self._openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                      "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject)
        self._openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                      "-set_serial", f"0x{secrets.token_hex(8)}", "-days", "2", "-extfile", ext.name,
                      "-out", f"{name}.crt")

    def _write_kubeconfig(self, path: str, user: str) -> None:
        # file paths, not *-data: the client's config loader copies inline data to temporary files
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": user,
               "clusters": [{"name": "local", "cluster": {"server": self.server,
                                                          "certificate-authority": str(self.pki / "ca.crt")}}],
               "users": [{"name": user, "user": {"client-certificate": str(self.pki / f"{user}.crt"),
                                                 "client-key": str(self.pki / f"{user}.key")}}],
               "contexts": [{"name": user, "context": {"cluster": "local", "user": user}}]}
        Path(path).write_text(yaml.safe_dump(doc))
