"""The pd family's generator for ``pdchaos explore`` (families/pd/explore.py), a property test:
whatever the seed, a drawn schedule renders to a scenario file the real schema and ``pdchaos
validate`` accept (its link fits its faults, every window leaves time for recovery), and it keeps
the generator's own rules (no two proxy faults at once, no two process faults on one node at once,
one toxic and one namespace fault at a time, a kill alone). No nodes run."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from families.pd import explore as E
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
    if "kill" in kinds:
        assert len(faults) == 1 and s["workload"]["duration"] >= 45
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
    write_scenario(E.render(s, f"drawn-{seed}", "hardened", seed), path)
    sc = load_scenario(path)  # the real schema: raises (a UsageError naming what) when invalid
    assert sc.model.topology.link == link
    # each window is a trigger; a keyed one also proves it started at its phase
    assert [t.fault for t in sc.model.triggers if t.type == "ops_in_window"] == list(range(len(faults)))
    assert [t.fault for t in sc.model.triggers if t.type == "phase_keyed"] == \
        [i for i, f in enumerate(faults) if f.get("upon")]
    assert [f.type for f in sc.faults] == [f["type"] for f in faults]
    for f, g in zip(sc.faults, faults):
        assert abs(f.at - g["at"]) < 1e-6 and abs(f.for_ - g["for"]) < 1e-6
        if g.get("upon"):  # only phases every target shows, only on freezes, never in a pause
            assert f.type == "stop" and f.upon.phase in E.PHASES and g["upon"]["phase"] in set(E.PHASES)
            assert abs(f.upon.within - g["upon"]["within"]) < 1e-6 and abs(f.upon.offset - g["upon"]["offset"]) < 1e-6
            for p in sc.model.workload.pauses:
                assert not (p.at < _latest(g) and g["at"] < p.at + p.for_), s
        else:
            assert f.upon is None


def test_some_drawn_freezes_are_keyed_on_phases() -> None:
    faults = [f for seed in range(300) for f in E.draw(random.Random(seed))["faults"]]
    keyed = [f for f in faults if f.get("upon")]
    stops = [f for f in faults if f["type"] == "stop"]
    assert 0.1 * len(stops) <= len(keyed) <= 0.6 * len(stops), (len(keyed), len(stops))
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
    # each node frozen at a phase once (P as it starts writing, D as its pull goes out)
    assert sorted((f["node"], f["upon"]["phase"]) for c in cover for f in c["faults"] if f.get("upon")) == \
        [("decode:0", "d_pull_out"), ("prefill:0", "p_write_started")]
    assert {f["node"] for c in cover for f in c["faults"] if f["type"] == "kill"} == set(E.NODES)
    # the plain link's kinds first (warm nodes), kills last (a cold start each)
    links = [c["topology"]["link"] for c in cover[:-2]]
    assert links == sorted(links, key=["direct", "toxiproxy", "netns"].index)
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
