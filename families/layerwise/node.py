"""Node kinds ``layerwise-decode`` (D) and ``layerwise-prefill`` (P): vllm-ascend's real connector.

``pdchaos node layerwise-decode --impl upstream|hardened --kv-port N --dist-port M --metaserver URL
...`` (the harness's env) replaces itself with the conformance env's python running :func:`main`
(harness/nodeenv/exec_node.py): same pid, READY line and control channel.

* ``--impl upstream``: vllm-ascend 0.23.0.post1's ``MooncakeLayerwiseConnector``, unmodified;
* ``--impl patched``: upstream's ``MooncakeLayerwiseConnector`` from ``--upstream-overlay DIR`` (a copy of
  the env's vllm-ascend with connector_patch/upstream/vllm-ascend/0.23.0.post1/ applied), no plugin;
* ``--impl hardened``: ``connector_patch.layerwise.ascend_connector.HardenedMooncakeLayerwiseConnector``,
  or ``--hardened-class module:Class`` (a subclass of it: a mutation run's, tests/mutants/system/),
  imported with ``--plugin-path DIR`` first on ``sys.path``.

D (``kv_consumer``) builds the connector's scheduler and worker sides (its listener binds
``127.0.0.1:kv-port`` on a ROUTER) and runs :class:`~.engine.DecodeEngine` (vLLM's real v1
Scheduler, ``--policy`` its ``kv_load_failure_policy``); control commands
``admit`` {req, tokens} and ``status`` {req}. P (``kv_producer``) builds the worker side (its
sending thread over :class:`~.fake_engine.FakeTransferEngine`) and runs
:class:`~.engine.PrefillEngine`; commands ``submit`` {params} (what the metaserver forwards; its
answer's ticket), ``forwarded`` {ticket} (done, sent: what a metaserver waiting for P polls) and
``engine_fault`` {mode, delay_ms}. The control channel is the harness's (nodekit/control.py); the
commands are how the workload and the metaserver play the parts of vLLM's API front end and the
proxy, never part of the connector.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

IMPLS = ("upstream", "hardened", "patched")
ROLES = {"layerwise-decode": "kv_consumer", "layerwise-prefill": "kv_producer"}
READY_TIMEOUT_S = 240.0  # torch + vLLM + vllm-ascend imports: 10-60 s on a busy 2-core host
ENGINE_RPC_PORT = {"kv_consumer": 17002, "kv_producer": 17001}  # what the fake engine reports (never dialled)


def add_node_arguments(p: argparse.ArgumentParser, kind: str) -> None:
    p.add_argument("--impl", required=True, choices=IMPLS)
    p.add_argument("--kv-port", type=int, required=True, help="kv_transfer_config.kv_port (D's listener port)")
    p.add_argument("--dist-port", type=int, required=True, help="a free port for vLLM's gloo world group")
    p.add_argument("--engine-id", default=kind.split("-")[-1] + "-0")
    p.add_argument("--metaserver", default="", help="D: the URL its scheduler POSTs transfer params to")
    p.add_argument("--recv-timeout", type=float, default=60.0, help="hardened: layerwise_recv_timeout_s")
    p.add_argument("--meta-timeout", type=float, default=2.0, help="hardened: layerwise_meta_timeout_s")
    p.add_argument("--post-timeout", type=float, default=5.0, help="hardened: metaserver_timeout_s")
    p.add_argument("--signal-timeout", type=float, default=2.0, help="hardened: layerwise_signal_timeout_s")
    p.add_argument("--write-grace", type=float, default=5.0, help="hardened: layerwise_write_grace_s")
    p.add_argument("--batch", type=int, default=1, help="P: requests per forward pass (at most)")
    p.add_argument("--policy", default="fail", choices=("fail", "recompute"),
                   help="kv_load_failure_policy of D's scheduler (vLLM's default: fail)")
    p.add_argument("--hardened-class", default="", metavar="MODULE:CLASS",
                   help="hardened: run this subclass of the hardened connector instead (a mutation run's)")
    p.add_argument("--plugin-path", default="", metavar="DIR", help="a folder put first on sys.path")
    p.add_argument("--upstream-overlay", default="", metavar="DIR",
                   help="patched: a copy of vllm-ascend with the upstream diffs applied, put first on sys.path "
                        "(harness/nodeenv/overlay.py)")
    p.add_argument("--control", default=None)
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(kind=kind)


def _argv(args: argparse.Namespace) -> list[str]:
    out = [args.kind, "--impl", args.impl, "--kv-port", str(args.kv_port), "--dist-port", str(args.dist_port),
           "--engine-id", args.engine_id, "--metaserver", args.metaserver, "--recv-timeout", str(args.recv_timeout),
           "--meta-timeout", str(args.meta_timeout), "--post-timeout", str(args.post_timeout),
           "--signal-timeout", str(args.signal_timeout), "--write-grace", str(args.write_grace),
           "--policy", args.policy,
           "--batch", str(args.batch), "--log-level", args.log_level, "--hardened-class", args.hardened_class,
           "--plugin-path", args.plugin_path, "--upstream-overlay", args.upstream_overlay]
    return out + (["--control", args.control] if args.control else [])


def run_node(args: argparse.Namespace) -> int:
    from nodekit.nodeio import usage_exit

    for name in ("kv_port", "dist_port"):
        if not 1024 <= getattr(args, name) <= 65535:
            return usage_exit(f"--{name.replace('_', '-')}: a port in 1024..65535")
    if not 1 <= args.batch <= 16:
        return usage_exit("--batch: an int in 1..16")
    if args.hardened_class and (args.impl != "hardened" or ":" not in args.hardened_class):
        return usage_exit("--hardened-class: MODULE:CLASS, with --impl hardened only")
    if args.plugin_path and not (os.path.isabs(args.plugin_path) and os.path.isdir(args.plugin_path)):
        return usage_exit(f"--plugin-path {args.plugin_path!r}: not an absolute path of a folder")
    from harness.nodeenv.overlay import overlay_arg_problem

    bad = overlay_arg_problem(args.impl == "patched", args.upstream_overlay, "vllm_ascend")
    if bad:
        return usage_exit(bad)
    if args.kind == "layerwise-decode" and not args.metaserver.startswith("http://127.0.0.1:"):
        return usage_exit("--metaserver: D needs http://127.0.0.1:PORT/... (loopback only)")
    from stacks.ascend_cpu.recipe import ascend_conf_env
    from harness.nodeenv.exec_node import exec_module

    exec_module(ascend_conf_env().python, __name__, _argv(args))
    return 2  # not reached


# --------------------------------------------------------------------------- conformance-env side

def _app(args: argparse.Namespace):
    from nodekit.nodeio import NodeApp

    from . import stack
    from .engine import DecodeEngine, PrefillEngine
    from .fake_engine import FakeTransferEngine

    role = ROLES[args.kind]

    class App(NodeApp):
        def __init__(self) -> None:
            # D's engine reports its listener port as its rpc port: unique per live D, so P's engine
            # finds this D's memory map by it (fake_engine.py)
            self.engine = FakeTransferEngine(rpc_port=args.kv_port if role == "kv_consumer"
                                             else ENGINE_RPC_PORT[role])
            self.side = None
            shm = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
            self.shm_prefix = os.path.join(shm, f"pdchaos-lw-{os.getpid()}") if role == "kv_consumer" else ""

        def bind(self) -> None:
            folder = Path(tempfile.mkdtemp(prefix="pdc-lw-model-"))
            extra = {"layerwise_recv_timeout_s": args.recv_timeout, "layerwise_meta_timeout_s": args.meta_timeout,
                     "metaserver_timeout_s": args.post_timeout, "layerwise_signal_timeout_s": args.signal_timeout,
                     "layerwise_write_grace_s": args.write_grace}
            import zmq

            try:
                cfg, worker, sched, caches = stack.build(args.impl, role, args.kv_port, args.engine_id,
                                                       stack.write_model_dir(folder / "model"), args.dist_port,
                                                       self.engine, extra, args.policy,
                                                       scheduler_side=role != "kv_consumer",
                                                       hardened_class=args.hardened_class,
                                                       plugin_path=args.plugin_path,
                                                       shm_prefix=self.shm_prefix)
            except zmq.ZMQError:
                raise
            except Exception as exc:  # a port taken (gloo's store), a config vLLM refuses: one line, no traceback
                first = (str(exc).strip().splitlines() or [""])[0][:300]
                raise zmq.ZMQError(getattr(exc, "errno", None) or 22, f"{type(exc).__name__}: {first}") from None
            if role == "kv_consumer":
                self.engine.publish_memory(stack.shm_files(caches))
            self.side = (DecodeEngine(worker, cfg, args.metaserver, caches) if role == "kv_consumer"
                         else PrefillEngine(worker, caches, args.batch, tag=stack.send_meta_tagger(args.impl)))
            self.side.start()

        def stats(self) -> dict:
            if self.side is None:
                return {"counters": {}, "alive": False}
            counters = self.side.stats()
            counters.update({f"engine_{k}": v for k, v in self.engine.counters.items()})
            return {"counters": counters, "alive": self.side.alive()}

        def handlers(self) -> dict:
            side = self.side

            if role == "kv_consumer":
                def admit(m: dict) -> dict:
                    return side.admit(str(m["req"]), int(m.get("tokens", 64)))

                def status(m: dict) -> dict:
                    return side.status(str(m["req"]))

                return {"admit": admit, "status": status}

            def submit(m: dict) -> dict:
                return side.submit(dict(m.get("params") or {}))

            def forwarded(m: dict) -> dict:
                return side.forwarded(int(m["ticket"]))

            def engine_fault(m: dict) -> dict:
                self.engine.set(str(m.get("mode", "ok")), int(m.get("delay_ms", 0)), int(m.get("port", 0)))
                return {"mode": self.engine.mode, "delayed_in_flight": self.engine.delayed_in_flight}

            def prefill_delay(m: dict) -> dict:
                side.layer_delay_s = max(0.0, float(m.get("layer_s", 0.0)))
                return {"layer_s": side.layer_delay_s, "slow_forwards": side.slow_forwards}

            return {"submit": submit, "forwarded": forwarded, "engine_fault": engine_fault,
                    "prefill_delay": prefill_delay}

        def close(self) -> None:
            if self.side is not None:
                self.side.stop()
            self.engine.close()
            if self.shm_prefix:
                import glob

                for path in glob.glob(self.shm_prefix + "-*"):
                    try:
                        os.unlink(path)
                    except OSError:
                        pass

        def ready_message(self) -> str:
            which = f"{args.impl} ({args.hardened_class})" if args.hardened_class else args.impl
            return f"{which} layerwise connector, {role}, {stack.NUM_LAYERS} layers"

    return App()


def main(argv: list[str] | None = None) -> int:
    from nodekit.nodeio import run_node as run_node_process

    argv = list(sys.argv[1:] if argv is None else argv)
    kind = argv.pop(0) if argv and argv[0] in ROLES else ""
    if not kind:
        print("error: first argument: layerwise-decode or layerwise-prefill", file=sys.stderr)
        return 2
    p = argparse.ArgumentParser(prog=f"pdchaos node {kind}")
    add_node_arguments(p, kind)
    args = p.parse_args(argv)
    if args.upstream_overlay:  # patched: upstream's code with the diffs, before anything imports vllm_ascend
        sys.path.insert(0, args.upstream_overlay)
    from . import stack

    stack.import_stack()
    return run_node_process(lambda: _app(args), endpoints={"--kv-port": f"tcp://127.0.0.1:{args.kv_port}"},
                            bind_flag="--kv-port", control=args.control, log_level=args.log_level)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # upstream's scheduler keeps a non-daemon executor; a POST it never got an answer to would
    # hold the interpreter's exit forever: the node has closed what it owns, so it leaves now
    os._exit(code)
