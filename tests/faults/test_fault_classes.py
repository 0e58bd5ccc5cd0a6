"""The fault classes: generic ones (faults/process.py, faults/interpose.py) and the lookup
family's (families/lookup/fault_{peers,server,backend,requests}.py).

Params validation is checked field by field. Each fault is then driven through a FaultContext:
``RecordingContext`` below stands in for the runner's topology (harness/topology.py with
families/lookup/topology.py), the seam the faults are written against; it records the
node-control calls it gets (by role), and resolves node specs with the real
``BaseTopology.roles``. Where a fault's effect can be real in a small test, it is: backend faults
go through a real ``lookup-server`` node's control channel, ``malformed_requests`` hits a real
LookupServer and the legacy model, ``interpose`` drives a real interposer node (with the lookup
codec), and the fake-peer arguments a peer fault asks for are parsed by the real fake-peer node
parser.
"""

from __future__ import annotations

import argparse
import os
import random
import select
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import pytest
from pydantic import ValidationError

from connector_patch.lookup.legacy import LegacyLookupServer
from connector_patch.lookup import LookupClient, LookupServer, MemoryBackend
from faults.base import FAULT_MODULES, OnceFault, load_registry
from nodekit.control import ControlError, control_call
from harness.errors import HarnessError
from families.lookup import fake_peer, wire
from families.lookup.fault_requests import EXPECTED_CODE, REQUEST_KINDS, bad_requests
from harness.family import get_family
from harness.topology import BaseTopology

LOOKUP = get_family("lookup")  # load_registry("lookup") needs the family loaded (its fault modules)
PKG = "families.lookup"
GENERIC = {
    "faults.process": {"node_down", "kill", "stop", "restart"},
    "faults.interpose": {"interpose"},
}
LOOKUP_FAULTS = {
    f"{PKG}.fault_peers": {"slow_peer", "silent_peer", "malformed_reply", "legacy_peer"},
    f"{PKG}.fault_server": {"server_down", "server_kill", "server_freeze", "server_restart"},
    f"{PKG}.fault_backend": {"backend_raise", "backend_hang", "backend_slow"},
    f"{PKG}.fault_requests": {"malformed_requests"},
}
PRELOADED = [bytes([i]) * 32 for i in range(1, 9)]
CODEC = ["--codec", f"{PKG}.wire"]  # as the lookup topology starts the interposer


class RecordingContext:
    """A FaultContext whose node-control methods are recorded instead of performed (the topology
    is tested with the runner). Node specs are resolved by the real ``BaseTopology.roles`` over
    ``roles``. ``control`` can be wired to a real control channel per role (``controls``);
    ``server_control`` is the lookup topology's ``control("server", ...)``."""

    roles = BaseTopology.roles  # the real node-spec rules (role, prefix:*, all) over self.nodes

    def __init__(self, server_endpoint: str = "ipc:///nonexistent/srv", *, deadline: float | None = None,
                 controls: dict[str, Callable[..., dict]] | None = None,
                 roles: tuple[str, ...] = ("server",), failing: dict[tuple[str, str], Exception] | None = None):
        self.target = "hardened"
        self.server_endpoint = server_endpoint
        self.client_endpoint = server_endpoint
        self.rng = random.Random(1234)
        if deadline is not None:
            self.deadline = deadline
        self.nodes = {r: None for r in roles}
        self.calls: list[tuple] = []
        self.events: list[tuple[str, dict]] = []
        self._controls = controls or {}
        self._failing = failing or {}  # (method, role) -> the exception that call raises, once recorded

    def _record(self, call: tuple) -> None:
        self.calls.append(call)
        exc = self._failing.get(call[:2])
        if exc is not None:
            raise exc

    def event(self, what: str, **fields: Any) -> None:
        self.events.append((what, fields))

    # generic (harness/topology.py); each act says whether the intended state was seen after
    # (``seen``: True, False, or None for "cannot tell"), which the process faults count (fault_effect)
    seen: bool | None = True

    def start_node(self, role: str) -> None:
        self._record(("start_node", role))

    def stop_node(self, role: str) -> bool | None:
        self._record(("stop_node", role))
        return self.seen

    def kill_node(self, role: str) -> bool | None:
        self._record(("kill_node", role))
        return self.seen

    def restart_node(self, role: str, *, kill: bool = False) -> bool | None:
        self._record(("restart_node", role, {"kill": kill}))
        return self.seen

    def freeze_node(self, role: str) -> bool | None:
        self._record(("freeze_node", role))
        return self.seen

    def thaw_node(self, role: str) -> None:
        self._record(("thaw_node", role))

    def control(self, role: str, cmd: str, timeout_ms: int = 2000, **fields: Any) -> dict:
        self._record(("control", role, cmd, fields))
        real = self._controls.get(role)
        return real(cmd, **fields) if real else {"ok": True}

    # the lookup family's (families/lookup/topology.py)
    def swap_server(self, kind: str, args: list[str]) -> None:
        self._record(("swap_server", kind, list(args)))

    def restore_server(self) -> None:
        self._record(("restore_server",))

    def server_control(self, cmd: str, **fields: Any) -> dict:
        self.calls.append(("server_control", cmd, fields))
        real = self._controls.get("server")
        return real(cmd, **fields) if real else {"ok": True}


