"""The plan of a run: which (scenario, target) runs, in which order, under which launch profile.

Order: scenarios grouped by their family's reuse group (warm nodes in the pool serve a whole
group in a row), one target after the other within a group; while running, WarmOrder picks the
next run by the warm nodes the pool holds then. Profiles: data per family, handed
to the runner and through it to each topology. Exclusions: runs a family's profile cannot make
are left out with the reason, never run and never counted as passing.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from .errors import UsageError


def order_for_reuse(scenarios: list) -> list:
    """The scenarios grouped by (family, the family's reuse group), groups in the order their first
    scenario comes, file order within a group: nodes kept warm serve a whole group in a row."""
    groups: dict = {}
    for sc in scenarios:
        groups.setdefault((sc.family.name, sc.family.reuse_group(sc.model)), []).append(sc)
    return [sc for group in groups.values() for sc in group]


def targets_of(sc: Any, asked: Any = ()) -> list[str]:
    """The targets a scenario runs: its own, and each derived target (``Family.derived_targets``)
    asked for by name whose base target it runs."""
    own = list(sc.model.targets)
    derived = [t for t, base in sc.family.derived_targets.items() if t in asked and base in own and t not in own]
    return own + derived


def plan_for_reuse(scenarios: list, asked: Any = ()) -> list[tuple]:
    """(scenario, target) runs: per reuse group (order_for_reuse), one target after the other (in
    the family's target order), file order within: the warm nodes of one target serve all of that
    group's runs before the next target's nodes start (a pool holds one pair, not one per target).
    ``asked``: the targets named on the command line (derived targets run only when named)."""
    plan: list[tuple] = []
    groups: dict = {}
    for sc in order_for_reuse(scenarios):
        groups.setdefault((sc.family.name, sc.family.reuse_group(sc.model)), []).append(sc)
    for group in groups.values():
        runs = {id(sc): targets_of(sc, asked) for sc in group}
        order = list(dict.fromkeys([t for t in group[0].family.targets] + [t for sc in group for t in runs[id(sc)]]))
        plan += [(sc, t) for t in order for sc in group if t in runs[id(sc)]]
    return plan


class WarmOrder:
    """Which planned run next, so warm nodes serve as many runs as they can (harness/pool.py).

    Each run needs one node per role; a role the family pools has a key (``pool_key``), the others
    start fresh every run, whatever the order (so they do not count). The next run is the one with
    the fewest cold starts of pooled roles given the nodes idle in the pool now (the pool's real state: a node a run left unfit is gone); of equals, the one
    whose warm nodes the fewest other runs could use (use them before they are stopped), then plan
    order. Before each run the pool learns what the remaining runs need, so it stops the idle nodes
    no run needs. With a P/D pair this serves e.g. a scenario that mixes an upstream and a hardened
    node from the warm nodes of both targets, instead of starting both cold.

    Pure over its inputs (the keys per run, the idle keys) but for telling the pool."""

    def __init__(self, keys: list[list], pool: Any = None):
        self.keys = [list(k) for k in keys]  # per planned run: one key per role (None: never pooled)
        self.pool = pool
        self.left = list(range(len(self.keys)))  # planned runs not yet started, by their plan index

    @classmethod
    def for_plan(cls, plan: list[tuple], profiles: dict[str, Any] | None = None, pool: Any = None) -> "WarmOrder":
        return cls([pool_keys(sc, target, (profiles or {}).get(sc.family.name)) for sc, target in plan], pool)

    def need(self, runs: list[int]) -> Counter:
        return Counter(k for i in runs for k in self.keys[i] if k is not None)

    def pick(self, idle: list) -> int:
        """The plan index of the next run, given the keys of the idle nodes."""
        need = self.need(self.left)

        def rank(i: int) -> tuple:
            free = Counter(idle)
            cold, score = 0, 0.0
            for k in self.keys[i]:
                if k is None:
                    continue  # never pooled: started fresh whatever the order
                if free[k] > 0:
                    free[k] -= 1
                    score += 1.0 / need[k]
                else:
                    cold += 1
            return cold, -score, i

        return min(self.left, key=rank)

    def choose(self, remaining: list) -> int:
        """For Runner.run_plan: the position in ``remaining`` (the runs not yet started, in plan
        order, as this order was built from) of the next run; tells the pool what runs still need."""
        if len(remaining) != len(self.left):
            raise RuntimeError("WarmOrder: the runner's remaining runs are not this order's")
        i = self.pick(self.pool.idle_keys() if self.pool is not None else [])
        pos = self.left.index(i)
        del self.left[pos]
        if self.pool is not None:  # the chosen run's nodes are kept for it; once it gave them back, only later runs count
            self.pool.want(self.need(self.left), starting=self.need([i]))
        return pos


@contextmanager
def scratch_topology(sc: Any, target: str, profile: Any = None) -> Iterator[tuple[Path, Any]]:
    """(a scratch folder, the family's topology of ``sc`` against ``target`` built in it): nothing
    started; closed and removed at the end (``--dry-run`` and :func:`pool_keys` ask it questions)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"pdchaos-dry-{os.getpid()}-"))
    try:
        from .runtime import runtime_of

        services = {"runtime": runtime_of(profile), "runtime_profile": profile}  # nothing is made before a start
        topo = sc.family.topology(sc, target, tmp, lambda rec: None, services, profile)
        try:
            yield tmp, topo
        finally:
            topo.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def pool_keys(sc: Any, target: str, profile: Any = None) -> list:
    """One key per role of ``sc`` against ``target``: the family topology's ``pool_key`` (None: the
    role is never pooled), asked of a scratch topology. One that cannot be built or asked: no key
    (the run is ordered as if it pooled nothing)."""
    try:
        with scratch_topology(sc, target, profile) as (_, topo):
            return [topo.pool_key(role) for role in sc.family.roles(sc.model, profile) or []]
    except Exception:  # noqa: BLE001 - only an ordering hint: the run itself reports what is wrong
        return []


def runtime_refusal(sc: Any, profile: Any = None) -> str | None:
    """Why the runtime of the family's launch profile (harness/runtime.py) cannot make this
    scenario: a fault asks a node for something it cannot do (freeze a pod it cannot exec into),
    or the scenario needs a link it cannot make; None when it can."""
    from faults.base import load_registry

    from .runtime import runtime_of

    registry = load_registry(sc.family.name)
    needs: dict[str, tuple[str, ...]] = {"topology": tuple(sc.family.requirements(sc))}
    for f in sc.faults:
        cls = registry[f.type]
        needs[f.type] = tuple(cls.requires) + tuple(getattr(cls, "node_ops", ()))
    return runtime_of(profile).refuses(list(needs), needs, profile, scenario=sc)


def split_plan(plan: list[tuple], profiles: dict[str, Any] | None = None) -> tuple[list[tuple], list[tuple]]:
    """(the runs to make, the runs left out with why): a family leaves out a scenario/target
    its launch profile cannot run (``Family.excluded``)."""
    keep, left_out = [], []
    for sc, target in plan:
        profile = (profiles or {}).get(sc.family.name)
        why = sc.family.excluded(sc, target, profile) or runtime_refusal(sc, profile)  # random faults drawn
        if why is None:
            keep.append((sc, target))
        else:
            left_out.append((sc, target, why))
    return keep, left_out


def missing_setup(plan: list[tuple], profiles: dict[str, Any] | None = None) -> list[str]:
    """The ``pdchaos setup`` commands the planned runs need first, one line each ("what is
    missing: run `COMMAND`"): a family's node stack that is not installed
    (``Family.unavailable`` returning a :class:`harness.setup.MissingSetup`). Other reasons a run
    cannot be made here (no root, no toxiproxy) skip that run when it comes."""
    from .setup import MissingSetup

    out: dict[str, str] = {}
    for sc in dict.fromkeys(sc for sc, _ in plan):
        why = sc.family.unavailable(sc, (profiles or {}).get(sc.family.name))
        if isinstance(why, MissingSetup):
            out.setdefault(why.command, f"{sc.name} (family {sc.family.name}): {why}")
    return list(out.values())


def choose_profiles(scenarios: list, spec: str | None, sets: list[str]) -> dict[str, Any]:
    """The launch profile of each selected family that has them (``--profile``/``--set``), by
    family name: data the runner hands to each topology; none when none is asked for (each family
    then picks its default, per scenario: the pd family's KV-pool scenarios take cpu-store). A
    built-in profile name goes to the families that have it, the others run their default. An
    error when one was asked for and no selected family has profiles (or none has that name)."""
    families = list(dict.fromkeys(s.family for s in scenarios))
    with_profiles = [f for f in families if f.profile_names()]
    if (spec or sets) and not with_profiles:
        raise UsageError(f"--profile/--set: none of the selected scenarios' families has launch profiles "
                         f"(families: {', '.join(f.name for f in families)})")
    if not (spec or sets):
        return {}  # each family's default, which a family may choose per scenario (Family.topology & co.)
    if spec and not spec.endswith((".yaml", ".yml")):
        knowing = [f for f in with_profiles if spec in f.profile_names()]
        if knowing:  # a built-in name: the families that have it (the others run their default)
            with_profiles = knowing
    return {fam.name: fam.load_profile(spec, list(sets)) for fam in with_profiles}
