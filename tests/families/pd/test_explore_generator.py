"""The pd family's generator for ``pdchaos explore`` (families/pd/explore.py), a property test:
whatever the seed, a drawn schedule renders to a scenario file the real schema and ``pdchaos
validate`` accept (its link fits its faults, every window leaves time for recovery), and it keeps
the generator's own rules (no two proxy faults at once, no two process faults on one node at once,
one toxic and one namespace fault at a time, a kill of a vLLM node alone, the store master's faults
on a KV pool, no loopback peer on a namespace link), and it draws every kind it has. No nodes run."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from families.pd import explore as E
from faults.base import parse_duration
from harness.explore import shrink_candidates, write_scenario
from harness.schema import load_scenario

pytestmark = pytest.mark.timeout(300)
SEEDS = st.integers(min_value=0, max_value=2**31 - 1)


def _overlap(a: dict, b: dict) -> bool:
    return a["at"] < b["at"] + b["for"] and b["at"] < a["at"] + a["for"]


def _latest(f: dict) -> float:  # a keyed fault may start as late as its arming + bound + offset
    u = f.get("upon")
    return f["at"] + f["for"] + (u["within"] + u["offset"] if u else 0.0)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=SEEDS)
def test_every_drawn_schedule_is_a_valid_scenario_file(tmp_path: Path, seed: int) -> None:
    s = E.draw(random.Random(seed))
    faults = s["faults"]
    assert 1 <= len(faults) <= 3
    link = s["topology"]["link"]
    kinds = {f["type"] for f in faults}
    assert link == ("toxiproxy" if kinds & set(E.TOXICS) else "netns" if kinds & set(E.NETNS) else "direct")
    pool = any(f.get("node") == E.STORE for f in faults)  # the store master's faults need the KV pool
    assert bool(s["topology"].get("kv_pool")) == pool
    if pool:  # the store proxy's hooks only, never keyed (no phase journal in the store connector)
        assert kinds <= {"stop", "kill"} | set(E.STORE_KINDS) and not any(f.get("upon") for f in faults), s
    if any(f["type"] == "kill" and f["node"] != E.STORE for f in faults):  # a vLLM node's kill: alone
        assert len(faults) == 1 and s["workload"]["duration"] >= 45
    if link == "netns":  # loopback peers a namespace cuts off
        assert not kinds & set(E.NOT_ON_NETNS), s
    for f in faults:
        if f["type"] in E.PORT_FAULTS:
            assert f["port"] in E.PORTS and f["direction"] in E.DIRECTIONS
    for i, a in enumerate(faults):
        for b in faults[i + 1:]:
            if a.get("upon") or b.get("upon"):  # a keyed window, from its arming to its latest end, is alone
                assert not (a["at"] < _latest(b) and b["at"] < _latest(a)), s
            if not _overlap(a, b):
                continue
            assert not (a["type"] in E.PROXY_FAULTS and b["type"] in E.PROXY_FAULTS), s
            assert not (a.get("node") and a.get("node") == b.get("node")), s  # one process fault per node
            assert not ({a["type"], b["type"]} <= set(E.TOXICS)) and not ({a["type"], b["type"]} <= set(E.NETNS)), s
    path = tmp_path / f"d{seed}.yaml"
    doc = E.render(s, f"drawn-{seed}", "hardened", seed)
    write_scenario(doc, path)
    sc = load_scenario(path)  # the real schema: raises (a UsageError naming what) when invalid
    # the client waits 3 s past bounded_return's bound, no longer (a stall run is the longest)
    assert sc.model.workload.request_timeout == sc.model.deadline + sc.model.tolerance + 3.0, s
    assert sc.model.topology.link == link
    # each window is a trigger; a keyed one also proves it started at its phase
    assert [t.fault for t in sc.model.triggers if t.type == "ops_in_window"] == list(range(len(faults)))
    assert [t.fault for t in sc.model.triggers if t.type == "phase_keyed"] == \
        [i for i, f in enumerate(faults) if f.get("upon")]
    assert [f.type for f in sc.faults] == [f["type"] for f in faults]
    assert bool(sc.model.topology.kv_pool) == pool
    w = s["workload"]  # a shared-prefix mix keeps words of each prompt's own
    assert sc.model.workload.shared_prefix_tokens == w.get("shared_prefix_tokens", 0)
    if w.get("shared_prefix_tokens"):
        assert 8 <= w["shared_prefix_tokens"] <= w["prompt_tokens"] - 8 and 1 <= w["prefix_groups"] <= 3
    for f, g in zip(sc.faults, faults):
        assert abs(f.at - g["at"]) < 1e-6 and abs(f.for_ - g["for"]) < 1e-6
        if g.get("upon"):  # only phases every target shows, only on freezes, never in a pause
            assert f.type == "stop" and f.upon.phase in E.PHASES and g["upon"]["phase"] in set(E.PHASES)
            assert abs(f.upon.within - g["upon"]["within"]) < 1e-6 and abs(f.upon.offset - g["upon"]["offset"]) < 1e-6
            for p in sc.model.workload.pauses:
                assert not (p.at < _latest(g) and g["at"] < p.at + p.for_), s
        else:
            assert f.upon is None
    # an EOS prompt first: the prompts of the seed whose prompt 12 answers EOS, a trigger proving it did
    eos = [(t.index, t.expect) for t in sc.model.triggers if t.type == "prompt_answered"]
    if w.get("lead_prompts"):
        assert eos == [(E.EOS_PROMPT, "")] and sc.model.seed == E.EOS_SEED and w["prompt_tokens"] == 200
        assert not w.get("shared_prefix_tokens") and all(f["at"] >= 1.5 for f in faults), s
    else:
        assert eos == [] and sc.model.seed == seed
    # a pause never holds another fault's whole window (no request would be in flight in it)
    for p in sc.model.workload.pauses:
        holders = [f for f in faults if f["at"] <= p.at and p.at + p.for_ <= f["at"] + f["for"] + 1e-6]
        assert holders, s
        assert not any(p.at <= f["at"] and _latest(f) <= p.at + p.for_ + 1e-6 for f in faults), s
    # guarantee 1's unanswered rule, claimed where a peer answering for nobody is the only fault
    within = ((doc.get("checks") or {}).get("fail_fast") or {}).get("fail_within")
    alone = len(faults) == 1 and faults[0]["type"] == "fake_prefill_peer" and faults[0]["mode"] == "unknown"
    frozen_d = [f["for"] for f in faults if f["type"] == "stop" and f.get("node") == "decode:0"]
    if frozen_d:  # a frozen D fails a load at the thaw: the freeze + deadline + margin
        assert within == {"hardened": f"{round((max(frozen_d) + 4.0) * 1000)}ms"}, (within, s)
    else:
        assert (within == {"hardened": "1s"}) == alone, (within, s)


def test_pauses_hold_a_request_failing_at_the_load_deadline() -> None:
    """For a fake peer the rest of its window after the lead, up to 5.5 s (a request it caught may
    take D's 2 s load deadline to fail, and the quiet interval comes after it), at least 3.5 s, as
    every other pause; none inside a keyed window.
    A proxy hook's pause starts once its first request has come (one pacing interval and 0.5 s after
    the hook is armed), any other fault's 0.5 s into its window."""
    plain = {"type": "fake_prefill_peer", "mode": "unknown", "count": 1}
    assert E._pause([{**plain, "at": 1.0, "for": 7.0}], 16.0, 2.0) == (2.0, 5.5)
    assert E._pause([{**plain, "at": 1.0, "for": 6.0}], 16.0, 2.0) == (2.0, 5.0)  # the rest of its window
    assert E._pause([{**plain, "at": 1.0, "for": 6.0}], 16.0, 1.0) == (2.5, 4.5)
    # a peer answering for nobody at 4 requests/s: lead 0.75 s, 5.25 s of its 6 s window left (a fixed
    # 5.5 s fell back to 3.5 s, and TrustFinish's killing run could not be judged: no quiet interval)
    assert E._pause([{**plain, "at": 0.7, "for": 6.0}], 16.0, 4.0) == (1.45, 5.25)
    assert E._pause([{**plain, "at": 1.0, "for": 6.0}], 16.0, 0.5) == (3.5, 3.5)  # ends with the window
    assert E._pause([{**plain, "at": 1.0, "for": 4.0}], 16.0, 4.0) is None  # no room after the first request
    hook = {"type": "abort_after_prefill", "count": 1, "at": 1.0, "for": 6.0}  # acts on requests in its window
    assert E._pause([hook], 16.0, 4.0) == (1.75, 3.5)
    freeze = {"type": "stop", "node": "prefill:0", "at": 1.0, "for": 6.0}  # what is in flight as it starts
    assert E._pause([freeze], 16.0, 0.5) == (1.5, 3.5)
    assert E._pause([{**plain, "at": 1.0, "for": 7.0}, {"type": "stop", "node": "decode:0", "at": 2.5, "for": 2.0}],
                    16.0, 2.0) is None  # the freeze's whole window would lie in either pause
    assert E._pause([{**plain, "at": 1.0, "for": 7.0}, {"type": "stop", "node": "decode:0", "at": 4.0, "for": 2.0}],
                    16.0, 2.0) == (2.0, 3.5)
    keyed = {"type": "stop", "node": "prefill:0", "at": 1.0, "for": 6.0,
             "upon": {"phase": "p_write_started", "offset": 0.0, "within": 2.0}}
    assert E._pause([keyed], 16.0, 4.0) is None


