"""A backtracking check of one optimiser step against its own batch.

An on-policy step can overshoot: pushing a failed rollout's tokens down also
moves the tokens it shares with the successes (a tool-call format, the choice
to call a tool at all), and one Adam step of a small policy at a high
learning rate can then make what worked *less* likely, after which the pass
rate collapses and does not come back (docs/harnesses.md, "Learning inside
Codex CLI"). The trainer re-scores the step's batch after the step and, while
the step is unacceptable, halves it (``theta_old + scale * delta``); after the
last halving it drops the step. Acceptable means:

* the mean log-likelihood change of the positive-advantage tokens is not
  negative: the step did not unlearn what it was reinforcing, and
* with a ``max_kl``, the token-mean KL(before || after) on the batch's own
  sampled tokens is at most ``max_kl``: the k3 estimate ``exp(d) - 1 - d``
  of veRL's ``low_var_kl``, without its per-token clamp at 10, so one token
  that moved far counts in full.

Pure functions here; :class:`openforge_trainer.training.loop.Trainer` owns
the parameters and the re-scoring. Adam's moments keep the full step's
gradient (only the parameters move back), as a line search over the step's
length would.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import torch


@dataclasses.dataclass(frozen=True)
class StepSize:
    """How far one update moved the policy on its own batch's response tokens."""

    positive_shift: float  # mean log p(after) - log p(before) over positive-advantage tokens
    kl: float  # token mean of k3 = exp(d) - 1 - d, d = log p(after) - log p(before)

    def acceptable(self, max_kl: float) -> bool:
        """The step kept its positive tokens' likelihood and stayed within ``max_kl`` (0: any)."""
        return self.positive_shift >= 0.0 and (max_kl <= 0 or self.kl <= max_kl)


def measure(
    before: torch.Tensor, after: torch.Tensor, *, mask: torch.Tensor, advantages: torch.Tensor
) -> StepSize:
    """The step's size from log-probs before and after it, all [B, R].

    ``mask`` marks the response tokens the step trained on (1) and
    ``advantages`` holds each token's advantage. With no positive-advantage
    token the positive shift is 0 (nothing to unlearn).
    """
    if not before.shape == after.shape == mask.shape == advantages.shape:
        raise ValueError(
            f"shapes differ: before {tuple(before.shape)}, after {tuple(after.shape)}, "
            f"mask {tuple(mask.shape)}, advantages {tuple(advantages.shape)}"
        )
    weight = mask.to(torch.float32)
    log_ratio = (after - before).to(torch.float32).clamp(-20.0, 20.0) * weight
    k3 = (torch.exp(log_ratio) - 1.0 - log_ratio) * weight
    positive = weight * (advantages > 0)
    positive_count = float(positive.sum())
    return StepSize(
        positive_shift=float((log_ratio * positive).sum()) / positive_count
        if positive_count
        else 0.0,
        kl=float(k3.sum()) / max(float(weight.sum()), 1.0),
    )


def scales(backtracks: int) -> list[float]:
    """The step lengths tried after the full step: 1/2, 1/4, ... (``backtracks`` of them),
    then 0."""
    if backtracks < 0:
        raise ValueError(f"backtracks must be at least 0 (got {backtracks})")
    return [0.5**number for number in range(1, backtracks + 1)] + [0.0]


@torch.no_grad()
def interpolate(
    parameters: Iterable[torch.nn.Parameter], start: Sequence[torch.Tensor], *, ratio: float
) -> None:
    """Move each parameter to ``start + ratio * (parameter - start)`` in place."""
    for parameter, origin in zip(parameters, start, strict=True):
        parameter.sub_(origin).mul_(ratio).add_(origin)
