"""Endpoint parsing shared by every command: ipc:// paths and tcp:// on loopback only."""

from __future__ import annotations

import ipaddress
import os

from .errors import UsageError


def check_endpoint(endpoint: str, what: str = "--endpoint", *, allow_any_tcp_host: bool = False) -> str:
    """Accept ``ipc:///path`` (the folder must exist) or ``tcp://127.x.y.z:PORT`` / ``tcp://[::1]:PORT``.

    Any other address is refused: pd-chaos never sends traffic off this machine (network
    namespaces made by the run pass ``allow_any_tcp_host``)."""
    if not isinstance(endpoint, str):
        raise UsageError(f"{what}: expected an endpoint string")
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://"):]
        if not path:
            raise UsageError(f"{what}: {endpoint!r} has no path")
        if path.startswith("@"):
            return endpoint  # abstract namespace
        folder = os.path.dirname(os.path.abspath(path)) or "."
        if not os.path.isdir(folder):
            raise UsageError(f"{what}: folder {folder!r} of {endpoint!r} does not exist")
        if len(os.fsencode(path)) > 107:
            raise UsageError(f"{what}: ipc path of {endpoint!r} is longer than the 107 bytes a unix socket allows")
        return endpoint
    if endpoint.startswith("tcp://"):
        rest = endpoint[len("tcp://"):]
        host, sep, port = rest.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise UsageError(f"{what}: {endpoint!r} needs a port, like tcp://127.0.0.1:5555")
        host = host.strip("[]")
        if host == "localhost":
            return endpoint
        try:
            addr = ipaddress.ip_address(host)
        except ValueError:
            raise UsageError(f"{what}: {endpoint!r}: host must be an IP address or localhost") from None
        # Inside a network namespace the run made (the runner sets PDCHAOS_NETNS for the nodes it
        # starts there) the veth address is the only way across; it never leaves the machine.
        in_netns = bool(os.environ.get("PDCHAOS_NETNS")) and addr.is_private
        if not addr.is_loopback and not allow_any_tcp_host and not in_netns:
            raise UsageError(f"{what}: {endpoint!r} is not on loopback (127.0.0.0/8 or ::1)")
        return endpoint
    raise UsageError(f"{what}: {endpoint!r} must start with ipc:// or tcp://")
