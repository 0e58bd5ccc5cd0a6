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
- with ``link: netns``: ``partition`` (iptables DROP) or ``refuse`` (REJECT), one way or both, a
  ``bandwidth_limit``, or ``refuse_port``/``partition_port`` on one port of P only (its side
  channel, where D's pulls go, most often; its bootstrap server; its HTTP server:
  families/pd/port_faults.py), at most one at a time; the deadline is 15 s (a new connection's SYN
  is retried at 15 s: pd-partition-prefill-decode); never ``fake_prefill_peer`` or
  ``side_channel_garbage`` (they reach a peer at a loopback address a namespace cuts off);
- on a KV pool (8 % of the schedules, ``topology.kv_pool``: launch profile cpu-store, P, D and a
  real ``mooncake_master``, no warm nodes): the store master frozen or killed (restarted empty at
  heal) first, maybe a freeze of P or D inside its window, maybe a hook the store proxy takes;
  never keyed on a phase (the phase journal wraps vLLM's Mooncake connector, not the store one);
- faults overlapping on different nodes: in 30 % of the schedules a freeze of another node starts
  inside the first fault's window (P and D, or the master and P or D);
- a shared-prefix mix in 25 % of the workloads (``shared_prefix_tokens``, ``prefix_groups``): prefix
  caching is off on the nodes, so the requests' blocks stay their own on P and D and D pulls all
  of them; the pull groups requests by P's engine id and scheduler step, never by prompt.

Phase-keyed timing (harness/phases.py): a share of the freezes (``stop``) are keyed on a protocol
phase instead of a fixed time: armed at their drawn ``at``, they start 0, 50 or 200 ms after the
first ``p_pull_served``, ``p_write_started``, ``p_write_done`` or ``d_pull_out`` that follows, and
their window (arming, bound ``within``, offset, length) overlaps no other fault's (another fault
could keep the phase from coming: a harness error, not a finding); a keyed window holds no pause,
and its trigger ``phase_keyed`` proves it started there. Only phases every target shows are drawn
(``d_cancel_sent`` is the hardened D's; ``d_bootstrap_query_out`` comes only from a D that has not
met this P, never from a warm one).

