"""connector_patch.quiet against vLLM 0.32.0's real classes, in the P/D node env's python (run by
tests/connector_patch/test_quiet_vllm.py). argv: REPO. Prints one line ``PDCHAOS-QUIET-RESULT {json}``
(counts, times and names only).

Real here: vLLM's ``EngineCoreProc._process_engine_step`` and ``SpinCondition`` as installed (their
sources are what the patches fingerprint), a real ``SpinCondition`` reader and writer over ZMQ, the
wake channel's real ipc sockets. The engine is a stand-in object (an ``EngineCoreProc`` is a whole
vLLM engine with a model and worker processes): it has the attributes the step function uses
(``step_fn``, ``output_queue``, ``post_step``, ``scheduler.has_requests``, ``input_queue``) and its
``step_fn`` counts calls and reports no model run, as a step of an engine that only waits does.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
import types

sys.path.insert(0, sys.argv[1])

import vllm  # noqa: E402
from vllm.v1.engine.core import EngineCoreProc  # noqa: E402
from vllm.distributed.device_communicators import shm_broadcast  # noqa: E402

from connector_patch import quiet  # noqa: E402

out: dict = {"version": vllm.__version__}
originals = {
    "step": EngineCoreProc.__dict__["_process_engine_step"],
    "record_read": shm_broadcast.SpinCondition.__dict__["record_read"],
    "wait": shm_broadcast.SpinCondition.__dict__["wait"],
}

# 1. an unsupported version: nothing patched, one line says why
out["refused_version"] = quiet.install(100, "engine", version="0.31.0")
out["untouched_after_refusal"] = all(
    getattr(o, "__pdchaos_patch__", None) is None for o in (EngineCoreProc.__dict__["_process_engine_step"],
                                                            shm_broadcast.SpinCondition.__dict__["wait"]))
quiet.uninstall()

# 2. an upstream function that changed: refused, all or none
def _changed(self) -> None:  # noqa: ARG001 - a different body than the one the patch was written for
    return None


shm_broadcast.SpinCondition.wait = _changed
out["refused_changed"] = quiet.install(100, "engine")
out["none_patched_when_one_changed"] = EngineCoreProc.__dict__["_process_engine_step"] is originals["step"]
shm_broadcast.SpinCondition.wait = originals["wait"]
quiet.uninstall()

# 3. switched off
out["off"] = quiet.install(0, "engine")
out["off_untouched"] = EngineCoreProc.__dict__["_process_engine_step"] is originals["step"]

# 4. installed
out["installed"] = quiet.install(100, "engine")
out["patched"] = sorted(getattr(f, "__pdchaos_patch__", "") for f in (
    EngineCoreProc.__dict__["_process_engine_step"], shm_broadcast.SpinCondition.__dict__["record_read"],
    shm_broadcast.SpinCondition.__dict__["wait"]))


class Engine:
    """Stand-in with what _process_engine_step touches; its steps run no model."""

    def __init__(self) -> None:
        self.input_queue: queue.Queue = queue.Queue()
        self.output_queue: queue.Queue = queue.Queue()
        self.steps = 0
        self.scheduler = types.SimpleNamespace(has_requests=lambda: True)

    def step_fn(self):
        self.steps += 1
        return {}, False

    def post_step(self, model_executed: bool) -> None:  # noqa: ARG002
        pass


def run_for(engine: Engine, seconds: float) -> int:
    end = time.monotonic() + seconds
    n0 = engine.steps
    while time.monotonic() < end:
        EngineCoreProc._process_engine_step(engine)
    return engine.steps - n0


eng = Engine()
out["steps_in_1s_waiting"] = run_for(eng, 1.0)
upstream_eng = Engine()
end = time.monotonic() + 1.0
while time.monotonic() < end:
    originals["step"](upstream_eng)
out["upstream_steps_in_1s_waiting"] = upstream_eng.steps


def woken_after(trigger) -> float:
    """Seconds from ``trigger`` to the next step, with the engine deep in its backoff."""
    run_for(eng, 0.5)
    stepped = threading.Event()
    t_trig: list[float] = []

    def fire() -> None:
        t_trig.append(time.monotonic())
        trigger()

    n0 = eng.steps
    threading.Timer(0.03, fire).start()
    end = time.monotonic() + 2.0
    while time.monotonic() < end and not stepped.is_set():
        EngineCoreProc._process_engine_step(eng)
        if t_trig and eng.steps > n0:
            stepped.set()
    return round(time.monotonic() - t_trig[0], 4) if t_trig else -1.0


out["woken_by_input_s"] = woken_after(lambda: eng.input_queue.put(("ADD", None)))
while not eng.input_queue.empty():
    eng.input_queue.get_nowait()
out["woken_by_local_wake_s"] = woken_after(quiet.wake)

# 5. the wake channel across processes: the listener opened at install answers a child's sender
import subprocess  # noqa: E402

seq0 = quiet._local_wakes.seq if quiet._local_wakes else None
child = subprocess.run([sys.executable, "-c", (
    "import sys, os, time; sys.path.insert(0, sys.argv[1]);"
    "from connector_patch.quiet.channel import WakeSender;"
    "s = WakeSender(os.getppid()); time.sleep(0.3); s.wake(); time.sleep(0.2); print(s.sent)"), sys.argv[1]],
    capture_output=True, text=True, timeout=60)
out["child_wake_sent"] = child.stdout.strip()
time.sleep(0.2)
out["child_wake_seen"] = (quiet._local_wakes.seq - seq0) if quiet._local_wakes and seq0 is not None else None

# 6. a real SpinCondition: the window follows the reader's traffic; an idle wait is bounded
import zmq  # noqa: E402

ctx = zmq.Context()
addr = f"ipc:///tmp/pdchaos-quiet-test-{time.monotonic_ns()}"
writer = shm_broadcast.SpinCondition(False, ctx, addr)
reader = shm_broadcast.SpinCondition(True, ctx, addr)
reader.record_read()
time.sleep(0.05)
reader.record_read()  # after a long gap: idle at once
out["window_after_long_gap"] = reader.busy_loop_s
reader.record_read()  # right after: dense traffic
out["window_in_dense_traffic"] = reader.busy_loop_s
time.sleep(0.1)  # past the window: the next wait polls, bounded though no one writes
t0 = time.monotonic()
reader.wait(timeout_ms=None)
out["idle_wait_returned_after_s"] = round(time.monotonic() - t0, 4)
t0 = time.monotonic()
threading.Timer(0.005, writer.notify).start()
reader.wait(timeout_ms=None)
out["idle_wait_with_notify_s"] = round(time.monotonic() - t0, 4)

quiet.uninstall()
out["restored"] = (EngineCoreProc.__dict__["_process_engine_step"] is originals["step"]
                   and shm_broadcast.SpinCondition.__dict__["wait"] is originals["wait"]
                   and shm_broadcast.SpinCondition.__dict__["record_read"] is originals["record_read"])
print("PDCHAOS-QUIET-RESULT " + json.dumps(out), flush=True)
