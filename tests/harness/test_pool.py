"""Warm nodes between scenario runs (harness/pool.py + BaseTopology's pool hooks), with real
node processes: the toy echo family's server, pooled by a topology subclass defined here (the
pd family pools its vLLM servers the same way; tests/families/pd/test_pd_nodes.py and the P/D suite run
that for real).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from harness.pool import NodePool
from harness.runner import Runner

TOY = Path(__file__).resolve().parents[1] / "toy_family"


@pytest.fixture()
def echo(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(TOY))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TOY), os.environ.get("PYTHONPATH", "")]))  # its nodes
    from echo_family.family import FAMILY, EchoTopology

    class PooledEcho(EchoTopology):
        refuse: str | None = None  # what reusable() says (None: reusable)

        def pool_key(self, role: str) -> tuple | None:
            return ("echo", self.target) if role == "server" else None

        def pool_extra(self, role: str) -> dict:
            return {"endpoint": self.endpoint}

        def reusable(self, role: str, stats: dict) -> str | None:
            return PooledEcho.refuse

        def start(self) -> None:
            pooled = self.take_pooled("server")
            if pooled is not None:
                self.endpoint = pooled.extra["endpoint"]
                if self.adopt("server", pooled) is not None:
                    return
            self.endpoint = f"ipc://{self.pool.tmp}/echo-{time.monotonic_ns()}.sock"
            self.start_node("server")

    monkeypatch.setattr(FAMILY, "topology", lambda sc, target, d, rec, services, profile=None: PooledEcho(sc, target, d, rec, services))
    return PooledEcho


def scenario(tmp_path: Path, name: str = "echo-plain") -> Any:
    from harness.schema import load_scenario

    p = tmp_path / f"{name}.yaml"
    p.write_text(f"name: {name}\nfamily: echo_family\ndeadline: 200ms\ncap: 20s\n"
                 "targets: [plain]\nworkload: {duration: 500ms, concurrency: 1, rate: 20}\nexpect: {plain: pass}\n"
                 "triggers: {none: \"baseline without faults\"}\n")
    return load_scenario(p)


def events(run_dir: Path, res: Any, what: str) -> list[dict]:
    recs = [json.loads(line) for line in (run_dir / res.dir / "journal.jsonl").open()]
    return [r for r in recs if r["type"] == "event" and r["what"] == what]


@pytest.mark.timeout(60)
def test_a_healthy_node_serves_the_next_scenario_and_dies_with_the_pool(tmp_path: Path, echo) -> None:
    sc = scenario(tmp_path)
    with NodePool(tmp_path) as pool:
        runner = Runner(tmp_path, services={"node_pool": pool})
        first = runner.run_one(sc, "plain")
        second = runner.run_one(scenario(tmp_path, "echo-again"), "plain")
        assert first.verdict == second.verdict == "pass", (first.reason, second.reason)
        pooled = events(tmp_path, first, "node_pooled")
        reused = events(tmp_path, second, "node_reused")
        assert [e["role"] for e in pooled] == ["server"] and [e["role"] for e in reused] == ["server"]
        assert reused[0]["pid"] == pooled[0]["pid"] and reused[0]["reuses"] == 1
        # alive on purpose: never reported as a leftover of the run that pooled it
        assert not events(tmp_path, first, "leftovers") and not events(tmp_path, second, "leftovers")
        # the second run probed the reused node afresh: its own baseline, same process
        recs = [json.loads(line) for line in (tmp_path / second.dir / "journal.jsonl").open()]
        base = [r for r in recs if r["type"] == "probe" and r["node"] == "server" and r["when"] == "baseline"]
        assert len(base) == 1 and base[0]["pid"] == reused[0]["pid"]
        idle = pool.idle()
        assert len(idle) == 1 and idle[0].handle.alive
        proc, tmp = idle[0].handle, pool.tmp
    assert not proc.alive and not tmp.exists()


@pytest.mark.timeout(60)
def test_a_node_the_family_finds_unfit_is_stopped_not_pooled(tmp_path: Path, echo) -> None:
    echo.refuse = "1 request still waiting"
    try:
        with NodePool(tmp_path) as pool:
            runner = Runner(tmp_path, services={"node_pool": pool})
            res = runner.run_one(scenario(tmp_path), "plain")
            assert res.verdict == "pass", res.reason
            why = events(tmp_path, res, "not_pooled")
            assert [(e["role"], e["why"]) for e in why] == [("server", "1 request still waiting")]
            assert pool.idle() == [] and not events(tmp_path, res, "leftovers")
    finally:
        echo.refuse = None


@pytest.mark.timeout(60)
def test_a_pooled_node_found_unfit_at_adoption_is_replaced(tmp_path: Path, echo) -> None:
    with NodePool(tmp_path) as pool:
        runner = Runner(tmp_path, services={"node_pool": pool})
        first = runner.run_one(scenario(tmp_path), "plain")
        old = pool.idle()[0].handle
        echo.refuse = "KV cache 0.01% in use"
        try:
            second = runner.run_one(scenario(tmp_path, "echo-again"), "plain")
        finally:
            echo.refuse = None
        assert first.verdict == "pass" and second.verdict == "pass", second.reason
        rejected = events(tmp_path, second, "pool_reject")
        assert [e["why"] for e in rejected] == ["KV cache 0.01% in use"] and not old.alive
        assert not events(tmp_path, second, "node_reused")  # a fresh server served it


@pytest.mark.timeout(60)
def test_a_pooled_node_that_died_while_idle_is_dropped(tmp_path: Path, echo) -> None:
    with NodePool(tmp_path) as pool:
        runner = Runner(tmp_path, services={"node_pool": pool})
        runner.run_one(scenario(tmp_path), "plain")
        dead = pool.idle()[0]
        dead.handle.kill()
        second = runner.run_one(scenario(tmp_path, "echo-again"), "plain")
        assert second.verdict == "pass", second.reason
        assert not events(tmp_path, second, "node_reused")
        assert len(pool.idle()) == 1 and pool.idle()[0].handle.pid != dead.handle.pid


def test_pool_keys_must_match(tmp_path: Path) -> None:
    from harness.pool import PooledNode

    class Alive:
        alive = True
        pid = 1

        def stop(self, timeout_s: float = 0) -> None:
            self.alive = False

    with NodePool(tmp_path) as pool:
        p = PooledNode(("vllm", "fail", 10), "vllm", Alive(), None)  # type: ignore[arg-type]
        pool.give(p)
        assert pool.take(("vllm", "recompute", 10)) is None
        assert pool.take(("vllm", "fail", 10)) is p and p.reuses == 1
        assert pool.take(("vllm", "fail", 10)) is None
        pool.give(p)
    assert p.handle.alive is False  # close() stops what it still holds


def test_the_pool_keeps_at_most_max_idle_nodes(tmp_path: Path) -> None:
    from harness.pool import PooledNode

    class Alive:
        def __init__(self, pid: int):
            self.alive, self.pid = True, pid

        def stop(self, timeout_s: float = 0) -> None:
            self.alive = False

    with NodePool(tmp_path, max_idle=2) as pool:
        nodes = [PooledNode(("k", i), "vllm", Alive(i), None) for i in range(3)]  # type: ignore[arg-type]
        for n in nodes:
            pool.give(n)
        assert [n.key for n in pool.idle()] == [("k", 1), ("k", 2)]
        assert [n.handle.alive for n in nodes] == [False, True, True]  # the oldest was stopped


def test_pdchaos_run_groups_scenarios_by_start_settings() -> None:
    """File order, but the scenarios whose nodes start alike run in a row (the node pool serves
    them): the pd suite's netns and fixed-engine scenarios come after the default ones."""
    from harness.plan import order_for_reuse
    from harness.schema import load_all

    scenarios = load_all([str(Path(__file__).resolve().parents[2] / "scenarios" / "pd")])
    ordered = order_for_reuse(scenarios)
    assert sorted(s.name for s in ordered) == sorted(s.name for s in scenarios)  # nothing lost or added
    groups = [s.family.reuse_group(s.model) for s in ordered]
    seen: list = []
    for g in groups:  # each group is contiguous
        if not seen or seen[-1] != g:
            assert g not in seen, f"group {g} split"
            seen.append(g)
    assert len(seen) >= 3  # default, netns, fixed engine id
    default = [s.name for s in ordered if s.family.reuse_group(s.model) == groups[0]]
    assert default == [s.name for s in scenarios if s.family.reuse_group(s.model) == groups[0]]  # file order kept
    assert ordered[-1].model.topology.engine_id == "fixed" or ordered[-1].model.topology.link == "netns" \
        or ordered[-1].model.topology.kv_load_failure_policy == "recompute"


