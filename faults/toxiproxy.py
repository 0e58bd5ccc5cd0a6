"""The one module that touches toxiproxy-python: a per-server API wrapper and the server's lifecycle.

toxiproxy-python 0.1.1 (2019) has four gaps this module closes:

* one global host/port (``APIConsumer.host``/``.port`` are class attributes that ``Proxy`` and
  ``Toxiproxy`` reference directly) -> :class:`Toxiproxy` builds its own ``APIConsumer`` subclass
  per instance, bound to ``127.0.0.1:PORT``; the library's ``Proxy``/``Toxiproxy`` classes are not
  used because they can only talk to the global one;
* no request timeout -> every call passes ``timeout=`` (``APIConsumer`` forwards ``**kwargs`` to
  ``requests``);
* 5xx and 4xx other than 400/404/409 are swallowed by ``validate_response`` -> every response is
  checked here and raises :class:`ToxiproxyError` with the status and the server's message;
* ``Proxy.add_toxic`` returns None -> :meth:`Toxiproxy.add_toxic` reads the toxic back and returns it.

:class:`ToxiproxyServer` finds the ``toxiproxy-server`` binary, starts it on a free loopback port
(never 8474 by assumption), waits until it answers, and stops it (SIGTERM, then SIGKILL, its own
process group). :data:`TOXIC_TYPES` is the table of toxic types and attributes that the wrapper and
the scenario schema validate against (toxiproxy-server itself silently ignores unknown attributes).
:func:`measure_floor` measures what the proxy adds with no toxic, and a latency toxic's real effect.
"""

from __future__ import annotations

import ctypes
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Literal

import requests
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from toxiproxy.api import APIConsumer
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

PINNED_VERSION = "2.12.0"
ENV_BINARY = "PDCHAOS_TOXIPROXY_SERVER"
DEFAULT_TIMEOUT_S = 5.0

# --------------------------------------------------------------------------- toxic table

# type -> attribute -> unit, as toxiproxy-server v2.12.0 reads them (every attribute is an int).
# "ms"/"us" attributes are durations; the fault Params (faults/toxics.py) take Duration strings.
TOXIC_TYPES: dict[str, dict[str, str]] = {
    "latency": {"latency": "ms", "jitter": "ms"},
    "bandwidth": {"rate": "KB/s"},
    "slow_close": {"delay": "ms"},
    "timeout": {"timeout": "ms"},
    "reset_peer": {"timeout": "ms"},
    "slicer": {"average_size": "bytes", "size_variation": "bytes", "delay": "us"},
    "limit_data": {"bytes": "bytes"},
}
STREAMS = ("upstream", "downstream")


class ToxicSpec(BaseModel):
    """One toxic as sent to the server; an unknown type or attribute is a precise error."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str
    stream: Literal["upstream", "downstream"] = "downstream"
    toxicity: float = Field(1.0, ge=0.0, le=1.0)
    attributes: dict[str, int] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known(self) -> "ToxicSpec":
        known = TOXIC_TYPES.get(self.type)
        if known is None:
            raise ValueError(f"unknown toxic type {self.type!r}; known: {', '.join(TOXIC_TYPES)}")
        for attr, value in self.attributes.items():
            if attr not in known:
                raise ValueError(f"toxic {self.type!r}: unknown attribute {attr!r}; known: {', '.join(known)}")
            if value < 0:
                raise ValueError(f"toxic {self.type!r}: attribute {attr!r} must be >= 0 ({known[attr]}), got {value}")
        return self


class ToxiproxyError(Exception):
    """A call to toxiproxy-server failed. ``status`` is the HTTP status (None: no answer at all)."""

    def __init__(self, message: str, *, status: int | None = None, method: str = "", path: str = ""):
        self.status = status
        self.method = method
        self.path = path
        self.message = message
        where = f"{method} {path}".strip()
        head = f"toxiproxy {where}: " if where else "toxiproxy: "
        tail = f" (HTTP {status})" if status is not None else ""
        super().__init__(f"{head}{message}{tail}")


class ToxicSpecError(ValueError):
    """A toxic refused before it reached the server (unknown type or attribute, bad value)."""


def validate_toxic(type: str, stream: str = "downstream", toxicity: float = 1.0,
                   attributes: dict[str, int] | None = None) -> ToxicSpec:
    try:
        return ToxicSpec(type=type, stream=stream, toxicity=toxicity, attributes=dict(attributes or {}))
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        raise ToxicSpecError(f"{loc}: {msg}" if loc else msg) from None


# --------------------------------------------------------------------------- API wrapper

# The library's exceptions carry only the body; the status each one stands for is fixed by
# toxiproxy.api.validate_response.
_LIB_STATUS = {ProxyExists: 409, NotFound: 404, InvalidToxic: 400}


def _server_message(body: bytes | str) -> str:
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
    try:
        data = json.loads(text)
        if isinstance(data, dict) and "error" in data:
            return str(data["error"])
    except ValueError:
        pass
    return text.strip()[:200] or "(empty body)"


def _check_loopback_hostport(value: str, what: str) -> tuple[str, int]:
    """``HOST:PORT`` with a loopback host (127.0.0.0/8, ::1 or localhost), else ValueError."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{what}: {value!r} must be HOST:PORT")
    host = host.strip("[]")
    if host == "localhost":
        return host, int(port)
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{what}: {value!r}: host must be a loopback IP address") from None
    if not addr.is_loopback:
        raise ValueError(f"{what}: {value!r} is not on loopback (127.0.0.0/8 or ::1)")
    return host, int(port)


