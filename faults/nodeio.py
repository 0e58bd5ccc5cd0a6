"""Input checks and lifecycle shared by every node process (lookup server, fake peer, interposer).

One implementation used by ``faults`` and, through ``harness/endpoints.py`` and
``harness/nodeutil.py``, by the harness (faults cannot import harness).
"""

from __future__ import annotations

import ipaddress
import os
import signal
import threading


class NodeUsageError(Exception):
    """Bad input: printed as one ``error:`` line, exit 2, no traceback. ``harness.errors.UsageError``
    is a subclass."""


def check_endpoint(endpoint: str, what: str = "--endpoint", *, allow_any_tcp_host: bool = False) -> str:
    """Accept ``ipc:///path`` (the folder must exist, the path fit a unix socket's 107 bytes) or
    ``tcp://127.x.y.z:PORT`` / ``tcp://[::1]:PORT`` / ``tcp://localhost:PORT``.

    Any other address is refused: pd-chaos never sends traffic off this machine. Inside a network
    namespace the run made (the runner sets PDCHAOS_NETNS for the nodes it starts there) a private
    veth address is allowed: it never leaves the machine."""
    if not isinstance(endpoint, str):
        raise NodeUsageError(f"{what}: expected an endpoint string")
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://"):]
        if not path:
            raise NodeUsageError(f"{what}: {endpoint!r} has no path")
        if path.startswith("@"):
            return endpoint  # abstract namespace
        folder = os.path.dirname(os.path.abspath(path)) or "."
        if not os.path.isdir(folder):
            raise NodeUsageError(f"{what}: folder {folder!r} of {endpoint!r} does not exist")
        if len(os.fsencode(path)) > 107:
            raise NodeUsageError(f"{what}: ipc path of {endpoint!r} is longer than the 107 bytes a unix socket allows")
        return endpoint
    if endpoint.startswith("tcp://"):
        host, sep, port = endpoint[len("tcp://"):].rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise NodeUsageError(f"{what}: {endpoint!r} needs a port, like tcp://127.0.0.1:5555")
        host = host.strip("[]")
        if host == "localhost":
            return endpoint
        try:
            addr = ipaddress.ip_address(host)
        except ValueError:
            raise NodeUsageError(f"{what}: {endpoint!r}: host must be an IP address or localhost") from None
        in_netns = bool(os.environ.get("PDCHAOS_NETNS")) and addr.is_private
        if not addr.is_loopback and not allow_any_tcp_host and not in_netns:
            raise NodeUsageError(f"{what}: {endpoint!r} is not on loopback (127.0.0.0/8 or ::1)")
        return endpoint
    raise NodeUsageError(f"{what}: {endpoint!r} must start with ipc:// or tcp://")


def read_hashes(path: str, what: str = "--preload") -> list[str]:
    """One hex block hash per line; blank lines and '#' comments are skipped; lowercased."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise NodeUsageError(f"{what}: cannot read {path!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise NodeUsageError(f"{what}: {path!r} is not UTF-8 text") from None
    out = []
    for n, line in enumerate(lines, 1):
        h = line.strip()
        if not h or h.startswith("#"):
            continue
        if len(h) % 2 or any(c not in "0123456789abcdefABCDEF" for c in h):
            raise NodeUsageError(f"{what}: {path}:{n}: expected one hex block hash per line")
        out.append(h.lower())
    return out


def stop_on_signals() -> threading.Event:
    """An Event set by SIGTERM or SIGINT, or when the parent (the runner) dies.

    Nodes run in their own sessions (the runner signals whole groups), so a runner killed with
    SIGKILL sends nothing; a watcher thread notices the node was re-parented and stops it, so no
    node outlives a crashed runner by more than a quarter second. (PR_SET_PDEATHSIG is tied to the
    parent *thread*, and the runner starts nodes from its nemesis thread, which ends early.)"""
    ev = threading.Event()
    parent = os.getppid()

    def handler(signum, frame):  # noqa: ARG001
        ev.set()

    def watch_parent() -> None:
        while not ev.wait(0.25):
            if os.getppid() != parent:
                ev.set()
                return

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    threading.Thread(target=watch_parent, name="parent-watch", daemon=True).start()
    return ev
