"""How a harness command that starts nodes (``pdchaos run``, ``pdchaos explore``) ends when it is
told to: SIGINT (Ctrl-C), SIGTERM (``kill``, a CI job's timeout) and SIGHUP (the terminal closed)
all mean "stop now, cleanly".

While :class:`Interrupts` is entered, each of the three only calls the command's callbacks (the
runner's ``interrupt``: the scenario run under way tears down through its normal teardown, faults
healed, nodes stopped, its journal ending ``interrupted``; no other run starts). The first signal
is the one the exit code names, ``128 + its number`` (130, 143, 129). A second signal changes
nothing: the teardown is bounded and goes on (SIGKILL is the way to cut it short, and each node
then notices its runner is gone and stops itself: nodekit/nodeio.py ``watch_parent``).

A harness killed outright (SIGKILL) runs none of this: its nodes stop themselves (the parent
watch), and what it made on this machine (network namespaces with their iptables rules, ipc
folders) is removed by the next run (:func:`sweep_leftovers`), ``pdchaos doctor`` and ``pdchaos
clean``, one line each.

SIGHUP comes when the terminal is gone, and writing to it would then fail (EIO) in the middle of
the teardown: the standard output and error that are terminals are pointed at /dev/null first.
"""

from __future__ import annotations

import os
import signal
import stat
from typing import Callable, TextIO

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupts:
    """``with Interrupts() as intr: intr.on(runner.interrupt) ...``; then ``intr.signum`` (the
    first signal, or None) and ``intr.exit_code``."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._callbacks: list[Callable[[str], None]] = []
        self._old: dict[int, object] = {}

    @property
    def name(self) -> str | None:
        return signal.Signals(self.signum).name if self.signum is not None else None

    @property
    def exit_code(self) -> int | None:
        """128 + the first signal's number (the shell's convention), None when none came."""
        return 128 + int(self.signum) if self.signum is not None else None

    def on(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(signal name)`` on a signal; at once when one came already."""
        self._callbacks.append(callback)
        if self.signum is not None:
            callback(self.name or "")

    def _handler(self, signum: int, frame: object) -> None:  # noqa: ARG002
        if signum == signal.SIGHUP:
            _detach_terminal()
        if self.signum is not None:
            return  # the teardown the first one started goes on
        self.signum = signum
        for cb in list(self._callbacks):
            cb(self.name or "")

    def __enter__(self) -> "Interrupts":
        for sig in SIGNALS:
            self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)  # type: ignore[arg-type]
        self._old.clear()


def _detach_terminal() -> None:
    """Point stdout and stderr at /dev/null where they are a terminal (a closed one, on SIGHUP); a
    file or a pipe stays as it is."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        null_dev = os.fstat(null).st_rdev
        for fd in (1, 2):  # what is still buffered goes there too, at the next flush
            try:
                # a hung-up terminal no longer answers isatty(): a character device is enough
                st = os.fstat(fd)
                if stat.S_ISCHR(st.st_mode) and st.st_rdev != null_dev:
                    os.dup2(null, fd)
            except OSError:
                continue
    finally:
        os.close(null)


def sweep_leftovers(out: TextIO) -> None:
    """Remove what runs killed outright left on this machine (the local runtime's ``clean``), one
    line each on ``out``; a namespace of unknown owner is named, never removed."""
    from .runtime import load_runtime

    try:
        removed, left = load_runtime().clean()
    except Exception as exc:  # noqa: BLE001 - a run does not stop for this
        print(f"warning: leftovers of killed runs not looked for: {type(exc).__name__}: {exc}", file=out, flush=True)
        return
    for line in removed:
        print(f"removed: {line}", file=out, flush=True)
    for line in left:
        print(f"left: {line}", file=out, flush=True)
