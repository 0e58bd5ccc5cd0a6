"""The node control channel (nodekit/control.py) over a real ZMQ socket: a node whose own gauges raise
answers that as an error and keeps answering (the control thread never dies of a stats call)."""

from __future__ import annotations

import msgpack
import pytest
import zmq

from harness.topology import free_tcp_port
from nodekit.control import ControlServer

pytestmark = pytest.mark.timeout(30)


def _ask(ep: str, cmd: str) -> dict:
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.REQ)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(ep)
    try:
        s.send(msgpack.packb({"cmd": cmd}))
        assert s.poll(5000), f"no answer to {cmd}"
        return msgpack.unpackb(s.recv(), raw=False)
    finally:
        s.close(linger=0)


def test_a_stats_call_that_raises_is_an_error_answer_and_the_channel_lives_on() -> None:
    calls = {"n": 0}

    def stats() -> dict:
        calls["n"] += 1
        if calls["n"] == 1:
            raise AttributeError("'Holds' object has no attribute 'counters'")
        return {"free_blocks": 3}

    ep = f"tcp://127.0.0.1:{free_tcp_port()}"
    srv = ControlServer(ep, stats=stats).start()
    try:
        first = _ask(ep, "stats")
        assert first["ok"] is False and "AttributeError" in first["error"]
        assert _ask(ep, "ping") == {"ok": True}
        again = _ask(ep, "stats")
        assert again["ok"] is True and again["free_blocks"] == 3
    finally:
        srv.close()