Every window leaves every worker time for its first op after the heal (``recovery``); the first
window of 4 s or more holds a workload pause (3.5 s; 5.5 s for a fake peer where it fits), so that
``no_busy_wait`` sees a quiet interval; in a proxy hook's window the pause starts once the hook's
first request has come (one pacing interval and 0.5 s after it is armed). A silent fake peer's
window lasts ``HOLD_S`` (6 s) past the latest moment its first request can come: its stop at heal
ends D's wait whatever D's deadline, so only a longer window puts the load deadline to the test
(guarantee 1; system mutant NoLoadDeadline). Each fault is a trigger (``ops_in_window``): a window
no request crossed is a harness error, never a pass. Every schedule ``draw`` returns renders to a scenario file that ``pdchaos
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
PORT_FAULTS = ("refuse_port", "partition_port")  # iptables on one port of P (families/pd/port_faults.py)
NETNS = ("partition", "refuse", "bandwidth_limit") + PORT_FAULTS  # between P's namespace and D's
PORTS = ("side_channel", "side_channel", "bootstrap", "http")  # D's pulls go to the side channel: drawn most
# faults that reach P or a fake peer at a loopback address the harness's namespace shares with them:
# with P in a namespace of its own they cannot (read, not measured), so a netns link never draws them
NOT_ON_NETNS = ("fake_prefill_peer", "side_channel_garbage")
STORE = "store"  # the KV pool's store master (topology.kv_pool, launch profile cpu-store)
STORE_SHARE = 0.08  # of the schedules: a KV pool (no warm nodes: P, D and the master start cold each time)
STORE_KINDS = ("abort_after_prefill", "abort_while_decode_waits", "hold_after_prefill")  # hooks the store proxy takes
OVERLAP_SHARE = 0.3  # of the schedules: a freeze of another node inside the first fault's window
PREFIX_SHARE = 0.25  # of the workloads: a shared-prefix mix
EOS_SHARE = 0.15  # of the schedules whose faults start late enough: an EOS prompt sent first
# scenarios/pd/eos-answer.yaml: with the prompts of seed 107 (default length, no shared prefix) prompt
# 12's greedy answer on the tiny model is EOS at once (the guarantee "P keeps the prompt's KV for D
# also when its one token is EOS"); a drawn schedule with the mix takes that seed and sends it first
EOS_SEED, EOS_PROMPT = 107, 12
DIRECTIONS = ("client->server", "server->client", "both")
NODES = ("prefill:0", "decode:0")
HEAL_S = 2.0  # the slowest heal here (the fake prefill peer's stop)
LINKS = ("direct",) * 6 + ("toxiproxy",) * 2 + ("netns",) * 2
KILL_SHARE = 0.05  # of the schedules: a kill is one cold start of vLLM (30 s-2 min here)
PHASE_SHARE = 0.4  # of the freezes: keyed on a protocol phase (harness/phases.py)
PHASES = ("p_pull_served", "p_write_started", "p_write_done", "d_pull_out")  # every target shows them
PHASE_OFFSETS = (0.0, 0.0, 0.05, 0.2)
PHASE_WITHIN = (2.0, 4.0)  # the bound on the phase's coming after the arming: at least one request's time
# guarantee 1 (every KV load on D ends within kv_load_timeout_ms, 2 s here) has one interleaving
# that nothing but the deadline ends: a peer that stays up, answers D's heartbeats (libzmq answers
# ZMTP pings whatever its application does), takes the pull and never writes nor answers. The
# silent fake peer is that peer only while its window lasts: its stop at heal closes the side
# channel, D's pull sees DISCONNECTED and fails the load (peer_gone), deadline or not. So a drawn
# silent peer holds its window this long after the latest moment its first request can come: past
# the load deadline plus fail_fast's 2 s margin (4 s) with room to spare. Measured: drawn as before
# (its request caught after the window's pause, 1.4 s before the heal), NoLoadDeadline failed that
# request at 1.68 s, inside the bound, and survived 600 s of exploration (docs/interleavings.md,
# "Re-proving, --mutant and the explorer's power").
HOLD_S = 6.0


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
    if kind in PORT_FAULTS:
        return {"type": kind, "port": rng.choice(PORTS), "direction": rng.choice(DIRECTIONS)}
    if kind == "bandwidth_limit":
        return {"type": kind, "rate_kbit": rng.choice([64, 512]), "direction": rng.choice(DIRECTIONS)}
    raise ValueError(kind)


def _lead(rate: float) -> float:
    """How long after a proxy hook is armed its first request has surely come: one pacing interval
    of the whole workload (ops start every 1/rate s) and half a second for it to reach the proxy
    (scenarios/pd arm their hooks half a second before the op they mean: armed on the tick they
    raced it). A hook acts on the next requests, never on those in flight, so a window's pause
    starts only after this (else the hook catches the first request after the pause, or none)."""
    return round(1.0 / rate + 0.5, 2)


def _window(f: dict, length: float, rate: float) -> float:
    """The window a drawn fault gets: a silent fake peer holds its first request ``HOLD_S`` past
    the latest moment it can come (the interleaving only D's load deadline bounds); a proxy hook
    long enough for a pause is made long enough for one after its first request."""
    if f["type"] == "fake_prefill_peer" and f.get("mode") == "silent":
        return max(length, round(_lead(rate) + HOLD_S, 2))
    if f["type"] in PROXY_FAULTS and length >= 4.0:
        return max(length, round(_lead(rate) + PAUSES[-1], 2))
    return length


KINDS = ("stop", "stop", "fake_prefill_peer", "abort_while_decode_waits", "abort_after_prefill",
         "hold_after_prefill", "bad_transfer_params", "side_channel_garbage")
LINK_KINDS = {"direct": (), "toxiproxy": TOXICS, "netns": NETNS}


def _link_of(faults: list[dict]) -> str:
    kinds = {f["type"] for f in faults}
    return "toxiproxy" if kinds & set(TOXICS) else "netns" if kinds & set(NETNS) else "direct"


def _topology_of(faults: list[dict]) -> dict:
    """A fault on the store master needs the KV pool (launch profile cpu-store: no phase journal, no
    warm nodes), every other fault the link it acts on."""
    if any(f.get("node") == STORE for f in faults):
        return {"link": "direct", "kv_pool": True}
    return {"link": _link_of(faults)}


