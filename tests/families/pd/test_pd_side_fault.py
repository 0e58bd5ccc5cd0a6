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



def _serve_once(router, answer: bool, got: list, wait_ms: int) -> threading.Thread:
    """P's ROUTER in a thread: takes one message (its frame count into ``got``) and answers it or not."""
    def serve() -> None:
        if router.poll(wait_ms):
            frames = router.recv_multipart()
            got.append(len(frames))
            if answer:
                router.send_multipart([frames[0], b"nack"])

    t = threading.Thread(target=serve)
    t.start()
    return t

@pytest.mark.parametrize("answer", [True, False])
def test_garbage_reaches_the_router_with_its_frames_and_the_answer_is_recorded(peer, answer) -> None:
    router, bootstrap = peer
    got: list = []
    t = _serve_once(router, answer, got, 5000)
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
    t = _serve_once(router, answer, got, 15000)
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


class Started:
    """A sender started beside D and kept running (``Placement.start_beside``): here a process of its
    own, spoken to over its stdin and stdout as a cluster's exec session is."""

    def __init__(self, module: str, args: list[str]) -> None:
        import subprocess
        import sys
        from pathlib import Path

        self.proc = subprocess.Popen([sys.executable, "-m", module, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     cwd=Path(__file__).resolve().parents[3])
        self.written: list[str] = []

    def readline(self, timeout_s: float) -> str:
        return self.proc.stdout.readline().rstrip("\n")

    def write(self, line: str) -> None:
        self.written.append(line)
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        self.proc.wait(15)


class StartingPlacement(BesidePlacement):
    def __init__(self, p_host: str | None = None) -> None:
        super().__init__(p_host)
        self.started: list[Started] = []

    def start_beside(self, role: str, module: str, args: list[str], timeout_s: float) -> Started:
        self.calls.append((role, module))
        self.started.append(Started(module, args))
        return self.started[-1]


@pytest.mark.parametrize("answer", [True, False])
def test_a_sender_started_in_prepare_has_its_session_before_the_window_and_sends_only_at_the_signal(
        peer, answer) -> None:
    """Where the runtime keeps a process beside D (a cluster's exec with stdin), prepare() starts the
    sender before t0: it finds P's side channel and makes its session then, and nothing reaches P
    until inject() signals it (a cluster's exec took 0.5 s on a loaded kubelet, past the window's
    one request, when the whole send started in the window)."""
    import time

    router, bootstrap = peer
    got: list = []
    ctx = Ctx(bootstrap.replace("127.0.0.1", "prefill-0.pdchaos-r1.svc"))
    ctx.placement = StartingPlacement(p_host="127.0.0.1")
    fault = SideChannelGarbage(SideGarbageParams(frames=3), ctx)
    fault.prepare()
    assert ctx.placement.calls == [("decode:0", "families.pd.side_faults")]
    assert not router.poll(300)  # ready, its session made: nothing sent before the signal
    assert ctx.events == [] and ctx.tainted == []

    t = _serve_once(router, answer, got, 5000)
    t_go = time.monotonic()
    fault.inject()
    took = time.monotonic() - t_go
    t.join(5)
    sender = ctx.placement.started[0]
    assert sender.written == ["go"] and got == [3]
    assert took < (0.5 if answer else 1.5)  # the signal and the send; no answer: the 1 s wait for one
    assert sender.proc.returncode == 0  # released: the exec ended with its stdin
    assert fault.effect() == {"sent": 1, "answered": int(answer)}
    assert ctx.tainted == ([] if answer else ["prefill:0"])
    fault.release()  # safe to repeat at teardown


def test_a_sender_that_cannot_be_made_ready_fails_prepare_and_taints_p() -> None:
    ctx = Ctx("http://127.0.0.1:9")  # nothing listens
    ctx.placement = StartingPlacement()
    fault = SideChannelGarbage(SideGarbageParams(frames=3), ctx)
    with pytest.raises(RuntimeError, match=r"^side_channel_garbage: (ConnectionRefusedError|URLError|OSError)"):
        fault.prepare()
    assert ctx.tainted == ["prefill:0"] and ctx.placement.started[0].proc.returncode == 0


def test_a_sender_whose_stdin_ends_sends_nothing(peer) -> None:
    router, bootstrap = peer
    import io

    from families.pd.side_faults import wait_and_send

    out = io.StringIO()
    assert wait_and_send(bootstrap, 3, io.StringIO(""), out) == 0
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert lines == [{"ready": True, "session": True}, {"cancelled": True}]
    assert not router.poll(300)
