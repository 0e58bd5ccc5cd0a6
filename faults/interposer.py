"""Node ``interposer``: a ZMQ man-in-the-middle between a REQ client and a REP server.

A TCP proxy cannot sit in an ipc link, and it sees bytes, not messages. The interposer sits at
the ZMQ message level, on ipc or tcp::

    client REQ --> [ROUTER --listen]  interposer  [one DEALER per client --> --upstream] --> REP server

The ROUTER receives ``[identity, envelope..., b"", body...]`` from each client; the envelope
(everything after the identity up to and including the empty delimiter) is passed on unchanged
on that client's own DEALER, so the REP server sees exactly what the client sent, and its reply
comes back on the same DEALER and is routed to the same identity. One DEALER per client means a
delayed or dropped message of one client never holds up another.

A client rebuilds its REQ socket after every failure, so identities come and go. When a client's
connection closes, its DEALER is closed too (once nothing of it is still scheduled), so the
server sees the disconnect as it would without the interposer and its open connections (fds)
return to their baseline: the connection is recognised by the ``ZMQ_SRCFD`` of the client's
messages and checked through ``/proc/self/fd`` every 200 ms (ZMQ_ROUTER_NOTIFY, the direct way,
is a draft API the installed libzmq lacks). Where that cannot be known, DEALERs with no traffic
for ``--idle-timeout-ms`` and nothing scheduled are closed. At most ``--max-clients`` are kept
(least recently used first out).

Rules act on the body frames (the part after the delimiter). Each rule::

    {"direction": "request" | "reply" | "both",
     "action": "delay" | "drop" | "duplicate" | "truncate" | "rewrite",
     "match": {"every": true} | {"nth": N} | {"every_nth": N} | {"probability": P},
     "seed": S,                        # probability: the rule's own random.Random(S)
     "delay": "300ms",                 # action delay
     "gap": "50ms",                    # action duplicate: the copy follows the original after gap
     "truncate_bytes": K, "truncate_frame": -1,   # action truncate: keep K bytes of that frame
     "rewrite": {"frame": 0, "bytes_hex": "00ff"} | {"named": "version2"}}   # action rewrite

``nth`` counts the messages the rule sees (in its direction; "both" counts both) from 1 and
matches only the Nth; ``every_nth`` matches N, 2N, ...; ``probability`` draws once per message
the rule sees. Rules apply in order: ``drop`` ends the list, ``delay`` adds up, ``duplicate``
adds one copy, ``truncate`` and ``rewrite`` change the frames the next rules see.

The interposer knows no protocol itself. Named rewrites (replies only) come from a **codec**,
a module given with ``--codec MODULE`` and imported at start, which provides

* ``NAMED_REWRITES``: ``{name: rewrite(reply_body, info) -> new reply_body}``;
* optionally ``request_info(request_body) -> info``: what a rewrite needs to know of the request
  the reply answers (kept per client, from its last request; None without it).

The lookup family's codec is ``families.lookup.wire`` (its broken replies, plus
``legacy4``, today's upstream raw 4-byte reply with the same hit; ``info`` is the request's
token_len). A rule naming a rewrite the codec does not have, or any named rewrite when no codec
was given, is refused when it is set (``--rules``, ``set_rules``, ``add_rule``) with the name and
the known ones in the error.

Rules are set at start (``--rules JSON`` or ``--rules @file.json``; a list, or ``{"rules": [...]}``)
and at run time on the control channel: ``set_rules {rules: [...]}`` (replaces all, resets each
rule's counter and random generator), ``clear_rules``, ``add_rule {id, rule}`` / ``remove_rule
{id}`` (one rule among others: overlapping faults each own theirs), ``reset_stats`` and ``stats`` (per
direction: seen, forwarded, dropped, delayed, duplicated, truncated, rewritten; plus unroutable,
send_failed, clients, clients_gone, clients_evicted, and each rule's ``seen`` and ``matched``).

Bounded: every socket send is non-blocking (a full queue or a vanished client is counted, never
waited on), the loop wakes at least every 50 ms, SIGTERM/SIGINT stop it and it exits 0 with its
sockets closed and its ipc file removed. Logs carry counts only, never frames.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import logging
import math
import os
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

import zmq
from pydantic import Field, ValidationError, field_validator, model_validator

from .base import Duration, FaultParams
from nodekit.nodeio import NodeApp, NodeUsageError, run_node as run_node_process, split_envelope, unlink_ipc

logger = logging.getLogger("faults.interposer")

IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]*$"

DIRECTIONS = ("request", "reply")
STAT_KEYS = ("seen", "forwarded", "dropped", "delayed", "duplicated", "truncated", "rewritten")

_POLL_MS = 50
_MAX_HEX = 1 << 17  # 64 KiB of replacement bytes: far more than a rewrite needs


# --------------------------------------------------------------------------- rules


def _fmt_duration(seconds: float) -> str:
    return f"{round(seconds * 1e6) / 1e3}ms"


class Match(FaultParams):
    """Which messages a rule acts on: exactly one of the four keys."""

    every: Literal[True] | None = Field(None, description="every message")
    nth: int | None = Field(None, ge=1, le=1_000_000_000, description="only the Nth message (from 1)")
    every_nth: int | None = Field(None, ge=1, le=1_000_000_000, description="messages N, 2N, 3N, ...")
    probability: float | None = Field(None, ge=0.0, le=1.0, description="each message with probability P")

    @model_validator(mode="after")
    def _exactly_one(self) -> "Match":
        given = [k for k in ("every", "nth", "every_nth", "probability") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of every, nth, every_nth, probability"
                             + (f" (got {', '.join(given)})" if given else ""))
        return self


class Rewrite(FaultParams):
    """Replace one body frame by ``bytes_hex``, or the whole reply by a ``named`` broken reply."""

    frame: int = Field(0, ge=-16, le=15, description="body frame index (negative counts from the end)")
    bytes_hex: str | None = Field(None, max_length=_MAX_HEX, description="the new frame, as hex")
    named: str | None = Field(None, pattern=IDENTIFIER, max_length=64,
                              description="a named rewrite of the interposer's codec (replies only)")

    @field_validator("bytes_hex")
    @classmethod
    def _hex(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                bytes.fromhex(v)
            except ValueError:
                raise ValueError("expected an even number of hex digits") from None
        return v

    @model_validator(mode="after")
    def _one(self) -> "Rewrite":
        if (self.bytes_hex is None) == (self.named is None):
            raise ValueError("give exactly one of bytes_hex, named")
        if self.named is not None and self.frame != 0:
            raise ValueError("frame: not used with a named rewrite (it replaces the whole reply)")
        return self


_ACTION_FIELDS = {"delay": ("delay",), "duplicate": ("gap",), "truncate": ("truncate_bytes", "truncate_frame"),
                  "rewrite": ("rewrite",), "drop": ()}
_ALL_ACTION_FIELDS = {f for fs in _ACTION_FIELDS.values() for f in fs}


class Rule(FaultParams):
    """One interposer rule (see the module docstring)."""

    direction: Literal["request", "reply", "both"] = Field(description="which messages")
    action: Literal["delay", "drop", "duplicate", "truncate", "rewrite"] = Field(description="what to do")
    match: Match = Field(default_factory=lambda: Match(every=True), description="which of them (default every)")
    seed: int | None = Field(None, ge=0, le=2**63 - 1, description="probability: seed of the rule's random draws")
    delay: Duration = Field(0.0, description='action delay: how long, e.g. "300ms"')
    gap: Duration = Field(0.0, description='action duplicate: the copy is sent this long after the original')
    truncate_bytes: int | None = Field(None, ge=0, le=1 << 20, description="action truncate: bytes kept")
    truncate_frame: int = Field(-1, ge=-16, le=15, description="action truncate: body frame index (default last)")
    rewrite: Rewrite | None = Field(None, description="action rewrite: what to write")

    @model_validator(mode="after")
    def _consistent(self) -> "Rule":
        # Judged on values, not on which keys were given: a full dump of a rule (every default
        # spelled out, as the runner's journal and model_construct produce) must stay valid.
        own = _ACTION_FIELDS[self.action]
        for name in sorted(_ALL_ACTION_FIELDS - set(own)):
            if getattr(self, name) != Rule.model_fields[name].default:
                users = [a for a, fs in _ACTION_FIELDS.items() if name in fs]
                raise ValueError(f"{name}: only used with action {users[0]!r}, not {self.action!r}")
        if self.action == "delay" and not self.delay > 0:
            raise ValueError('action delay needs delay > 0, e.g. delay: "300ms"')
        if self.action == "truncate" and self.truncate_bytes is None:
            raise ValueError("action truncate needs truncate_bytes")
        if self.action == "rewrite":
            if self.rewrite is None:
                raise ValueError("action rewrite needs rewrite: {frame, bytes_hex} or {named}")
            if self.rewrite.named is not None and self.direction != "reply":
                raise ValueError(f"rewrite.named: only for direction 'reply', not {self.direction!r}")
        if self.seed is not None and self.match.probability is None:
            raise ValueError("seed: only used with match.probability")
        return self

    def rule_fields(self) -> dict:
        """This rule in wire form: only the fields that differ from their defaults, durations as
        strings ("300.0ms"), and nothing a subclass adds (the scenario schema adds type/at/for)."""
        dumped = self.model_dump(mode="json", exclude_defaults=True)
        out = {name: dumped[name] for name in Rule.model_fields if name in dumped}
        for name in ("delay", "gap"):
            if name in out:
                out[name] = _fmt_duration(getattr(self, name))
        return out


def parse_rules(value: Any, where: str = "rules") -> list[Rule]:
    """A list of rule dicts -> Rules; ValueError naming the rule and field on bad input."""
    if isinstance(value, dict) and set(value) == {"rules"}:
        value = value["rules"]
    if not isinstance(value, list):
        raise ValueError(f"{where}: expected a list of rules")
    rules = []
    for i, item in enumerate(value):
        try:
            rules.append(Rule.model_validate(item))
        except ValidationError as exc:
            raise ValueError(f"{where}[{i}]: {format_validation_error(exc)}") from None
    return rules


def format_validation_error(exc: ValidationError) -> str:
    """The first error of a pydantic ValidationError as "loc: message" (plus how many more)."""
    errors = exc.errors()
    first = errors[0]
    loc = ".".join(str(p) for p in first["loc"] if not str(p).startswith("function-"))
    msg = first["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if first["type"] == "extra_forbidden":
        msg = "unknown field"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{loc + ': ' if loc else ''}{msg}{more}"


# --------------------------------------------------------------------------- codec


Rewriter = Callable[[list[bytes], Any], list[bytes]]


@dataclass(frozen=True)
class Codec:
    """The protocol knowledge the named rewrites need (see the module docstring)."""

    module: str | None = None
    named_rewrites: Mapping[str, Rewriter] = field(default_factory=dict)
    request_info: Callable[[list[bytes]], Any] | None = None

    def check(self, rule: "Rule") -> None:
        """ValueError when ``rule`` names a rewrite this codec does not have."""
        name = rule.rewrite.named if rule.rewrite is not None else None
        if name is None or name in self.named_rewrites:
            return
        if self.module is None:
            raise ValueError(f"rewrite.named: {name!r} needs a codec; this interposer was started "
                             "without --codec MODULE")
        raise ValueError(f"rewrite.named: unknown named rewrite {name!r} (codec {self.module} knows: "
                         f"{', '.join(self.named_rewrites) or 'none'})")


NO_CODEC = Codec()


def load_codec(module: str) -> Codec:
    """Import ``module`` and read its NAMED_REWRITES (and request_info, if any); NodeUsageError
    naming what is wrong otherwise."""
    import importlib

    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise NodeUsageError(f"--codec: cannot import {module!r}: {exc}") from None
    named = getattr(mod, "NAMED_REWRITES", None)
    if not isinstance(named, Mapping) or not all(isinstance(k, str) and callable(v) for k, v in named.items()):
        raise NodeUsageError(f"--codec: {module} has no NAMED_REWRITES (a dict of name -> callable)")
    info = getattr(mod, "request_info", None)
    if info is not None and not callable(info):
        raise NodeUsageError(f"--codec: {module}.request_info is not callable")
    return Codec(module, dict(named), info)


# --------------------------------------------------------------------------- the rule engine


@dataclass
class _RuleState:
    rid: str
    rule: Rule
    rng: random.Random
    seen: int = 0
    matched: int = 0

    def matches(self) -> bool:
        self.seen += 1
        m = self.rule.match
        if m.every:
            return True
        if m.nth is not None:
            return self.seen == m.nth
        if m.every_nth is not None:
            return self.seen % m.every_nth == 0
        return self.rng.random() < (m.probability or 0.0)


@dataclass
class Decision:
    """What to send for one message: (delay_s, body) per copy; empty = dropped."""

    sends: list[tuple[float, list[bytes]]] = field(default_factory=list)


class RuleEngine:
    """Pure message-level logic, thread-safe; no sockets here. Named rewrites come from ``codec``:
    rules naming one it does not have are refused (ValueError) by set_rules and add_rule."""

    def __init__(self, rules: Sequence[Rule] = (), codec: Codec = NO_CODEC):
        self._lock = threading.Lock()
        self._states: list[_RuleState] = []
        self.codec = codec
        self.stats: dict[str, dict[str, int]] = {}
        self.reset_stats()
        self.set_rules(rules)

    @staticmethod
    def _state(rid: str, rule: Rule) -> _RuleState:
        return _RuleState(rid, rule, random.Random(rule.seed if rule.seed is not None else 0))

    def set_rules(self, rules: Sequence[Rule]) -> None:
        """Replace every rule (ids "0", "1", ...); counters and random draws start afresh.
        ValueError ("rules[i]: ...") if one names an unknown rewrite: then nothing changes."""
        for i, rule in enumerate(rules):
            try:
                self.codec.check(rule)
            except ValueError as exc:
                raise ValueError(f"rules[{i}]: {exc}") from None
        states = [self._state(str(i), r) for i, r in enumerate(rules)]
        with self._lock:
            self._states = states

    def add_rule(self, rid: str, rule: Rule) -> None:
        """Append a rule under ``rid`` (replacing one with the same id, in place). ValueError if it
        names an unknown rewrite."""
        self.codec.check(rule)
        st = self._state(rid, rule)
        with self._lock:
            for i, old in enumerate(self._states):
                if old.rid == rid:
                    self._states = [*self._states[:i], st, *self._states[i + 1:]]
                    return
            self._states = [*self._states, st]

    def remove_rule(self, rid: str) -> bool:
        with self._lock:
            kept = [s for s in self._states if s.rid != rid]
            removed = len(kept) != len(self._states)
            self._states = kept
        return removed

    def reset_stats(self) -> None:
        with self._lock:
            self.stats = {d: {k: 0 for k in STAT_KEYS} for d in DIRECTIONS}
            for st in getattr(self, "_states", []):
                st.matched = 0

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "request": dict(self.stats["request"]),
                "reply": dict(self.stats["reply"]),
                "rules": [{"id": s.rid, "direction": s.rule.direction, "action": s.rule.action, "seen": s.seen,
                           "matched": s.matched} for s in self._states],
            }

    def apply(self, direction: str, body: list[bytes], info: Any = None) -> Decision:
        """``info``: the codec's request_info of the request a reply answers (for named rewrites)."""
        with self._lock:
            st = self.stats[direction]
            st["seen"] += 1
            delay = 0.0
            gaps: list[float] = []
            touched: set[str] = set()
            for rs in self._states:
                rule = rs.rule
                if rule.direction not in (direction, "both") or not rs.matches():
                    continue
                rs.matched += 1
                if rule.action == "drop":
                    st["dropped"] += 1
                    return Decision([])
                if rule.action == "delay":
                    delay += rule.delay
                    touched.add("delayed")
                elif rule.action == "duplicate":
                    gaps.append(rule.gap)
                elif rule.action == "truncate":
                    i = rule.truncate_frame
                    if -len(body) <= i < len(body):
                        body = list(body)
                        body[i] = body[i][: rule.truncate_bytes]
                        touched.add("truncated")
                elif rule.action == "rewrite":
                    rw = rule.rewrite
                    assert rw is not None
                    if rw.named is not None:
                        body = self.codec.named_rewrites[rw.named](list(body), info)
                        touched.add("rewritten")
                    elif -len(body) <= rw.frame < len(body):
                        body = list(body)
                        body[rw.frame] = bytes.fromhex(rw.bytes_hex or "")
                        touched.add("rewritten")
            for key in touched:
                st[key] += 1
            st["forwarded"] += 1
            st["duplicated"] += len(gaps)
            return Decision([(delay, body)] + [(delay + g, body) for g in gaps])


