"""The version matrix (connector_patch/versions.py): each hardened connector loads on the upstream
releases it declares and is refused with one line on any other, checked against both node envs
this machine has (the P/D node env: vLLM 0.32.0; the conformance env: vLLM 0.23.0 with vllm-ascend
0.23.0.post1, under its NPU stubs), importing each connector module for real."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from connector_patch import versions as V
from nodes import run_env_helper

REPO = Path(__file__).resolve().parents[2]
MARKER = "PDCHAOS-VERSIONS-RESULT"


def test_every_registered_connector_has_a_row():
    from connector_patch.vllm_plugin import CONNECTORS

    assert {name for name, _, _ in CONNECTORS} == set(V.TESTED)
    assert set(V.NIGHTLY_ONLY) <= set(V.TESTED)


def test_status_and_the_refusal_line():
    p032 = {"vllm": "0.32.0", "vllm_ascend": None}
    conf = {"vllm": "0.23.0", "vllm_ascend": "0.23.0.post1"}
    assert V.status("HardenedMooncakeConnector", p032) == "tested"
    assert V.status("HardenedMooncakeConnector", conf) == "unsupported"  # issue 30, item 3
    assert V.status("HardenedMooncakeConnector", {"vllm": "0.33.0", "vllm_ascend": None}) == "unsupported"
    assert V.status("HardenedMooncakeStoreConnector", conf) == "unsupported"
    assert V.status("HardenedAscendStoreConnector", conf) == "tested"
    assert V.status("HardenedAscendStoreConnector", {"vllm": "0.23.0", "vllm_ascend": "0.24.0"}) == "unsupported"
    assert V.status("HardenedMooncakeLayerwiseConnector", p032) == "unsupported"
    with pytest.raises(V.UnsupportedUpstream) as err:
        V.require("HardenedMooncakeStoreConnector", {"vllm": "0.23.0"})
    msg = str(err.value)
    assert "\n" not in msg and msg == ("pdchaos: HardenedMooncakeStoreConnector does not support vllm 0.23.0 "
                                       "(supported: vllm 0.32.0); not loaded")
    with pytest.raises(KeyError):
        V.status("NoSuchConnector", p032)


def test_nightly_only_loads_with_one_line(caplog, monkeypatch):
    """The mechanism (no row uses it today): a release only the nightly checks loads, saying so."""
    monkeypatch.setitem(V.NIGHTLY_ONLY, "HardenedAscendStoreConnector", {"vllm": ("0.23.1",), "vllm_ascend": ("0.23.1",)})
    caplog.set_level(logging.WARNING, logger="vllm.pdchaos.versions")
    assert V.require("HardenedAscendStoreConnector", {"vllm": "0.23.1", "vllm_ascend": "0.23.1"}) == "nightly-only"
    assert [r.getMessage() for r in caplog.records] == [
        "pdchaos: HardenedAscendStoreConnector on vllm 0.23.1, vllm_ascend 0.23.1: loads here, checked only by "
        "the Ascend nightly"]


def test_the_p2p_connector_is_refused_on_vllm_0_23():
    """Issue 30, item 3: on vLLM 0.23.0 (what vllm-ascend 0.23.0.post1 pins) the hardened P/D
    connector imported but no load could complete; it is refused with one line instead."""
    with pytest.raises(V.UnsupportedUpstream) as err:
        V.require("HardenedMooncakeConnector", {"vllm": "0.23.0", "vllm_ascend": "0.23.0.post1"})
    assert str(err.value) == ("pdchaos: HardenedMooncakeConnector does not support vllm 0.23.0 (supported: vllm "
                              "0.32.0); not loaded")


def _run(env, *extra) -> dict:
    if not env.installed():
        pytest.skip(f"the {env.name} node env is not installed here: run `pdchaos setup`")
    res, _, _ = run_env_helper([str(env.python), str(REPO / "tests" / "helpers" / "connector_versions.py"),
                                str(REPO), *extra], env=dict(os.environ), cwd=str(REPO), timeout=300, marker=MARKER)
    return res


def _agrees(res: dict) -> None:
    """Every connector the table supports here imports; every other is refused with its one line
    and leaves nothing behind; no other error."""
    for name, row in res["connectors"].items():
        if row["status"] in ("tested", "nightly-only"):
            assert row["import"] == "ok", (name, row)
        else:
            assert row["import"] == "refused" and row["left_in_sys_modules"] is False, (name, row)
            assert row["message"].startswith(f"pdchaos: {name} does not support ") and "\n" not in row["message"]


@pytest.mark.timeout(360)
def test_pd_node_env_vllm_0_32_0():
    from stacks.vllm_cpu.recipe import pd_node_env

    res = _run(pd_node_env(out=lambda line: None))
    assert res["releases"] == {"vllm": "0.32.0", "vllm_ascend": None}
    assert {n: r["status"] for n, r in res["connectors"].items()} == {
        "HardenedMooncakeConnector": "tested", "HardenedMooncakeStoreConnector": "tested",
        "HardenedAscendStoreConnector": "unsupported", "HardenedMooncakeLayerwiseConnector": "unsupported"}
    _agrees(res)
    assert res["p2p_facts"] == {"runner_calls_get_transfer_results": True, "pull_req_meta_has_failed": True}, \
        res["p2p_facts"]


@pytest.mark.timeout(360)
def test_conformance_env_vllm_0_23_0_with_vllm_ascend_0_23_0_post1():
    from stacks.ascend_cpu.recipe import ascend_conf_env

    res = _run(ascend_conf_env(out=lambda line: None), "stubs")
    assert res["releases"] == {"vllm": "0.23.0", "vllm_ascend": "0.23.0.post1"}
    assert {n: r["status"] for n, r in res["connectors"].items()} == {
        "HardenedMooncakeConnector": "unsupported", "HardenedMooncakeStoreConnector": "unsupported",
        "HardenedAscendStoreConnector": "tested", "HardenedMooncakeLayerwiseConnector": "tested"}
    _agrees(res)
    # why the P/D connector is refused there (issue 30, item 3): what it needs, 0.23 lacks
    assert res["p2p_facts"] == {"runner_calls_get_transfer_results": False, "pull_req_meta_has_failed": False}, \
        res["p2p_facts"]