class Toxiproxy:
    """The HTTP API of one toxiproxy-server at ``http://127.0.0.1:PORT``. Thread-safe (no shared state)."""

    def __init__(self, port: int, host: str = "127.0.0.1", *, timeout: float = DEFAULT_TIMEOUT_S):
        _check_loopback_hostport(f"{host}:{port}", "toxiproxy API address")
        self.host = host
        self.port = int(port)
        self.timeout = float(timeout)
        self.base_url = f"http://{host}:{self.port}"
        # A subclass per instance: the library's client pieces, with this server's address.
        self._api = type("APIConsumer_%d" % self.port, (APIConsumer,), {"host": host, "port": self.port})

    def __repr__(self) -> str:
        return f"Toxiproxy({self.base_url})"

    # ------------------------------------------------------------------ HTTP
    def _call(self, method: str, path: str, body: Any = None, *, timeout: float | None = None) -> Any:
        timeout = self.timeout if timeout is None else timeout
        try:
            if method == "GET":
                resp = self._api.get(path, timeout=timeout)
            elif method == "POST":
                resp = self._api.post(path, json=body, timeout=timeout)
            elif method == "DELETE":
                resp = self._api.delete(path, timeout=timeout)
            elif method == "PATCH":
                # APIConsumer has no PATCH, and POST /proxies/{name} is deprecated in 2.12 (it logs a
                # warning per call): plain requests for this one verb.
                resp = requests.patch(self.base_url + path, json=body, timeout=timeout)
            else:  # pragma: no cover - internal misuse
                raise ValueError(method)
        except (ProxyExists, NotFound, InvalidToxic) as exc:
            body_text = exc.args[0] if exc.args else b""
            raise ToxiproxyError(_server_message(body_text), status=_LIB_STATUS[type(exc)],
                                 method=method, path=path) from None
        except requests.Timeout:
            raise ToxiproxyError(f"no answer within {timeout:g}s", method=method, path=path) from None
        except requests.RequestException as exc:
            raise ToxiproxyError(f"cannot reach {self.base_url}: {type(exc).__name__}",
                                 method=method, path=path) from None
        if resp.status_code >= 400:  # what validate_response lets through (5xx, 405, ...)
            raise ToxiproxyError(_server_message(resp.content), status=resp.status_code, method=method, path=path)
        if resp.status_code == 204 or not resp.content:
            return None
        try:
            return resp.json()
        except ValueError:
            return resp.text

    # ------------------------------------------------------------------ server
    def version(self) -> str:
        """The version the server reports ("2.12.0"; "git" for a build without the version stamp)."""
        data = self._call("GET", "/version")
        if isinstance(data, dict):
            return str(data.get("version", ""))
        return str(data or "").strip()

    def ping(self, timeout: float = 0.5) -> bool:
        try:
            self._call("GET", "/version", timeout=timeout)
            return True
        except ToxiproxyError:
            return False

    def reset(self) -> None:
        """Remove every toxic and re-enable every proxy."""
        self._call("POST", "/reset")

    # ------------------------------------------------------------------ proxies
    def proxies(self) -> dict[str, dict]:
        return self._call("GET", "/proxies") or {}

    def get_proxy(self, name: str) -> dict:
        return self._call("GET", f"/proxies/{name}")

    def create_proxy(self, name: str, listen: str = "127.0.0.1:0", *, upstream: str,
                     enabled: bool = True, allow_any_upstream: bool = False) -> dict:
        """Create a proxy; returns it as the server has it (``listen`` with the real port).

        Listen is loopback only; so is upstream unless ``allow_any_upstream`` (an address in a
        network namespace the run made)."""
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name or ""):
            raise ValueError(f"proxy name {name!r}: use 1-64 of A-Z a-z 0-9 _ . -")
        _check_loopback_hostport(listen, "listen")
        if not allow_any_upstream:
            _check_loopback_hostport(upstream, "upstream")
        return self._call("POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream,
                                               "enabled": enabled})

    def _delete(self, path: str, missing_ok: bool) -> bool:
        """DELETE ``path``: True if removed, False if it was not there and ``missing_ok``."""
        try:
            self._call("DELETE", path)
            return True
        except ToxiproxyError as exc:
            if missing_ok and exc.status == 404:
                return False
            raise

    def delete_proxy(self, name: str, *, missing_ok: bool = False) -> bool:
        return self._delete(f"/proxies/{name}", missing_ok)

    def set_enabled(self, proxy: str, enabled: bool) -> dict:
        """Enable or disable a proxy (disabled: the listener is closed and live connections are cut)."""
        return self._call("PATCH", f"/proxies/{proxy}", {"enabled": bool(enabled)})

    # ------------------------------------------------------------------ toxics
    def toxics(self, proxy: str) -> list[dict]:
        return self._call("GET", f"/proxies/{proxy}/toxics") or []

    def get_toxic(self, proxy: str, name: str) -> dict:
        return self._call("GET", f"/proxies/{proxy}/toxics/{name}")

    def add_toxic(self, proxy: str, type: str, stream: str = "downstream", toxicity: float = 1.0,
                  attributes: dict[str, int] | None = None, *, name: str | None = None,
                  validate: bool = True) -> dict:
        """Add a toxic and return it as read back from the server.

        ``validate`` checks type and attributes against :data:`TOXIC_TYPES` first (raises
        :class:`ToxicSpecError`); the server itself ignores unknown attributes."""
        if validate:
            spec = validate_toxic(type, stream, toxicity, attributes)
            body = spec.model_dump()
        else:
            body = {"type": type, "stream": stream, "toxicity": toxicity, "attributes": dict(attributes or {})}
        body["name"] = name or f"{type}_{stream}_{secrets.token_hex(3)}"
        self._call("POST", f"/proxies/{proxy}/toxics", body)
        return self.get_toxic(proxy, body["name"])

    def remove_toxic(self, proxy: str, name: str, *, missing_ok: bool = True) -> bool:
        """True if removed, False if it was not there (``missing_ok``; a reset may have removed it)."""
        return self._delete(f"/proxies/{proxy}/toxics/{name}", missing_ok)


