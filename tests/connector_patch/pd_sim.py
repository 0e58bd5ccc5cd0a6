"""A simulated world for the hardened Mooncake connector's REAL worker code
(``connector_patch/pd/vllm_connector.py``, byte for byte): a virtual clock, an asyncio loop that
runs on it, ZMQ-like sockets over a simulated network, and stand-ins for the parts of vLLM's
``MooncakeConnectorWorker`` the hardened worker calls through ``super()``.

Why stand-ins: the harness env has no vLLM (it lives in the P/D node env, whose import alone takes
17-65 s here, and has no Hypothesis). So the module is loaded a second time, privately, with a
small stand-in ``vllm`` package in ``sys.modules`` for the duration of the import (nothing else
sees it) and its ``time``, ``zmq`` and ``msgspec`` globals pointed at this world. Every line of the
hardened worker and of its rules (``pull.py``, ``settle.py``, ``ledger.py``, ``terminal.py``) runs
as shipped; what upstream does under it (its ``send_kv_to_decode`` skeleton: wait for P's prefill
up to the abort timeout, mark ``sending``, build the transfer, write, answer; ``record_send_reqs``,
``fetch_finished_sending_reqs``, the bootstrap query) is modelled here from upstream's code (vLLM
0.32.0) and says so. vLLM's own code with the hardened connector runs in
tests/connector_patch/test_pd_hardened_inproc.py.

The network (facts measured with pyzmq and written in pull.py): a pull's DEALER connects (CONNECTED)
or is refused (CONNECT_RETRIED, again every 0.1 s) or hangs (blackhole: no event); a connection
lost emits DISCONNECTED then one RETRIED at once (the scheduled reconnect); queued messages go on
the first connection, a dropped connection loses what was on it; within a connection messages keep
their order; across connections (each cancel round is a new DEALER) they do not. P's side channel
(ROUTER) learns a connection is gone from a FIN at once, from a reset on its next keepalive probe
(``P_DETECT_S`` = 1 s: KEEPALIVE_IDLE_S), and under a blackhole only after the probes run out.
D's pull learns it from a reset at once and from a blackhole after its heartbeat timeout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import itertools
import pickle
import queue
import selectors
import struct
import sys
import threading
import types
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path

import msgpack
import zmq

REPO = Path(__file__).resolve().parents[2]
ABORT_S = 3.0  # P's abort timeout (VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT) in the model
MARGIN_S = 1.0  # the module's BOUND_MARGIN_S in the model: D's bound is ABORT_S + MARGIN_S after a pull
DEADLINE_MS = 1500  # kv_load_timeout_ms
HEARTBEAT_MS = 500  # D's pull: P is lost after 3 missed (1.5 s)
RECONNECT_S = 0.1  # ZMQ_RECONNECT_IVL
P_DETECT_S = 1.0  # P's keepalive: a reset is seen at the next probe, 1 s after the link's last traffic
P_KEEPALIVE_GIVEUP_S = 61.0  # 1 s idle + 60 unanswered probes
ENGINE = "p-engine"
BLOCK_BYTES = 2 * 1024 * 1024  # one block's KV in P's write (a few layers of a small model)
PTR_STRIDE = 4 * 1024 * 1024  # a descriptor's pointers: block (and write, request) times this, plus the offset


# ------------------------------------------------------------------ a loop on a virtual clock
class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class _VirtualSelector(selectors.SelectSelector):
    """Never waits: a select with a timeout moves the clock to the next timer instead."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock

    def select(self, timeout=None):
        if timeout is None:
            raise RuntimeError("the simulated world has nothing scheduled and nothing to run")
        if timeout > 0:
            self.clock.t += timeout
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self, clock: Clock) -> None:
        super().__init__(_VirtualSelector(clock))
        self._clock_fn = clock
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._clock_fn()

    def _write_to_self(self) -> None:  # one thread: nothing to wake
        pass


# ------------------------------------------------------------------ the wire format stand-in
class Status(IntEnum):  # upstream's MooncakeXferResponseStatus
    FINISH = 0
    CONTINUE = 1
    ERROR = 2


@dataclass
class Response:  # upstream's MooncakeXferResponse
    status: Status
    ok_reqs: list | None = None
    err_reqs: list | None = None
    err_msg: str | None = None


class XferMetadata:  # upstream's MooncakeXferMetadata: the fields the model reads
    def __init__(self, **kw) -> None:
        self.__dict__.update(kw)


@dataclass
class PullReqMeta:  # upstream's PullReqMeta
    d_req_id: str
    transfer_id: str
    local_block_ids: list
    remote_engine_id: str
    remote_bootstrap_addr: str
    expire_time: float = float("inf")
    pull_tasks_count: int = 0
    failed: bool = False


