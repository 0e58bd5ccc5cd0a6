"""The incident timeline of one scenario run: a pure function of its journal, re-runnable offline.

Fault injected (and when its effect was first seen) -> the first failure the client saw -> every
request's terminal state, grouped by outcome (count, first and last time) -> recovered (the fault
healed, the first success after it), joined with what the nodes' records say (their events, the
family's gauges, the counters that moved). Times are seconds since the run's start (the meta
line's ``t0``, as every plot). Nothing family-specific is named here: the outcome names and codes
are the workload's own (the journal's ``outcome``, ``code``, ``error_phase``), the word for a failed
op is the family's ``failed_words`` from the meta line, and the gauges are the ones the family
declares there.

What it never shows: request ids, prompts, outputs, token ids or their digests, keys, block
hashes, raw frames, pids. An op gives only its class, outcome, code, phase and times; an event
only its role, kind and short scalar fields (a string that looks like a key, a path or a long
token is left out); counters only their names and numbers.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from harness.checks import op_elapsed_ms
from nodekit import journal as J

from . import data as D
from . import gauges as G

# the harness's own probe keys (process resources), not the node's counters; histogram sums are
# seconds, not counts
RESOURCE_KEYS = frozenset({"cpu_s", "fds", "threads", "rss_mib", "sockets", "processes", "group_fds",
                           "group_threads", "wrapper_fds", "wrapper_threads", "metrics_ok"})
# events folded into a fault's own row, or that say where a file is (not what happened)
FOLDED_EVENTS = frozenset({"fault_started", "fault_effect", "fault_prepared", "server_log"})
EVENT_FIELDS = ("role", "node", "kind", "fault", "reason", "why", "returncode", "signal", "seconds", "mode",
                "error", "phase", "s")
_SECRET_LIKE = (re.compile(r"[0-9a-fA-F]{16,}"), re.compile(r"[0-9A-Za-z_\-]{24,}"))
MAX_STR = 80
# counters whose names speak of a failure come first in a node's row (then those that were 0)
FAILURE_WORDS = re.compile(r"error|fail|abort|timeout|reject|refus|drop|miss|unanswer|bad|malformed|late|stall|"
                           r"expired|rebuild|retr|lost|poison", re.IGNORECASE)
COUNTERS_SHOWN = 4  # per node, in the counters row (the rest are counted)


def safe_text(v: Any, limit: int = MAX_STR) -> str | None:
    """A short scalar as text, or None when it must not be shown (a path, a key-like or
    token-like run, a long string, a container)."""
    if isinstance(v, bool) or v is None:
        return None if v is None else str(v).lower()
    if isinstance(v, (int, float)):
        return _num(v)
    if not isinstance(v, str):
        return None
    s = " ".join(v.split())
    if not s or "/" in s or any(p.search(s) for p in _SECRET_LIKE):
        return None
    return s if len(s) <= limit else s[:limit - 1] + "…"


def _num(v: float) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int) or (isinstance(v, float) and math.isfinite(v) and v == int(v) and abs(v) < 1e12):
        return str(int(v))
    if isinstance(v, float) and math.isfinite(v):
        return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.3g}"
    return str(v)


def fmt_s(t: float | None) -> str:
    return "–" if t is None else f"{t:.2f}"


@dataclass(frozen=True)
class Entry:
    """One line of the timeline: when (s since t0; None: no time), where, what."""
    t: float | None
    stage: str     # fault | effect | failure | outcome | healed | recovered | node | gauge | counters | note
    source: str    # "harness", "client" or a node's role
    text: str


@dataclass(frozen=True)
class FaultRow:
    id: int
    name: str
    start: float | None          # the nemesis's start record
    injected: float | None       # start + how long the injection took (its fault_started event)
    effect_seen: float | None    # the first node sample where a counter its effect names moved
    effect_where: str | None     # that node and counter
    effect: dict                 # the counts the fault reported at its heal (fault_effect)
    healed: float | None         # the stop record (None: never healed)
    healed_by: str | None        # "schedule" | "teardown" | None


@dataclass(frozen=True)
class Group:
    """Requests that ended the same way: class, outcome, code, phase (and op kind)."""
    cls: str
    words: str        # how the report says the class (a failed op in the family's words)
    f: str
    outcome: str
    code: str
    phase: str
    count: int
    first: float | None
    last: float | None
    late: bool = False  # ok, but over the scenario's deadline + tolerance (bounded_return's limit)


@dataclass
class Incident:
    scenario: str
    target: str
    end: float                               # s since t0: the journal's end
    faults: list[FaultRow] = field(default_factory=list)
    first_failure: Entry | None = None
    failure_before_fault: bool = False
    groups: list[Group] = field(default_factory=list)
    recovered: list[Entry] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   # the headline facts, in words
    n_ops: int = 0
    limit_ms: float | None = None            # deadline + tolerance: an ok op slower than this is late
    first_late: Entry | None = None

    def headline(self) -> str:
        return "; ".join(self.notes)


# ------------------------------------------------------------------ the pieces

def _flat(counters: Any, prefix: str = "") -> dict[str, float]:
    """Counters as ``{dotted.name: number}`` (nested dicts flattened; non-numbers left out)."""
    out: dict[str, float] = {}
    if not isinstance(counters, dict):
        return out
    for k, v in counters.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, name + "."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[name] = float(v)
    return out


def _probes_by_node(records: Sequence[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in records:
        if r.get("type") == "probe" and isinstance(r.get("t"), (int, float)) and not isinstance(r.get("t"), bool):
            out.setdefault(str(r.get("node")), []).append(r)
    for ps in out.values():
        ps.sort(key=lambda p: p["t"])
    return out


def _terminal_t(op: dict, end_abs: float) -> float:
    """When the client saw the op end (absolute): its completion, else when the run gave up."""
    tc = op.get("t_complete")
    return float(tc) if isinstance(tc, (int, float)) and not isinstance(tc, bool) else end_abs


def _op_words(op: dict, words: str) -> str:
    bits = [safe_text(op.get(k), 40) for k in ("outcome", "code", "error_phase")]
    outcome, code, phase = (b or "" for b in bits)
    if outcome == words:
        return words + (f" ({code})" if code else "") + (f" (phase {phase})" if phase else "")
    detail = ", ".join(x for x in (code if code and code != outcome else "", f"phase {phase}" if phase else "") if x)
    return f"{words}: {outcome or '?'}" + (f" ({detail})" if detail else "")


def _effect_seen(fault_start: float, keys: Sequence[str], by_node: dict[str, list[dict]]) -> tuple[float, str] | None:
    """(absolute time, where) of the first probe after ``fault_start`` in which a counter named by
    the fault's effect moved from its value at the start; None when no node counts it."""
    best: tuple[float, str] | None = None
    for node, probes in by_node.items():
        for key in keys:
            ref = None
            for p in probes:
                v = _flat(p.get("counters")).get(key)
                if v is None:
                    continue
                if p["t"] <= fault_start:
                    ref = v
                    continue
                if ref is None:
                    ref = 0.0 if p.get("when") != "baseline" else v
                if v != ref:
                    if best is None or p["t"] < best[0]:
                        best = (p["t"], f"{node} ({key})")
                    break
    return best


