"""The hardened Mooncake connector inside vLLM's REAL v1 Scheduler, in-process on CPU.

One subprocess (the P/D node env's python: vLLM 0.32.0 CPU, torch, Mooncake; the harness env has
no vLLM) runs ``tests/helpers/pd_hardened_inproc.py``, which for each case builds a D: vLLM's own
``Scheduler`` whose scheduler-side connector it constructs itself from ``kv_transfer_config``
(``kv_connector="HardenedMooncakeConnector"``, registered by ``connector_patch.vllm_plugin``; vLLM's
``MooncakeConnector`` for the contrast in the bad-params case), and a worker-side connector built
by vLLM's ``KVConnectorFactory`` for real (a Mooncake TransferEngine over tcp on 127.0.0.1, KV
tensors registered with it, its receiver thread). Each engine step is ``schedule()`` -> vLLM's
``KVConnectorModelRunnerMixin`` (``start_load_kv`` with the scheduler's ``build_connector_meta``
output, ``get_transfer_results``, ``get_block_ids_with_load_errors``) -> ``update_from_output()``.
D's pulls and cancel messages go for real (bootstrap query over HTTP, ZMQ DEALERs) to P engines:
mostly stand-ins (vLLM's own ``MooncakeBootstrapServer`` plus a ZMQ ROUTER per P TP rank answering
from a script with msgspec-encoded ``MooncakeXferResponse`` messages, as P does: ERROR, FINISH with
err_reqs, FINISH naming nothing, OK, silence, a late answer; and D's ``{"pdchaos_cancel": [...]}``
answered not at all, ERROR as upstream, or as the hardened P answers it), and in the late-write
case the REAL hardened P worker (kv_producer: its own side channel, ``_on_cancel`` and
TransferEngine writes into D's KV tensors).

Each step's ``KVConnectorOutput`` is classified per request (the helper's ``REPORT_KINDS``):
``failed`` (its invalid blocks without finished_recving: vLLM fails the request with policy fail
and, the request not being in finished_recving, keeps its blocks), ``failed+released`` (both in one
output and vLLM finished the request: the client's error and the blocks back in one step),
``failed+recv`` (both, the request goes on: policy recompute), ``released`` (finished_recving alone
for a request already finished, failed or aborted: vLLM frees its blocks) and ``ok``
(finished_recving alone for a request still waiting: a load that succeeded). For every report the
helper also records what the step did with the request's blocks, from vLLM's block pool: a
``failed`` report must leave them all held, a release must give all of them back in that step
(``reports_against_blocks`` counts the reports that did not; asserted 0 for every node), and D never
reports finished_sending (it never delay-frees).

What it proves, case by case (the issue's list): a failed load ends the request FINISHED_ERROR
(policy ``fail``) or makes it recompute from its valid prefix (``recompute``), and is reported once
as failed, never as an OK load: ``['failed+released']`` when P can no longer write at that moment
(P answered ERROR or FINISH, its address refuses), ``['failed', 'released']`` when it still may
(then the blocks stay held, with the request in the scheduler, until the load settles: P's last
word on the pull, its acknowledgement of D's cancel, a refused port), and ``['failed+recv']`` with
policy recompute; a failure then an OK from two P workers is reported once, as failed, and the
blocks come back after the OK; a pull with no local block is never reported; duplicate failures
are reported once; unusable kv_transfer_params leave upstream's request in WAITING_FOR_REMOTE_KVS
for good while the hardened one computes it locally at once; a load nobody answers is reported
failed at kv_load_timeout_ms, D then asks P to cancel it and releases the blocks once P
acknowledged. Beyond the list: a P address where nobody listens fails the load in well under a
second; a request aborted while it waits (deadline 20 s) gets its blocks back by
``['released']`` (finished_recving without invalid blocks), at once when P acknowledges D's cancel
and once P's port refuses otherwise, never before. A P that may still write after D's deadline (P
waits for its own prefill, then writes): with policy ``fail`` the client gets its error at the
deadline and the blocks stay held until P cannot write (the real P acknowledges D's cancel at
once, then writes nothing when its prefill ends; an upstream-like P that answers neither pull nor
cancel keeps them held, watched 2 s, until its late answer); with policy ``recompute`` the failure
reaches the scheduler only once P cannot write any more (after P acknowledged D's cancel: against
a stand-in that ignores the first cancel, 2 s later; against the real P, at once), the prompt is
recomputed in place, P's prefill ending writes nothing over it, and the failure is counted once.

Not real: no model runs (a step that schedules tokens gets one constant stand-in token per request
that reached its end, and in some cases writes a marker into a newly scheduled request's blocks as
a model writes a prompt's KV; a step with nothing scheduled goes through the mixin's real
``kv_connector_no_forward``); the stand-in P engines write no KV bytes; the real P's scheduler is
replaced by the metadata it would hand its worker; vLLM plugins are off in the subprocess and the
node env's CPU shim (``pdchaos_cpu_shim``) is registered by hand.
"""

from __future__ import annotations

import pytest

from nodes import run_pd_env_helper

MARKER = "PDCHAOS-INPROC-RESULT "
SUBPROCESS_TIMEOUT_S = 480  # start-up is 10 s on a quiet machine, 20-65 s for `import torch` under load
TEST_TIMEOUT_S = SUBPROCESS_TIMEOUT_S + 60  # the first test also pays for the module fixture
DEADLINE_S = 0.3  # the helper's kv_load_timeout_ms for the deadline case


@pytest.fixture(scope="module")
def inproc() -> dict:
    from faults.toxiproxy import find_binary

    result = run_pd_env_helper("pd_hardened_inproc.py", timeout=SUBPROCESS_TIMEOUT_S, marker=MARKER, env_extra={
        "PD_INPROC_WATCHDOG_S": str(SUBPROCESS_TIMEOUT_S - 20),  # it dumps its stacks and exits first
        "PD_INPROC_TOXIPROXY": find_binary() or "",  # the link of the requester_lost case
    })
    print("in-process P/D timing (s):", result["timing"])
    return result["cases"]


