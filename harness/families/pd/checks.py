"""The pd family's checks (generic ones are in harness/checks.py)."""

from __future__ import annotations

from harness.checks import CheckInput, CheckResult, _first, _r

from .family import FAMILY

check = FAMILY.checks.check


@check("correct_output")
def correct_output(inp: CheckInput, opts: dict) -> CheckResult:  # noqa: ARG001
    """Every HTTP 200 carries exactly the reference text of its prompt (the greedy output of the
    same model without disaggregation): a wrong KV transfer shows here."""
    ok_ops = [o for o in inp.ops if o.get("phase") == "ok"]
    wrong = [o for o in ok_ops if o.get("value") != o.get("expected")]
    if wrong:
        return _r(False, f"{len(wrong)} of {len(ok_ops)} completions differ from the reference; first: op "
                         f"{wrong[0]['id']}", wrong=_first([o["id"] for o in wrong]))
    if not ok_ops:
        return _r(False, "no completion succeeded: nothing to compare with the reference")
    return _r(True, f"all {len(ok_ops)} completions equal the reference output")
