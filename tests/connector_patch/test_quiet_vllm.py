"""Quiet waiting's runtime patches against vLLM 0.32.0's real classes (the P/D node env's python,
tests/helpers/quiet_vllm.py): installed only on the version and sources they were written for,
all or none, switchable off, and undone; an engine that only waits steps ~16 times a second
instead of ~900 and wakes at once for input or a connector's wake; a real SpinCondition reader
spins only in dense traffic, and its idle wait is bounded (a lost notification costs 20 ms)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nodes import run_env_helper

MARKER = "PDCHAOS-QUIET-RESULT "
pytestmark = pytest.mark.timeout(360)


@pytest.fixture(scope="module")
def result() -> dict:
    from stacks.vllm_cpu.recipe import pd_node_env

    env = pd_node_env(out=lambda line: None)
    if not env.installed():
        pytest.skip("the P/D node stack is not installed here: run `pdchaos setup --only pd-node-stack`")
    repo = Path(__file__).resolve().parents[2]
    res, _, _ = run_env_helper([str(env.python), str(repo / "tests" / "helpers" / "quiet_vllm.py"), str(repo)],
                               env=dict(os.environ), cwd=str(repo), timeout=300, marker=MARKER)
    return res


def test_refused_on_another_version_or_a_changed_function_and_then_nothing_is_patched(result) -> None:
    assert result["version"].split("+")[0] == "0.32.0"
    assert result["refused_version"].startswith("quiet waiting not installed: vLLM 0.31.0 is not one")
    assert result["untouched_after_refusal"] is True
    assert "SpinCondition.wait differs from vLLM 0.32.0" in result["refused_changed"]
    assert result["none_patched_when_one_changed"] is True  # all or none


def test_switched_off_touches_nothing_and_installed_patches_three_functions(result) -> None:
    assert result["off"] == "quiet waiting off (quiet_wait_max_ms: 0)" and result["off_untouched"] is True
    assert result["installed"].startswith("quiet waiting on: 3 vLLM functions patched")
    assert result["patched"] == ["connector_patch.quiet.patch_engine_step",
                                 "connector_patch.quiet.patch_spin_record_read",
                                 "connector_patch.quiet.patch_spin_wait"]
    assert result["restored"] is True


def test_an_engine_that_only_waits_backs_off_and_wakes_at_once(result) -> None:
    assert result["upstream_steps_in_1s_waiting"] > 200  # 1 ms sleeps: hundreds of empty steps
    assert result["steps_in_1s_waiting"] <= 25  # 1, 2, 4, ... 100 ms
    assert 0 <= result["woken_by_input_s"] < 0.02
    assert 0 <= result["woken_by_local_wake_s"] < 0.02
    assert result["child_wake_sent"] == "1" and result["child_wake_seen"] == 1  # a worker's wake over ipc


def test_the_queue_reader_spins_only_in_dense_traffic_and_never_sleeps_unbounded(result) -> None:
    assert result["window_after_long_gap"] == 0.0
    assert result["window_in_dense_traffic"] == pytest.approx(0.05)
    assert 0.015 <= result["idle_wait_returned_after_s"] < 0.5  # bounded poll, no writer at all
    assert result["idle_wait_with_notify_s"] < 0.019  # a notification still wakes it before the bound