def _case(inproc: dict, name: str) -> dict:
    case = inproc[name]
    assert case["error"] is None, case["error"]
    return case


def _node_clean(node: dict) -> None:
    """The real Scheduler raised nothing (it asserts that every finished_recving names a request it
    holds), every block came back, no invalid block went unclaimed, every report did with the
    request's blocks what it means, and D never reported finished_sending."""
    assert node["scheduler_error"] is None
    assert node["worker_class"] == "HardenedMooncakeConnectorWorker"
    assert node["scheduler_connector_class"] == "HardenedMooncakeConnectorScheduler"
    assert node["unfinished_end"] == 0
    assert node["free_blocks_end"] == node["free_blocks_start"] and node["usage_end"] == 0.0
    assert node["stray_invalid_blocks"] == 0
    assert node["reports_against_blocks"] == 0
    assert node["finished_sending"] == 0


# a failed load reported with its release in one output: P could no longer write at the failure
SETTLED_AT_ONCE = ["failed+released"]
# the failure first (the client's error, blocks held), the release alone in a later output
RELEASED_LATER = ["failed", "released"]


def _effects(req: dict) -> None:
    """What each report of the request did with its blocks, from vLLM's block pool: a failure
    alone kept all of them (the request stays in the scheduler), a release gave all of them back
    in its step (the free blocks gained, less those of other requests that left in that step)."""
    assert [e["report"] for e in req["report_effects"]] == req["reports"]
    for e in req["report_effects"]:
        assert e["own_blocks"] == req["blocks"] > 0, req["report_effects"]
        if e["report"] == "failed":
            assert e["in_scheduler_after"] and e["own_freed"] == 0, req["report_effects"]
        elif e["report"] in ("failed+released", "released"):
            assert not e["in_scheduler_after"] and e["own_freed"] == e["own_blocks"], req["report_effects"]


