"""`openforge run` with ``spec.training.engine: verl``: the demo trained by veRL's Ray trainer.

examples/react-toy-verl.yaml, as a user runs it, for 3 iterations: the real
ReAct harness runs each task's 4 samples against its own capture sidecar,
which generates from ``openforge serve``; ``openforge train-verl`` runs veRL's
own trainer (a local Ray cluster, TaskRunner, TransferQueue, 2 FSDP2 workers
over gloo, our agent loop and ``external`` rollout), which takes each step's
groups from the store as the sidecars captured them and publishes each step's
weights to ``openforge serve``; the next iteration's rollouts are sampled by
them. The options add veRL keys that recompute the old log-probs (its
decoupled mode) with truncated importance sampling, to measure the captured
log-probs against veRL's own. The run is made in two: 2 iterations, then the same
command with 3, which resumes veRL from its step-2 checkpoint (as a stopped run
is continued), so its third step follows the first two; there, once veRL has
resumed, its process is SIGKILLed: the runner kills the rest of its Ray cluster and
restarts it, and it resumes again.

The option checks (a bad veRL key named before anything starts) are in
tests/runner/test_run_cli.py; the builders in tests/trainer/training/.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import learning_runs
import pytest
import transformers
from openforge_trainer.collection import store
from openforge_trainer.trajectories import export

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
ITERATIONS = 3
TASKS = 8
SAMPLES = 4

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def verl_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The run directory and what ``openforge run`` printed."""
    base = tmp_path_factory.mktemp("verl-engine")
    manifest = learning_runs.example_copy(
        base,
        "react-toy-verl.yaml",
        options="      algorithm.rollout_correction.bypass_mode: false\n"
        "      algorithm.rollout_correction.rollout_is: token\n",
    )
    run_dir = base / "run"
    resumed = f"Resuming from {run_dir / 'train' / 'checkpoints'}/global_step_{ITERATIONS - 1}"
    killed: list[int] = []
    for iterations in (ITERATIONS - 1, ITERATIONS):
        if iterations == ITERATIONS:  # the trainer SIGKILLed once it resumed: it resumes again
            threading.Thread(
                target=_kill_trainer_after, args=(run_dir, resumed, killed), daemon=True
            ).start()
        done = learning_runs.run_in_own_group(
            [
                *(sys.executable, "-m", "openforge.cli", "run", str(manifest)),
                *("--run-dir", str(run_dir), "--iterations", str(iterations), "--quiet"),
            ],
            timeout=1500,
        )
        trainer_log = (run_dir / "trainer.log").read_text(errors="replace")
        assert done.returncode == 0, done.stdout + done.stderr + trainer_log[-6000:]
    # the second run's veRL resumed from the first's last checkpoint, twice
    assert killed and trainer_log.count(resumed) == 2, trainer_log[-6000:]
    restarts = [e for e in _journal(run_dir) if e["event"] == "service"]
    assert restarts == [
        {"event": "service", "service": "trainer", "exit_code": -9, "action": "restarted"}
    ], restarts
    return run_dir, done.stdout


