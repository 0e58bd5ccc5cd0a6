"""Helpers for the lookup RPC tests: raw ZMQ peers, distinctive hashes, resource snapshots.

Everything here speaks real ZMQ over real ipc/tcp sockets. Nothing mocks zmq: a "bad server" is a
real REP socket that answers with chosen frames, and a "bad client" is a real DEALER socket that
sends chosen frames.

Written by hand (no library offers "a REP socket that answers with these exact bytes after this
delay"), small on purpose.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Sequence

import zmq

from connector_patch.lookup import MemoryBackend
from connector_patch.lookup.protocol import LookupRequest

# --------------------------------------------------------------------------- timing constants

#: Every bounded-return test uses this short deadline...
SHORT_DEADLINE_MS = 200
#: ...and asserts ``elapsed <= deadline + TOLERANCE_S``: scheduling noise on 2 shared, noisy cores.
#: Stated once, here; DESIGN.md ("Deadline accounting") quotes the same 150 ms.
TOLERANCE_S = 0.15
#: How long a test waits for something that must happen promptly (a reply from a healthy server).
PROMPT_S = 2.0

# --------------------------------------------------------------------------- distinctive hashes

#: Every block-hash hex handed out by :func:`distinct_hashes`; the log guard looks for each of
#: them in every captured log record.
USED_HASH_HEX: set[str] = set()


def distinct_hashes(n: int, tag: str) -> list[bytes]:
    """``n`` 32-byte block hashes that look like upstream's (sha256 digests), unique per tag,
    and registered so that the log guard can prove none of them ever reaches a log line."""
    out = [hashlib.sha256(f"pdchaos-test/{tag}/{i}".encode()).digest() for i in range(n)]
    USED_HASH_HEX.update(h.hex() for h in out)
    return out


def hexes(hashes: Sequence[bytes]) -> list[str]:
    return [h.hex() for h in hashes]


# --------------------------------------------------------------------------- backends

class ControlledBackend(MemoryBackend):
    """The real MemoryBackend with switchable faults (mode: none | raise | hang | slow | bad_value).

    The real pool backends (Mooncake, memcache, yuanrong) cannot exist here; this is the embedded
    backend with fault injection, not a mock of anything the server does."""

    def __init__(self, block_size: int = 16, groups: int = 1):
        super().__init__(block_size=block_size, groups=groups)
        self.mode = "none"
        self.slow_s = 0.0
        self.bad_value: object = -1
        self.calls = 0
        self._release = threading.Event()

    def set(self, mode: str, slow_s: float = 0.0, bad_value: object = -1) -> None:
        self.mode, self.slow_s, self.bad_value = mode, slow_s, bad_value
        if mode == "hang":
            self._release.clear()
        else:
            self._release.set()

    def release(self) -> None:
        """Let every hung call return (teardown)."""
        self.mode = "none"
        self._release.set()

    def hit_tokens(self, request: LookupRequest) -> int:
        self.calls += 1
        mode = self.mode
        if mode == "raise":
            raise RuntimeError("injected backend failure")
        if mode == "hang":
            self._release.wait(30.0)
        elif mode == "slow":
            time.sleep(self.slow_s)
        elif mode == "bad_value":
            return self.bad_value  # type: ignore[return-value]
        return super().hit_tokens(request)

    def close(self) -> None:
        self.release()
        super().close()


# --------------------------------------------------------------------------- raw REP peer

@dataclass
class Act:
    """What a :class:`RawRepPeer` does with one request.

    ``reply``: the frames to send back; ``None`` means never answer (the REP socket then stays
    mid-exchange, so later requests queue unanswered). ``delay_s``: wait before answering.
    ``relay``: forward the request to this endpoint (a real, healthy LookupServer) and send back
    whatever it answers."""

    reply: list[bytes] | None = None
    delay_s: float = 0.0
    relay: str | None = None


class RawRepPeer:
    """A REP socket on its own thread that answers each request as ``respond(index, frames)``
    says. With ``silent=True`` it binds and never even reads. With ``bind_delay_s`` it binds only
    after that delay (a server that comes up late)."""

    def __init__(self, endpoint: str, respond: Callable[[int, list[bytes]], Act] | None = None, *,
                 silent: bool = False, bind_delay_s: float = 0.0):
        self.endpoint = endpoint
        self._respond = respond or (lambda i, f: Act(reply=None))
        self._silent = silent
        self._bind_delay_s = bind_delay_s
        self._ctx = zmq.Context()
        self._stop = threading.Event()
        self._bound = threading.Event()
        self._lock = threading.Lock()
        self.requests: list[list[bytes]] = []
        self.replied = 0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="raw-rep-peer", daemon=True)
        self._thread.start()
        if not bind_delay_s:
            if not self._bound.wait(PROMPT_S):
                raise RuntimeError(f"raw peer did not bind: {self._error!r}")

    def _run(self) -> None:
        sock = None
        relay_sock = None
        try:
            if self._bind_delay_s and self._stop.wait(self._bind_delay_s):
                return
            sock = self._ctx.socket(zmq.REP)
            sock.setsockopt(zmq.LINGER, 0)
            sock.bind(self.endpoint)
            self._bound.set()
            index = 0
            while not self._stop.is_set():
                if self._silent:  # bound, connected to, never reading
                    self._stop.wait(0.05)
                    continue
                if not sock.poll(20, zmq.POLLIN):
                    continue
                frames = sock.recv_multipart()
                with self._lock:
                    self.requests.append(frames)
                act = self._respond(index, frames)
                index += 1
                if act.delay_s and self._stop.wait(act.delay_s):
                    return
                reply = act.reply
                if act.relay is not None:
                    if relay_sock is None:
                        relay_sock = self._ctx.socket(zmq.REQ)
                        relay_sock.setsockopt(zmq.LINGER, 0)
                        relay_sock.connect(act.relay)
                    relay_sock.send_multipart(frames)
                    if not relay_sock.poll(int(PROMPT_S * 1000), zmq.POLLIN):
                        raise RuntimeError("relay: upstream did not answer")
                    reply = relay_sock.recv_multipart()
                if reply is None:  # never answer: stay mid-exchange until closed
                    self._stop.wait()
                    return
                sock.send_multipart(reply)
                with self._lock:
                    self.replied += 1
        except BaseException as exc:  # noqa: BLE001 - surfaced by close()
            self._error = exc
        finally:
            for s in (sock, relay_sock):
                if s is not None:
                    s.close(linger=0)

    @property
    def request_count(self) -> int:
        with self._lock:
            return len(self.requests)

    def wait_bound(self, timeout_s: float = PROMPT_S) -> bool:
        return self._bound.wait(timeout_s)

    def close(self) -> None:
        """Idempotent."""
        self._stop.set()
        self._thread.join(PROMPT_S)
        assert not self._thread.is_alive(), "raw peer thread did not stop"
        if not self._ctx.closed:
            self._ctx.term()
        if self._error is not None:
            raise AssertionError(f"raw peer failed: {self._error!r}")


def reply_always(frames: list[bytes], delay_s: float = 0.0) -> Callable[[int, list[bytes]], Act]:
    return lambda i, f: Act(reply=list(frames), delay_s=delay_s)


def first_then_relay(first: Act, upstream: str) -> Callable[[int, list[bytes]], Act]:
    """Answer the first request as ``first`` says; relay every later one to a real server."""
    return lambda i, f: first if i == 0 else Act(relay=upstream)


# --------------------------------------------------------------------------- raw senders

class RawDealer:
    """A DEALER that sends any frame list as one REP request (it adds the empty delimiter a REQ
    socket would add) and reads replies one at a time, so a test can see exactly how many replies
    one request produced."""

    def __init__(self, endpoint: str):
        self._ctx = zmq.Context()
        self.sock = self._ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def send(self, frames: Sequence[bytes]) -> None:
        self.sock.send_multipart([b"", *frames])

    def send_envelope_only(self) -> None:
        """A message with the delimiter and no body: libzmq's REP discards it as malformed."""
        self.sock.send_multipart([b""])

    def recv(self, timeout_s: float = PROMPT_S) -> list[bytes] | None:
        """One reply's frames (delimiter stripped), or None if nothing came within timeout_s."""
        if not self.sock.poll(int(timeout_s * 1000), zmq.POLLIN):
            return None
        msg = self.sock.recv_multipart()
        assert msg and msg[0] == b"", f"reply without the empty delimiter: {len(msg)} frames"
        return msg[1:]

    def request(self, frames: Sequence[bytes], timeout_s: float = PROMPT_S) -> list[bytes] | None:
        self.send(frames)
        return self.recv(timeout_s)

    def close(self) -> None:
        self.sock.close(linger=0)
        self._ctx.term()