def test_pdchaos_run_plans_one_target_after_the_other_within_a_group() -> None:
    """Within a reuse group every upstream run comes first, then every hardened one (the pool keeps
    one warm pair: alternating targets would start a fresh pair for every run); nothing is lost."""
    from harness.plan import plan_for_reuse
    from harness.schema import load_all

    scenarios = load_all([str(Path(__file__).resolve().parents[2] / "scenarios" / "pd")])
    plan = plan_for_reuse(scenarios)
    assert sorted((s.name, t) for s, t in plan) == sorted((s.name, t) for s in scenarios for t in s.model.targets)
    switches = sum(1 for (a, ta), (b, tb) in zip(plan, plan[1:]) if ta != tb)
    groups = {s.family.reuse_group(s.model) for s in scenarios}
    assert switches <= 2 * len(groups)  # at most one target change inside a group, one between groups
    first = [t for s, t in plan if s.family.reuse_group(s.model) == plan[0][0].family.reuse_group(plan[0][0].model)]
    assert first == sorted(first, key=("upstream", "hardened").index)  # upstream's runs, then hardened's


class _Proc:
    def __init__(self, pid: int):
        self.alive, self.pid = True, pid

    def stop(self, timeout_s: float = 0) -> None:
        self.alive = False


def test_with_a_plan_the_pool_stops_what_no_run_needs_and_keeps_what_runs_need(tmp_path: Path) -> None:
    from collections import Counter

    from harness.pool import PooledNode

    with NodePool(tmp_path, max_idle=2) as pool:
        a, b, c = (PooledNode(("k", n), "vllm", _Proc(i), None) for i, n in enumerate("abc"))  # type: ignore[arg-type]
        pool.give(a)
        pool.give(b)
        assert pool.want(Counter({("k", "b"): 1})) == [a]  # a: no run left needs it, stopped at once
        assert not a.handle.alive and b.handle.alive and pool.idle_keys() == [("k", "b")]
        pool.want(Counter({("k", "b"): 1, ("k", "c"): 5, ("k", "d"): 3}))
        pool.give(c)
        d = PooledNode(("k", "d"), "vllm", _Proc(3), None)  # type: ignore[arg-type]
        pool.give(d)  # three needed, room for two: the one the fewest runs need goes (b: 1)
        assert pool.idle_keys() == [("k", "c"), ("k", "d")] and not b.handle.alive
        pool.want(None)  # no plan: the oldest beyond max_idle, as before
        e = PooledNode(("k", "e"), "vllm", _Proc(4), None)  # type: ignore[arg-type]
        pool.give(e)
        assert pool.idle_keys() == [("k", "d"), ("k", "e")] and not c.handle.alive