def _failed_once(req: dict, reports: list[str]) -> None:
    """Reported once as failed (never as an OK load), with exactly the report sequence
    ``reports``; the client got its error; blocks held until the release, given back by it."""
    assert req["first_status"] == "WAITING_FOR_REMOTE_KVS", req
    assert req["blocks"] > 0
    assert req["reports"] == reports, req
    assert sum(r.startswith("failed") for r in req["reports"]) == 1 and "ok" not in req["reports"], req
    assert req["reports"][-1] in ("failed+released", "released"), req  # its blocks came back
    assert req["final_status"] == "FINISHED_ERROR" and req["finish_reason"] == "ERROR", req
    _effects(req)


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_policy_fail_ends_a_failed_load_with_an_error_and_frees_its_blocks(inproc) -> None:
    c = _case(inproc, "fail_policy")
    _node_clean(c["node"])
    # while waiting, the blocks of both requests were held
    held = sum(r["blocks"] for r in c["reqs"].values())
    assert c["node"]["free_blocks_start"] - c["free_blocks_held"] == held and c["usage_held"] > 0
    for name, p in c["p"].items():
        assert p["pulls"] == [1], name  # D really pulled from P over ZMQ
        assert p["asked_blocks"] == [[c["reqs"][name]["blocks"]]]
        assert p["cancels"] == [0], name  # P had answered: nothing to cancel
    for name, req in c["reqs"].items():  # P said ERROR / P's FINISH did not name the request
        # P's answer was its last word: the error and the blocks back in the same output
        _failed_once(req, SETTLED_AT_ONCE)
        assert c["released_after_last_word_s"][name] >= 0, c["released_after_last_word_s"]
    assert c["node"]["failures"] == {"peer_error": 1, "unanswered": 1}
    assert c["node"]["failed_recvs"] == 2


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_policy_recompute_reschedules_the_prompt_from_its_valid_prefix(inproc) -> None:
    c = _case(inproc, "recompute_policy")
    _node_clean(c["node"])
    assert c["prefix_caching"] and c["warm_final_status"] == "FINISHED_LENGTH_CAPPED"
    req = c["req"]
    assert c["first"] == {"status": "WAITING_FOR_REMOTE_KVS", "computed": req["prompt_tokens"]}
    # D had the shared prefix in its own cache and pulled only the rest: those blocks failed
    assert c["p"]["pulls"] == [1]
    assert 0 < c["p"]["asked_blocks"][0][0] < req["blocks"]
    # P's FINISH err_reqs settled the pull: the failure and finished_recving in one output, once;
    # the request keeps its blocks (recomputed in place)
    assert req["reports"] == ["failed+recv"], req
    assert req["report_effects"] == [{"report": "failed+recv", "in_scheduler_after": True,
                                      "own_blocks": req["blocks"], "own_freed": 0}]
    assert c["valid_prefix_after_failure"] == c["shared_prefix_tokens"] > 0
    assert c["next"] == {"status": "RUNNING", "scheduled": req["prompt_tokens"] - c["shared_prefix_tokens"]}
    assert c["next"]["scheduled"] > 0
    assert req["final_status"] == "FINISHED_LENGTH_CAPPED" and req["finish_reason"] == "LENGTH"
    assert c["node"]["failures"] == {"peer_error": 1} and c["node"]["failed_recvs"] == 1


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_failure_and_an_ok_from_two_prefill_workers_report_the_load_once_as_failed(inproc) -> None:
    c = _case(inproc, "multi_p")
    _node_clean(c["node"])
    for name, p in c["p"].items():
        assert p["pulls"] == [1, 1], name  # one pull to each P TP rank: pull_tasks_count 2
        assert p["reply_order"] == [0, 1], name  # rank 0 answered first, rank 1 after it
    # rank 0 failed while rank 1 could still write (it answers once D's scheduler has the
    # failure): the client's error at once, the blocks held until rank 1's OK, its last word on the
    # pull, then back (within a cancel round D may have started meanwhile, which P leaves unanswered)
    fail_then_ok = c["reqs"]["fail_then_ok"]
    _failed_once(fail_then_ok, RELEASED_LATER)
    assert c["last_word_after_failure_s"]["fail_then_ok"] > 0, c["last_word_after_failure_s"]
    assert 0 <= c["released_after_last_word_s"]["fail_then_ok"] < 3.0, c["released_after_last_word_s"]
    # rank 0 said OK, then rank 1 failed: its ERROR was P's last word, so the error and the
    # release in one output
    _failed_once(c["reqs"]["ok_then_fail"], SETTLED_AT_ONCE)
    assert c["last_word_after_failure_s"]["ok_then_fail"] <= 0, c["last_word_after_failure_s"]
    assert c["released_after_last_word_s"]["ok_then_fail"] >= 0, c["released_after_last_word_s"]
    assert c["p"]["ok_then_fail"]["cancels"] == [0, 0]
    assert c["node"]["failures"] == {"peer_error": 2} and c["node"]["failed_recvs"] == 2


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_an_empty_block_pull_is_never_reported_to_the_scheduler(inproc) -> None:
    c = _case(inproc, "empty_pull")
    _node_clean(c["node"])
    assert c["aborted_statuses"] == {"ok": "FINISHED_ABORTED", "err": "FINISHED_ABORTED"}
    assert c["p"]["pulls"] == [1] and c["p"]["asked_blocks"] == [[0, 0]]  # P was told to free its side
    assert c["p"]["reply_order"] == [0]  # and answered (OK for one, err_reqs for the other)
    assert c["reports"] == {"ok": [], "err": []}
    assert c["ledger_pending"] == 0
    assert c["node"]["failed_recvs"] == 0 and c["node"]["failures"] == {}


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_duplicate_failures_of_one_load_are_reported_once(inproc) -> None:
    c = _case(inproc, "duplicates")
    _node_clean(c["node"])
    assert set(c["reqs"]) == {"err_reqs_twice", "err_reqs_then_error", "both_workers_error"}
    for name, req in c["reqs"].items():
        if name == "both_workers_error":
            # one P worker's ERROR fails the load while the other P worker could still write: one
            # failure report, then the release alone, after the second worker's last word
            _failed_once(req, RELEASED_LATER)
            # the second worker's last word comes with or after the failure (the same poll may read
            # both: 0.0 s once in a fresh machine's full test run), never before it
            assert c["last_word_after_failure_s"][name] >= 0, c["last_word_after_failure_s"]
            assert 0 <= c["released_after_last_word_s"][name] < 3.0, c["released_after_last_word_s"]
        else:
            # err_reqs naming the request is P's last word for it (P never writes a request it
            # reported failed): settled with the failure, released in the same output; the
            # repeated failure afterwards changes nothing
            _failed_once(req, SETTLED_AT_ONCE)
    assert c["p"]["both_workers_error"]["pulls"] == [1, 1]
    assert c["node"]["failures"] == {"peer_error": 3} and c["node"]["failed_recvs"] == 3


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_bad_transfer_params_wait_forever_upstream_and_run_locally_hardened(inproc) -> None:
    c = _case(inproc, "bad_params")
    up, hard = c["upstream"], c["hardened"]
    assert up["node"]["scheduler_connector_class"] == "MooncakeConnectorScheduler"
    assert up["node"]["scheduler_error"] is None and up["node"]["steps"] >= 5
    for name, req in up["reqs"].items():  # vLLM's own connector: stuck, blocks held, nothing asked
        assert req["statuses"] == [["WAITING_FOR_REMOTE_KVS", up["node"]["steps"]]], name
        assert req["final_status"] == "WAITING_FOR_REMOTE_KVS" and req["reports"] == []
    assert up["node"]["free_blocks_end"] == up["free_blocks_held"] < up["node"]["free_blocks_start"]
    assert up["p"]["pulls"] == [0]

    _node_clean(hard["node"])
    for name, req in hard["reqs"].items():  # hardened: RUNNING at the first step, whole prompt local
        assert req["first_status"] == "RUNNING", name
        assert req["first_scheduled"] == req["prompt_tokens"], name
        assert req["blocks"] == 0 and req["reports"] == []  # never waited for remote KV
        assert req["final_status"] == "FINISHED_LENGTH_CAPPED"
    assert hard["p"]["pulls"] == [0]
    assert hard["node"]["scheduler_failures"] == {"bad_params:missing_transfer_id": 1,
                                                  "bad_params:missing_remote_bootstrap_addr": 1}


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_request_aborted_while_waiting_gets_its_blocks_back_once_prefill_cannot_write(inproc) -> None:
    c = _case(inproc, "abort_while_waiting")
    _node_clean(c["node"])
    ack, gone = c["ack"], c["refused"]
    # vLLM keeps an aborted WAITING_FOR_REMOTE_KVS request's blocks until the connector reports it
    assert c["statuses_after_abort"] == ["FINISHED_ABORTED", "FINISHED_ABORTED"]
    assert c["in_scheduler_after_abort"] == [True, True]
    held = ack["req"]["blocks"] + gone["req"]["blocks"]
    assert held > 0 and c["free_blocks_after_abort"] == c["node"]["free_blocks_start"] - held
    for part in (ack, gone):
        assert part["p"]["pulls"] == [1] and part["p"]["reply_order"] == []  # P never answered the pull itself
        assert part["p"]["cancels"][0] >= 1  # D asked P to cancel the transfer
        # one finished_recving, without invalid blocks, for the finished request: its release
        assert part["req"]["reports"] == ["released"], part["req"]
        assert part["req"]["final_status"] == "FINISHED_ABORTED"
        _effects(part["req"])
    # a P that acknowledges the cancel (answering the pull err_reqs): back at once, long before the
    # 20 s load deadline
    assert ack["p"]["cancel_answered_pulls"] == [1]
    assert ack["freed_after_abort_s"] < min(1.0, c["deadline_s"] / 10), ack["freed_after_abort_s"]
    # a P that answers the cancel ERROR (as upstream): held until its port refuses, then back at once
    assert gone["p"]["cancel_answered_pulls"] == [0]
    assert gone["held_before_close"] == {"reports": 0, "in_scheduler": True}
    assert 0 <= gone["freed_after_close_s"] < 3.0, gone["freed_after_close_s"]
    assert gone["freed_after_abort_s"] < c["deadline_s"] / 2
    assert c["node"]["failures"] == {} and c["node"]["failed_recvs"] == 0
    # an abort leaves P's cached addresses fresh (forgetting them on every abort once raced a
    # healthy load's bootstrap query on CI: unknown_engine); a refused port marks them stale, kept
    # (never removed under a query) until P's bootstrap server answers again
    assert c["engines"] == {"ack_stale": False, "refused_stale": True, "refused_cached": True,
                            "refused_stale_after_query": False}, c["engines"]


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_prefill_address_nobody_listens_on_fails_the_load_long_before_the_deadline(inproc) -> None:
    c = _case(inproc, "unreachable")
    _node_clean(c["node"])
    assert c["p"]["pulls"] == [0]
    _failed_once(c["req"], SETTLED_AT_ONCE)  # a refused port: P cannot write, the blocks back at once
    assert c["reported_after_s"] < min(5.0, c["timeout_s"] / 4), c["reported_after_s"]
    assert c["node"]["failures"] == {"unreachable": 1}


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_load_nobody_answers_is_reported_failed_at_its_deadline(inproc) -> None:
    c = _case(inproc, "deadline")
    _node_clean(c["node"])
    assert c["deadline_s"] == DEADLINE_S
    assert c["p"]["pulls"] == [1] and c["p"]["reply_order"] == []  # P took the pull, never answered it
    # the failure at the deadline (P may still write: blocks held), D cancels, P acknowledges, the
    # release comes alone after that; the pull's own end reports nothing more
    _failed_once(c["req"], RELEASED_LATER)
    assert DEADLINE_S <= c["reported_after_s"] <= DEADLINE_S + 1.0, c["reported_after_s"]
    assert c["p"]["cancels"] == [1] and c["p"]["cancel_answered_pulls"] == [1]  # D cancelled; P acknowledged
    assert c["cancel_answered_after_s"] >= DEADLINE_S
    assert c["cancel_answered_after_s"] <= c["released_after_s"] < c["cancel_answered_after_s"] + 1.0, (
        c["cancel_answered_after_s"], c["released_after_s"])
    assert c["node"]["failures"] == {"timeout": 1} and c["node"]["failed_recvs"] == 1