def _silent_holds(schedule: dict) -> list[str]:
    """What keeps a schedule's silent fake peers from holding a load past D's deadline: the
    interleaving nothing but that deadline ends (a peer that is up, answers heartbeats, takes the
    pull and never answers). The peer's stop at heal ends the wait, so its first request, which
    comes at the latest one pacing interval after the hook is armed, must wait past the load deadline
    and fail_fast's margin (2 + 2 s) before the heal; a pause in the window starts after it came."""
    w = schedule["workload"]
    gap = 1.0 / w["rate"]
    doc = E.render(schedule, "h", "hardened", 1)
    pauses = [(_s(p["at"]), _s(p["for"])) for p in doc["workload"].get("pauses") or ()]
    bad = []
    for f in schedule["faults"]:
        if f["type"] != "fake_prefill_peer" or f["mode"] != "silent":
            continue
        if f["at"] + f["for"] - (f["at"] + gap) < 4.0 + 1.5:
            bad.append(f"held {f['for'] - gap:.2f} s: {f}")
        for a, n in pauses:
            if f["at"] <= a < f["at"] + f["for"] and a < f["at"] + gap + 0.25:
                bad.append(f"pause at {a} before its first request: {f}")
    return bad


def _s(d: str) -> float:
    return float(d[:-2]) / 1000.0 if d.endswith("ms") else float(d[:-2]) / 1e6


