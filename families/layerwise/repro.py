"""``pdchaos repro``'s hooks for the layerwise family (harness/cli/repro.py finds this module beside
family.py): the report's standalone/ folder where families/layerwise/standalone.py has a case for
the scenario (the defect with vllm-ascend alone, on its own unit-test stubs); None otherwise."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_standalone(scenario: Any, report_dir: Path) -> Path | None:
    from . import standalone

    if scenario.name not in standalone.CASES:
        return None
    return standalone.write_standalone(Path(report_dir), scenario.name, standalone.env_text(*standalone.node_python()))
