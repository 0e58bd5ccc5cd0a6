"""Runtime patch of ``vllm.distributed.device_communicators.shm_broadcast.SpinCondition.record_read``
(vLLM 0.32.0).

Upstream only stamps the time of the read; ``SpinCondition.wait`` then busy-polls with
``sched_yield`` until ``busy_loop_s`` (1 s, hard-coded) after it. Here a read also sets the reader's
spin window from the gap since the previous read (:func:`connector_patch.quiet.spin.spin_window_s`):
dense traffic keeps spinning (no added latency while a model runs), a reader whose engine only
waits sleeps on the writer's notification at once. ``wait`` itself is upstream's, unchanged.
The upstream diff it stands for: ``connector_patch/upstream/vllm/0.32.0/02-shm-broadcast-adaptive-spin.diff``.
"""

from __future__ import annotations

import time

from .spin import spin_window_s

TARGET = ("vllm.distributed.device_communicators.shm_broadcast", "SpinCondition", "record_read")
UPSTREAM_SHA256 = {"0.32.0": "3af743c903ce01354cb4c0b5f7ed152fc8d0f41474dbc70c7e07a197a1627a56"}


def build(original):
    """The replacement (installed only where quiet waiting is on: :func:`connector_patch.quiet.install`)."""

    def record_read(self):
        now = time.monotonic()
        cap = self.__dict__.setdefault("_pdchaos_busy_cap_s", self.busy_loop_s)
        self.busy_loop_s = spin_window_s(now - self.last_read, cap)
        self.last_read = now

    record_read.__pdchaos_patch__ = __name__
    return record_read
