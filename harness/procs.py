"""Start and stop ``pdchaos node ...`` processes (and other helper processes) reliably.

Every process is started in its own session, so its process group id equals its pid: ``stop()``
and ``kill()`` signal the whole group (a node's own children go too), and a Ctrl-C typed at the
terminal reaches only the harness, which then stops its nodes in a ``finally``.

Readiness: a node prints one line ``READY`` on stdout when it serves (nodekit/nodeio.py). We
read stdout until that line or the ready timeout, whichever comes first; a node that exits before
it is ready raises :class:`HarnessError` naming its exit code and the last lines of its log. After
READY a daemon thread keeps draining stdout (into the log when there is one) so a chatty node can
never block on a full pipe.

The selector loop below is written by hand because the standard library has no "read a line
with a deadline" for a pipe; it is a few lines of ``selectors`` and ``os.read``.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Mapping, Sequence

from nodekit.nodeio import PARENT_ENV

from .errors import HarnessError
from .runtime import NodeHandle

READY_LINE = b"READY"
_TAIL_BYTES = 2000


def _seen_stopped(pid: int, wait_s: float = 1.0) -> bool | None:
    """The process is in state T (stopped) in /proc, within ``wait_s``; None without /proc."""
    path = f"/proc/{pid}/stat"
    end = time.monotonic() + wait_s
    while True:
        try:
            with open(path, encoding="ascii", errors="replace") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return None
        if state in ("T", "t"):
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.01)


def node_command(kind: str, args: Sequence[str] = ()) -> list[str]:
    """The argv of ``pdchaos node KIND ARGS...`` run with this interpreter (no PATH lookup)."""
    return [sys.executable, "-m", "harness.cli", "node", kind, *[str(a) for a in args]]


class ProcHandle(NodeHandle):
    """A started process: ``.pid``, ``.proc``, ``.alive``, ``.stop(timeout_s)``, ``.kill()``,
    ``.freeze()``/``.thaw()`` (the local runtime's node handle, runtimes/local).

    ``stop`` and ``kill`` are idempotent and never raise; both return the exit code (a negative
    signal number when a signal ended it, as in ``subprocess``)."""

    def __init__(self, proc: subprocess.Popen, name: str, log_path: str | None, log_fh: IO[bytes] | None):
        self.proc = proc
        self.pid = proc.pid
        self.name = name
        self.log_path = log_path
        self._log_fh = log_fh
        self._drain: threading.Thread | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ state
    @property
    def instance(self) -> int:
        return self.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    # ---------------------------------------------------------------- control
    def _signal_group(self, sig: int) -> None:
        # The group id is our pid (start_new_session). Signal it only while the leader has not
        # been reaped: afterwards the id could in principle belong to someone else.
        if self.proc.returncode is not None:
            return
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:  # pragma: no cover - never expected for our own child
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def stop(self, timeout_s: float = 5.0) -> int | None:
        """SIGTERM to the group, wait up to ``timeout_s``, then SIGKILL and wait again."""
        with self._lock:
            if self.proc.poll() is None:
                self._signal_group(signal.SIGTERM)
                self._signal_group(signal.SIGCONT)  # a frozen (SIGSTOP) node must run to exit
                try:
                    self.proc.wait(timeout=max(0.0, timeout_s))
                except subprocess.TimeoutExpired:
                    self._signal_group(signal.SIGKILL)
                    try:
                        self.proc.wait(timeout=5.0)
                    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
                        pass
            self._reap_group()
            self._finish()
            return self.proc.returncode

    def kill(self) -> int | None:
        """SIGKILL to the group at once (no clean shutdown: for crash scenarios)."""
        with self._lock:
            if self.proc.poll() is None:
                self._signal_group(signal.SIGKILL)
                try:
                    self.proc.wait(timeout=5.0)
                except subprocess.TimeoutExpired:  # pragma: no cover
                    pass
            self._reap_group()
            self._finish()
            return self.proc.returncode

    def signal(self, sig: int) -> None:
        """``sig`` to the whole process group (a node that runs a server as its child, e.g. vLLM,
        freezes, thaws or dies with it)."""
        with self._lock:
            self._signal_group(sig)

    def freeze(self) -> bool | None:
        """SIGSTOP to the group; whether the node's process was then seen stopped (state T in
        /proc; None where that cannot be read)."""
        self.signal(signal.SIGSTOP)
        return _seen_stopped(self.pid)

    def thaw(self) -> None:
        self.signal(signal.SIGCONT)

    def _reap_group(self) -> None:
        """Children of the node that outlived it are still in its group: end them too. Safe here:
        while any member lives the group id cannot be reused."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def _finish(self) -> None:
        if self._drain is not None:
            self._drain.join(timeout=1.0)
        # Close our end only once the drain thread is done with it (a reader blocked in read()
        # holds the buffer lock and close() would wait for it).
        if self.proc.stdout is not None and (self._drain is None or not self._drain.is_alive()):
            try:
                self.proc.stdout.close()
            except OSError:
                pass
        if self._log_fh is not None:
            try:
                self._log_fh.close()
            except OSError:
                pass
            self._log_fh = None

    def log_tail(self, n_bytes: int = _TAIL_BYTES) -> str:
        """The last bytes of the process's log (stderr, and stdout lines): the named log file, or
        while the process runs the anonymous temporary file used when there is none."""
        try:
            if self._log_fh is not None and not self._log_fh.closed:
                self._log_fh.flush()
                fd = self._log_fh.fileno()
                size = os.fstat(fd).st_size
                return os.pread(fd, n_bytes, max(0, size - n_bytes)).decode("utf-8", "replace")
            if self.log_path:
                with open(self.log_path, "rb") as fh:
                    fh.seek(0, os.SEEK_END)
                    fh.seek(max(0, fh.tell() - n_bytes))
                    return fh.read().decode("utf-8", "replace")
        except OSError:
            pass
        return ""

    def __enter__(self) -> "ProcHandle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<ProcHandle {self.name} pid={self.pid} alive={self.alive}>"


