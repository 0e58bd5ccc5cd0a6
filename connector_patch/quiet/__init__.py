"""Quiet waiting: runtime patches to vLLM that stop a node from spinning while it only waits on a
peer (a request waiting for remote KV; blocks P keeps for D), installed by the hardened connectors
the way vllm-ascend's ``patch/`` modules change vLLM: one small module per patched function, each
with the upstream diff it stands for (``diffs/``), never an edit of an installed file.

- :mod:`.patch_engine_step`: the engine core's empty steps back off (1 ms, then eight times longer each time, up to
  ``quiet_wait_max_ms``) and are woken at once by new input or a connector's progress.
- :mod:`.patch_spin_record_read`: the shared-memory queue's readers spin only while traffic is
  dense, and otherwise sleep on the writer's notification.
- :mod:`.channel`: the worker → engine core wake channel the hardened connector's progress uses;
  :func:`wake_at` wakes the engine at a time the connector names (a load's deadline), so the cap
  may be long without a deadline being noticed late.

Active only where a hardened connector runs: :func:`install` is called by the hardened
connector's constructors (scheduler side in the engine core, worker side in each worker), so an
upstream node's vLLM is never touched. Switched off with ``quiet_wait_max_ms: 0`` in
``kv_connector_extra_config``. Installed only on a vLLM version whose patched functions have the
exact source the patches were written against (``UPSTREAM_SHA256``); otherwise nothing is patched
and one line says why (all or none: never half-installed).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import logging
import os
import threading
from dataclasses import dataclass

from . import patch_engine_step, patch_spin_record_read, patch_spin_wait
from .backoff import Alarm, IdleBackoff, WakeCounter, wait_quietly
from .channel import WakeListener, WakeSender

logger = logging.getLogger("connector_patch.quiet")

PATCHES = (patch_engine_step, patch_spin_record_read, patch_spin_wait)
SUPPORTED_VLLM = tuple(sorted(set.intersection(*(set(p.UPSTREAM_SHA256) for p in PATCHES))))

_lock = threading.Lock()
_installed: dict[str, object] = {}  # "module.Class.function" -> the original
_cap_s = 0.0
_refused: str | None = None
_sender: WakeSender | None = None
_listener: WakeListener | None = None
_local_wakes: WakeCounter | None = None  # the engine in this process, when there is one


def source_sha256(fn) -> str:
    return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()


def _resolve(target):
    module, cls, name = target
    owner = getattr(importlib.import_module(module), cls)
    return owner, name, owner.__dict__[name]


def check_targets(version: str) -> list[tuple]:
    """[(owner, name, original, patch module)] when every patch fits this vLLM; else ValueError naming the first that does not."""
    found = []
    for patch in PATCHES:
        where = ".".join(patch.TARGET)
        want = patch.UPSTREAM_SHA256.get(version)
        if want is None:
            raise ValueError(f"vLLM {version} is not one the quiet-wait patches support "
                             f"({', '.join(SUPPORTED_VLLM) or 'none'})")
        owner, name, original = _resolve(patch.TARGET)
        original = getattr(original, "__pdchaos_original__", original)
        if source_sha256(original) != want:
            raise ValueError(f"{where} differs from vLLM {version}'s as released")
        found.append((owner, name, original, patch))
    return found


@dataclass
class EngineQuiet:
    backoff: IdleBackoff
    wakes: WakeCounter

    def wait(self, q, seen: int) -> bool:
        """Wait before the next empty step; True when woken by input or a connector's progress."""
        return wait_quietly(q.not_empty, q._qsize, self.wakes, seen, self.backoff.next_delay())


def _engine_state(engine):
    """The engine's backoff and wake counter, made at its first step; None (upstream's step) when
    this process has no wake listener (it could not bind: said once, at install)."""
    global _local_wakes
    state = engine.__dict__.get("_pdchaos_quiet", False)
    if state is False:
        state = None
        if _listener is not None:
            _local_wakes = WakeCounter(engine.input_queue.not_empty)
            state = EngineQuiet(IdleBackoff(_cap_s), _local_wakes)
        engine.__dict__["_pdchaos_quiet"] = state
    return state


def _on_wake() -> None:
    wakes = _local_wakes
    if wakes is not None:
        wakes.wake()


def install(cap_ms: int, role: str, version: str | None = None) -> str:
    """Apply the patches in this process (idempotent) and open its end of the wake channel:
    ``role`` "engine" (the engine core, where the scheduler side of the connector lives) listens,
    "worker" sends. Returns what was done, for the node's log."""
    global _cap_s, _refused, _listener, _sender
    if role not in ("engine", "worker"):
        raise ValueError(f"role must be 'engine' or 'worker', got {role!r}")
    with _lock:
        if cap_ms <= 0:
            return "quiet waiting off (quiet_wait_max_ms: 0)"
        if _installed:
            return "quiet waiting on (already installed)"
        if _refused is not None:
            return _refused
        if version is None:
            import vllm
            version = vllm.__version__
        version = version.split("+")[0]  # a local build tag (0.32.0+cpu) patches as its release
        try:
            targets = check_targets(version)
        except (ValueError, ImportError, AttributeError, KeyError, OSError, TypeError) as e:
            _refused = f"quiet waiting not installed: {e}"
            logger.warning("%s", _refused)
            return _refused
        _cap_s = cap_ms / 1000.0
        try:  # opened now, with the node, not at the first wait
            if role == "engine":
                _listener = WakeListener(_on_wake)
            else:
                _sender = WakeSender(os.getppid())
        except Exception as e:  # noqa: BLE001 - the node works as upstream does, and says so
            _refused = f"quiet waiting not installed: its wake channel did not open ({type(e).__name__})"
            logger.warning("%s", _refused)
            return _refused
        for owner, name, original, patch in targets:
            new = patch.build(original, _engine_state) if patch is patch_engine_step else patch.build(original)
            new.__pdchaos_original__ = original
            setattr(owner, name, new)
            _installed[".".join(patch.TARGET)] = original
        return f"quiet waiting on: {len(targets)} vLLM functions patched, empty steps wait up to {cap_ms} ms"


def uninstall() -> None:
    """Put upstream's functions back and close the wake channel (tests)."""
    global _refused, _listener, _sender, _local_wakes
    with _lock:
        if _listener is not None:
            _listener.close()
        if _sender is not None:
            _sender.close()
        _listener = _sender = _local_wakes = None
        for key, original in list(_installed.items()):
            module, cls, name = key.rsplit(".", 2)
            setattr(getattr(importlib.import_module(module), cls), name, original)
            del _installed[key]
        _refused = None


def wake() -> None:
    """A connector made progress: wake this process's engine, or the parent engine core of this worker."""
    if _local_wakes is not None:
        _local_wakes.wake()
    elif _sender is not None:
        _sender.wake()


_alarm: Alarm | None = None


def wake_at(when: float) -> None:
    """Wake this process's engine (or the worker's parent engine core) at ``when`` (time.monotonic):
    a time the connector must look at the clock, e.g. a load's deadline. Nothing when quiet
    waiting is not installed here (the engine steps every 1 ms: upstream's)."""
    global _alarm
    if _local_wakes is None and _sender is None:
        return
    if _alarm is None:
        with _lock:
            if _alarm is None:
                _alarm = Alarm(wake)
    _alarm.at(when)


class WakeEvent(threading.Event):
    """A ``threading.Event`` whose ``set`` also wakes the engine (:func:`wake`)."""

    def set(self) -> None:
        super().set()
        wake()
