"""The policy learns inside a real harness, on CPU, through the real path.

`openforge run examples/react-toy.yaml`: the ReAct harness process talks to
its own capture sidecar, which generates from `openforge serve` (the
warm-started tiny policy); the collector stores every call; `openforge
train` takes a GRPO step per iteration with veRL's functions and pushes the
new weights to the server. The pass rate must rise by a wide margin, and
the logprobs the trainer recomputes must match the captured ones.
Without the gradient step the reward would stay where the warm-start put it
(~0.27 on these tasks, measured in examples/models/tiny-react/README.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_reward_rises_inside_the_react_harness(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "openforge.cli", "run", str(ROOT / "examples" / "react-toy.yaml"),
         "--run-dir", str(run_dir), "--iterations", "5", "--quiet"],
        capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finished = [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]
    finished = [e for e in finished if e["event"] == "finish"]
    by_iteration: dict[int, list[float]] = {}
    for entry in finished:
        assert entry["status"] == "succeeded", entry
        by_iteration.setdefault(entry["iteration"], []).append(entry["reward"])
    first, last = (sum(by_iteration[i]) / len(by_iteration[i]) for i in (0, 4))
    assert len(by_iteration[0]) == len(by_iteration[4]) == 32
    assert last - first >= 0.25, f"pass rate {first:.2f} -> {last:.2f}"
    steps = [json.loads(line) for line in (run_dir / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [s["policy_version"] for s in steps] == [1.0, 2.0, 3.0, 4.0, 5.0]
    # token exactness across the loop: what was sampled is what is trained
    assert max(s["logprob_diff_max"] for s in steps) < 1e-4