# ---------------------------------------------------------------- a P that may still write after D's deadline

def _late(inproc: dict, phase: str) -> dict:
    c = _case(inproc, "late_write_after_deadline")[phase]
    _node_clean(c["node"])
    return c


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_late_write_setup_the_real_prefill_could_still_write_when_the_load_failed(inproc) -> None:
    """Premises of the next test (real hardened P, policy fail)."""
    c = _late(inproc, "fail")
    _failed_once(c["x"], RELEASED_LATER)  # the client's error, then the release
    assert c["deadline_s"] <= c["x_error_after_s"] <= c["deadline_s"] + 1.0, c["x_error_after_s"]
    # when the failure reached D's scheduler, the real P still had the transfer and had not given it up
    assert c["at_report"] == {"p_may_write": True, "p_cancelled": False, "free_blocks": 0}, c["at_report"]
    assert c["y"]["final_status"] == "FINISHED_LENGTH_CAPPED"
    assert c["y_reuses_x_blocks"] == c["y_blocks"] == c["x_blocks"] > 0  # Y ran on X's blocks
    assert c["y_blocks_intact_before_p_prefill_end"] == c["y_blocks"]  # and wrote its own KV there
    assert c["p_sent"]["failed"] == 0 and c["p_sent"]["p_freed"]  # P's prefill ended; P freed its blocks
    assert c["node"]["failures"] == {"timeout": 1} and c["node"]["failed_recvs"] == 1


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_load_failed_at_its_deadline_keeps_its_blocks_until_the_prefill_cannot_write(inproc) -> None:
    c = _late(inproc, "fail")
    # the client's error at the deadline, the blocks still held: Y (which needs them) waits
    assert c["at_failure"] == {"free_blocks": 0, "x_in_scheduler": True, "y_status": "WAITING"}, c["at_failure"]
    # released (finished_recving alone) once the real P had acknowledged D's cancel, which it does
    # at once: well under a second; vLLM gave the blocks back in that very step
    assert c["at_release"] == {"p_may_write": False, "p_cancelled": True,
                               "free_blocks": c["node"]["free_blocks_start"]}, c["at_release"]  # X held them all
    assert c["at_freed"] == c["at_release"], (c["at_freed"], c["at_release"])
    assert c["x_released_after_s"] == c["x_freed_after_s"]
    assert 0 < c["x_freed_after_s"] - c["x_error_after_s"] < 1.0, (c["x_error_after_s"], c["x_freed_after_s"])
    assert c["at_y_scheduled"] == {"p_may_write": False, "p_cancelled": True}
    assert c["y_first_scheduled_after_s"] >= c["x_freed_after_s"]
    # P's prefill then ended: it wrote nothing, freed its blocks, and Y's KV is intact. P counted
    # the cancel; when D's connection for the pull had closed by then, it also counted the pull's
    # requester as lost (item 4: either stops the write; seen once in a loaded full run)
    assert c["p_failures"].get("p_cancelled") == 1 and set(c["p_failures"]) <= {"p_cancelled", "p_requester_lost"}, \
        c["p_failures"]
    assert c["p_sent"] == {"bytes": 0, "transfers": 0, "failed": 0, "p_freed": True}, c["p_sent"]
    assert c["y_blocks_overwritten_by_p"] == 0 and c["y_blocks_intact_after"] == c["y_blocks"] > 0


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_policy_recompute_reports_a_failed_load_once_the_real_prefill_cannot_write(inproc) -> None:
    c = _late(inproc, "recompute")
    z = c["z"]
    assert z["reports"] == ["failed+recv"], z  # once, the failure and finished_recving together
    # reported when the real P had acknowledged D's cancel (P can no longer write), not before
    assert c["at_report"] == {"p_may_write": False, "p_cancelled": True}, c["at_report"]
    assert [s for s, _ in z["statuses"]] == ["WAITING_FOR_REMOTE_KVS", "RUNNING"], z["statuses"]
    assert c["z_blocks_refilled"] == c["z_blocks"] > 0  # the prompt recomputed into its blocks
    # P's prefill then ended: nothing written over the recomputed KV
    assert c["p_sent"] == {"bytes": 0, "transfers": 0, "failed": 0, "p_freed": True}, c["p_sent"]
    assert c["z_blocks_overwritten_by_p"] == 0 and c["z_blocks_intact_after"] == c["z_blocks"]
    # P counted the cancel; when D's connection for the pull had closed by then, also the pull's
    # requester as lost (as in the policy fail case; seen once here in a loaded whole-file run)
    assert c["p_failures"].get("p_cancelled") == 1 and set(c["p_failures"]) <= {"p_cancelled", "p_requester_lost"}, \
        c["p_failures"]
    assert z["final_status"] == "FINISHED_LENGTH_CAPPED"
    assert set(c["node"]["failures"]) == {"timeout"}  # how many: see the count test below


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_upstream_like_prefill_setup_loads_fail_at_the_deadline_and_cancels_go_unanswered(inproc) -> None:
    """Premises of the next test (stand-in P engines that answer neither the pull nor the cancel in
    time)."""
    c = _case(inproc, "upstream_p_holds_blocks")
    _node_clean(c["node"])
    for k, x in c["x"].items():
        _failed_once(x, RELEASED_LATER)
        assert c["deadline_s"] <= c["failed_at_s"][k] <= c["deadline_s"] + 1.0, c["failed_at_s"]
        assert c["cancels_while_held"][k] >= 1, k  # D asked P to cancel; P did not acknowledge
        assert c["p"][k]["pulls"] == [1] and c["p"][k]["cancel_answered_pulls"] == [0], k
    assert c["y"]["final_status"] == "FINISHED_LENGTH_CAPPED"
    assert c["held"]["watched_past_deadline_s"] >= c["hold_s"]
    assert c["node"]["bound_s"] >= 60 > c["hold_s"] + 5  # upstream's bound is far past what was watched
    assert c["node"]["failures"] == {"timeout": 2} and c["node"]["failed_recvs"] == 2


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_blocks_of_a_load_an_upstream_like_prefill_may_still_write_stay_held_until_it_answers(inproc) -> None:
    c = _case(inproc, "upstream_p_holds_blocks")
    held = c["held"]
    # HOLD_S past the deadline: nothing freed or released, the third request never scheduled
    assert held["free_blocks_seen"] == [0] and held["x_in_scheduler"], held
    assert held["releases"] == {"error": 0, "mute": 0}, held
    assert held["y_statuses"] == ["WAITING"] and not held["y_scheduled"], held
    # P's late answer (FINISH err_reqs) settles the pull: released at once (at most one cancel round)
    assert c["late_answer_sent"] == {"error": True, "mute": True}
    for k, dt in c["freed_after_answer_s"].items():
        assert dt is not None and 0 <= dt < 2.0, (k, dt)
    assert c["y_scheduled_after_release"]
    assert c["y_reuses_x_blocks"]["error"] == c["y_blocks"] > 0


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_policy_recompute_holds_a_failed_load_unreported_until_prefill_answers_the_cancel(inproc) -> None:
    c = _case(inproc, "recompute_settles")
    _node_clean(c["node"])
    req, p = c["req"], c["p"]
    assert p["pulls"] == [1] and p["reply_order"] == []  # P never answered the pull itself
    # D's first cancel (at the pull's own end, past the deadline) went unanswered; the second, 2 s
    # later, was acknowledged; the failure reached the scheduler only after that
    assert p["cancels"] == [2] and p["cancel_answered_pulls"] == [1]
    assert c["cancel_at_s"][0] >= c["deadline_s"]
    assert c["cancel_answered_after_s"] >= c["cancel_at_s"][0] + 1.0
    assert c["at_report"] == {"cancels": 2, "cancel_answered": True}
    assert c["reported_after_s"] >= c["cancel_answered_after_s"]
    assert req["reports"] == ["failed+recv"], req  # once, the failure and finished_recving together
    # until then it waited (blocks held, nothing reported); then it recomputed its whole prompt
    assert [s for s, _ in req["statuses"]] == ["WAITING_FOR_REMOTE_KVS", "RUNNING"], req["statuses"]
    assert c["next"] == {"status": "RUNNING", "scheduled": req["prompt_tokens"]}
    assert c["blocks_refilled"] == c["blocks"] == req["blocks"] > 0
    assert req["final_status"] == "FINISHED_LENGTH_CAPPED"
    assert set(c["node"]["failures"]) == {"timeout"}  # how many: see below


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_policy_recompute_counts_a_failed_load_once(inproc) -> None:
    """A timeout held until settlement (policy recompute) is counted once: when the pull timed out;
    the ledger gets it at settlement under ``settled_timeout``, which is not counted again."""
    for node in (_case(inproc, "recompute_settles")["node"], _late(inproc, "recompute")["node"]):
        assert node["failures"] == {"timeout": 1}, node["failures"]
        assert node["failed_recvs"] == 1