def test_a_silent_peer_holds_its_load_past_the_deadline() -> None:
    """Every drawn silent peer (over 3000 seeds) and the covering round's one outlast D's load
    deadline by the margin: with the pause put first, its one request came 1.4 s before the heal
    and NoLoadDeadline's failure, at 1.68 s, passed fail_fast (600 s of exploration, not killed)."""
    drawn = [E.draw(random.Random(seed)) for seed in range(3000)]
    silent = [d for d in drawn if any(f.get("mode") == "silent" for f in d["faults"])]
    assert len(silent) >= 20, len(silent)  # the draw has them: not a test of nothing
    assert [b for d in silent for b in _silent_holds(d)] == []
    for seed in range(5):
        covering = [c for c in E.cover(random.Random(seed)) if any(f.get("mode") == "silent" for f in c["faults"])]
        assert len(covering) == 1 and _silent_holds(covering[0]) == [], covering
        assert E.render(covering[0], "c", "hardened", seed)["workload"].get("pauses"), covering  # judged quiet
    # the old draw fails the rule: a 6 s window at 1 request/s, its pause from 0.5 s
    old = {"workload": {"duration": 16.0, "concurrency": 2, "rate": 1.0, "request_timeout": 30.0},
           "faults": [{"type": "fake_prefill_peer", "mode": "silent", "count": 1, "at": 4.4, "for": 6.0}],
           "topology": {"link": "direct"}}
    assert _silent_holds(old)


def test_a_proxy_hooks_pause_comes_after_its_first_request() -> None:
    """A hook acts on the next requests: a pause from 0.5 s into its window left a rate-1 hook no
    request (a harness error, measured at b49f96a) or only the first one after the pause."""
    n = 0
    for seed in range(600):
        s = E.draw(random.Random(seed))
        doc = E.render(s, "p", "hardened", seed)
        for p in doc["workload"].get("pauses") or ():
            a = _s(p["at"])
            for f in s["faults"]:
                if f["type"] in E.PROXY_FAULTS and f["at"] <= a < f["at"] + f["for"]:
                    n += 1
                    assert a >= f["at"] + 1.0 / s["workload"]["rate"] + 0.25, (p, s)
    assert n >= 50, n


