"""Node ``pd-fake-prefill``: a prefill peer that D trusts and that answers D wrongly, on purpose.

It plays the two things a vLLM 0.32 prefill node with the ``MooncakeConnector`` shows D (read
from ``vllm/distributed/kv_transfer/kv_connector/v1/mooncake/``):

**(a) the Mooncake bootstrap server** on ``127.0.0.1:--bootstrap-port`` (``mooncake_utils.py``
``MooncakeBootstrapServer``): ``GET /query`` answers ``dict[int, EngineEntry]`` as JSON,
``{"0": {"engine_id": E, "worker_addr": {"0": {"0": "tcp://127.0.0.1:SIDE"}}}}`` (dp rank ->
engine id and ``{tp_rank: {pp_rank: side-channel address}}``). D's worker
(``_connect_to_prefiller_bootstrap``, called by ``handle_new_engine_id`` when a request names an
engine it does not know) GETs ``{remote_bootstrap_addr}/query`` with httpx, calls
``raise_for_status()``, registers every entry's ``worker_addr`` under its ``engine_id`` and then
fails every pending request whose ``remote_engine_id`` is not among them. E is a fresh uuid4 per
process (like vLLM's random engine id); it is never logged.

**(b) the side channel**: a ZMQ ROUTER bound on ``tcp://127.0.0.1:--side-port``. D's worker
(``receive_kv_from_single_worker``) connects a DEALER to the address above, sends one frame,
``msgspec.msgpack`` of ``MooncakeXferMetadata`` (a msgpack map: ``remote_hostname``,
``remote_port``, ``remote_tp_size``, ``remote_tp_rank``, ``req_blocks: {d_req_id: [transfer_id,
[[block ids]]]}``, ``kv_caches_base_addr``, ``block_lens``, ``kv_block_lens``, ...), so the ROUTER
receives ``[identity, payload]``; P answers ``[identity, reply]`` where the reply is
``MooncakeXferResponse`` (a msgpack map, defaults omitted: ``status`` FINISH=0 | CONTINUE=1 |
ERROR=2, ``ok_reqs``, ``err_reqs``, ``err_msg``). D reads replies with ``RCVTIMEO =
(VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT + 60) s`` until FINISH or ERROR.

``--mode`` says how it answers (changed at run time with the control command ``mode``):

- ``garbage``: the reply is bytes that are not msgpack (``0xc1`` is never used by msgpack);
- ``error``: a well-formed ``{"status": 2, "err_msg": ...}`` (what P sends when it cannot serve);
- ``unknown``: ``{"status": 0, "err_reqs": [ids D never asked for], "err_msg": ...}`` — FINISH
  that names none of D's requests;
- ``other``: ``{"status": 0, "ok_reqs": [id]}`` — FINISH "ok" for another request id (the id of
  an earlier pull this fake saw, or a made-up one), never for the ones D asked for;
- ``silent``: no reply at all (D waits until its RCVTIMEO);
- ``bootstrap_500``: ``/query`` answers HTTP 500 (the side channel answers ``error`` if reached);
- ``unknown_engine``: ``/query`` names another engine id (a second uuid4) than E, with this
  fake's side channel (the side channel answers ``error`` if reached).

The project's proxy (``redirect`` hook, families/pd/proxy.py) reads E from this
``/query`` too, before it sends D ``remote_engine_id=E``: its query carries the header
``X-PDChaos-Peer: proxy`` and always gets the true entry, whatever the mode, so the mode decides
only what **D** later finds (a bootstrap that broke, or an engine restarted, between the proxy's
query and D's). A pull that is not one frame of a msgpack map with ``req_blocks`` is counted
``malformed_pulls`` and answered ``error`` (as vLLM's P answers an undecodable pull), unless
silent. Any other path or method on the bootstrap port: 404.

Control ``stats``: ``mode``, ``engine_id_set`` (never the id itself) and ``counters``: queries,
query_answers by kind (``ok``, ``proxy``, ``http_500``, ``unknown_engine``, ``not_found``),
pulls, pull_reqs (request ids asked for), malformed_pulls, answers by mode (``garbage``,
``error``, ``unknown``, ``other``), unanswered (silent), mode_changes. Logs carry counts, modes and
codes only: never raw frames, request, transfer or engine ids.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from nodekit.nodeio import NodeApp, NodeUsageError, check_endpoint, run_node as run_node_process

logger = logging.getLogger(__name__)

SIDE_MODES = ("garbage", "error", "unknown", "other", "silent")
BOOTSTRAP_MODES = ("bootstrap_500", "unknown_engine")
MODES = SIDE_MODES + BOOTSTRAP_MODES
PEER_HEADER = "X-PDChaos-Peer"  # the proxy's redirect hook sends "proxy": it gets the true entry

# vLLM 0.32 MooncakeXferResponseStatus
FINISH, CONTINUE, ERROR = 0, 1, 2
GARBAGE = b"\xc1\xc1 fake prefill: not msgpack \xc1"  # 0xc1 is "never used" in msgpack


def add_node_arguments(p: argparse.ArgumentParser, kind: str) -> None:  # noqa: ARG001
    p.add_argument("--bootstrap-port", type=int, required=True,
                   help="TCP port of the fake Mooncake bootstrap server (GET /query), 127.0.0.1 only")
    p.add_argument("--side-port", type=int, required=True,
                   help="TCP port of the fake side channel (ZMQ ROUTER)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address both listen on (default 127.0.0.1; 0.0.0.0 in a pod, nodekit/nodeio.py)")
    p.add_argument("--advertise-host", default=None,
                   help="the address the side channel is announced at in bootstrap answers (default --host; "
                        "a pod's own address in a pod)")
    p.add_argument("--mode", required=True, choices=MODES, help="how D is answered: " + ", ".join(MODES))
    p.add_argument("--control", help="ipc endpoint of the harness control channel")
    p.add_argument("--log-level", default="INFO")


def _check_mode(value: Any) -> str:
    if value not in MODES:
        raise ValueError(f"mode: expected one of {', '.join(MODES)}")
    return value


class _Http(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True  # a port in TIME_WAIT can be bound again; a listening one cannot (Linux)
    fake: "FakePrefill"


class _Handler(BaseHTTPRequestHandler):
    server: _Http
    protocol_version = "HTTP/1.0"  # one request per connection: nothing to keep open at close

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - counted, not logged
        pass

    def _send(self, status: int, body: Any) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:  # noqa: N802
        if self.path.split("?", 1)[0] != "/query":
            self.server.fake.count_query("not_found")
            self._send(404, {"detail": "Not Found"})
            return
        status, body = self.server.fake.query_answer(self.headers.get(PEER_HEADER) == "proxy")
        self._send(status, body)

    def do_POST(self) -> None:  # noqa: N802 - /register and anything else: this fake takes no worker
        self.server.fake.count_query("not_found")
        self._send(404, {"detail": "Not Found"})


class FakePrefill(NodeApp):
    def __init__(self, *, bootstrap_port: int, side_port: int, mode: str, host: str = "127.0.0.1",
                 advertise: str | None = None):
        self.host = host
        self.bootstrap_port = bootstrap_port
        self.side_port = side_port
        self.bind_addr = f"tcp://{host}:{side_port}"
        self.side_addr = f"tcp://{advertise or host}:{side_port}"  # what bootstrap answers announce
        self.mode = _check_mode(mode)
        self.engine_id = str(uuid.uuid4())
        self.other_engine_id = str(uuid.uuid4())
        self._lock = threading.Lock()
        self._last_ids: list[str] = []  # request ids of the last pull (for mode "other"); never logged
        self._c: dict[str, Any] = {
            "queries": 0, "query_answers": {"ok": 0, "proxy": 0, "http_500": 0, "unknown_engine": 0, "not_found": 0},
            "pulls": 0, "pull_reqs": 0, "malformed_pulls": 0,
            "answers": {"garbage": 0, "error": 0, "unknown": 0, "other": 0}, "unanswered": 0, "mode_changes": 0,
        }
        self._http: _Http | None = None
        self._http_thread: threading.Thread | None = None
        self._zctx: Any = None
        self._sock: Any = None

    # ------------------------------------------------------------------ lifecycle
    def listen_http(self) -> None:
        """Bind the bootstrap port (before :meth:`bind`, so a taken port is a usage error that
        names ``--bootstrap-port``)."""
        try:
            self._http = _Http((self.host, self.bootstrap_port), _Handler)
        except OSError as exc:
            raise NodeUsageError(f"--bootstrap-port: cannot bind {self.host}:{self.bootstrap_port}: "
                                 f"{exc.strerror or exc}") from None
        self._http.fake = self

    def bind(self) -> None:
        import zmq

        self._zctx = zmq.Context()
        self._sock = self._zctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(self.bind_addr)
        if self._http is None:
            self.listen_http()
        self._http_thread = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.2},
                                             name="fake-bootstrap", daemon=True)
        self._http_thread.start()

    def serve(self, stop: threading.Event) -> None:
        import zmq

        while not stop.is_set():
            try:
                if not self._sock.poll(100, zmq.POLLIN):
                    continue
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                continue
            except zmq.ZMQError as exc:
                logger.error("fake-prefill: side channel: %s", exc.strerror)
                return
            self._on_pull(frames)

    def close(self) -> None:
        if self._http is not None:
            if self._http_thread is not None:
                self._http.shutdown()
                self._http_thread.join(5.0)
            self._http.server_close()
            self._http = None
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None
        if self._zctx is not None:
            self._zctx.term()
            self._zctx = None

    def ready_message(self) -> str:
        return (f"pd-fake-prefill ready: bootstrap port {self.bootstrap_port}, side port {self.side_port}, "
                f"mode {self.mode}")

    def stop_message(self) -> str:
        c = self.stats()["counters"]
        return (f"pd-fake-prefill stopping: queries={c['queries']} pulls={c['pulls']} "
                f"answers={sum(c['answers'].values())} unanswered={c['unanswered']}")

    # ------------------------------------------------------------------ control
    def stats(self) -> dict:
        with self._lock:
            return {"mode": self.mode, "engine_id_set": bool(self.engine_id),
                    "counters": json.loads(json.dumps(self._c))}

    def handlers(self) -> dict[str, Callable[[dict], dict]]:
        return {"mode": self._cmd_mode}

    def _cmd_mode(self, m: dict) -> dict:
        mode = _check_mode(m.get("mode"))
        with self._lock:
            previous, self.mode = self.mode, mode
            if mode != previous:
                self._c["mode_changes"] += 1
        logger.info("fake-prefill: mode %s -> %s", previous, mode)
        return {"mode": mode, "previous": previous}

    # ------------------------------------------------------------------ bootstrap (HTTP threads)
    def count_query(self, kind: str) -> None:
        with self._lock:
            self._c["queries"] += 1
            self._c["query_answers"][kind] += 1

    def _entry(self, engine_id: str) -> dict:
        return {"0": {"engine_id": engine_id, "worker_addr": {"0": {"0": self.side_addr}}}}

    def query_answer(self, from_proxy: bool) -> tuple[int, Any]:
        with self._lock:
            mode = self.mode
        if from_proxy:
            kind, answer = "proxy", (200, self._entry(self.engine_id))
        elif mode == "bootstrap_500":
            kind, answer = "http_500", (500, {"detail": "fake prefill: bootstrap failure"})
        elif mode == "unknown_engine":
            kind, answer = "unknown_engine", (200, self._entry(self.other_engine_id))
        else:
            kind, answer = "ok", (200, self._entry(self.engine_id))
        self.count_query(kind)
        logger.info("fake-prefill: /query answered %d (%s)", answer[0], kind)
        return answer

    # ------------------------------------------------------------------ side channel (serve thread)
    def _on_pull(self, frames: list[bytes]) -> None:
        import msgpack

        ids: list[str] | None = None
        if len(frames) == 2:
            try:
                meta = msgpack.unpackb(frames[1], raw=False, strict_map_key=False)
            except Exception:  # noqa: BLE001 - any undecodable pull is counted, never fatal
                meta = None
            blocks = meta.get("req_blocks") if isinstance(meta, dict) else None
            if isinstance(blocks, dict) and all(isinstance(k, str) for k in blocks):
                ids = list(blocks)
        with self._lock:
            mode = self.mode
            self._c["pulls"] += 1
            if ids is None:
                self._c["malformed_pulls"] += 1
            else:
                self._c["pull_reqs"] += len(ids)
            earlier = [i for i in self._last_ids if ids is None or i not in ids]
            if ids:
                self._last_ids = ids
        if mode == "silent":
            with self._lock:
                self._c["unanswered"] += 1
            logger.info("fake-prefill: pull of %s request(s): no answer (silent)", len(ids) if ids else "?")
            return
        answer_mode = mode if mode in SIDE_MODES and ids is not None else "error"
        if answer_mode == "garbage":
            reply = GARBAGE
        elif answer_mode == "unknown":
            made_up = [f"fake-unknown-{uuid.uuid4().hex}" for _ in range(max(1, len(ids or ())))]
            reply = msgpack.packb({"status": FINISH, "err_reqs": made_up,
                                   "err_msg": "fake prefill: finished requests you did not ask for"})
        elif answer_mode == "other":
            other = earlier[:1] or [f"fake-other-{uuid.uuid4().hex}"]
            reply = msgpack.packb({"status": FINISH, "ok_reqs": other})
        else:
            reply = msgpack.packb({"status": ERROR, "err_msg": "fake prefill: cannot serve this pull"})
        with self._lock:  # counted before it goes: whoever reads the reply and then the counters sees it
            self._c["answers"][answer_mode] += 1
        try:
            self._sock.send_multipart([frames[0], reply])
        except Exception as exc:  # noqa: BLE001 - D went away: counted as unanswered
            with self._lock:
                self._c["answers"][answer_mode] -= 1
                self._c["unanswered"] += 1
            logger.warning("fake-prefill: reply not sent: %s", type(exc).__name__)
            return
        logger.info("fake-prefill: pull of %s request(s): answered %s", len(ids) if ids is not None else "?",
                    answer_mode)


def run_node(args: argparse.Namespace) -> int:
    def build() -> FakePrefill:
        for flag, port in (("--bootstrap-port", args.bootstrap_port), ("--side-port", args.side_port)):
            if not 1 <= port <= 65535:
                raise NodeUsageError(f"{flag}: {port} is not a TCP port in [1, 65535]")
        if args.bootstrap_port == args.side_port:
            raise NodeUsageError(f"--side-port: {args.side_port} is also the --bootstrap-port; give two ports")
        check_endpoint(f"tcp://{args.host}:{args.bootstrap_port}", "--host")  # the bootstrap server's address
        if args.advertise_host:
            check_endpoint(f"tcp://{args.advertise_host}:{args.side_port}", "--advertise-host")
        node = FakePrefill(bootstrap_port=args.bootstrap_port, side_port=args.side_port, mode=args.mode,
                           host=args.host, advertise=args.advertise_host)
        node.listen_http()  # last: a taken bootstrap port is one error line, exit 2
        return node

    return run_node_process(build, endpoints={"--side-port": f"tcp://{args.host}:{args.side_port}"},
                            bind_flag="--side-port", control=args.control, log_level=args.log_level)