def fault_rows(records: Sequence[dict], by_node: dict[str, list[dict]]) -> list[FaultRow]:
    started = {r.get("id"): r for r in records if r.get("type") == "event" and r.get("what") == "fault_started"}
    effects = {r.get("id"): r for r in records if r.get("type") == "event" and r.get("what") == "fault_effect"}
    stops = {r.get("id"): r for r in records if r.get("type") == "fault" and r.get("phase") == "stop"}
    starts = {r.get("id"): r for r in records if r.get("type") == "fault" and r.get("phase") == "start"}
    rows = []
    for fid in sorted(set(starts) | set(stops), key=lambda i: (starts.get(i, stops.get(i, {})).get("t", 0.0), str(i))):
        st, sp = starts.get(fid), stops.get(fid)
        name = str((st or sp or {}).get("name", "?"))
        t_start = float(st["t"]) if st and isinstance(st.get("t"), (int, float)) else None
        inj = started.get(fid)
        injected = (t_start + float(inj["s"])) if (t_start is not None and inj and isinstance(inj.get("s"), (int, float))) \
            else (float(inj["t"]) if inj and isinstance(inj.get("t"), (int, float)) else None)
        eff = effects.get(fid) or {}
        effect = {str(k): v for k, v in (eff.get("effect") or {}).items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool)} if isinstance(eff.get("effect"), dict) else {}
        keys = list(effect) + [k for k in (eff.get("required") or {}) if k not in effect] \
            if isinstance(eff.get("required"), dict) else list(effect)
        seen = _effect_seen(t_start, keys, by_node) if t_start is not None and keys else None
        healed = float(sp["t"]) if sp and isinstance(sp.get("t"), (int, float)) else None
        rows.append(FaultRow(id=fid if isinstance(fid, int) else -1, name=name, start=t_start, injected=injected,
                             effect_seen=seen[0] if seen else None, effect_where=seen[1] if seen else None,
                             effect=effect, healed=healed,
                             healed_by=str(sp.get("healed_by")) if sp and sp.get("healed_by") else None))
    return rows


