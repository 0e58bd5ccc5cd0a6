"""``pdchaos repro``'s hooks for the lookup family (harness/cli/repro.py and harness/family.py find
this module beside family.py): the report's standalone/ folder, the defect with the upstream
package alone. The store scenarios (scenarios/store/) have theirs in store_standalone.py, the AscendStore
lookup ones (lookup-*) in ascend_standalone.py; a
scenario with no recipe gets no folder (None)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_standalone(scenario: Any, report_dir: Path) -> Path | None:
    from . import store_standalone

    if scenario.name in store_standalone.CASES:
        env_text = store_standalone.collect_env(store_standalone.node_python())
        return store_standalone.write_standalone(Path(report_dir), scenario.name, env_text)
    from . import ascend_standalone  # the AscendStore lookup reports (vllm-ascend's own unit-test stubs)

    if scenario.name in ascend_standalone.CASES:
        return ascend_standalone.write_standalone(Path(report_dir), scenario.name,
                                                  ascend_standalone.env_text(*ascend_standalone.node_python()))
    return None