# --------------------------------------------------------------------------- the interposer


@dataclass
class _Client:
    ident: bytes
    dealer: zmq.Socket
    last_active: float
    info: Any = None  # the codec's request_info of this client's last request
    scheduled: int = 0  # timers still holding a message of this client
    fd: int = -1  # the ROUTER-side connection this client's messages came in on
    conn: str | None = None  # readlink of that fd ("socket:[inode]"), to notice when it closes


def _conn_id(fd: int) -> str | None:
    """Identity of an open socket fd of this process (Linux /proc), None when closed or unknown."""
    if fd < 0:
        return None
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


class Interposer(NodeApp):
    def __init__(self, listen: str, upstream: str, rules: Sequence[Rule] = (), *,
                 idle_timeout_s: float = 10.0, max_clients: int = 256, codec: Codec = NO_CODEC):
        self.listen = listen
        self.upstream = upstream
        self.engine = RuleEngine(rules, codec)
        self.idle_timeout_s = idle_timeout_s
        self.max_clients = max_clients
        self._ctx = zmq.Context()
        self._ctx.set(zmq.MAX_SOCKETS, max(1024, max_clients + 64))
        self._front: zmq.Socket | None = None
        self._poller = zmq.Poller()
        self._clients: dict[bytes, _Client] = {}
        self._by_sock: dict[zmq.Socket, _Client] = {}
        self._timers: list = []  # (due, seq, "request"|"reply", ident, frames)
        self._seq = itertools.count()
        self._lock = threading.Lock()  # guards the counters below (read by the control thread)
        self.unroutable = self.send_failed = self.evicted = self.gone = 0

    # ------------------------------------------------------------------ control
    def stats(self) -> dict:
        snap = self.engine.snapshot()
        with self._lock:
            snap.update({"unroutable": self.unroutable, "send_failed": self.send_failed,
                         "clients": len(self._clients), "clients_evicted": self.evicted,
                         "clients_gone": self.gone,
                         "scheduled": len(self._timers)})
        snap["counters"] = {f"{d}_{k}": v for d in DIRECTIONS for k, v in snap[d].items()}
        return snap

    def handlers(self) -> dict:
        def set_rules(msg: dict) -> dict:
            rules = parse_rules(msg.get("rules"), "rules")
            self.engine.set_rules(rules)
            logger.info("interposer: %d rule(s) set", len(rules))
            return {"rules": len(rules)}

        def clear_rules(msg: dict) -> dict:  # noqa: ARG001
            self.engine.set_rules([])
            logger.info("interposer: rules cleared")
            return {"rules": 0}

        def add_rule(msg: dict) -> dict:
            rid = msg.get("id")
            if not isinstance(rid, str) or not rid:
                raise ValueError("id: expected a non-empty string")
            try:
                rule = Rule.model_validate(msg.get("rule"))
                self.engine.add_rule(rid, rule)
            except ValidationError as exc:
                raise ValueError(f"rule: {format_validation_error(exc)}") from None
            except ValueError as exc:  # a named rewrite the codec does not have
                raise ValueError(f"rule: {exc}") from None
            logger.info("interposer: rule added")
            return {"rules": len(self.engine.snapshot()["rules"])}

        def remove_rule(msg: dict) -> dict:
            removed = self.engine.remove_rule(str(msg.get("id")))
            return {"removed": removed, "rules": len(self.engine.snapshot()["rules"])}

        def reset_stats(msg: dict) -> dict:  # noqa: ARG001
            self.engine.reset_stats()
            with self._lock:
                self.unroutable = self.send_failed = self.evicted = self.gone = 0
            return {}

        return {"set_rules": set_rules, "clear_rules": clear_rules, "add_rule": add_rule,
                "remove_rule": remove_rule, "reset_stats": reset_stats}

    # ------------------------------------------------------------------ sockets
    def bind(self) -> None:
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a vanished client is counted, not silently dropped
        try:
            sock.bind(self.listen)
        except zmq.ZMQError:
            sock.close(linger=0)
            raise
        self._front = sock
        self._poller.register(sock, zmq.POLLIN)

    def _client(self, ident: bytes, now: float) -> _Client:
        c = self._clients.get(ident)
        if c is None:
            if len(self._clients) >= self.max_clients:
                self._evict(now, force_one=True)
            dealer = self._ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(self.upstream)
            c = _Client(ident, dealer, now)
            self._clients[ident] = c
            self._by_sock[dealer] = c
            self._poller.register(dealer, zmq.POLLIN)
        c.last_active = now
        return c

    def _drop_client(self, c: _Client, gone: bool = False) -> None:
        self._poller.unregister(c.dealer)
        self._by_sock.pop(c.dealer, None)
        self._clients.pop(c.ident, None)
        c.dealer.close(linger=0)
        with self._lock:
            if gone:
                self.gone += 1
            else:
                self.evicted += 1

    def _evict(self, now: float, force_one: bool = False) -> None:
        idle = [c for c in self._clients.values() if c.scheduled == 0]
        for c in idle:
            if c.conn is not None and now - c.last_active > 0.1 and _conn_id(c.fd) != c.conn:
                self._drop_client(c, gone=True)  # the client closed its socket: so do we, upstream
            elif now - c.last_active > self.idle_timeout_s:
                self._drop_client(c)
        if force_one and len(self._clients) >= self.max_clients:
            candidates = [c for c in self._clients.values() if c.scheduled == 0] or list(self._clients.values())
            self._drop_client(min(candidates, key=lambda c: c.last_active))

    def _send(self, sock: zmq.Socket, frames: list[bytes]) -> None:
        try:
            sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=True)
        except zmq.Again:
            with self._lock:
                self.send_failed += 1
        except zmq.ZMQError as exc:
            with self._lock:
                if exc.errno == zmq.EHOSTUNREACH:
                    self.unroutable += 1
                else:
                    self.send_failed += 1

    def _dispatch(self, direction: str, ident: bytes, frames: list[bytes]) -> None:
        """Send one (possibly delayed) message: requests on the client's DEALER, replies on the ROUTER."""
        if direction == "request":
            c = self._clients.get(ident)
            if c is None:  # evicted under max_clients pressure while a timer held its message
                with self._lock:
                    self.send_failed += 1
                return
            self._send(c.dealer, frames)
        else:
            assert self._front is not None
            self._send(self._front, [ident, *frames])

    def _handle(self, direction: str, c: _Client, rest: list[bytes], now: float) -> None:
        split = split_envelope(rest)
        envelope, body = split if split is not None else ([], list(rest))
        request_info = self.engine.codec.request_info
        if direction == "request" and request_info is not None:
            try:
                c.info = request_info(body)
            except Exception:  # a codec that cannot read a message must not stop the interposer
                c.info = None
        decision = self.engine.apply(direction, body, c.info)
        for delay, out in decision.sends:
            frames = [*envelope, *out]
            if delay <= 0:
                self._dispatch(direction, c.ident, frames)
            else:
                c.scheduled += 1
                heapq.heappush(self._timers, (now + delay, next(self._seq), direction, c.ident, frames))

    def _fire_timers(self, now: float) -> None:
        while self._timers and self._timers[0][0] <= now:
            _, _, direction, ident, frames = heapq.heappop(self._timers)
            c = self._clients.get(ident)
            if c is not None:
                c.scheduled -= 1
                c.last_active = now
            self._dispatch(direction, ident, frames)

    def serve(self, stop: threading.Event) -> None:
        assert self._front is not None, "bind() first"
        front = self._front
        last_evict = time.monotonic()
        while not stop.is_set():
            now = time.monotonic()
            timeout_ms = _POLL_MS
            if self._timers:
                timeout_ms = max(0, min(_POLL_MS, math.ceil((self._timers[0][0] - now) * 1000)))
            events = dict(self._poller.poll(timeout_ms))
            for sock in events:
                if sock is not front and sock not in self._by_sock:
                    continue  # evicted in this round (max_clients pressure)
                for _ in range(256):  # drain, bounded, so timers and other sockets get their turn
                    try:
                        if sock is front:
                            raw = sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
                            fd = raw[0].get(zmq.SRCFD)
                            frames = [f.bytes for f in raw]
                        else:
                            frames = sock.recv_multipart(flags=zmq.NOBLOCK, copy=True)
                    except zmq.Again:
                        break
                    now = time.monotonic()
                    if sock is front:
                        if len(frames) < 2:
                            continue
                        c = self._client(frames[0], now)
                        if c.fd != fd:
                            c.fd, c.conn = fd, _conn_id(fd)
                        self._handle("request", c, frames[1:], now)
                    else:
                        c = self._by_sock.get(sock)
                        if c is None:
                            break
                        c.last_active = now
                        self._handle("reply", c, frames, now)
            now = time.monotonic()
            self._fire_timers(now)
            if now - last_evict > min(0.2, self.idle_timeout_s / 2):
                self._evict(now)
                last_evict = now

    def close(self) -> None:
        for c in list(self._clients.values()):
            c.dealer.close(linger=0)
        self._clients.clear()
        self._by_sock.clear()
        if self._front is not None:
            self._front.close(linger=0)
            self._front = None
        self._ctx.term()
        unlink_ipc(self.listen)

    def ready_message(self) -> str:
        return f"interposer ready: {len(self.engine.snapshot()['rules'])} rule(s)"

    def stop_message(self) -> str:
        s = self.stats()
        return f"interposer stopping: requests={s['request']['seen']} replies={s['reply']['seen']}"


