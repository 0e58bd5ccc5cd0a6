"""Verdicts and expectations (harness/verdicts.py, harness/schema.py): an expectation names the
checks that must fail; a run whose failing set differs deviates and says how; a run the harness
could not judge is an error that no expectation matches; no target runs without an expectation."""

from __future__ import annotations

import textwrap

import pytest

from harness import verdicts as V
from harness.checks import CheckResult, run_checks
from harness.errors import UsageError
from harness.schema import load_scenario

pytestmark = pytest.mark.timeout(20)


def _res(**oks) -> list[CheckResult]:
    return [CheckResult(n, ok, "msg") for n, ok in oks.items()]


def test_text_round_trip():
    for text in ("pass", "fail[no_busy_wait]", "fail[a,b,c?]|stall[bounded_return,no_stall]"):
        assert V.text(V.parse(text)) == text
    assert V.parse("") == [V.Alternative("pass", frozenset())]
    assert V.parse("fail|stall") == [V.Alternative("fail", None), V.Alternative("stall", None)]


def test_expected_fail_is_met_only_by_the_failure_it_claims():
    exp = "fail[no_busy_wait]"
    assert V.outcome("fail", exp, ["no_busy_wait"]) == "as_expected"
    assert V.outcome("fail", exp, ["fail_fast"]) == "deviation"  # another failure
    assert V.outcome("fail", exp, ["fail_fast", "no_busy_wait"]) == "deviation"  # more than claimed
    assert V.outcome("pass", exp, []) == "deviation"
    assert V.outcome("pass", "pass", []) == "as_expected"
    assert V.outcome("fail", "pass", ["recovery"]) == "deviation"


def test_may_fail_bounds_the_set_both_ways():
    exp = "fail[recovery,bounded_return?]"
    assert V.outcome("fail", exp, ["recovery"]) == "as_expected"
    assert V.outcome("fail", exp, ["bounded_return", "recovery"]) == "as_expected"
    assert V.outcome("fail", exp, ["bounded_return"]) == "deviation"  # the required one held
    assert V.outcome("fail", exp, ["recovery", "no_leaks"]) == "deviation"


def test_alternatives_and_old_unnamed_expectations():
    exp = "fail[recovery]|stall[bounded_return,no_stall]"
    assert V.outcome("stall", exp, ["bounded_return", "no_stall"]) == "as_expected"
    assert V.outcome("stall", exp, ["no_stall"]) == "deviation"
    # a journal saved before expectations named checks: any failing set of that verdict
    assert V.outcome("fail", "fail|stall", ["anything"]) == "as_expected"


def test_error_verdicts_never_match():
    for check in V.ERROR_CHECKS:
        verdict, failing = V.of_results(_res(**{check: False, "recovery": True}))
        assert verdict == "error" and failing == [check]
        assert V.outcome(verdict, "fail[" + check + "]", failing) == "error"
    raised = [CheckResult("recovery", False, V.RAISED + "KeyError: 'x'")]
    assert V.of_results(raised)[0] == "error"
    assert V.of_results(_res(no_stall=False, recovery=False)) == ("stall", ["no_stall", "recovery"])
    assert V.of_results(_res(no_stall=True, recovery=None)) == ("pass", [])


def test_a_raising_checker_is_an_error_not_a_fail():
    def boom(inp, opts):  # noqa: ARG001
        raise RuntimeError("bug")

    results = run_checks(object(), {}, {"mine": boom})
    assert V.of_results(results)[0] == "error"


def test_difference_names_the_checks():
    msg = V.difference("fail", "fail[no_busy_wait]", ["fail_fast"])
    assert "fail_fast failed unexpectedly" in msg and "no_busy_wait did not fail" in msg
    assert "expected fail[no_busy_wait]" in msg
    assert "verdict pass, not fail" in V.difference("pass", "fail[x]", []) or "x did not fail" in \
        V.difference("pass", "fail[x]", [])
    assert V.words("fail[a,b?]|stall[no_stall]") == "fail (failing: a; may fail: b) or stall (failing: no_stall)"


SCENARIO = """\
name: t-expect
family: lookup
seed: 1
targets: [hardened, legacy]
workload: {{duration: 3s, concurrency: 1, rate: 20}}
faults:
  - {{type: slow_peer, at: 1s, for: 0.5s, delay: 500ms}}
triggers: [{{type: ops_in_window, fault: 0}}]
{checks}
expect:
{expect}
"""