def make(name: str, ctx: RecordingContext, **params: Any):
    cls = load_registry("lookup")[name]
    return cls(cls.Params.model_validate(params), ctx)


class Node:
    def __init__(self, kind: str, args: list[str]):
        self.proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "node", kind, *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     start_new_session=True)

    def wait_ready(self, timeout: float = 10.0) -> "Node":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if select.select([self.proc.stdout], [], [], 0.05)[0]:
                line = self.proc.stdout.readline()
                if line.strip() == "READY":
                    return self
                if not line:
                    break
        self.stop()
        raise AssertionError("node did not print READY")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc.stdout.close()
        return self.proc.returncode


@pytest.fixture
def workdir():
    d = tempfile.mkdtemp(prefix="pdc")
    yield d
    shutil.rmtree(d, ignore_errors=True)


# --------------------------------------------------------------------------- registry and params


def test_every_fault_is_registered_from_its_module():
    registry = load_registry("lookup")
    for modules, mine, family in [(FAULT_MODULES, GENERIC, None), (LOOKUP.fault_modules, LOOKUP_FAULTS, "lookup")]:
        for module, names in mine.items():
            assert module in modules
            for name in names:
                cls = registry[name]
                assert cls.__module__ == module and cls.name == name and cls.family == family
                assert cls.Params.model_config.get("extra") == "forbid"
                assert cls.__doc__ and cls.__doc__.strip()
    assert registry["interpose"].requires == ("interposer",)
    # generic faults are every family's; a lookup fault is in the lookup registry only
    assert set().union(*GENERIC.values()) <= set(load_registry("no-such-family"))
    assert not set().union(*LOOKUP_FAULTS.values()) & set(load_registry("no-such-family"))


def test_lookup_server_faults_are_the_generic_process_faults_on_the_server():
    from faults import process

    registry = load_registry("lookup")
    for name, generic in [("server_down", process.Down), ("server_kill", process.Kill),
                          ("server_freeze", process.Stop), ("server_restart", process.Restart)]:
        cls = registry[name]
        assert issubclass(cls, generic) and issubclass(cls, OnceFault)
        assert cls.fixed_node == "server" and "node" not in cls.Params.model_fields
        assert cls.categories == ("timeout",)


def test_reply_kinds_agree_between_fault_and_peer():
    from typing import get_args

    from families.lookup.fault_peers import ReplyKind

    assert set(get_args(ReplyKind)) == set(fake_peer.REPLY_KINDS) == set(wire.REPLY_KINDS)
    # the interposer's codec names every broken reply, plus the upstream raw reply
    assert set(wire.NAMED_REWRITES) == set(wire.REPLY_KINDS) | {"legacy4"}


