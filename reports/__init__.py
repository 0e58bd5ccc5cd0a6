"""Reports of a run folder: plots (PNG), summary.md (PR comment), report.html (one file), bench.json.

``generate(run_dir)`` is what the runner calls at the end of a run and what ``pdchaos report RUN_DIR``
calls on a saved run; both read only summary.json, the journals and an optional
``bench_samples.json``, so the outputs are the same whenever they are rebuilt.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["generate"]


def generate(run_dir: str | Path, *, bench: str | Path | None = None, jobs: int | None = None) -> list[Path]:
    """Write ``plots/*.png``, ``summary.md``, ``report.html`` and ``bench.json`` into ``run_dir``;
    return their paths. ``bench`` overrides ``run_dir/bench_samples.json``. Raises
    ``harness.errors.UsageError`` when ``run_dir`` is not a run folder or an input is malformed."""
    from .build import generate as _generate

    return _generate(run_dir, bench=bench, jobs=jobs)
