"""The learning tests' statistic, on curves the CI runs produced."""

from __future__ import annotations

import learning_runs
import numpy as np
import pytest


def curve(*means: float) -> dict[int, list[float]]:
    """Iterations of 32 rewards (0/1) with the given pass rates."""
    out = {}
    for index, mean in enumerate(means):
        passed = round(mean * 32)
        out[index] = [1.0] * passed + [0.0] * (32 - passed)
    return out


def test_a_straight_line_rises_by_its_ends() -> None:
    assert learning_runs.fitted_rise([0.2, 0.3, 0.4, 0.5]) == pytest.approx(0.3)
    assert learning_runs.fitted_rise([0.5, 0.5, 0.5]) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="two iterations"):
        learning_runs.fitted_rise([0.5])


def test_the_later_half_against_the_first_two() -> None:
    assert learning_runs.pooled_rise([0.2, 0.4, 0.5, 0.5, 0.7, 0.9]) == pytest.approx(0.4)
    assert learning_runs.pooled_rise([0.3, 0.5, 0.2, 0.4, 0.6]) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="four iterations"):
        learning_runs.pooled_rise([0.1, 0.2, 0.3])


def test_a_rise_that_plateaus_with_a_dip_passes() -> None:
    # a clean-clone CI run of the Codex test: learned by iteration 4, dipped at 7
    means = [0.22, 0.22, 0.44, 0.53, 0.53, 0.47, 0.25, 0.44, 0.47, 0.53]
    assert learning_runs.fitted_rise(means) < 0.2 < learning_runs.pooled_rise(means)
    learning_runs.assert_rise(curve(*means), iterations=10, at_least=0.2)


@pytest.mark.parametrize(("iterations", "rate"), [(8, 0.3), (10, 0.3), (10, 0.5)])
def test_a_policy_that_does_not_learn_rarely_passes(iterations: int, rate: float) -> None:
    """Either statistic at 0.2, for 20,000 simulated runs at a constant pass rate."""
    passes = np.random.default_rng(0).binomial(32, rate, size=(20_000, iterations)) / 32
    false_passes = sum(
        max(learning_runs.fitted_rise(list(run)), learning_runs.pooled_rise(list(run))) >= 0.2
        for run in passes
    )
    assert false_passes / len(passes) < 0.02


def test_a_lucky_first_batch_moves_the_trend_less_than_first_against_last() -> None:
    # a clean-clone CI run of the Codex test: 0.47 first, +0.06 first against last two
    means = [0.47, 0.44, 0.38, 0.41, 0.56, 0.69, 0.50, 0.56]
    assert learning_runs.fitted_rise(means) == pytest.approx(0.167, abs=0.005)
    learning_runs.assert_rise(curve(*means), iterations=8, at_least=0.15)


def test_a_flat_curve_fails() -> None:
    with pytest.raises(AssertionError, match="fitted rise"):
        learning_runs.assert_rise(
            curve(0.25, 0.31, 0.22, 0.28, 0.25, 0.31, 0.22, 0.28), iterations=8, at_least=0.15
        )


def test_a_collapse_at_the_end_fails() -> None:
    # a clean-clone CI run before the step guard
    with pytest.raises(AssertionError, match="fitted rise"):
        learning_runs.assert_rise(
            curve(0.28, 0.34, 0.41, 0.47, 0.62, 0.0, 0.03, 0.0), iterations=8, at_least=0.15
        )
    # a curve that ends below its start is refused even when its trend rises
    means = (0.31, 0.0, 0.0, 0.59, 0.81, 0.94, 0.97, 0.25, 0.28)
    assert learning_runs.fitted_rise(list(means)) > 0.3
    with pytest.raises(AssertionError, match="ended below the start"):
        learning_runs.assert_rise(curve(*means), iterations=9, at_least=0.15)


def test_a_curve_from_every_iteration_is_required() -> None:
    with pytest.raises(AssertionError):
        learning_runs.assert_rise(curve(0.2, 0.8), iterations=3, at_least=0.1)