def is_late(op: dict, limit_ms: float | None) -> bool:
    """An ok op that took longer than ``limit_ms`` (the deadline + tolerance bounded_return holds
    every op to)."""
    return limit_ms is not None and D.classify(op) == "ok" and op_elapsed_ms(op) > limit_ms


def outcome_groups(ops: Sequence[dict], end_abs: float, t0: float, failed: str,
                   limit_ms: float | None = None) -> list[Group]:
    words = {"ok": "ok", "fail-open": failed, "error": "raised", "stalled": "stalled"}
    groups: dict[tuple, list[float]] = {}
    for op in ops:
        cls = D.classify(op)
        key = (cls, str(op.get("f", "")), safe_text(op.get("outcome"), 40) or "",
               "" if cls == "ok" else (safe_text(op.get("code"), 40) or ""),
               "" if cls == "ok" else (safe_text(op.get("error_phase"), 40) or ""), is_late(op, limit_ms))
        groups.setdefault(key, []).append(_terminal_t(op, end_abs) - t0)
    late_words = f"ok but late (over {_num(limit_ms)} ms)" if limit_ms is not None else "ok"
    out = [Group(cls=k[0], words=late_words if k[5] else words.get(k[0], k[0]), f=k[1], outcome=k[2], code=k[3],
                 phase=k[4], count=len(ts), first=min(ts), last=max(ts), late=k[5]) for k, ts in groups.items()]
    return sorted(out, key=lambda g: (g.first if g.first is not None else math.inf, g.cls, g.outcome))


def group_text(g: Group, show_f: bool) -> str:
    what = g.words
    if g.cls != "ok" and g.outcome == g.words:
        what += f" ({g.code})" if g.code and g.code != g.outcome else ""
    elif g.cls != "ok":
        detail = ", ".join(x for x in (g.code if g.code and g.code != g.outcome else "",
                                       f"phase {g.phase}" if g.phase else "") if x)
        what += f": {g.outcome or '?'}" + (f" ({detail})" if detail else "")
    span = fmt_s(g.first) if g.count == 1 or g.first == g.last else f"{fmt_s(g.first)}–{fmt_s(g.last)} s"
    span = span if span.endswith(" s") else span + " s"
    return f"{g.count} × {(g.f + ' ') if show_f and g.f else ''}{what}, ended {span}"


def event_entries(records: Sequence[dict], t0: float, end_abs: float) -> list[Entry]:
    out = []
    for r in records:
        if r.get("type") != "event" or r.get("what") in FOLDED_EVENTS:
            continue
        t = r.get("t")
        if not isinstance(t, (int, float)) or isinstance(t, bool) or t < t0 or t > end_abs:
            continue
        src = safe_text(r.get("role")) or safe_text(r.get("node")) or safe_text(r.get("kind")) or "harness"
        bits = []
        for k in EVENT_FIELDS:
            if k in ("role", "node") or k not in r:
                continue
            v = safe_text(r.get(k))
            if v is not None:
                bits.append(f"{k} {v}")
        what = safe_text(r.get("what"), 40) or "event"
        out.append(Entry(t - t0, "node", src, what + (f" ({', '.join(bits[:5])})" if bits else "")))
    return out


