"""The fake transfer engine: the nemesis-controlled peer behind P's sending thread.

Not a stub of upstream code: it stands where the Mooncake transfer engine sits (``global_te``'s
engine), so vllm-ascend's real sending thread calls it exactly as it calls Mooncake, and a fault
decides what each call does. Stdlib only (it is built in the conformance env, set from the control
channel).

Modes: ``ok`` (the write succeeds after ``delay_ms``), ``raise`` (``batch_transfer_sync_write``
raises RuntimeError, as the Mooncake binding does on a broken session), ``ret`` (it returns -1, the
engine's error code). Counts calls, bytes and failures; never logs data.

It **copies the bytes** of a successful write, as the real engine's RDMA write does: D's KV caches
live in shared-memory files (``stack.kv_caches``), D's engine publishes where (``publish_memory``:
``MEMDIR/<rpc_port>.json``, its base addresses, sizes and files; D's rpc port is unique per live
D), and P's engine, given a session ``host:rpc_port``, reads that map and writes each source range
of its own memory into the file at the destination's offset. A destination in no published region
is counted (``unmapped_writes``) and not copied: D's content check then sees those layers missing.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import tempfile
import threading
import time

MODES = ("ok", "raise", "ret")


MEMDIR = os.path.join(tempfile.gettempdir(), "pdchaos-layerwise-mem")


class FakeTransferEngine:
    def __init__(self, rpc_port: int = 0, memdir: str = MEMDIR):
        self._lock = threading.Lock()
        self.mode = "ok"
        self.delay_ms = 0
        self.port = 0  # the mode's D (rpc port); 0: every D
        self.delayed_in_flight = 0  # writes sleeping out a delay right now
        self.rpc_port = rpc_port
        self.memdir = memdir
        self._published: str | None = None
        self._maps: dict[str, tuple[int, list]] = {}  # rpc port -> (map file mtime, regions)
        self._files: dict[str, mmap.mmap] = {}
        self.counters = {"writes": 0, "write_bytes": 0, "write_errors": 0, "registered": 0, "copied_bytes": 0,
                         "unmapped_writes": 0}

    # --- D: where its memory is
    def publish_memory(self, regions: list[tuple[int, int, str]]) -> None:
        """(base address, size, shared-memory file) of each of D's KV tensors, for P's engine."""
        os.makedirs(self.memdir, exist_ok=True)
        path = os.path.join(self.memdir, f"{self.rpc_port}.json")
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"pid": os.getpid(), "regions": [list(r) for r in regions]}, f)
        os.replace(tmp, path)
        self._published = path

    def close(self) -> None:
        with self._lock:
            for m in self._files.values():
                m.close()
            self._files.clear()
        if self._published:
            try:
                os.unlink(self._published)
            except OSError:
                pass

    # --- P: the copy
    def _regions(self, session_id: str) -> list:
        port = session_id.rpartition(":")[2]
        path = os.path.join(self.memdir, f"{port}.json")
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            return []
        cached = self._maps.get(port)
        if cached is None or cached[0] != mtime:
            try:
                with open(path, encoding="utf-8") as f:
                    regions = json.load(f)["regions"]
            except (OSError, ValueError, KeyError):
                return []
            cached = self._maps[port] = (mtime, regions)
        return cached[1]

    def _file(self, path: str) -> mmap.mmap:
        m = self._files.get(path)
        if m is None:
            with open(path, "r+b") as f:
                m = self._files[path] = mmap.mmap(f.fileno(), 0)
        return m

    def _copy(self, session_id: str, src: list, dst: list, length: list) -> None:
        regions = self._regions(session_id)
        for s, d, n in zip(src, dst, length):
            s, d, n = int(s), int(d), int(n)
            for base, size, path in regions:
                if base <= d and d + n <= base + size:
                    try:
                        self._file(path)[d - base:d - base + n] = ctypes.string_at(s, n)
                    except (OSError, ValueError):
                        break  # D's file is gone (D stopped): not copied
                    self.counters["copied_bytes"] += n
                    break
            else:
                self.counters["unmapped_writes"] += 1

    def set(self, mode: str, delay_ms: int = 0, port: int = 0) -> None:
        """``port``: the mode applies to writes to that D's session only (its rpc port); 0: all."""
        if mode not in MODES:
            raise ValueError(f"engine mode {mode!r}; known: {', '.join(MODES)}")
        with self._lock:
            self.mode, self.delay_ms, self.port = mode, max(0, int(delay_ms)), int(port)

    # --- what vllm-ascend calls
    def initialize(self, *args, **kwargs) -> int:  # noqa: ARG002
        return 0

    def get_rpc_port(self) -> int:
        return self.rpc_port

    def register_memory(self, ptr: int, size: int) -> int:  # noqa: ARG002
        with self._lock:
            self.counters["registered"] += 1
        return 0

    def batch_transfer_sync_write(self, session_id: str, src: list, dst: list, length: list) -> int:
        with self._lock:
            mode, delay = self.mode, self.delay_ms
            if self.port and session_id.rpartition(":")[2] != str(self.port):
                mode, delay = "ok", 0  # another D's session: not faulted
            self.counters["writes"] += 1
        if delay:
            with self._lock:
                self.delayed_in_flight += 1
            try:
                time.sleep(delay / 1000.0)
            finally:
                with self._lock:
                    self.delayed_in_flight -= 1
        if mode == "ok":
            with self._lock:
                self.counters["write_bytes"] += int(sum(length))
                self._copy(session_id, src, dst, length)
            return 0
        with self._lock:
            self.counters["write_errors"] += 1
        if mode == "raise":
            raise RuntimeError("transfer engine: session broken (injected)")
        return -1
