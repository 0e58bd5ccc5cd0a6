"""The pure rule of connector_patch/pd/patch_output_aggregator.py (no vLLM): a failed load is
due once every worker has reported the request failed or finished, in any order."""

from __future__ import annotations

from connector_patch.pd.patch_output_aggregator import EarlyFailures


def test_due_once_every_worker_failed_or_finished() -> None:
    e = EarlyFailures()
    e.seen(0, {"a"}, None)
    assert e.due({"a"}, 2) == set()  # worker 1 has said nothing yet
    e.seen(1, None, {"a"})  # worker 1 finished it (its part loaded): both have spoken
    assert e.due({"a"}, 2) == {"a"}


def test_a_worker_that_finished_before_another_failed_counts() -> None:
    e = EarlyFailures()
    e.seen(1, None, {"b"})
    e.seen(0, {"b"}, None)
    assert e.due({"b"}, 2) == {"b"}
    assert e.due({"b"}, 3) == set()  # a third worker has not spoken


def test_one_worker_reporting_twice_is_one_worker() -> None:
    e = EarlyFailures()
    e.seen(0, {"c"}, None)
    e.seen(0, None, {"c"})
    assert e.due({"c"}, 2) == set()


def test_forget_ends_a_request() -> None:
    e = EarlyFailures()
    e.seen(0, {"d"}, {"e"})
    e.forget({"d", "e"})
    assert e.reported == {}
