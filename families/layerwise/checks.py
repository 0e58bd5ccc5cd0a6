"""The layerwise family's checks.

* ``left_waiting``: every request left WAITING_FOR_REMOTE_KVS through ``finished_recving`` within
  its op's bound, and each one that failed had all its blocks reported as failed loads (a request
  that never leaves the wait holds its blocks and its scheduler entry forever).
* ``layers_complete``: P never handed a request to its sending thread for the last layer (after
  which upstream's sender signals DONE) when an earlier layer of it was skipped: D would complete
  that request with layers never written (P's ``partial_sends``, final minus baseline probe).
* ``listener_answers``: every malformed or unexpected message sent to D's listener
  (``listener_garbage``) was answered on its first try, within that try's timeout.
* ``kv_content``: every request D completed from P's KV holds the bytes P wrote for it.
* ``post_once``: D never POSTed one request to the metaserver twice (not idempotent).
* ``no_write_after_free``: P never wrote a failed request's KV into D's blocks after D gave them
  back (the blocks of another request by then).
* ``failed_where_faulted``: a fault that fails one D's writes only (``transfer_error`` with
  ``decode``) fails requests of that D only: never a request of another D (written fine, told
  FAILED: upstream's leftover loop variable when one send task holds several D sessions).
* ``blocks_returned``: D's scheduler (vLLM's real v1 Scheduler) got back every KV block its
  requests held (a failed request whose load never reports finished holds its blocks for ever).
"""

from __future__ import annotations

from pydantic import Field

from harness.checks import (CheckInput, CheckResult, _first, _r, history_end, in_window, op_span, undecided,
                            window_tail_s)
from harness.triggers import Fired, TriggerParams, in_flight

from .family import FAMILY
from .spec import decode_roles

check = FAMILY.checks.check


