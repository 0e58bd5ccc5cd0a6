"""Node ``pd-proxy``: the project's P/D proxy for vLLM 0.32's MooncakeConnector (aiohttp).

The protocol (as upstream's ``examples/disaggregated/mooncake_connector/mooncake_connector_proxy.py``
speaks it): for every ``POST /v1/completions`` the proxy makes up a ``transfer_id``, reads P's
engine id from P's Mooncake bootstrap server (``GET {bootstrap}/query``: vLLM's
``MooncakeBootstrapServer.query`` returns ``dict[int, EngineEntry]``, i.e. JSON
``{"0": {"engine_id": E, "worker_addr": {tp: {pp: addr}}}}``, ``{}`` until P's worker registered),
re-read on every request so a P restarted with a new engine id is found; then it asks P for one
token with ``kv_transfer_params={"do_remote_decode": true, "do_remote_prefill": false,
"transfer_id": X}`` and D for the real completion with ``{"do_remote_decode": false,
"do_remote_prefill": true, "remote_bootstrap_addr": BOOTSTRAP, "remote_engine_id": E,
"transfer_id": X}`` — at the same time (``--order parallel``, upstream's way) or D only after P
answered 200 (``--order sequential``). The client gets D's answer.

``--protocol store`` (a KV pool: vLLM's MooncakeStoreConnector, P ``kv_producer`` and D
``kv_consumer`` on one Mooncake master): P is asked first for one token, without
``kv_transfer_params`` (P stores the prompt's blocks in the pool), then D, without them either (D's
scheduler looks the prompt up in the pool and loads what it finds; a miss is computed). Always
sequential; ``bad_params`` has no keys to drop and ``redirect`` is refused.

``--protocol layerwise`` (vllm-ascend's decoder-first MooncakeLayerwiseConnector): D is asked first,
with ``X-Request-Id: ID`` and ``{"do_remote_decode": false, "do_remote_prefill": true,
"metaserver": "http://127.0.0.1:PORT/v1/metaserver"}``; D's scheduler POSTs its transfer params
(``request_id`` ``cmpl-ID-0``) to that endpoint, and the proxy then asks P for one token with them
(answering the POST once P answered: ``{}``; 404 for an unknown id, 409 for a second POST; P's
error otherwise, which also ends the client's request: 502/504 phase prefill). Counted as
``metaserver_posts``, ``metaserver_unknown``, ``metaserver_repeat``, ``metaserver_bad``. The
hooks between P's answer and D (``hold``, ``abort after_prefill``) are refused under this
protocol, and ``bad_params`` takes only keys that D gets under the proxy's protocol.

``--protocol kv-params`` (vllm-ascend's MooncakeConnectorV1, as its example proxy speaks it): no
bootstrap; P is asked first with ``{"do_remote_decode": true, "do_remote_prefill": false,
"remote_engine_id": null, "remote_block_ids": null, "remote_host": null, "remote_port": null}``,
and D gets the ``kv_transfer_params`` of P's answer (P's side channel, engine id, block ids...);
502 ``no_kv_params`` when P's answer has none. Always sequential; every hook but ``redirect``
applies (a ``redirect`` is refused: a fake peer is found through a bootstrap server).

Bounded errors: whatever P, D or the bootstrap do (refuse, hang, answer garbage), every client
request is answered within ``--timeout-s`` — HTTP 502 (bad answer, refused connection, hook
abort) or 504 (timeout) with ``{"error": {"type", "phase", "message"}}``, ``phase`` one of
bootstrap | prefill | decode | proxy. 400 for a bad client body.

Phase hooks for the nemesis (the natural window between P's answer and D's pull is
milliseconds), set at run time on the control channel, each counted in ``stats``:

- ``hold {phase: after_prefill, count: N, seconds: S}``: the next N requests wait after P
  answered, before D is asked (so they run sequentially), until ``release`` or S seconds;
- ``abort {phase: decode_wait, count: N, after_ms: M}``: the next N requests close their D
  request after M ms (a client that disconnects while D waits for KV); the client gets 502
  ``aborted``;
- ``abort {phase: after_prefill, count: N}``: after P answered, D is never asked (P holds its
  blocks until its abort timeout); the client gets 502 ``aborted``;
- ``bad_params {count: N, drop: [keys]}``: D's kv_transfer_params miss those keys (vLLM then
  leaves the request waiting: the proxy's timeout still answers);
- ``redirect {count: N, bootstrap: http://127.0.0.1:B}``: the next N requests never reach the
  real P: the proxy reads the engine id E from ``B/query`` (sent with the header
  ``X-PDChaos-Peer: proxy``, so a fake prefill peer, families/pd/fake_prefill.py, tells
  the proxy its true engine id whatever it later tells D) and sends D only
  ``{"do_remote_decode": false, "do_remote_prefill": true, "remote_bootstrap_addr": B,
  "remote_engine_id": E, "transfer_id": X}``; D then asks B for E and pulls from whatever B
  names. ``bad_params`` and ``abort decode_wait`` still apply to a redirected request; ``hold``
  and ``abort after_prefill`` (there is no prefill) are left armed for the next normal request;
- ``release`` (wake held requests, disarm ``hold``), ``clear`` (disarm every hook, wake held;
  ``clear {hooks: [names]}`` disarms only those, e.g. ``["redirect"]``).

Control ``stats`` answers ``counters`` (requests, ok, errors by phase and type, in_flight, held,
holding, hold_released, hold_expired, aborted, aborted_by hook, abort_missed, bad_params,
redirected, engine_id_changes) and the armed ``hooks`` with their remaining counts. A hook is
taken by a request once it has P's engine id (a request failing at the bootstrap takes none),
except ``redirect``: taken once the request's body is read, before the redirect's bootstrap is
asked (a request failing there used up its redirect, and is counted under phase bootstrap).

Logs carry counts, phases, status codes and times only: never prompts, bodies, token ids,
transfer ids, engine ids or bootstrap addresses of a redirect.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import urlsplit

from nodekit.nodeio import NodeApp, NodeUsageError, check_endpoint, run_node as run_node_process

logger = logging.getLogger(__name__)

PHASES = ("bootstrap", "prefill", "decode", "proxy")
# the keys of D's kv_transfer_params per protocol (what ``bad_params`` may drop)
D_KV_KEYS_BY_PROTOCOL = {
    "bootstrap": ("do_remote_decode", "do_remote_prefill", "remote_bootstrap_addr", "remote_engine_id", "transfer_id"),
    # what vllm-ascend's MooncakeConnectorV1 puts in P's answer
    "kv-params": ("do_remote_decode", "do_remote_prefill", "remote_block_ids", "remote_engine_id", "remote_host",
                  "remote_port", "remote_request_id"),
    "layerwise": ("do_remote_decode", "do_remote_prefill", "metaserver"),
    "store": (),  # P and D meet in the KV pool: D gets no kv_transfer_params
}
D_KV_KEYS = D_KV_KEYS_BY_PROTOCOL["bootstrap"]
PROTOCOLS = tuple(D_KV_KEYS_BY_PROTOCOL)
P_KV_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
               "remote_block_ids": None, "remote_host": None, "remote_port": None}
HOOKS = ("hold", "abort_decode_wait", "abort_after_prefill", "bad_params", "redirect")
PEER_HEADER = {"X-PDChaos-Peer": "proxy"}  # a redirect's bootstrap query: see families/pd/fake_prefill.py
_UPSTREAM_MESSAGE_CHARS = 300
_MAX_COUNT = 1_000_000


# --------------------------------------------------------------------------- arguments


def add_node_arguments(p: argparse.ArgumentParser, kind: str) -> None:  # noqa: ARG001
    p.add_argument("--port", type=int, required=True, help="TCP port to listen on")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; a pod's own address in a pod, nodekit/nodeio.py)")
    p.add_argument("--prefill", required=True, help="P's OpenAI API, http://127.0.0.1:N")
    p.add_argument("--prefill-bootstrap", required=True,
                   help="P's Mooncake bootstrap server, http://127.0.0.1:B (sent to D as remote_bootstrap_addr)")
    p.add_argument("--decode", required=True, help="D's OpenAI API, http://127.0.0.1:N")
    p.add_argument("--control", help="ipc endpoint of the harness control channel")
    p.add_argument("--timeout-s", type=float, default=60.0,
                   help="every client request is answered within this (default 60)")
    p.add_argument("--protocol", choices=PROTOCOLS, default="bootstrap",
                   help="bootstrap: D is told P's bootstrap address and engine id (vLLM's MooncakeConnector); "
                        "kv-params: P is asked first, and D gets the kv_transfer_params of P's answer "
                        "(vllm-ascend's MooncakeConnectorV1; always sequential, no redirect hook); "
                        "store: P first, then D, neither with kv_transfer_params (a KV pool: vLLM's "
                        "MooncakeStoreConnector; always sequential)")
    p.add_argument("--order", choices=("parallel", "sequential"), default="parallel",
                   help="parallel: P and D asked at once (upstream's example proxy); sequential: D only "
                        "after P answered 200 (default parallel)")
    p.add_argument("--log-level", default="INFO")


def check_url(url: str, what: str) -> str:
    """``http://HOST:PORT`` (an optional trailing ``/``) on loopback, by the endpoint rules of
    nodekit/nodeio.py (127.0.0.0/8, ::1, localhost; a private address inside a run's netns).
    Returns the URL without the trailing slash."""
    if not isinstance(url, str) or not url:
        raise NodeUsageError(f"{what}: expected a URL like http://127.0.0.1:8000")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise NodeUsageError(f"{what}: {url!r}: {exc}") from None
    if parts.scheme != "http":
        raise NodeUsageError(f"{what}: {url!r} must start with http://")
    if not parts.hostname or port is None:
        raise NodeUsageError(f"{what}: {url!r} needs a host and a port, like http://127.0.0.1:8000")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or parts.password:
        raise NodeUsageError(f"{what}: {url!r}: give only http://HOST:PORT (no path, query or user)")
    host = parts.hostname
    endpoint = f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
    try:
        check_endpoint(endpoint, what)
    except NodeUsageError as exc:
        raise NodeUsageError(str(exc).replace(repr(endpoint), repr(url))) from None
    return url.rstrip("/")


# --------------------------------------------------------------------------- errors and hooks


class ProxyError(Exception):
    """An answer to the client: ``{"error": {"type", "phase", "message", ...extra}}``."""

    def __init__(self, status: int, type_: str, phase: str, message: str, **extra: Any):
        super().__init__(message)
        self.status, self.type, self.phase, self.message, self.extra = status, type_, phase, message, extra

    def body(self) -> dict:
        return {"error": {"type": self.type, "phase": self.phase, "message": self.message, **self.extra}}


@dataclass
class Taken:
    """The hooks one request took when it was admitted."""

    hold_s: float | None = None
    hold_gen: int = 0
    abort_decode_ms: int | None = None
    abort_after_prefill: bool = False
    drop: tuple[str, ...] = ()

    @property
    def forces_sequential(self) -> bool:
        return self.hold_s is not None or self.abort_after_prefill


@dataclass
class Ctx:
    seq: int
    phase: str = "proxy"
    t0: float = 0.0
    times: dict[str, float] = field(default_factory=dict)  # phase -> ms
    d_asked: float | None = None  # loop time the request to D was sent (None: D not asked)


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_COUNT:
        raise ValueError(f"{what}: expected an integer in [1, {_MAX_COUNT}]")
    return value


def _seconds(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 86400:
        raise ValueError(f"{what}: expected a number of seconds in (0, 86400]")
    return float(value)


# --------------------------------------------------------------------------- the node


class PDProxy(NodeApp):
    def __init__(self, *, port: int, prefill: str, bootstrap: str, decode: str, timeout_s: float, order: str,
                 protocol: str = "bootstrap", host: str = "127.0.0.1"):
        self.protocol = protocol
        self.host = host
        self.port = port
        self.prefill = prefill
        self.bootstrap = bootstrap
        self.decode = decode
        self.timeout_s = timeout_s
        self.order = order
        self._lock = threading.Lock()  # hooks and counters: the control thread reads/writes them too
        self._hooks: dict[str, dict] = {}
        self._gen = 0  # bumped by release/clear: a hold taken before it is skipped
        self._seq = 0
        self._last_engine: str | None = None
        self._c: dict[str, Any] = {
            "requests": 0, "ok": 0, "errors": {}, "in_flight": 0,
            "held": 0, "holding": 0, "hold_released": 0, "hold_expired": 0,
            "aborted": 0, "aborted_by": {"decode_wait": 0, "after_prefill": 0}, "abort_missed": 0,
            "bad_params": 0, "redirected": 0, "engine_id_changes": 0,
            "metaserver_posts": 0, "metaserver_unknown": 0, "metaserver_repeat": 0, "metaserver_bad": 0,
        }
        self._layerwise_pending: dict[str, dict] = {}  # loop thread only: D's request id -> the client body
        self._closing = False
        self._hold_waiters: set[asyncio.Event] = set()  # loop thread only
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: Any = None
        self._session: Any = None

    # ------------------------------------------------------------------ lifecycle (main thread)
    def bind(self) -> None:
        import zmq

        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="pd-proxy-loop", daemon=True)
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=30.0)
        except OSError as exc:  # run_node reports a bind failure given as a ZMQError
            raise zmq.ZMQError(exc.errno or 98, exc.strerror or str(exc)) from None

    async def _start(self) -> None:
        from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

        app = web.Application(client_max_size=4 * 1024 * 1024)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/health", self._health)
        if self.protocol == "layerwise":
            app.router.add_post("/v1/metaserver", self._metaserver)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        # the deadline of every call is the request's own (--timeout-s), not aiohttp's default
        self._session = ClientSession(timeout=ClientTimeout(total=None), connector=TCPConnector(limit=0, force_close=True),
                                      json_serialize=json.dumps)
        await web.TCPSite(self._runner, self.host, self.port).start()

    def close(self) -> None:
        loop = self.loop
        if loop is None:
            return
        with self._lock:
            self._closing = True
            self._gen += 1
            self._hooks.clear()
        if loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(self._stop(), loop).result(timeout=10.0)
            except Exception as exc:  # noqa: BLE001 - closing must go on
                logger.warning("pd-proxy: stop: %s", type(exc).__name__)
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(5.0)
        if not loop.is_running():
            loop.close()
        self.loop = None

    async def _stop(self) -> None:
        self._wake_held()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def ready_message(self) -> str:
        return f"pd-proxy ready: port {self.port}, order {self.order}, timeout {self.timeout_s:g} s"

    def stop_message(self) -> str:
        c = self.stats()["counters"]
        return f"pd-proxy stopping: requests={c['requests']} ok={c['ok']} in_flight={c['in_flight']}"

    # ------------------------------------------------------------------ control channel (its thread)
    def stats(self) -> dict:
        """``counters`` (nested: the control answer's own ``ok`` must stay the envelope's), the
        armed ``hooks`` with their remaining counts, and the ``order``."""
        with self._lock:
            return {"counters": json.loads(json.dumps(self._c)), "hooks": json.loads(json.dumps(self._hooks)),
                    "order": self.order}

    def handlers(self) -> dict[str, Callable[[dict], dict]]:
        return {"hold": self._cmd_hold, "abort": self._cmd_abort, "bad_params": self._cmd_bad_params,
                "redirect": self._cmd_redirect, "release": self._cmd_release, "clear": self._cmd_clear}

    def _hooks_answer(self) -> dict:
        return {"hooks": json.loads(json.dumps(self._hooks))}

    def _no_prefill_phase(self, what: str) -> None:
        """Under --protocol layerwise P is asked by D's POST, not by the proxy between P and D:
        a hook on that phase would never be taken; it is refused, not armed for nothing."""
        if self.protocol == "layerwise":
            raise ValueError(f"{what}: this proxy speaks layerwise: P is asked by D's metaserver POST, there is "
                             "no phase after P's answer and before D")

    def _cmd_hold(self, m: dict) -> dict:
        if m.get("phase", "after_prefill") != "after_prefill":
            raise ValueError("phase: hold knows only 'after_prefill'")
        self._no_prefill_phase("hold")
        hook = {"count": _count(m.get("count", 1), "count"), "seconds": _seconds(m.get("seconds"), "seconds")}
        with self._lock:
            self._hooks["hold"] = hook
            return self._hooks_answer()

    def _cmd_abort(self, m: dict) -> dict:
        phase = m.get("phase")
        count = _count(m.get("count", 1), "count")
        if phase == "decode_wait":
            after_ms = m.get("after_ms")
            if isinstance(after_ms, bool) or not isinstance(after_ms, int) or not 0 <= after_ms <= 86_400_000:
                raise ValueError("after_ms: expected an integer number of milliseconds >= 0")
            hook = {"count": count, "after_ms": after_ms}
        elif phase == "after_prefill":
            self._no_prefill_phase("abort after_prefill")
            hook = {"count": count}
        else:
            raise ValueError("phase: expected 'decode_wait' or 'after_prefill'")
        with self._lock:
            self._hooks[f"abort_{phase}"] = hook
            return self._hooks_answer()

    def _cmd_bad_params(self, m: dict) -> dict:
        drop = m.get("drop")
        keys = D_KV_KEYS_BY_PROTOCOL[self.protocol]
        if not keys:
            raise ValueError(f"bad_params: D gets no kv_transfer_params under --protocol {self.protocol}")
        if (not isinstance(drop, (list, tuple)) or not drop
                or any(not isinstance(k, str) or k not in keys for k in drop)):
            raise ValueError(f"drop: expected a non-empty list of keys among {', '.join(keys)} "
                             f"(what D gets under --protocol {self.protocol})")
        hook = {"count": _count(m.get("count", 1), "count"), "drop": sorted(set(drop))}
        with self._lock:
            self._hooks["bad_params"] = hook
            return self._hooks_answer()

    def _cmd_redirect(self, m: dict) -> dict:
        if self.protocol != "bootstrap":
            raise ValueError(f"redirect: needs --protocol bootstrap (a fake prefill peer is found through a "
                             f"bootstrap server); this proxy speaks {self.protocol}")
        try:
            bootstrap = check_url(m.get("bootstrap"), "bootstrap")
        except NodeUsageError as exc:
            raise ValueError(str(exc)) from None
        hook = {"count": _count(m.get("count", 1), "count"), "bootstrap": bootstrap}
        with self._lock:
            self._hooks["redirect"] = hook
            return self._hooks_answer()

    def _release(self, names: tuple[str, ...]) -> dict:
        """Disarm the hooks ``names``; held requests are woken when ``hold`` is among them."""
        with self._lock:
            for name in names:
                self._hooks.pop(name, None)
            if "hold" not in names:
                return {"released": 0, **self._hooks_answer()}
            self._gen += 1
            answer = {"released": self._c["holding"], **self._hooks_answer()}
        if self.loop is not None and self.loop.is_running():
            self.loop.call_soon_threadsafe(self._wake_held)
        return answer

    def _cmd_release(self, m: dict) -> dict:  # noqa: ARG002
        return self._release(("hold",))

    def _cmd_clear(self, m: dict) -> dict:
        names = m.get("hooks")
        if names is None:
            return self._release(HOOKS)
        if (not isinstance(names, (list, tuple)) or not names
                or any(not isinstance(n, str) or n not in HOOKS for n in names)):
            raise ValueError(f"hooks: expected a non-empty list of hook names among {', '.join(HOOKS)}")
        return self._release(tuple(names))

    # ------------------------------------------------------------------ counters (loop thread)
    def _error(self, err: ProxyError) -> None:
        with self._lock:
            by_phase = self._c["errors"].setdefault(err.phase, {})
            by_phase[err.type] = by_phase.get(err.type, 0) + 1

    def _take_redirect(self) -> str | None:
        """The bootstrap this request is redirected to (the ``redirect`` hook's count goes down
        by one), or None."""
        with self._lock:
            hook = self._hooks.get("redirect")
            if hook is None:
                return None
            self._c["redirected"] += 1
            hook["count"] -= 1
            if hook["count"] <= 0:
                del self._hooks["redirect"]
            return hook["bootstrap"]

    def _take_hooks(self, decode_only: bool = False) -> Taken:
        """The hooks this request gets (each armed hook's count goes down by one); with
        ``decode_only`` (a redirected request: no prefill) only those that act on D's side."""
        taken = Taken()
        with self._lock:
            taken.hold_gen = self._gen
            for name in list(self._hooks):
                hook = self._hooks[name]
                if name == "redirect" or (decode_only and name in ("hold", "abort_after_prefill")):
                    continue
                if name == "hold":
                    taken.hold_s = hook["seconds"]
                elif name == "abort_decode_wait":
                    taken.abort_decode_ms = hook["after_ms"]
                elif name == "abort_after_prefill":
                    taken.abort_after_prefill = True
                elif name == "bad_params":
                    taken.drop = tuple(hook["drop"])
                    self._c["bad_params"] += 1
                hook["count"] -= 1
                if hook["count"] <= 0:
                    del self._hooks[name]
        return taken

    def _wake_held(self) -> None:
        for ev in list(self._hold_waiters):
            ev.set()

    # ------------------------------------------------------------------ HTTP
    async def _health(self, request: Any) -> Any:  # noqa: ARG002
        from aiohttp import web

        return web.json_response({"status": "ok"})

    async def _completions(self, request: Any) -> Any:
        from aiohttp import web

        loop = asyncio.get_running_loop()
        with self._lock:
            self._seq += 1
            self._c["requests"] += 1
            self._c["in_flight"] += 1
            ctx = Ctx(seq=self._seq, t0=loop.time())
        status, what = 0, "cancelled"
        try:
            try:
                data = await asyncio.wait_for(self._proxy(ctx, request), self.timeout_s)
            except asyncio.TimeoutError:
                raise ProxyError(504, "timeout", ctx.phase,
                                 f"no answer within {self.timeout_s:g} s (waiting in phase {ctx.phase})") from None
            with self._lock:
                self._c["ok"] += 1
            status = 200
            return web.json_response(data, status=200)
        except ProxyError as err:
            self._error(err)
            if ctx.d_asked is not None and "decode_ms" not in err.extra:
                # how long D had the request: a failed load is timed from here (fail_fast), not
                # from the client's send (time spent reaching P is not the load's)
                err.extra["decode_ms"] = round((loop.time() - ctx.d_asked) * 1000.0, 1)
            status, what = err.status, f"{err.phase}/{err.type}"
            return web.json_response(err.body(), status=err.status)
        except Exception as exc:  # noqa: BLE001 - a bug here must still answer the client
            err = ProxyError(502, "internal", "proxy", f"proxy error: {type(exc).__name__}")
            self._error(err)
            status, what = err.status, "proxy/internal"
            logger.error("req %d: internal error %s", ctx.seq, type(exc).__name__)
            return web.json_response(err.body(), status=err.status)
        finally:
            with self._lock:
                self._c["in_flight"] -= 1
            total_ms = (loop.time() - ctx.t0) * 1000.0
            times = "".join(f" {k}={v:.0f}ms" for k, v in ctx.times.items())
            if status == 200:
                logger.info("req %d: 200 total=%.0fms%s", ctx.seq, total_ms, times)
            else:  # counts, phases, codes and times only
                logger.info("req %d: %s %s total=%.0fms%s", ctx.seq, status or "-", what, total_ms, times)

    async def _read_body(self, request: Any) -> dict:
        from aiohttp import web

        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise ProxyError(413, "bad_request", "proxy", "body: too large", field="body") from None
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise ProxyError(400, "bad_request", "proxy", "body: not JSON", field="body") from None
        if not isinstance(body, dict):
            raise ProxyError(400, "bad_request", "proxy", "body: expected a JSON object", field="body")
        if not isinstance(body.get("prompt"), str):
            raise ProxyError(400, "bad_request", "proxy", "prompt: expected a string", field="prompt")
        if "model" in body and not isinstance(body["model"], str):
            raise ProxyError(400, "bad_request", "proxy", "model: expected a string", field="model")
        for name in ("max_tokens", "max_completion_tokens"):
            v = body.get(name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ProxyError(400, "bad_request", "proxy", f"{name}: expected a positive integer", field=name)
        if body.get("stream"):
            raise ProxyError(400, "bad_request", "proxy", "stream: streaming is not supported by this proxy",
                             field="stream")
        return body

    def _mark(self, ctx: Ctx, name: str, t_start: float) -> None:
        ctx.times[name] = (asyncio.get_running_loop().time() - t_start) * 1000.0

    async def _proxy(self, ctx: Ctx, request: Any) -> dict:
        loop = asyncio.get_running_loop()
        body = await self._read_body(request)
        redirect = self._take_redirect()
        if redirect is not None:
            return await self._redirected(ctx, body, redirect)
        if self.protocol == "kv-params":
            return await self._kv_params(ctx, body)
        if self.protocol == "store":
            return await self._store(ctx, body)
        if self.protocol == "layerwise":
            return await self._layerwise(ctx, body)

        ctx.phase = "bootstrap"
        t = loop.time()
        engine_id = await self._engine_id()
        self._mark(ctx, "bootstrap", t)

        taken = self._take_hooks()
        transfer_id = uuid.uuid4().hex
        p_body = self._prefill_body(body, {"do_remote_decode": True, "do_remote_prefill": False,
                                           "transfer_id": transfer_id})
        d_params = {"do_remote_decode": False, "do_remote_prefill": True, "remote_bootstrap_addr": self.bootstrap,
                    "remote_engine_id": engine_id, "transfer_id": transfer_id}
        for key in taken.drop:
            d_params.pop(key, None)
        d_body = dict(body)
        d_body["kv_transfer_params"] = d_params

        if self.order == "sequential" or taken.forces_sequential:
            ctx.phase = "prefill"
            t = loop.time()
            await self._post("prefill", self.prefill, p_body)
            self._mark(ctx, "prefill", t)
            return await self._then_decode(ctx, taken, d_body)

        ctx.phase = "prefill"
        t = loop.time()
        p_task = asyncio.ensure_future(self._post("prefill", self.prefill, p_body))
        d_task = asyncio.ensure_future(self._decode(ctx, d_body, taken))
        try:
            pending = {p_task, d_task}
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if p_task in done:
                    p_task.result()  # a failed prefill is the answer (D is closed below)
                    self._mark(ctx, "prefill", t)
                    if not d_task.done():
                        ctx.phase = "decode"
                if d_task in done:
                    exc = d_task.exception()
                    if isinstance(exc, ProxyError) and exc.type == "aborted" and not p_task.done():
                        await asyncio.wait({p_task})  # let P finish: only D's side is aborted
                        pending.discard(p_task)
                    if exc is not None:
                        ctx.phase = "decode"
                        raise exc
                    self._mark(ctx, "decode", t)
            return d_task.result()
        finally:
            for task in (p_task, d_task):
                if not task.done():
                    task.cancel()
            await asyncio.wait({p_task, d_task})
            for task in (p_task, d_task):  # retrieved, so no "exception never retrieved" noise
                if not task.cancelled():
                    task.exception()

    @staticmethod
    def _prefill_body(body: dict, kv_params: dict) -> dict:
        p_body = dict(body)
        p_body["max_tokens"] = 1
        if "max_completion_tokens" in p_body:
            p_body["max_completion_tokens"] = 1
        p_body["stream"] = False
        p_body.pop("stream_options", None)
        p_body["kv_transfer_params"] = kv_params
        return p_body

    async def _kv_params(self, ctx: Ctx, body: dict) -> dict:
        """``--protocol kv-params``: P first; D gets the ``kv_transfer_params`` of P's answer
        (vllm-ascend's MooncakeConnectorV1 names there its side channel, engine and blocks). The
        hooks apply as in sequential order."""
        loop = asyncio.get_running_loop()
        taken = self._take_hooks()
        ctx.phase = "prefill"
        t = loop.time()
        p_out = await self._post("prefill", self.prefill, self._prefill_body(body, dict(P_KV_PARAMS)))
        self._mark(ctx, "prefill", t)
        d_params = p_out.get("kv_transfer_params")
        if not isinstance(d_params, dict) or not d_params.get("do_remote_prefill"):
            raise ProxyError(502, "no_kv_params", "prefill",
                             "P answered without kv_transfer_params for D (is P's kv_role kv_producer?)")
        d_params = {k: v for k, v in d_params.items() if k not in taken.drop}
        return await self._then_decode(ctx, taken, {**body, "kv_transfer_params": d_params})

    async def _store(self, ctx: Ctx, body: dict) -> dict:
        """``--protocol store``: P first (one token; it stores the prompt's blocks in the pool),
        then D; neither gets ``kv_transfer_params``. The hooks apply as in sequential order."""
        loop = asyncio.get_running_loop()
        taken = self._take_hooks()
        ctx.phase = "prefill"
        t = loop.time()
        p_body = self._prefill_body(body, {})
        p_body.pop("kv_transfer_params", None)
        await self._post("prefill", self.prefill, p_body)
        self._mark(ctx, "prefill", t)
        d_body = {k: v for k, v in body.items() if k != "kv_transfer_params"}
        return await self._then_decode(ctx, taken, d_body)

    async def _then_decode(self, ctx: Ctx, taken: Taken, d_body: dict) -> dict:
        """After P answered, in sequence: the ``hold`` and ``abort after_prefill`` hooks taken,
        then D."""
        loop = asyncio.get_running_loop()
        if taken.hold_s is not None:
            ctx.phase = "proxy"
            t = loop.time()
            await self._hold(taken)
            self._mark(ctx, "hold", t)
        if taken.abort_after_prefill:
            self._aborted("after_prefill")
            raise ProxyError(502, "aborted", "proxy", "the proxy did not ask D after P answered (hook)",
                             hook="after_prefill")
        ctx.phase = "decode"
        t = loop.time()
        out = await self._decode(ctx, d_body, taken)
        self._mark(ctx, "decode", t)
        return out

    async def _layerwise(self, ctx: Ctx, body: dict) -> dict:
        """``--protocol layerwise`` (vllm-ascend's decoder-first MooncakeLayerwiseConnector): D
        first, with ``X-Request-Id`` and the proxy's metaserver URL; D's scheduler POSTs its
        transfer params to ``/v1/metaserver`` (request id ``cmpl-<id>-0``), which sends P the
        request with them (``_metaserver``). The client gets D's answer, or P's error when P
        failed first (D is then closed). ``bad_params`` drops keys of what D is sent;
        ``abort decode_wait`` applies; the hooks between P and D are refused (P is asked by D's
        POST). P's request ends with the client's."""
        loop = asyncio.get_running_loop()
        taken = self._take_hooks(decode_only=True)
        rid = uuid.uuid4().hex
        key = f"cmpl-{rid}-0"
        d_params = {"do_remote_decode": False, "do_remote_prefill": True,
                    "metaserver": f"http://{self.host}:{self.port}/v1/metaserver"}
        for k in taken.drop:
            d_params.pop(k, None)
        d_body = dict(body)
        d_body["kv_transfer_params"] = d_params
        entry = {"body": dict(body), "rid": rid, "p_failed": loop.create_future(), "p_task": None, "ctx": ctx}
        self._layerwise_pending[key] = entry
        ctx.phase = "decode"
        t = loop.time()
        d_task = asyncio.ensure_future(self._decode(ctx, d_body, taken, headers={"X-Request-Id": rid}))
        answered = False
        try:
            await asyncio.wait({d_task, entry["p_failed"]}, return_when=asyncio.FIRST_COMPLETED)
            if not d_task.done():  # P failed first: its error is the answer
                ctx.phase = "prefill"
                raise entry["p_failed"].exception()
            out = d_task.result()
            answered = True
        finally:
            self._layerwise_pending.pop(key, None)
            # P's request ends with a request that failed, timed out or was cancelled; after D's
            # answer it may still be finishing (bounded by the metaserver's own deadline)
            for task in (d_task, None if answered else entry["p_task"]):
                if task is not None and not task.done():
                    task.cancel()
            if not d_task.done():
                await asyncio.wait({d_task})
            if not d_task.cancelled():
                d_task.exception()  # retrieved
            p_failed = entry["p_failed"]
            if p_failed.done() and not p_failed.cancelled() and answered:
                self._error(p_failed.exception())  # P failed after D answered: counted, not the answer
            elif not p_failed.done():
                p_failed.cancel()
        self._mark(ctx, "decode", t)
        return out

    async def _metaserver(self, request: Any) -> Any:
        """D's POST of its transfer params: P gets the client's request (one token) with them,
        once per request; answered once P answered (200 ``{}``), or with the error (404 for an
        id with no request in flight, 409 for a second POST of one, 400 for a body that is not
        a JSON object with ``request_id``, 502/504 when P failed: that error also ends the
        client's request). Counted, never logged."""
        from aiohttp import web

        def answer(status: int, type_: str, message: str) -> Any:
            return web.json_response({"error": {"type": type_, "phase": "proxy", "message": message}}, status=status)

        try:
            params = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError):
            params = None
        key = params.get("request_id") if isinstance(params, dict) else None
        if not isinstance(key, str):
            with self._lock:
                self._c["metaserver_bad"] += 1
            return answer(400, "bad_request", "metaserver: expected a JSON object with request_id")
        entry = self._layerwise_pending.get(key)
        if entry is None or entry["p_task"] is not None:
            with self._lock:
                self._c["metaserver_unknown" if entry is None else "metaserver_repeat"] += 1
            if entry is None:
                return answer(404, "unknown_request", "metaserver: no request in flight has this id")
            return answer(409, "repeated", "metaserver: this request was forwarded to P already")
        with self._lock:
            self._c["metaserver_posts"] += 1
        p_body = self._prefill_body(entry["body"], params)
        p_body["min_tokens"] = 1
        p_task = asyncio.ensure_future(self._post("prefill", self.prefill, p_body, {"X-Request-Id": entry["rid"]}))
        entry["p_task"] = p_task
        ctx = entry["ctx"]
        ctx.phase = "prefill"  # the client's request now waits on P too: a timeout names it
        try:
            await asyncio.wait({p_task}, timeout=self.timeout_s)
        except asyncio.CancelledError:
            p_task.cancel()
            raise
        finally:
            if ctx.phase == "prefill":
                ctx.phase = "decode"
        if not p_task.done():
            p_task.cancel()
            await asyncio.wait({p_task})
            err = ProxyError(504, "timeout", "prefill", f"P did not answer within {self.timeout_s:g} s")
            if not entry["p_failed"].done():
                entry["p_failed"].set_exception(err)
            return web.json_response(err.body(), status=err.status)
        if p_task.cancelled():
            return answer(503, "cancelled", "metaserver: the client's request ended before P answered")
        err = p_task.exception()
        if err is None:
            return web.json_response({})
        if not isinstance(err, ProxyError):
            err = ProxyError(502, "internal", "prefill", f"proxy error: {type(err).__name__}")
        if not entry["p_failed"].done():
            entry["p_failed"].set_exception(err)  # the client's request answers it (and counts it)
        return web.json_response(err.body(), status=err.status)

    async def _redirected(self, ctx: Ctx, body: dict, bootstrap: str) -> dict:
        """The ``redirect`` hook: no request to the real P; D is sent to ``bootstrap``."""
        loop = asyncio.get_running_loop()
        ctx.phase = "bootstrap"
        t = loop.time()
        engine_id = await self._engine_id(bootstrap, peer=True)
        self._mark(ctx, "bootstrap", t)
        taken = self._take_hooks(decode_only=True)
        d_params = {"do_remote_decode": False, "do_remote_prefill": True, "remote_bootstrap_addr": bootstrap,
                    "remote_engine_id": engine_id, "transfer_id": uuid.uuid4().hex}
        for key in taken.drop:
            d_params.pop(key, None)
        d_body = dict(body)
        d_body["kv_transfer_params"] = d_params
        ctx.phase = "decode"
        t = loop.time()
        out = await self._decode(ctx, d_body, taken)
        self._mark(ctx, "decode", t)
        return out

    async def _hold(self, taken: Taken) -> None:
        with self._lock:
            if taken.hold_gen != self._gen or self._closing:
                return  # released (or cleared) before this request reached the hold
            self._c["held"] += 1
            self._c["holding"] += 1
        ev = asyncio.Event()
        self._hold_waiters.add(ev)
        released = False
        try:
            try:
                await asyncio.wait_for(ev.wait(), taken.hold_s)
                released = True
            except asyncio.TimeoutError:
                pass
        finally:
            self._hold_waiters.discard(ev)
            with self._lock:
                self._c["holding"] -= 1
                self._c["hold_released" if released else "hold_expired"] += 1
                closing = self._closing
        if closing:
            raise ProxyError(503, "shutting_down", "proxy", "the proxy is stopping")

    def _aborted(self, hook: str) -> None:
        with self._lock:
            self._c["aborted"] += 1
            self._c["aborted_by"][hook] += 1

    async def _decode(self, ctx: Ctx, d_body: dict, taken: Taken, headers: dict | None = None) -> dict:
        ctx.d_asked = asyncio.get_running_loop().time()
        if taken.abort_decode_ms is None:
            return await self._post("decode", self.decode, d_body, headers)
        task = asyncio.ensure_future(self._post("decode", self.decode, d_body, headers))
        try:
            done, _ = await asyncio.wait({task}, timeout=taken.abort_decode_ms / 1000.0)
            if task in done:
                with self._lock:
                    self._c["abort_missed"] += 1
                return task.result()
            task.cancel()  # closes the connection to D: D sees a client that went away
            await asyncio.wait({task})
        finally:
            if not task.done():
                task.cancel()
                await asyncio.wait({task})
        self._aborted("decode_wait")
        raise ProxyError(502, "aborted", "decode",
                         f"the proxy closed its request to D after {taken.abort_decode_ms} ms (hook)",
                         hook="decode_wait")

    # ------------------------------------------------------------------ upstream calls
    async def _get_json(self, phase: str, method: str, url: str, body: dict | None = None,
                        headers: dict | None = None) -> Any:
        import aiohttp

        try:
            async with self._session.request(method, url, json=body, headers=headers) as r:
                status = r.status
                raw = await r.read()
        except aiohttp.ClientConnectorError as exc:
            why = exc.os_error.strerror if exc.os_error is not None and exc.os_error.strerror else "refused"
            raise ProxyError(502, "connect", phase, f"cannot connect to {phase}: {why}") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise ProxyError(502, "disconnected", phase, f"{phase} connection failed: {type(exc).__name__}") from None
        if status != 200:
            extra: dict[str, Any] = {"upstream_status": status}
            msg = _upstream_message(raw)
            if msg:
                extra["upstream_message"] = msg
            raise ProxyError(502, "bad_status", phase, f"{phase} answered HTTP {status}", **extra)
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise ProxyError(502, "bad_json", phase, f"{phase} answered 200 with a body that is not JSON") from None

    async def _post(self, phase: str, base: str, body: dict, headers: dict | None = None) -> dict:
        data = await self._get_json(phase, "POST", f"{base}/v1/completions", body, headers)
        if not isinstance(data, dict):
            raise ProxyError(502, "bad_json", phase, f"{phase} answered 200 with JSON that is not an object")
        return data

    async def _engine_id(self, bootstrap: str | None = None, peer: bool = False) -> str:
        """P's engine id from ``{bootstrap}/query`` (default: the real P's). ``peer``: a
        redirect's bootstrap (asked with the peer header; its engine id is not P's, so it does not
        count as a change of P's engine)."""
        url = f"{bootstrap or self.bootstrap}/query"
        data = await self._get_json("bootstrap", "GET", url, headers=PEER_HEADER if peer else None)
        if not isinstance(data, dict):
            raise ProxyError(502, "bad_json", "bootstrap", "bootstrap /query: expected a JSON object")
        entry = data.get("0")
        engine_id = entry.get("engine_id") if isinstance(entry, dict) else None
        if not isinstance(engine_id, str) or not engine_id:
            raise ProxyError(502, "no_engine", "bootstrap",
                             "bootstrap /query has no engine id for dp rank 0 (P's worker not registered)")
        if peer:
            return engine_id
        with self._lock:
            if self._last_engine is not None and engine_id != self._last_engine:
                self._c["engine_id_changes"] += 1
            self._last_engine = engine_id
        return engine_id


def _upstream_message(raw: bytes) -> str | None:
    """The message of an upstream error body (vLLM: {"error": {"message"}} or {"message"}), cut
    short; only ever put in the client's answer, never logged."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    msg = None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            msg = err.get("message")
        elif isinstance(err, str):
            msg = err
        msg = msg if isinstance(msg, str) else data.get("message") if isinstance(data.get("message"), str) else None
        if msg is None and isinstance(data.get("detail"), str):
            msg = data["detail"]
    return msg[:_UPSTREAM_MESSAGE_CHARS] if msg else None


def run_node(args: argparse.Namespace) -> int:
    def build() -> PDProxy:
        if not 1 <= args.port <= 65535:
            raise NodeUsageError("--port: must be in [1, 65535]")
        if not 0 < args.timeout_s <= 86400:
            raise NodeUsageError("--timeout-s: must be a number of seconds in (0, 86400]")
        prefill = check_url(args.prefill, "--prefill")
        bootstrap = check_url(args.prefill_bootstrap, "--prefill-bootstrap")
        decode = check_url(args.decode, "--decode")
        return PDProxy(port=args.port, prefill=prefill, bootstrap=bootstrap, decode=decode,
                       timeout_s=args.timeout_s, order=args.order, protocol=args.protocol, host=args.host)

    return run_node_process(build, endpoints={"--port": f"tcp://{args.host}:{args.port}"}, bind_flag="--port",
                            control=args.control, log_level=args.log_level)