def _kill_trainer_after(run_dir: Path, line: str, killed: list[int]) -> None:
    """SIGKILL the run's `openforge train-verl` (its leader alone, as the OOM killer
    would) once its log says ``line``."""
    log = run_dir / "trainer.log"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if log.exists() and line in log.read_text(errors="replace"):
            for proc in Path("/proc").iterdir():
                try:
                    argv = (proc / "cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if b"train-verl" in argv and str(run_dir).encode() in b" ".join(argv):
                    os.kill(int(proc.name), signal.SIGKILL)
                    killed.append(int(proc.name))
                    return
        time.sleep(0.5)


def _journal(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]


@pytest.mark.timeout(1800)  # the fixture's runs: ~7 min on 2 idle cores
def test_every_iteration_is_captured_trained_by_verl_and_served(
    verl_run: tuple[Path, str],
) -> None:
    run_dir, printed = verl_run
    for iteration in range(1, ITERATIONS + 1):
        assert f"iteration {iteration}/{ITERATIONS}: 32/32 done, 0 failed" in printed
    assert f"veRL metrics   {run_dir / 'train' / 'metrics.jsonl'}" in printed
    trained = [e for e in _journal(run_dir) if e["event"] == "trained"]
    assert [(e["iteration"], e["policy_version"]) for e in trained] == [(0, 1), (1, 2), (2, 3)]
    published = [
        json.loads(line)
        for line in (run_dir / "train" / "weights" / "publishes.jsonl").read_text().splitlines()
    ]
    # versions 0..2 by the first run; the second's veRL publishes the weights it resumed
    # (version 2, to its own `openforge serve`, restarted on the initial model), again
    # once restarted (the first may have been killed before it could), then 3
    versions = [(p["policy_version"], p["ok"]) for p in published]
    assert versions[:ITERATIONS] == [(v, True) for v in range(ITERATIONS)], versions
    assert versions[-1] == (ITERATIONS, True), versions
    assert set(versions[ITERATIONS:-1]) == {(ITERATIONS - 1, True)}, versions
    assert len(versions) in (ITERATIONS + 2, ITERATIONS + 3), versions
    # iteration i's rollouts were sampled by the weights of veRL's step i
    with store.Store(run_dir / "store.db") as db:
        versions = collections.defaultdict(set)
        for rollout in db.rollouts("react-toy"):
            versions[rollout.batch].add(rollout.policy_version)
    assert dict(versions) == {f"{i}/32": {i} for i in range(ITERATIONS)}


@pytest.mark.timeout(1800)
def test_verls_log_probs_are_the_captured_ones_and_every_step_updates(
    verl_run: tuple[Path, str],
) -> None:
    run_dir, _ = verl_run
    lines = (run_dir / "train" / "metrics.jsonl").read_text().splitlines()
    steps = {entry["step"]: entry["data"] for entry in map(json.loads, lines)}
    # each step once, the resumed run's appended to the first run's
    assert [json.loads(line)["step"] for line in lines] == list(range(1, ITERATIONS + 1))
    first = steps[1]
    # veRL's own comparison of the captured token probabilities with its recomputed ones.
    # Measured here: per sequence, mean |captured - recomputed log-prob| 3.8e-6; per token,
    # |captured - recomputed probability| at most 1.3e-5, 5.8e-6 on average (on synthetic
    # rollouts sampled by the trainer's own forward, 3e-10: the rest is openforge serve's
    # cached decoding against veRL's padded fp32 forward, not tracked down further). These
    # bounds catch a wrong token or position, not bf16 (veRL's default autocast gave a
    # 1.2e-5 maximum on the synthetic rollouts): the fp32 keys are checked in
    # tests/trainer/training/test_verl_launch.py.
    assert first["training/rollout_probs_diff_valid"] == 1.0
    assert first["rollout_corr/log_ppl_abs_diff"] <= 1e-5
    assert first["training/rollout_probs_diff_max"] <= 1e-4
    assert first["training/rollout_actor_probs_pearson_corr"] > 0.9999
    assert any(key.startswith("rollout_corr/rollout_is") for key in first), sorted(first)
    assert all(steps[s]["actor/grad_norm"] > 0 for s in steps)  # each a real update


def _store_rows(run_dir: Path, batch: str, tokenizer: Any) -> collections.Counter[Any]:
    """Per task, the (prompt, response) texts of the batch's rollouts, as veRL decodes them."""
    rows: collections.Counter[Any] = collections.Counter()
    with store.Store(run_dir / "store.db") as db:
        latest: dict[tuple[str, int], Any] = {}  # veRL trains a sample's latest attempt
        for rollout in db.rollouts("react-toy"):
            key = (rollout.task_id, rollout.sample_index)
            if rollout.batch == batch and (
                key not in latest or rollout.attempt > latest[key].attempt
            ):
                latest[key] = rollout
        for rollout in latest.values():
            captured, _ = export.rollout_rows(rollout, db.calls(rollout.rollout_id))
            for row in captured:
                rows[
                    (
                        rollout.task_id,
                        tokenizer.decode(row.prompt_ids, skip_special_tokens=True),
                        tokenizer.decode(row.response_ids, skip_special_tokens=True),
                    )
                ] += 1
    return rows


@pytest.mark.timeout(1800)
def test_each_step_trains_on_its_iterations_groups_of_distinct_rollouts(
    verl_run: tuple[Path, str],
) -> None:
    run_dir, _ = verl_run
    with store.Store(run_dir / "store.db") as db:
        per_sample = collections.Counter(
            (r.batch, r.task_id, r.sample_index) for r in db.rollouts("react-toy")
        )
    assert len(per_sample) == ITERATIONS * TASKS * SAMPLES
    tokenizer = transformers.AutoTokenizer.from_pretrained(EXAMPLES / "models" / "tiny-react")
    tasks = {json.loads(line)["id"] for line in (EXAMPLES / "tasks/toy-tools/demo.jsonl").open()}
    for step in range(1, ITERATIONS + 1):
        dumped = [
            json.loads(line)
            for line in (run_dir / "train" / "rollouts" / f"{step}.jsonl").read_text().splitlines()
        ]
        groups: dict[str, collections.Counter[Any]] = collections.defaultdict(collections.Counter)
        for sample in dumped:  # veRL keys a sample {uid}_{session}_{output}
            groups[sample["uid"].rsplit("_", 2)[0]][(sample["input"], sample["output"])] += 1
        assert len(groups) == TASKS
        assert all(sum(g.values()) == SAMPLES for g in groups.values())
        # the groups are, sample for sample, the tasks' rollouts of this step's iteration
        expected: dict[str, collections.Counter[Any]] = collections.defaultdict(collections.Counter)
        for (task, prompt, response), count in _store_rows(
            run_dir, f"{step - 1}/32", tokenizer
        ).items():
            expected[task][(prompt, response)] += count
        assert set(expected) == tasks
        assert sorted(map(sorted, (g.items() for g in groups.values()))) == sorted(
            map(sorted, (g.items() for g in expected.values()))
        )
