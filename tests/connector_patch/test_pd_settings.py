"""The hardened connector's settings, input checks, idle sleeps and failure log (pure: no vLLM)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from connector_patch.pd.ledger import LoadLedger
from connector_patch.pd.settings import (DEFAULT_IDLE_WAIT_MS, FailureLog, Settings, idle_sleep_s,
                                         remote_prefill_problem, summary)

pytestmark = pytest.mark.timeout(30)

GOOD = {"do_remote_prefill": True, "remote_engine_id": "e1", "remote_bootstrap_addr": "http://127.0.0.1:8998",
        "transfer_id": "t1"}


def test_defaults_when_nothing_is_set() -> None:
    s = Settings.from_extra({"mooncake_protocol": "tcp"})
    assert (s.kv_load_timeout_ms, s.idle_wait_ms, s.heartbeat_ms) == (30000, DEFAULT_IDLE_WAIT_MS, 500)
    assert s.heartbeat_timeout_ms == 1500
    assert Settings.from_extra(None) == s
    assert s.idle_wait_ms == 0 and Settings.from_extra({"idle_wait_ms": 50}).idle_wait_ms == 50  # 0: off


@pytest.mark.parametrize("key,value", [("kv_load_timeout_ms", 0), ("kv_load_timeout_ms", -5),
                                       ("kv_load_timeout_ms", "2000"), ("kv_load_timeout_ms", 2.5),
                                       ("kv_load_timeout_ms", True), ("idle_wait_ms", -1),
                                       ("idle_wait_ms", 5000), ("heartbeat_ms", None), ("heartbeat_ms", 0)])
def test_a_bad_setting_is_refused_naming_its_key(key, value) -> None:
    with pytest.raises(ValueError) as e:
        Settings.from_extra({key: value})
    assert f"kv_connector_extra_config.{key}" in str(e.value)


def test_extra_config_must_be_a_mapping() -> None:
    with pytest.raises(ValueError, match="mapping"):
        Settings.from_extra(["kv_load_timeout_ms", 1])  # type: ignore[arg-type]


def test_usable_params_have_no_problem() -> None:
    assert remote_prefill_problem(GOOD) is None


@pytest.mark.parametrize("change,code", [
    ({"transfer_id": None}, "missing_transfer_id"),
    ({"remote_engine_id": ""}, "bad_remote_engine_id"),
    ({"remote_bootstrap_addr": 8998}, "bad_remote_bootstrap_addr"),
    ({"remote_bootstrap_addr": "127.0.0.1:8998"}, "bad_remote_bootstrap_addr"),
])
def test_unusable_params_are_named(change, code) -> None:
    assert remote_prefill_problem({**GOOD, **change}) == code


def test_missing_keys_are_named() -> None:
    params = {k: v for k, v in GOOD.items() if k not in ("transfer_id", "remote_bootstrap_addr")}
    assert remote_prefill_problem(params) == "missing_remote_bootstrap_addr"


@given(st.floats(min_value=-1, max_value=1e6, allow_nan=False), st.integers(min_value=1, max_value=1000))
@settings(max_examples=200, deadline=None)
def test_idle_sleep_is_a_tenth_of_the_idle_time_capped(idle_for, cap_ms) -> None:
    s = idle_sleep_s(idle_for, cap_ms)
    assert 0.0 <= s <= cap_ms / 1000.0
    assert s <= max(0.0, idle_for) * 0.1 + 1e-12
    if idle_for > 0 and idle_for * 0.1 <= cap_ms / 1000.0:
        assert s == pytest.approx(idle_for * 0.1)


def test_failure_log_summarises_at_most_once_per_interval() -> None:
    log = FailureLog(interval_s=10.0)
    assert log.due(0.0) is None  # nothing to say
    log.note("timeout")
    log.note("peer_gone", 2)
    log.note("ignored", 0)
    assert log.due(1.0) == {"timeout": 1, "peer_gone": 2}
    log.note("timeout")
    assert log.due(5.0) is None  # too soon
    assert log.due(11.5) == {"timeout": 1}
    assert log.totals == {"timeout": 2, "peer_gone": 2}
    assert summary({"b": 2, "a": 1}) == "a=1, b=2"


def test_ledger_says_which_loads_failed_and_which_are_still_tracked() -> None:
    led = LoadLedger(1000)
    assert led.start("ok", [[1]], now=0.0) and led.start("bad", [[2, 3]], now=0.0)
    assert led.tracked("ok") and not led.tracked("never")
    led.ok("ok")
    led.fail("bad", "peer_error")
    rep = led.collect(now=0.1)
    assert rep.finished == {"ok", "bad"} and rep.failed_ids == {"bad"} and rep.failed_blocks == {2, 3}
    assert not led.tracked("bad")
