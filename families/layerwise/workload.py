"""Node kind ``layerwise-workload``: requests through D, each until it leaves WAITING_FOR_REMOTE_KVS.

Plays vLLM's API front end on D (with two Ds, worker i on D number i mod 2; the op names it,
``decode``): each op admits one request with ``do_remote_prefill`` (D's
``admit`` control command: the real scheduler side allocates its blocks and POSTs to the
metaserver, which forwards it to P), then watches D's engine (``status``, every ``POLL_S``) until
the request left the wait through ``finished_recving``:

* ``ok``, value ``"done"``: it finished with no failed block;
* ``fail``, outcome ``"failed_load"``: it finished and its blocks were reported as failed loads
  (``blocks_reported`` = ``blocks``);
* ``info``, outcome ``"stalled"``: still waiting when the op's bound (``wait_s``) passed: D would
  wait forever (D's engine keeps the request and its blocks);
* ``info``, outcome ``"raised"``: D did not answer its control channel.

Harness env, stdlib + pyzmq (nodekit.control). Op records carry counts and states only.
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
import uuid
from typing import Any

from nodekit.control import ControlClient, process_stats
from nodekit.journal import JournalWriter
from nodekit.workload import Horizon, Tally, add_workload_arguments, finish, paced, run_workers, start_node

POLL_S = 0.05


class Workload:
    def __init__(self, cfg: dict, journal: JournalWriter):
        self.cfg, self.journal = cfg, journal
        self._ids = iter(range(1, 1 << 30))
        # a D reused from an earlier run remembers that run's ids (a repeat is refused as a duplicate):
        # each workload's ids are its own, whatever the seed
        self._run = uuid.uuid4().hex[:6]
        self._lock = threading.Lock()
        self.orphaned = threading.Event()
        self.tally = Tally("transfer")

    def next_id(self) -> int:
        with self._lock:
            return next(self._ids)

    def call(self, worker: int, client: ControlClient, decode: str = "decode") -> None:
        op_id = self.next_id()
        req = f"lw-{self.cfg['seed']}-{self._run}-{op_id:05d}"
        tokens = int(self.cfg["tokens"])
        t0 = time.monotonic()
        self.journal.write({"type": "op", "id": op_id, "process": worker, "f": "transfer", "phase": "invoke",
                            "t": t0, "expected": "done", "tokens": tokens, "decode": decode})
        done: dict[str, Any] = {"type": "op", "id": op_id, "process": worker, "f": "transfer", "decode": decode}
        bound = t0 + float(self.cfg["wait_s"])
        try:
            adm = client.call("admit", timeout_ms=2000, req=req, tokens=tokens)
            if not adm.get("admitted"):
                done.update(phase="fail", value=None, outcome="refused", code=str(adm.get("why", "")))
            else:
                st: dict = {"state": "waiting"}
                while True:
                    st = client.call("status", timeout_ms=2000, req=req)
                    if st.get("state") != "waiting" or time.monotonic() >= bound:
                        break
                    time.sleep(POLL_S)
                blocks = {"blocks": st.get("blocks"), "blocks_reported": st.get("blocks_reported")}
                if st.get("state") == "done":
                    done.update(phase="ok", value="done", outcome="ok", code="", **blocks)
                elif st.get("state") == "failed":
                    done.update(phase="fail", value="failed", outcome="failed_load", code="", **blocks)
                else:
                    done.update(phase="info", value="waiting", outcome="stalled", code="still_waiting", **blocks)
        except Exception as exc:
            done.update(phase="info", value=None, outcome="raised", code=type(exc).__name__)
        t = time.monotonic()
        done.update(t=t, elapsed_ms=round((t - t0) * 1000.0, 3))
        self.journal.write(done)
        self.tally.count(done)

    def run(self) -> int:
        cfg = self.cfg
        self.journal.write({"type": "probe", "node": "client", "when": "baseline", "t": time.monotonic(),
                            **process_stats(), "counters": {}})
        n = int(cfg["concurrency"])
        # worker i drives D number i mod the number of Ds (the topology's D roles, in order)
        controls = dict(cfg["decode_controls"])
        roles = list(controls)
        clients = [ControlClient(controls[roles[i % len(roles)]]) for i in range(n)]
        print("READY", flush=True)
        if signal.sigtimedwait({signal.SIGUSR1}, float(cfg.get("go_timeout_s", 60.0))) is None:
            for c in clients:
                c.close()
            return 0
        t0 = time.monotonic()
        t_start = t0 + float(cfg.get("start_s", 0.0))
        t_end = Horizon(t0 + float(cfg["duration_s"]), cfg.get("horizon_path"))
        interval = n / float(cfg["rate"])

        def work(i: int, first_at: float) -> None:
            for _ in paced(first_at, t_end, interval, self.orphaned):
                self.call(i, clients[i], roles[i % len(roles)])

        stuck, crashed = run_workers(self.journal, "workload", n, work, t_start=t_start, t_end=t_end,
                                     interval=interval, grace=float(cfg["grace_s"]))
        for i, c in enumerate(clients):
            if i not in stuck:
                c.close()
        return finish(self.journal, stuck, crashed, counters=self.tally.counters())


def add_node_arguments(p: argparse.ArgumentParser, kind: str) -> None:  # noqa: ARG001
    add_workload_arguments(p)


def run_node(args: argparse.Namespace) -> int:
    cfg = start_node(args)
    return Workload(cfg, JournalWriter(args.journal)).run()
