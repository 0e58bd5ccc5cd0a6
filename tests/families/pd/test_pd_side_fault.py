"""The side_channel_garbage fault against a real ZMQ ROUTER behind a real bootstrap /query: it
finds the side channel the way D does, sends one message of N frames, records whether P answered,
and taints P so the pool never lends it."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
import zmq

from families.pd.side_faults import SideChannelGarbage, SideGarbageParams

pytestmark = pytest.mark.timeout(30)


class Ctx:
    def __init__(self, bootstrap: str):
        self.events: list[tuple[str, dict]] = []
        self.tainted: list[str] = []
        self._node = SimpleNamespace(endpoints={"bootstrap": bootstrap})

    def node(self, role: str):
        assert role == "prefill:0"
        return self._node

    def taint(self, role: str, why: str) -> None:
        self.tainted.append(role)

    def event(self, what: str, **fields) -> None:
        self.events.append((what, fields))


def _bootstrap(side_channel: str) -> ThreadingHTTPServer:
    """A bootstrap server whose /query names ``side_channel`` as P's (rank 0), serving in a thread."""
    entry = {"0": {"engine_id": "e", "worker_addr": {"0": {"0": side_channel}}}}

    class H(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = json.dumps(entry).encode()
            self.send_response(200 if self.path == "/query" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    return http


@pytest.fixture
def peer():
    zc = zmq.Context()
    router = zc.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    http = _bootstrap(f"tcp://127.0.0.1:{port}")
    yield router, f"http://127.0.0.1:{http.server_address[1]}"
    http.shutdown()
    router.close(0)
    zc.term()


@pytest.mark.parametrize("answer", [True, False])
def test_garbage_reaches_the_router_with_its_frames_and_the_answer_is_recorded(peer, answer) -> None:
    router, bootstrap = peer
    got: list = []

    def serve() -> None:
        if router.poll(5000):
            frames = router.recv_multipart()
            got.append(len(frames))
            if answer:
                router.send_multipart([frames[0], b"nack"])

    t = threading.Thread(target=serve)
    t.start()
    ctx = Ctx(bootstrap)
    fault = SideChannelGarbage(SideGarbageParams(frames=3), ctx)
    fault.inject()
    t.join(5)
    assert got == [3]  # identity + 2 frames: what vLLM's listener cannot unpack
    assert ctx.tainted == ([] if answer else ["prefill:0"])  # no answer: its listener may be gone
    # a listener that answered lives: the window's tail is short, not the declared LASTING one
    assert fault.tail_after_heal() == (1.0 if answer else None)
    what, fields = ctx.events[-1]
    assert what == "side_channel_garbage" and fields["frames"] == 3
    assert fields["answered"] is answer and (fields["reply_bytes"] == 4) is answer


def test_a_bootstrap_that_fails_taints_p() -> None:
    ctx = Ctx("http://127.0.0.1:9")  # nothing listens: the fault cannot send, P is not lent on
    with pytest.raises(Exception):
        SideChannelGarbage(SideGarbageParams(frames=3), ctx).inject()
    assert ctx.tainted == ["prefill:0"]


def test_frames_must_be_at_least_two() -> None:
    with pytest.raises(ValueError):
        SideGarbageParams(frames=1)


def test_no_session_with_p_means_nothing_sent_and_no_effect(monkeypatch):
    """The side channel /query names is not served (a runtime's forward that found no pod, a P gone):
    the DEALER would queue the message and say nothing, so the fault sends nothing and its effect
    says so (``sent`` 0: fault_effect then fails the window), and P is tainted (its state unknown)."""
    import socket

    import families.pd.side_faults as sf

    monkeypatch.setattr(sf, "HANDSHAKE_WAIT_MS", 500)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    http = _bootstrap(f"tcp://127.0.0.1:{dead}")
    try:
        ctx = Ctx(f"http://127.0.0.1:{http.server_address[1]}")
        f = SideChannelGarbage(SideGarbageParams(frames=3), ctx)
        f.inject()
        assert f.effect() == {"sent": 0, "answered": 0}
        assert ctx.events[-1][1]["session"] == 0 and ctx.tainted == ["prefill:0"]
    finally:
        http.shutdown()


class BesidePlacement:
    """A runtime whose nodes this machine cannot reach at the addresses they announce: the send
    runs elsewhere, as ``python -m families.pd.side_faults`` in a process of its own (a cluster runs
    that command in D's pod through exec)."""

    def __init__(self, p_host: str | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.p_host = p_host

    def host(self, role: str) -> str | None:
        """Where peers reach ``role`` now (a cluster without DNS: its pod's address)."""
        return self.p_host if role == "prefill:0" else None

    def run_beside(self, role: str, module: str, args: list[str], timeout_s: float) -> str:
        import subprocess
        import sys
        from pathlib import Path

        self.calls.append((role, module))
        out = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                             timeout=timeout_s, cwd=Path(__file__).resolve().parents[3])
        assert out.returncode == 0 and not out.stderr.strip(), out.stderr
        return out.stdout


@pytest.mark.parametrize("answer", [True, False])
def test_run_beside_d_the_module_sends_it_and_hands_back_its_counts(peer, answer) -> None:
    router, bootstrap = peer
    got: list = []

    def serve() -> None:
        if router.poll(15000):
            frames = router.recv_multipart()
            got.append(len(frames))
            if answer:
                router.send_multipart([frames[0], b"nack"])

    t = threading.Thread(target=serve)
    t.start()
    # P's endpoint as it was named before it ran (a Service name no DNS here resolves): the send
    # goes where peers reach P now, the placement's host for it
    ctx = Ctx(bootstrap.replace("127.0.0.1", "prefill-0.pdchaos-r1.svc"))
    ctx.placement = BesidePlacement(p_host="127.0.0.1")
    fault = SideChannelGarbage(SideGarbageParams(frames=4), ctx)
    fault.inject()
    t.join(15)
    assert ctx.placement.calls == [("decode:0", "families.pd.side_faults")]
    assert got == [4]
    assert fault.effect() == {"sent": 1, "answered": int(answer)}
    assert ctx.tainted == ([] if answer else ["prefill:0"])
    what, fields = ctx.events[-1]
    assert what == "side_channel_garbage" and fields["answered"] is answer and (fields["reply_bytes"] == 4) is answer


def test_run_beside_a_bootstrap_that_fails_is_one_error_and_taints_p() -> None:
    ctx = Ctx("http://127.0.0.1:9")
    ctx.placement = BesidePlacement()
    with pytest.raises(RuntimeError, match=r"^side_channel_garbage: (ConnectionRefusedError|URLError|OSError)"):
        SideChannelGarbage(SideGarbageParams(frames=3), ctx).inject()
    assert ctx.tainted == ["prefill:0"]


def test_the_module_refuses_bad_arguments_in_one_line() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "families.pd.side_faults", "http://x"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 2 and json.loads(out.stdout) == {"error": "usage: BOOTSTRAP_URL FRAMES"}
    assert out.stderr == ""
