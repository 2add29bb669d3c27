"""The step guard's measures, on hand-made log-probs."""

from __future__ import annotations

import math

import pytest
import torch
from openforge_trainer.training import update_guard


def test_the_positive_shift_averages_only_positive_advantage_response_tokens() -> None:
    before = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, 0.0]])
    after = torch.tensor([[-0.5, -1.0, -9.0], [-4.0, -2.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])  # the third column is padding
    advantages = torch.tensor([[0.7, 0.7, 0.7], [-0.7, -0.7, -0.7]])
    size = update_guard.measure(before, after, mask=mask, advantages=advantages)
    assert size.positive_shift == pytest.approx((0.5 + 1.0) / 2)
    d = [0.5, 1.0, -3.0, -1.0]  # log-ratios of the four masked tokens
    assert size.kl == pytest.approx(sum(math.exp(x) - 1 - x for x in d) / 4)


def test_a_step_that_lowers_what_worked_or_moves_too_far_is_unacceptable() -> None:
    mask = torch.ones(1, 2)
    positive = torch.ones(1, 2)
    before = torch.tensor([[-1.0, -1.0]])
    lowered = update_guard.measure(
        before, torch.tensor([[-1.5, -0.9]]), mask=mask, advantages=positive
    )
    assert lowered.positive_shift == pytest.approx(-0.2)
    assert not lowered.acceptable(max_kl=0.0)
    raised = update_guard.measure(
        before, torch.tensor([[-0.5, -0.9]]), mask=mask, advantages=positive
    )
    assert raised.acceptable(max_kl=0.0)
    assert raised.acceptable(max_kl=raised.kl)
    assert not raised.acceptable(max_kl=raised.kl / 2)


def test_without_positive_tokens_nothing_can_be_unlearned() -> None:
    before = torch.tensor([[-1.0, -1.0]])
    size = update_guard.measure(
        before, before - 5, mask=torch.ones(1, 2), advantages=torch.tensor([[-1.0, -1.0]])
    )
    assert size.positive_shift == 0.0 and size.kl > 1.0


def test_shapes_must_agree() -> None:
    with pytest.raises(ValueError, match=r"mask \(2, 3\)"):
        update_guard.measure(
            torch.zeros(2, 2),
            torch.zeros(2, 2),
            mask=torch.zeros(2, 3),
            advantages=torch.zeros(2, 2),
        )


def test_scales_halve_then_drop() -> None:
    assert update_guard.scales(3) == [0.5, 0.25, 0.125, 0.0]
    assert update_guard.scales(0) == [0.0]
    with pytest.raises(ValueError, match="backtracks"):
        update_guard.scales(-1)


def test_interpolate_moves_each_parameter_along_its_step() -> None:
    layer = torch.nn.Linear(2, 1)
    start = [p.detach().clone() for p in layer.parameters()]
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.add_(1.0)
    update_guard.interpolate(list(layer.parameters()), start, ratio=0.25)
    for parameter, origin in zip(layer.parameters(), start, strict=True):
        assert torch.allclose(parameter, origin + 0.25)
    update_guard.interpolate(list(layer.parameters()), start, ratio=0.0)
    for parameter, origin in zip(layer.parameters(), start, strict=True):
        assert torch.equal(parameter, origin)
