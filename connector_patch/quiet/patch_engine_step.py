"""Runtime patch of ``vllm.v1.engine.core.EngineCoreProc._process_engine_step`` (vLLM 0.32.0).

Upstream, after a step that ran no model while the scheduler still has requests, sleeps 1 ms and
steps again: ~1000 empty steps a second, each an RPC to the workers, for as long as a request waits
for remote KV or P keeps blocks for D (up to the abort timeout, 480 s by default). Here that sleep
is :func:`connector_patch.quiet.backoff.wait_quietly`: 1 ms after any progress (as upstream), then
growing eightfold up to the cap, and cut short at once by anything on the engine's input queue or a wake
from a worker's connector (:mod:`.channel`). Everything else is upstream's body unchanged.
The upstream diff it stands for: ``connector_patch/upstream/vllm/0.32.0/01-engine-core-quiet-wait.diff``.
"""

from __future__ import annotations

TARGET = ("vllm.v1.engine.core", "EngineCoreProc", "_process_engine_step")
# sha256 of inspect.getsource() of the function this replaces, per supported vLLM version:
# a different body means upstream changed it, and the patch is refused rather than applied blind
UPSTREAM_SHA256 = {"0.32.0": "b894c3b32cc020f7c81bf70b7cafecb3d04708e9d8975276170a2da70de2bcb7"}


def made_progress(outputs, model_executed: bool) -> bool:
    """A step that ran the model, or produced an output or a finished request, is progress."""
    if model_executed:
        return True
    for out in (outputs or {}).values():
        if getattr(out, "outputs", None) or getattr(out, "finished_requests", None):
            return True
    return False


def build(original, engine_state):
    """The replacement; ``engine_state(engine)`` gives the engine's backoff, wake counter and cap."""

    def _process_engine_step(self) -> bool:
        state = engine_state(self)
        if state is None:  # quiet waiting is off for this engine: upstream's own code
            return original(self)
        seen = state.wakes.seq
        outputs, model_executed = self.step_fn()
        for output in outputs.items() if outputs else ():
            self.output_queue.put_nowait(output)
        self.post_step(model_executed)
        if made_progress(outputs, model_executed):
            state.backoff.reset()
        elif self.scheduler.has_requests():
            q = self.input_queue
            if state.wait(q, seen):
                state.backoff.reset()
        return model_executed

    _process_engine_step.__doc__ = original.__doc__
    _process_engine_step.__pdchaos_patch__ = __name__
    return _process_engine_step
