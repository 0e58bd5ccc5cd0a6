"""The paired bootstrap interval the benches report (pure: numpy only)."""

from __future__ import annotations

import random

import pytest

from harness.benchkit import paired_ratio_ci

pytestmark = pytest.mark.timeout(60)


def _pairs(n: int, factor: float, noise: float, seed: int = 1) -> tuple[list[float], list[float]]:
    rng = random.Random(seed)
    base, other = [], []
    for _ in range(n):
        drift = rng.uniform(80, 160)  # what both sides of a pair share (machine load)
        base.append(drift * rng.uniform(1 - noise, 1 + noise))
        other.append(drift * factor * rng.uniform(1 - noise, 1 + noise))
    return base, other


def test_a_known_slowdown_lies_inside_the_interval() -> None:
    base, other = _pairs(400, 1.10, 0.02)
    r = paired_ratio_ci(base, other, 0.5)
    assert r["lo"] <= 1.10 <= r["hi"] and 1.05 < r["ratio"] < 1.15
    assert r["lo"] > 1.0  # a 10 % slowdown is told from no change


def test_no_difference_gives_an_interval_around_one_that_narrows_with_n() -> None:
    small = paired_ratio_ci(*_pairs(40, 1.0, 0.05), 0.5)
    large = paired_ratio_ci(*_pairs(1000, 1.0, 0.05), 0.5)
    assert small["lo"] <= 1.0 <= small["hi"] and large["lo"] <= 1.0 <= large["hi"]
    assert large["half_width"] < small["half_width"]


def test_the_same_seed_gives_the_same_interval() -> None:
    base, other = _pairs(100, 1.02, 0.05)
    assert paired_ratio_ci(base, other, 0.99, seed=7) == paired_ratio_ci(base, other, 0.99, seed=7)


@pytest.mark.parametrize("base,other,q", [([1.0], [1.0], 0.5), ([1.0, 2.0], [1.0], 0.5),
                                          ([1.0, 2.0], [1.0, 2.0], 1.0)])
def test_bad_input_is_refused(base, other, q) -> None:
    with pytest.raises(ValueError):
        paired_ratio_ci(base, other, q)
