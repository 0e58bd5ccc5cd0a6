"""How the harness reaches its pods from outside the cluster: a port-forward per (role, port),
through the API server (the kubelet's port-forward, as ``kubectl port-forward`` does), never
through cluster DNS or a route to the pods' network from this machine.

Each forward is a listener on ``127.0.0.1:<free port>``. A connection accepted there is relayed over
a port-forward stream to the role's pod that is ready *at that moment* (found by the role's
labels), so a pod a fault replaced (PodChaos pod-kill, a restarted container) is reached again by
the next connection: the control channel's ZMQ socket and the workload's HTTP client reconnect by
themselves. A connection made while no pod of the role is ready is closed at once (the client
retries), never held.

Written by hand over the official client's ``portforward`` (kubernetes.stream): the client gives one
socket per stream and no listener; this module adds the listener and the byte relay.
"""

from __future__ import annotations

import select
import socket
import threading
from typing import Any, Callable

ACCEPT_POLL_S = 0.25
CLIENT_THREAD = "Kubernetes port forward proxy"  # the official client's own relay thread, one per stream


def _quiet_client_threads() -> None:
    """The official client's port-forward thread raises when the far end closes its stream while it
    writes (SSLEOFError, a reset): a connection that ended, which the relay already handles, printed
    as a traceback. Such ends are counted, not printed; any other thread's exception is printed as
    before."""
    previous = threading.excepthook
    if getattr(previous, "_pdchaos_quiet", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if (args.thread is not None and args.thread.name.startswith(CLIENT_THREAD)
                and isinstance(args.exc_value, OSError)):
            CLOSED_BY_PEER[0] += 1
            return
        previous(args)

    hook._pdchaos_quiet = True  # type: ignore[attr-defined]
    threading.excepthook = hook


CLOSED_BY_PEER = [0]
RELAY_CHUNK = 65536
CONNECT_TIMEOUT_S = 10.0


class Forwards:
    """The run's forwards: ``local_port(role, port)`` starts one (once per pair) and returns the
    port on 127.0.0.1 it listens on; ``close()`` ends every listener and relay."""

    def __init__(self, kube: Callable[[], Any], namespace: str, selector: Callable[[str], str]) -> None:
        _quiet_client_threads()
        # ``kube``: gives the cluster's client when a connection first needs it (a dry run that only
        # names the forwards' ports asks no cluster)
        self._kube, self.namespace, self.selector = kube, namespace, selector
        self._listeners: dict[tuple[str, int], socket.socket] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.counts = {"accepted": 0, "relayed": 0, "no_pod": 0, "failed": 0}

    def local_port(self, role: str, port: int) -> int:
        with self._lock:
            lsock = self._listeners.get((role, port))
            if lsock is None:
                lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                lsock.bind(("127.0.0.1", 0))
                lsock.listen(64)
                lsock.settimeout(ACCEPT_POLL_S)
                self._listeners[(role, port)] = lsock
                threading.Thread(target=self._accept, args=(lsock, role, port), daemon=True,
                                 name=f"forward-{role}-{port}").start()
            return lsock.getsockname()[1]

    def url(self, role: str, url: str) -> str:
        """``http://HOST:PORT`` (or ``tcp://``) of ``role`` -> the same scheme on 127.0.0.1 and the
        forward's local port."""
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        if parts.port is None:
            return url
        local = self.local_port(role, parts.port)
        return f"{parts.scheme}://127.0.0.1:{local}{parts.path}"

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            for lsock in self._listeners.values():
                try:
                    lsock.close()
                except OSError:
                    pass
            self._listeners.clear()

    # ------------------------------------------------------------------ the relay
    def _pod(self, role: str) -> str | None:
        from .pods import pod_ready

        try:
            pods = self._kube().list("v1", "Pod", namespace=self.namespace, selector=self.selector(role))
        except Exception:  # noqa: BLE001 - the API server did not answer: no pod now, the client retries
            return None
        ready = [p for p in pods if pod_ready(p)]
        return ready[0]["metadata"]["name"] if ready else None

    def _accept(self, lsock: socket.socket, role: str, port: int) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = lsock.accept()
            except socket.timeout:
                continue
            except OSError:
                return  # closed
            self.counts["accepted"] += 1
            threading.Thread(target=self._serve, args=(conn, role, port), daemon=True,
                             name=f"relay-{role}-{port}").start()

    def _serve(self, conn: socket.socket, role: str, port: int) -> None:
        from kubernetes import client
        from kubernetes.stream import portforward

        pod = self._pod(role)
        if pod is None:
            self.counts["no_pod"] += 1
            conn.close()
            return
        try:
            # an ApiClient of its own: the client's stream functions swap the request method of the
            # ApiClient they are given while they connect, which would turn the run's own API calls
            # in other threads into websocket requests
            api = client.ApiClient(configuration=self._kube().api.configuration)
            pf = portforward(client.CoreV1Api(api).connect_get_namespaced_pod_portforward, pod,
                             self.namespace, ports=str(port), _request_timeout=CONNECT_TIMEOUT_S)
            remote = pf.socket(port)
            remote.setblocking(True)
        except Exception:  # noqa: BLE001 - the kubelet refused the stream: close, the client retries
            self.counts["failed"] += 1
            conn.close()
            return
        self.counts["relayed"] += 1
        try:
            _pump(conn, remote, self._stop)
        finally:
            for s in (conn, remote):
                try:
                    s.close()
                except OSError:
                    pass
            try:
                pf.close()
            except Exception:  # noqa: BLE001 - already closed by the other side
                pass


def _pump(a: socket.socket, b: socket.socket, stop: threading.Event) -> None:
    """Copy bytes both ways until either side closes (or the forwards close)."""
    peers = {a: b, b: a}
    while not stop.is_set():
        try:
            readable, _, _ = select.select([a, b], [], [], ACCEPT_POLL_S)
        except (OSError, ValueError):
            return
        for s in readable:
            try:
                data = s.recv(RELAY_CHUNK)
            except OSError:
                return
            if not data:
                return
            try:
                peers[s].sendall(data)
            except OSError:
                return