@dataclass
class SendBlockMeta:  # upstream's SendBlockMeta
    p_req_id: str
    transfer_id: str
    local_block_ids: list
    ready: asyncio.Event
    expire_time: float = float("inf")
    need_send: int = 0
    sent: int = 0
    sending: int = 0


class Codec:
    """msgspec's place: maps in msgpack (the wire format: the cancel prefix check works as on the
    real nodes), the upstream structs pickled behind a b"P" (they never start like a map)."""

    @staticmethod
    def encode(obj) -> bytes:
        return msgpack.packb(obj) if isinstance(obj, dict) else b"P" + pickle.dumps(obj)

    @staticmethod
    def decode(raw: bytes):
        return pickle.loads(raw[1:]) if raw[:1] == b"P" else msgpack.unpackb(raw)


# ------------------------------------------------------------------ sockets
def _mon_frames(event: int, value: int) -> list[bytes]:
    return [struct.pack("=hi", int(event), int(value)), b"sim"]


class _Box:
    """Messages waiting on a socket, and the coroutines waiting for one."""

    def __init__(self, loop) -> None:
        self.loop = loop
        self.items: list = []
        self.waiters: list[asyncio.Future] = []

    def put(self, item) -> None:
        self.items.append(item)
        for f in self.waiters:
            if not f.done():
                f.set_result(True)
        self.waiters.clear()

    def wait(self) -> asyncio.Future:
        f = self.loop.create_future()
        self.waiters.append(f)
        return f


