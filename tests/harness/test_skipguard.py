"""tests/skipguard.py: a skip passes a plain run and fails under PDCHAOS_REQUIRE_ALL=1 with its reason;
every run ends with the skips counted and grouped, just above pytest's own closing line."""

from __future__ import annotations

import pytest

import skipguard

pytest_plugins = ["pytester"]


def _summary(res) -> str:  # noqa: ANN001 - pytester's RunResult
    """The outcome counts of the inner run's last line, without its warnings count (warnings that
    modules imported earlier in the same xdist worker raise are no outcome: in the whole suite the
    line once read "..., 7 warnings in 0.17s") and its time."""
    import re

    line = re.sub(r" in [0-9.]+s.*$", "", res.outlines[-1])
    return re.sub(r", \d+ warnings?$", "", line)

SKIPPING = """
import pytest

needs_tool = pytest.mark.skipif(True, reason="toxiproxy-server missing")

@needs_tool
def test_marker():
    pass

def test_inline():
    pytest.skip("toxiproxy-server missing")

def test_other():
    pytest.skip("conformance env missing")

@pytest.mark.parametrize("side", ["p", "d"])
def test_not_applicable(side):
    if side == "d":
        pytest.skip("not applicable: P only")

@pytest.mark.xfail(reason="known")
def test_xfail():
    assert False

def test_ok():
    pass
"""


def _run(pytester: pytest.Pytester):
    pytester.makepyfile(test_some=SKIPPING)
    return pytester.runpytest("-p", "no:cacheprovider", "-q", plugins=[skipguard])


def test_a_skip_passes_a_plain_run_and_is_counted(pytester: pytest.Pytester, monkeypatch) -> None:
    monkeypatch.delenv("PDCHAOS_REQUIRE_ALL", raising=False)
    res = _run(pytester)
    res.assert_outcomes(passed=2, skipped=4, xfailed=1)
    assert res.ret == 0
    res.stdout.fnmatch_lines(["skips: 4 (2 x toxiproxy-server missing, 1 x conformance env missing, "
                              "1 x not applicable: P only)"])
    assert "PDCHAOS_REQUIRE_ALL" not in res.stdout.str()
    assert _summary(res) == "2 passed, 4 skipped, 1 xfailed", res.outlines[-1]


@pytest.mark.parametrize("value", ["1", "0"])
def test_require_all_turns_a_skip_into_a_failure_with_its_reason(pytester: pytest.Pytester, monkeypatch,
                                                                 value: str) -> None:
    monkeypatch.setenv("PDCHAOS_REQUIRE_ALL", value)
    res = _run(pytester)
    if value == "0":  # "0" is off
        res.assert_outcomes(passed=2, skipped=4, xfailed=1)
        return
    res.assert_outcomes(passed=2, failed=3, skipped=1, xfailed=1)
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    res.stdout.fnmatch_lines([
        "*PDCHAOS_REQUIRE_ALL=1 makes a skip a failure: toxiproxy-server missing*",
        "*PDCHAOS_REQUIRE_ALL=1 makes a skip a failure: conformance env missing*",
    ])
    res.stdout.fnmatch_lines([
        "skips: 1 (1 x not applicable: P only)",
        "skips failed by PDCHAOS_REQUIRE_ALL=1: 3 (2 x toxiproxy-server missing, 1 x conformance env missing)",
    ])
    assert _summary(res) == "3 failed, 2 passed, 1 skipped, 1 xfailed", res.outlines[-1]


def test_a_module_level_skip_fails_collection_under_require_all(pytester: pytest.Pytester, monkeypatch) -> None:
    pytester.makepyfile(test_mod='import pytest\npytest.skip("node env missing", allow_module_level=True)\n')
    monkeypatch.delenv("PDCHAOS_REQUIRE_ALL", raising=False)
    plain = pytester.runpytest("-p", "no:cacheprovider", "-q", plugins=[skipguard])
    plain.assert_outcomes(skipped=1)
    plain.stdout.fnmatch_lines(["skips: 1 (1 x node env missing)"])
    monkeypatch.setenv("PDCHAOS_REQUIRE_ALL", "1")
    strict = pytester.runpytest("-p", "no:cacheprovider", "-q", plugins=[skipguard])
    strict.assert_outcomes(errors=1)
    assert strict.ret != 0
    strict.stdout.fnmatch_lines(["*PDCHAOS_REQUIRE_ALL=1 makes a skip a failure: node env missing*",
                                 "skips failed by PDCHAOS_REQUIRE_ALL=1: 1 (1 x node env missing)"])