@pytest.mark.parametrize("name, params, loc, message", [
    ("slow_peer", {}, ("delay",), "Field required"),
    ("slow_peer", {"delay": 300}, ("delay",), 'expected a duration like "1.5s"'),
    ("slow_peer", {"delay": "-1s"}, ("delay",), "expected a duration"),
    ("slow_peer", {"delay": "0ms"}, ("delay",), "must be above 0"),
    ("slow_peer", {"delay": "2h"}, ("delay",), "expected a duration"),
    ("slow_peer", {"delay": "1s", "jitter": "1ms"}, ("jitter",), "Extra inputs are not permitted"),
    ("silent_peer", {"delay": "1s"}, ("delay",), "Extra inputs are not permitted"),
    ("malformed_reply", {"kind": "garbage"}, ("kind",), "Input should be 'empty', 'two_frames'"),
    ("malformed_reply", {}, ("kind",), "Field required"),
    ("server_restart", {"kill": "perhaps"}, ("kill",), "Input should be a valid boolean"),
    ("server_freeze", {"signal": "STOP"}, ("signal",), "Extra inputs are not permitted"),
    ("backend_slow", {"delay": "11m"}, ("delay",), "at most 10m"),
    ("backend_raise", {"mode": "raise"}, ("mode",), "Extra inputs are not permitted"),
    ("malformed_requests", {"kinds": ["frame_count", "nonsense"]}, ("kinds", 1), "Input should be 'frame_count'"),
    ("malformed_requests", {"kinds": []}, ("kinds",), "at least 1 item"),
    ("malformed_requests", {"count": 0}, ("count",), "greater than or equal to 1"),
    ("malformed_requests", {"count": 100_001}, ("count",), "less than or equal to 100000"),
    ("malformed_requests", {"reply_timeout": "soon"}, ("reply_timeout",), "expected a duration"),
    ("interpose", {"action": "drop"}, ("direction",), "Field required"),
    ("interpose", {"direction": "sideways", "action": "drop"}, ("direction",), "'request', 'reply' or 'both'"),
    ("interpose", {"direction": "reply", "action": "delay"}, (), "action delay needs delay > 0"),
    ("interpose", {"direction": "reply", "action": "drop", "delay": "1s"}, (),
     "delay: only used with action 'delay', not 'drop'"),
    ("interpose", {"direction": "reply", "action": "delay", "delay": "1s", "gap": "1ms"}, (),
     "gap: only used with action 'duplicate'"),
    ("interpose", {"direction": "reply", "action": "truncate"}, (), "action truncate needs truncate_bytes"),
    ("interpose", {"direction": "reply", "action": "truncate", "truncate_bytes": -1}, ("truncate_bytes",),
     "greater than or equal to 0"),
    ("interpose", {"direction": "reply", "action": "drop", "match": {}}, ("match",), "give exactly one of"),
    ("interpose", {"direction": "reply", "action": "drop", "match": {"nth": 2, "every": True}}, ("match",),
     "(got every, nth)"),
    ("interpose", {"direction": "reply", "action": "drop", "match": {"probability": 1.5}},
     ("match", "probability"), "less than or equal to 1"),
    ("interpose", {"direction": "reply", "action": "drop", "match": {"nth": 0}}, ("match", "nth"),
     "greater than or equal to 1"),
    ("interpose", {"direction": "reply", "action": "drop", "seed": 3}, (), "seed: only used with match.probability"),
    ("interpose", {"direction": "reply", "action": "rewrite"}, (), "action rewrite needs rewrite"),
    ("interpose", {"direction": "reply", "action": "rewrite", "rewrite": {"bytes_hex": "abc"}},
     ("rewrite", "bytes_hex"), "even number of hex digits"),
    # the names are the interposer codec's (a name it does not have is refused by the node when the
    # rule is set: test_interpose_faults_add_and_remove_their_own_rules); here, an identifier
    ("interpose", {"direction": "reply", "action": "rewrite", "rewrite": {"named": "v 3"}}, ("rewrite", "named"),
     "String should match pattern"),
    ("interpose", {"direction": "reply", "action": "rewrite", "rewrite": {"named": ""}}, ("rewrite", "named"),
     "String should match pattern"),
    ("node_down", {}, ("node",), "Field required"),
    ("kill", {"node": "Server"}, ("node",), "String should match pattern"),
    ("stop", {"node": "prefill:x"}, ("node",), "String should match pattern"),
    ("restart", {"node": "server", "kill": "perhaps"}, ("kill",), "Input should be a valid boolean"),
    ("restart", {"node": "server", "signal": "KILL"}, ("signal",), "Extra inputs are not permitted"),
    ("interpose", {"direction": "reply", "action": "rewrite", "rewrite": {"named": "version2", "bytes_hex": "00"}},
     ("rewrite",), "give exactly one of bytes_hex, named"),
    ("interpose", {"direction": "both", "action": "rewrite", "rewrite": {"named": "legacy4"}}, (),
     "rewrite.named: only for direction 'reply'"),
])
def test_bad_params_give_a_precise_error(name, params, loc, message):
    cls = load_registry("lookup")[name]
    with pytest.raises(ValidationError) as info:
        cls.Params.model_validate(params)
    errors = info.value.errors()
    assert len(errors) == 1, errors
    assert errors[0]["loc"] == loc
    assert message in errors[0]["msg"], errors[0]["msg"]