def start_process(argv: Sequence[str], *, name: str | None = None, log_path: str | None = None,
                  ready_timeout_s: float | None = 10.0, env: Mapping[str, str] | None = None,
                  cwd: str | None = None, cancel: threading.Event | None = None) -> ProcHandle:
    """Start ``argv`` in its own process group; with ``ready_timeout_s`` wait for a ``READY`` line.

    stderr goes to ``log_path`` (appended) or to an anonymous temporary file (so an early exit can
    still be explained), never to our own terminal. Raises HarnessError when the program
    cannot be started, exits before READY, or is not ready in time (it is stopped first).
    ``cancel``: the run's interrupt (a signal to the harness); once set, the wait for READY ends
    within a fifth of a second, the process group is killed and :class:`StartCancelled` raised (a
    vLLM server's start takes minutes: an interrupted run must not wait for it)."""
    name = name or os.path.basename(str(argv[0]))
    # owned by the handle, closed by stop()/kill()
    log_fh = open(log_path, "a+b") if log_path else tempfile.TemporaryFile()  # noqa: SIM115
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    full_env[PARENT_ENV] = str(os.getpid())  # a node whose runner died before it looked still sees it (nodeio)
    try:
        proc = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=log_fh,
            start_new_session=True, env=full_env, cwd=cwd,
        )
    except OSError as exc:
        log_fh.close()
        raise HarnessError(f"{name}: cannot start: {exc.strerror or exc}") from None
    handle = ProcHandle(proc, name, log_path, log_fh)
    if ready_timeout_s is None:
        handle._drain = _start_drain(proc, log_fh)
        return handle
    try:
        _wait_ready(handle, ready_timeout_s, cancel)
    except BaseException:
        handle.kill()
        raise
    handle._drain = _start_drain(proc, log_fh)
    return handle


def start_node(kind: str, args: Sequence[str] = (), log_path: str | None = None,
               ready_timeout_s: float = 10.0, *, env: Mapping[str, str] | None = None,
               cancel: threading.Event | None = None) -> ProcHandle:
    """``pdchaos node KIND ARGS...`` as a process; returns once it printed READY."""
    return start_process(node_command(kind, args), name=f"node {kind}", log_path=log_path,
                         ready_timeout_s=ready_timeout_s, env=env, cancel=cancel)


class StartCancelled(HarnessError):
    """The run was interrupted while a process started: it was killed before it was ready."""


_CANCEL_POLL_S = 0.2


def _wait_ready(handle: ProcHandle, timeout_s: float, cancel: threading.Event | None = None) -> None:
    proc = handle.proc
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout_s
    buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            if cancel is not None and cancel.is_set():
                raise StartCancelled(f"{handle.name}: start interrupted before it was ready")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise HarnessError(f"{handle.name}: not ready within {timeout_s:g} s{_tail(handle)}")
            if not sel.select(timeout=remaining if cancel is None else min(remaining, _CANCEL_POLL_S)):
                continue
            chunk = os.read(fd, 4096)
            if not chunk:  # stdout closed: the process is exiting
                try:
                    code = proc.wait(timeout=2.0)
                except subprocess.TimeoutExpired:
                    code = None
                raise HarnessError(f"{handle.name}: exited (code {code}) before it was ready{_tail(handle)}")
            if handle._log_fh is not None:
                handle._log_fh.write(chunk)
                handle._log_fh.flush()
            buf += chunk
            lines = buf.split(b"\n")
            if any(line.strip() == READY_LINE for line in lines[:-1]):
                return
            buf = lines[-1][-256:]


def _tail(handle: ProcHandle) -> str:
    tail = handle.log_tail(400).strip().splitlines()
    return f"; last log line: {tail[-1]}" if tail else ""


def _start_drain(proc: subprocess.Popen, log_fh: IO[bytes] | None) -> threading.Thread:
    def drain() -> None:
        stream = proc.stdout
        if stream is None:
            return
        try:
            while True:
                chunk = stream.read1(4096) if hasattr(stream, "read1") else stream.read(4096)
                if not chunk:
                    return
                if log_fh is not None and not log_fh.closed:
                    log_fh.write(chunk)
                    log_fh.flush()
        except (OSError, ValueError):  # closed under us by _finish
            return

    t = threading.Thread(target=drain, name=f"drain-{proc.pid}", daemon=True)
    t.start()
    return t
