"""The reward curve: its band stays within the rewards the rollouts got, and it says what it is."""

from __future__ import annotations

from pathlib import Path

import pytest
from openforge_trainer.training import metrics


def test_the_band_never_claims_a_reward_no_rollout_got() -> None:
    history: list[metrics.Record] = [
        {"step": 1, "reward_mean": 0.5, "reward_std": 0.5, "reward_min": 0.0, "reward_max": 1.0},
        {"step": 2, "reward_mean": 0.875, "reward_std": 0.33, "reward_min": 0.0, "reward_max": 1.0},
        {"step": 3, "reward_mean": 0.1, "reward_std": 0.3, "reward_min": 0.0, "reward_max": 1.0},
    ]
    lower, upper = metrics.band(history)
    assert lower == pytest.approx([0.0, 0.545, 0.0])
    assert upper == pytest.approx([1.0, 1.0, 0.4])


def test_records_without_the_extremes_keep_the_plain_band() -> None:
    lower, upper = metrics.band([{"step": 1, "reward_mean": 2.0, "reward_std": 1.0}])
    assert (lower, upper) == ([1.0], [3.0])


def test_the_curve_has_a_title_and_is_written_whole(tmp_path: Path) -> None:
    history: list[metrics.Record] = [
        {
            "step": 1,
            "reward_mean": 0.5,
            "reward_std": 0.5,
            "pass_rate": 0.5,
            "reward_min": 0.0,
            "reward_max": 1.0,
        }
    ]
    drawn = metrics.figure(history, title="react-toy: reward per training step")
    assert drawn.axes[0].get_title() == "react-toy: reward per training step"
    metrics.plot(history, tmp_path / metrics.CURVE, title="t")
    assert (tmp_path / metrics.CURVE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob("*.tmp.png"))