def test_good_params_parse_durations_to_seconds():
    registry = load_registry("lookup")
    assert registry["slow_peer"].Params.model_validate({"delay": "1.5s"}).delay == 1.5
    p = registry["interpose"].Params.model_validate(
        {"direction": "reply", "action": "duplicate", "gap": "250us", "match": {"every_nth": 3}})
    assert p.gap == pytest.approx(0.00025)
    mr = registry["malformed_requests"].Params.model_validate({})
    assert list(mr.kinds) == list(REQUEST_KINDS) and mr.count is None
    for node in ("server", "prefill:0", "prefill:*", "all", "decode_2"):
        assert registry["kill"].Params.model_validate({"node": node}).node == node


# --------------------------------------------------------------------------- peers


@pytest.mark.parametrize("name, params, mode_args, categories", [
    ("slow_peer", {"delay": "300ms"}, ["--mode", "slow", "--delay-ms", "300"], ("timeout",)),
    ("silent_peer", {}, ["--mode", "silent"], ("timeout",)),
    ("malformed_reply", {"kind": "hit_over"}, ["--mode", "malformed", "--reply", "hit_over"],
     ("protocol", "timeout")),  # timeout: the swap itself is a short outage
    ("legacy_peer", {}, ["--mode", "legacy"], ("protocol", "timeout")),
])
def test_peer_faults_swap_in_a_fake_peer_with_valid_args_and_restore_once(name, params, mode_args, categories):
    ctx = RecordingContext()
    fault = make(name, ctx, **params)
    fault.start()
    assert ctx.calls == [("swap_server", "fake-peer", mode_args)]
    # the args, plus what the topology appends, are accepted by the real node parser
    parser = argparse.ArgumentParser()
    fake_peer.add_node_arguments(parser, "fake-peer")
    ns = parser.parse_args([*mode_args, "--endpoint", "ipc:///tmp/x", "--control", "ipc:///tmp/y",
                            "--preload", "p.txt", "--block-size", "16", "--groups", "2"])
    assert ns.mode == mode_args[1]
    fault.stop()
    fault.stop()  # idempotent: the runner heals again at teardown
    assert ctx.calls[1:] == [("restore_server",)]
    assert fault.expected_categories() == categories


def test_a_peer_fault_never_started_does_not_restore():
    ctx = RecordingContext()
    make("silent_peer", ctx).stop()
    assert ctx.calls == []


def test_a_swap_that_failed_half_way_is_still_restored_once():
    """Real server stopped, fake peer not ready: the swap raises, and the heal must still put the
    real server back (the fault is marked before the swap), once."""
    ctx = RecordingContext(failing={("swap_server", "fake-peer"): HarnessError("fake-peer: no READY")})
    fault = make("legacy_peer", ctx)
    with pytest.raises(HarnessError):
        fault.start()
    fault.stop()
    fault.stop()
    assert ctx.calls == [("swap_server", "fake-peer", ["--mode", "legacy"]), ("restore_server",)]


