"""Node kind ``layerwise-metaserver``: the proxy's metaserver endpoint, under the nemesis' control.

In vllm-ascend's decoder-first flow the proxy sends a request to D first; D's scheduler
(``update_state_after_alloc``) POSTs its transfer params to the proxy's metaserver, and the proxy
forwards the request with those params to P. Upstream ships that endpoint only in an example proxy
script (``examples/disaggregated_prefill_v1/``), not in the package: pd-chaos models it here, the
way the example does its job (take the POST, forward to P, answer), so that what is tested is the
caller's side, D's real POST.

``POST /v1/metaserver`` with D's params: forwarded to P (its ``submit`` control command, the
rewrite ``--decode-via`` applied to the address P dials D at: the link under test). Two
behaviours (``--behaviour``):

* ``pdchaos`` (default): 200 once P queued the request, 502 when the forward failed;
* ``upstream-example``: what vllm-ascend 0.23.0's example proxy
  (``load_balance_proxy_layerwise_server_example.py``, ``/v1/metaserver``) does: the forward is P's
  whole completion (the answer waits until P is done with the request: ``forwarded`` polled, no
  deadline of its own; bounded here by ``WAIT_CAP_S`` so a node never hangs), a failed one is
  sent again up to 3 times in all, 0.2 s then 0.4 s apart (``send_request_to_service``: a request
  P may already have taken goes to P again), and the answer is **200 whatever happened** (its
  handler catches every exception and returns nothing).

Modes (``metaserver_fault`` {mode}): ``ok``; ``error`` answers 500; ``hang`` reads the request and
never answers (until the mode changes or the node stops); ``drop`` closes the connection without
an answer; ``forward_fails``: every forward to P fails (P refusing or unreachable from the proxy),
answered as the behaviour answers a failed forward. Counters only (posts by outcome); never logs
the params.
"""

from __future__ import annotations

import argparse
import http.server
import json
import logging
import sys
import threading
import time

MODES = ("ok", "error", "hang", "drop", "forward_fails")
BEHAVIOURS = ("pdchaos", "upstream-example")
WAIT_CAP_S = 120.0  # upstream-example: the longest a POST waits for P's completion
POLL_S = 0.01
RETRIES, RETRY_DELAY_S = 3, 0.2  # the example proxy's max_retries and retry_delay defaults
SEEN_MAX = 65536
log = logging.getLogger(__name__)


def add_node_arguments(p: argparse.ArgumentParser, kind: str) -> None:  # noqa: ARG001
    p.add_argument("--port", type=int, required=True, help="HTTP port on 127.0.0.1")
    p.add_argument("--prefill-control", required=True, help="P's control endpoint (ipc://...)")
    p.add_argument("--decode-via", default="", help="host:port P dials D's listener at (a link in between)")
    p.add_argument("--behaviour", default="pdchaos", choices=BEHAVIOURS,
                   help="pdchaos: 200 once P queued it, 502 on a failed forward; upstream-example: vllm-ascend's "
                        "example proxy (waits for P's completion, re-sends a failed forward, always 200)")
    p.add_argument("--control", default=None)
    p.add_argument("--log-level", default="INFO")


