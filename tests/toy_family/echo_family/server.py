"""Node ``echo-server``: a REP socket that sends back what it receives."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import zmq

from nodekit.control import ControlServer
from nodekit.journal import JournalWriter
from nodekit.nodeio import announce_ready, stop_on_signals as stop_event


def add_node_arguments(p: argparse.ArgumentParser, kind: str) -> None:  # noqa: ARG001
    p.add_argument("--endpoint", required=True)
    p.add_argument("--control")
    p.add_argument("--uppercase", action="store_true")
    p.add_argument("--journal", help="this node's own journal part (the runner merges it)")
    p.add_argument("--phases", help="where it appends a phase event per echo served (harness/phases.py)")
    p.add_argument("--ready-delay", type=float, default=0.0,
                   help="seconds before READY (a slow cold start, as a vLLM server's: tests only)")
    p.add_argument("--stubborn-child", action="store_true",
                   help="start a child that ignores SIGTERM and never watches its parent (as vLLM's EngineCore)")


# A child as vLLM's EngineCore is to its node: it ignores SIGTERM, never looks at its parent and
# never exits on its own; only its process group's SIGKILL ends it.
STUBBORN = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    time.sleep(1)\n"


def run_node(args: argparse.Namespace) -> int:
    stop = stop_event()
    child = None
    if args.stubborn_child:
        child = subprocess.Popen([sys.executable, "-c", STUBBORN], stdin=subprocess.DEVNULL)
        print(f"stubborn child pid {child.pid}", file=sys.stderr, flush=True)  # the tests find it here
    if stop.wait(args.ready_delay):  # asked to stop (or orphaned) before it was ready
        return 0
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REP)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(args.endpoint)
    state = {"garble": False, "requests": 0, "replies": 0}
    control = None
    if args.control:
        control = ControlServer(args.control, stats=lambda: {"counters": {k: v for k, v in state.items()
                                                                          if k != "garble"}})
        jw = JournalWriter(args.journal) if args.journal else None

        def garble(m: dict) -> dict:
            state["garble"] = bool(m.get("on"))
            if jw is not None:  # a state transition, in the node's own part of the journal
                jw.write({"type": "event", "what": "echo_garble", "t": time.monotonic(), "on": state["garble"]})
            return {}

        control.add("garble", garble)
        control.start()
    announce_ready()
    try:
        while not stop.is_set():
            if not sock.poll(100):
                continue
            msg = sock.recv()
            state["requests"] += 1
            out = msg.upper() if args.uppercase else msg
            sock.send(out[::-1] if state["garble"] else out)
            state["replies"] += 1
            if args.phases:  # one line per echo, appended: the nemesis reads the file live
                with open(args.phases, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"t": time.monotonic(), "phase": "echo_served", "pid": os.getpid()}) + "\n")
    finally:
        if control is not None:
            control.close()
        sock.close(0)
        ctx.term()
    return 0