def test_interpose_wire_rule_survives_the_runners_model_construct():
    """The runner rebuilds params with model_construct (every field set, defaults included);
    the rule sent on the wire must still carry only what the scenario said, and be accepted."""
    from faults.interposer import parse_rules

    cls = load_registry("lookup")["interpose"]
    given = {"direction": "reply", "action": "duplicate", "gap": "1.5s", "match": {"every_nth": 2}}
    validated = cls.Params.model_validate(given)
    constructed = cls.Params.model_construct(**{k: getattr(validated, k) for k in cls.Params.model_fields})
    fault = cls(constructed, RecordingContext())
    wire = fault.wire_rule()
    assert wire == {"direction": "reply", "action": "duplicate", "gap": "1500.0ms", "match": {"every_nth": 2}}
    (rule,) = parse_rules([wire])
    assert rule.gap == 1.5 and rule.match.every_nth == 2


def test_delay_expectations_follow_the_deadline():
    # a peer swap is a short outage: timeouts are possible even below the deadline
    assert make("slow_peer", RecordingContext(deadline=0.2), delay="50ms").expected_categories() == ("timeout",)
    assert make("backend_slow", RecordingContext(deadline=1.0), delay="100ms").expected_categories() == ()
    assert make("backend_slow", RecordingContext(), delay="100ms").expected_categories() == ("timeout",
                                                                                          "backend_error")
    ip = lambda **p: make("interpose", RecordingContext(deadline=0.2), **p).expected_categories()  # noqa: E731
    assert ip(direction="request", action="drop") == ("timeout",)
    assert ip(direction="reply", action="delay", delay="20ms") == ()
    assert ip(direction="reply", action="delay", delay="1s") == ("timeout",)
    assert ip(direction="both", action="truncate", truncate_bytes=1) == ("protocol", "server_error")
    assert ip(direction="request", action="rewrite", rewrite={"frame": 0, "bytes_hex": "00"}) == ("server_error",)
    assert ip(direction="reply", action="duplicate") == ()


# --------------------------------------------------------------------------- process


@pytest.mark.parametrize("name, params, on_start, on_stop", [
    ("server_down", {}, [("stop_node", "server")], [("start_node", "server")]),
    ("server_kill", {}, [("kill_node", "server")], [("start_node", "server")]),
    ("server_freeze", {}, [("freeze_node", "server")], [("thaw_node", "server")]),
    ("server_restart", {}, [("restart_node", "server", {"kill": False})], []),
    ("server_restart", {"kill": True}, [("restart_node", "server", {"kill": True})], []),
])
def test_process_faults_heal_exactly_what_they_did(name, params, on_start, on_stop):
    ctx = RecordingContext(roles=("server", "interposer"))  # only the server is touched
    fault = make(name, ctx, **params)
    fault.start()
    assert ctx.calls == on_start
    fault.stop()
    fault.stop()
    assert ctx.calls[len(on_start):] == on_stop
    assert fault.expected_categories() == ("timeout",)


ROLES = ("server", "prefill:0", "prefill:1", "decode:0", "proxy")


