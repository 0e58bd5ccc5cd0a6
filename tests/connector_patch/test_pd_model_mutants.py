"""Each rule mutant of tests/connector_patch/pd_mutants.py (one real rule of connector_patch/pd broken
by a monkeypatch) is caught by the P/D model (pd_model.py, over the real worker code) at each TP
size it lists: an invariant fails within the bounded examples. A module of its own so that
pytest-xdist's loadfile runs it beside test_pd_model.py. ``PDCHAOS_MODEL_SCALE`` multiplies the
example count (the nightly's long profile).
"""

from __future__ import annotations

import os

import pytest

import pd_model
import pd_mutants
import pd_sim
from test_pd_model import _quiet_logs, _run  # noqa: F401 - the fixture applies here too

SCALE = max(1, int(os.environ.get("PDCHAOS_MODEL_SCALE", "1")))
MUTANT_EXAMPLES = 250  # every listed mutant was caught within 135 (measured), with a margin: the example
# sequence depends on what ran before in the process
pytestmark = pytest.mark.timeout(300 * SCALE)


CASES = [(name, tp) for name, (_, tps, _) in pd_mutants.MUTANTS.items() for tp in tps]


@pytest.mark.parametrize("name, p_tp", CASES, ids=[f"{n}-tp{t}" for n, t in CASES])
def test_each_rule_mutant_is_caught(monkeypatch, name, p_tp) -> None:
    _, _, install = pd_mutants.MUTANTS[name]
    install(pd_sim.hardened_module(), monkeypatch.setattr)
    with pytest.raises(AssertionError):
        _run(pd_model.model(p_tp), MUTANT_EXAMPLES * SCALE)


@pytest.mark.parametrize("name", sorted(pd_mutants.DIRECTED))
def test_each_half_of_7a_is_needed(monkeypatch, name) -> None:
    """Each half of 7a's fix (P cuts its write, D's fence) is broken alone, and the hand-written
    run that needs it sees P write into a freed block; the other run still passes (each half
    alone covers it)."""
    _, case, install = pd_mutants.DIRECTED[name]
    install(pd_sim.hardened_module(), monkeypatch.setattr)
    out = pd_model.directed_7a(case)
    assert any("which D holds for nobody" in v for v in out["violations"]), out
    other = "blackhole" if case == "refuse" else "refuse"
    assert pd_model.directed_7a(other)["violations"] == [], other


def test_at_least_ten_mutants_at_tp1_and_tp2() -> None:
    both = [n for n, (_, tps, _) in pd_mutants.MUTANTS.items() if {1, 2} <= set(tps)]
    assert len(both) >= 10, both