def _prefix_mix(rng: random.Random, prompt_tokens: int) -> dict:
    """A shared-prefix mix: prompts start with one of 1-3 prefixes of a quarter to three quarters
    of their length. Prefix caching is off on the nodes, so each request's blocks are still its own
    on P and D and D pulls all of them; the pull groups requests by P's engine id and scheduler step,
    not by their prompts (docs/interleavings.md, the wider generator)."""
    share = rng.choice([0.25, 0.5, 0.75])
    return {"shared_prefix_tokens": max(8, min(prompt_tokens - 8, int(prompt_tokens * share))),
            "prefix_groups": rng.choice([1, 1, 2, 3])}


def cover(rng: random.Random) -> list[dict]:
    """Each fault kind alone once (each fake-peer mode and each node's stop count as a kind), in a
    seeded order, before explore's random combinations: every kind is tried in any budget that
    runs this many schedules. The kinds on the plain link come first (they share warm nodes), with
    P and D frozen at once and a shared-prefix mix after them, then the toxics, then the namespace
    faults (a fresh pair each; each port fault on P's side channel), then the store master frozen
    and killed (a KV pool: P, D and the master start cold), then a kill of each node (a cold start
    each)."""
    kinds: list[dict] = [{"type": "stop", "node": n} for n in NODES]
    # each node frozen at a phase of its own: P as it starts writing, D as its pull goes out
    kinds += [{"type": "stop", "node": n, "upon": {"phase": ph, "offset": 0.0, "within": PHASE_WITHIN[0]}}
              for n, ph in zip(NODES, ("p_write_started", "d_pull_out"))]
    kinds += [{"type": "fake_prefill_peer", "mode": m, "count": 1} for m in FAKE_MODES]
    for kind in dict.fromkeys(KINDS):
        if kind not in ("stop", "fake_prefill_peer"):
            kinds.append(_fault(rng, kind))
    rng.shuffle(kinds)
    # each port fault on P's side channel (where D's pulls go; issue 43, 7a), both ways
    later = [_fault(rng, k) for k in TOXICS] + [_fault(rng, k) for k in NETNS if k not in PORT_FAULTS]
    later += [{"type": k, "port": "side_channel", "direction": "both"} for k in PORT_FAULTS]
    out = []
    for f in kinds + later:
        concurrency = rng.choice([1, 2, 4])
        rate = min(4.0, concurrency * rng.choice([0.5, 1.0]))
        duration = 16.0
        length = _window(f, 6.0, rate)  # room for a pause (render) while the fault acts
        at = round(rng.uniform(0.5, duration - (concurrency / rate + HEAL_S + 1.0) - length), 1)
        if f.get("upon"):  # keyed: armed early, its window may start up to `within` later (no pause in it)
            length, at = 4.0, 1.0
        out.append({"workload": {"duration": duration, "concurrency": concurrency, "rate": rate,
                                 "request_timeout": 30.0},
                    "faults": [{**f, "at": at, "for": length}], "topology": {"link": _link_of([f])}})
    # on the plain link too (warm nodes): P and D frozen at once, a shared-prefix mix
    out[len(kinds):len(kinds)] = [_overlap_schedule(rng), _prefix_schedule(rng)]
    out.insert(min(3, len(out)), _eos_schedule(rng))  # early: it runs on the warm pair too
    out.append(_slow_write_schedule(rng))  # D frozen inside P's write: a namespace pair of its own
    out += [_store_schedule(rng, kind) for kind in ("stop", "kill")]  # the KV pool's: a cold start each
    for node in NODES:
        out.append(_kill_schedule(rng, node))
    return out


def _eos_schedule(rng: random.Random) -> dict:
    """The EOS prompt first, one proxy hook late in the run (a failure the EOS prompt causes comes
    before any fault's window and is explained by none)."""
    concurrency = rng.choice([1, 2])
    rate, duration, length = float(concurrency), 16.0, 6.0
    at = round(duration - (concurrency / rate + HEAL_S + 1.0) - length, 1)
    schedule = {"workload": {"duration": duration, "concurrency": concurrency, "rate": rate, "request_timeout": 30.0},
                "faults": [{**_fault(rng, "abort_after_prefill"), "at": at, "for": length}], "topology": {"link": "direct"}}
    _eos_mix(schedule)
    return schedule


