"""The pd family's generator for ``pdchaos explore`` (harness/explore.py): seeded schedules of
several faults (overlapping windows, either node), a link, a workload mix, over the real P/D pair.

A schedule first draws its link (``topology.link``): ``direct`` most of the time, ``toxiproxy``
(P's bootstrap server behind Toxiproxy) or ``netns`` (P in its own network namespace), and its
workload (concurrency 1-8, prompt length 64-400 tokens, 8-32 output tokens). Then 1-3 faults among
those the link allows:

- process faults: ``stop`` (SIGSTOP/SIGCONT: a freeze) on either node, overlapping anything but
  another process fault on the same node (the first heal would thaw the second's window);
  ``kill`` (SIGKILL, restarted at heal; P with its engine id kept or new, ``topology.engine_id``)
  only alone, in a 50 s workload (a vLLM restart is a 30 s-2 min cold start here), with
  ``recovery`` and ``no_busy_wait`` not judged (the restart's length is the machine's, and a node
  beside a restarting peer spins in vLLM's shared-memory queue whatever the connector does:
  pd-long/kill-decode, measured);
- the faults that act through the P/D proxy (its phase hooks, the fake prefill peer's redirect,
  ``bad_transfer_params``) never overlap one another: each one's heal clears the proxy's hooks, so
  an overlap would leave one window without its effect (a harness error, not a finding); an abort
  storm is ``abort_while_decode_waits`` with a count of 8-40 at concurrency 8;
- ``side_channel_garbage`` at most once (an upstream P's listener it kills stays dead);
- with ``link: toxiproxy``: a toxic on the bootstrap link (latency, bandwidth, reset_peer, slicer,
  timeout; either stream), at most one at a time (one Toxiproxy proxy);
- with ``link: netns``: ``partition`` (iptables DROP) or ``refuse`` (REJECT), one way or both, or a
  ``bandwidth_limit``, at most one at a time; the deadline is 15 s (a new connection's SYN is
  retried at 15 s: pd-partition-prefill-decode).

Phase-keyed timing (harness/phases.py): a share of the freezes (``stop``) are keyed on a protocol
phase instead of a fixed time: armed at their drawn ``at``, they start 0, 50 or 200 ms after the
first ``p_pull_served``, ``p_write_started``, ``p_write_done`` or ``d_pull_out`` that follows, and
their window (arming, bound ``within``, offset, length) overlaps no other fault's (another fault
could keep the phase from coming: a harness error, not a finding); a keyed window holds no pause,
and its trigger ``phase_keyed`` proves it started there. Only phases every target shows are drawn
(``d_cancel_sent`` is the hardened D's; ``d_bootstrap_query_out`` comes only from a D that has not
met this P, never from a warm one).

Every window leaves every worker time for its first op after the heal (``recovery``); the first
window of 3.5 s or more holds a 3.5 s workload pause, so that ``no_busy_wait`` sees a quiet
interval; each fault is a trigger (``ops_in_window``): a window no request crossed is a harness
error, never a pass. Every schedule ``draw`` returns renders to a scenario file that ``pdchaos
validate`` passes (tests/families/pd/test_explore_generator.py, a property test).
"""

from __future__ import annotations

import random
from typing import Any

MIN_WINDOW_S = 2.0
PROXY_FAULTS = ("abort_after_prefill", "abort_while_decode_waits", "hold_after_prefill", "bad_transfer_params",
                "fake_prefill_peer")
FAKE_MODES = ("garbage", "error", "unknown", "other", "silent", "bootstrap_500", "unknown_engine")
TOXICS = ("latency", "bandwidth", "reset_peer", "slicer", "timeout")  # on P's bootstrap link (Toxiproxy)
NETNS = ("partition", "refuse", "bandwidth_limit")  # between P's namespace and D's
DIRECTIONS = ("client->server", "server->client", "both")
NODES = ("prefill:0", "decode:0")
HEAL_S = 2.0  # the slowest heal here (the fake prefill peer's stop)
LINKS = ("direct",) * 6 + ("toxiproxy",) * 2 + ("netns",) * 2
KILL_SHARE = 0.05  # of the schedules: a kill is one cold start of vLLM (30 s-2 min here)
PHASE_SHARE = 0.4  # of the freezes: keyed on a protocol phase (harness/phases.py)
PHASES = ("p_pull_served", "p_write_started", "p_write_done", "d_pull_out")  # every target shows them
PHASE_OFFSETS = (0.0, 0.0, 0.05, 0.2)
PHASE_WITHIN = (2.0, 4.0)  # the bound on the phase's coming after the arming: at least one request's time


