"""Synthetic run folders with known numbers (journals written with nodekit.journal from made-up
histories, summary.json, bench samples): the reports' input in tests/reports/ and the workflows'
in tests/harness/test_workflows.py."""

from __future__ import annotations

import json
import random
from pathlib import Path

from harness import verdicts as V
from nodekit.journal import write_journal

# ------------------------------------------------------------------ a synthetic run folder
T0 = 1000.0
DEADLINE_MS = 200.0
TOLERANCE_MS = 50.0


def _meta(scenario: str, target: str, expect: str, faults: list[dict], cap_s: float = 8.0,
          targets: tuple[str, ...] = ("hardened", "legacy"), baseline: str | None = "legacy") -> dict:
    return {"type": "meta", "scenario": scenario, "file": f"{scenario}.yaml", "family": "lookup", "target": target,
            "deadline_ms": DEADLINE_MS, "tolerance_ms": TOLERANCE_MS, "seed": 7, "t0": T0,
            "wall_start": "2026-01-01T00:00:00+00:00", "cap_s": cap_s, "checks": {"bounded_return": {}},
            "expect": expect, "targets": list(targets), "baseline_target": baseline,
            "topology": {"transport": "ipc"}, "faults": faults}


def scenario_journal(scenario: str, target: str, *, duration: float = 6.0, rate: float = 40.0,
                     scale: float = 1.0, seed: int = 1, **layout) -> list[dict]:
    """One closed-loop worker issuing lookups every 1/rate s (or as soon as the previous returns).

    scenario: "slow-peer" (a 500 ms peer from 2 s to 4 s), "silent-server" (from 3 s the server never
    replies: hardened fails open at the deadline, legacy hangs until the runner's cap), "bad-reply"
    (from 1.5 s to 2.5 s the reply is 5 bytes: hardened fails open, legacy raises), "normal".
    ``scale`` multiplies every normal-path latency (to fake a regression).
    """
    rng = random.Random(f"{scenario}/{target}/{seed}")
    faults = {"slow-peer": [("slow_peer", 2.0, 4.0, {"delay": "500ms"})],
              "silent-server": [("silent_server", 3.0, 5.0, {})],
              "bad-reply": [("malformed_reply", 1.5, 2.5, {"kind": "five_bytes"})],
              "normal": []}[scenario]
    recs: list[dict] = [_meta(scenario, target, "pass", [{"name": n, "at": a} for n, a, _, _ in faults], **layout)]
    in_fault = lambda x: next((f for f in faults if f[1] <= x < f[2]), None)  # noqa: E731
    events: list[tuple[float, dict]] = []
    for fid, (name, a, b, params) in enumerate(faults):
        events.append((T0 + a, {"type": "fault", "id": fid, "name": name, "phase": "start", "params": params}))
    x, op_id, stalled_at = 0.0, 0, None
    cap = 8.0
    while x < duration:
        f = in_fault(x)
        lat = rng.lognormvariate(-1.2, 0.35) * scale  # ~0.3 ms normal path
        phase, outcome, value, code = "ok", "ok", 64, ""
        if f and f[0] == "slow_peer":
            if target == "hardened":
                lat, phase, outcome, value, code = DEADLINE_MS + rng.uniform(0.2, 3), "fail", "timeout", 0, "TIMEOUT"
            else:
                lat = 500.0 + rng.uniform(0.2, 3)
        elif f and f[0] == "silent_server":
            if target == "hardened":
                lat, phase, outcome, value, code = DEADLINE_MS + rng.uniform(0.2, 3), "fail", "timeout", 0, "TIMEOUT"
            else:
                stalled_at = x
        elif f and f[0] == "malformed_reply":
            if target == "hardened":
                lat, phase, outcome, value, code = rng.uniform(0.3, 0.8), "fail", "protocol", 0, "BAD_REPLY"
            else:
                lat, phase, outcome, value, code = rng.uniform(0.3, 0.8), "info", "raised", None, "OverflowError"
        kind = rng.choice(["full", "partial", "miss"])
        events.append((T0 + x, {"type": "op", "id": op_id, "process": 0, "f": "lookup", "phase": "invoke",
                                "kind": kind, "token_len": 128, "hashes": 8, "groups": [0], "expected": 64}))
        if stalled_at is not None:
            # The legacy client never returns; the runner gives up at the cap and records it.
            events.append((T0 + cap, {"type": "op", "id": op_id, "process": 0, "f": "lookup", "phase": "info",
                                      "value": None, "outcome": "stalled", "code": "", "elapsed_ms": None}))
            break
        done = x + lat / 1000.0
        events.append((T0 + done, {"type": "op", "id": op_id, "process": 0, "f": "lookup", "phase": phase,
                                   "value": value, "outcome": outcome, "code": code, "elapsed_ms": round(lat, 3)}))
        op_id += 1
        x = max(x + 1.0 / rate, done)
    end_t = T0 + (cap if stalled_at is not None else max(duration, x))
    for fid, (name, a, b, params) in enumerate(faults):
        stop_t, healed = (T0 + b, "schedule") if T0 + b <= end_t else (end_t, "teardown")
        events.append((stop_t, {"type": "fault", "id": fid, "name": name, "phase": "stop", "params": params,
                                "healed_by": healed}))
    events.sort(key=lambda e: e[0])
    for t, r in events:
        r["t"] = round(t, 6)
        recs.append(r)
    recs.append({"type": "end", "t": round(end_t, 6), "reason": "cap" if stalled_at is not None else "done",
                 "stalled": 1 if stalled_at is not None else 0})
    return recs