def test_the_wider_kinds_are_drawn() -> None:
    """Over 600 seeds: REJECT and DROP on each of P's ports, each way; the store master frozen and
    killed, alone and with a freeze of P or D inside its window; two faults overlapping on two
    different nodes; shared-prefix mixes; and an abort storm."""
    draws = [E.draw(random.Random(seed)) for seed in range(600)]
    faults = [f for d in draws for f in d["faults"]]
    ports = {(f["type"], f["port"]) for f in faults if f["type"] in E.PORT_FAULTS}
    assert ports == {(k, p) for k in E.PORT_FAULTS for p in set(E.PORTS)}
    assert {f["direction"] for f in faults if f["type"] in E.PORT_FAULTS} == set(E.DIRECTIONS)
    store = [d for d in draws if d["topology"].get("kv_pool")]
    assert 0.03 * len(draws) <= len(store) <= 0.15 * len(draws)
    assert {f["type"] for d in store for f in d["faults"] if f["node" if "node" in f else "type"] == E.STORE} == \
        {"stop", "kill"}
    assert {f.get("node") for d in store for f in d["faults"]} >= {E.STORE, *E.NODES}

    def on_two_nodes(d: dict) -> bool:
        fs = d["faults"]
        return any(_overlap(a, b) and a.get("node") and b.get("node") and a["node"] != b["node"]
                   for i, a in enumerate(fs) for b in fs[i + 1:])

    both = [d for d in draws if on_two_nodes(d)]
    assert len(both) >= 0.03 * len(draws)
    assert {frozenset(f["node"] for f in d["faults"] if f.get("node")) for d in both} >= \
        {frozenset(E.NODES), frozenset({E.STORE, "prefill:0"}), frozenset({E.STORE, "decode:0"})}
    mixes = [d["workload"] for d in draws if d["workload"].get("shared_prefix_tokens")]
    assert 0.1 * len(draws) <= len(mixes) <= 0.4 * len(draws)
    assert {w["prefix_groups"] for w in mixes} == {1, 2, 3}
    assert any(f["type"] == "abort_while_decode_waits" and f["count"] >= 8 for f in faults)  # a storm


def test_some_drawn_freezes_are_keyed_on_phases() -> None:
    draws = [E.draw(random.Random(seed)) for seed in range(600)]
    faults = [f for d in draws for f in d["faults"]]
    keyed = [f for f in faults if f.get("upon")]
    # the freezes a phase could key: on P or D, not on a KV pool (a freeze drawn inside another
    # fault's window, on another node, is never keyed either: about half of these)
    stops = [f for d in draws if not d["topology"].get("kv_pool") for f in d["faults"] if f["type"] == "stop"]
    assert 0.05 * len(stops) <= len(keyed) <= 0.6 * len(stops), (len(keyed), len(stops))
    assert {f["upon"]["phase"] for f in keyed} == set(E.PHASES)
    assert {f["node"] for f in keyed} == set(E.NODES)
    assert E.signature({"faults": keyed[:1]}) == f"stop({keyed[0]['node']}@{keyed[0]['upon']['phase']})"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=SEEDS)
def test_shrinking_a_drawn_schedule_keeps_its_link(tmp_path: Path, seed: int) -> None:
    """A shrink step keeps the schedule's topology (a toxic dropped leaves the Toxiproxy link, which
    is valid), so the steps validate or are refused only for recovery time, never for the link."""
    s = E.draw(random.Random(seed))
    for i, (_, cand) in enumerate(shrink_candidates(s, E.MIN_WINDOW_S)):
        assert cand["topology"] == s["topology"]
        path = tmp_path / f"k{seed}-{i}.yaml"
        write_scenario(E.render(cand, f"k-{seed}-{i}", "hardened", seed), path)
        try:
            load_scenario(path)
        except Exception as exc:  # noqa: BLE001
            assert "recovery:" in str(exc), exc