def _overlap_schedule(rng: random.Random) -> dict:
    """P and D frozen at once: D's freeze starts inside P's and outlasts it."""
    at = round(rng.uniform(1.0, 3.0), 1)
    return {"workload": {"duration": 18.0, "concurrency": 2, "rate": 2.0, "request_timeout": 30.0},
            "faults": [{"type": "stop", "node": "prefill:0", "at": at, "for": 4.0},
                       {"type": "stop", "node": "decode:0", "at": round(at + 2.0, 1), "for": 4.0}],
            "topology": {"link": "direct"}}


def _slow_write_schedule(rng: random.Random) -> dict:
    """D frozen while P's write into it is in flight: P and D in two namespaces, what P sends held to
    a rate at which a request's KV takes long to write, and D stopped a little after P's write
    starts (keyed on p_write_started). Over loopback a tiny model's write takes a millisecond or
    two, and a freeze keyed on it lands after it (pd-kill-prefill-at-write measured 2-6 ms); the
    held link makes the write outlast the keyed fault's reaction (scenarios/pd/stop-decode-mid-write,
    where on real pods the hardened P spun 1.04 of a core in Mooncake's sync write)."""
    return {"workload": {"duration": 24.0, "concurrency": 1, "rate": 0.5, "request_timeout": 40.0},
            "faults": [{"type": "bandwidth_limit", "rate_kbit": 512, "direction": "server->client",
                        "at": 0.5, "for": 13.5},
                       {"type": "stop", "node": "decode:0", "at": 1.0, "for": float(rng.choice([4, 6, 8])),
                        "upon": {"phase": "p_write_started", "offset": rng.choice([0.05, 0.1, 0.2]),
                                 "within": PHASE_WITHIN[0]}}],
            "topology": {"link": "netns"}}


def _prefix_schedule(rng: random.Random) -> dict:
    """A shared-prefix mix of 400-token prompts under a freeze of P."""
    return {"workload": {"duration": 16.0, "concurrency": 4, "rate": 4.0, "request_timeout": 30.0,
                         "prompt_tokens": 400, "output_tokens": 16, **_prefix_mix(rng, 400)},
            "faults": [{"type": "stop", "node": "prefill:0", "at": round(rng.uniform(1.0, 4.0), 1), "for": 6.0}],
            "topology": {"link": "direct"}}


def _store_schedule(rng: random.Random, kind: str | None = None) -> dict:
    """P and D through a KV pool: the store master frozen or killed (restarted empty at heal; the
    first fault), maybe a freeze of P or D inside its window, maybe a proxy hook the store proxy
    takes. Never keyed on a phase (the phase journal wraps vLLM's Mooncake connector, not the store
    connector)."""
    concurrency = rng.choice([1, 2])
    rate = concurrency * rng.choice([0.5, 1.0])
    duration = float(rng.choice([16, 18, 20]))
    workload = {"duration": duration, "concurrency": concurrency, "rate": rate, "request_timeout": 30.0,
                # 200 or 400 tokens, as scenarios/pd-store/ measured D loading from the pool: with 64-token
                # prompts a master freeze at concurrency 1 ended with D loading none (kv_transferred, 1 run)
                "prompt_tokens": rng.choice([200, 400]), "output_tokens": rng.choice([8, 16])}
    gap = concurrency / rate + HEAL_S + 1.0
    length = float(rng.choice([4, 6, 8]))
    master = {"type": kind or rng.choice(("stop", "stop", "kill")), "node": STORE,
              "at": round(rng.uniform(0.5, duration - gap - length), 1), "for": length}
    faults = [master]
    if kind is None and rng.random() < 0.5:
        _add_overlapping(rng, faults, master, duration, gap, concurrency / rate)
    if kind is None and rng.random() < 0.3:
        f = _fault(rng, rng.choice(STORE_KINDS), concurrency)
        f["for"] = float(rng.choice([2, 3, 4]))
        latest = duration - gap - f["for"]
        if latest >= 0.5:
            f["at"] = round(rng.uniform(0.5, latest), 1)
            if not _clashes(f, faults) and _recovery_ok(faults + [f], duration, concurrency / rate):
                faults.append(f)
    faults.sort(key=lambda f: f["at"])
    return {"workload": workload, "faults": faults, "topology": _topology_of(faults)}