# --------------------------------------------------------------------------- binary and server

_VERSION_LINE = re.compile(r"version\s+v?(\S+)")
# Go embeds the module list as plain text ("mod\t<path>\t<version>\t<sum>"); a `go install pkg@vX`
# build without the -X version stamp still carries its module version there.
_BUILDINFO_MOD = re.compile(rb"\nmod\tgithub\.com/Shopify/toxiproxy/v2\tv?([0-9A-Za-z.+-]+)")


def find_binary() -> str | None:
    """``$PDCHAOS_TOXIPROXY_SERVER`` when set (an explicit choice: if it is not an executable, the
    answer is None, no fallback), else ``toxiproxy-server`` on PATH, else ``~/go/bin/server`` (where
    a plain ``go install`` puts it)."""
    env = os.environ.get(ENV_BINARY)
    if env:
        return env if os.path.isfile(env) and os.access(env, os.X_OK) else None
    on_path = shutil.which("toxiproxy-server")
    if on_path:
        return on_path
    gobin = Path(os.environ.get("GOBIN") or Path.home() / "go" / "bin") / "server"
    if gobin.is_file() and os.access(gobin, os.X_OK) and _buildinfo_version(str(gobin)) is not None:
        return str(gobin)
    return None


find_server_binary = find_binary  # the name harness/services.py imports


def _buildinfo_version(path: str) -> str | None:
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    m = _BUILDINFO_MOD.search(data)
    return m.group(1).decode() if m else None


