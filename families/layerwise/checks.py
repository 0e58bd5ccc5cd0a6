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

from harness.checks import CheckInput, CheckResult, _first, _r, undecided

from .family import FAMILY

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
    """The D roles of the history (decode, decode2), from its probes."""
    roles = {p.get("node") for p in inp.probes if str(p.get("node", "")).startswith("decode")}
    roles |= {o.get("decode") for o in inp.ops if o.get("decode")}  # a D the ops used must have been probed
    return sorted(roles) or ["decode"]


@check("blocks_returned")
def blocks_returned(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """Every D's scheduler got back every KV block its requests held: at D's final probe, the
    free blocks of vLLM's block pool plus those held by unfinished requests equal the pool at the
    start (a request finished without its blocks freed, e.g. FINISHED_ERROR while its load is
    never reported finished, holds them for ever: counted as leaked)."""
    det: dict = {}
    leaks = []
    for role in _decodes(inp):
        c = _final_counters(inp, role)
        if c is None:
            return undecided(f"no final probe of {role}: its block pool cannot be judged")
        if not all(_count(c.get(k)) for k in ("free_blocks", "blocks_live", "blocks_initial")) \
                or not _count(c.get("blocks_held_finished", 0)):
            return undecided(f"{role}'s final probe has no block-pool counters (free_blocks, blocks_live, "
                             "blocks_initial)")
        leaked = c["blocks_initial"] - c["free_blocks"] - c["blocks_live"]
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


def _delta(inp: CheckInput, node: str, key: str) -> int | None:
    """Final minus baseline of a node's counter, same pid (a pooled node's counters span runs);
    None: a probe, the key or a valid count missing, or a baseline above the final."""
    final = [p for p in inp.probes if p.get("node") == node and p.get("when") == "final"]
    if not final:
        return None
    p = final[-1]
    base = [b for b in inp.probes if b.get("node") == node and b.get("when") == "baseline"
            and b.get("pid") == p.get("pid")]
    if len(base) != 1:
        return None
    a, b = (base[0].get("counters") or {}).get(key), (p.get("counters") or {}).get(key)
    if not (_count(a) and _count(b)) or b < a:
        return None
    return b - a


def _delta_decodes(inp: CheckInput, key: str) -> int | None:
    """``_delta`` of every D, summed; None when any D's cannot be read."""
    total = 0
    for role in _decodes(inp):
        d = _delta(inp, role, key)
        if d is None:
            return None
        total += d
    return total


@check("kv_content")
def kv_content(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """Every request D completed from P's KV holds what P computed for it: the transfer engine
    copies the bytes into D's caches, and D compares each layer's K and V of a loaded request
    (no block reported failed) with P's pattern before vLLM frees them (``content_bad``). A layer
    never written, or another request's late write into blocks D gave back, shows here."""
    checked, bad = _delta_decodes(inp, "content_checked"), _delta_decodes(inp, "content_bad")
    if checked is None or bad is None:
        return undecided("D's content counters (content_checked, content_bad) are missing from its one baseline "
                         "and final probe, or are not counts, or went down")
    # completed from P's KV: no block of theirs reported failed (under recompute those D computed itself)
    loaded = sum(1 for o in inp.ops if o.get("phase") == "ok" and o.get("f") == "transfer"
                 and not o.get("blocks_reported"))
    if checked < loaded:
        return undecided(f"{loaded} requests completed from P's KV and D checked the content of {checked}: "
                         f"cannot judge the others")
    if bad:
        return _r(False, f"{bad} of {checked} loaded requests hold KV that P did not write for them (a layer never "
                         f"written or written over)", checked=checked, bad=bad)
    return _r(True, f"{checked} loaded requests checked, all hold what P wrote", checked=checked, bad=0)


@check("no_write_after_free")
def no_write_after_free(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """P never wrote into D's blocks after D's scheduler freed them: when vLLM frees the blocks of
    a request whose load failed, D fills them with a value no request's pattern has and watches
    them (20 s) for that request's pattern (``writes_after_free``; ``freed_after_failure``: how
    many it watched). Such a write lands in another request's KV once the blocks are reused."""
    writes, freed = _delta_decodes(inp, "writes_after_free"), _delta_decodes(inp, "freed_after_failure")
    if writes is None or freed is None:
        return undecided("D's counters (writes_after_free, freed_after_failure) are missing from its one baseline "
                         "and final probe, or are not counts, or went down")
    if writes > freed:
        return undecided(f"D counted {writes} writes after a free of {freed} watched requests: inconsistent")
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

    def target(f: dict) -> str:
        return str((f.get("params") or {}).get("decode") or "all")

    aimed = [w for w in inp.windows if w.get("start") is not None and target(faults.get(w.get("id"), {})) != "all"]
    if not aimed:
        return undecided("no fault aimed at one D ran: nothing to judge (set the check only where one does)")
    end = max((r.get("t", 0.0) for r in inp.records if "t" in r), default=0.0)
    wrong, judged = [], 0
    for o in inp.ops:
        if o.get("phase") == "ok" or not o.get("decode"):
            continue
        a, b = o.get("t_invoke"), o.get("t_complete")
        b = end if b is None else b
        if a is None:
            continue
        hits = [faults.get(w.get("id"), {}) for w in inp.windows if w.get("start") is not None
                and a <= float(w["stop"]) + float(faults.get(w.get("id"), {}).get("tail_s") or 0.0)
                and b >= w["start"]]
        if not hits:
            continue  # failures_explained judges a failure outside every window
        judged += 1
        if all(target(f) not in ("all", o["decode"]) for f in hits):
            wrong.append(o)
    det = {"judged": judged, "wrong": _first([o["id"] for o in wrong])}
    if wrong:
        o = wrong[0]
        return _r(False, f"{len(wrong)} request(s) failed on a D no active fault was aimed at (first: op {o['id']} "
                         f"on {o['decode']}, {o.get('outcome')})", **det)
    return _r(True, f"{judged} failed requests in fault windows, each on the D its fault was aimed at", **det)
