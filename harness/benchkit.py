"""What every family's benchmark (``pdchaos bench FAMILY``) shares: its signals and its samples
file. A bench starts and stops its own nodes, so SIGTERM and SIGINT must reach it as exceptions
that unwind to its cleanup, also when it was started with SIGINT ignored (a job started in the
background inherits that). The samples file (``--save``) says which family and op it measured,
so the reports title it without importing the family."""

from __future__ import annotations

import json
import os
import signal
from contextlib import contextmanager
from typing import Any, Iterator

from .errors import UsageError


class Terminated(Exception):
    """SIGTERM reached the bench."""


@contextmanager
def bench_signals() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated`, SIGINT ``KeyboardInterrupt``, for the block; restored after."""
    def on_term(signum, frame):  # noqa: ARG001
        raise Terminated()

    old_term = signal.signal(signal.SIGTERM, on_term)
    old_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGINT, old_int)


def check_save_path(path: str | None) -> None:
    """``--save PATH``: a file in a folder that exists (checked before any node starts)."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"--save: folder {folder!r} does not exist")
    if os.path.isdir(path):
        raise UsageError(f"--save: {path!r} is a folder, expected a file path")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"--save: folder {folder!r} is not writable")


def save_samples(path: str, family: str, op: str, samples: dict[str, list[float]], **about: Any) -> None:
    """Write the raw per-op latencies (µs) per target, with what was measured."""
    doc = {"family": family, "op": op, "unit": "us", **about, **samples}
    try:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
    except OSError as exc:
        raise UsageError(f"--save: cannot write {path!r}: {exc.strerror or exc}") from None


def paired_ratio_ci(base: list[float], other: list[float], q: float, *, n_boot: int = 2000, seed: int = 0,
                    level: float = 0.95) -> dict[str, float]:
    """``other``'s ``q``-quantile over ``base``'s, with a percentile bootstrap interval: pairs
    (``base[i]``, ``other[i]`` measured side by side) are resampled together, so drift that hit
    both sides of a pair cancels. Returns ``ratio``, ``lo``, ``hi`` and ``half_width`` (half the
    interval over the ratio: 0.01 is +-1 %). numpy's quantiles (linear interpolation)."""
    import numpy as np

    a, b = np.asarray(base, dtype=float), np.asarray(other, dtype=float)
    if a.shape != b.shape or a.size < 2:
        raise ValueError(f"paired samples of equal length >= 2 needed, got {a.size} and {b.size}")
    if not 0 < q < 1 or not 0 < level < 1:
        raise ValueError(f"q and level must be in (0, 1), got {q!r}, {level!r}")
    ratio = float(np.quantile(b, q) / np.quantile(a, q))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, a.size, size=(n_boot, a.size))
    boots = np.quantile(b[idx], q, axis=1) / np.quantile(a[idx], q, axis=1)
    lo, hi = np.quantile(boots, [(1 - level) / 2, 1 - (1 - level) / 2])
    return {"ratio": round(ratio, 4), "lo": round(float(lo), 4), "hi": round(float(hi), 4),
            "half_width": round(float(hi - lo) / 2 / ratio, 4)}
