"""The outputs of a run: summary.json and junit.xml (reports/ makes the rest), and the run's status.

Every scenario/target run has exactly one outcome:

``as_expected``  it ran, and its verdict and the set of checks that failed are one the scenario expects;
``deviation``    it ran, and its verdict or its failing set is not one the scenario expects;
``skipped``      it did not run here (a tool or a privilege is missing), with the reason; never a pass;
``error``        the harness could not run it to the end (a topology or harness failure, Ctrl-C), or
                 the run cannot be judged (harness_integrity or workload_ran failed, a checker raised).

Exit status (``pdchaos run`` and ``pdchaos check``): 1 on any deviation or error, else 0; with
``--strict`` a skipped run also makes it 1.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from . import verdicts as V

# summary.json "counts": outcome -> key
COUNT_KEYS = {"as_expected": "as_expected", "deviation": "deviations", "skipped": "skipped", "error": "errors"}


def outcome_of(verdict: str, expected: str | None, failing: list[str] | None = None) -> str:
    """The outcome of a verdict and its failing checks against what the scenario expects
    (harness/verdicts.py: alternatives as ``fail[a,b]|stall[no_stall]``)."""
    return V.outcome(verdict, expected, failing)


@dataclass
class Result:
    scenario: str
    file: str
    target: str
    dir: str
    verdict: str
    expected: str
    reason: str = ""
    checks: list[dict] = field(default_factory=list)
    elapsed_s: float = 0.0
    setup_s: float = 0.0
    teardown_s: float = 0.0
    family: str = ""
    failing: list[str] = field(default_factory=list)  # the checks that failed (the expectation names them)

    @property
    def outcome(self) -> str:
        return outcome_of(self.verdict, self.expected, self.failing)

    @property
    def as_expected(self) -> bool:
        """Ran, and ended as expected. False for a skipped run: it proved nothing."""
        return self.outcome == "as_expected"

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["outcome"] = self.outcome
        d["as_expected"] = self.as_expected
        return d


def counts(outcomes: Iterable[str]) -> dict[str, int]:
    """``{"as_expected": n, "deviations": n, "skipped": n, "errors": n}``."""
    out = dict.fromkeys(COUNT_KEYS.values(), 0)
    for o in outcomes:
        out[COUNT_KEYS[o]] += 1
    return out


def tally(c: dict[str, int]) -> str:
    """``28 as expected, 1 deviations, 2 skipped, 0 errors``."""
    return (f"{c['as_expected']} as expected, {c['deviations']} deviations, {c['skipped']} skipped, "
            f"{c['errors']} errors")


def run_status(outcomes: Iterable[str], *, strict: bool = False) -> tuple[int, str]:
    """(exit code, a line saying why) for a run whose scenario/target runs had these outcomes."""
    c = counts(outcomes)
    bad = [f"{c[k]} {word}" for k, word in (("deviations", "deviation(s)"), ("errors", "error(s)")) if c[k]]
    if strict and c["skipped"]:
        bad.append(f"{c['skipped']} skipped (--strict: a skipped run fails the run)")
    if bad:
        return 1, "exit 1: " + ", ".join(bad)
    if c["skipped"]:
        return 0, (f"exit 0: no deviation, no error; {c['skipped']} skipped "
                   f"(not run here, not a deviation; --strict fails on them)")
    return 0, "exit 0: every run as expected"


def write_summary(run_dir: Path, results: list[Result], started_wall: str, elapsed_s: float) -> dict:
    summary = {"run_id": run_dir.name, "started": started_wall, "elapsed_s": round(elapsed_s, 3),
               "counts": counts(r.outcome for r in results), "results": [r.to_dict() for r in results]}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    write_junit(run_dir / "junit.xml", results)
    return summary


def write_junit(path: Path, results: list[Result]) -> None:
    c = counts(r.outcome for r in results)
    suite = ET.Element("testsuite", name="pdchaos", tests=str(len(results)), failures=str(c["deviations"]),
                       errors=str(c["errors"]), skipped=str(c["skipped"]),
                       time=f"{sum(r.elapsed_s for r in results):.3f}")
    for r in results:
        case = ET.SubElement(suite, "testcase", classname=r.scenario, name=r.target, time=f"{r.elapsed_s:.3f}",
                             file=r.file)
        outcome = r.outcome
        if outcome == "skipped":
            ET.SubElement(case, "skipped", message=r.reason)
        elif outcome == "error":
            ET.SubElement(case, "error", message=r.reason or "harness error")
        elif outcome == "deviation":
            failed = [c for c in r.checks if c["ok"] is False]
            msg = V.difference(r.verdict, r.expected, r.failing)
            el = ET.SubElement(case, "failure", message=msg)
            el.text = "\n".join(f"{c['name']}: {c['message']}" for c in failed) or msg
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
