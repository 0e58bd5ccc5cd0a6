"""Node ``echo-server``: a REP socket that sends back what it receives."""

from __future__ import annotations

import argparse
import json
import os
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


def run_node(args: argparse.Namespace) -> int:
    stop = stop_event()
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