@pytest.mark.parametrize("name, node, on_start, on_stop", [
    ("node_down", "decode:0", [("stop_node", "decode:0")], [("start_node", "decode:0")]),
    ("node_down", "prefill:*", [("stop_node", "prefill:0"), ("stop_node", "prefill:1")],
     [("start_node", "prefill:0"), ("start_node", "prefill:1")]),
    ("kill", "proxy", [("kill_node", "proxy")], [("start_node", "proxy")]),
    ("kill", "prefill:*", [("kill_node", "prefill:0"), ("kill_node", "prefill:1")],
     [("start_node", "prefill:0"), ("start_node", "prefill:1")]),
    ("stop", "all", [("freeze_node", r) for r in ROLES],
     [("thaw_node", r) for r in ROLES]),
    ("stop", "prefill:1", [("freeze_node", "prefill:1")],
     [("thaw_node", "prefill:1")]),
    ("restart", "server", [("restart_node", "server", {"kill": False})], []),
    ("restart", "prefill:*", [("restart_node", "prefill:0", {"kill": False}),
                              ("restart_node", "prefill:1", {"kill": False})], []),
])
def test_generic_process_faults_act_on_the_roles_of_their_node_spec(name, node, on_start, on_stop):
    ctx = RecordingContext(roles=ROLES)
    fault = make(name, ctx, node=node)
    assert fault.family is None and isinstance(fault, OnceFault)
    fault.start()
    assert ctx.calls == on_start
    fault.stop()
    fault.stop()  # idempotent: the runner heals again at teardown
    assert ctx.calls[len(on_start):] == on_stop
    assert fault.expected_categories() == ()  # generic: no expectation on a family's counters
    # what the window did, for fault_effect: every role acted on, each seen in its intended state
    assert fault.effect() == {"acted": len(on_start), "seen": len(on_start), "unseen": 0}
    assert fault.required_effect() == {"acted": 1, "seen": 1}


@pytest.mark.parametrize("seen,effect", [(False, {"acted": 1, "seen": 0, "unseen": 1}),
                                         (None, {"acted": 1, "seen": 0, "unseen": 0})])
def test_a_process_fault_not_seen_to_act_reports_it(seen, effect):
    """A kill whose process was not seen gone (or could not be looked at) is counted as such:
    fault_effect then finds ``seen`` below the required 1."""
    ctx = RecordingContext(roles=ROLES)
    ctx.seen = seen
    fault = make("kill", ctx, node="decode:0")
    fault.start()
    fault.stop()
    assert fault.effect() == effect


def test_generic_restart_with_kill_and_a_fault_never_started():
    ctx = RecordingContext(roles=ROLES)
    make("restart", ctx, node="decode:0", kill=True).start()
    assert ctx.calls == [("restart_node", "decode:0", {"kill": True})]
    for name in ("node_down", "kill", "stop", "restart"):
        make(name, ctx, node="all").stop()  # healing what never started does nothing
    assert len(ctx.calls) == 1


def test_a_half_done_stop_fault_thaws_exactly_the_nodes_it_froze():
    boom = HarnessError("signal SIGSTOP: node 'prefill:1' is not running")
    ctx = RecordingContext(roles=ROLES, failing={("freeze_node", "prefill:1"): boom})
    fault = make("stop", ctx, node="prefill:*")
    with pytest.raises(HarnessError):
        fault.start()
    fault.stop()
    assert ctx.calls == [("freeze_node", "prefill:0"), ("freeze_node", "prefill:1"),
                         ("thaw_node", "prefill:0")]


@pytest.mark.parametrize("name", ["stop", "restart", "node_down", "kill"])
def test_a_node_spec_naming_no_role_fails_at_start_and_heals_nothing(name):
    ctx = RecordingContext(roles=ROLES)
    fault = make(name, ctx, node="decode:7")
    with pytest.raises(HarnessError, match=r"node 'decode:7': no such role"):
        fault.start()
    fault.stop()
    assert ctx.calls == []


# --------------------------------------------------------------------------- backend (real server node)


