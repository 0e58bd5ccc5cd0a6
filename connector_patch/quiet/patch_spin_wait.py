"""Runtime patch of ``vllm.distributed.device_communicators.shm_broadcast.SpinCondition.wait``
(vLLM 0.32.0).

Upstream's idle branch polls the writer's notification socket with the read's own timeout (none
for a worker waiting for its next step). The notification is a PUB message with a send high-water
mark of 1, so one sent while the previous one is still in flight is dropped; upstream rarely
reaches the idle branch right after a read (it spins for 1 s first), but a reader that goes idle
at once (:mod:`.patch_spin_record_read`) does, and a dropped notification would leave it asleep
beside a written buffer. Here the idle poll is bounded (``IDLE_POLL_MS``): the reader then looks
at the buffer again, so a lost notification costs at most that, and an idle reader wakes about
50 times a second (microseconds each) instead of spinning. Everything else is upstream's.
The upstream diff it stands for: ``connector_patch/upstream/vllm/0.32.0/02-shm-broadcast-adaptive-spin.diff``.
"""

from __future__ import annotations

import time

TARGET = ("vllm.distributed.device_communicators.shm_broadcast", "SpinCondition", "wait")
UPSTREAM_SHA256 = {"0.32.0": "3c5dd220ba84735e4a9d3534fe67a07edf94d69c4c30eb85cb6d1ce2b1de8d57"}
IDLE_POLL_MS = 20


def build(original):
    """The replacement (installed only where quiet waiting is on: :func:`connector_patch.quiet.install`)."""

    def wait(self, timeout_ms: int | None = None) -> None:
        if time.monotonic() > self.last_read + self.busy_loop_s:
            timeout_ms = IDLE_POLL_MS if timeout_ms is None else min(timeout_ms, IDLE_POLL_MS)
        return original(self, timeout_ms)

    wait.__doc__ = original.__doc__
    wait.__pdchaos_patch__ = __name__
    return wait
