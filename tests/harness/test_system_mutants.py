"""The system mutants' wiring (tests/mutants/system/): every mutant of a table exists in its plugin
site, is registered by the site's plugin, claims scenarios that exist and expect something of the
target, and reaches the nodes through the profile (the real-node run is ``pdchaos mutate
scenarios/pd/ scenarios/pd-long/prefill-down-same-engine.yaml``: see docs/verdicts.md for its last score)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from harness.cli.mutate import mutant_tables, system_mutants
from harness.errors import UsageError
from harness.schema import load_all

ROOT = Path(__file__).resolve().parents[2]
# where the P/D mutants' scenarios live: the CI suite, and the long set's one (NoForgetPeer's)
PD_SCENARIOS = [str(ROOT / "scenarios" / "pd"), str(ROOT / "scenarios" / "pd-long" / "prefill-down-same-engine.yaml")]
SITE = ROOT / "tests" / "mutants" / "system" / "site"


def _classes(path: Path) -> set[str]:
    return {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)}


def _names() -> list[str]:
    tree = ast.parse((SITE / "pdchaos_mutants" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "NAMES":
            return list(ast.literal_eval(node.value))
    raise AssertionError("no NAMES")


def test_every_mutant_of_the_table_is_a_registered_class_of_the_site():
    pd = mutant_tables()["pd"]
    classes = _classes(SITE / "pdchaos_mutants" / "connectors.py")
    names = _names()
    assert [m[0] for m in pd.MUTANTS] == names  # the plugin registers exactly the table's mutants
    for name, guarantee, scenarios in pd.MUTANTS:
        assert pd.PREFIX + name in classes, name
        assert guarantee and scenarios
    entry = (SITE / "pdchaos_mutants-0.0.0.dist-info" / "entry_points.txt").read_text()
    assert "[vllm.general_plugins]" in entry and "pdchaos_mutants:register" in entry


def test_mutant_names_select_the_hardened_paths_of_the_node():
    from families.pd.vllm_node import HARDENED, is_hardened, is_mooncake

    pd = mutant_tables()["pd"]
    assert pd.PREFIX.startswith(HARDENED)
    assert all(is_hardened(pd.PREFIX + m[0]) and is_mooncake(pd.PREFIX + m[0]) for m in pd.MUTANTS)
    assert not is_hardened("MooncakeConnector")


def test_every_mutant_claims_scenarios_that_exist_and_judge_the_target():
    pd = mutant_tables()["pd"]
    scs = {sc.name: sc for sc in load_all(PD_SCENARIOS)}
    for name, _, scenarios in pd.MUTANTS:
        for s in scenarios:
            assert s in scs, f"{name}: no scenario {s}"
            assert pd.TARGET in scs[s].model.targets


def test_system_mutants_pick_the_given_scenarios_and_refuse_unknown_names():
    scs = load_all(PD_SCENARIOS)
    every = system_mutants(scs, "hardened", [])
    assert {m["name"] for m in every} == {m[0] for m in mutant_tables()["pd"].MUTANTS}
    # the CI suite's folder alone leaves out the mutant whose scenario is in the long set
    ci_only = system_mutants(load_all([PD_SCENARIOS[0]]), "hardened", [])
    assert {m[0] for m in mutant_tables()["pd"].MUTANTS} - {m["name"] for m in ci_only} == {"NoForgetPeer"}
    one = system_mutants(scs, "hardened", ["NoParamsCheck"])
    assert [m["name"] for m in one] == ["NoParamsCheck"]
    assert [sc.name for sc in one[0]["scenarios"]] == ["pd-bad-transfer-params"]
    assert any(v.startswith("connectors.hardened.name=") for v in one[0]["sets"])
    assert system_mutants([sc for sc in scs if sc.name == "pd-baseline"], "hardened", []) == []  # none claimed there
    with pytest.raises(UsageError, match="no such system mutant"):
        system_mutants(scs, "hardened", ["NoSuchMutant"])


def test_profile_plugin_path_reaches_the_vllm_nodes_and_the_pool_key(tmp_path):
    from families.pd.profile import load_profile

    p = load_profile("cpu", [f"plugin_path={SITE}", "connectors.hardened.name=HardenedMooncakeConnectorMutantEosFrees"])
    assert p.plugin_path == str(SITE) and p.connectors["hardened"].name.endswith("EosFrees")
    assert p.key() != load_profile("cpu").key()  # a mutant node is never lent to a hardened run
    with pytest.raises(UsageError, match="plugin_path"):
        load_profile("cpu", ["plugin_path=relative/dir"])
    with pytest.raises(UsageError, match="plugin_path"):
        load_profile("cpu", [f"plugin_path={tmp_path / 'missing'}"])


def test_the_mutation_score_goes_into_the_run_report(tmp_path):
    import json

    from reports.summary import mutation_md

    assert mutation_md(tmp_path) == []  # no mutate.json: no section
    (tmp_path / "mutate.json").write_text(json.dumps({"target": "hardened", "killed": 1, "total": 2, "rows": [
        {"result": "killed", "scenario": "pd-a", "mutant": "upstream"},
        {"result": "survived", "scenario": "pd-b", "mutant": "NoLoadDeadline"}]}))
    text = "\n".join(mutation_md(tmp_path))
    assert "1/2 killed" in text and "survived: pd-b [NoLoadDeadline]" in text
    (tmp_path / "mutate.json").write_text("{not json")
    assert mutation_md(tmp_path) == []


def test_the_layerwise_mutants_are_classes_of_the_site_and_claim_scenarios_that_exist():
    lw = mutant_tables()["layerwise"]
    classes = _classes(SITE / "pdchaos_mutants" / "layerwise.py")
    scs = {sc.name: sc for sc in load_all([str(ROOT / "scenarios" / "ascend-cpu")])}
    for name, guarantee, scenarios in lw.MUTANTS:
        assert lw.PREFIX + name in classes, name
        assert guarantee and scenarios
        for s in scenarios:
            assert s in scs and scs[s].family.name == "layerwise", f"{name}: no layerwise scenario {s}"
            assert scs[s].model.expected(lw.TARGET) == "pass", f"{name}: {s} claims nothing of hardened"
    one = system_mutants(list(scs.values()), "hardened", ["ResendPost"])
    assert [sc.name for sc in one[0]["scenarios"]] == ["layerwise-metaserver-fail"]
    prof = scs["layerwise-baseline"].family.load_profile(None, one[0]["sets"])  # the sets make a valid profile
    assert prof.hardened_class.endswith(":HardenedMooncakeLayerwiseConnectorMutantResendPost")