def _add_overlapping(rng: random.Random, faults: list[dict], first: dict, duration: float, gap: float,
                     need: float) -> bool:
    """A freeze of another node (never ``first``'s) that starts inside ``first``'s window: two
    faults overlapping on different nodes. Added when it fits (no clash, recovery after it)."""
    nodes = [n for n in NODES if n != first.get("node")]
    length = float(rng.choice([2, 3, 4]))
    at = round(first["at"] + rng.uniform(0.2, max(0.2, first["for"] - 0.5)), 1)
    if at + length > duration - gap:
        return False
    f = {"type": "stop", "node": rng.choice(nodes), "at": at, "for": length}
    if _clashes(f, faults) or not _recovery_ok(faults + [f], duration, need):
        return False
    faults.append(f)
    return True


def _kill_schedule(rng: random.Random, node: str) -> dict:
    return {"workload": {"duration": 50.0, "concurrency": rng.choice([1, 2]), "rate": 0.5, "request_timeout": 30.0},
            "faults": [{"type": "kill", "node": node, "at": round(rng.uniform(2.0, 6.0), 1),
                        "for": float(rng.choice([1, 3]))}],
            "topology": {"link": "direct", "engine_id": rng.choice(["random", "fixed"])}}


def signature(schedule: dict) -> str:
    """The fault kinds of a schedule (a stop or kill names its node, a fake peer its mode, a
    network fault its direction, a port fault its port too; a shared-prefix mix is named): two findings with the same kinds and failing checks are one
    defect until shown otherwise."""
    parts = []
    for f in schedule["faults"]:
        extra = f.get("node") or f.get("mode") or f.get("direction") or f.get("stream")
        if f.get("port"):  # a port fault: which port of P, and which way
            extra = f"{f['port']},{f['direction']}"
        if f.get("upon"):  # the same fault at a phase is another interleaving
            extra = f"{extra}@{f['upon']['phase']}"
        parts.append(f"{f['type']}({extra})" if extra else f["type"])
    if (schedule.get("workload") or {}).get("shared_prefix_tokens"):  # the same faults over another mix
        parts.append("shared_prefix")
    if (schedule.get("workload") or {}).get("lead_prompts"):  # an EOS prompt first
        parts.append("eos_first")
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
    if rng.random() < STORE_SHARE:
        return _store_schedule(rng)
    link = rng.choice(LINKS)
    concurrency = rng.choice([1, 2, 4, 8])
    rate = min(4.0, concurrency * rng.choice([0.5, 1.0]))
    duration = float(rng.choice([14, 16, 18, 20]))
    workload = {"duration": duration, "concurrency": concurrency, "rate": rate, "request_timeout": 30.0,
                "prompt_tokens": rng.choice([64, 200, 200, 400]), "output_tokens": rng.choice([8, 16, 16, 32])}
    if rng.random() < PREFIX_SHARE:
        workload.update(_prefix_mix(rng, workload["prompt_tokens"]))
    gap = concurrency / rate + HEAL_S + 1.0  # recovery: every worker's first op after the last heal
    kinds = tuple(k for k in KINDS if link != "netns" or k not in NOT_ON_NETNS) + LINK_KINDS[link] * 2
    overlap = rng.random() < OVERLAP_SHARE
    faults: list[dict] = []
    for n in range(rng.choice([1, 1, 2, 2, 3])):
        if overlap and len(faults) == 1 and not faults[0].get("upon"):
            overlap = False
            if _add_overlapping(rng, faults, faults[0], duration, gap, concurrency / rate):
                continue
        # the link's own kinds first: a schedule on a toxiproxy or netns link has at least one of them
        kind = rng.choice(LINK_KINDS[link]) if n == 0 and LINK_KINDS[link] else rng.choice(kinds)
        if kind == "side_channel_garbage" and any(f["type"] == kind for f in faults):
            continue
        f = _fault(rng, kind, concurrency)
        length = float(rng.choice([4, 6] if not faults else [2, 3, 4, 6]))  # the first holds a pause
        length = _window(f, length, rate)  # a silent peer outlasts the load deadline; a hook holds a pause
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
    if overlap and len(faults) == 1 and not faults[0].get("upon"):  # a one-fault schedule drawn to overlap
        _add_overlapping(rng, faults, faults[0], duration, gap, concurrency / rate)
    faults.sort(key=lambda f: f["at"])
    schedule = {"workload": workload, "faults": faults, "topology": _topology_of(faults)}
    if rng.random() < EOS_SHARE:
        _eos_mix(schedule)
    return schedule


