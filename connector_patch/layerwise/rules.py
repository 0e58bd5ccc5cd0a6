"""The rules the hardened layerwise connector follows, as plain functions and one small class.

* :func:`classify`: what D's listener makes of one decoded message: a :class:`Message` it acts on,
  or the NACK code it replies with at once (it always replies: a sender is never left waiting).
* :class:`RecvDeadlines`: D's bound on waiting for a request's DONE/FAILED. A request that has
  heard neither by its deadline is failed by D itself (it then leaves WAITING_FOR_REMOTE_KVS through
  ``finished_recving``, its blocks reported as failed loads). A completion that arrives for a
  request D no longer waits for is ignored (never completes a request D already failed).
* :class:`Holds`: the blocks of a request D failed by itself (its deadline, a POST that may have
  reached the proxy) stay D's until P cannot write them any more: P's last word for the request
  (a late DONE from every sender, or FAILED), or the request's write-by time plus a grace. P never
  starts a write past the write-by time D sent it (:data:`WRITE_BY_KEY`, :func:`past_write_by`).
* :func:`post_failure`: whether D's metaserver POST failed, from its outcome.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

GET_META = b"get_meta_msg"
DONE = b"done_sending_msg"
FAILED = b"failed_sending_msg"

ACK = b"ACK"
NACK_MALFORMED = b"NACK_MALFORMED"  # not one payload frame, or not a decodable tuple
NACK_UNKNOWN = b"NACK_UNKNOWN_MSG"  # a tuple whose first item names no known message
NACK_FIELDS = b"NACK_BAD_FIELDS"  # a known message with missing or mistyped fields

NACKS = (NACK_MALFORMED, NACK_UNKNOWN, NACK_FIELDS)

# D's transfer params carry the wall-clock time (seconds since the epoch) after which P must not
# start a write into D's blocks: D's own deadline for the request. Hosts' clocks are assumed
# synchronised to well within D's grace (``layerwise_write_grace_s``).
WRITE_BY_KEY = "layerwise_write_by"


def past_write_by(write_by: Any, now: float) -> bool:
    """Whether P must not start a write for a request whose params said ``write_by`` (a number of
    seconds since the epoch; anything else, e.g. upstream's D that sends none: no limit)."""
    return isinstance(write_by, (int, float)) and not isinstance(write_by, bool) and now > float(write_by)


@dataclass(frozen=True)
class Message:
    kind: str  # "get_meta" | "done" | "failed"
    req_id: str = ""
    count: int = 0  # DONE/FAILED: how many senders the request expects (0: not said, upstream's FAILED)
    sender: str = ""  # DONE/FAILED: "host:port" of the sender


def _text(v: Any) -> str | None:
    if isinstance(v, bytes):
        try:
            return v.decode()
        except UnicodeDecodeError:
            return None
    return v if isinstance(v, str) else None


def classify(msg: Any) -> Message | bytes:
    """A decoded listener message -> the :class:`Message` to act on, or a NACK code."""
    if not isinstance(msg, (tuple, list)) or not msg:
        return NACK_MALFORMED
    head = msg[0]
    if isinstance(head, str):
        head = head.encode()
    if head == GET_META:
        return Message("get_meta", _text(msg[1]) or "" if len(msg) > 1 else "")
    if head not in (DONE, FAILED):
        return NACK_UNKNOWN if isinstance(head, bytes) else NACK_MALFORMED
    kind = "done" if head == DONE else "failed"
    if len(msg) < 2 or _text(msg[1]) is None:
        return NACK_FIELDS
    if kind == "failed":  # upstream's P sends (FAILED, id); the hardened P adds its count and sender
        if len(msg) >= 4 and isinstance(msg[2], int) and not isinstance(msg[2], bool) and msg[2] >= 1 \
                and _text(msg[3]) is not None:
            return Message(kind, _text(msg[1]) or "", int(msg[2]), _text(msg[3]) or "")
        return Message(kind, _text(msg[1]) or "")
    if len(msg) < 4 or isinstance(msg[2], bool) or not isinstance(msg[2], int) or msg[2] < 1 \
            or _text(msg[3]) is None:
        return NACK_FIELDS
    return Message(kind, _text(msg[1]) or "", int(msg[2]), _text(msg[3]) or "")


class RecvDeadlines:
    """Requests D waits for, each with a deadline; thread-safe.

    ``expect`` when the worker starts waiting; ``settle`` when DONE (from every sender) or FAILED
    arrived (False: D was not waiting for it: late, unknown or duplicate); ``expired`` takes the
    requests whose deadline passed (each once). Requests settled or expired are remembered for a
    while so a late completion is recognised as late."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic, remember: int = 4096):
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.timeout_s = float(timeout_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._due: dict[str, float] = {}
        self._gone: dict[str, None] = {}
        self._remember = remember

    def expect(self, req_id: str) -> None:
        with self._lock:
            self._gone.pop(req_id, None)
            self._due[req_id] = self._clock() + self.timeout_s

    def due(self, req_id: str) -> float | None:
        """When this request's deadline passes (None: D does not wait for it)."""
        with self._lock:
            return self._due.get(req_id)

    def waiting(self, req_id: str) -> bool:
        with self._lock:
            return req_id in self._due

    def settle(self, req_id: str) -> bool:
        with self._lock:
            if self._due.pop(req_id, None) is None:
                return False
            self._forget(req_id)
            return True

    def expired(self) -> list[str]:
        now = self._clock()
        with self._lock:
            out = [r for r, due in self._due.items() if due <= now]
            for r in out:
                del self._due[r]
                self._forget(r)
            return out

    def gone(self, req_id: str) -> bool:
        """Whether D settled or expired this request recently (a completion for it is late)."""
        with self._lock:
            return req_id in self._gone

    def pending(self) -> int:
        with self._lock:
            return len(self._due)

    def _forget(self, req_id: str) -> None:
        self._gone[req_id] = None
        while len(self._gone) > self._remember:
            self._gone.pop(next(iter(self._gone)))


class Holds:
    """Requests D failed by itself whose blocks stay D's until P cannot write them; thread-safe.

    ``hold(req, due)`` when D fails a request P may still write (its deadline passed, or a POST
    that may have reached the proxy); ``due`` is D's deadline for it (the write-by time D sent P,
    on D's clock): the hold ends at ``due + grace`` at the latest. ``word(req, count)`` when P's
    last word for it arrives late: FAILED (``count`` None), or DONE from ``count`` distinct senders
    (the hold ends once all of them said it): P writes nothing after it. ``take_released`` takes the
    requests whose hold ended (each once)."""

    def __init__(self, grace_s: float, clock: Callable[[], float] = time.monotonic):
        if grace_s <= 0:
            raise ValueError("grace_s must be positive")
        self.grace_s = float(grace_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._until: dict[str, float] = {}
        self._words: dict[str, set[str]] = {}
        self._released: list[str] = []
        self.counters = {"held": 0, "released_by_word": 0, "released_by_time": 0}

    def hold(self, req_id: str, due: float | None) -> None:
        now = self._clock()
        with self._lock:
            self._until[req_id] = max(now, due if due is not None else now) + self.grace_s
            self._words.pop(req_id, None)
            self.counters["held"] += 1

    def word(self, req_id: str, count: int | None, sender: str = "") -> bool:
        """P's late DONE from ``sender``, one of ``count`` senders, or FAILED (``count`` None);
        True: it ended a hold."""
        with self._lock:
            if req_id not in self._until:
                return False
            senders = self._words.setdefault(req_id, set())
            senders.add(sender)
            if count is not None and len(senders) < count:
                return False
            del self._until[req_id]
            self._words.pop(req_id, None)
            self._released.append(req_id)
            self.counters["released_by_word"] += 1
            return True

    def take_released(self) -> list[str]:
        now = self._clock()
        with self._lock:
            out, self._released = self._released, []
            for r in [r for r, t in self._until.items() if t <= now]:
                del self._until[r]
                self._words.pop(r, None)
                out.append(r)
                self.counters["released_by_time"] += 1
            return out

    def held(self) -> int:
        with self._lock:
            return len(self._until)

    def holding(self, req_id: str) -> bool:
        with self._lock:
            return req_id in self._until


def post_failure(status: int | None, error: str | None) -> str | None:
    """Why a metaserver POST failed (None: it succeeded): an exception, or a non-2xx answer."""
    if error:
        return error
    if status is None:
        return "no answer"
    if not 200 <= int(status) < 300:
        return f"http {int(status)}"
    return None
