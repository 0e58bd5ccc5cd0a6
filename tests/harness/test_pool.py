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
                 "targets: [plain]\nworkload: {duration: 500ms, concurrency: 1, rate: 20}\nexpect: {plain: pass}\n")
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
        assert len(idle) == 1 and idle[0].proc.alive
        proc, tmp = idle[0].proc, pool.tmp
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
        old = pool.idle()[0].proc
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
        dead.proc.kill()
        second = runner.run_one(scenario(tmp_path, "echo-again"), "plain")
        assert second.verdict == "pass", second.reason
        assert not events(tmp_path, second, "node_reused")
        assert len(pool.idle()) == 1 and pool.idle()[0].proc.pid != dead.proc.pid


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
    assert p.proc.alive is False  # close() stops what it still holds


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
        assert [n.proc.alive for n in nodes] == [False, True, True]  # the oldest was stopped


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