def gauge_entries(records: Sequence[dict], t0: float) -> list[Entry]:
    """Per node and declared gauge that moved: its peak (when) and whether it came back."""
    try:
        specs = G.meta_gauges(J.meta(list(records)))
    except Exception:  # noqa: BLE001 - a malformed declaration: the gauges plot says so; no rows here
        return []
    ng = G.node_gauges(list(records), specs, "", "", t0) if specs else None
    if ng is None:
        return []
    out = []
    for panel in ng.panels:
        for s in panel.series:
            pts = [(x, y) for x, y in zip(s.x, s.y) if math.isfinite(y)]
            if len(pts) < 2:
                continue
            base = pts[0][1]
            xp, peak = max(pts, key=lambda p: (p[1], -p[0]))
            if peak <= base or (panel.gauge.rate and peak - base < 0.05):
                continue
            back = next((x for x, y in pts if x > xp and y <= base + (0.05 if panel.gauge.rate else 0)), None)
            tail = (f"back to {_num(base)} at {fmt_s(back)} s" if back is not None
                    else f"{_num(pts[-1][1])} at its last sample ({fmt_s(pts[-1][0])} s)")
            out.append(Entry(xp, "gauge", s.node, f"{panel.gauge.label}: peak {_num(peak)} "
                                                  f"(from {_num(base)}); {tail}"))
    return out


def counter_entries(by_node: dict[str, list[dict]], t0: float, ref_abs: float | None, gauges: set[str]) -> list[Entry]:
    """Per node: the counters that moved after ``ref_abs`` (the first fault's start; None: the
    node's first probe), biggest first, each with the time it first moved."""
    out = []
    for node, probes in by_node.items():
        if not probes:
            continue
        ref_i = 0
        if ref_abs is not None:
            before = [i for i, p in enumerate(probes) if p["t"] <= ref_abs]
            ref_i = before[-1] if before else 0
        ref = _flat(probes[ref_i].get("counters"))
        moved: dict[str, tuple[float, float]] = {}  # name -> (first move, abs), delta
        last = dict(ref)
        for p in probes[ref_i + 1:]:
            if p.get("pid") != probes[ref_i].get("pid"):
                break  # a new process: its counters start again
            cur = _flat(p.get("counters"))
            for k, v in cur.items():
                if k in RESOURCE_KEYS or k.endswith("_sum") or G._bare(k, False) in gauges or k in gauges:
                    continue
                if k not in moved and v != ref.get(k, v if p.get("when") == "baseline" else 0.0):
                    moved[k] = (p["t"] - t0, 0.0)
            last.update(cur)
        if not moved:
            continue
        # failure-named counters first, then those that were 0 before, then by when they moved
        rows = sorted(((k, first, last.get(k, 0.0) - ref.get(k, 0.0)) for k, (first, _) in moved.items()
                       if last.get(k, 0.0) != ref.get(k, 0.0)),
                      key=lambda x: (not FAILURE_WORDS.search(x[0]), ref.get(x[0], 0.0) != 0.0, x[1], x[0]))
        if not rows:
            continue
        shown = [f"{k} {'+' if d >= 0 else ''}{_num(round(d, 3))} (from {fmt_s(first)} s)"
                 for k, first, d in rows[:COUNTERS_SHOWN]]
        more = f"; +{len(rows) - COUNTERS_SHOWN} more" if len(rows) > COUNTERS_SHOWN else ""
        out.append(Entry(min(r[1] for r in rows), "counters", node, "counters moved: " + "; ".join(shown) + more))
    return out


# ------------------------------------------------------------------ the timeline

