"""`openforge run` trains for real while no rollout can be trained (the harness exits at
once, before any model call): each iteration still gets its step, one that trains
nothing, and the run goes on to its end instead of waiting for a step that never comes
(it waited 1800 s, then failed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import learning_runs
import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

pytestmark = pytest.mark.slow


def failing_job(tmp_path: Path) -> Path:
    """The ReAct demo on two tasks, two samples each, whose harness exits at once."""
    lines = (EXAMPLES / "tasks" / "toy-tools" / "demo.jsonl").read_text().splitlines()[:2]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(lines) + "\n")
    path = learning_runs.example_copy(tmp_path, "react-toy.yaml")
    text = path.read_text()
    text = text.replace(f"file: {EXAMPLES}/tasks/toy-tools/demo.jsonl", f"file: {tasks}")
    text = text.replace("samplesPerTask: 4", "samplesPerTask: 2")
    text = text.replace("maxAttemptsPerRollout: 2", "maxAttemptsPerRollout: 1")
    start = text.index("  local:\n", text.index("name: react-toy"))
    end = text.index("  grader:\n", start)
    text = text[:start] + "  local:\n    command: [bash, -c, 'exit 3']\n    args: []\n" + text[end:]
    path.write_text(text)
    return path


def test_a_run_with_nothing_to_train_gets_a_step_per_iteration_and_ends(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "openforge.cli", "run", str(failing_job(tmp_path))]
    done = learning_runs.run_in_own_group(
        [*argv, "--run-dir", str(run_dir), "--iterations", "2", "--quiet"], timeout=420
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # graded all the same (the grader decides the reward), but with no model tokens
    assert "iteration 1/2: 4/4 done, 0 failed, mean reward 0.0" in done.stdout
    assert "iteration 2/2: 4/4 done, 0 failed, mean reward 0.0" in done.stdout
    entries = [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]
    trained = [(e["iteration"], e["policy_version"]) for e in entries if e["event"] == "trained"]
    assert trained == [(0, 1), (1, 2)]
    log = (run_dir / "trainer.log").read_text()
    assert "skipping rollout react-toy-i0-0-0: no model tokens" in log
    assert (
        "step 1 (policy v1): nothing to train in batch '0/4', every group skipped (group too "
        "small: 0 usable rollout(s) in 'train-000@v0#0/4'; group too small: 0 usable "
        "rollout(s) in 'train-001@v0#0/4'); the weights are unchanged, published 1/1"
    ) in log
    assert "step 2 (policy v2): nothing to train in batch '1/4'" in log
