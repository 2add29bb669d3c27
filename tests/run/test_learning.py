"""The policy learns inside a real harness, on CPU, through the real path.

`openforge run examples/react-toy.yaml`: the ReAct harness process talks to
its own capture sidecar, which generates from `openforge serve` (the
warm-started tiny policy); the collector stores every call; `openforge
train` takes a GRPO step per iteration with veRL's functions and pushes the
new weights to the server. The pass rate must rise by a wide margin, and
the logprobs the trainer recomputes must match the captured ones.
Without the gradient step the reward would stay where the warm-start put it
(~0.27 on these tasks, measured in examples/models/tiny-react/README.md).

The comparison is iteration 0 (32 rollouts of the warm start) against the
last two iterations pooled (64 rollouts), so one unlucky batch of 32 cannot
decide it: the standard error of that difference is about 0.09, and a run at
the example's learning rate (5e-4) goes ~0.19 -> ~0.53 by iterations 3-4.
At 1e-3 the tiny policy sometimes collapsed into repeating the tool name
(tied embeddings + Adam's early sign-like steps), which is why it is 5e-4.
"""

from __future__ import annotations

import sys
from pathlib import Path

import learning_runs
import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


# 5 iterations take ~4 min on two idle cores; far longer when they are shared
@pytest.mark.timeout(1500)
def test_reward_rises_inside_the_react_harness(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    learning_runs.train(
        [sys.executable, "-m", "openforge.cli", "run", str(ROOT / "examples" / "react-toy.yaml"),
         "--run-dir", str(run_dir), "--iterations", "5", "--quiet"],
        timeout=1400,
    )
    by_iteration = learning_runs.rewards_by_iteration(run_dir)
    learning_runs.assert_rise(by_iteration, iterations=5, at_least=0.2)
    steps = learning_runs.training_steps(run_dir)
    assert [s["policy_version"] for s in steps] == [1.0, 2.0, 3.0, 4.0, 5.0]
    # token exactness across the loop: what was sampled is what is trained
    assert max(s["logprob_diff_max"] for s in steps) < 1e-4