def test_warm_order_serves_runs_from_the_nodes_idle_now() -> None:
    """The P/D pattern in keys: upstream runs, hardened runs, and two hardened-target runs that each
    mix one upstream node with one hardened one; netns runs pool nothing."""
    from collections import Counter

    from harness.plan import WarmOrder

    uP, uD, hP, hD = "uP", "uD", "hP", "hD"
    keys = [[uP, uD, None]] * 3 + [[hP, hD, None]] * 3 + [[hP, uD, None], [uP, hD, None]] + [[None, None, None]]
    order = WarmOrder(keys)
    assert order.pick([]) == 8  # a run that pools nothing costs no cold start of a pooled node: first
    order.left = [0, 1, 2, 3, 4, 5, 6, 7]
    assert order.pick([]) == 0  # nothing warm: plan order
    order.left = [1, 2, 3, 4, 5, 6, 7]
    assert order.pick([uP, uD]) == 1  # warm pair: its target's runs
    order.left = [3, 4, 5, 6, 7]
    assert order.pick([uP, uD]) == 6  # upstream done: a mixed run uses a warm node (before it goes)
    order.left = [3, 4, 5, 7]
    assert order.pick([uP, hP]) == 7  # uP is needed by that run only; hP by four: uP first
    order.left = [3, 4, 5]
    assert order.pick([hP, hD]) == 3
    assert order.need([6, 7]) == Counter({uD: 1, hP: 1, uP: 1, hD: 1})
    order.left = [1, 3]
    assert order.pick([uP]) == 1  # a node a run left unfit is gone: the rest of its target still first
    order.left = [0, 8]
    assert WarmOrder([[], [None]]).pick([]) == 0  # no keys at all (a topology that could not be built): plan order