def incident_timeline(records: Sequence[dict]) -> Incident:
    """The incident timeline of one scenario run's journal records (see the module docstring)."""
    records = list(records)
    meta = J.meta(records)
    t0 = D.t0_of(records)
    end_abs = D.end_of(records)
    failed = D.failed_words(records)[0]
    inc = Incident(scenario=str(meta.get("scenario", "")), target=str(meta.get("target", "")),
                   end=max(end_abs - t0, 0.0))
    by_node = _probes_by_node(records)
    ops = [o for o in J.ops(records) if "t_invoke" in o]
    inc.n_ops = len(ops)
    inc.faults = fault_rows(records, by_node)
    entries: list[Entry] = []

    # faults: injected, effect seen, healed (or not)
    for fr in inc.faults:
        rel = (lambda t: None if t is None else t - t0)
        took = (f", in effect {fmt_s(rel(fr.injected))} s" if fr.injected is not None and fr.start is not None
                and fr.injected - fr.start >= 0.005 else "")
        entries.append(Entry(rel(fr.start), "fault", "harness", f"fault {fr.name} (#{fr.id}) injected{took}"))
        if fr.effect_seen is not None:
            effect = ", ".join(f"{k} {_num(v)}" for k, v in sorted(fr.effect.items()))
            entries.append(Entry(rel(fr.effect_seen), "effect", (fr.effect_where or "nodes").split(" ")[0],
                                 f"effect of {fr.name} first seen: {fr.effect_where}"
                                 + (f" (at its heal: {effect})" if effect else "")))
        elif fr.effect:
            effect = ", ".join(f"{k} {_num(v)}" for k, v in sorted(fr.effect.items()))
            entries.append(Entry(rel(fr.healed), "effect", "harness", f"effect of {fr.name} counted at its heal: {effect}"))
        if fr.healed is None:
            entries.append(Entry(None, "healed", "harness", f"fault {fr.name} (#{fr.id}) NEVER HEALED (no stop record)"))
        else:
            by = "" if fr.healed_by in (None, "schedule") else f" (by {fr.healed_by}, not by its schedule)"
            entries.append(Entry(rel(fr.healed), "healed", "harness", f"fault {fr.name} (#{fr.id}) healed{by}"))

    # the client: first failure, terminal states by outcome
    failures = sorted((o for o in ops if D.classify(o) != "ok"), key=lambda o: _terminal_t(o, end_abs))
    first_fault = min((f.start for f in inc.faults if f.start is not None), default=None)
    if failures:
        o = failures[0]
        t_fail = _terminal_t(o, end_abs) - t0
        words = {"fail-open": failed, "error": "raised", "stalled": "stalled"}[D.classify(o)]
        text = (f"first failure the client saw: {_op_words(o, words)} "
                f"(sent at {fmt_s(float(o['t_invoke']) - t0)} s)")
        inc.failure_before_fault = first_fault is None or _terminal_t(o, end_abs) < first_fault
        if inc.failure_before_fault:
            text += (" — BEFORE ANY FAULT (no fault was injected)" if first_fault is None and not inc.faults
                     else " — BEFORE ANY FAULT's recorded start (no start record)" if first_fault is None
                     else f" — BEFORE ANY FAULT (the first was injected at {fmt_s(first_fault - t0)} s)")
        inc.first_failure = Entry(t_fail, "failure", "client", text)
        entries.append(inc.first_failure)
    d, tol = D.deadline(records)
    inc.limit_ms = d + (tol or 0.0) if d else None
    late = sorted((o for o in ops if is_late(o, inc.limit_ms)), key=lambda o: _terminal_t(o, end_abs))
    if late:
        o = late[0]
        inc.first_late = Entry(_terminal_t(o, end_abs) - t0, "late", "client",
                               f"first late answer: ok after {_num(round(op_elapsed_ms(o), 1))} ms, over the "
                               f"{_num(inc.limit_ms)} ms deadline + tolerance (sent at {fmt_s(float(o['t_invoke']) - t0)} s)")
        entries.append(inc.first_late)
    inc.groups = outcome_groups(ops, end_abs, t0, failed, inc.limit_ms)
    show_f = len({g.f for g in inc.groups}) > 1
    for g in inc.groups:
        entries.append(Entry(g.first, "outcome", "client", group_text(g, show_f)))

    # recovered: after each heal, the first request sent after it that succeeded
    oks = sorted((o for o in ops if D.classify(o) == "ok"), key=lambda o: float(o["t_invoke"]))
    for fr in inc.faults:
        if fr.healed is None:
            continue
        after = next((o for o in oks if float(o["t_invoke"]) >= fr.healed), None)
        if after is None:
            e = Entry(None, "recovered", "client", f"NOT RECOVERED after {fr.name}: no request sent after its heal "
                                                   f"({fmt_s(fr.healed - t0)} s) succeeded")
        else:
            tc = _terminal_t(after, end_abs)
            e = Entry(tc - t0, "recovered", "client",
                      f"recovered after {fr.name}: first success sent after its heal "
                      f"(sent {fmt_s(float(after['t_invoke']) - t0)} s, {_num(round((tc - fr.healed), 2))} s after the heal)")
        inc.recovered.append(e)
        entries.append(e)

    # the nodes: events, gauges, counters that moved
    gauges = {str(g[0]) for g in meta.get("gauges") or [] if isinstance(g, (list, tuple)) and g}
    entries += event_entries(records, t0, end_abs)
    entries += gauge_entries(records, t0)
    entries += counter_entries(by_node, t0, first_fault, gauges)
    order = {s: i for i, s in enumerate(("fault", "effect", "failure", "late", "outcome", "healed", "recovered", "node",
                                         "gauge", "counters", "note"))}
    inc.entries = sorted(entries, key=lambda e: (math.inf if e.t is None else e.t, order.get(e.stage, 99)))
    inc.notes = headline_notes(inc, t0, first_fault)
    why = meta.get("error") or meta.get("skipped")
    if why:  # the runner gave the run up before its workload (harness/runner.py: _abandon)
        inc.notes.insert(0, f"the run did not happen ({'error' if meta.get('error') else 'skipped'}: "
                            f"{safe_text(why, 160) or 'see its reason'})")
    return inc


