"""The stateful model of the P/D pull protocol (tests/connector_patch/pd_model.py) over the
hardened connector's real pure rules, run by Hypothesis' rule-based state machine: D, P with one
or two TP ranks, a network that delays, reorders, loses and duplicates, aborts and deadlines at
any step. Then each rule the model covers is broken the way the defects of issue 30 broke it,
and the model must find a history that violates an invariant.

``PDCHAOS_MODEL_EXAMPLES`` raises the example count (the nightly's long mode); the default keeps
this file to seconds.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from connector_patch.pd import pull as pull_rules
from connector_patch.pd.settle import Settlements

from pd_model import SEEN, PDModel, PDModelTwoRanks

EXAMPLES = int(os.environ.get("PDCHAOS_MODEL_EXAMPLES", "300"))
MUTANT_EXAMPLES = max(EXAMPLES, 1500)
pytestmark = pytest.mark.timeout(600 if EXAMPLES > 300 else 180)


def _run(model, examples: int) -> None:
    run_state_machine_as_test(model, settings=settings(max_examples=examples, stateful_step_count=50, deadline=None,
                                                       suppress_health_check=list(HealthCheck), database=None,
                                                       derandomize=True))


@pytest.mark.parametrize("model", [PDModel, PDModelTwoRanks], ids=["p-tp1", "p-tp2"])
def test_the_pull_protocol_keeps_its_invariants(model) -> None:
    SEEN.clear()
    _run(model, EXAMPLES)
    # not vacuous: P wrote, loads completed and failed, cancels were acknowledged, loads given up
    # during the bootstrap query were never pulled, P gave up waiting, and pulls ran to their bound
    paths = ("written", "done", "failed", "cancelled", "pull_dropped", "p_expired", "bound")
    assert all(SEEN[k] > 0 for k in paths), dict(SEEN)


def _opened_without_close(self, req_id, pulls):
    """Mutant of Settlements.opened: "not opened means settled" and nothing remembers it (before
    issue 30, item 1's fix): a load given up during the bootstrap query opens all the same."""
    keys = set(pulls)
    with self._lock:
        self._open.setdefault(req_id, set()).update(keys)
        return True


def _cancel_every_open_id(req_ids, pull_failed, cancel_wanted):  # noqa: ARG001
    """Mutant of cancel_targets: one abort cancels every open id of its pull (issue 30, item 2)."""
    ids = set(req_ids)
    return ids if pull_failed or ids & set(cancel_wanted) else set()


def _fail_without_settling(self, rid, action):  # noqa: ARG001
    """Mutant of Settlements.want: a failed or aborted load frees its blocks at once, whether P may
    still write or not (the rule the settlements exist for)."""
    with self._lock:
        self._want.pop(rid, None)
        return True


@pytest.mark.parametrize("target, attr, mutant, words", [
    (Settlements, "opened", _opened_without_close, "P wrote"),
    (pull_rules, "cancel_targets", _cancel_every_open_id, "neither aborted nor its pull failed"),
    (Settlements, "want", _fail_without_settling, "P wrote"),
], ids=["not-opened-means-settled", "cancel-every-open-id", "free-before-settled"])
def test_the_model_catches_a_broken_rule(monkeypatch, target, attr, mutant, words) -> None:
    monkeypatch.setattr(target, attr, mutant)
    with pytest.raises(AssertionError) as err:
        _run(PDModel, MUTANT_EXAMPLES)
    assert words in str(err.value), str(err.value)