def req_exchange(endpoint: str, frames: Sequence[bytes], timeout_s: float = PROMPT_S) -> list[bytes] | None:
    """Send one frame list from a fresh REQ socket; the reply frames or None on timeout."""
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(endpoint)
            sock.send_multipart(list(frames))
            if not sock.poll(int(timeout_s * 1000), zmq.POLLIN):
                return None
            return sock.recv_multipart()
        finally:
            sock.close(linger=0)
    finally:
        ctx.term()


# --------------------------------------------------------------------------- resources

def _open_fds() -> dict[int, str]:
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:  # the fd listdir used is closed by now: readlink fails on it, so it drops out
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass
    return out


@dataclass(frozen=True)
class Resources:
    threads: int  # OS threads of this process (zmq I/O and reaper threads included)
    fds: dict  # open file descriptor -> what it points at

    @staticmethod
    def now() -> "Resources":
        return Resources(len(os.listdir("/proc/self/task")), _open_fds())

    def leaked_since(self, baseline: "Resources") -> str:
        """'' when nothing is left over compared with ``baseline``, else what is."""
        extra_fds = {fd: t for fd, t in self.fds.items() if baseline.fds.get(fd) != t}
        problems = []
        if self.threads > baseline.threads:
            problems.append(f"{self.threads - baseline.threads} extra thread(s)")
        if extra_fds:
            problems.append(f"extra fds {extra_fds}")
        return "; ".join(problems)


