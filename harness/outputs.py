"""The outputs of a run: summary.json and junit.xml (reports/ makes the rest)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path


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

    @property
    def as_expected(self) -> bool:
        return self.verdict == "skipped" or self.verdict in self.expected.split("|")

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["as_expected"] = self.as_expected
        return d


def write_summary(run_dir: Path, results: list[Result], started_wall: str, elapsed_s: float) -> dict:
    summary = {"run_id": run_dir.name, "started": started_wall, "elapsed_s": round(elapsed_s, 3),
               "results": [r.to_dict() for r in results]}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    write_junit(run_dir / "junit.xml", results)
    return summary


def write_junit(path: Path, results: list[Result]) -> None:
    suite = ET.Element("testsuite", name="pdchaos", tests=str(len(results)),
                       failures=str(sum(1 for r in results if not r.as_expected and r.verdict != "error")),
                       errors=str(sum(1 for r in results if r.verdict == "error")),
                       skipped=str(sum(1 for r in results if r.verdict == "skipped")),
                       time=f"{sum(r.elapsed_s for r in results):.3f}")
    for r in results:
        case = ET.SubElement(suite, "testcase", classname=r.scenario, name=r.target, time=f"{r.elapsed_s:.3f}",
                             file=r.file)
        if r.verdict == "skipped":
            ET.SubElement(case, "skipped", message=r.reason)
        elif r.verdict == "error":
            ET.SubElement(case, "error", message=r.reason or "harness error")
        elif not r.as_expected:
            failed = [c for c in r.checks if c["ok"] is False]
            msg = f"verdict {r.verdict}, expected {r.expected}"
            el = ET.SubElement(case, "failure", message=msg)
            el.text = "\n".join(f"{c['name']}: {c['message']}" for c in failed) or msg
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
