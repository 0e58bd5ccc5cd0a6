"""vLLM 0.32.0's MooncakeStoreConnector admin channel against the hardened one, with upstream's real
LookupKeyServer/LookupKeyClient in the P/D node env's python (tests/helpers/store_vllm.py): upstream's
thread dies on a short lookup and its reset reports success when remove_all failed; the hardened
channel answers every message, bounds every call, tells a failed reset from a done one, and never
shares or takes over another engine's path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nodes import run_env_helper

MARKER = "PDCHAOS-STORE-RESULT "
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    from stacks.vllm_cpu.recipe import pd_node_env

    env = pd_node_env(out=lambda line: None)
    if not env.installed():
        pytest.skip("the P/D node stack is not installed here: run `pdchaos setup --only pd-node-stack`")
    repo = Path(__file__).resolve().parents[2]
    base = tmp_path_factory.mktemp("rpc")
    res, _, err = run_env_helper([str(env.python), str(repo / "tests" / "helpers" / "store_vllm.py"), str(repo),
                                  str(base)], env=dict(os.environ), cwd=str(repo), timeout=200, marker=MARKER)
    return res


def test_upstream_thread_dies_on_a_short_lookup_and_then_nothing_answers(result) -> None:
    assert result["upstream_good"] is True
    assert result["upstream_reply_to_short_lookup"] is False
    assert result["upstream_thread_alive_after_short_lookup"] is False
    assert result["upstream_answers_after"] is False


def test_upstream_reports_a_reset_that_removed_nothing_as_success(result) -> None:
    assert result["upstream_reset_with_master_gone"] is True
    assert result["upstream_keys_left_after_that_reset"] == 1
    assert result["upstream_same_path_two_engines"] is True


def test_the_workloads_upstream_client_closes_with_no_thread_left(result) -> None:
    """The final probe is written right after close(): the executor thread the lookup started must
    be gone by then, or no_leaks reads a thread the system under test never leaked."""
    assert result["workload_upstream_lookup"] == 16
    assert result["workload_upstream_threads_while_open"] == 1
    assert result["workload_upstream_threads_after_close"] == 0


def test_hardened_answers_every_message_and_keeps_serving(result) -> None:
    assert result["hardened_good_hit"] == 16
    assert result["hardened_replies_to_malformed"] == 5
    assert result["hardened_lookup_when_store_raises"] == 0  # a miss: the prompt is computed
    assert result["hardened_hit_after_all_that"] == 16
    assert result["hardened_async_first_poll_none"] is True and result["hardened_async_then_hit"] == 16


def test_hardened_reset_succeeds_only_when_the_store_was_cleared_and_is_bounded(result) -> None:
    assert result["hardened_reset_with_master_gone"] is False
    assert result["hardened_reset_with_stuck_put"] is False
    assert 1.9 <= result["hardened_reset_with_stuck_put_s"] < 4.0  # the 2 s drain bound, answered in time
    assert result["hardened_reset_ok"] is True and result["hardened_keys_left"] == 0
    # only this model's keys ("<cache_prefix>@<model><namespace>@tp_rank:..."), never remove_all
    assert set(result["hardened_reset_patterns"]) == {"^pfx@tiny@tp_rank:"}
    assert result["hardened_reset_two_ranks"] is False and result["hardened_reset_no_regex"] is False
    assert result["hardened_keys_left_after_refusals"] == 1
    assert result["hardened_miss_after_reset"] == 0


def test_hardened_lookup_is_bounded_when_the_server_is_gone(result) -> None:
    assert result["hardened_lookup_server_gone"] == 0
    assert result["hardened_lookup_server_gone_s"] < 1.5  # lookup_rpc_timeout_ms 500


def test_hardened_paths_are_per_engine_and_a_live_one_is_never_taken(result) -> None:
    assert result["hardened_paths_differ"] is True
    assert result["hardened_second_server_on_live_path"] == \
        "another store lookup server is listening on this engine's path"


def test_bad_deadlines_fail_at_start_naming_the_key(result) -> None:
    assert result["settings_zero"].startswith("lookup_rpc_timeout_ms must be a positive int")
    assert result["settings_reset_under_drain"].startswith("lookup_reset_timeout_ms (1000) must exceed")
    # issue 30, item 11: the server's backend deadline is below the client's, so its answer arrives
    assert result["settings_backend_over_client"].startswith(
        "lookup_backend_timeout_ms (4000) must be less than 1000 (lookup_rpc_timeout_ms)")
    assert result["settings_backend_default"] == 750