# ---------------------------------------------------------------- D's cancel as P's prefill ends

@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_cancel_that_meets_the_woken_pull_still_frees_the_prefills_blocks(inproc) -> None:
    """Found on CI (pd-abort-all-under-load: P held one block after the run, past its abort
    timeout): D's cancel handled in the same turn of P's sender loop as the end of P's prefill,
    after it woke D's waiting pull and before that pull ran. The pull answers the request aborted
    and P sends nothing; P frees the request's blocks (before the fix it forgot the transfer and
    kept them for good)."""
    c = _case(inproc, "cancel_as_prefill_ends")
    _node_clean(c["node"])
    assert c["pull_was_waiting"] and c["acked"], c  # the premises: the race as described
    assert c["p_transfers"] == 0  # P wrote nothing into D's blocks
    assert c["p_freed"] and not c["p_still_tracks"], c
    assert c["p_failures"] == {"p_cancelled": 1}, c["p_failures"]
    # D: the load ended in an error (P answered the request aborted), its blocks back at once
    assert c["x"]["reports"] == ["failed+released"] and c["x"]["final_status"] == "FINISHED_ERROR", c["x"]
    _effects(c["x"])


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_blocks_of_a_cancelled_transfer_whose_record_is_gone_are_freed_and_the_batch_goes_on(inproc) -> None:
    """Found by review: a cancel while P computes drops P's entry; 4096 later terminal transfers
    push its record out; then P's prefill ends, in one batch with another request's. Before the
    fix upstream's record_send_reqs raised KeyError on it: its blocks and the rest of the batch
    were held for good (the other request never became ready)."""
    c = _case(inproc, "cancel_record_gone")
    assert c["acked"] and not c["tracked_after_cancel"] and c["record_gone"], c  # the premises
    assert c["x_freed"] and c["x_late_pull_answer"] == "cancelled", c
    assert c["y_ready"] and not c["y_freed"], c  # the other request waits for its pull, as normal
    assert c["p_failures"] == {"p_cancelled": 2, "p_forgotten_freed": 1}, c["p_failures"]  # x's, then z's below
    # a cancel for a transfer a pull is still counted for (no entry left) waits for that pull
    assert c["busy_acked"] == [] and c["idle_acked"] == ["z-busy"], c


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_load_given_up_while_its_bootstrap_query_is_out_is_never_pulled(inproc) -> None:
    """Issue 30, item 1: P's engine not known yet, the pull waits for the bootstrap query; the
    client aborts (or the 300 ms deadline passes) meanwhile. Nothing was sent to P, so D frees the
    blocks at once, and when the query answers, no pull names them (before the fix: P got a pull
    for the 3 freed blocks in both cases, measured)."""
    c = _case(inproc, "bootstrap_gap")
    for how in ("abort", "deadline"):
        part = c[how]
        _node_clean(part["node"])
        assert part["queries"] == 1
        assert part["freed_while_query_out"] is True, how
        assert part["p"]["pulls"] == [0] and part["p"]["asked_blocks"] == [[]], (how, part["p"])
        assert part["node"]["failures"].get("pull_dropped") == 1, (how, part["node"]["failures"])
        # issue 43, 7b: P is told at once (one cancel naming the transfer), not left to keep the
        # prompt's blocks for its abort timeout (480 s); this test asserted "no message to P" before,
        # which locked the defect in (on 940310a: cancels [0])
        assert part["p"]["cancels"] == [1] and part["p"]["cancel_sizes"] == [[1]], (how, part["p"])
        _effects(part["req"])
    assert c["abort"]["req"]["reports"] == ["released"] and c["abort"]["req"]["final_status"] == "FINISHED_ABORTED"
    _failed_once(c["deadline"]["req"], SETTLED_AT_ONCE)


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_aborting_one_request_of_a_pull_leaves_its_sibling_to_complete(inproc) -> None:
    """Issue 30, item 2: two requests in one pull, one aborted: D's cancel names only that one,
    and the other completes on P's answer (before the fix: the cancel named both, the hardened P
    acknowledged both, and the sibling waited in WAITING_FOR_REMOTE_KVS for its deadline)."""
    c = _case(inproc, "abort_one_of_a_pull")
    _node_clean(c["node"])
    assert c["p"]["pulls"] == [1] and c["p"]["asked_blocks"] == [[3, 3]]  # one pull carried both
    assert c["p"]["cancel_sizes"] == [[1]], c["p"]
    assert c["a_freed"] is True and c["aborted"]["reports"] == ["released"]
    assert c["sibling"]["reports"] == ["ok"] and c["sibling"]["final_status"] == "FINISHED_LENGTH_CAPPED", c["sibling"]
    assert c["node"]["failures"] == {} and c["node"]["failed_recvs"] == 0


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_pull_queued_past_a_lost_cancel_record_never_writes(inproc) -> None:
    """Issue 30, item 10: D's pull waits in the real P's queue (every sender task busy), D cancels,
    P acknowledges and D frees the blocks, an abort storm pushes the record out, then the pull is
    served and P's prefill ends. Before the fix P wrote 589,824 bytes into the freed blocks; now the
    pull is answered as expired and P frees its own blocks."""
    c = _case(inproc, "queued_pull_after_record_gone")
    assert c["queued"] and c["acked"] and c["freed_on_ack"] and c["record_gone"], c
    assert c["sent"] == {"bytes": 0, "transfers": 0, "failed": 0, "p_freed": True}, c["sent"]
    assert c["p_failures"].get("queued_pull_expired") == 1, c["p_failures"]


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_failed_load_reaches_the_client_at_its_deadline_under_tp2_with_hma(inproc) -> None:
    """Issue 30, item 6: a TP 2 engine (vLLM's KVOutputAggregator over its workers' outputs) whose
    model reports failed loads by request (HMA), pulling from a frozen P, load deadline 1 s (the pull
    must reach P before it: issue 43, 7f).
    Upstream's aggregator forwards the failure only with every worker's finished_recving, which the
    hardened worker reports once P can no longer write (540 s for a frozen P): no error within 5 s.
    Patched (connector_patch/pd/patch_output_aggregator.py): the error at the deadline, the blocks
    still held; once P acknowledges D's cancel they go back."""
    c = _case(inproc, "hma_tp2")
    up, patched, acked = c["upstream_aggregator"], c["patched_aggregator"], c["patched_then_acknowledged"]
    assert up["error_after_s"] is None and up["req"]["reports"] == [] and not up["patched"], up
    for v in (patched, acked):
        assert v["patched"] and v["error_after_s"] is not None and v["error_after_s"] < v["deadline_s"] + 1.0, v
        assert v["blocks_held_at_error"], v
        assert v["req"]["report_effects"][0] == {"report": "failed", "in_scheduler_after": True,
                                                 "own_blocks": 3, "own_freed": 0}, v["req"]
    assert not patched["freed_at_end"]  # a frozen P: held (upstream's bound, 540 s)
    assert acked["req"]["reports"] == ["failed", "released"] and acked["freed_at_end"], acked


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_p_never_writes_for_a_pull_whose_connection_dropped(inproc) -> None:
    """Issue 30, item 4: D's pull waits at the real hardened P (still computing the prompt) when the
    link between them goes down as under a REJECT rule (toxiproxy disabled: the connection closed,
    reconnects refused) for longer than D's heartbeat timeout. D reads P as gone, fails the request
    and frees its blocks; Y runs on them. The link heals, P's prefill ends. Before the fix P wrote
    589,824 bytes into Y's 3 blocks; now it writes nothing, frees its own blocks and counts it. (How
    soon P sees a link that refuses only one way: test_pd_side_channel_netns.py.)"""
    from faults.toxiproxy import find_binary

    if find_binary() is None:
        pytest.skip("toxiproxy-server is not installed here: run `pdchaos setup`")
    c = _case(inproc, "requester_lost")
    assert c["waiting"] and c["x_freed"], c
    assert c["x"]["final_status"] == "FINISHED_ERROR", c["x"]
    assert c["x_done_after_s"] < 5.0, c  # D read P as gone: no deadline was waited for
    assert c["y_reuses_x_blocks"] == c["y_blocks"] > 0, c
    assert c["y_blocks_overwritten_by_p"] == 0 and c["y_blocks_intact"] == c["y_blocks"], c
    assert c["sent"] == {"bytes": 0, "transfers": 0, "failed": 0, "p_freed": True}, c["sent"]
    assert c["p_failures"].get("p_requester_lost") == 1 and not c["p_may_write"], c


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_p_keeps_an_eos_answered_prompt_only_for_its_hold(inproc) -> None:
    """Issue 30, item 9: P's one token was EOS and no D pulls the prompt. The real hardened P (its
    scheduler connector, then its worker) keeps the blocks eos_hold_ms (1 s here), then frees them
    (before the fix: for the abort timeout, 480 s by default); a D pulling later gets its error at
    once, from P's "expired" record. The LENGTH_CAPPED prompt of the same step keeps upstream's hold."""
    c = _case(inproc, "eos_hold")
    hold = c["hold_ms"] / 1000
    assert c["eos_delayed"] is True and c["capped_delayed"] is True, c
    assert c["eos_freed_after_s"] is not None and hold <= c["eos_freed_after_s"] < hold + 2.0, c
    assert c["eos_record"] == "expired", c
    assert not c["capped_freed"] and c["capped_may_write"], c
    _node_clean(c["node"])
    _failed_once(c["late_req"], SETTLED_AT_ONCE)
    assert c["late_pull_s"] < 5.0, c