# (verdict, expectation as the runner writes it: the verdict and the exact set of failing checks)
EXPECT = {("slow-peer", "hardened"): ("pass", "pass"), ("slow-peer", "legacy"): ("fail", "fail[bounded_return]"),
          ("silent-server", "hardened"): ("pass", "pass"),
          ("silent-server", "legacy"): ("stall", "stall[bounded_return,no_stall]"),
          ("bad-reply", "hardened"): ("pass", "pass"), ("bad-reply", "legacy"): ("fail", "pass"),
          ("normal", "hardened"): ("pass", "pass"), ("normal", "legacy"): ("pass", "pass")}


def make_run(root: Path, *, scenarios=("slow-peer", "silent-server", "bad-reply", "normal"), scale: float = 1.0,
             bench: bool = True, run_id: str = "synthetic") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    results = []
    for s in scenarios:
        for t in ("hardened", "legacy"):
            write_journal(root / s / t / "journal.jsonl", scenario_journal(s, t, scale=scale))
            verdict, expected = EXPECT[(s, t)]
            slow = t == "legacy" and s in ("slow-peer", "silent-server")
            checks = [{"name": "bounded_return", "ok": not slow,
                       "message": "op 81 took 503 ms > 250 ms" if slow else "all ops within 250 ms"},
                      {"name": "fail_open", "ok": not (s == "bad-reply" and t == "legacy"),
                       "message": "op 60 raised OverflowError" if (s == "bad-reply" and t == "legacy") else "ok"},
                      {"name": "metrics_match", "ok": None, "message": "not applicable to the legacy target"}]
            if verdict == "stall":
                checks.append({"name": "no_stall", "ok": False, "message": "op 81 never returned"})
            failing = sorted(c["name"] for c in checks if c["ok"] is False)
            outcome = V.outcome(verdict, expected, failing)
            results.append({"scenario": s, "file": f"scenarios/lookup/{s}.yaml", "target": t, "dir": f"{s}/{t}",
                            "verdict": verdict, "expected": expected, "failing": failing,
                            "as_expected": outcome == "as_expected",
                            "reason": "" if outcome == "as_expected" else "fail_open violated: op 60 raised",
                            "checks": checks})
    (root / "summary.json").write_text(json.dumps(
        {"run_id": run_id, "started": "2026-01-01T00:00:00+00:00", "elapsed_s": 42.5, "results": results}, indent=1))
    if bench:
        rng = random.Random(3)
        (root / "bench_samples.json").write_text(json.dumps({
            "legacy": [round(rng.lognormvariate(4.8, 0.25) * scale, 2) for _ in range(2000)],
            "hardened": [round(rng.lognormvariate(4.9, 0.28) * scale, 2) for _ in range(2000)]}))
    return root