@pytest.mark.timeout(30)
def test_backend_faults_through_a_real_server_node(workdir):
    ep, control = f"ipc://{workdir}/srv", f"ipc://{workdir}/ctl"
    preload = os.path.join(workdir, "preload.txt")
    with open(preload, "w") as fh:
        fh.write("".join(h.hex() + "\n" for h in PRELOADED))
    node = Node("lookup-server", ["--endpoint", ep, "--control", control, "--preload", preload,
                                  "--backend-timeout-ms", "100"]).wait_ready()
    ctx = RecordingContext(ep, controls={"server": lambda cmd, **f: control_call(control, cmd, **f)})
    try:
        with LookupClient(ep, timeout_ms=400) as c:
            assert c.lookup(128, PRELOADED) == 128
            for name, params, outcome, code in [
                ("backend_raise", {}, "backend_error", "BACKEND_ERROR"),
                ("backend_hang", {}, "backend_error", "BACKEND_TIMEOUT"),  # server deadline 100 ms < client 400 ms
                ("backend_slow", {"delay": "150ms"}, "backend_error", "BACKEND_TIMEOUT"),
                ("backend_slow", {"delay": "30ms"}, "ok", ""),
            ]:
                fault = make(name, ctx, **params)
                fault.start()
                try:
                    t0 = time.monotonic()
                    hit = c.lookup(128, PRELOADED)
                    elapsed = time.monotonic() - t0
                    assert (c.last_outcome, c.last_code) == (outcome, code), name
                    assert hit == (128 if outcome == "ok" else 0)
                    if name == "backend_slow" and outcome == "ok":
                        assert elapsed >= 0.03
                    assert outcome in fault.expected_categories() or outcome == "ok"
                finally:
                    fault.stop()
                    fault.stop()
                assert c.lookup(128, PRELOADED[:2]) == 32, f"not healed after {name}"  # healed at once
        modes = [f["mode"] for call, cmd, f in ctx.calls]
        assert modes == ["raise", "none", "hang", "none", "slow", "none", "slow", "none"]
    finally:
        assert node.stop() == 0


# --------------------------------------------------------------------------- malformed requests


@pytest.mark.timeout(30)
def test_malformed_requests_are_each_answered_once_by_the_hardened_server(workdir):
    ep = f"ipc://{workdir}/srv"
    backend = MemoryBackend(groups=2)
    backend.put([h.hex() for h in PRELOADED])
    server = LookupServer(ep, backend).start()
    try:
        ctx = RecordingContext(ep)
        fault = make("malformed_requests", ctx, interval="0ms", reply_timeout="1s")
        fault.start()
        deadline = time.monotonic() + 10
        total = sum(len(bad_requests(k)) for k in REQUEST_KINDS)
        while fault.result()["sent"] < total and time.monotonic() < deadline:
            time.sleep(0.01)
        fault.stop()
        fault.stop()
        assert [what for what, _ in ctx.events] == ["malformed_requests"]  # recorded once
        ev = ctx.events[0][1]
        assert ev["sent"] == ev["answered"] == total and ev["unanswered"] == 0
        assert ev["accepted"] == ev["invalid"] == ev["duplicates"] == 0
        want: dict[str, int] = {}
        for kind in REQUEST_KINDS:
            want[EXPECTED_CODE[kind]] = want.get(EXPECTED_CODE[kind], 0) + len(bad_requests(kind))
        assert ev["by_code"] == want
        assert server.counters["protocol"] == total
        with LookupClient(ep, timeout_ms=500) as c:  # and the server still serves
            assert c.lookup(128, PRELOADED, (0, 1)) == 128
    finally:
        server.close()
        backend.close()


@pytest.mark.timeout(30)
def test_malformed_requests_kill_the_legacy_server_and_are_reported_unanswered(workdir):
    ep = f"ipc://{workdir}/legacy"
    backend = MemoryBackend()
    server = LegacyLookupServer(ep, backend).start()
    try:
        ctx = RecordingContext(ep)
        # int_width first: the legacy server parses 3- and 5-byte ints and answers with raw
        # 4-byte replies (not v1 envelopes); the first wrong frame count then ends its thread.
        fault = make("malformed_requests", ctx, kinds=["int_width", "frame_count"], interval="0ms",
                     reply_timeout="100ms")
        fault.start()
        time.sleep(0.5)
        fault.stop()
        ev = ctx.events[0][1]
        n_int = len(bad_requests("int_width"))
        assert ev["answered"] == ev["invalid"] == n_int
        assert ev["by_kind"]["int_width"] == {"sent": n_int, "answered": n_int}
        assert ev["by_kind"]["frame_count"]["answered"] == 0
        assert ev["unanswered"] == ev["sent"] - n_int >= 1
        assert ev["by_code"] == {} and ev["accepted"] == 0
        assert not server.alive
    finally:
        server.close()
        backend.close()


