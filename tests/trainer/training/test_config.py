from __future__ import annotations

from pathlib import Path

import pytest
from openforge_trainer.training import config as train_config

REQUIRED = {"store": Path("s.db"), "job": "j", "model": Path("m"), "run_dir": Path("r")}


def test_defaults_are_valid_and_documented() -> None:
    config = train_config.load(**REQUIRED)
    assert (config.groups_per_step, config.adv_estimator, config.policy_loss) == (
        4,
        "grpo",
        "vanilla",
    )
    assert config.kl_coef == 0.0  # no reference model unless asked
    for name, field in train_config.TrainConfig.model_fields.items():
        assert field.description, f"{name} has no description"


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"lr": -0.1}, "lr: Input should be greater than 0 (got -0.1)"),
        (
            {"groups_per_step": 0},
            "groups_per_step: Input should be greater than or equal to 1 (got 0)",
        ),
        ({"clip_ratio_c": 1.0}, "clip_ratio_c: Input should be greater than 1 (got 1.0)"),
        (
            {"adv_estimator": "ppo2"},
            "adv_estimator: unknown estimator 'ppo2'; known: ['grpo', 'rloo']",
        ),
        ({"policy_loss": "gspo"}, "policy_loss: unknown policy loss 'gspo'; known: ['vanilla']"),
        (
            {"serve_urls": ["127.0.0.1:8000"]},
            "serve_urls: '127.0.0.1:8000' is not an http:// or https:// URL",
        ),
        ({"loss_agg_mode": "mean"}, "loss_agg_mode: Input should be 'token-mean'"),
        ({"group_size": 1}, "group_size 1 gives GRPO nothing to compare (got group_size=1"),
        ({"lrr": 1e-3}, "lrr: Extra inputs are not permitted (got 0.001)"),
    ],
)
def test_errors_name_the_field_and_the_value(values: dict[str, object], expected: str) -> None:
    with pytest.raises(train_config.ConfigError) as caught:
        train_config.load(**{**REQUIRED, **values})
    assert expected in str(caught.value)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(train_config.ConfigError) as caught:
        train_config.load(job="", lr=0, max_staleness=-1)
    message = str(caught.value)
    for expected in (
        "store: required",
        "job: String should have at least 1 character",
        "lr:",
        "max_staleness:",
    ):
        assert expected in message


def test_urls_lose_their_trailing_slash() -> None:
    config = train_config.load(**REQUIRED, vllm_urls=["http://gpu-0:8000/"])
    assert config.vllm_urls == ("http://gpu-0:8000",)