class Metaserver:
    def __init__(self, port: int, prefill_control: str, decode_via: str, behaviour: str = "pdchaos"):
        from nodekit.control import ControlClient

        self.port, self.decode_via, self.behaviour = port, decode_via, behaviour
        self.prefill = ControlClient(prefill_control)
        self._prefill_lock = threading.Lock()
        self.mode = "ok"
        self.changed = threading.Condition()
        self.stopping = False
        self.counters = {"posts": 0, "forwarded": 0, "forward_errors": 0, "answered_500": 0, "hung": 0,
                         "dropped": 0, "bad_requests": 0, "resent": 0, "ok_after_failed_forward": 0,
                         "forward_wait_ms_max": 0, "repeat_posts": 0}
        self._seen: dict[str, None] = {}  # request ids POSTed so far (the last SEEN_MAX): a repeat is counted
        self.httpd: http.server.ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    def note_request(self, request_id: object) -> None:
        """Count a POST for a request id already POSTed (D sent it twice: the proxy would ask P twice)."""
        rid = str(request_id)
        with self.changed:
            if rid in self._seen:
                self.counters["repeat_posts"] += 1
                return
            self._seen[rid] = None
            if len(self._seen) > SEEN_MAX:
                del self._seen[next(iter(self._seen))]

    def set_mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"metaserver mode {mode!r}; known: {', '.join(MODES)}")
        with self.changed:
            self.mode = mode
            self.changed.notify_all()

    def _call(self, cmd: str, **fields) -> dict:
        with self._prefill_lock:
            return self.prefill.call(cmd, timeout_ms=2000, **fields)

    def _forward_once(self, params: dict, wait: bool) -> bool:
        if self.mode == "forward_fails":
            return False
        try:
            reply = self._call("submit", params=params)
            if not reply.get("queued"):
                return False
            if not wait:
                return True
            t0 = time.monotonic()
            while time.monotonic() - t0 < WAIT_CAP_S and not self.stopping:
                state = self._call("forwarded", ticket=int(reply["ticket"]))
                if state.get("done"):
                    ms = round((time.monotonic() - t0) * 1000)
                    self.counters["forward_wait_ms_max"] = max(self.counters["forward_wait_ms_max"], ms)
                    return bool(state.get("sent"))
                time.sleep(POLL_S)
            return False
        except Exception as exc:
            log.error("metaserver: forward to P failed (%s)", type(exc).__name__)
            return False

    def forward(self, params: dict) -> bool:
        if self.decode_via:
            host, _, port = self.decode_via.rpartition(":")
            params = dict(params, remote_host=host, remote_port=int(port))
        if self.behaviour == "pdchaos":
            return self._forward_once(params, wait=False)
        for attempt in range(1, RETRIES + 1):  # the example proxy's send_request_to_service
            if self._forward_once(params, wait=True):
                return True
            if attempt < RETRIES:
                self.counters["resent"] += 1
                with self.changed:
                    if self.changed.wait_for(lambda: self.stopping, RETRY_DELAY_S * 2 ** (attempt - 1)):
                        return False
        return False

    def handler(self) -> type:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # noqa: ARG002 - no request lines in the log
                pass

            def _answer(self, code: int, body: dict | None) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                server.counters["posts"] += 1
                try:
                    n = int(self.headers.get("content-length") or 0)
                    params = json.loads(self.rfile.read(n) or b"{}")
                    if not isinstance(params, dict):
                        raise ValueError("not an object")
                except Exception:
                    server.counters["bad_requests"] += 1
                    self._answer(400, {"error": "bad request"})
                    return
                server.note_request(params.get("request_id"))
                mode = server.mode
                if mode == "error":
                    server.counters["answered_500"] += 1
                    self._answer(500, {"error": "metaserver failed (injected)"})
                elif mode == "drop":
                    server.counters["dropped"] += 1
                    self.close_connection = True
                elif mode == "hang":
                    server.counters["hung"] += 1
                    with server.changed:
                        server.changed.wait_for(lambda: server.mode != "hang" or server.stopping)
                    self.close_connection = True  # the caller waited; it never gets an answer
                elif server.forward(params):
                    server.counters["forwarded"] += 1
                    self._answer(200, {"ok": True})
                elif server.behaviour == "upstream-example":
                    server.counters["forward_errors"] += 1
                    server.counters["ok_after_failed_forward"] += 1
                    self._answer(200, None)  # the example's handler returns nothing: 200, body null
                else:
                    server.counters["forward_errors"] += 1
                    self._answer(502, {"error": "forward to prefill failed"})

        return Handler

    def bind(self) -> None:
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), self.handler())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                       name="metaserver", daemon=True)
        self.thread.start()

    def close(self) -> None:
        with self.changed:
            self.stopping = True
            self.changed.notify_all()
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
        self.prefill.close()


def run_node(args: argparse.Namespace) -> int:
    from nodekit.nodeio import NodeApp, NodeUsageError, run_node as run_node_process

    def build() -> NodeApp:
        if not 1024 <= args.port <= 65535:
            raise NodeUsageError("--port: a port in 1024..65535")
        if not args.prefill_control.startswith("ipc://"):
            raise NodeUsageError("--prefill-control: an ipc:// endpoint")
        ms = Metaserver(args.port, args.prefill_control, args.decode_via, args.behaviour)

        class App(NodeApp):
            def bind(self) -> None:
                try:
                    ms.bind()
                except OSError as exc:
                    import zmq

                    raise zmq.ZMQError(exc.errno or 98, str(exc)) from None

            def close(self) -> None:
                ms.close()

            def stats(self) -> dict:
                return {"counters": dict(ms.counters, mode=MODES.index(ms.mode)),
                        "alive": bool(ms.thread and ms.thread.is_alive())}

            def handlers(self) -> dict:
                def metaserver_fault(m: dict) -> dict:
                    ms.set_mode(str(m.get("mode", "ok")))
                    return {"mode": ms.mode}

                return {"metaserver_fault": metaserver_fault}

            def ready_message(self) -> str:
                return f"metaserver serving ({ms.behaviour})"

        return App()

    return run_node_process(build, endpoints={}, bind_flag="--port", control=args.control,
                            log_level=args.log_level)


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="pdchaos node layerwise-metaserver")
    add_node_arguments(p, "layerwise-metaserver")
    sys.exit(run_node(p.parse_args()))
