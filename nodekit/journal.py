"""The journal: the single record of one scenario run against one target (JSON lines).

Layout of a run folder (``runs/<run_id>/``)::

    summary.json  summary.md  junit.xml
    <scenario>/<target>/journal.jsonl      # this format
    <scenario>/<target>/logs/<node>.log    # stderr of every process of that run
    <scenario>/<target>/...                # what the family keeps (lookup: preload.txt, never logged)

One schema for every family (Jepsen's history); family data lives in the free fields. Every line
is one JSON object with a ``type``. Times ``t`` are ``time.monotonic()`` seconds (CLOCK_MONOTONIC
is system-wide on Linux, so times from different processes compare); the ``meta`` line's ``t0``
is the workload start, and reports plot ``t - t0``. Any node may write its own part
(``<role>.part.jsonl``); the runner merges the parts by time at the end of the run.

``meta``   scenario, file, family, target, targets (all of the scenario's), baseline_target,
           deadline_ms, tolerance_ms, seed, t0, wall_start (ISO 8601), cap_s, checks ({name:
           options}), not_applicable ({check: why}), expect (verdict), primary_ops (the ``f`` of
           the workload's main op), planned_ops, topology (dict), workload (dict), faults (list of
           {id, type, at, for, params, categories (must cause), explains (may cause)})
``op``     one line at invoke and one at completion:
           id (int, unique in the journal), process (worker index), f (the operation, e.g.
           "lookup" | "reset"), phase "invoke" | "ok" | "fail" | "info", t;
           at invoke: expected (the value a correct system returns), and the family's fields
           (lookup: kind "full" | "partial" | "miss" | "hbm" | "multigroup", token_len, hashes,
           groups, matched = the scheduler's decision);
           at completion: value (what the call returned), outcome ("ok", a failure category such
           as "timeout", or "raised" | "stalled"), code (error code or exception type), elapsed_ms.
           ok = the call succeeded; fail = it failed and we know it (lookup: a fail-open 0 or
           False); info = indeterminate (raised, or never returned: "stalled", by the runner).
``fault``  id, name, phase "start" | "stop", t, params (dict), and ``healed_by`` ("schedule" |
           "teardown") on stop.
``probe``  node (the role: "server", "interposer", "client", ...), kind, pid, when ("baseline"
           when it started | "last" just before it was stopped | "final"), threads, fds,
           counters (dict), alive (bool); written by the topology or the workload.
``event``  what (str), t, and free fields: process starts, stops, kills and signals (with role
           and pid), probe_silent, fault_error, workload_exit, leftovers, the runner's notes.
``end``    t, reason ("done" | "cap" | "interrupted"), stalled (int).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Iterable, Iterator

class JournalWriter:
    """Append-only, line-buffered, thread-safe. Every line is flushed so a crash loses nothing."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", encoding="utf-8", buffering=1)
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":"), default=str)
        with self._lock:
            if self._fh.closed:  # a late writer after the run closed its journal: nothing to keep
                return
            self._fh.write(line + "\n")

    def flush(self) -> None:
        with self._lock:
            if not self._fh.closed:
                self._fh.flush()

    def close(self) -> None:
        with self._lock:
            if not self._fh.closed:
                self._fh.close()

    def __enter__(self) -> "JournalWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


UNREADABLE = "journal_line_unreadable"


def read_journal(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All records; a torn last line (a process killed mid-write) is skipped. A line that cannot be
    read with more lines after it is no torn write: it becomes an event record ``journal_line_unreadable``
    (its line number only) in its place, which ``harness_integrity`` fails on, so a damaged record
    can never just vanish from a history."""
    out: list[dict[str, Any]] = []
    bad: int | None = None
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            if bad is not None:
                out.append({"type": "event", "what": UNREADABLE, "line": bad})
                bad = None
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                bad = n
                continue
            out.append(rec if isinstance(rec, dict) else {"type": "event", "what": UNREADABLE, "line": n})
    return out


def write_journal(path: str | os.PathLike, records: Iterable[dict[str, Any]]) -> None:
    with JournalWriter(path) as w:
        for r in records:
            w.write(r)


def meta(records: list[dict]) -> dict:
    return next((r for r in records if r.get("type") == "meta"), {})


def ops(records: list[dict]) -> list[dict]:
    """Completed operations, invoke and completion merged into one dict per op id:
    ``{id, process, f, kind, expected, t_invoke, t_complete, phase, value, outcome, code, elapsed_ms, ...}``.
    An op with no completion record is returned with phase "info" and outcome "stalled". What the
    invoke says of the op (its ``f``, ``process``, ...) is never overwritten by its completion, and
    ``t_invoke``/``t_complete`` come only from the records' own times (a completion that says
    otherwise contradicts its invoke: ``harness_integrity`` refuses such a history)."""
    invokes: dict[int, dict] = {}
    completions: dict[int, dict] = {}
    for r in records:
        if r.get("type") == "op":
            (invokes if r["phase"] == "invoke" else completions)[r["id"]] = r
    merged: dict[int, dict] = {}
    for i in list(invokes) + [i for i in completions if i not in invokes]:
        op = merged[i] = {"id": i}
        c, v = completions.get(i), invokes.get(i)
        if c is not None:
            op.update({k: x for k, x in c.items() if k not in ("type", "t", "t_invoke", "t_complete")})
            op["t_complete"] = c["t"]
        if v is not None:
            op.update({k: x for k, x in v.items() if k not in ("type", "phase", "t", "t_invoke", "t_complete")})
            op["t_invoke"] = v["t"]
    for op in merged.values():
        if "phase" not in op:
            op.update(phase="info", outcome="stalled", value=None, t_complete=None)
    return sorted(merged.values(), key=lambda o: (o.get("t_invoke", 0.0), o["id"]))


def fault_windows(records: list[dict]) -> list[dict]:
    """``[{id, name, start, stop, params}]``; a fault with no stop record ends at the journal's end."""
    end_t = max((r.get("t", 0.0) for r in records if "t" in r), default=0.0)
    windows: dict[int, dict] = {}
    for r in records:
        if r.get("type") != "fault":
            continue
        w = windows.setdefault(r["id"], {"id": r["id"], "name": r["name"], "params": r.get("params", {}),
                                         "start": None, "stop": None})
        w[r["phase"]] = r["t"]
        if r["phase"] == "stop" and "tail_s" in r:
            w["tail_s"] = r["tail_s"]  # the fault's own, shorter tail: what its window did shows
    for w in windows.values():
        if w["stop"] is None:
            w["stop"] = end_t
    return sorted(windows.values(), key=lambda w: (w["start"] or 0.0, w["id"]))


def probes(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("type") == "probe"]


def iter_runs(run_dir: str | os.PathLike) -> Iterator[tuple[str, str, Path]]:
    """(scenario, target, journal path) for every journal under a run folder."""
    root = Path(run_dir)
    for path in sorted(root.glob("*/*/journal.jsonl")):
        yield path.parent.parent.name, path.parent.name, path