def wait_resources_back(baseline: Resources, timeout_s: float = 3.0) -> Resources:
    """Poll until threads and open fds are back to ``baseline`` (abandoned daemon threads exit
    asynchronously); returns the last snapshot for the caller to compare."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = Resources.now()
        if not now.leaked_since(baseline) or time.monotonic() >= deadline:
            return now
        time.sleep(0.02)


def counter_delta(before: dict, after: dict) -> dict:
    """The counters that changed between two snapshots, and by how much."""
    return {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}


# --------------------------------------------------------------------------- log checks

_LONG_HEX = re.compile(r"[0-9a-fA-F]{32,}")


def record_text(record: logging.LogRecord) -> str:
    """Everything a handler could print for this record: message, exception, stack."""
    text = record.getMessage()
    if record.exc_info:
        text += "\n" + "".join(traceback.format_exception(*record.exc_info))
    if record.exc_text:
        text += "\n" + record.exc_text
    if record.stack_info:
        text += "\n" + record.stack_info
    return text


def hash_leaks(records) -> list[str]:
    """The records that carry a block hash (any hash handed out by distinct_hashes, or any run of
    32+ hex digits) or raw frame bytes (a bytes repr)."""
    bad = []
    for r in records:
        text = record_text(r)
        low = text.lower()
        if (_LONG_HEX.search(text) or "\\x" in text or "b'" in text or 'b"' in text
                or any(h in low for h in USED_HASH_HEX)):
            bad.append(f"{r.name}: {text[:300]}")
    return bad
