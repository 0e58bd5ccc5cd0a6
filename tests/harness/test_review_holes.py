"""Holes a review found by forging saved histories (issue 30), each now refused: a trigger that
counts requests sent after the fault acted, or one after another as if at once; a record time
that is not a number; a damaged journal line in the middle of a history."""

from __future__ import annotations

import json
import math

from harness import checks as C
from harness.triggers import ops_in_window
from nodekit import journal as J

T0 = 100.0


def records(ops: list[tuple[int, float, float | None]], acted: float | None = 2.05) -> list[dict]:
    out: list[dict] = [{"type": "meta", "family": "toy", "t0": T0, "primary_ops": ["complete"]},
                       {"type": "fault", "id": 0, "name": "kill", "phase": "start", "t": T0 + 2.0},
                       {"type": "fault", "id": 0, "name": "kill", "phase": "stop", "t": T0 + 40.0}]
    if acted is not None:
        out.append({"type": "event", "what": "fault_started", "id": 0, "t": T0 + acted})
    for i, a, b in ops:
        out.append({"type": "op", "id": i, "process": i, "f": "complete", "phase": "invoke", "t": T0 + a})
        if b is not None:
            out.append({"type": "op", "id": i, "process": i, "f": "complete", "phase": "ok", "t": T0 + b})
    return out


def fired(recs: list[dict], **params) -> tuple[bool, str]:
    f = ops_in_window(C.CheckInput(recs), {"fault": 0, "min": 1, **params})
    return f.fired, f.evidence


def test_a_request_sent_after_the_kill_is_not_the_one_the_kill_caught() -> None:
    caught = records([(1, 1.5, 3.0)])
    later = records([(2, 5.0, 6.0), (3, 7.0, 8.0)])
    assert fired(caught, at_start=True)[0] is True
    assert fired(later)[0] is True  # in the window ...
    assert fired(later, at_start=True)[0] is False  # ... but none in flight when it acted


def test_one_that_ended_between_the_start_record_and_the_act_does_not_count() -> None:
    assert fired(records([(1, 1.5, 2.01)]))[0] is False  # ended before the fault had acted (2.05)
    assert fired(records([(1, 1.5, 3.0)], acted=None))[0] is False  # no record of when it acted


def test_at_once_needs_them_together() -> None:
    one_by_one = records([(i, 3.0 + i, 3.5 + i) for i in range(5)])
    together = records([(i, 3.0, 5.0) for i in range(5)])
    assert fired(one_by_one, min=5)[0] is True
    ok, msg = fired(one_by_one, min=5, at_once=True)
    assert ok is False and "at most 1" in msg
    assert fired(together, min=5, at_once=True)[0] is True


def test_a_record_time_that_is_not_a_number_is_a_broken_history() -> None:
    recs = records([(1, 1.0, 1.1)]) + [{"type": "end", "t": T0 + 50}]
    recs[-2]["t"] = math.nan  # the op's completion
    r = C.CHECKS["harness_integrity"](C.CheckInput(recs), {})
    assert r.ok is False and "not a finite number" in r.message
    assert C.op_elapsed_ms({"elapsed_ms": 150.0, "t_invoke": T0, "t_complete": math.nan}) == math.inf



def test_a_record_after_the_end_record_is_a_broken_history() -> None:
    """Found by a helper handed an attach run's journal: a final probe moved 1000 s past the end read
    as expected; a history whose records outlive its own end record is not one run's."""
    recs = records([(1, 1.0, 1.1)]) + [{"type": "end", "t": T0 + 50}]
    assert "end record" not in C.CHECKS["harness_integrity"](C.CheckInput(recs), {}).message
    late = recs + [{"type": "probe", "node": "decode:0", "when": "final", "pid": 1, "t": T0 + 1050}]
    r = C.CHECKS["harness_integrity"](C.CheckInput(late), {})
    assert r.ok is False and "after the run's end record" in r.message

def test_an_unreadable_line_mid_journal_is_kept_as_an_event(tmp_path) -> None:
    p = tmp_path / "journal.jsonl"
    lines = [json.dumps({"type": "meta"}), '{"type": "event", "what": "fault_er', json.dumps({"type": "end"}),
             '{"type": "op", "id"']  # a damaged line inside, a torn one last
    p.write_text("\n".join(lines) + "\n")
    recs = J.read_journal(p)
    assert [r.get("what") for r in recs if r.get("type") == "event"] == ["journal_line_unreadable"]
    assert recs[1] == {"type": "event", "what": "journal_line_unreadable", "line": 2}
    assert recs[-1] == {"type": "end"}  # the torn last line is just skipped
    assert "journal_line_unreadable" in C.HARNESS_PROBLEMS