def _fault(rng: random.Random, kind: str, concurrency: int = 2) -> dict:
    if kind in ("stop", "kill"):
        return {"type": kind, "node": rng.choice(NODES)}
    if kind == "fake_prefill_peer":
        return {"type": kind, "mode": rng.choice(FAKE_MODES), "count": rng.choice([1, 2])}
    if kind == "abort_while_decode_waits":
        storm = concurrency >= 8 and rng.random() < 0.5
        return {"type": kind, "count": rng.randint(8, 40) if storm else rng.randint(1, 5),
                "after": rng.choice([0.025, 0.05, 0.1])}
    if kind == "abort_after_prefill":
        return {"type": kind, "count": rng.randint(1, 3)}
    if kind == "hold_after_prefill":
        return {"type": kind, "count": 1, "seconds": 2.0}
    if kind == "bad_transfer_params":
        return {"type": kind, "count": 1}
    if kind == "side_channel_garbage":
        return {"type": kind, "frames": rng.randint(2, 3)}
    stream = rng.choice(["upstream", "downstream"])
    if kind == "latency":
        return {"type": kind, "latency": rng.choice([0.2, 1.0, 2.0]), "jitter": rng.choice([0.0, 0.01]),
                "stream": stream}
    if kind == "bandwidth":
        return {"type": kind, "rate": rng.choice([1, 8, 64]), "stream": stream}
    if kind == "reset_peer":
        return {"type": kind, "timeout": rng.choice([0.0, 0.5]), "stream": stream}
    if kind == "slicer":
        size = rng.choice([4, 32])
        return {"type": kind, "average_size": size, "size_variation": size // 2, "delay": 0.0001, "stream": stream}
    if kind == "timeout":
        return {"type": kind, "timeout": rng.choice([0.0, 1.0]), "stream": stream}
    if kind in ("partition", "refuse"):
        return {"type": kind, "direction": rng.choice(DIRECTIONS)}
    if kind == "bandwidth_limit":
        return {"type": kind, "rate_kbit": rng.choice([64, 512]), "direction": rng.choice(DIRECTIONS)}
    raise ValueError(kind)


KINDS = ("stop", "stop", "fake_prefill_peer", "abort_while_decode_waits", "abort_after_prefill",
         "hold_after_prefill", "bad_transfer_params", "side_channel_garbage")
LINK_KINDS = {"direct": (), "toxiproxy": TOXICS, "netns": NETNS}


def _link_of(faults: list[dict]) -> str:
    kinds = {f["type"] for f in faults}
    return "toxiproxy" if kinds & set(TOXICS) else "netns" if kinds & set(NETNS) else "direct"


def cover(rng: random.Random) -> list[dict]:
    """Each fault kind alone once (each fake-peer mode and each node's stop count as a kind), in a
    seeded order, before explore's random combinations: every kind is tried in any budget that
    runs this many schedules. The kinds on the plain link come first (they share warm nodes), then
    the toxics, then the namespace faults (a fresh pair each), then a kill of each node (a cold
    start each)."""
    kinds: list[dict] = [{"type": "stop", "node": n} for n in NODES]
    # each node frozen at a phase of its own: P as it starts writing, D as its pull goes out
    kinds += [{"type": "stop", "node": n, "upon": {"phase": ph, "offset": 0.0, "within": PHASE_WITHIN[0]}}
              for n, ph in zip(NODES, ("p_write_started", "d_pull_out"))]
    kinds += [{"type": "fake_prefill_peer", "mode": m, "count": 1} for m in FAKE_MODES]
    for kind in dict.fromkeys(KINDS):
        if kind not in ("stop", "fake_prefill_peer"):
            kinds.append(_fault(rng, kind))
    rng.shuffle(kinds)
    later = [_fault(rng, k) for k in TOXICS] + [_fault(rng, k) for k in NETNS]
    out = []
    for f in kinds + later:
        concurrency = rng.choice([1, 2, 4])
        rate = min(4.0, concurrency * rng.choice([0.5, 1.0]))
        duration = 16.0
        length = 6.0  # room for a pause (render) while the fault acts
        at = round(rng.uniform(0.5, duration - (concurrency / rate + HEAL_S + 1.0) - length), 1)
        if f.get("upon"):  # keyed: armed early, its window may start up to `within` later (no pause in it)
            length, at = 4.0, 1.0
        out.append({"workload": {"duration": duration, "concurrency": concurrency, "rate": rate,
                                 "request_timeout": 30.0},
                    "faults": [{**f, "at": at, "for": length}], "topology": {"link": _link_of([f])}})
    for node in NODES:
        out.append(_kill_schedule(rng, node))
    return out


def _kill_schedule(rng: random.Random, node: str) -> dict:
    return {"workload": {"duration": 50.0, "concurrency": rng.choice([1, 2]), "rate": 0.5, "request_timeout": 30.0},
            "faults": [{"type": "kill", "node": node, "at": round(rng.uniform(2.0, 6.0), 1),
                        "for": float(rng.choice([1, 3]))}],
            "topology": {"link": "direct", "engine_id": rng.choice(["random", "fixed"])}}


def signature(schedule: dict) -> str:
    """The fault kinds of a schedule (a stop or kill names its node, a fake peer its mode, a
    network fault its direction): two findings with the same kinds and failing checks are one
    defect until shown otherwise."""
    parts = []
    for f in schedule["faults"]:
        extra = f.get("node") or f.get("mode") or f.get("direction") or f.get("stream")
        if f.get("upon"):  # the same fault at a phase is another interleaving
            extra = f"{extra}@{f['upon']['phase']}"
        parts.append(f"{f['type']}({extra})" if extra else f["type"])
    return "+".join(sorted(parts))


def end(f: dict) -> float:
    """The latest a drawn fault may still be in its window: a keyed one may start as late as its
    arming plus its bound and offset (harness/phases.py, latest_end)."""
    upon = f.get("upon")
    return f["at"] + f["for"] + (upon["within"] + upon["offset"] if upon else 0.0)


def _overlap(a: dict, b: dict) -> bool:
    return a["at"] < end(b) and b["at"] < end(a)


def _clashes(f: dict, faults: list[dict]) -> bool:
    """``f`` may not overlap one of ``faults``: two proxy faults (each heal clears the hooks), two
    process faults on one node (the first heal thaws the second), two toxics or two namespace
    faults (one proxy, one set of rules)."""
    for g in faults:
        if not _overlap(f, g):
            continue
        if f.get("upon") or g.get("upon"):
            return True  # a keyed window overlaps nothing: another fault could keep its phase away
        if f["type"] in PROXY_FAULTS and g["type"] in PROXY_FAULTS:
            return True
        if f["type"] in ("stop", "kill") and g["type"] in ("stop", "kill") and f["node"] == g["node"]:
            return True
        if (f["type"] in TOXICS and g["type"] in TOXICS) or (f["type"] in NETNS and g["type"] in NETNS):
            return True
    return False


HEALS = {"fake_prefill_peer": HEAL_S}  # the heal allowance of a kind (faults/: heal_allowance_s), others 0


def _recovery_ok(faults: list[dict], duration: float, need: float) -> bool:
    """What ``pdchaos validate`` asks of a schedule (harness/schema.py, validate_recovery_gaps):
    after every merged window and its heal, ``need`` seconds before the next window or the end."""
    from harness.schema import merge_windows

    spans = [(f["at"], end(f), HEALS.get(f["type"], 0.0)) for f in faults]
    stop = None  # the end of the merged window so far
    for a, b, _ in sorted(spans):
        if stop is not None and abs(a - stop) < 0.01:
            return False  # windows that touch: merged or not by a rounding of their milliseconds
        stop = b if stop is None or a > stop else max(stop, b)
    merged = merge_windows(spans)
    for i, (_, stop, healed) in enumerate(merged):
        nxt = merged[i + 1][0] if i + 1 < len(merged) else duration
        if nxt - stop < need + (healed - stop) + 0.01:
            return False
    return True


def draw(rng: random.Random) -> dict:
    if rng.random() < KILL_SHARE:
        return _kill_schedule(rng, rng.choice(NODES))
    link = rng.choice(LINKS)
    concurrency = rng.choice([1, 2, 4, 8])
    rate = min(4.0, concurrency * rng.choice([0.5, 1.0]))
    duration = float(rng.choice([14, 16, 18, 20]))
    workload = {"duration": duration, "concurrency": concurrency, "rate": rate, "request_timeout": 30.0,
                "prompt_tokens": rng.choice([64, 200, 200, 400]), "output_tokens": rng.choice([8, 16, 16, 32])}
    gap = concurrency / rate + HEAL_S + 1.0  # recovery: every worker's first op after the last heal
    kinds = KINDS + LINK_KINDS[link] * 2
    faults: list[dict] = []
    for n in range(rng.choice([1, 1, 2, 2, 3])):
        # the link's own kinds first: a schedule on a toxiproxy or netns link has at least one of them
        kind = rng.choice(LINK_KINDS[link]) if n == 0 and LINK_KINDS[link] else rng.choice(kinds)
        if kind == "side_channel_garbage" and any(f["type"] == kind for f in faults):
            continue
        f = _fault(rng, kind, concurrency)
        length = float(rng.choice([4, 6] if not faults else [2, 3, 4, 6]))  # the first holds a pause
        latest = duration - gap - length
        if latest < 0.5:
            continue
        f["at"], f["for"] = round(rng.uniform(0.5, latest), 1), length
        offset = rng.choice(PHASE_OFFSETS)
        if f["type"] == "stop" and rng.random() < PHASE_SHARE and latest - offset - PHASE_WITHIN[0] >= 0.5:
            # armed early enough that the keyed window still ends in time for recovery
            f["at"] = round(rng.uniform(0.5, latest - offset - PHASE_WITHIN[0]), 1)
            room = round(latest - f["at"] - offset, 1)
            f["upon"] = {"phase": rng.choice(PHASES), "offset": offset, "within": min(PHASE_WITHIN[1], room)}
        if _clashes(f, faults) or not _recovery_ok(faults + [f], duration, concurrency / rate):
            continue
        faults.append(f)
    if not faults:  # one stop of either node, early: every schedule has a fault
        faults.append({**_fault(rng, "stop"), "at": 1.0, "for": 3.0})
    faults.sort(key=lambda f: f["at"])
    return {"workload": workload, "faults": faults, "topology": {"link": _link_of(faults)}}


DURATIONS = ("at", "for", "after", "seconds", "latency", "jitter", "delay", "timeout")  # written as durations


def _dur(v: float) -> str:
    v = float(v)
    if 0 < v < 0.001:
        return f"{round(v * 1_000_000):d}us"
    return f"{round(v * 1000):d}ms"


def _upon(upon: dict) -> dict:
    return {"phase": upon["phase"], "offset": _dur(upon["offset"]), "within": _dur(upon["within"])}


def render(schedule: dict, name: str, target: str, seed: int) -> dict[str, Any]:
    w = dict(schedule["workload"])
    faults = [dict(f) for f in schedule["faults"]]
    topology = dict(schedule.get("topology") or {})
    if topology.get("link") == "direct":
        del topology["link"]
    killed = any(f["type"] == "kill" for f in faults)
    # 3.5 s with no request starting: room for two of the nodes' samples with nothing in flight
    # after the last requests end (1.5 s left 10 of 38 drawn runs at concurrency 4-8 without a
    # quiet interval to judge; 2.5 s one of 11 at concurrency 2: a silent peer's request failing at
    # its 2 s deadline inside the pause, then a node's 1.5 s tail; the suite's pauses are 3.5 s too)
    # (never in a keyed window: requests paused would keep its phase from coming)
    pause = None if killed else next(({"at": _dur(f["at"] + 0.5), "for": "3500ms"} for f in faults
                                      if f["for"] >= 4.0 and f["at"] + 4.0 <= w["duration"]
                                      and not f.get("upon")), None)
    if pause is not None:
        w["pauses"] = [pause]
    doc: dict[str, Any] = {
        "name": name, "family": "pd",
        "description": f"drawn by pdchaos explore (seed {seed})",
        "seed": seed, "deadline": "15s" if topology.get("link") == "netns" else "10s", "tolerance": "2s",
        "cap": "500s" if killed else "300s",
        "targets": [target],
    }
    if topology:
        doc["topology"] = topology
    doc.update({
        "workload": {k: (f"{v:g}s" if k in ("duration", "request_timeout") else v) for k, v in w.items()},
        "faults": [{**{k: (_dur(v) if k in DURATIONS else _upon(v) if k == "upon" else v) for k, v in f.items()}}
                   for f in faults],
        "triggers": [{"type": "ops_in_window", "fault": i} for i in range(len(faults))]
        + [{"type": "phase_keyed", "fault": i} for i, f in enumerate(faults) if f.get("upon")],
        "expect": {target: "pass"},
    })
    checks: dict[str, Any] = {}
    if pause is None:  # no window holds a pause: no quiet interval to judge busy waiting in
        checks["no_busy_wait"] = {"enabled": False}
    if killed:  # the restart's length is the machine's (30 s-2 min): not a bound on the connector
        checks["recovery"] = {"enabled": False}
    if checks:
        doc["checks"] = checks
    return doc
