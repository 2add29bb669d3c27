from __future__ import annotations

import math

import pytest
import torch
from openforge_trainer.training import algorithms

torch.set_num_threads(1)


def test_grpo_matches_a_hand_computation() -> None:
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5])
    groups = algorithms.group_ids(["a", "a", "a", "a", "b"])
    advantages = algorithms.ADVANTAGES["grpo"](scores, groups, norm_by_std=True)
    std = math.sqrt(4 * 0.5**2 / 3)  # unbiased, as torch.std
    expected = [0.5 / std, -0.5 / std, -0.5 / std, 0.5 / std, 0.5]  # a group of one keeps its score
    assert advantages.tolist() == pytest.approx(expected, abs=1e-5)
    dr_grpo = algorithms.ADVANTAGES["grpo"](scores, groups, norm_by_std=False)
    assert dr_grpo.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 0.5])


def test_rloo_subtracts_the_mean_of_the_others() -> None:
    scores = torch.tensor([1.0, 0.0, 0.5])
    advantages = algorithms.ADVANTAGES["rloo"](
        scores, algorithms.group_ids("aaa"), norm_by_std=True
    )
    assert advantages.tolist() == pytest.approx([1 - 0.25, 0 - 0.75, 0.5 - 0.5])


def test_a_rollout_split_into_two_rows_counts_once_in_its_group() -> None:
    # rollouts r0 (two rows), r1, r2 of one task; rewards 1, 0, 0
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 1, 1]])
    tokens, per_rollout = algorithms.row_advantages(
        "grpo",
        scores=torch.tensor([1.0, 0.0, 0.0]),
        groups=algorithms.group_ids(["t", "t", "t"]),
        row_rollout=torch.tensor([0, 0, 1, 2]),
        response_mask=mask,
    )
    alone = algorithms.ADVANTAGES["grpo"](
        torch.tensor([1.0, 0.0, 0.0]), algorithms.group_ids("ttt"), norm_by_std=True
    )
    assert per_rollout.tolist() == pytest.approx(alone.tolist())
    assert tokens[0].tolist() == pytest.approx([alone[0].item()] * 2 + [0.0])
    assert tokens[1].tolist() == pytest.approx([alone[0].item(), 0.0, 0.0])
    assert tokens[3].tolist() == pytest.approx([0.0] + [alone[2].item()] * 2)


def actor(**overrides: object) -> object:
    settings = {
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.2,
        "clip_ratio_c": 3.0,
        "loss_agg_mode": "token-mean",
    }
    return algorithms.actor_config(**{**settings, **overrides})  # type: ignore[arg-type]


def test_clipped_policy_loss_matches_a_hand_computation() -> None:
    old = torch.zeros(1, 2)
    new = torch.log(torch.tensor([[1.5, 0.5]]))
    loss, metrics = algorithms.policy_loss(
        actor(),  # type: ignore[arg-type]
        old_log_prob=old,
        log_prob=new,
        advantages=torch.tensor([[1.0, -1.0]]),
        response_mask=torch.ones(1, 2),
        batch_num_tokens=2,
        global_batch_size=1,
    )
    # token 1: A=+1, ratio 1.5 clipped to 1.2 -> -1.2;
    # token 2: A=-1, ratio 0.5 clipped to 0.8 -> 0.8
    assert float(loss) == pytest.approx((-1.2 + 0.8) / 2)
    assert metrics["pg_clipfrac"] == pytest.approx(1.0)
    assert set(metrics) == {"pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"}


def test_micro_batch_losses_sum_to_the_whole_batch_loss() -> None:
    torch.manual_seed(0)
    old, new = torch.randn(4, 5), torch.randn(4, 5)
    advantages = torch.randn(4, 1) * torch.ones(4, 5)
    mask = (torch.rand(4, 5) > 0.3).long()
    config = actor(clip_ratio_high=0.28)
    tokens = int(mask.sum())

    def loss(rows: slice) -> float:
        value, _ = algorithms.policy_loss(
            config,  # type: ignore[arg-type]
            old_log_prob=old[rows],
            log_prob=new[rows],
            advantages=advantages[rows],
            response_mask=mask[rows],
            batch_num_tokens=tokens,
            global_batch_size=4,
        )
        return float(value)

    assert loss(slice(0, 1)) + loss(slice(1, 4)) == pytest.approx(loss(slice(0, 4)), abs=1e-6)


def test_log_probs_entropy_and_kl_shapes_and_values() -> None:
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]])  # p = (1/4, 3/4), (1/2, 1/2)
    log_probs = algorithms.token_log_probs(logits, torch.tensor([[1, 0]]))
    assert log_probs.shape == (1, 2)
    assert log_probs.tolist()[0] == pytest.approx([math.log(0.75), math.log(0.5)])
    entropy = algorithms.entropy(logits)
    assert entropy.tolist()[0] == pytest.approx(
        [-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), math.log(2)]
    )
    kl = algorithms.kl_penalty(log_probs, log_probs, kind="low_var_kl")
    assert kl.tolist() == [[0.0, 0.0]]
    aggregate = algorithms.aggregate(
        actor(),  # type: ignore[arg-type]
        torch.tensor([[1.0, 3.0]]),
        mask=torch.tensor([[1, 1]]),
        batch_num_tokens=4,
        global_batch_size=1,
    )
    assert float(aggregate) == pytest.approx(1.0)  # (1 + 3) / 4 step tokens