def binary_version(path: str, timeout: float = 5.0) -> str | None:
    """"2.12.0" from ``-version``; for an unstamped build ("git") the module version in its build info."""
    try:
        out = subprocess.run([path, "-version"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = _VERSION_LINE.search(out.stdout + out.stderr)
    version = m.group(1) if m else None
    if version in (None, "git"):
        version = _buildinfo_version(path) or version
    return version


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _listening_ports(pid: int) -> set[int]:
    """TCP ports a process listens on (Linux /proc: its socket inodes matched to LISTEN entries)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        return set()
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A" and cols[9] in inodes:  # 0A = LISTEN
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        # PR_SET_PDEATHSIG: no server outlives its runner. It fires when the *thread* that started
        # the server exits, so start it from a thread that lives as long as the run (the main one).
        libc.prctl(1, signal.SIGTERM)
    except Exception:
        pass


class ToxiproxyServer:
    """One toxiproxy-server process on a free loopback port. ``with ToxiproxyServer() as srv: srv.api...``"""

    def __init__(self, binary: str | None = None, *, host: str = "127.0.0.1", port: int | None = None,
                 log_path: str | os.PathLike | None = None, log_level: str = "warn",
                 start_timeout: float = 10.0, api_timeout: float = DEFAULT_TIMEOUT_S):
        self.binary = binary or find_binary()
        self.host = host
        self.requested_port = port  # None: any free port (the usual case)
        self.port: int | None = None  # the port it serves on, once started
        self.log_path = Path(log_path) if log_path else None
        self.log_level = log_level
        self.start_timeout = start_timeout
        self.api_timeout = api_timeout
        self.proc: subprocess.Popen | None = None
        self.api: Toxiproxy | None = None
        self.version: str | None = None

    @property
    def available(self) -> bool:
        return self.binary is not None

    @property
    def pinned(self) -> bool:
        return self.version == PINNED_VERSION

    def start(self) -> "ToxiproxyServer":
        if self.proc is not None:
            return self
        if self.binary is None:
            raise ToxiproxyError(f"toxiproxy-server not found (PATH, ~/go/bin/server, ${ENV_BINARY}); "
                                 "run .ci/install-toxiproxy.sh")
        self.version = binary_version(self.binary)
        # With no port given the server binds port 0 and we read the port it got from /proc: no
        # window in which another process can take a port picked for it. (toxiproxy-server does not
        # exit when its API port is taken: it logs "Server finished with error" and keeps running,
        # so a picked port that got taken would leave a silent server, or let us talk to another.)
        have_proc = Path(f"/proc/{os.getpid()}/net/tcp").exists()
        if self.requested_port is not None:
            port_arg = int(self.requested_port)
        elif have_proc:
            port_arg = 0
        else:  # not Linux: pick one; the log check below catches a lost race
            port_arg = free_port(self.host)
        # stderr goes to a file (the log, or an anonymous temp file): a pipe nobody drains could
        # fill up and block the server.
        log = open(self.log_path, "a+b") if self.log_path else tempfile.TemporaryFile()
        offset = log.seek(0, os.SEEK_END)
        try:
            proc = subprocess.Popen(
                [self.binary, "-host", self.host, "-port", str(port_arg)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                env={**os.environ, "LOG_LEVEL": self.log_level}, start_new_session=True,
                preexec_fn=_die_with_parent)
        except OSError as exc:
            log.close()
            raise ToxiproxyError(f"cannot start {self.binary}: {exc}") from None
        try:
            deadline = time.monotonic() + self.start_timeout
            port: int | None = port_arg or None
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise ToxiproxyError(f"toxiproxy-server exited at start (code {proc.returncode}): "
                                         f"{self._output_tail(log, offset)}")
                failure = self._start_failure(log, offset)
                if failure:
                    raise ToxiproxyError(f"toxiproxy-server cannot serve on {self.host}:{port_arg}: {failure}")
                if have_proc:
                    ports = _listening_ports(proc.pid)  # before any proxy exists: the API's only
                    port = (port_arg if port_arg in ports else None) if port_arg else min(ports, default=None)
                if port is not None:
                    api = Toxiproxy(port, self.host, timeout=self.api_timeout)
                    if api.ping(timeout=0.5):
                        self.proc, self.api, self.port = proc, api, port
                        return self
                time.sleep(0.02)
            raise ToxiproxyError(f"toxiproxy-server ({self.host}:{port_arg or 'any port'}) did not answer "
                                 f"within {self.start_timeout:g}s")
        except BaseException:
            self._kill(proc)
            raise
        finally:
            log.close()  # the child keeps its own descriptor

    @staticmethod
    def _start_failure(log, offset: int) -> str | None:
        try:
            log.flush()
            log.seek(offset)
            text = log.read().decode(errors="replace")
            log.seek(0, os.SEEK_END)
        except (OSError, ValueError):
            return None
        for line in text.splitlines():
            if "Server finished with error" in line:
                try:
                    return str(json.loads(line).get("error") or line)
                except ValueError:
                    return line.strip()[:300]
        return None

    @staticmethod
    def _output_tail(log, offset: int = 0) -> str:
        try:
            log.flush()
            log.seek(offset)
            text = log.read().decode(errors="replace")
        except (OSError, ValueError):
            text = ""
        return " | ".join(text.strip().splitlines()[-3:])[:400] or "no output"

    @staticmethod
    def _kill(proc: subprocess.Popen, grace: float = 3.0) -> None:
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            if proc.poll() is not None:
                break
            try:
                os.killpg(proc.pid, sig)  # its own session: pgid == pid
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 3 s. Idempotent."""
        proc, self.proc, self.api = self.proc, None, None
        if proc is not None:
            self._kill(proc)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def client(self) -> Toxiproxy:
        """The API wrapper of the running server (the same object as ``.api``)."""
        if self.api is None:
            raise ToxiproxyError("toxiproxy-server is not running: call start() first")
        return self.api

    def __enter__(self) -> "ToxiproxyServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- measurement floor


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def measure_floor(api: Toxiproxy, *, n: int = 200, latency_ms: int = 20, n_latency: int = 30,
                  stream: str = "downstream", timeout_ms: int = 2000) -> dict[str, Any]:
    """What Toxiproxy adds to a ZMQ REQ/REP round trip on 127.0.0.1, and what a latency toxic really adds.

    An echo REP socket runs in a thread; one REQ client connects directly and one through a fresh
    proxy. Round trips alternate direct/proxied (so noise hits both alike); medians over ``n``.
    Then a ``latency_ms`` latency toxic goes on ``stream`` and ``n_latency`` proxied round trips
    give the measured added latency (median through the toxic minus the direct median).
    The proxy is removed at the end. Times in milliseconds."""
    import zmq  # only here: the wrapper itself does not need pyzmq

    ctx = zmq.Context()
    rep = ctx.socket(zmq.REP)
    rep.setsockopt(zmq.LINGER, 0)
    port = rep.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()

    def echo() -> None:
        while not stop.is_set():
            if rep.poll(20, zmq.POLLIN):
                rep.send(rep.recv())

    thread = threading.Thread(target=echo, name="pdchaos-floor-echo", daemon=True)
    thread.start()
    proxy_name = f"pdc-floor-{secrets.token_hex(3)}"
    socks: list = []
    try:
        proxy = api.create_proxy(proxy_name, "127.0.0.1:0", upstream=f"127.0.0.1:{port}")

        def client(endpoint: str):
            s = ctx.socket(zmq.REQ)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(endpoint)
            socks.append(s)
            return s

        direct = client(f"tcp://127.0.0.1:{port}")
        proxied = client(f"tcp://{proxy['listen']}")
        payload = b"x" * 64

        def rtt(sock) -> float:
            t0 = time.perf_counter()
            sock.send(payload)
            if not sock.poll(timeout_ms, zmq.POLLIN):
                raise ToxiproxyError(f"floor: no echo within {timeout_ms} ms")
            sock.recv()
            return (time.perf_counter() - t0) * 1000.0

        for _ in range(10):  # warm-up: connections established, caches hot
            rtt(direct), rtt(proxied)
        d, p = [], []
        for _ in range(n):
            d.append(rtt(direct))
            p.append(rtt(proxied))
        toxic = api.add_toxic(proxy_name, "latency", stream, 1.0, {"latency": int(latency_ms), "jitter": 0})
        lat, d2 = [], []
        for _ in range(n_latency):
            d2.append(rtt(direct))
            lat.append(rtt(proxied))
        api.remove_toxic(proxy_name, toxic["name"])
        d_med, p_med = statistics.median(d), statistics.median(p)
        measured = statistics.median(lat) - statistics.median(d2)
        return {
            "method": "zmq REQ/REP round trip on 127.0.0.1, 64-byte payload",
            "n": n,
            "direct_median_ms": round(d_med, 4),
            "direct_p90_ms": round(_percentile(d, 0.9), 4),
            "proxied_median_ms": round(p_med, 4),
            "proxied_p90_ms": round(_percentile(p, 0.9), 4),
            "added_median_ms": round(p_med - d_med, 4),
            "latency_stream": stream,
            "latency_n": n_latency,
            "latency_configured_ms": int(latency_ms),
            "latency_measured_ms": round(measured, 4),
            "latency_error_ms": round(measured - latency_ms, 4),
            "latency_min_ms": round(min(lat), 4),
            "latency_max_ms": round(max(lat), 4),
        }
    finally:
        stop.set()
        thread.join(2.0)
        for s in socks:
            s.close(linger=0)
        rep.close(linger=0)
        ctx.term()
        try:
            api.delete_proxy(proxy_name, missing_ok=True)
        except ToxiproxyError:
            pass
