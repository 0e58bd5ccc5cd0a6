"""The plan of a run: which (scenario, target) runs, in which order, under which launch profile.

Order: scenarios grouped by their family's reuse group (warm nodes in the pool serve a whole
group in a row), one target after the other within a group. Profiles: data per family, handed
to the runner and through it to each topology. Exclusions: runs a family's profile cannot make
are left out with the reason, never run and never counted as passing.
"""

from __future__ import annotations

from typing import Any

from .errors import UsageError


def order_for_reuse(scenarios: list) -> list:
    """The scenarios grouped by (family, the family's reuse group), groups in the order their first
    scenario comes, file order within a group: nodes kept warm serve a whole group in a row."""
    groups: dict = {}
    for sc in scenarios:
        groups.setdefault((sc.family.name, sc.family.reuse_group(sc.model)), []).append(sc)
    return [sc for group in groups.values() for sc in group]


def plan_for_reuse(scenarios: list) -> list[tuple]:
    """(scenario, target) runs: per reuse group (order_for_reuse), one target after the other (in
    the family's target order), file order within: the warm nodes of one target serve all of that
    group's runs before the next target's nodes start (a pool holds one pair, not one per target)."""
    plan: list[tuple] = []
    groups: dict = {}
    for sc in order_for_reuse(scenarios):
        groups.setdefault((sc.family.name, sc.family.reuse_group(sc.model)), []).append(sc)
    for group in groups.values():
        order = list(dict.fromkeys([t for t in group[0].family.targets] + [t for sc in group for t in sc.model.targets]))
        plan += [(sc, t) for t in order for sc in group if t in sc.model.targets]
    return plan


def split_plan(plan: list[tuple], profiles: dict[str, Any] | None = None) -> tuple[list[tuple], list[tuple]]:
    """(the runs to make, the runs left out with why): a family leaves out a scenario/target
    its launch profile cannot run (``Family.excluded``)."""
    keep, left_out = [], []
    for sc, target in plan:
        why = sc.family.excluded(sc, target, (profiles or {}).get(sc.family.name))  # random faults drawn
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
