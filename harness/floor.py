"""The Toxiproxy measurement floor of one run: ``<run_dir>/toxiproxy_floor.json``.

Measured once per run, by ``start_toxiproxy`` (harness/services.py), when a scenario of the run
goes through Toxiproxy: what the proxy adds to a ZMQ round trip with no toxic, and what a latency
toxic of known size really adds (``faults.toxiproxy.measure_floor``). Readers of a run need both
to judge latency numbers: a difference smaller than the floor's spread is noise, and a latency
toxic is only as exact as ``latency_error_ms``.

The file (times in milliseconds)::

    {"measured": true, "toxiproxy_version": "2.12.0", "measured_at": "<ISO 8601 UTC>",
     "took_s": 0.6, "floor": {... the dict measure_floor returns ...}, "text": "one line for a summary"}

or, when it could not be measured (server missing, measurement failed)::

    {"measured": false, "reason": "...", "text": "..."}

A failed measurement never fails the run: the verdicts do not depend on it.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

FLOOR_FILE = "toxiproxy_floor.json"


def floor_text(floor: dict[str, Any]) -> str:
    """One line for a summary, from the dict ``measure_floor`` returns."""
    return (f"Toxiproxy adds {floor['added_median_ms']:.3f} ms per ZMQ round trip (median; direct "
            f"{floor['direct_median_ms']:.3f} ms, proxied {floor['proxied_median_ms']:.3f} ms, p90 "
            f"{floor['proxied_p90_ms']:.3f} ms, n={floor['n']}); a {floor['latency_configured_ms']} ms "
            f"latency toxic ({floor['latency_stream']}) measured {floor['latency_measured_ms']:.2f} ms "
            f"(error {floor['latency_error_ms']:+.2f} ms, n={floor['latency_n']})")


def _write(run_dir: Path, data: dict[str, Any]) -> Path:
    path = Path(run_dir) / FLOOR_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)  # a reader never sees half a file
    return path


def write_unmeasured(run_dir: Path, reason: str) -> dict[str, Any]:
    data = {"measured": False, "reason": reason, "text": f"Toxiproxy floor not measured: {reason}"}
    _write(run_dir, data)
    return data


def measure_and_write(api: Any, run_dir: Path, **kwargs: Any) -> dict[str, Any]:
    """Measure the floor through ``api`` (a running :class:`faults.toxiproxy.Toxiproxy`) and write it.

    Returns what was written. Any failure is written as ``measured: false`` with its reason."""
    from faults.toxiproxy import measure_floor

    started = time.monotonic()
    try:
        version = api.version()
        floor = measure_floor(api, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the run goes on without a floor; the file says why
        return write_unmeasured(run_dir, f"measurement failed: {type(exc).__name__}: {exc}")
    data = {"measured": True, "toxiproxy_version": version,
            "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "took_s": round(time.monotonic() - started, 3), "floor": floor, "text": floor_text(floor)}
    _write(run_dir, data)
    return data


def read_floor(run_dir: Path) -> dict[str, Any] | None:
    """The run's floor record, or None when the run used no Toxiproxy (no file)."""
    path = Path(run_dir) / FLOOR_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return {"measured": False, "reason": f"{FLOOR_FILE} unreadable: {exc}",
                "text": f"Toxiproxy floor unreadable: {exc}"}
