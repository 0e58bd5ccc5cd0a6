"""The hardened layerwise connector's pure rules (connector_patch/layerwise): no vllm, torch or zmq."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from connector_patch.layerwise import (ACK, DONE, FAILED, GET_META, NACK_FIELDS, NACK_MALFORMED, NACK_UNKNOWN,
                                       Message, RecvDeadlines, classify, post_failure)


@pytest.mark.parametrize("msg, want", [
    ((GET_META, "r1"), Message("get_meta", "r1")),
    ((GET_META,), Message("get_meta", "")),
    ((DONE, "r1", 1, "127.0.0.1:5000"), Message("done", "r1", 1, "127.0.0.1:5000")),
    ([DONE, b"r1", 2, b"h:1"], Message("done", "r1", 2, "h:1")),
    ((FAILED, "r1", 1, "h:1"), Message("failed", "r1", 1, "h:1")),
    ((FAILED, "r1", 2, "h:1"), Message("failed", "r1", 2, "h:1")),
    ((FAILED, "r1", 0, "h:1"), Message("failed", "r1")),  # no usable count: upstream's FAILED
    ((FAILED, "r1"), Message("failed", "r1")),
    (("done_sending_msg", "r1", 1, "h:1"), Message("done", "r1", 1, "h:1")),
])
def test_classify_accepts_the_wire_messages(msg, want):
    assert classify(msg) == want


@pytest.mark.parametrize("msg, code", [
    (7, NACK_MALFORMED),
    ((), NACK_MALFORMED),
    ("done_sending_msg", NACK_MALFORMED),
    ((42, "r1"), NACK_MALFORMED),
    ((b"bogus_msg", "x"), NACK_UNKNOWN),
    ((DONE, "x"), NACK_FIELDS),
    ((DONE,), NACK_FIELDS),
    ((DONE, "x", 0, "h:1"), NACK_FIELDS),
    ((DONE, "x", True, "h:1"), NACK_FIELDS),
    ((DONE, "x", "1", "h:1"), NACK_FIELDS),
    ((DONE, "x", 1), NACK_FIELDS),
    ((DONE, "x", 1, 5), NACK_FIELDS),
    ((FAILED,), NACK_FIELDS),
    ((FAILED, 3), NACK_FIELDS),
    ((DONE, b"\xff\xfe", 1, "h:1"), NACK_FIELDS),
])
def test_classify_names_what_is_wrong(msg, code):
    assert classify(msg) == code


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_deadlines_expire_once_and_settle_once():
    c = Clock()
    d = RecvDeadlines(2.0, clock=c)
    d.expect("a")
    d.expect("b")
    assert d.pending() == 2 and d.waiting("a")
    c.t += 1.0
    assert d.expired() == []
    assert d.settle("a") is True
    assert d.settle("a") is False  # a duplicate completion
    c.t += 1.5
    assert d.expired() == ["b"]
    assert d.expired() == []
    assert d.settle("b") is False  # a late completion after D failed it
    assert d.pending() == 0


def test_deadlines_remember_a_bounded_number():
    d = RecvDeadlines(1.0, remember=3)
    for i in range(10):
        d.expect(str(i))
        d.settle(str(i))
    assert len(d._gone) == 3


def test_deadlines_refuse_a_non_positive_timeout():
    with pytest.raises(ValueError):
        RecvDeadlines(0)


@pytest.mark.parametrize("status, error, why", [
    (200, None, None), (204, None, None), (500, None, "http 500"), (404, None, "http 404"),
    (None, None, "no answer"), (None, "ReadTimeout", "ReadTimeout"), (200, "ConnectError", "ConnectError"),
])
def test_post_failure(status, error, why):
    assert post_failure(status, error) == why


def test_ack_and_nacks_are_distinct_bytes():
    codes = [ACK, NACK_MALFORMED, NACK_UNKNOWN, NACK_FIELDS]
    assert len(set(codes)) == 4 and all(isinstance(c, bytes) for c in codes)


def test_rules_import_neither_vllm_nor_torch_nor_zmq():
    folder = Path(__file__).resolve().parents[2] / "connector_patch" / "layerwise"
    for path in folder.glob("*.py"):
        if path.name == "ascend_connector.py":  # the vllm-ascend subclass that applies the rules
            continue
        tree = ast.parse(path.read_text())
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not names & {"vllm", "vllm_ascend", "torch", "zmq", "msgspec", "httpx"}, path.name


def test_deadlines_know_what_is_gone():
    d = RecvDeadlines(1.0)
    assert not d.gone("a")
    d.expect("a")
    assert not d.gone("a")
    d.settle("a")
    assert d.gone("a")
    d.expect("a")  # expected again (a retried request): no longer gone
    assert not d.gone("a") and d.waiting("a")


def test_a_hold_ends_at_ps_last_word_or_at_the_write_by_time_plus_the_grace():
    """Issue 21: the blocks of a request D failed itself stay D's until P cannot write them."""
    from connector_patch.layerwise.rules import Holds

    now = [100.0]
    h = Holds(3.0, clock=lambda: now[0])
    h.hold("a", 101.0)  # its deadline ahead (a failed POST): held until 104
    h.hold("b", None)  # its deadline passed now: held until 103
    h.hold("c", 100.0)
    assert h.held() == 3 and h.take_released() == []
    assert h.word("c", 2, "p1:1") is False and h.word("c", 2, "p1:1") is False  # the same sender twice
    assert h.word("c", 2, "p2:1") is True and h.take_released() == ["c"]  # every sender said DONE
    assert h.word("x", None) is False  # not held: nothing to end
    now[0] = 103.0
    assert h.take_released() == ["b"] and h.holding("a")
    assert h.word("a", None) is True and h.take_released() == ["a"] and h.held() == 0  # FAILED
    assert h.take_released() == [] and h.counters == {"held": 3, "released_by_word": 2, "released_by_time": 1}
    with pytest.raises(ValueError):
        Holds(0)


@pytest.mark.parametrize("write_by, now, past", [
    (100.0, 100.5, True), (100.0, 99.5, False), (100, 100.0, False), (None, 1e12, False), ("100", 1e12, False),
    (True, 1e12, False),
])
def test_past_write_by(write_by, now, past):
    from connector_patch.layerwise.rules import past_write_by

    assert past_write_by(write_by, now) is past
