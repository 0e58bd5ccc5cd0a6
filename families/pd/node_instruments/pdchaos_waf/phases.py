"""The P/D family's phase journal, inside a vLLM node's processes (a harness instrument, not part
of the system under test; upstream, patched and hardened alike).

Loaded as a vLLM general plugin from the instrument site (``families/pd/plugin_site.py``), active
only where ``PDCHAOS_PHASE_FILE`` is set. It wraps functions of vLLM's own Mooncake connector
worker (``MooncakeConnectorWorker`` in vLLM's mooncake_connector.py), which every target runs (the
hardened worker subclasses it and calls these through ``super()``, or is wrapped on its instance
where it replaces one), and appends one JSON line per event to that file: ``{"t":
time.monotonic(), "phase": NAME, "pid": N}``. Names, times and pids only: never a request id, a
block id or an address. The harness's nemesis reads the file live (harness/phases.py) to start a
fault at a phase.

P (producer):
  ``p_pull_served``    a pull from D was taken off P's queue and is being served
                       (``send_kv_to_decode`` entered: upstream's, which the hardened one calls)
  ``p_pull_answered``  P is done with that pull: its last answer to D was sent, or it gave up
                       (``send_kv_to_decode`` returned or raised)
  ``p_write_started``  P's transfer engine starts writing KV into D's blocks (``_send_blocks``,
                       in P's sender executor thread)
  ``p_write_done``     that write returned (either way)
D (consumer):
  ``d_bootstrap_query_out``  D's query to P's bootstrap server is out (``_connect_to_prefiller_bootstrap``:
                             the first pull to an engine D does not know, or marks stale)
  ``d_pull_out``       D opens a pull to one P worker (``receive_kv_from_single_worker``, the
                       instance's own: the hardened worker replaces upstream's)
  ``d_cancel_sent``    D asks P to cancel transfers (the hardened worker's ``_cancel_round``;
                       upstream never cancels)
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import threading
import time

ENV = "PDCHAOS_PHASE_FILE"
_installed = False
_lock = threading.Lock()
_fd: dict[int, int] = {}  # pid -> fd (a forked process opens its own)


def emit(phase: str) -> None:
    """Append one event (never raises: an instrument must not break the node)."""
    path = os.environ.get(ENV)
    if not path:
        return
    try:
        line = json.dumps({"t": time.monotonic(), "phase": phase, "pid": os.getpid()},
                          separators=(",", ":")) + "\n"
        pid = os.getpid()
        with _lock:
            fd = _fd.get(pid)
            if fd is None:
                fd = _fd[pid] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, line.encode())  # one write of one short line, O_APPEND: lines never interleave
    except Exception:  # noqa: BLE001
        pass


def _wrap(fn, before: str | None, after: str | None = None):  # noqa: ANN001, ANN202
    """``fn`` that emits ``before`` on entry and ``after`` on return (sync or async)."""
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def awrapped(*a, **kw):  # noqa: ANN002, ANN003, ANN202
            if before:
                emit(before)
            try:
                return await fn(*a, **kw)
            finally:
                if after:
                    emit(after)
        awrapped.__pdchaos_phase__ = True
        return awrapped

    @functools.wraps(fn)
    def wrapped(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        if before:
            emit(before)
        try:
            return fn(*a, **kw)
        finally:
            if after:
                emit(after)
    wrapped.__pdchaos_phase__ = True
    return wrapped


# on upstream's class: every target reaches these (the hardened worker through super())
CLASS_LEVEL = {"send_kv_to_decode": ("p_pull_served", "p_pull_answered"),
               "_connect_to_prefiller_bootstrap": ("d_bootstrap_query_out", None)}
# on each worker instance, its own class's method: a subclass may replace upstream's without super()
# (the hardened P writes in chunks in its own _send_blocks since issue 43's 7a: wrapped on upstream's
# class only, p_write_started and p_write_done never came on hardened nodes and a freeze keyed on them
# was a harness error every time)
INSTANCE_LEVEL = {"receive_kv_from_single_worker": ("d_pull_out", None),
                  "_cancel_round": ("d_cancel_sent", None),
                  "_send_blocks": ("p_write_started", "p_write_done")}


def install(worker_cls) -> None:  # noqa: ANN001
    """Wrap ``worker_cls`` (upstream's MooncakeConnectorWorker) once."""
    for name, (before, after) in CLASS_LEVEL.items():
        fn = worker_cls.__dict__.get(name)
        if fn is not None and not getattr(fn, "__pdchaos_phase__", False):
            setattr(worker_cls, name, _wrap(fn, before, after))
    init = worker_cls.__dict__["__init__"]
    if getattr(init, "__pdchaos_phase__", False):
        return

    @functools.wraps(init)
    def __init__(self, *a, **kw):  # noqa: ANN001, ANN002, ANN003, N807
        init(self, *a, **kw)
        for name, (before, after) in INSTANCE_LEVEL.items():
            bound = getattr(self, name, None)
            if bound is not None and not getattr(bound, "__pdchaos_phase__", False):
                setattr(self, name, _wrap(bound, before, after))

    __init__.__pdchaos_phase__ = True
    worker_cls.__init__ = __init__


def register() -> None:
    """The ``vllm.general_plugins`` entry point: wraps the worker when ``PDCHAOS_PHASE_FILE`` is set."""
    global _installed
    if not os.environ.get(ENV) or _installed:
        return
    _installed = True
    from vllm.distributed.kv_transfer.kv_connector.v1.mooncake import mooncake_connector as mc

    install(mc.MooncakeConnectorWorker)
