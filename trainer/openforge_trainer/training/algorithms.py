"""RL algorithms: thin wrappers of veRL's own tensor functions, registered by name.

The maths is veRL's (``verl.trainer.ppo.core_algos`` and
``verl.utils.torch_functional``, verl 0.9.1); this module only adapts its
calling conventions to ours and says the shapes. Names used below:

* ``B``: rows in the batch (one row = one token-verified segment of a rollout);
* ``R``: response columns (right-padded), ``V``: vocabulary size;
* ``n``: rollouts (a rollout with several segments has several rows).

Advantage estimators work per rollout (an outcome reward is one number per
rollout), and :func:`row_advantages` spreads each rollout's advantage over its
rows' model tokens, so a rollout split into two segments is not counted twice
in its group's mean and std.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

import numpy as np
import torch
import verl.utils.torch_functional as verl_functional
from verl.trainer.ppo import core_algos
from verl.workers.config import ActorConfig, PolicyLossConfig


class AdvantageFn(Protocol):
    def __call__(
        self, scores: torch.Tensor, groups: np.ndarray, *, norm_by_std: bool
    ) -> torch.Tensor: ...


ADVANTAGES: dict[str, AdvantageFn] = {}


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    def decorator(function: AdvantageFn) -> AdvantageFn:
        ADVANTAGES[name] = function
        return function

    return decorator


def _outcome(
    estimator: Any, scores: torch.Tensor, *, groups: np.ndarray, **kwargs: Any
) -> torch.Tensor:
    # veRL's outcome estimators take token-level rewards [n, T] and sum them;
    # one column holding the reward, under a mask of ones, is exactly that.
    rewards = scores.to(torch.float32).reshape(-1, 1)
    advantages, _returns = estimator(
        token_level_rewards=rewards, response_mask=torch.ones_like(rewards), index=groups, **kwargs
    )
    result: torch.Tensor = advantages.reshape(-1)
    return result


@register_advantage("grpo")
def grpo(scores: torch.Tensor, groups: np.ndarray, *, norm_by_std: bool = True) -> torch.Tensor:
    """GRPO: (score - group mean) / (group std + 1e-6); scores [n], groups [n] -> [n].

    ``norm_by_std=False`` leaves out the division (Dr. GRPO). A group of one
    keeps its score (veRL's convention: mean 0, std 1).
    """
    return _outcome(
        core_algos.compute_grpo_outcome_advantage,
        scores,
        groups=groups,
        norm_adv_by_std_in_grpo=norm_by_std,
    )


@register_advantage("rloo")
def rloo(scores: torch.Tensor, groups: np.ndarray, *, norm_by_std: bool = True) -> torch.Tensor:
    """RLOO: score - mean of the other scores in the group; scores [n] -> [n]."""
    del norm_by_std  # leave-one-out baselines are not scaled
    return _outcome(core_algos.compute_rloo_outcome_advantage, scores, groups=groups)


def row_advantages(
    name: str,
    *,
    scores: torch.Tensor,
    groups: np.ndarray,
    row_rollout: torch.Tensor,
    response_mask: torch.Tensor,
    norm_by_std: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token advantages [B, R] and the per-rollout ones [n].

    ``scores`` [n] and ``groups`` [n] describe rollouts; ``row_rollout`` [B]
    gives each row's rollout index into them; ``response_mask`` [B, R] is 1 on
    model tokens. Tokens outside the mask get advantage 0.
    """
    per_rollout = ADVANTAGES[name](scores, groups, norm_by_std=norm_by_std)
    per_row = per_rollout[row_rollout]
    return per_row.unsqueeze(-1) * response_mask.to(per_row.dtype), per_rollout


# -- log-probs and entropy -----------------------------------------------------


def token_log_probs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token] in float32; logits [B, R, V], tokens [B, R] -> [B, R]."""
    result: torch.Tensor = verl_functional.logprobs_from_logits_naive(logits.float(), tokens)
    return result


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) in float32; logits [B, R, V] -> [B, R]."""
    result: torch.Tensor = verl_functional.entropy_from_logits(logits.float())
    return result


# -- losses --------------------------------------------------------------------


POLICY_LOSSES: tuple[str, ...] = ("vanilla",)


def actor_config(
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float,
    loss_agg_mode: str,
    policy_loss: str = "vanilla",
) -> ActorConfig:
    """The veRL ActorConfig its policy losses read (clip ratios, aggregation, batch info)."""
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=clip_ratio_low,
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        clip_ratio_c=clip_ratio_c,
        loss_agg_mode=loss_agg_mode,
        policy_loss=PolicyLossConfig(loss_mode=policy_loss),
        use_torch_compile=False,
    )


def policy_loss(
    config: ActorConfig,
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    batch_num_tokens: int,
    global_batch_size: int,
) -> tuple[torch.Tensor, dict[str, float]]:
    """veRL's policy loss for one micro-batch; all tensors [b, R] -> (scalar, metrics).

    ``old_log_prob`` is the policy that sampled (the captured log-probs), so
    the importance ratio is exp(log_prob - old_log_prob). The loss is scaled
    to the step's whole batch (``batch_num_tokens`` model tokens in
    ``global_batch_size`` rows), so summing the micro-batches' gradients gives
    the full batch's gradient, as veRL's actor does across micro-batches.
    Metrics: ``pg_clipfrac``, ``ppo_kl``, ``pg_clipfrac_lower``.
    """
    _set_batch_info(config, batch_num_tokens, global_batch_size=global_batch_size)
    loss_fn = core_algos.get_policy_loss_fn(config.policy_loss.loss_mode)  # type: ignore[no-untyped-call]
    loss, metrics = loss_fn(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask.bool(),
        loss_agg_mode=config.loss_agg_mode,
        config=config,
        rollout_is_weights=None,
    )
    return loss, {key.removeprefix("actor/"): float(value) for key, value in metrics.items()}


def aggregate(
    config: ActorConfig,
    values: torch.Tensor,
    *,
    mask: torch.Tensor,
    batch_num_tokens: int,
    global_batch_size: int,
) -> torch.Tensor:
    """veRL's agg_loss of token values [b, R] under ``mask`` [b, R], scaled to the step."""
    _set_batch_info(config, batch_num_tokens, global_batch_size=global_batch_size)
    result: torch.Tensor = core_algos.agg_loss(
        loss_mat=values,
        loss_mask=mask,
        loss_agg_mode=config.loss_agg_mode,
        **config.global_batch_info,
    )
    return result


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, *, kind: str) -> torch.Tensor:
    """veRL's per-token KL estimate between policy and reference; [b, R] -> [b, R]."""
    result: torch.Tensor = core_algos.kl_penalty(
        cast(torch.FloatTensor, log_prob), cast(torch.FloatTensor, ref_log_prob), kind
    )
    return result


def _set_batch_info(config: ActorConfig, batch_num_tokens: int, *, global_batch_size: int) -> None:
    # veRL's actor fills this dict in place before each micro-batch's loss.
    config.global_batch_info.update(
        dp_size=1,
        batch_num_tokens=batch_num_tokens,
        global_batch_size=global_batch_size,
        loss_scale_factor=config.loss_scale_factor,
    )


def group_ids(keys: Sequence[str]) -> np.ndarray:
    """An object array of group keys, as veRL's estimators index them."""
    return np.array(list(keys), dtype=object)