def _eos_mix(schedule: dict) -> bool:
    """The EOS prompt sent first (answered before any fault starts, a trigger says it was): when no
    shared prefix changes the prompts and every fault starts at 1.5 s or later."""
    w = schedule["workload"]
    if w.get("shared_prefix_tokens") or any(f["at"] < 1.5 or f.get("upon") for f in schedule["faults"]):
        return False
    if w["duration"] * w["rate"] / w["concurrency"] <= EOS_PROMPT:  # prompt 12 exists, also at concurrency 1
        return False
    w["prompt_tokens"] = 200
    w["lead_prompts"] = [EOS_PROMPT]
    schedule["prompt_seed"] = EOS_SEED
    return True


DURATIONS = ("at", "for", "after", "seconds", "latency", "jitter", "delay", "timeout")  # written as durations


def _dur(v: float) -> str:
    v = float(v)
    if 0 < v < 0.001:
        return f"{round(v * 1_000_000):d}us"
    return f"{round(v * 1000):d}ms"


def _upon(upon: dict) -> dict:
    return {"phase": upon["phase"], "offset": _dur(upon["offset"]), "within": _dur(upon["within"])}


PAUSES = (5.5, 3.5)  # the pause's length, the longest that fits first


def _pause(faults: list[dict], duration: float, rate: float) -> tuple[float, float] | None:
    """(start, length) of the workload's pause: inside the first fault window of at least 4 s that
    no phase keys, 0.5 s after it starts, or, for a proxy hook, once its first request has come
    (:func:`_lead`: a hook acts on the next requests; from 0.5 s it caught the first request after
    the pause, or none, and a silent peer's one request came 1.4 s before the heal ended its wait).
    5.5 s for a fake peer where the window holds it: a request it caught may take D's load deadline
    (2 s) to fail, and the nodes' samples need a quiet stretch after it (measured: a 3.5 s pause at
    concurrency 4, a request failing at 2.0 s into it, left no quiet interval to judge:
    TrustFinish's killing run not judged); never a pause that holds another fault's whole window
    (no request would be in flight in it), comes before another hook's first request or while a
    fault keyed on a phase waits for it (no request would make the phase come)."""
    for f in faults:
        if f.get("upon") or f["for"] < 4.0:
            continue
        # the long pause only where a request the fault catches as it starts waits for D's deadline (a fake
        # peer; its first request has come before the pause, the lead); a proxy hook acts on the requests
        # that come in its window: a long pause leaves it few (measured: abort_after_prefill under a 5.5 s
        # pause from 0.5 s, no effect in 2 of 2 runs)
        hook = f["type"] in PROXY_FAULTS
        long_ok = f["type"] == "fake_prefill_peer"
        lead = _lead(rate) if hook else 0.5
        # a fake peer's pause: as long as its window holds after the lead, up to 5.5 s (a peer answering for
        # nobody at 4 requests/s: lead 0.75 s, 5.25 s left of a 6 s window; a fixed 5.5 s fell back to 3.5)
        room = round(min(f["at"] + f["for"], duration) - f["at"] - lead, 2)
        for length in ([min(PAUSES[0], room)] if long_ok and room >= PAUSES[1] else []) + list(PAUSES[1:]):
            start, stop = f["at"] + lead, f["at"] + lead + length
            if stop > f["at"] + f["for"] + 1e-6 or stop > duration + 1e-6:
                continue
            if any(g is not f and start <= g["at"] and end(g) <= stop for g in faults):
                continue
            if any(g is not f and g["type"] in PROXY_FAULTS and start < g["at"] + _lead(rate) and g["at"] < stop
                   for g in faults):
                continue  # another hook's first request would come only after the pause
            if any(g.get("upon") and start < g["at"] + g["upon"]["within"] and g["at"] < stop for g in faults):
                continue  # a keyed fault waits for its phase then: a pause would starve it of requests
            return start, length
    return None


