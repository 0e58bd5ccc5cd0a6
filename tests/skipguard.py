"""No silent skips (issue 17, item 10): a pytest plugin, loaded by ``tests/conftest.py``.

* With ``PDCHAOS_REQUIRE_ALL=1`` (``.ci/run`` sets it for its pytest call) a skip FAILS, with the
  same reason: a missing node env or tool must not leave a green run that tested nothing of it.
  Only a skip whose reason starts with ``not applicable:`` (a case that does not apply whatever is
  installed, e.g. a parametrization) stays a skip. An xfail is no skip and is left alone.
* Every run ends (just above pytest's own closing line) with the count of skips and their reasons,
  grouped: ``skips: 3 (2 x toxiproxy-server not found ..., 1 x ...)``.

A skip at collection (``pytest.skip(allow_module_level=True)``, module-level ``importorskip``)
becomes a collection error under ``PDCHAOS_REQUIRE_ALL=1``, which stops the run there.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

REQUIRE_ALL = "PDCHAOS_REQUIRE_ALL"
NOT_APPLICABLE = "not applicable:"


def require_all() -> bool:
    return os.environ.get(REQUIRE_ALL, "").strip() not in ("", "0")


def skip_reason(report) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def _police(report):
    """Turn a skip report into a failure (same reason) when REQUIRE_ALL is set."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return report
    reason = skip_reason(report)
    if not require_all() or reason.startswith(NOT_APPLICABLE):
        return report
    report.outcome = "failed"
    report.longrepr = f"skipped, and {REQUIRE_ALL}=1 makes a skip a failure: {reason}"
    report.pdchaos_required_skip = reason
    return report


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    return _police((yield))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_make_collect_report(collector):
    return _police((yield))


def pytest_report_teststatus(report, config):
    # a skip in setup (skipif marker) would otherwise count as an "error": it is a failed test
    if getattr(report, "pdchaos_required_skip", None) is not None and report.when in ("setup", "call"):
        return "failed", "F", "FAILED"
    return None


def _grouped(reasons: list[str]) -> str:
    if not reasons:
        return "0"
    groups = ", ".join(f"{n} x {reason}" for reason, n in Counter(reasons).most_common())
    return f"{len(reasons)} ({groups})"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    stats = terminalreporter.stats
    skipped = [skip_reason(r) for r in stats.get("skipped", [])]
    failed = [r.pdchaos_required_skip for key in ("failed", "error") for r in stats.get(key, [])
              if getattr(r, "pdchaos_required_skip", None) is not None]
    terminalreporter.write_sep("-", "skips")
    terminalreporter.write_line(f"skips: {_grouped(skipped)}")
    if failed or require_all():
        terminalreporter.write_line(f"skips failed by {REQUIRE_ALL}=1: {_grouped(failed)}")
