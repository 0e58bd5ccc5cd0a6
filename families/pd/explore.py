"""The pd family's generator for ``pdchaos explore`` (harness/explore.py): seeded schedules of
several faults (overlapping windows, either node), concurrency 1-8, over the real P/D pair.

What is drawn, and what never is:

- process faults on either node (``stop``: SIGSTOP/SIGCONT) may overlap anything;
- the faults that act through the P/D proxy (its phase hooks, the fake prefill peer's redirect,
  ``bad_transfer_params``) never overlap one another: each one's heal clears the proxy's hooks, so
  an overlap would leave one window without its effect (a harness error, not a finding);
- ``side_channel_garbage`` at most once (an upstream P's listener it kills stays dead);
- no fault that needs Toxiproxy, network namespaces or root (the default topology has none), and
  no ``kill``/``node_down`` (a restart of a vLLM node is a 30 s cold start: the long set's job).

Every window leaves every worker time for its first op after the heal (``recovery``); the first
window of 3.5 s or more holds a 2.5 s workload pause, so that ``no_busy_wait`` sees a quiet interval;
each fault is a trigger (``ops_in_window``): a window no request crossed is a harness error, never
a pass.
"""

from __future__ import annotations

import random
from typing import Any

MIN_WINDOW_S = 2.0
PROXY_FAULTS = ("abort_after_prefill", "abort_while_decode_waits", "hold_after_prefill", "bad_transfer_params",
                "fake_prefill_peer")
FAKE_MODES = ("garbage", "error", "unknown", "other", "silent", "bootstrap_500", "unknown_engine")
HEAL_S = 2.0  # the slowest heal here (the fake prefill peer's stop)


def _fault(rng: random.Random, kind: str) -> dict:
    if kind == "stop":
        return {"type": "stop", "node": rng.choice(["prefill:0", "decode:0"])}
    if kind == "fake_prefill_peer":
        return {"type": kind, "mode": rng.choice(FAKE_MODES), "count": rng.choice([1, 2])}
    if kind == "abort_while_decode_waits":
        return {"type": kind, "count": rng.randint(1, 5), "after": rng.choice([0.025, 0.05, 0.1])}
    if kind == "abort_after_prefill":
        return {"type": kind, "count": rng.randint(1, 3)}
    if kind == "hold_after_prefill":
        return {"type": kind, "count": 1, "seconds": 2.0}
    if kind == "bad_transfer_params":
        return {"type": kind, "count": 1}
    if kind == "side_channel_garbage":
        return {"type": kind, "frames": rng.randint(2, 3)}
    raise ValueError(kind)


KINDS = ("stop", "stop", "fake_prefill_peer", "abort_while_decode_waits", "abort_after_prefill",
         "hold_after_prefill", "bad_transfer_params", "side_channel_garbage")


def cover(rng: random.Random) -> list[dict]:
    """Each fault kind alone once (each fake-peer mode and each node's stop count as a kind), in a
    seeded order, before explore's random combinations: every kind is tried in any budget that
    runs this many schedules."""
    kinds: list[dict] = [{"type": "stop", "node": n} for n in ("prefill:0", "decode:0")]
    kinds += [{"type": "fake_prefill_peer", "mode": m, "count": 1} for m in FAKE_MODES]
    for kind in dict.fromkeys(KINDS):
        if kind not in ("stop", "fake_prefill_peer"):
            kinds.append(_fault(rng, kind))
    rng.shuffle(kinds)
    out = []
    for f in kinds:
        concurrency = rng.choice([1, 2, 4])
        rate = min(4.0, concurrency * rng.choice([0.5, 1.0]))
        duration = 16.0
        length = 6.0  # room for a pause (render) while the fault acts
        at = round(rng.uniform(0.5, duration - (concurrency / rate + HEAL_S + 1.0) - length), 1)
        out.append({"workload": {"duration": duration, "concurrency": concurrency, "rate": rate,
                                 "request_timeout": 30.0},
                    "faults": [{**f, "at": at, "for": length}]})
    return out


def signature(schedule: dict) -> str:
    """The fault kinds of a schedule (a stop names its node, a fake peer its mode): two findings
    with the same kinds and failing checks are one defect until shown otherwise."""
    parts = []
    for f in schedule["faults"]:
        extra = f.get("node") or f.get("mode")
        parts.append(f"{f['type']}({extra})" if extra else f["type"])
    return "+".join(sorted(parts))


def draw(rng: random.Random) -> dict:
    concurrency = rng.choice([1, 2, 4, 8])
    rate = min(4.0, concurrency * rng.choice([0.5, 1.0]))
    duration = float(rng.choice([14, 16, 18, 20]))
    gap = concurrency / rate + HEAL_S + 1.0  # recovery: every worker's first op after the last heal
    faults: list[dict] = []
    for _ in range(rng.choice([1, 1, 2, 2, 3])):
        kind = rng.choice(KINDS)
        if kind == "side_channel_garbage" and any(f["type"] == kind for f in faults):
            continue
        f = _fault(rng, kind)
        length = float(rng.choice([4, 6] if not faults else [2, 3, 4, 6]))  # the first holds a pause
        latest = duration - gap - length
        if latest < 0.5:
            continue
        f["at"], f["for"] = round(rng.uniform(0.5, latest), 1), length
        if f["type"] in PROXY_FAULTS and any(
                g["type"] in PROXY_FAULTS and f["at"] < g["at"] + g["for"] and g["at"] < f["at"] + f["for"]
                for g in faults):
            continue
        faults.append(f)
    if not faults:  # one stop of either node, early: every schedule has a fault
        faults.append({**_fault(rng, "stop"), "at": 1.0, "for": 3.0})
    faults.sort(key=lambda f: f["at"])
    return {"workload": {"duration": duration, "concurrency": concurrency, "rate": rate, "request_timeout": 30.0},
            "faults": faults}


DURATIONS = ("at", "for", "after", "seconds")  # fault fields written as durations


def _dur(v: float) -> str:
    return f"{round(float(v) * 1000):d}ms"


def render(schedule: dict, name: str, target: str, seed: int) -> dict[str, Any]:
    w = dict(schedule["workload"])
    faults = [dict(f) for f in schedule["faults"]]
    # 3.5 s with no request starting: room for two of the nodes' samples with nothing in flight
    # after the last requests end (1.5 s left 10 of 38 drawn runs at concurrency 4-8 without a
    # quiet interval to judge; 2.5 s one of 11 at concurrency 2: a silent peer's request failing at
    # its 2 s deadline inside the pause, then a node's 1.5 s tail; the suite's pauses are 3.5 s too)
    pause = next(({"at": _dur(f["at"] + 0.5), "for": "3500ms"} for f in faults if f["for"] >= 4.0), None)
    if pause is not None:
        w["pauses"] = [pause]
    doc: dict[str, Any] = {
        "name": name, "family": "pd",
        "description": f"drawn by pdchaos explore (seed {seed})",
        "seed": seed, "deadline": "10s", "tolerance": "2s", "cap": "300s",
        "targets": [target],
        "workload": {k: (f"{v:g}s" if k in ("duration", "request_timeout") else v) for k, v in w.items()},
        "faults": [{**{k: (_dur(v) if k in DURATIONS else v) for k, v in f.items()}} for f in faults],
        "triggers": [{"type": "ops_in_window", "fault": i} for i in range(len(faults))],
        "expect": {target: "pass"},
    }
    if pause is None:  # no window holds a pause: no quiet interval to judge busy waiting in
        doc["checks"] = {"no_busy_wait": {"enabled": False}}
    return doc