def render(schedule: dict, name: str, target: str, seed: int) -> dict[str, Any]:
    w = dict(schedule["workload"])
    faults = [dict(f) for f in schedule["faults"]]
    topology = dict(schedule.get("topology") or {})
    if topology.get("link") == "direct":
        del topology["link"]
    killed = any(f["type"] == "kill" and f.get("node") != STORE for f in faults)  # a vLLM node's cold start
    pool = bool(topology.get("kv_pool"))
    # 3.5 s with no request starting: room for two of the nodes' samples with nothing in flight
    # after the last requests end (1.5 s left 10 of 38 drawn runs at concurrency 4-8 without a
    # quiet interval to judge; 2.5 s one of 11 at concurrency 2: a silent peer's request failing at
    # its 2 s deadline inside the pause, then a node's 1.5 s tail; the suite's pauses are 3.5 s too)
    # (never in a keyed window: requests paused would keep its phase from coming)
    deadline = 15.0 if topology.get("link") == "netns" else 10.0
    # the client waits 3 s past bounded_return's bound (deadline + 2 s tolerance), not 30 s: a request
    # past the bound fails that check either way, and a stall run is the explorer's longest (measured:
    # NoParamsCheck's stall ran 50 s of journal, its ops to 33 s, then a cold start: re-proving 3 of 3
    # and the file's re-run did not fit in 10 minutes)
    w["request_timeout"] = min(float(w["request_timeout"]), deadline + 2.0 + 3.0)
    pause = None if killed else _pause(faults, w["duration"], w["rate"])
    if pause is not None:
        w["pauses"] = [{"at": _dur(pause[0]), "for": _dur(pause[1])}]
    doc: dict[str, Any] = {
        "name": name, "family": "pd",
        "description": f"drawn by pdchaos explore (seed {seed})",
        "seed": schedule.get("prompt_seed", seed), "deadline": _dur(deadline), "tolerance": "2s",
        "cap": "500s" if killed else "600s" if pool else "300s",  # a KV pool: P, D and the master start cold
        "targets": [target],
    }
    if topology:
        doc["topology"] = topology
    doc.update({
        "workload": {k: (f"{v:g}s" if k in ("duration", "request_timeout") else v) for k, v in w.items()},
        "faults": [{**{k: (_dur(v) if k in DURATIONS else _upon(v) if k == "upon" else v) for k, v in f.items()}}
                   for f in faults],
        "triggers": [{"type": "ops_in_window", "fault": i} for i in range(len(faults))]
        + [{"type": "phase_keyed", "fault": i} for i, f in enumerate(faults) if f.get("upon")]
        + [{"type": "prompt_answered", "index": i, "expect": ""} for i in w.get("lead_prompts") or ()],
        "expect": {target: "pass"},
    })
    checks: dict[str, Any] = {}
    if pause is None:  # no window holds a pause: no quiet interval to judge busy waiting in
        checks["no_busy_wait"] = {"enabled": False}
    if killed:  # the restart's length is the machine's (30 s-2 min): not a bound on the connector
        checks["recovery"] = {"enabled": False}
    frozen_d = [f["for"] for f in faults if f["type"] == "stop" and f.get("node") == "decode:0"]
    if frozen_d:
        # a frozen D fails nothing while it is frozen: a load whose deadline passed in the freeze fails at
        # the thaw, up to the freeze + the deadline (2 s) + the margin (2 s) after its request started
        # (measured: D frozen 4 s at d_pull_out, the request failed at 4.02-4.03 s, past the generic 4 s
        # bound, 3 of 3 runs, on the hardened connector as on each mutant; as scenarios/pd/stop-decode*)
        checks["fail_fast"] = {"fail_within": {target: _dur(max(frozen_d) + 4.0)}}
    elif len(faults) == 1 and faults[0]["type"] == "fake_prefill_peer" and faults[0].get("mode") == "unknown":
        # guarantee 1's unanswered rule: P's FINISH that names none of the asked requests fails them at
        # once (502 in ~0.1 s), not at the 2 s load deadline; as scenarios/pd/fake-prefill-unknown-reqs
        checks["fail_fast"] = {"fail_within": {"hardened": "1s"}}
    if pool:  # each node's store client opens new connections to a master that froze or restarted
        checks["no_leaks"] = {"slack": 10}  # (+5 to +8 descriptors measured: scenarios/pd-store/)
    if checks:
        doc["checks"] = checks
    return doc