async def _wait_any(boxes, timeout_ms) -> None:
    loop = boxes[0].loop
    if any(b.items for b in boxes):
        return
    futs = [b.wait() for b in boxes]
    try:
        await asyncio.wait(futs, timeout=None if timeout_ms is None or timeout_ms < 0 else timeout_ms / 1000.0,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        for f in futs:
            f.cancel()
    del loop


class MonSock:
    """A socket monitor's PAIR end (D: get_monitor_socket; P: the PAIR the listener connects)."""

    def __init__(self, loop) -> None:
        self.box = _Box(loop)
        self.closed = False
        self.underlying = self  # zmq.Socket.shadow(amon.underlying): the plain view below

    def emit(self, event: int, value: int = 0) -> None:
        if not self.closed:
            self.box.put(_mon_frames(event, value))

    def connect(self, addr) -> None:  # P's PAIR: the monitor the ROUTER published at addr
        self.box = WORLD_MONITORS[addr].box

    async def recv_multipart(self, flags: int = 0, copy: bool = True):
        if flags & zmq.NOBLOCK and not self.box.items:
            raise zmq.Again()
        while not self.box.items:
            await self.box.wait()
        return self.box.items.pop(0)

    async def poll(self, timeout=None, flags=zmq.POLLIN):
        await _wait_any([self.box], timeout)
        return zmq.POLLIN if self.box.items else 0

    def close(self, linger=None) -> None:
        self.closed = True


WORLD_MONITORS: dict[str, MonSock] = {}


class _PlainView:
    """zmq.Socket.shadow of P's monitor PAIR: reads that never wait."""

    def __init__(self, mon: MonSock) -> None:
        self.mon = mon

    def recv_multipart(self, flags: int = 0):
        if not self.mon.box.items:
            raise zmq.Again()
        return self.mon.box.items.pop(0)


class _Frame:
    def __init__(self, data: bytes, fd: int | None = None) -> None:
        self.bytes = data
        self._fd = fd

    def get(self, opt):
        return self._fd if opt == zmq.SRCFD else None


@dataclass
class Conn:
    cid: int
    dealer: "DealerSock"
    rank: int
    fd: int
    identity: bytes
    up_d: bool = True  # D's end still thinks it is up
    up_p: bool = True  # P's end still thinks it is up
    dead: bool = False  # no byte moves any more
    held: list = field(default_factory=list)  # messages a blackhole holds (TCP retransmits them later)
    last_at: dict = field(default_factory=lambda: {"d2p": 0.0, "p2d": 0.0})


class DealerSock:
    def __init__(self, world: "World") -> None:
        self.world = world
        self.box = _Box(world.loop)
        self.mon: MonSock | None = None
        self.addr: str | None = None
        self.rank: int | None = None
        self.conn: Conn | None = None
        self.outq: list[bytes] = []
        self.closed = False
        self.attempt: asyncio.TimerHandle | None = None
        self.ever = False

    def setsockopt(self, opt, value) -> None:
        pass

    def get_monitor_socket(self, events=None) -> MonSock:
        self.mon = MonSock(self.world.loop)
        return self.mon

    def disable_monitor(self) -> None:
        self.mon = None

    def _event(self, ev: int) -> None:
        if self.mon is not None:
            self.mon.emit(ev)

    def connect(self, addr: str) -> None:
        self.addr, self.rank = addr, self.world.rank_of(addr)
        self.world.schedule_attempt(self, self.world.delay)

    async def send(self, data: bytes, flags: int = 0) -> None:
        self.world.on_d_send(data)
        if self.conn is not None and self.conn.up_d:
            self.world.transmit(self.conn, "d2p", data)
        else:
            self.outq.append(data)

    async def recv(self, flags: int = 0):
        while not self.box.items:
            await self.box.wait()
        return self.box.items.pop(0)

    async def poll(self, timeout=None, flags=zmq.POLLIN):
        await _wait_any([self.box], timeout)
        return zmq.POLLIN if self.box.items else 0

    def close(self, linger=None) -> None:
        if self.closed:
            return
        self.closed = True
        if self.attempt is not None:
            self.attempt.cancel()
        if self.conn is not None and self.conn.up_d:
            self.world.hang_up(self.conn)
        if self.mon is not None:
            self.mon.emit(zmq.EVENT_MONITOR_STOPPED)


class RouterSock:
    def __init__(self, world: "World") -> None:
        self.world = world
        self.box = _Box(world.loop)
        self.mon: MonSock | None = None
        self.rank: int | None = None

    def setsockopt(self, opt, value) -> None:
        pass

    def monitor(self, addr: str, events=None) -> None:
        self.mon = MonSock(self.world.loop)
        WORLD_MONITORS[addr] = self.mon

    def disable_monitor(self) -> None:
        self.mon = None

    def bind_to_random_port(self, host: str) -> int:
        self.rank = int(host.split("//p")[1])
        self.world.routers[self.rank] = self
        return 7000 + self.rank

    async def recv_multipart(self, copy: bool = True):
        while not self.box.items:
            await self.box.wait()
        identity, data, fd = self.box.items.pop(0)
        return [_Frame(identity, fd), _Frame(data, fd)]

    async def send_multipart(self, parts) -> None:
        identity, data = parts
        self.world.on_p_send(self.rank, data)
        conn = self.world.by_identity.get(identity)
        if conn is not None and conn.up_p:
            self.world.transmit(conn, "p2d", data)  # else ROUTER drops what it cannot route

    def close(self, linger=None) -> None:
        pass


class SimCtx:
    def __init__(self, world: "World") -> None:
        self.world = world

    def socket(self, kind):
        if kind == zmq.DEALER:
            return DealerSock(self.world)
        if kind == zmq.ROUTER:
            return RouterSock(self.world)
        return MonSock(self.world.loop)


class SimPoller:  # zmq.asyncio.Poller
    def __init__(self) -> None:
        self.socks: list = []

    def register(self, sock, flags=zmq.POLLIN) -> None:
        self.socks.append(sock)

    async def poll(self, timeout=None):
        await _wait_any([s.box for s in self.socks], timeout)
        return [(s, zmq.POLLIN) for s in self.socks if s.box.items]


TRACE: list | None = None  # set to a list to record what moves (debugging a finding)


def _brief(data: bytes) -> str:
    msg = Codec.decode(data)
    if isinstance(msg, dict):
        return str(msg)
    if isinstance(msg, Response):
        return f"{msg.status.name} ok={msg.ok_reqs} err={msg.err_reqs} {msg.err_msg or ''}"[:90]
    return f"pull {sorted(msg.req_blocks)}"


# ------------------------------------------------------------------ the network
class World:
    """The network, the clock and the loop of one run. Modes per P rank: up, refuse, blackhole."""

    def __init__(self, p_tp: int) -> None:
        self.clock = Clock()
        self.loop = VirtualLoop(self.clock)
        self.p_tp = p_tp
        self.mode = ["up"] * p_tp
        self.mode_since = [0.0] * p_tp
        self.delay = 0.01
        self.lose_next = False
        self.dup_next = False
        self.rng = None  # jitter: each message's latency drawn up to ``delay``
        self.dup_pulls = False  # a pull duplicated too (TCP never does; see pd_model's FULL space)
        self.routers: dict[int, RouterSock] = {}
        self.conns: list[Conn] = []
        self.by_identity: dict[bytes, Conn] = {}
        self.fds: list[set[int]] = [set() for _ in range(p_tp)]
        self.ids = itertools.count(1)
        self.pending: list[DealerSock] = [ ]  # dealers waiting for a link that hangs (blackhole)
        self.d_send_hooks: list = []
        self.p_send_hooks: list = []
        self.seen: dict[str, int] = {}
        self.turns: set[_Turn] = set()  # executor calls waiting for the world's time

    def jitter_seed(self, seed) -> None:
        import random
        self.rng = None if seed is None else random.Random(seed)

    def note(self, key: str) -> None:
        self.seen[key] = self.seen.get(key, 0) + 1

    def now(self) -> float:
        return self.clock.t

    @staticmethod
    def rank_of(addr: str) -> int:
        return int(addr.split("//p")[1].split(":")[0])

    def on_d_send(self, data: bytes) -> None:
        for h in self.d_send_hooks:
            h(data)

    def on_p_send(self, rank: int, data: bytes) -> None:
        for h in self.p_send_hooks:
            h(rank, data)

    # connecting
    def schedule_attempt(self, dealer: DealerSock, after: float) -> None:
        if not dealer.closed:
            dealer.attempt = self.loop.call_later(after, self._attempt, dealer)

    def _attempt(self, dealer: DealerSock) -> None:
        dealer.attempt = None
        if dealer.closed or dealer.conn is not None and dealer.conn.up_d:
            return
        mode = self.mode[dealer.rank]
        if mode == "refuse":
            dealer._event(zmq.EVENT_CONNECT_RETRIED)
            self.schedule_attempt(dealer, RECONNECT_S)
        elif mode == "blackhole":
            self.pending.append(dealer)  # the SYN hangs; tried again when the link changes
        else:
            fd = min(set(range(10, 10 + len(self.fds[dealer.rank]) + 1)) - self.fds[dealer.rank])
            self.fds[dealer.rank].add(fd)
            conn = Conn(next(self.ids), dealer, dealer.rank, fd, b"id%d" % next(self.ids))
            self.conns.append(conn)
            self.by_identity[conn.identity] = conn
            dealer.conn, dealer.ever = conn, True
            dealer._event(zmq.EVENT_CONNECTED)
            router = self.routers[dealer.rank]
            if router.mon is not None:
                router.mon.emit(zmq.EVENT_ACCEPTED, fd)
            out, dealer.outq = dealer.outq, []
            for data in out:
                self.transmit(conn, "d2p", data)

    # moving bytes
    def transmit(self, conn: Conn, way: str, data: bytes) -> None:
        if TRACE is not None:
            TRACE.append((round(self.now() - 1000, 3), "send", conn.rank, conn.cid, way, _brief(data),
                          "lost" if self.lose_next else "dup" if self.dup_next else ""))
        if conn.dead:
            return
        if self.lose_next:
            self.lose_next = False
            self.note("lost")
            return
        copies = 1
        if self.dup_next and (self.dup_pulls or not (way == "d2p" and data[:1] == b"P")):
            self.dup_next, copies = False, 2
            self.note("duplicated")
        for _ in range(copies):
            if self.mode[conn.rank] == "blackhole":
                conn.held.append((way, data))
                continue
            delay = self.delay if self.rng is None else self.delay * self.rng.random()
            at = max(self.now() + delay, conn.last_at[way])  # one connection keeps its order
            conn.last_at[way] = at
            self.loop.call_at(at, self._arrive, conn, way, data)

    def _arrive(self, conn: Conn, way: str, data: bytes) -> None:
        if conn.dead:
            return
        if way == "d2p":
            if conn.up_p:
                self.routers[conn.rank].box.put((conn.identity, data, conn.fd))
        elif conn.up_d and not conn.dealer.closed:
            conn.dealer.box.put(data)

    # losing connections
    def _d_loses(self, conn: Conn) -> None:
        if not conn.up_d:
            return
        conn.up_d = False
        d = conn.dealer
        if d.conn is conn and not d.closed:
            d.conn = None
            d._event(zmq.EVENT_DISCONNECTED)
            d._event(zmq.EVENT_CONNECT_RETRIED)  # the reconnect it schedules at once (pull.py)
            self.schedule_attempt(d, RECONNECT_S)

    def _p_loses(self, conn: Conn) -> None:
        if not conn.up_p:
            return
        conn.up_p = False
        self.fds[conn.rank].discard(conn.fd)
        self.by_identity.pop(conn.identity, None)
        router = self.routers.get(conn.rank)
        if router is not None and router.mon is not None:
            router.mon.emit(zmq.EVENT_DISCONNECTED, conn.fd)

    def hang_up(self, conn: Conn) -> None:
        """D closed its socket: a FIN, which P sees at once unless the link holds it."""
        conn.up_d = False
        conn.dead = True
        if self.mode[conn.rank] == "up":
            self.loop.call_later(self.delay, self._p_loses, conn)
        else:
            conn.p_learns_late = True

    def drop(self, rank: int) -> None:
        """A reset on every connection of ``rank`` (a middlebox, a restart of the link): both ends see it."""
        for conn in self.conns:
            if conn.rank == rank and not conn.dead:
                conn.dead = True
                self._d_loses(conn)
                self.loop.call_later(self.delay, self._p_loses, conn)

    def set_mode(self, rank: int, mode: str) -> None:
        old = self.mode[rank]
        if old == mode:
            return
        self.mode[rank] = mode
        self.mode_since[rank] = self.now()
        self.note(f"mode_{mode}")
        live = [c for c in self.conns if c.rank == rank and (c.up_d or c.up_p)]
        if mode == "refuse":  # REJECT with a reset: D sees it at once, P at its next keepalive probe
            for c in live:
                c.dead = True
                self._d_loses(c)
                self.loop.call_later(P_DETECT_S, self._p_loses, c)
        elif mode == "blackhole":
            for c in live:
                if c.up_d:
                    self.loop.call_later(HEARTBEAT_MS * 3 / 1000.0, self._hb_timeout, c, self.now())
                self.loop.call_later(P_KEEPALIVE_GIVEUP_S, self._keepalive_giveup, c, self.now())
        else:  # up again
            for c in live:
                if c.dead or not c.up_d:  # D gave it up meanwhile: P's next probe meets a reset
                    c.dead = True
                    self.loop.call_later(P_DETECT_S, self._p_loses, c)
                else:  # it survived: TCP retransmits what the blackhole held
                    held, c.held = c.held, []
                    for way, data in held:
                        self.transmit(c, way, data)
        if mode != "blackhole":
            waiting, self.pending = [d for d in self.pending if d.rank == rank], \
                [d for d in self.pending if d.rank != rank]
            for d in waiting:
                self.schedule_attempt(d, self.delay)

    def _hb_timeout(self, conn: Conn, since: float) -> None:
        if self.mode[conn.rank] == "blackhole" and self.mode_since[conn.rank] == since and conn.up_d:
            conn.dead = True
            self._d_loses(conn)

    def _keepalive_giveup(self, conn: Conn, since: float) -> None:
        if self.mode[conn.rank] == "blackhole" and self.mode_since[conn.rank] == since:
            conn.dead = True
            self._p_loses(conn)

    def run_until(self, t: float) -> None:
        async def _sleep():
            await asyncio.sleep(max(0.0, t - self.now()))
        self.loop.run_until_complete(_sleep())

    def close(self) -> None:
        turns, self.turns = list(self.turns), set()
        for turn in turns:  # a write still waiting for its time: it ends with the world
            turn.abandoned = True
        for task in asyncio.all_tasks(self.loop):
            task.cancel()
        try:
            self.loop.run_until_complete(asyncio.sleep(0))
        except Exception:  # noqa: BLE001 - teardown of a finished run
            pass
        self.loop.close()
        for turn in turns:
            turn.to_thread.release()  # raises _Abandoned in its thread, which then ends


# ------------------------------------------------------------------ P's sender executor, in turns
class _Abandoned(Exception):
    """The world closed while a write waited for its time."""


class _Turn:
    """One call in the executor: a thread of its own that runs only while the loop waits for it
    (strict turns), so the world stays deterministic; :func:`executor_sleep` hands virtual time
    back to the loop."""

    def __init__(self, world: "World") -> None:
        self.world = world
        self.to_thread = threading.Semaphore(0)
        self.to_loop = threading.Semaphore(0)
        self.wants: float | None = None  # seconds the thread waits for, when it gave the turn back
        self.abandoned = False

    def give_to_thread(self) -> None:
        """(loop) Run the thread until it waits for time or ends; then schedule its wake-up."""
        self.to_thread.release()
        self.to_loop.acquire()
        if self.wants is not None:
            dt, self.wants = self.wants, None
            self.world.turns.add(self)
            self.world.loop.call_later(dt, self._wake)

    def _wake(self) -> None:
        self.world.turns.discard(self)
        self.give_to_thread()

    def sleep(self, dt: float) -> None:
        """(thread) Wait ``dt`` of the world's time."""
        self.wants = max(0.0, dt)
        self.to_loop.release()
        self.to_thread.acquire()
        if self.abandoned:
            raise _Abandoned()


_CURRENT = threading.local()


def executor_sleep(dt: float) -> None:
    """Called in an executor thread (the transfer engine's write): the world's time passes."""
    _CURRENT.turn.sleep(dt)


class SimExecutor(concurrent.futures.Executor):
    """P's ``_sender_executor``: upstream hands ``_send_blocks`` to it with ``run_in_executor``."""

    def __init__(self, world: "World") -> None:
        self.world = world

    def submit(self, fn, /, *args, **kwargs):
        fut: concurrent.futures.Future = concurrent.futures.Future()
        turn = _Turn(self.world)

        def body() -> None:
            _CURRENT.turn = turn
            turn.to_thread.acquire()
            try:
                try:
                    result, exc = fn(*args, **kwargs), None
                except BaseException as e:  # noqa: BLE001 - handed to the awaiting task
                    result, exc = None, e
                if not turn.abandoned:
                    try:
                        fut.set_result(result) if exc is None else fut.set_exception(exc)
                    except concurrent.futures.InvalidStateError:
                        pass  # its task was cancelled meanwhile
            finally:
                turn.to_loop.release()

        threading.Thread(target=body, daemon=True, name="sim-sender-executor").start()
        turn.give_to_thread()
        return fut

    def shutdown(self, wait=True, *, cancel_futures=False) -> None:
        pass


class SimEngine:
    """P's transfer engine: ``batch_transfer_sync_write`` is the model's (``PDModel.write_chunk``)."""

    def __init__(self, model, rank: int) -> None:
        self.model, self.rank = model, rank

    def batch_transfer_sync_write(self, session, src, dst, lengths) -> int:
        return self.model.write_chunk(self.rank, src, dst, lengths)


# ------------------------------------------------------------------ upstream's worker, modelled
class UpstreamWorker:
    """What the hardened worker inherits from vLLM 0.32.0's MooncakeConnectorWorker, reduced to the
    protocol (no KV layout, no transfer engine): the write is the world's (``SimWorld.write``)."""

    def __init__(self, vllm_config, engine_id, kv_cache_config) -> None:
        sim = vllm_config.sim
        self.world: World = sim["world"]
        self.sim = sim["model"]
        self.tp_rank = sim["rank"]
        self.engine_id = engine_id
        self.is_kv_producer = sim["producer"]
        self.is_kv_consumer = not sim["producer"]
        self.async_zmq_ctx = SimCtx(self.world)
        self.receiver_loop = self.sender_loop = self.world.loop
        self.reqs_need_send: dict[str, SendBlockMeta] = {}
        self.finished_sending_reqs: set[str] = set()
        self.sender_worker_queue: asyncio.Queue = asyncio.Queue()
        self.num_sender_tasks = 2
        self._encoder = self._xfer_resp_decoder = self._xfer_meta_decoder = Codec
        self._remote_agents: dict = {}
        self._tp_size: dict = {}
        self._pending_bootstrap_queries: dict = {}
        self.pp_size, self.pp_rank, self.tp_size = 1, 0, 1
        self.transfer_topo = types.SimpleNamespace(handshake_target_ranks=lambda n: list(range(n)))
        self._invalid_block_ids: queue.SimpleQueue = queue.SimpleQueue()
        self._is_hma_required = False
        self.hostname = f"p{self.tp_rank}" if self.is_kv_producer else "d0"
        self.rpc_port = 0
        for name in ("kv_caches_base_addr", "block_len_per_layer", "kv_block_len_per_layer",
                     "registered_layer_names", "registered_layer_indices", "registered_group_indices",
                     "region_shared_groups", "region_row_offsets"):
            setattr(self, name, [])
        self.xfer_stats = None
        self.engine = SimEngine(self.sim, self.tp_rank)
        self._sender_executor = SimExecutor(self.world)

    async def register_worker_with_bootstrap(self) -> None:
        pass

    # D
    def start_load_kv(self, metadata) -> None:
        if not self.is_kv_producer and metadata.reqs_to_recv:
            asyncio.run_coroutine_threadsafe(self._start_load_kv(metadata.reqs_to_recv), self.receiver_loop)
        if not self.is_kv_consumer and (metadata.reqs_to_send or metadata.reqs_not_processed):
            asyncio.run_coroutine_threadsafe(self.record_send_reqs(metadata), self.sender_loop)

    async def handle_new_engine_id(self, remote_engine_id, pull_metas) -> None:
        addr = next(iter(pull_metas.values())).remote_bootstrap_addr
        if addr not in self._pending_bootstrap_queries:
            self._pending_bootstrap_queries[addr] = asyncio.Event()
            await self._connect_to_prefiller_bootstrap(addr)
            self._pending_bootstrap_queries.pop(addr).set()
        else:
            await self._pending_bootstrap_queries[addr].wait()
        if remote_engine_id not in self._remote_agents:
            self._handle_failed_recv(pull_metas, list(pull_metas), "remote engine_id not found")
            return
        self.receive_kv(remote_engine_id, pull_metas)

    async def _connect_to_prefiller_bootstrap(self, remote_bootstrap_addr) -> None:
        self.world.note("bootstrap_query")
        await asyncio.sleep(self.sim.bootstrap_s)
        self._remote_agents[ENGINE] = {r: {0: f"tcp://p{r}:{7000 + r}"} for r in range(self.world.p_tp)}
        self._tp_size[ENGINE] = self.world.p_tp

    def get_transfer_results(self):
        return types.SimpleNamespace(finished_sending=set(), finished_recving=set(), failed_recving=set())

    # P
    async def record_send_reqs(self, metadata) -> None:
        for p_req_id, (tid, blocks) in metadata.reqs_to_send.items():
            if blocks:
                meta = self.reqs_need_send[tid]
                meta.p_req_id, meta.local_block_ids = p_req_id, blocks
                meta.expire_time = self.world.now() + ABORT_S
                meta.ready.set()
            elif tid not in self.reqs_need_send:
                self.reqs_need_send[tid] = SendBlockMeta(p_req_id, tid, [], asyncio.Event())
        for tid in metadata.reqs_not_processed:
            self.reqs_need_send.pop(tid)

    async def fetch_finished_sending_reqs(self) -> set:
        out, self.finished_sending_reqs = self.finished_sending_reqs, set()
        now = self.world.now()
        expired = [t for t, m in self.reqs_need_send.items() if m.p_req_id and m.expire_time < now and m.sending == 0]
        for tid in expired:
            out.add(self.reqs_need_send.pop(tid).p_req_id)
        return out

    async def send_kv_to_decode(self, identity, sock, meta) -> None:
        pending = {}
        for d_req_id, (tid, _) in meta.req_blocks.items():
            if tid not in self.reqs_need_send:
                self.reqs_need_send[tid] = SendBlockMeta("", tid, [], asyncio.Event())
            pending[d_req_id] = self.reqs_need_send[tid]

        async def ready(d, m):
            await m.ready.wait()
            return d, m

        waits = [asyncio.create_task(ready(d, m)) for d, m in pending.items()]
        while waits:
            done, rest = await asyncio.wait(waits, timeout=ABORT_S, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                for t in waits:
                    t.cancel()
                self.world.note("p_waited_out")
                await sock.send_multipart((identity, self._encoder.encode(
                    Response(Status.FINISH, err_reqs=list(pending), err_msg="Timeout waiting for P side ready."))))
                break
            waits = list(rest)
            status = Status.CONTINUE if waits else Status.FINISH
            ready_reqs = []
            for task in done:
                d, m = task.result()
                del pending[d]
                if m.transfer_id in self.reqs_need_send:
                    m.sending += 1
                    if not m.need_send:
                        m.need_send = 1  # one D rank pulls each P rank
                    ready_reqs.append((d, m))
            src, dst, lengths, err_reqs, err_msg = await self._build_transfer_params(ready_reqs, meta)
            err_set = set(err_reqs)
            ok = [(d, m) for d, m in ready_reqs if d not in err_set]
            if src:
                ret = await self.sender_loop.run_in_executor(self._sender_executor, self._send_blocks, "d0:0",
                                                             src, dst, lengths)
                if ret != 0:
                    err_reqs = list(err_reqs) + [d for d, _ in ok]
                    err_set |= {d for d, _ in ok}
                    err_msg = "Mooncake transfer engine returned -1"
                    ok = []
            for d, m in ready_reqs:
                m.sending -= 1
                if d in err_set:
                    continue
                m.sent += 1
                if m.sent == m.need_send and self.reqs_need_send.pop(m.transfer_id, None) is not None:
                    self.finished_sending_reqs.add(m.p_req_id)
            await sock.send_multipart((identity, self._encoder.encode(
                Response(status, ok_reqs=[d for d, _ in ok] or None, err_reqs=list(err_reqs) or None,
                         err_msg=err_msg))))

    async def _build_transfer_params(self, ready_reqs, meta, *args, **kwargs):
        """One descriptor per block of each request: D's address (the block, times PTR_STRIDE) and
        P's, which names the write and the request (the model's write_chunk reads them back)."""
        src, dst, lengths = [], [], []
        blocks = {d: [b for g in meta.req_blocks[d][1] for b in g] for d, _ in ready_reqs}
        wid = self.sim.new_write(sum(len(v) for v in blocks.values()) * BLOCK_BYTES)
        for d, _ in ready_reqs:
            for b in blocks[d]:
                src.append(((wid * 1000 + int(d[1:])) * 1000 + b) * PTR_STRIDE)
                dst.append(b * PTR_STRIDE)
                lengths.append(BLOCK_BYTES)
        return src, dst, lengths, [], None

    def _send_blocks(self, remote_session, src_ptrs, dst_ptrs, lengths) -> int:  # upstream's
        ret = self.engine.batch_transfer_sync_write(remote_session, src_ptrs, dst_ptrs, lengths)
        if ret == 0:
            self.xfer_stats.record_transfer(duration_s=0.0, total_bytes=sum(lengths), num_descs=len(src_ptrs))
        else:
            self.xfer_stats.record_failed_transfer()
        return ret

    def shutdown(self) -> None:  # upstream's: the context, then the executor without waiting
        pass


class UpstreamScheduler:
    def __init__(self, *a, **k) -> None:
        pass

    def request_finished(self, request, block_ids):
        return False, None

    def build_connector_meta(self, scheduler_output):
        return scheduler_output


class _Stats:  # MooncakeKVConnectorStats
    def __init__(self, data=None) -> None:
        self.data = data if data is not None else {}
        self._lock = threading.Lock()
        if data is None:
            self.reset()

    def reset(self) -> None:
        self.data = {}

    def record_failed_recv(self) -> None:
        self.data.setdefault("failed", []).append(1)

    def record_transfer(self, duration_s: float, total_bytes: int, num_descs: int) -> None:
        self.data.setdefault("bytes", []).append(total_bytes)

    def record_failed_transfer(self) -> None:
        self.data.setdefault("failed_transfers", []).append(1)

    def record_kv_expired_req(self) -> None:
        pass

    def is_empty(self) -> bool:
        return True

    def reduce(self) -> dict:
        return {}


# ------------------------------------------------------------------ loading the real module
def _stub_vllm() -> dict[str, types.ModuleType]:
    def mod(name, **kw):
        m = types.ModuleType(name)
        m.__dict__.update(kw)
        return m

    mc = mod("vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector",
             MooncakeConnectorScheduler=UpstreamScheduler, MooncakeConnectorWorker=UpstreamWorker,
             MooncakeConnector=type("MooncakeConnector", (), {}), MooncakeXferResponseStatus=Status,
             MooncakeXferResponse=Response, MooncakeXferMetadata=XferMetadata)
    import logging
    names = {
        "vllm": mod("vllm", __version__="0.32.0", envs=mod("vllm.envs", VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT=ABORT_S)),
        "vllm.distributed.kv_transfer.kv_connector.v1.base": mod(
            "base", KVConnectorBase_V1=type("KVConnectorBase_V1", (), {}),
            KVConnectorRole=types.SimpleNamespace(SCHEDULER=0, WORKER=1)),
        "vllm.distributed.kv_transfer.kv_connector.v1.metrics": mod(
            "metrics", KVConnectorPromMetrics=type("KVConnectorPromMetrics", (), {})),
        "vllm.distributed.kv_transfer.kv_connector.v1.mooncake": mod("mooncake", mooncake_connector=mc),
        "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector": mc,
        "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.stats": mod(
            "stats", MooncakeKVConnectorStats=_Stats),
        "vllm.logger": mod("vllm.logger", init_logger=logging.getLogger),
        "vllm.v1.request": mod("vllm.v1.request", RequestStatus=types.SimpleNamespace(FINISHED_STOPPED=3)),
        "msgspec": mod("msgspec", msgpack=mod("msgspec.msgpack", encode=Codec.encode, decode=Codec.decode)),
    }
    for parent in ("vllm.distributed", "vllm.distributed.kv_transfer", "vllm.distributed.kv_transfer.kv_connector",
                   "vllm.distributed.kv_transfer.kv_connector.v1"):
        names[parent] = mod(parent)
    return names


_MODULE = None


def hardened_module():
    """connector_patch/pd/vllm_connector.py, loaded privately over the stand-ins (once)."""
    global _MODULE
    if _MODULE is not None:
        return _MODULE
    import connector_patch.versions as versions

    stubs = _stub_vllm()
    saved = {k: sys.modules.get(k) for k in stubs}
    saved_require = versions.require
    sys.modules.update(stubs)
    versions.require = lambda connector, found=None: "tested"
    try:
        path = REPO / "connector_patch" / "pd" / "vllm_connector.py"
        spec = importlib.util.spec_from_file_location("pdchaos_model_vllm_connector", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        versions.require = saved_require
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    zproxy = types.SimpleNamespace(**{k: getattr(zmq, k) for k in dir(zmq) if not k.startswith("_")})
    zproxy.asyncio = types.SimpleNamespace(Poller=SimPoller)
    zproxy.Socket = types.SimpleNamespace(shadow=lambda underlying: _PlainView(underlying))
    module.zmq = zproxy
    module.BOUND_MARGIN_S = MARGIN_S
    module._SIM_TIME = types.SimpleNamespace(monotonic=None)
    _MODULE = module
    return module


def bind_clock(module, world: World) -> None:
    """The module's ``time`` reads the world's clock (the module is this model's private copy)."""
    module.time = types.SimpleNamespace(monotonic=world.clock, perf_counter=world.clock, time=world.clock,
                                        sleep=None)


def config(world: World, model, rank: int, producer: bool):
    extra = {"kv_load_timeout_ms": DEADLINE_MS, "heartbeat_ms": HEARTBEAT_MS, "quiet_wait_max_ms": 0}
    return types.SimpleNamespace(
        kv_transfer_config=types.SimpleNamespace(kv_connector_extra_config=extra, kv_load_failure_policy="fail"),
        sim={"world": world, "model": model, "rank": rank, "producer": producer})