# --------------------------------------------------------------------------- interpose (real interposer node)


@pytest.mark.timeout(30)
def test_interpose_faults_add_and_remove_their_own_rules(workdir):
    upstream, listen, control = f"ipc://{workdir}/srv", f"ipc://{workdir}/mitm", f"ipc://{workdir}/ctl"
    backend = MemoryBackend()
    backend.put([h.hex() for h in PRELOADED])
    server = LookupServer(upstream, backend).start()
    node = Node("interposer", ["--listen", listen, "--upstream", upstream, "--control", control, *CODEC]).wait_ready()
    ctx = RecordingContext(upstream, roles=("server", "interposer"),
                           controls={"interposer": lambda cmd, **f: control_call(control, cmd, **f)})
    try:
        slow = make("interpose", ctx, direction="reply", action="delay", delay="40ms")
        broken = make("interpose", ctx, direction="reply", action="rewrite", rewrite={"named": "version2"},
                      match={"probability": 1.0})
        slow.start()
        broken.start()
        rules = control_call(control, "stats")["rules"]
        assert [r["id"] for r in rules] == [slow.rule_id, broken.rule_id]
        assert {(call, role) for call, role, _, _ in ctx.calls} == {("control", "interposer")}
        sent = [f["rule"] for _, _, _, f in ctx.calls]
        assert sent[0] == {"direction": "reply", "action": "delay", "delay": "40.0ms"}
        assert sent[1]["seed"] == random.Random(1234).randrange(2**32)  # drawn from the scenario rng
        with LookupClient(listen, timeout_ms=300) as c:
            t0 = time.monotonic()
            assert c.lookup(128, PRELOADED) == 0 and c.last_code == "UNSUPPORTED_VERSION"
            assert time.monotonic() - t0 >= 0.04
            broken.stop()
            broken.stop()
            t0 = time.monotonic()
            assert c.lookup(128, PRELOADED) == 128 and time.monotonic() - t0 >= 0.04  # the other rule stays
            slow.stop()
            assert control_call(control, "stats")["rules"] == []
            t0 = time.monotonic()
            assert c.lookup(128, PRELOADED) == 128 and time.monotonic() - t0 < 0.04
        assert [cmd for _, _, cmd, _ in ctx.calls] == ["add_rule", "add_rule", "remove_rule", "remove_rule"]
        # a name the interposer's codec does not have is refused when the rule is set, by name
        unknown = make("interpose", ctx, direction="reply", action="rewrite", rewrite={"named": "v3"})
        with pytest.raises(ControlError, match=r"add_rule: ValueError: rule: rewrite.named: unknown named rewrite 'v3' "
                                               r"\(codec families.lookup.wire knows: empty, "):
            unknown.start()
        unknown.stop()  # marked before the call (OnceFault): the heal is harmless, nothing was added
        assert control_call(control, "stats")["rules"] == []
    finally:
        assert node.stop() == 0
        server.close()
        backend.close()


@pytest.mark.timeout(30)
def test_cpu_pressure_burns_for_its_window_and_counts_the_burners_still_running():
    """Real busy processes for the window, gone after the heal; the effect counts those still
    running at the heal (a burner that died early stressed nothing)."""
    import time

    ctx = RecordingContext(roles=ROLES)
    fault = make("cpu_pressure", ctx, node="decode:0", workers=2, load=50)
    assert fault.required_effect() == {"workers": 2}
    fault.start()
    procs = list(fault._procs)
    time.sleep(0.3)
    assert all(p.poll() is None for p in procs)
    fault.stop()
    assert fault.effect() == {"workers": 2} and all(p.poll() is not None for p in procs)
    fault.stop()  # idempotent
    early = make("cpu_pressure", ctx, workers=1)
    early.start()
    early._procs[0].kill()
    early._procs[0].wait(5)
    early.stop()
    assert early.effect() == {"workers": 0}  # fault_effect fails such a window