# --------------------------------------------------------------------------- node


def add_node_arguments(p: argparse.ArgumentParser, kind: str) -> None:  # noqa: ARG001
    p.add_argument("--listen", required=True, help="endpoint the client connects to (bound here)")
    p.add_argument("--upstream", required=True, help="endpoint of the real server")
    p.add_argument("--rules", help='initial rules: JSON (a list, or {"rules": [...]}) or @FILE')
    p.add_argument("--codec", help="module providing the named rewrites (NAMED_REWRITES, request_info), "
                                   "as a dotted module path (a family's wire module)")
    p.add_argument("--control", help="ipc endpoint of the harness control channel")
    p.add_argument("--idle-timeout-ms", type=int, default=10_000,
                   help="close a client's upstream socket after this much silence (default 10000)")
    p.add_argument("--max-clients", type=int, default=256, help="upstream sockets kept at most (default 256)")
    p.add_argument("--log-level", default="INFO")


def _load_rules(text: str, codec: Codec) -> list[Rule]:
    where = "--rules"
    if text.startswith("@"):
        path = text[1:]
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise NodeUsageError(f"--rules: cannot read {path!r}: {exc.strerror or exc}") from None
        where = f"--rules {path}"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NodeUsageError(f"{where}: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    try:
        rules = parse_rules(value, "rules")
        RuleEngine(rules, codec)  # a named rewrite the codec does not have is refused here
    except ValueError as exc:
        raise NodeUsageError(f"{where}: {exc}") from None
    return rules


def run_node(args: argparse.Namespace) -> int:
    def build() -> Interposer:
        if args.listen == args.upstream:
            raise NodeUsageError("--listen and --upstream must differ")
        if args.idle_timeout_ms <= 0:
            raise NodeUsageError("--idle-timeout-ms: must be a positive integer")
        if not 1 <= args.max_clients <= 4096:
            raise NodeUsageError("--max-clients: must be in [1, 4096]")
        codec = load_codec(args.codec) if args.codec else NO_CODEC
        rules = _load_rules(args.rules, codec) if args.rules else []
        return Interposer(args.listen, args.upstream, rules, idle_timeout_s=args.idle_timeout_ms / 1000.0,
                          max_clients=args.max_clients, codec=codec)

    return run_node_process(build, endpoints={"--listen": args.listen, "--upstream": args.upstream},
                            bind_flag="--listen", control=args.control, log_level=args.log_level)