def test_warm_order_tells_the_pool_what_the_remaining_runs_need(tmp_path: Path) -> None:
    from harness.plan import WarmOrder
    from harness.pool import PooledNode

    with NodePool(tmp_path, max_idle=2) as pool:
        order = WarmOrder([["a"], ["b"], ["a"]], pool)
        na = PooledNode("a", "vllm", _Proc(1), None)  # type: ignore[arg-type]
        pool.give(na)
        assert order.choose([0, 1, 2]) == 0  # "a" is warm; the run takes it (the runner's list)
        assert pool.take("a") is na
        pool.give(na)
        assert order.choose([1, 2]) == 1  # the other "a" run
        assert na.handle.alive
        assert order.choose([1]) == 0  # "b": "a" is needed by no run left, stopped before it starts
        assert not na.handle.alive
        with pytest.raises(RuntimeError):
            order.choose([1, 2])  # not the runs this order has left


def test_the_nodes_a_run_gives_back_are_judged_by_the_runs_after_it(tmp_path: Path) -> None:
    """A main job's case: upstream P and D idle; a run mixing a fresh hardened P with the upstream D
    gives back hardened P and upstream D. With room for two, the upstream P (which one later run
    needs) stays and the upstream D (which no later run needs) goes, not the other way round."""
    from harness.plan import WarmOrder
    from harness.pool import PooledNode

    with NodePool(tmp_path, max_idle=2) as pool:
        order = WarmOrder([["uP", "uD"], ["hP", "uD"], ["uP", "hD"], ["hP", "hD"], ["hP", "hD"]], pool)
        order.left = [1, 2, 3, 4]
        up, ud = (PooledNode(k, "vllm", _Proc(i), None) for i, k in enumerate(("uP", "uD")))  # type: ignore[arg-type]
        pool.give(up)
        pool.give(ud)
        assert order.choose([1, 2, 3, 4]) == 0  # the mixed run on the warm upstream D
        assert pool.take("uD") is ud and pool.idle_keys() == ["uP"]  # uP kept for the other mixed run
        hp = PooledNode("hP", "vllm", _Proc(3), None)  # type: ignore[arg-type]
        pool.give(ud)
        pool.give(hp)
        assert pool.idle_keys() == ["uP", "hP"] and up.handle.alive and not ud.handle.alive
        assert order.choose([2, 3, 4]) == 0  # the other mixed run, on the warm upstream P


def test_pool_keys_of_the_pd_suite_pair_each_target_and_mix_them() -> None:
    """What WarmOrder works from, asked of the real P/D topology (nothing started): P and D pooled
    per target, a mixed scenario's nodes under the keys of the targets it mixes, netns never."""
    from harness.plan import plan_for_reuse, pool_keys
    from harness.schema import load_all

    scenarios = {s.name: s for s in load_all([str(Path(__file__).resolve().parents[2] / "scenarios" / "pd")])}
    base_u = pool_keys(scenarios["pd-baseline"], "upstream")
    base_h = pool_keys(scenarios["pd-baseline"], "hardened")
    assert base_u[0] and base_u[1] and base_u[2] is None  # P, D pooled; the proxy never
    assert not set(base_u[:2]) & set(base_h[:2])
    mixed_d = pool_keys(scenarios["pd-mixed-upstream-decode"], "hardened")
    mixed_p = pool_keys(scenarios["pd-mixed-upstream-prefill"], "hardened")
    assert mixed_d[:2] == [base_h[0], base_u[1]] and mixed_p[:2] == [base_u[0], base_h[1]]
    assert pool_keys(scenarios["pd-partition-prefill-decode"], "upstream") == [None, None, None]
    assert len(plan_for_reuse(list(scenarios.values()))) > 0


def test_dead_idle_nodes_go_first_and_a_key_keeps_no_more_nodes_than_runs_need_it(tmp_path: Path) -> None:
    from collections import Counter

    from harness.pool import PooledNode

    with NodePool(tmp_path, max_idle=2) as pool:
        pool.want(Counter({"a": 5, "b": 1}))
        dead = PooledNode("a", "vllm", _Proc(1), None)  # type: ignore[arg-type]
        live_b = PooledNode("b", "vllm", _Proc(2), None)  # type: ignore[arg-type]
        pool.give(dead)
        pool.give(live_b)
        dead.handle.alive = False
        fresh = PooledNode("a", "vllm", _Proc(3), None)  # type: ignore[arg-type]
        pool.give(fresh)  # three for two places: the dead one goes, not the live one fewer runs need
        assert pool.idle_keys() == ["b", "a"] and live_b.handle.alive
        pool.want(Counter({"a": 1}))
        second_a = PooledNode("a", "vllm", _Proc(4), None)  # type: ignore[arg-type]
        pool.give(second_a)  # one run left needs "a": one node of it stays, the newest
        assert pool.idle_keys() == ["a"] and pool.idle()[0] is second_a and not fresh.handle.alive
