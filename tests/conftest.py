"""Shared fixtures: unique endpoints, a started LookupServer over ipc and tcp, raw peers, a
resource snapshot helper and the log guard (no block hash in any log record).

Helper classes and constants live in ``tests/rawpeers.py`` (importable as ``rawpeers``)."""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Callable, Iterator

import pytest

from connector_patch.lookup import LookupClient, LookupServer
from rawpeers import (
    ControlledBackend,
    RawDealer,
    RawRepPeer,
    Resources,
    distinct_hashes,
    hash_leaks,
    hexes,
    wait_resources_back,
)
# no silent skips: PDCHAOS_REQUIRE_ALL=1 makes a skip a failure; every run ends with the skips counted
from skipguard import (  # noqa: F401  (pytest finds the hooks by name in this module)
    pytest_make_collect_report,
    pytest_report_teststatus,
    pytest_runtest_makereport,
    pytest_terminal_summary,
)

TRANSPORTS = ("ipc", "tcp")


# --------------------------------------------------------------------------- two workers
# ``python -m pytest`` runs in two pytest-xdist workers, a module per worker at a time (addopts in
# pyproject.toml: -n 2 --dist loadfile; xdist hands out the modules with the most tests first):
# the suite waits on node processes, sockets and deadlines most of the time (one serial run
# measured 595 s of CPU in 780 s of wall time on 2 cores).
# Each worker hands out TCP ports from its own half of the range (harness.topology._port_slice),
# so the two never pick the same one.
if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):
    _n = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    # modulo: a worker that replaces a crashed one gets the next id (gw2 of 2)
    os.environ.setdefault("PDCHAOS_PORT_SLICE", f"{int(os.environ['PYTEST_XDIST_WORKER'][2:]) % _n}/{_n}")


# --------------------------------------------------------------------------- endpoints

def _short_tmp() -> Iterator[str]:
    # Under /tmp, short: tmp_path is often longer than the 107 bytes a unix socket path allows.
    path = tempfile.mkdtemp(prefix="pdc", dir="/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def ipc_dir() -> Iterator[str]:
    yield from _short_tmp()


@pytest.fixture
def short_tmp() -> Iterator[str]:
    """A fresh short folder under /tmp for one test (ipc paths, preload files, TMPDIR)."""
    yield from _short_tmp()


_ipc_counter = itertools.count()


@pytest.fixture
def ipc_endpoint(ipc_dir: str) -> Callable[[], str]:
    """Factory: a fresh ``ipc://`` endpoint (nothing bound yet) each call."""
    return lambda: f"ipc://{ipc_dir}/s{next(_ipc_counter)}.sock"


def free_tcp_port() -> int:
    """The harness's own port picker: outside the kernel's ephemeral range, never given twice."""
    from harness.topology import free_tcp_port as pick

    return pick()


@pytest.fixture
def tcp_endpoint() -> Callable[[], str]:
    """Factory: ``tcp://127.0.0.1:PORT`` on a port free right now (nothing bound yet)."""
    return lambda: f"tcp://127.0.0.1:{free_tcp_port()}"


@pytest.fixture(scope="module", params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    """ipc or tcp. Module-scoped so that a module's tests run per transport and can share one
    server (``shared_server``) instead of paying a server start and close each."""
    return request.param


@pytest.fixture
def make_endpoint(transport: str, ipc_endpoint, tcp_endpoint) -> Callable[[], str]:
    """Factory of fresh endpoints of the parametrized transport (ipc and tcp)."""
    return ipc_endpoint if transport == "ipc" else tcp_endpoint


# --------------------------------------------------------------------------- servers and peers

@dataclass
class ServerHandle:
    endpoint: str
    server: LookupServer
    backend: ControlledBackend

    def preload(self, n: int, tag: str, groups=None) -> list[bytes]:
        hashes = distinct_hashes(n, tag)
        self.backend.put(hexes(hashes), groups)
        return hashes


@pytest.fixture
def server_factory() -> Iterator[Callable[..., ServerHandle]]:
    """Factory: a started LookupServer over a (fault-injectable) MemoryBackend; closed at teardown."""
    made: list[ServerHandle] = []

    def make(endpoint: str, *, block_size: int = 16, groups: int = 2, **kwargs) -> ServerHandle:
        backend = ControlledBackend(block_size=block_size, groups=groups)
        server = LookupServer(endpoint, backend, **kwargs)
        handle = ServerHandle(endpoint, server, backend)
        made.append(handle)
        server.start()
        return handle

    yield make
    for h in made:
        h.backend.release()
        h.server.close()
        h.backend.close()


@pytest.fixture
def lookup_server(make_endpoint, server_factory) -> ServerHandle:
    """A started LookupServer + MemoryBackend (block size 16, 2 groups), over ipc and tcp."""
    return server_factory(make_endpoint())


@pytest.fixture(scope="module")
def shared_server(transport: str, ipc_dir: str) -> Iterator[ServerHandle]:
    """One started LookupServer + MemoryBackend (block size 16, 2 groups) per module and
    transport. Tests compare counters with :func:`rawpeers.counter_delta` and must leave the
    backend healthy (mode none); tests that reset or break the backend use ``lookup_server``."""
    ep = (f"ipc://{ipc_dir}/shared{next(_ipc_counter)}.sock" if transport == "ipc"
          else f"tcp://127.0.0.1:{free_tcp_port()}")
    backend = ControlledBackend(block_size=16, groups=2)
    server = LookupServer(ep, backend).start()
    try:
        yield ServerHandle(ep, server, backend)
    finally:
        backend.release()
        server.close()
        backend.close()


@pytest.fixture
def client_factory() -> Iterator[Callable[..., LookupClient]]:
    made: list[LookupClient] = []

    def make(endpoint: str, timeout_ms: int = 2000, **kwargs) -> LookupClient:
        c = LookupClient(endpoint, timeout_ms, **kwargs)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


@pytest.fixture
def peer_factory() -> Iterator[Callable[..., RawRepPeer]]:
    made: list[RawRepPeer] = []

    def make(endpoint: str, respond=None, **kwargs) -> RawRepPeer:
        p = RawRepPeer(endpoint, respond, **kwargs)
        made.append(p)
        return p

    yield make
    errors = []
    for p in made:
        try:
            p.close()
        except AssertionError as exc:
            errors.append(str(exc))
    assert not errors, errors


@pytest.fixture
def dealer_factory() -> Iterator[Callable[[str], RawDealer]]:
    made: list[RawDealer] = []

    def make(endpoint: str) -> RawDealer:
        d = RawDealer(endpoint)
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()


# --------------------------------------------------------------------------- resources

@pytest.fixture
def resources() -> Callable[[], Resources]:
    """Snapshot helper: ``base = resources()`` ... ``assert_back(base)`` (see wait_resources_back)."""
    return Resources.now


@pytest.fixture
def assert_resources_back() -> Callable[[Resources], None]:
    def check(baseline: Resources, timeout_s: float = 3.0) -> None:
        now = wait_resources_back(baseline, timeout_s)
        leak = now.leaked_since(baseline)
        assert not leak, f"not back to baseline after close: {leak}"

    return check


# --------------------------------------------------------------------------- log guard

class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def log_guard() -> Iterator[_Capture]:
    """Capture every record of the ``connector_patch`` loggers at DEBUG during the test and fail it
    if any record carries a block hash or raw frames. Used by every lookup test module."""
    logger = logging.getLogger("connector_patch")
    handler = _Capture()
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    leaks = hash_leaks(handler.records)
    assert not leaks, f"log records carry block hashes or raw frames: {leaks}"