def test_the_covering_round_has_every_kind_of_every_link_and_validates(tmp_path: Path) -> None:
    cover = E.cover(random.Random(5))
    kinds = {f["type"] for c in cover for f in c["faults"]}
    assert kinds == set(E.KINDS) | set(E.TOXICS) | set(E.NETNS) | {"kill"}
    # each new kind once: each port fault on P's side channel, the store master frozen and killed,
    # P and D frozen at once, a shared-prefix mix
    assert sorted(E.signature(c) for c in cover if any(f["type"] in E.PORT_FAULTS for f in c["faults"])) == \
        ["partition_port(side_channel,both)", "refuse_port(side_channel,both)"]
    assert [E.signature(c) for c in cover if c["topology"].get("kv_pool")] == ["stop(store)", "kill(store)"]
    assert [E.signature(c) for c in cover if len(c["faults"]) > 1] == ["stop(decode:0)+stop(prefill:0)",
                                                                       E.signature(E._slow_write_schedule(random.Random(0)))]
    assert sum(bool(c["workload"].get("shared_prefix_tokens")) for c in cover) == 1
    # each node frozen at a phase once (P as it starts writing, D as its pull goes out)
    # and D frozen inside P's write, the link from P held so that the write outlasts the reaction
    assert sorted((f["node"], f["upon"]["phase"]) for c in cover for f in c["faults"] if f.get("upon")) == \
        [("decode:0", "d_pull_out"), ("decode:0", "p_write_started"), ("prefill:0", "p_write_started")]
    slow = [c for c in cover if any(f["type"] == "bandwidth_limit" and f["direction"] == "server->client"
                                    and f["at"] + f["for"] >= 1.0 + 2.0 + 0.2 for f in c["faults"])
            and any(f.get("upon", {}).get("phase") == "p_write_started" and f["node"] == "decode:0"
                    for f in c["faults"])]
    assert len(slow) == 1 and slow[0]["topology"] == {"link": "netns"}
    assert {f["node"] for c in cover for f in c["faults"] if f["type"] == "kill"} == {*E.NODES, E.STORE}
    # the plain link's kinds first (warm nodes), kills last (a cold start each)
    links = [c["topology"]["link"] + ("+pool" if c["topology"].get("kv_pool") else "") for c in cover[:-2]]
    assert links == sorted(links, key=["direct", "toxiproxy", "netns", "direct+pool"].index)
    assert [f["type"] for c in cover[-2:] for f in c["faults"]] == ["kill", "kill"]
    for i, c in enumerate(cover):
        write_scenario(E.render(c, f"cover-{i}", "hardened", i), tmp_path / f"cover-{i}.yaml")
        load_scenario(tmp_path / f"cover-{i}.yaml")


def test_pdchaos_validate_passes_drawn_schedules(tmp_path: Path) -> None:
    """The command itself, on 40 drawn schedules and the covering round."""
    rng = random.Random(20261207)
    for i in range(40):
        write_scenario(E.render(E.draw(rng), f"v-{i}", "hardened", i), tmp_path / f"v-{i}.yaml")
    for i, c in enumerate(E.cover(random.Random(1))):
        write_scenario(E.render(c, f"c-{i}", "upstream", i), tmp_path / f"c-{i}.yaml")
    r = subprocess.run([sys.executable, "-m", "harness.cli", "validate", str(tmp_path)], capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def test_a_store_schedule_renders_as_the_pd_store_suite_runs() -> None:
    """A KV pool's schedule: topology kv_pool, the written suite's descriptor slack (a store client
    reopens its connections after the master froze or restarted: +5 to +8 measured), a cap for three
    cold starts; a kill of the master is no vLLM restart, so recovery stays judged."""
    rng = random.Random(3)
    for kind in ("stop", "kill"):
        doc = E.render(E._store_schedule(rng, kind), f"store-{kind}", "hardened", 1)
        assert doc["topology"] == {"kv_pool": True} and doc["cap"] == "600s"
        assert doc["checks"]["no_leaks"] == {"slack": 10} and "recovery" not in doc["checks"]
        assert [(f["type"], f["node"]) for f in doc["faults"]] == [(kind, E.STORE)]
    plain = E.render(E._kill_schedule(rng, "decode:0"), "kill-d", "hardened", 1)
    assert plain["checks"]["recovery"] == {"enabled": False} and "no_leaks" not in plain["checks"]


def test_no_pause_starves_a_fault_waiting_for_its_phase() -> None:
    """The slow-write schedule's bandwidth window could hold a pause from 1 s, while the freeze
    keyed on p_write_started waits (armed at 1 s, 2 s to see the phase): no request would come,
    the phase never, and the run would be a harness error. No pause overlaps such a wait."""
    for seed in range(20):
        c = E._slow_write_schedule(random.Random(seed))
        pauses = E.render(c, "x", "hardened", seed)["workload"].get("pauses") or []
        for p in pauses:
            start, length = parse_duration(p["at"]), parse_duration(p["for"])
            keyed = c["faults"][1]
            assert start >= keyed["at"] + keyed["upon"]["within"] or start + length <= keyed["at"], (seed, p)
