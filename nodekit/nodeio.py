"""Input checks and lifecycle shared by every node process (lookup server, fake peer, interposer).

Part of ``nodekit``, the ground floor every node process stands on (families' nodes, the fault
nodes, the harness): it imports nothing of this project.

:func:`run_node` is the whole life of a node process, written once: check the endpoints, build
the node (its own option checks), set up logging, bind (a taken endpoint is one ``error:`` line,
exit 2), answer the control channel when asked, print ``READY``, serve until SIGTERM/SIGINT (or
the runner's death), close everything, exit 0. A node is a :class:`NodeApp`.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import sys
import threading
import time
from typing import Callable, Mapping, Sequence


class NodeUsageError(Exception):
    """Bad input: printed as one ``error:`` line, exit 2, no traceback. ``harness.errors.UsageError``
    is a subclass."""


def check_endpoint(endpoint: str, what: str = "--endpoint", *, allow_any_tcp_host: bool = False) -> str:
    """Accept ``ipc:///path`` (the folder must exist, the path fit a unix socket's 107 bytes) or
    ``tcp://127.x.y.z:PORT`` / ``tcp://[::1]:PORT`` / ``tcp://localhost:PORT``.

    Any other address is refused: pd-chaos never sends traffic off this machine. Inside a network
    namespace the run made (the runner sets PDCHAOS_NETNS for the nodes it starts there) a private
    veth address is allowed: it never leaves the machine. In a pod the run made (its manifest sets
    PDCHAOS_POD) the node is a host of its own on the pod network: it may listen on its pod's
    addresses (``0.0.0.0``, a private address) and name its peers by their Services
    (``NAME.NAMESPACE.svc``), never a public address."""
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
        in_pod = bool(os.environ.get("PDCHAOS_POD"))
        if host == "localhost" or (in_pod and _service_name(host)):
            return endpoint
        try:
            addr = ipaddress.ip_address(host)
        except ValueError:
            raise NodeUsageError(f"{what}: {endpoint!r}: host must be an IP address or localhost"
                                 + (" (or a Service, NAME.NAMESPACE.svc)" if in_pod else "")) from None
        in_netns = (bool(os.environ.get("PDCHAOS_NETNS")) or in_pod) and (addr.is_private or addr.is_unspecified)
        if not addr.is_loopback and not allow_any_tcp_host and not in_netns:
            raise NodeUsageError(f"{what}: {endpoint!r} is not on loopback (127.0.0.0/8 or ::1)")
        return endpoint
    raise NodeUsageError(f"{what}: {endpoint!r} must start with ipc:// or tcp://")


def _service_name(host: str) -> bool:
    """``NAME.NAMESPACE.svc`` or ``NAME.NAMESPACE.svc.cluster.local``: a Service on the pod network."""
    import re

    return re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\.[a-z0-9]([-a-z0-9]*[a-z0-9])?\.svc(\.cluster\.local)?",
                        host) is not None


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
    node outlives a crashed runner by more than a quarter second (and its group by more than
    ``ORPHAN_GRACE_S``: see :func:`watch_parent`). (PR_SET_PDEATHSIG is tied to the parent
    *thread*, and the runner starts nodes from short-lived threads: a node's start thread, the
    nemesis.)"""
    ev = threading.Event()

    def handler(signum, frame):  # noqa: ARG001
        ev.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    watch_parent(ev)
    return ev


#: set by the harness in the environment of each node it starts: its own pid (harness/procs.py)
PARENT_ENV = "PDCHAOS_PARENT_PID"
#: how long an orphaned node's own stop may take before its whole process group is killed
ORPHAN_GRACE_S = 5.0
_ORPHANED = threading.Event()


def orphaned() -> bool:
    """Whether this node's runner died (the parent watch saw it)."""
    return _ORPHANED.is_set()


def _expected_parent() -> int:
    """The runner's pid: the one the harness put in the environment (then removed from it, so
    this node's own children do not take it for theirs), when it is still our parent or no longer
    alive; else (started by hand, or by another node) our parent now."""
    named = os.environ.pop(PARENT_ENV, "")
    now = os.getppid()
    if not named.isdigit() or int(named) == now:
        return now
    try:
        os.kill(int(named), 0)
    except ProcessLookupError:
        return int(named)  # the runner died before we looked: orphaned already
    except PermissionError:
        pass
    return now  # alive and not our parent: someone else started us


def watch_parent(ev: threading.Event, grace_s: float = ORPHAN_GRACE_S) -> None:
    """Set ``ev`` when this process is re-parented (its parent, the runner, died), checked every
    quarter second by a daemon thread that ends once ``ev`` is set.

    Then the node stops as on SIGTERM, and when it leads its own process group (the runner starts
    every node in a session of its own) that whole group is killed with SIGKILL ``grace_s``
    later, or when the node's command ends (harness/cli/node.py, :func:`reap_if_orphaned`),
    whichever comes first: children that neither watch their parent nor die with it (vLLM's
    EngineCore and workers) go too, and a node stuck in a long call still ends."""
    parent = _expected_parent()

    def watch() -> None:
        while not ev.is_set():
            if os.getppid() != parent:
                _ORPHANED.set()
                ev.set()
                if grace_s is not None:
                    time.sleep(grace_s)
                    reap_if_orphaned()
                return
            ev.wait(0.25)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def reap_if_orphaned() -> None:
    """When the runner died and this process leads its own group: SIGKILL that group (this
    process too, after its output is flushed). Nothing otherwise (never a group we do not lead,
    such as a shell's that started us by hand)."""
    if not _ORPHANED.is_set() or os.getpgrp() != os.getpid():
        return
    try:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - the group goes anyway
        pass
    try:
        os.killpg(os.getpgrp(), signal.SIGKILL)
    except OSError:
        pass