def _load(tmp_path, expect: str, checks: str = ""):
    p = tmp_path / "s.yaml"
    p.write_text(SCENARIO.format(expect=textwrap.indent(expect, "  "), checks=checks))
    return load_scenario(p)


def test_schema_accepts_named_expectations(tmp_path):
    sc = _load(tmp_path, "hardened: pass\nlegacy: [{verdict: fail, failing: [recovery], may_fail: [bounded_return]},"
                         " {verdict: stall, failing: [no_stall, recovery]}]")
    assert sc.model.expected("hardened") == "pass"
    assert sc.model.expected("legacy") == "fail[recovery,bounded_return?]|stall[no_stall,recovery]"


@pytest.mark.parametrize("expect, checks, words", [
    ("hardened: pass\nlegacy: fail", "", "a bare 'fail' does not say which checks fail"),
    ("hardened: pass\nlegacy: [pass, stall]", "", "a bare 'stall'"),
    ("hardened: pass", "", "no expectation for target(s) legacy"),
    ("hardened: pass\nlegacy: {verdict: stall, failing: [recovery]}", "", "must include no_stall"),
    ("hardened: pass\nlegacy: {verdict: fail, failing: []}", "", "verdict fail needs failing checks"),
    ("hardened: pass\nlegacy: {verdict: fail, failing: [no_stall]}", "", "verdict fail needs failing checks"),
    ("hardened: pass\nlegacy: {verdict: pass, failing: [recovery]}", "", "verdict pass with failing"),
    ("hardened: pass\nlegacy: {verdict: fail, failing: [harness_integrity]}", "", "harness error"),
    ("hardened: pass\nlegacy: {verdict: fail, failing: [no_such_check]}", "", "legacy"),
    ("hardened: pass\nlegacy: {verdict: fail, failing: [recovery], may_fail: [recovery]}", "", "both in failing"),
    ("hardened: pass\nlegacy: {verdict: fail, failing: [no_leaks]}", "checks: {no_leaks: {enabled: false}}",
     "disables"),
])
def test_schema_refuses_claims_that_name_nothing_or_cannot_hold(tmp_path, expect, checks, words):
    with pytest.raises(UsageError) as e:
        _load(tmp_path, expect, checks)
    assert words in str(e.value)
    assert "s.yaml" in str(e.value)  # names the file (and line)


def test_failures_explained_tail_option_widens_every_window():
    from harness.checks import CheckInput, failures_explained

    t0 = 100.0
    meta = {"type": "meta", "t0": t0, "faults": [{"id": 0, "type": "node_down", "explains": ["http_502"], "tail_s": 1.0}]}
    recs = [meta,
            {"type": "fault", "id": 0, "name": "node_down", "phase": "start", "t": t0 + 3},
            {"type": "fault", "id": 0, "name": "node_down", "phase": "stop", "t": t0 + 10},
            {"type": "op", "id": 1, "process": 0, "f": "complete", "phase": "invoke", "t": t0 + 12},
            {"type": "op", "id": 1, "process": 0, "f": "complete", "phase": "fail", "t": t0 + 12.1,
             "outcome": "http_502", "elapsed_ms": 100.0},
            {"type": "end", "t": t0 + 20}]
    inp = CheckInput(recs)
    r = failures_explained(inp, {})
    assert r.ok is False and "1 of 1 failed ops" in r.message  # 2 s after the heal, past the 1 s tail
    assert failures_explained(inp, {"tail_ms": 5000.0}).ok is True  # the scenario's measured tail
    assert failures_explained(inp, {"allow": ["http_502"]}).ok is True


@pytest.mark.parametrize("a,b,both", [
    ("pass", "pass", True),
    ("pass", "pass|fail[no_leaks]", True),  # the baseline may pass too: no gain can be shown
    ("pass", "fail[no_stall]", False),
    ("fail[no_busy_wait]", "fail[no_busy_wait,recovery?]", True),
    ("fail[no_busy_wait]", "fail[no_busy_wait,recovery]", False),
    ("fail[a,b?]", "fail[b,c?]", False),  # both need {a, b}, which the second does not allow (a)
    ("fail[a,b?]", "fail[b,a?]", True),  # {a, b} meets both
    ("stall[no_stall]", "fail[no_stall]", False),
    ("fail", "fail[no_stall]", True),  # an old-style set admits any
])
def test_overlap_is_whether_one_run_could_meet_both(a, b, both):
    assert V.overlap(a, b) is both
    assert V.overlap(b, a) is both


