"""The stand-in control channel for a vLLM server the harness did not start (families/pd/attached.py),
over a real ZMQ socket, against a real HTTP server serving /health and /metrics as vLLM does."""

from __future__ import annotations

import http.server
import threading

import pytest

from families.pd.attached import AttachedControl
from nodekit.control import ControlClient, ControlError

pytestmark = pytest.mark.timeout(30)

METRICS = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
"""


class _Server(http.server.BaseHTTPRequestHandler):
    healthy = True

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path == "/health":
            self.send_response(200 if self.healthy else 503)
            self.end_headers()
        elif self.path == "/metrics":
            body = METRICS.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_response(404)
            self.end_headers()

    def log_message(self, *a):  # quiet
        pass


class _Handle:
    """A node handle that counts (a pod's /proc through exec, in attach mode), or cannot (None)."""

    def __init__(self, counts):
        self.counts, self.calls = counts, 0

    def proc_counts(self):
        self.calls += 1
        return self.counts


@pytest.fixture
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _control(tmp_path, url, handle):
    ep = f"ipc://{tmp_path}/ctl.sock"
    return AttachedControl(ep, "decode:0", lambda: url, lambda: handle).start(), ControlClient(ep)


def test_stats_come_from_metrics_and_the_handles_counts(tmp_path, server):
    handle = _Handle({"threads": 40, "fds": 120, "processes": 3, "cpu_s": 12.5})
    ctl, client = _control(tmp_path, server, handle)
    try:
        st = client.call("stats", timeout_ms=5000)
        assert st["alive"] is True and st["attached"] == 1
        assert (st["threads"], st["fds"], st["cpu_s"]) == (40, 120, 12.5)
        c = st["counters"]
        assert c["metrics_ok"] == 1 and c["cpu_s"] == 12.5
        assert c["num_requests_running"] == 2.0 and c["kv_cache_usage_perc"] == 0.25
        client.call("stats", timeout_ms=5000)
        assert handle.calls == 1, "counted at most every COUNT_EVERY_S (exec is not free)"
    finally:
        client.close()
        ctl.close()


def test_a_node_that_cannot_be_counted_reads_minus_one(tmp_path, server):
    ctl, client = _control(tmp_path, server, _Handle(None))
    try:
        st = client.call("stats", timeout_ms=8000)
        assert st["alive"] is True
        assert (st["threads"], st["fds"], st["cpu_s"]) == (-1, -1, -1.0), "unknown, never a healthy-looking 0"
    finally:
        client.close()
        ctl.close()


def test_a_server_that_does_not_answer_health_gets_no_stats_answer(tmp_path):
    ctl, client = _control(tmp_path, "http://127.0.0.1:9", _Handle({"threads": 1, "fds": 1, "processes": 1,
                                                                    "cpu_s": 0.0}))  # nothing listens on 9
    try:
        with pytest.raises(ControlError, match="does not answer /health"):
            client.call("stats", timeout_ms=8000)
    finally:
        client.close()
        ctl.close()


def test_commands_that_change_a_user_process_are_refused_by_name(tmp_path, server):
    ctl, client = _control(tmp_path, server, _Handle(None))
    try:
        with pytest.raises(ControlError, match="attach mode"):
            client.call("rank_signal", rank=0, signal="STOP", timeout_ms=5000)
    finally:
        client.close()
        ctl.close()
