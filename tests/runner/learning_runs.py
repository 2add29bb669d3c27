"""Running a learning job with ``openforge run`` and reading its curve back.

Shared by tests/runner/test_learning.py (the ReAct demo),
tests/runner/test_learning_codex.py (inside Codex CLI) and
tests/runner/test_verl_engine.py (the demo on veRL's trainer).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example_copy(tmp_path: Path, name: str, *, options: str = "") -> Path:
    """``examples/{name}`` written to ``tmp_path`` with its paths made absolute and
    ``options`` (YAML lines) added to its ``spec.training.options``."""
    text = (EXAMPLES / name).read_text()
    text = text.replace("$OPENFORGE_MANIFEST_DIR", str(EXAMPLES)).replace(
        "${OPENFORGE_MANIFEST_DIR}", str(EXAMPLES)
    )
    text = text.replace("file: tasks/", f"file: {EXAMPLES}/tasks/")
    text = text.replace("model: models/", f"model: {EXAMPLES}/models/")
    assert text.count("    options:\n") == 1, f"{name}: one spec.training.options expected"
    text = text.replace("    options:\n", "    options:\n" + options)
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def run_in_own_group(argv: list[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``openforge run`` in its own process group; on timeout stop all of it.

    A plain ``subprocess.run`` timeout kills only the runner and leaves its
    collector, server and trainer running; SIGINT is the runner's own clean stop.
    """
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
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


def train(argv: list[str], *, timeout: float) -> None:
    """Run an ``openforge run`` command line (see :func:`run_in_own_group`); it must succeed."""
    done = run_in_own_group(argv, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def rewards_by_iteration(run_dir: Path) -> dict[int, list[float]]:
    """Each iteration's rollout rewards from the journal; every rollout must have succeeded."""
    entries = [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]
    by_iteration: dict[int, list[float]] = {}
    for entry in entries:
        if entry["event"] != "finish":
            continue
        assert entry["status"] == "succeeded", entry
        by_iteration.setdefault(entry["iteration"], []).append(entry["reward"])
    return by_iteration


def fitted_rise(means: list[float]) -> float:
    """The least-squares line's rise from the first iteration to the last.

    Every iteration weighs in, so one lucky or unlucky batch of 32 moves it
    far less than it moves "first against last": the first iteration's
    leverage over 8 iterations is about half.
    """
    count = len(means)
    if count < 2:
        raise ValueError(f"a trend needs two iterations at least (got {count})")
    center = (count - 1) / 2
    mean = sum(means) / count
    slope = sum((x - center) * (y - mean) for x, y in enumerate(means)) / sum(
        (x - center) ** 2 for x in range(count)
    )
    return slope * (count - 1)


def pooled_rise(means: list[float]) -> float:
    """The later half of the iterations pooled, against the first two pooled.

    A curve that rises in a few steps and then holds (the toy tasks' usual
    shape) gains all of its rise here, where a straight line through it
    (:func:`fitted_rise`) is dragged down by the plateau and by one late dip.
    """
    count = len(means)
    if count < 4:
        raise ValueError(f"two halves need four iterations at least (got {count})")
    later = means[count // 2 :]
    return sum(later) / len(later) - (means[0] + means[1]) / 2


def assert_rise(by_iteration: dict[int, list[float]], *, iterations: int, at_least: float) -> None:
    """The pass rate must rise by ``at_least`` and end above where it began.

    32 rollouts per iteration. The rise is measured two ways, each prespecified
    (:func:`fitted_rise`, the least-squares line through every iteration;
    :func:`pooled_rise`, the later half against the first two); either may clear
    ``at_least``. For a policy that does not learn, each has expectation 0 and a
    standard error of 0.07-0.09 (p ~ 0.3, 8-10 iterations), so at 0.2 the chance that
    either clears it is about 1% (tests/runner/test_learning_runs.py simulates it).
    "Ends above" pools the last two iterations (64 rollouts) against the first,
    which a collapse late in the run fails.
    """
    assert sorted(by_iteration) == list(range(iterations))
    assert all(len(rewards) == 32 for rewards in by_iteration.values())
    means = [sum(by_iteration[i]) / 32 for i in range(iterations)]
    late = (means[-2] + means[-1]) / 2
    curve = ", ".join(f"{m:.2f}" for m in means)
    fitted, pooled = fitted_rise(means), pooled_rise(means)
    assert max(fitted, pooled) >= at_least, (
        f"fitted rise {fitted:+.2f}, later half against the first two {pooled:+.2f}, "
        f"neither {at_least:+.2f}; pass rate per iteration: {curve}"
    )
    assert late > means[0], f"ended below the start; pass rate per iteration: {curve}"


def training_steps(run_dir: Path) -> list[dict[str, Any]]:
    """The trainer's metrics, one entry per step."""
    lines = (run_dir / "train" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]