def test_mutate_claims_only_where_the_baseline_cannot_show_the_target_s_outcome(tmp_path):
    from harness.cli.mutate import claims

    sc = _load(tmp_path, "legacy: [pass, {verdict: fail, failing: [no_leaks]}]\nhardened: pass")
    assert claims([sc], "hardened") == []
    sc2 = _load(tmp_path, "legacy: {verdict: fail, failing: [no_leaks]}\nhardened: pass")
    assert [s.model.name for s, _ in claims([sc2], "hardened")] == [sc2.model.name]


def _integrity(recs):
    from harness.checks import CheckInput, harness_integrity

    return harness_integrity(CheckInput(recs), {})


def _history(t0=100.0):
    return [{"type": "meta", "t0": t0, "faults": [{"id": 0, "type": "slow_peer"}]},
            {"type": "probe", "node": "server", "when": "baseline", "pid": 7, "t": t0, "threads": 1, "fds": 1},
            {"type": "fault", "id": 0, "name": "slow_peer", "phase": "start", "t": t0 + 1},
            {"type": "op", "id": 1, "process": 0, "f": "lookup", "phase": "invoke", "t": t0 + 1.5},
            {"type": "op", "id": 1, "process": 0, "f": "lookup", "phase": "ok", "t": t0 + 1.6, "value": 1,
             "outcome": "ok"},
            {"type": "fault", "id": 0, "name": "slow_peer", "phase": "stop", "t": t0 + 2},
            {"type": "probe", "node": "server", "when": "final", "pid": 7, "t": t0 + 3, "threads": 1, "fds": 1},
            {"type": "end", "t": t0 + 3}]


def test_integrity_rejects_histories_no_run_can_write():
    # broken histories a reviewer made read "as expected" (helper-6): each is now a harness error
    assert _integrity(_history()).ok is True
    h = _history()
    h[4]["t"] = h[3]["t"] - 0.5  # completed before it was invoked
    assert "before it was invoked" in _integrity(h).message
    h = _history()
    del h[5]  # the fault's stop record gone: never healed
    assert "never healed" in _integrity(h).message
    h = _history()
    h.insert(7, dict(h[6], fds=900))  # a second final probe of the same process
    assert "two final probes" in _integrity(h).message
    h = _history()  # two nodes in pods of their own may share a pid (each pod counts its own): one run
    h.insert(7, dict(h[6], node="other", fds=900))
    assert _integrity(h).ok is True
    h = _history()
    h[4]["outcome"] = "http_502"  # a failure relabelled a success (or the reverse)
    assert "contradicts itself" in _integrity(h).message
    h = _history()
    h[4].update(phase="info")
    assert "contradicts itself" in _integrity(h).message


@pytest.mark.timeout(30)
def test_each_check_has_its_own_options_and_a_familys_defaults_obey_them(monkeypatch, tmp_path) -> None:
    """An option belongs to its check: pd's max_cpu is no_busy_wait's, not no_leaks'; a family's
    check_defaults are held to the same models when the family's scenarios are first read."""
    from families.pd.family import FAMILY
    from harness import schema
    from harness.errors import UsageError

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nfamily: pd\nworkload: {duration: 2s}\nchecks:\n  no_leaks: {max_cpu: 1}\n"
                   "expect: {upstream: pass, hardened: pass}\ntriggers: {none: baseline}\n")
    with pytest.raises(UsageError, match=r"bad.yaml:5: checks.no_leaks.max_cpu: unknown field"):
        schema.load_scenario(bad)
    bad.write_text(bad.read_text().replace("no_leaks: {max_cpu: 1}", "no_busy_wait: {max_cpu: 0.2}"))
    assert schema.load_scenario(bad).model.checks.get("no_busy_wait").max_cpu == 0.2
    monkeypatch.setattr(type(FAMILY), "check_defaults", {"no_leaks": {"slak": 4}})
    monkeypatch.setattr(schema, "_MODELS", {})
    with pytest.raises(UsageError, match=r"family 'pd': check_defaults.no_leaks: Extra inputs are not permitted"):
        schema.scenario_model("pd")
