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

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def run_in_own_group(argv: list[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``openforge run`` in its own process group; on timeout stop all of it.

    A plain ``subprocess.run`` timeout kills only the runner and leaves its
    collector, server and trainer running; SIGINT is the runner's own clean stop.
    """
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
        raise
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


# 5 iterations take ~4 min on two idle cores; far longer when they are shared
@pytest.mark.timeout(1500)
def test_reward_rises_inside_the_react_harness(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = run_in_own_group(
        [sys.executable, "-m", "openforge.cli", "run", str(ROOT / "examples" / "react-toy.yaml"),
         "--run-dir", str(run_dir), "--iterations", "5", "--quiet"],
        timeout=1400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finished = [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]
    finished = [e for e in finished if e["event"] == "finish"]
    by_iteration: dict[int, list[float]] = {}
    for entry in finished:
        assert entry["status"] == "succeeded", entry
        by_iteration.setdefault(entry["iteration"], []).append(entry["reward"])
    assert sorted(by_iteration) == [0, 1, 2, 3, 4]
    assert all(len(rewards) == 32 for rewards in by_iteration.values())
    first = sum(by_iteration[0]) / 32
    late = (sum(by_iteration[3]) + sum(by_iteration[4])) / 64
    curve = ", ".join(f"{sum(r) / len(r):.2f}" for _, r in sorted(by_iteration.items()))
    assert late - first >= 0.2, f"pass rate per iteration: {curve}"
    steps = [json.loads(line) for line in (run_dir / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [s["policy_version"] for s in steps] == [1.0, 2.0, 3.0, 4.0, 5.0]
    # token exactness across the loop: what was sampled is what is trained
    assert max(s["logprob_diff_max"] for s in steps) < 1e-4