@check("left_waiting")
def left_waiting(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """Every request D waited on left WAITING_FOR_REMOTE_KVS by its bound, through
    ``finished_recving``, and a failed one with all its blocks reported as failed loads."""
    ops = [o for o in inp.ops if o.get("phase") in ("ok", "fail", "info")]
    if not ops:
        return _r(False, "no request in the history: nothing shows that requests leave the wait")
    waiting = [o for o in ops if o.get("value") == "waiting" or o.get("outcome") == "stalled"]
    unreported = [o for o in ops if o.get("outcome") == "failed_load"
                  and (o.get("blocks_reported") or 0) < (o.get("blocks") or 0)]
    raised = [o for o in ops if o.get("outcome") == "raised"]
    failed = [o for o in ops if o.get("outcome") == "failed_load"]
    det = {"requests": len(ops), "failed": len(failed), "still_waiting": _first([o["id"] for o in waiting]),
           "blocks_unreported": _first([o["id"] for o in unreported]), "unknown": _first([o["id"] for o in raised])}
    if waiting:
        rep = [o for o in waiting if (o.get("blocks_reported") or 0) > 0]
        how = (f"; {len(rep)} of them with their blocks reported as failed loads but never finished"
               if rep else "")
        return _r(False, f"{len(waiting)} of {len(ops)} requests still in WAITING_FOR_REMOTE_KVS at their bound "
                         f"(first: op {waiting[0]['id']}){how}", **det)
    if unreported:
        o = unreported[0]
        return _r(False, f"{len(unreported)} failed requests left the wait with blocks unreported (op {o['id']}: "
                         f"{o.get('blocks_reported')} of {o.get('blocks')})", **det)
    if raised:
        return _r(False, f"{len(raised)} requests of unknown fate (D did not answer): op {raised[0]['id']}", **det)
    return _r(True, f"all {len(ops)} requests left the wait through finished_recving; {len(failed)} failed, "
                    f"each with all its blocks reported", **det)


@check("listener_answers")
def listener_answers(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """D's listener answered every bad message the fault sent, on the first try."""
    probes = [e for e in inp.events if e.get("what") == "listener_probe"]
    if not probes:
        return _r(False, "no listener_probe recorded: the listener_garbage fault sent nothing")
    late = [e for e in probes if not e.get("answered") or (e.get("tries") or 0) > 1]
    det = {"probes": len(probes), "answers": {e.get("probe"): e.get("reply") for e in probes},
           "worst_ms": max((e.get("elapsed_ms") or 0) for e in probes)}
    if late:
        e = late[0]
        how = (f"never answered after {e.get('tries')} tries ({e.get('elapsed_ms')} ms)" if not e.get("answered")
               else f"answered only on try {e.get('tries')}")
        return _r(False, f"{len(late)} of {len(probes)} bad messages not answered at once; {e.get('probe')}: {how}",
                  **det)
    return _r(True, f"all {len(probes)} bad messages answered on the first try (worst {det['worst_ms']} ms): "
                    + ", ".join(f"{k}={v}" for k, v in det["answers"].items()), **det)


@check("layers_complete")
def layers_complete(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """P never signalled a request's last layer (DONE follows) after skipping an earlier layer of it."""
    base = {p.get("pid"): p for p in inp.probes if p.get("node") == "prefill" and p.get("when") == "baseline"}
    final = [p for p in inp.probes if p.get("node") == "prefill" and p.get("when") == "final"]
    if not final:
        return _r(False, "no final probe of P: its sends cannot be judged")
    n = 0
    for p in final:
        b = base.get(p.get("pid"), {})
        n += int((p.get("counters") or {}).get("partial_sends", 0)) - int((b.get("counters") or {}).get("partial_sends", 0))
    if n:
        return _r(False, f"{n} request(s) went out for their last layer (DONE follows) after an earlier layer was "
                         f"skipped: D completes them with layers never written", partial_sends=n)
    return _r(True, "no request was signalled after a skipped layer", partial_sends=0)


def _count(v: object) -> bool:
    """A counter a node reports: a non-negative int (not a bool, float or text)."""
    return type(v) is int and v >= 0


def _final_counters(inp: CheckInput, node: str) -> dict | None:
    """The counters of ``node``'s last final probe; None: no final probe."""
    final = [p for p in inp.probes if p.get("node") == node and p.get("when") == "final"]
    return (final[-1].get("counters") or {}) if final else None


def _decodes(inp: CheckInput) -> list[str]:
    """The D roles the run's topology had (``decode``, and ``decode2`` with ``decodes: 2``)."""
    n = (inp.meta.get("topology") or {}).get("decodes", 1)
    return decode_roles(n) if isinstance(n, int) else []


def _op_decode(o: dict, roles: list[str]) -> str | None:
    """The D an op ran on: its ``decode``; with one D, ``decode`` when it names none; None: unknown."""
    d = o.get("decode")
    if d is None and roles == ["decode"]:
        return "decode"
    return d if d in roles else None


def _d_probes(inp: CheckInput) -> dict[str, tuple[dict, dict]] | str:
    """Every D of the topology -> (baseline counters, final counters) of its one process, or why
    the Ds' probes cannot be judged: a D without exactly one baseline and one final, probes of one
    D from two processes (a restarted D: its first process's counts would be lost), a D the
    topology does not have, or an op on an unknown D."""
    roles = _decodes(inp)
    if not roles:
        return "the topology's number of Ds is not 1 or 2"
    extra = {p.get("node") for p in inp.probes if str(p.get("node", "")).startswith("decode")} - set(roles)
    if extra:
        return f"probes of {', '.join(sorted(map(str, extra)))}, not a D of this topology ({', '.join(roles)})"
    unknown = [o["id"] for o in inp.ops if _op_decode(o, roles) is None]
    if unknown:
        return f"{len(unknown)} op(s) on no D of this topology (first: op {unknown[0]})"
    out = {}
    for role in roles:
        mine = [p for p in inp.probes if p.get("node") == role]
        base = [p for p in mine if p.get("when") == "baseline"]
        final = [p for p in mine if p.get("when") == "final"]
        if len(base) != 1 or len(final) != 1:
            return f"{role} has {len(base)} baseline and {len(final)} final probes (one each needed)"
        if len({p.get("pid") for p in mine}) != 1:
            return f"{role}'s probes come from more than one process: a restarted D's first counts are lost"
        out[role] = (base[0].get("counters") or {}, final[0].get("counters") or {})
    return out


@check("blocks_returned")
def blocks_returned(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """Every D's scheduler got back every KV block its requests held: at D's final probe, the
    free blocks of vLLM's block pool plus those held by unfinished requests equal the pool at the
    start (a request finished without its blocks freed, e.g. FINISHED_ERROR while its load is
    never reported finished, holds them for ever: counted as leaked)."""
    probes = _d_probes(inp)
    if isinstance(probes, str):
        return undecided(f"D's block pools cannot be judged: {probes}")
    det: dict = {}
    leaks = []
    for role, (b, c) in probes.items():
        if not all(_count(c.get(k)) for k in ("free_blocks", "blocks_live", "blocks_initial")) \
                or not _count(c.get("blocks_held_finished", 0)):
            return undecided(f"{role}'s final probe has no block-pool counters (free_blocks, blocks_live, "
                             "blocks_initial)")
        if b.get("blocks_initial") != c["blocks_initial"]:
            return undecided(f"{role}'s pool was {b.get('blocks_initial')!r} blocks at its baseline and "
                             f"{c['blocks_initial']} at the end")
        leaked = c["blocks_initial"] - c["free_blocks"] - c["blocks_live"]
        if leaked < 0:
            return undecided(f"{role} counts more blocks free or live ({c['free_blocks']} + {c['blocks_live']}) "
                             f"than its pool has ({c['blocks_initial']})")
        held = c.get("blocks_held_finished", 0)
        det[role] = {"initial": c["blocks_initial"], "free": c["free_blocks"], "live": c["blocks_live"],
                     "leaked": leaked, "held_by_finished": held}
        if leaked:
            leaks.append(f"{role}: {leaked} of {c['blocks_initial']} KV blocks never returned ({c['free_blocks']} "
                         f"free, {c['blocks_live']} held by unfinished requests; {held} held by requests that "
                         f"finished)")
    if leaks:
        return _r(False, "; ".join(leaks), **det)
    return _r(True, "every block back: " + "; ".join(f"{r} {d['free']} free, {d['live']} held by live requests, of "
                                                      f"{d['initial']}" for r, d in det.items()), **det)


@check("post_once")
def post_once(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """D never POSTed one request's transfer params to the metaserver twice: the POST is not
    idempotent (a proxy that got the first one sends the request to P again, and P writes into D's
    blocks twice). Judged from the metaserver's ``repeat_posts`` (a request id it had seen)."""
    c = _final_counters(inp, "metaserver")
    if c is None:
        return undecided("no final probe of the metaserver: D's POSTs cannot be judged")
    if not (_count(c.get("repeat_posts")) and _count(c.get("posts")) and c["repeat_posts"] <= c["posts"]):
        return undecided("the metaserver's final probe has no consistent post counters (posts, repeat_posts)")
    asked = sum(1 for o in inp.ops if o.get("outcome") != "refused")
    if asked and not c["posts"]:
        return undecided(f"{asked} requests reached D and the metaserver counted no POST: cannot judge")
    if c["repeat_posts"]:
        return _r(False, f"{c['repeat_posts']} of {c['posts']} POSTs repeated a request D had POSTed already",
                  posts=c["posts"], repeat_posts=c["repeat_posts"])
    return _r(True, f"{c['posts']} POSTs, none repeated", posts=c["posts"], repeat_posts=0)


def _d_deltas(inp: CheckInput, *keys: str, probes: dict | str | None = None) -> dict[str, dict[str, int]] | str:
    """Every D -> {key: final minus baseline} of its one process (``probes``: ``_d_probes``'s, if
    read already), or why not: a key missing, not a count, or going down."""
    probes = _d_probes(inp) if probes is None else probes
    if isinstance(probes, str):
        return probes
    out: dict[str, dict[str, int]] = {}
    for role, (b, c) in probes.items():
        for key in keys:
            x, y = b.get(key), c.get(key)
            if not (_count(x) and _count(y)) or y < x:
                return f"{role}'s {key} is missing from its baseline or final probe, is not a count, or went down"
            out.setdefault(role, {})[key] = y - x
    return out


@check("kv_content")
def kv_content(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """Every request D completed from P's KV holds what P computed for it: the transfer engine
    copies the bytes into D's caches, and D compares each layer's K and V of a loaded request
    (no block reported failed) with P's pattern before vLLM frees them (``content_bad``). A layer
    never written, or another request's late write into blocks D gave back, shows here."""
    d = _d_deltas(inp, "content_checked", "content_bad")
    if isinstance(d, str):
        return undecided(f"D's content counters cannot be read: {d}")
    roles = list(d)
    for role, c in d.items():
        # completed from P's KV: no block of theirs reported failed (under recompute those D computed itself)
        loaded = sum(1 for o in inp.ops if o.get("phase") == "ok" and o.get("f") == "transfer"
                     and not o.get("blocks_reported") and _op_decode(o, roles) == role)
        if c["content_checked"] < loaded:
            return undecided(f"{loaded} requests completed from P's KV on {role} and it checked the content of "
                             f"{c['content_checked']}: cannot judge the others")
        if c["content_bad"] > c["content_checked"]:
            return undecided(f"{role} counts {c['content_bad']} bad of {c['content_checked']} checked: inconsistent")
    checked = sum(c["content_checked"] for c in d.values())
    bad = sum(c["content_bad"] for c in d.values())
    if bad:
        return _r(False, f"{bad} of {checked} loaded requests hold KV that P did not write for them (a layer never "
                         f"written or written over)", checked=checked, bad=bad,
                  by_d={r: c["content_bad"] for r, c in d.items()})
    return _r(True, f"{checked} loaded requests checked, all hold what P wrote", checked=checked, bad=0)


@check("no_write_after_free")
def no_write_after_free(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """P never wrote into D's blocks after D's scheduler freed them: when vLLM frees the blocks of
    a request whose load failed, D fills them with a value no request's pattern has and watches
    them (20 s) for that request's pattern (``writes_after_free``; ``freed_after_failure``: how
    many it watched). Such a write lands in another request's KV once the blocks are reused.
    Judged up to D's final probe: a write landing after it is not seen (the holds drain first,
    but a request freed in the last seconds is watched only that long)."""
    probes = _d_probes(inp)
    d = _d_deltas(inp, "writes_after_free", "freed_after_failure", probes=probes)
    if isinstance(d, str) or isinstance(probes, str):
        return undecided(f"D's write-after-free counters cannot be read: {d}")
    roles = list(d)
    for role, c in d.items():
        if c["writes_after_free"] > c["freed_after_failure"]:
            return undecided(f"{role} counted {c['writes_after_free']} writes after a free of "
                             f"{c['freed_after_failure']} watched requests: inconsistent")
        final = probes[role][1]
        failed = sum(1 for o in inp.ops if o.get("outcome") == "failed_load" and _op_decode(o, roles) == role)
        every_block_back = final.get("blocks_held_finished", 0) == 0 \
            and final.get("free_blocks") == final.get("blocks_initial") is not None
        if every_block_back and c["freed_after_failure"] < failed:
            # every block came back, so every failed request's blocks were freed: each must have been watched
            return undecided(f"{failed} requests failed on {role} and got their blocks back, and it watched "
                             f"{c['freed_after_failure']} of them after the free: cannot judge the others")
    writes = sum(c["writes_after_free"] for c in d.values())
    freed = sum(c["freed_after_failure"] for c in d.values())
    if writes:
        return _r(False, f"P wrote {writes} of {freed} failed requests' KV into D's blocks after D freed them",
                  freed=freed, writes_after_free=writes)
    return _r(True, f"{freed} failed requests' freed blocks watched: P wrote none of them afterwards", freed=freed,
              writes_after_free=0)


@check("failed_where_faulted")
def failed_where_faulted(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """A request that failed while only faults aimed at another D were active is a wrong failure:
    its KV was written, and P told its D FAILED for another D's failed write. Judged for ops whose
    span overlaps a window (plus tail) of a fault with a ``decode`` target; an op also overlapping
    a fault aimed at its own D, or at every D, is that fault's doing."""
    faults = {f.get("id"): f for f in inp.meta.get("faults") or []}
    roles = _decodes(inp)

    def target(f: dict) -> str:
        return str((f.get("params") or {}).get("decode") or "all")

    started = [w for w in inp.windows if w.get("start") is not None]
    stray = [w for w in started if w.get("id") not in faults]
    if stray:
        return undecided(f"a fault window (id {stray[0].get('id')}) of no fault the run scheduled")
    aimed = [w for w in started if target(faults[w["id"]]) != "all"]
    if not aimed:
        return undecided("no fault aimed at one D ran: nothing to judge (set the check only where one does)")
    end = history_end(inp)

    def hits(o: dict) -> list[dict]:
        a, b = op_span(o, end)
        return [faults[w["id"]] for w in started if in_window(a, b, w, window_tail_s(w, faults[w["id"]]))]

    wrong, judged, spared_seen, aimed_failed = [], 0, 0, 0
    for o in inp.ops:
        d = _op_decode(o, roles)
        if d is None:
            return undecided(f"op {o['id']} ran on no D of this topology: cannot judge where it failed")
        if o.get("t_invoke") is None:
            if o.get("phase") != "ok":
                return undecided(f"op {o['id']} failed with no invoke record: its span is unknown")
            continue
        fs = hits(o)
        if any(target(f) not in ("all", d) for f in fs):
            spared_seen += 1  # an op of a D some fault spared, during that fault
        if o.get("phase") == "ok" or not fs:
            continue  # failures_explained judges a failure outside every window
        judged += 1
        if any(target(f) == d for f in fs):
            aimed_failed += 1
        if all(target(f) not in ("all", d) for f in fs):
            wrong.append(o)
    det = {"judged": judged, "wrong": _first([o["id"] for o in wrong]), "spared_ops": spared_seen,
           "aimed_failures": aimed_failed}
    if wrong:
        o = wrong[0]
        return _r(False, f"{len(wrong)} request(s) failed on a D no active fault was aimed at (first: op {o['id']} "
                         f"on {_op_decode(o, roles)}, {o.get('outcome')})", **det)
    if not spared_seen or not aimed_failed:
        return undecided(f"the aimed fault shows nothing to judge: {spared_seen} ops of a spared D ran during it, "
                         f"{aimed_failed} requests of its own D failed")
    return _r(True, f"{judged} failed requests in fault windows, each on the D its fault was aimed at "
                    f"({spared_seen} ops of the spared D ran meanwhile)", **det)


# --------------------------------------------------------------------------- triggers (harness/triggers.py)

class RequestsOnDecode(TriggerParams):
    fault: int = Field(ge=0, description="the fault entry (0-based, in file order) whose window is meant")
    decode: str = Field(pattern=r"^decode[0-9]*$", description="the D the requests ran on (`decode`, `decode2`)")
    min: int = Field(1, ge=1, le=1000, description="at least this many of its requests in flight in the window")


@FAMILY.triggers.trigger("requests_on_decode", RequestsOnDecode)
def requests_on_decode(inp: CheckInput, params: dict) -> Fired:
    """At least ``min`` requests that ran on D ``decode`` were in flight while fault ``fault``
    acted (as ``ops_in_window``, counting only that D's requests): a claim about what a fault aimed
    at one D does to the other (``failed_where_faulted``) rests on requests of each D meeting it."""
    roles = _decodes(inp)
    d = params["decode"]
    if d not in roles:
        return Fired(False, f"the topology has no D {d!r} (its Ds: {', '.join(roles) or 'none'})")
    return in_flight(inp, params, [o for o in inp.ops if _op_decode(o, roles) == d], f"requests on {d}")


class ListenerProbed(TriggerParams):
    fault: int = Field(ge=0, description="the listener_garbage fault entry (0-based, in file order)")
    min: int = Field(1, ge=1, le=1000, description="at least this many messages sent to D's listener in its window")


@FAMILY.triggers.trigger("listener_probed", ListenerProbed)
def listener_probed(inp: CheckInput, params: dict) -> Fired:
    """At least ``min`` malformed or unexpected messages reached D's listener during fault
    ``fault``'s window (its ``listener_probe`` events, answered or not: whether they were answered
    is ``listener_answers``' to judge): the claim about D's listener rests on it having been sent them."""
    fid, need = params["fault"], params.get("min", 1)
    w = next((w for w in inp.windows if w.get("id") == fid), None)
    if w is None or not isinstance(w.get("start"), (int, float)) or not isinstance(w.get("stop"), (int, float)):
        return Fired(False, f"fault {fid} never opened a window")
    sent = [e for e in inp.events if e.get("what") == "listener_probe" and isinstance(e.get("t"), (int, float))
            and w["start"] <= e["t"] <= w["stop"]]
    return Fired(len(sent) >= need, f"{len(sent)} messages sent to D's listener during {w.get('name')} "
                                    f"(fault {fid}; {need} needed)")
