"""D's pull rules (connector_patch/pd/pull.py): which requests a pull cancels, and when the socket
monitor says P is gone, judged on the events a real libzmq emits (pyzmq, loopback sockets)."""

from __future__ import annotations

import socket
import time

import pytest
import zmq
from zmq.utils.monitor import parse_monitor_message

from connector_patch.pd.pull import PeerWatch, RequesterLinks, cancel_targets

pytestmark = pytest.mark.timeout(30)
EVENTS = zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_DISCONNECTED


def test_a_failed_pull_cancels_all_an_abort_only_its_own() -> None:
    assert cancel_targets(["a", "b"], True, set()) == {"a", "b"}
    assert cancel_targets(["a", "b"], False, {"a", "z"}) == {"a"}
    assert cancel_targets(["a", "b"], False, set()) == set()


class Pull:
    """A DEALER as D's pull opens it, its monitor fed to a PeerWatch; also counts refusals the
    way the connector did before issue 30's item 4 (every CONNECT_RETRIED)."""

    def __init__(self, ctx: zmq.Context, port: int, after_loss_s: float, fence_s: float = 0.0):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.mon = self.sock.get_monitor_socket(EVENTS)
        self.sock.connect(f"tcp://127.0.0.1:{port}")
        self.watch = PeerWatch(2, after_loss_s, fence_s)
        self.old_refused = 0
        self.old_gone_at: float | None = None
        self.refusals_when_old_gone: int | None = None  # real refusals (the new count) at that moment

    def pump(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if not self.mon.poll(20):
                continue
            ev = parse_monitor_message(self.mon.recv_multipart())["event"]
            now = time.monotonic()
            if ev == zmq.EVENT_CONNECTED:
                self.watch.on_connected(now)
                self.old_refused = 0
            elif ev == zmq.EVENT_DISCONNECTED:
                self.watch.on_disconnected(now)
                self.old_refused = 0
            elif ev == zmq.EVENT_CONNECT_RETRIED:
                self.watch.on_retried(now)
                self.old_refused += 1
                if self.old_refused >= 2 and self.old_gone_at is None:
                    self.old_gone_at, self.refusals_when_old_gone = now, self.watch.refused

    def gone_within(self, seconds: float) -> float | None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            self.pump(0.02)
            if self.watch.gone(time.monotonic()):
                return time.monotonic() - t0
        return None

    def close(self) -> None:
        self.sock.disable_monitor()
        self.mon.close(linger=0)
        self.sock.close(linger=0)


def _refusing_port() -> socket.socket:
    """A loopback port that refuses every connect for as long as the returned socket stays open:
    bound, never listening. A port merely freed could be taken by a parallel test, or be picked as
    the connecting socket's own ephemeral port (a TCP self-connect, which reads as CONNECTED: seen
    once on CI); a bound port can be neither."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    return s


def _connected_then_lost(ctx: zmq.Context, after_loss_s: float,
                         fence_s: float = 0.0) -> tuple[Pull, int, socket.socket]:
    """A pull connected to a listening P whose port then closes (P gone, or a blip). The port is
    then held bound, not listening (see _refusing_port), until the caller closes the socket."""
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    pull = Pull(ctx, port, after_loss_s=after_loss_s, fence_s=fence_s)
    pull.pump(0.3)
    assert pull.watch.connected
    router.close(linger=0)
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the old connection's TIME_WAIT
    end = time.monotonic() + 2.0
    while True:  # libzmq closes its listener on its own I/O thread: wait until the port is free
        try:
            held.bind(("127.0.0.1", port))
            return pull, port, held
        except OSError:
            if time.monotonic() > end:
                held.close()
                raise
            time.sleep(0.005)


def test_nobody_ever_listening_is_gone_after_two_refusals() -> None:
    ctx = zmq.Context()
    try:
        with _refusing_port() as held:
            pull = Pull(ctx, held.getsockname()[1], after_loss_s=1.5)
            took = pull.gone_within(3.0)
            assert took is not None and took < 2.0, took  # two refused connects, ~0.2 s on a quiet machine
            assert not pull.watch.ever_connected
            pull.close()
    finally:
        ctx.destroy(linger=0)  # also when an assertion failed before a socket was closed


def test_a_lost_connection_is_not_p_gone_after_one_refusal() -> None:
    """Issue 30, item 4: after DISCONNECTED, libzmq's first CONNECT_RETRIED only schedules the
    reconnect. The old count read one refused connect as two: P 'gone' ~0.13 s into the loss."""
    ctx = zmq.Context()
    try:
        pull, _, held = _connected_then_lost(ctx, after_loss_s=1.0)
        t_loss = time.monotonic()
        pull.pump(0.5)
        # the old rule: "gone" after the first real refusal (the scheduling RETRIED counted as one)
        assert pull.old_gone_at is not None and pull.refusals_when_old_gone == 1, pull.refusals_when_old_gone
        assert pull.watch.refused >= 1 and not pull.watch.gone(time.monotonic())  # the rule now: not yet
        took = pull.gone_within(2.0)
        assert took is not None and time.monotonic() - t_loss >= 1.0  # refused for its whole window
        pull.close()
        held.close()
    finally:
        ctx.destroy(linger=0)  # also when an assertion failed before a socket was closed


def test_a_port_that_listens_again_within_the_window_is_not_gone() -> None:
    """A blip that heals (or P back on its port) before the window ends: connected again, never gone."""
    ctx = zmq.Context()
    try:
        pull, port, held = _connected_then_lost(ctx, after_loss_s=1.5)
        pull.pump(0.6)
        assert pull.watch.refused >= 1
        held.close()
        again = ctx.socket(zmq.ROUTER)
        again.bind(f"tcp://127.0.0.1:{port}")
        assert pull.gone_within(2.0) is None
        assert pull.watch.connected
        again.close(linger=0)
        pull.close()
    finally:
        ctx.destroy(linger=0)  # also when an assertion failed before a socket was closed


def test_a_pull_p_got_is_gone_only_a_fence_after_the_first_refusal() -> None:
    """Issue 43, 7a: once P got the pull, "gone" also waits the fence after the first refusal that
    followed the loss (P's keepalive sees a refusing link within its 1 s probe interval, and its
    write in flight is cut at the next chunk by then). Real libzmq events: the port closes, the
    reconnects are refused; with a 0.2 s loss window and a 1.0 s fence, not gone at 0.5 s, gone
    1.0 s after the first refusal, not before."""
    ctx = zmq.Context()
    try:
        pull, _, held = _connected_then_lost(ctx, after_loss_s=0.2, fence_s=1.0)
        pull.pump(0.5)
        w = pull.watch
        assert w.refused >= 2 and w.refused_at is not None, (w.refused, w.refused_at)
        assert not w.gone(time.monotonic())  # the old rule held at 0.2 s
        assert w.gone_at() == max(w.lost_at + 0.2, w.refused_at + 1.0)
        took = pull.gone_within(2.0)
        assert took is not None and time.monotonic() - w.refused_at >= 1.0, took
        pull.close()
        held.close()
    finally:
        ctx.destroy(linger=0)  # also when an assertion failed before a socket was closed


def test_the_fence_is_for_pulls_p_got_only() -> None:
    """A pull that never connected is gone after two refusals, fence or not (P never got it)."""
    w = PeerWatch(2, 1.5, 2.0)
    w.on_retried(10.0)
    w.on_retried(10.1)
    assert w.gone(10.1) and w.gone_at() == float("-inf")
    w = PeerWatch(2, 1.5, 2.0)
    w.on_connected(10.0)
    w.on_disconnected(11.0)
    w.on_retried(11.0)  # the reconnect scheduled at the loss: no refusal
    w.on_retried(11.1)
    w.on_retried(11.2)
    assert w.refused_at == 11.1 and w.gone_at() == 13.1
    assert not w.gone(13.0) and w.gone(13.1)
    w.on_connected(13.05)  # back before the fence ended: never gone
    assert w.gone_at() is None and not w.gone(20.0)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        PeerWatch(0, 1.0)
    with pytest.raises(ValueError):
        PeerWatch(2, -1.0)
    with pytest.raises(ValueError):
        PeerWatch(2, 1.0, -0.1)


def test_p_tells_a_pull_on_a_dropped_connection_from_one_on_a_new_connection() -> None:
    """P's side (RequesterLinks) fed by a real ROUTER's monitor, read before each message as the
    hardened listener does: a pull's connection drops and D reconnects, the kernel handing the new
    connection the same descriptor. The old pull reads lost, the new one does not."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    mon = router.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
    links = RequesterLinks()

    def read_links() -> None:
        while mon.poll(0):
            msg = parse_monitor_message(mon.recv_multipart())
            (links.on_accepted if msg["event"] == zmq.EVENT_ACCEPTED else links.on_disconnected)(int(msg["value"]))

    def pull_from_new_dealer():
        d = ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        d.connect(f"tcp://127.0.0.1:{port}")
        d.send(b"pull")
        assert router.poll(5000)
        parts = router.recv_multipart(copy=False)
        read_links()
        return d, parts[-1].get(zmq.SRCFD), links.tag(parts[-1].get(zmq.SRCFD))

    try:
        d1, fd1, tag1 = pull_from_new_dealer()
        assert tag1 is not None and not links.lost(tag1)
        d1.close()
        end = time.monotonic() + 5
        while not links.lost(tag1) and time.monotonic() < end:
            time.sleep(0.01)
            read_links()
        assert links.lost(tag1)  # the first pull's connection dropped
        d2, fd2, tag2 = pull_from_new_dealer()
        assert tag2 != tag1  # (on Linux the kernel reuses the descriptor: a new generation of it)
        assert links.lost(tag1) and not links.lost(tag2)
        assert not links.lost(None) and links.tag(None) is None  # not known: upstream's behaviour
        d2.close()
    finally:
        router.disable_monitor()
        mon.close(linger=0)
        router.close()
        ctx.term()


def test_requester_links_by_generation() -> None:
    links = RequesterLinks()
    assert links.tag(7) is None  # no accept seen: not known
    links.on_accepted(7)
    a = links.tag(7)
    links.on_disconnected(7)
    assert links.lost(a) and links.lost(links.tag(7))  # a message of the dropped connection read late
    links.on_accepted(7)  # the descriptor reused by a new connection
    b = links.tag(7)
    assert links.lost(a) and not links.lost(b)
    links.on_disconnected(99)  # a descriptor never accepted (before the monitor): ignored
    assert links.tag(99) is None
