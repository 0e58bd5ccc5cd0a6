"""The fake transfer engine: the nemesis-controlled peer behind P's sending thread.

Not a stub of upstream code: it stands where the Mooncake transfer engine sits (``global_te``'s
engine), so vllm-ascend's real sending thread calls it exactly as it calls Mooncake, and a fault
decides what each call does. Stdlib only (it is built in the conformance env, set from the control
channel).

Modes: ``ok`` (the write succeeds after ``delay_ms``), ``raise`` (``batch_transfer_sync_write``
raises RuntimeError, as the Mooncake binding does on a broken session), ``ret`` (it returns -1, the
engine's error code). Counts calls, bytes and failures; never looks at data.
"""

from __future__ import annotations

import threading
import time

MODES = ("ok", "raise", "ret")


class FakeTransferEngine:
    def __init__(self, rpc_port: int = 0):
        self._lock = threading.Lock()
        self.mode = "ok"
        self.delay_ms = 0
        self.rpc_port = rpc_port
        self.counters = {"writes": 0, "write_bytes": 0, "write_errors": 0, "registered": 0}

    def set(self, mode: str, delay_ms: int = 0) -> None:
        if mode not in MODES:
            raise ValueError(f"engine mode {mode!r}; known: {', '.join(MODES)}")
        with self._lock:
            self.mode, self.delay_ms = mode, max(0, int(delay_ms))

    # --- what vllm-ascend calls
    def initialize(self, *args, **kwargs) -> int:  # noqa: ARG002
        return 0

    def get_rpc_port(self) -> int:
        return self.rpc_port

    def register_memory(self, ptr: int, size: int) -> int:  # noqa: ARG002
        with self._lock:
            self.counters["registered"] += 1
        return 0

    def batch_transfer_sync_write(self, session_id: str, src: list, dst: list, length: list) -> int:  # noqa: ARG002
        with self._lock:
            mode, delay = self.mode, self.delay_ms
            self.counters["writes"] += 1
        if delay:
            time.sleep(delay / 1000.0)
        if mode == "ok":
            with self._lock:
                self.counters["write_bytes"] += int(sum(length))
            return 0
        with self._lock:
            self.counters["write_errors"] += 1
        if mode == "raise":
            raise RuntimeError("transfer engine: session broken (injected)")
        return -1
