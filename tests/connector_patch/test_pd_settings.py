"""The hardened connector's settings, input checks and failure log (pure: no vLLM)."""

from __future__ import annotations

import pytest

from connector_patch.pd.ledger import LoadLedger
from connector_patch.pd.settings import (DEFAULT_QUIET_WAIT_MAX_MS, FailureLog, Settings, remote_prefill_problem,
                                         summary)

pytestmark = pytest.mark.timeout(30)

GOOD = {"do_remote_prefill": True, "remote_engine_id": "e1", "remote_bootstrap_addr": "http://127.0.0.1:8998",
        "transfer_id": "t1"}


def test_defaults_when_nothing_is_set() -> None:
    s = Settings.from_extra({"mooncake_protocol": "tcp"})
    assert (s.kv_load_timeout_ms, s.quiet_wait_max_ms, s.heartbeat_ms) == (30000, DEFAULT_QUIET_WAIT_MAX_MS, 500)
    assert s.heartbeat_timeout_ms == 1500
    assert s.eos_hold_ms == 60000 and Settings.from_extra({"eos_hold_ms": 5000}).eos_hold_ms == 5000
    assert Settings.from_extra(None) == s
    assert s.aggregate_failed_early is True
    assert Settings.from_extra({"aggregate_failed_early": False}).aggregate_failed_early is False
    assert s.quiet_wait_max_ms == 1000 and Settings.from_extra({"quiet_wait_max_ms": 0}).quiet_wait_max_ms == 0  # 0: off


@pytest.mark.parametrize("key,value", [("kv_load_timeout_ms", 0), ("kv_load_timeout_ms", -5),
                                       ("kv_load_timeout_ms", "2000"), ("kv_load_timeout_ms", 2.5),
                                       ("kv_load_timeout_ms", True), ("quiet_wait_max_ms", -1),
                                       ("quiet_wait_max_ms", 5000), ("quiet_wait_max_ms", 1.5), ("heartbeat_ms", None), ("heartbeat_ms", 0),
                                       ("eos_hold_ms", 0), ("eos_hold_ms", "60s"), ("eos_hold_ms", 7200000),
                                       ("aggregate_failed_early", "yes"), ("aggregate_failed_early", 1)])
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