def headline_notes(inc: Incident, t0: float, first_fault: float | None) -> list[str]:
    notes = []
    if not inc.faults:
        notes.append("no fault injected")
    else:
        for fr in inc.faults:
            notes.append(f"{fr.name} injected at {fmt_s(None if fr.start is None else fr.start - t0)} s, "
                         + ("never healed" if fr.healed is None else f"healed at {fmt_s(fr.healed - t0)} s"))
    n_late = sum(g.count for g in inc.groups if g.late)
    late = (f"; {n_late} answered late (over {_num(inc.limit_ms)} ms), the first at {fmt_s(inc.first_late.t)} s"
            if n_late and inc.first_late is not None else "")
    if inc.first_failure is None:
        notes.append(f"no failure ({inc.n_ops} requests, all ok{late})" if inc.n_ops else "no request in the history")
    else:
        n_bad = sum(g.count for g in inc.groups if g.cls != "ok")
        notes.append(f"first failure at {fmt_s(inc.first_failure.t)} s ({n_bad} of {inc.n_ops} requests failed{late})")
        if inc.failure_before_fault:
            notes.append("a failure came BEFORE ANY FAULT" if first_fault is not None or inc.faults
                         else "failures with NO FAULT injected")
    for e in inc.recovered:
        if e.t is None:
            notes.append("not recovered")
        else:
            notes.append(f"recovered at {fmt_s(e.t)} s")
    return notes


def incident_of_journal(path: Any) -> Incident:
    """The incident timeline of a saved journal file."""
    return incident_timeline(J.read_journal(path))


# ------------------------------------------------------------------ rendering

KEY_STAGES = ("fault", "effect", "failure", "late", "outcome", "healed", "recovered")


def markdown(inc: Incident, limit: int | None = None, stages: Sequence[str] | None = None) -> list[str]:
    """A compact table: time (s), where, what; only the rows of ``stages`` (None: all) and
    ``limit`` rows at most; the rows left out are counted in a last row."""
    picked = [e for e in inc.entries if stages is None or e.stage in stages]
    rows = picked if limit is None else picked[:limit]
    lines = [f"{inc.headline()}.", "", "| t (s) | where | what |", "|---:|---|---|"]
    lines += [f"| {fmt_s(e.t)} | {_md(e.source)} | {_md(e.text)} |" for e in rows]
    left = len(inc.entries) - len(rows)
    if left:
        lines.append(f"| | | {left} more row(s) in report.html (the nodes' events, gauges and counters) |")
    return lines


def _md(s: str) -> str:
    t = " ".join(str(s).split()).replace("|", "\\|")
    return t if len(t) <= 300 else t[:297] + "..."