# --------------------------------------------------------------------------- issue 43, item 7
# Each failed on 940310a (the commit before its fix), measured: see docs/interleavings.md.

@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_repeated_ok_from_one_prefill_rank_does_not_complete_a_load_from_two(inproc) -> None:
    """7e: a load pulled from 2 P ranks; rank 0 says OK twice (CONTINUE, then FINISH), rank 1 has
    not written yet. The load completes only on rank 1's OK (on 940310a: reported OK and the
    request ran to FINISHED_LENGTH_CAPPED on blocks rank 1 had not written)."""
    c = _case(inproc, "repeated_ok")
    _node_clean(c["node"])
    assert c["before_rank1"] == {"reports": [], "status": "WAITING_FOR_REMOTE_KVS", "scheduled": False}, c
    assert c["p"]["pulls"] == [1, 1] and c["p"]["reply_order"] == [0, 1], c["p"]
    assert c["req"]["reports"] == ["ok"] and c["req"]["final_status"] == "FINISHED_LENGTH_CAPPED", c["req"]


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_load_that_succeeded_is_never_cancelled_while_its_sibling_waits(inproc) -> None:
    """7d: two requests in one pull; the first is answered OK and runs to its end while P has not
    answered the second. D sends P no cancel for the first (on 940310a: 2 cancel rounds, each on a
    new connection, within 2.5 s of its end), and the second completes on P's answer."""
    c = _case(inproc, "ok_sibling_cancels")
    _node_clean(c["node"])
    assert c["a_done"] and c["first"]["reports"] == ["ok"], c["first"]
    assert c["cancels_while_sibling_waits"] == 0 and c["p"]["cancels"] == [0], c["p"]
    assert c["sibling"]["reports"] == ["ok"] and c["sibling"]["final_status"] == "FINISHED_LENGTH_CAPPED", c


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_pull_that_never_connected_frees_its_blocks_at_the_deadline(inproc) -> None:
    """7f: P's side channel is blackholed (SYNs dropped: no connection, no refusal). At the 300 ms
    deadline P provably never got the pull: the error then, the blocks back at the pull's own
    deadline (0.25 s after the load's) (on 940310a: the error at 0.3 s, the blocks still held 4 s
    later, to be held to the bound, 540 s; measured after the fix: freed at 0.59 s)."""
    c = _case(inproc, "never_connected")
    assert c["error_after_s"] is not None and c["error_after_s"] < 1.5, c
    assert c["freed_after_s"] is not None and c["freed_after_s"] < 1.5, c
    assert c["req"]["reports"] == RELEASED_LATER and c["req"]["final_status"] == "FINISHED_ERROR", c["req"]
    assert c["failures"].get("timeout") == 1 and c["failures"].get("pull_never_connected") == 1, c


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_prefill_answers_after_a_thousand_idle_connections(inproc) -> None:
    """7c: 1200 connections open and close on the real hardened P's side channel, then D sends a
    cancel. P reads its side channel's monitor as events come, so it accepts them all and answers
    (on 940310a: from the 1103rd on every connection timed out, libzmq's I/O thread blocked on
    ~2200 unread monitor events, and the cancel got no answer within 3 s)."""
    c = _case(inproc, "monitor_backlog")
    assert c["connections"] == 1200, c
    assert c["answered"] and c["reply"] == {"cancelled": ["x-nobody"]}, c


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_p_never_writes_into_blocks_d_freed_while_its_write_was_in_flight(inproc) -> None:
    """7a: the real hardened P starts a 3 s write for D's pull (a slow link: the bytes land as they
    go); right after, the side-channel link (only it) goes down as under a REJECT rule. D fails X
    at once (the connection lost: the client's error) and frees its 3 blocks only once P's write
    has ended: P sees the connection drop (toxiproxy closes it here; under a REJECT rule its
    keepalive, ~0.9 s) and cuts the write at its next chunk, and D holds a pull P got for a fence
    after the first refusal. Y then runs on X's blocks, untouched. Measured: the error at 0.12 s,
    the write cut at 0.34 s (one 64 KiB chunk of 576 KiB), the blocks freed at 3.12 s. (On
    7d48c02..29d2a5d: D freed the blocks at 1.68 s, Y ran on them, P's write, one call in the
    executor, ran on to 3.02 s and overwrote all 3 of Y's blocks.)"""
    from faults.toxiproxy import find_binary

    if find_binary() is None:
        pytest.skip("toxiproxy-server is not installed here: run `pdchaos setup`")
    c = _case(inproc, "write_in_flight")
    assert c["write_started"] and c["write_ended"] and c["x_freed"], c
    # bounded return: the error at the loss, well before the blocks (the fence holds only those)
    assert c["x_error_after_s"] < 2.0 and c["x_error_after_s"] + 1.0 < c["x_freed_after_s"], c
    assert c["x_freed_after_write_ended"], c  # only the blocks waited
    assert c["write_ret"] == -1001 and 0 < c["written_bytes"] < c["write_bytes"], c  # cut, not finished
    assert c["write_ended_after_cut_s"] < 2.5, c  # P's keepalive (~0.9 s) and one chunk (~0.1 s)
    assert c["p_failures"].get("p_write_cut") == 1 and c["p_failures"].get("p_requester_lost") == 1, c
    assert c["y_reuses_x_blocks"] == c["y_blocks"] > 0 and c["y_blocks_intact_before"] == c["y_blocks"], c
    assert c["y_blocks_overwritten_by_p"] == 0 and c["y_blocks_intact"] == c["y_blocks"], c


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_p_shutting_down_never_writes_after_its_context_is_gone(inproc) -> None:
    """7a, P's shutdown: the real hardened P is 0.3 s into a 3 s write when its worker shuts down.
    Upstream's shutdown terminates the ZMQ context first (the side channel closes: D may read P as
    gone) and leaves the executor writing (on 29d2a5d: the context terminated at once, the write
    ended 2.71 s later, every byte written). The hardened one cuts the write before its next chunk
    and waits for it before the context goes (measured: both 0.05 s after the shutdown began, one
    64 KiB chunk of 576 KiB written). Upstream's term() itself then blocks (its asyncio listener
    never sees ContextTerminated), before and after the fix: not asserted here."""
    c = _case(inproc, "shutdown_while_writing")
    assert c["write_started"] and c["write_ended"], c
    assert c["context_terminated_after_s"] is not None and not c["wrote_after_context_gone"], c
    assert c["write_ret"] == -1001 and 0 < c["written_bytes"] < c["write_bytes"], c
    assert c["write_ended_after_shutdown_s"] < 1.5 and c["context_terminated_after_s"] < 2.5, c
    assert c["p_failures"].get("p_write_cut") == 1, c


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_sixty_pulls_held_open_to_a_silent_peer_cost_little_cpu(inproc) -> None:
    """7h, the connector's share, measured: 60 pulls (one request each) to a silent peer fail at
    their 1 s deadline and stay open (P may still write): their polls and cancel rounds (120 in the
    8 s window) cost D's threads 0.035 of a core here (busiest thread 0.011), nothing stepping. The
    0.54 of a core measured on real nodes after such a burst is not the held pulls' own work."""
    c = _case(inproc, "held_pulls_cpu")
    assert c["pulls"] == 60 and c["failed"] == 60 and c["held_blocks"] == 120, c
    assert c["cancel_rounds_in_window"] > 0, c  # the pulls were held open, asking P to cancel
    assert c["cores"] < 0.15, c


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_the_write_after_free_watcher_sees_a_write_into_blocks_reassigned_at_once(inproc) -> None:
    """7a's watcher half: the same interleaving with both halves of 7a's fix switched off for the
    case (P's write never cut, D's fence 0: the defect as it was), so P's write lands in Y's blocks.
    The P/D write-after-free watcher (the real pdchaos_waf.Watcher, stepped as the decode worker
    steps it) sees it although X's 3 blocks went to Y at once (no poison can stay there): it
    compares them between steps, when nothing of vLLM writes KV. Before, those blocks counted
    freed_handed_out_at_once and nothing watched them. With the fix, the same watcher counts no
    late write."""
    from faults.toxiproxy import find_binary

    if find_binary() is None:
        pytest.skip("toxiproxy-server is not installed here: run `pdchaos setup`")
    c = _case(inproc, "write_in_flight_unfixed")
    assert not c["x_freed_after_write_ended"] and c["written_bytes"] == c["write_bytes"], c  # the defect
    assert c["y_blocks_intact_before"] == c["y_blocks"] == 3 and c["y_blocks_intact"] == 0, c  # all 3 hit
    waf = c["waf"]
    assert waf["errors"] == 0 and waf["tensors"] == 2, waf
    assert waf["freed_handed_out_at_once"] == waf["reassigned_watched"] == c["y_blocks"] == 3, waf
    assert waf["late_writes_reassigned"] == waf["late_writes"] == 3, (waf, c)
    fixed = _case(inproc, "write_in_flight")["waf"]
    assert fixed["errors"] == 0 and fixed["reassigned_watched"] == 3 and fixed["late_writes"] == 0, fixed