# --------------------------------------------------------------------------- small helpers


def split_envelope(frames: Sequence[bytes]) -> tuple[list[bytes], list[bytes]] | None:
    """``frames`` without the ROUTER identity -> (envelope up to and including the empty delimiter,
    body). None when there is no delimiter (a REP socket would discard such a message)."""
    for i, f in enumerate(frames):
        if len(f) == 0:
            return list(frames[: i + 1]), list(frames[i + 1:])
    return None


def unlink_ipc(endpoint: str | None) -> None:
    """Remove the socket file of an ``ipc://`` endpoint (not of an abstract one); quiet if gone."""
    if endpoint and endpoint.startswith("ipc://") and not endpoint.startswith("ipc://@"):
        try:
            os.unlink(endpoint[len("ipc://"):])
        except OSError:
            pass


READY_FILE_ENV = "PDCHAOS_READY_FILE"


def announce_ready() -> None:
    """Tell the runner this node serves: one line ``READY`` on stdout (harness/procs.py waits for it);
    where the runtime reads readiness from a file instead (a pod's readiness probe), that file too."""
    path = os.environ.get(READY_FILE_ENV)
    if path:
        with open(path, "w", encoding="ascii") as fh:
            fh.write("READY\n")
    print("READY", flush=True)


def exit_now(rc: int) -> None:
    """Leave without the interpreter's teardown (with torch and vLLM loaded it takes seconds on a
    busy host, past the runner's grace): for a node whose output is all written and closed."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    reap_if_orphaned()  # the runner died: the node's group goes with it
    os._exit(rc)


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=getattr(logging, str(level).upper(), logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def usage_exit(message: str) -> int:
    """Bad input, the way the CLI reports it: one ``error:`` line on stderr; returns exit code 2."""
    print(f"error: {message}", file=sys.stderr)
    return 2


# --------------------------------------------------------------------------- node lifecycle


class NodeApp:
    """What :func:`run_node` drives. ``bind()`` binds the node's sockets (raises ``zmq.ZMQError``
    when an endpoint cannot be bound); ``serve(stop)`` serves until ``stop`` is set (default: just
    waits, for nodes that serve on their own threads); ``close()`` releases everything and is
    called once ``bind()`` was tried, whatever happened. ``stats()`` and ``handlers()`` are what
    the control channel answers (``stats`` and the node's own commands)."""

    def bind(self) -> None:
        raise NotImplementedError

    def serve(self, stop: threading.Event) -> None:
        while not stop.wait(0.2):
            pass

    def close(self) -> None:
        pass

    def stats(self) -> dict:
        return {}

    def handlers(self) -> dict[str, Callable[[dict], dict]]:
        return {}

    def ready_message(self) -> str | None:
        """Logged when the node is ready (counts and modes only, never data)."""
        return None

    def stop_message(self) -> str | None:
        """Logged when the node stops serving."""
        return None


def run_node(build: Callable[[], NodeApp], *, endpoints: Mapping[str, str | None], bind_flag: str,
             control: str | None = None, log_level: str = "INFO") -> int:
    """The life of one node process (see the module docstring); returns its exit code.

    ``endpoints``: option name -> endpoint, each checked (None: not given); ``bind_flag`` names
    the one the node binds, for the error when it cannot. ``build()`` checks the node's other
    options (raising :class:`NodeUsageError`) and returns the node, not yet bound. ``control``: the
    ipc endpoint of the harness control channel, or None."""
    import zmq  # here, not at import: every CLI command imports this module (harness.errors)

    try:
        for flag, endpoint in endpoints.items():
            if endpoint is not None:
                check_endpoint(endpoint, flag)
        if control:
            check_endpoint(control, "--control")
        app = build()
    except NodeUsageError as exc:
        return usage_exit(str(exc))
    setup_logging(log_level)
    logger = logging.getLogger(type(app).__module__)
    stop = stop_on_signals()
    server = None
    try:
        try:
            app.bind()
        except zmq.ZMQError as exc:
            return usage_exit(f"{bind_flag}: cannot bind {endpoints.get(bind_flag)!r}: {exc.strerror}")
        if control:
            from .control import ControlServer

            try:
                server = ControlServer(control, handlers=app.handlers(), stats=app.stats)
            except zmq.ZMQError as exc:
                return usage_exit(f"--control: cannot bind {control!r}: {exc.strerror}")
            server.start()
        if (msg := app.ready_message()) is not None:
            logger.info("%s", msg)
        announce_ready()
        app.serve(stop)
        if (msg := app.stop_message()) is not None:
            logger.info("%s", msg)
    finally:
        if server is not None:
            server.close()
        app.close()
    return 0
