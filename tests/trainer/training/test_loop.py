"""The training loop on rollouts a tiny real model sampled into a real store.

Every test samples its rollouts with the model it then trains (torch,
temperature 1, the sampled tokens' raw log-probs recorded), so the captured
log-probs are those of the policy's own weights, as the sidecar records them
from an engine serving that policy.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import call_outcomes
import pytest
import torch
from openforge import trajectory
from openforge.trajectory.v1 import trajectory_pb2
from openforge_trainer.collection import store
from openforge_trainer.training import checkpoint, metrics, rollout_sampler
from openforge_trainer.training import config as train_config
from openforge_trainer.training import loop as trainer_loop
from safetensors.torch import load_file

torch.set_num_threads(1)
JOB = "job"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return rollout_sampler.build_tiny_model(tmp_path_factory.mktemp("policy") / "model", seed=3)


def first_token_parity(completions: Sequence[Sequence[int]]) -> float:
    return float(completions[0][0] % 2 == 0)


def sample_into(
    db_path: Path,
    model_dir: Path,
    tasks: Sequence[str],
    *,
    version: int = 0,
    seed: int = 0,
    samples: int = 4,
) -> list[str]:
    model = trainer_loop.load_model(model_dir, dtype="float32", device="cpu")
    with store.Store(db_path) as db:
        return rollout_sampler.write_rollouts(
            db,
            model,
            job=JOB,
            tasks=tasks,
            samples=samples,
            turns=2,
            max_new_tokens=6,
            policy_version=version,
            seed=seed,
            reward=first_token_parity,
        )


def settings(tmp_path: Path, model_dir: Path, **overrides: Any) -> train_config.TrainConfig:
    values: dict[str, Any] = {
        "store": tmp_path / "store.db",
        "job": JOB,
        "model": model_dir,
        "run_dir": tmp_path / "run",
        "groups_per_step": 2,
        "lr": 1e-3,
        "wait_for_groups": 0,
        "poll_interval": 0.01,
    }
    return train_config.load(**{**values, **overrides})


def quiet(line: str) -> None:
    del line


def trainer(config: train_config.TrainConfig) -> trainer_loop.Trainer:
    return trainer_loop.Trainer.open(config, publishers=[], log=quiet)


def test_recomputed_log_probs_equal_the_captured_ones_before_any_update(
    tmp_path: Path, model_dir: Path
) -> None:
    sample_into(tmp_path / "store.db", model_dir, ["a", "b"])
    run = trainer(settings(tmp_path, model_dir, micro_batch_tokens=64))
    selection = trainer_loop.select_groups(run.store, run.config, state=run.state, limit=2)
    batch = run.make_batch(selection.groups)
    mask = batch.batch["response_mask"].bool()
    recomputed = run.current_log_probs(batch)
    captured = batch.batch["rollout_log_probs"]
    assert mask.sum() > 20
    assert (recomputed - captured)[mask].abs().max() < 1e-4
    record = run.train_step(selection)  # the same check, inside the loop's first micro-step
    assert record["micro_batches"] > 1
    assert record["logprob_diff_max"] < 1e-4
    run.close()


def test_one_step_raises_the_log_probs_of_positive_advantage_tokens(
    tmp_path: Path, model_dir: Path
) -> None:
    sample_into(tmp_path / "store.db", model_dir, ["a", "b"])
    run = trainer(settings(tmp_path, model_dir))
    batch = run.make_batch(
        trainer_loop.select_groups(run.store, run.config, state=run.state, limit=2).groups
    )
    advantages = batch.batch["advantages"]
    positive, negative = advantages > 0, advantages < 0
    assert positive.any() and negative.any()
    before = run.current_log_probs(batch)
    update = run.update(batch)
    after = run.current_log_probs(batch)
    assert update["update_skipped"] == 0.0 and update["grad_norm"] > 0
    change = after - before
    assert change[positive].mean() > 1e-4  # without the optimiser step this is exactly 0
    assert change[negative].mean() < -1e-4
    run.close()


def positive_shift_of_one_update(
    tmp_path: Path, model_dir: Path, **overrides: Any
) -> tuple[float, dict[str, float]]:
    tmp_path.mkdir(exist_ok=True)
    sample_into(tmp_path / "store.db", model_dir, ["a", "b"])
    run = trainer(settings(tmp_path, model_dir, **overrides))
    batch = run.make_batch(
        trainer_loop.select_groups(run.store, run.config, state=run.state, limit=2).groups
    )
    positive = batch.batch["advantages"] > 0
    before = run.current_log_probs(batch)
    update = run.update(batch)
    shift = float((run.current_log_probs(batch) - before)[positive].mean())
    run.close()
    return shift, update


def test_the_update_guard_halves_a_step_that_unlearns_what_worked(
    tmp_path: Path, model_dir: Path
) -> None:
    # at lr 1 one Adam step overshoots: the positive-advantage tokens fall
    shift, update = positive_shift_of_one_update(tmp_path / "plain", model_dir, lr=1.0)
    assert shift < -1.0 and "update_scale" not in update
    shift, update = positive_shift_of_one_update(
        tmp_path / "guarded", model_dir, lr=1.0, update_backtracks=4
    )
    assert 0 < update["update_scale"] < 1
    assert update["update_backtracks"] == -math.log2(update["update_scale"])
    assert shift >= 0 and update["update_positive_shift"] == pytest.approx(shift, abs=1e-4)
    # a sane step passes the guard untouched
    _, update = positive_shift_of_one_update(
        tmp_path / "small", model_dir, lr=1e-3, update_backtracks=4
    )
    assert update["update_scale"] == 1.0 and update["update_backtracks"] == 0.0


def test_the_update_guard_drops_a_step_it_cannot_shrink_into_the_kl_bound(
    tmp_path: Path, model_dir: Path
) -> None:
    shift, update = positive_shift_of_one_update(
        tmp_path, model_dir, lr=1e-3, update_backtracks=2, max_update_kl=1e-12
    )
    assert update["update_scale"] == 0.0 and update["update_backtracks"] == 3.0
    assert shift == pytest.approx(0.0, abs=1e-6)  # the parameters are back where they were
    assert update["grad_norm"] > 0


def test_micro_batching_does_not_change_the_update(tmp_path: Path, model_dir: Path) -> None:
    # Adam's first step is lr * g / (|g| + eps): at the default eps a parameter whose
    # gradient is near eps moves by a fraction of lr set by rounding (CI saw 1e-6 apart).
    # With eps 1 the step is lr * g for these gradients, so the parameters' moves compare
    # the accumulated gradients themselves: a micro-batch normalised wrongly moves them
    # by a multiple.
    sample_into(tmp_path / "store.db", model_dir, ["a", "b"])
    runs = [
        trainer(
            settings(
                tmp_path,
                model_dir,
                run_dir=tmp_path / name,
                micro_batch_tokens=budget,
                adam_eps=1.0,
            )
        )
        for name, budget in (("whole", 100_000), ("split", 1))
    ]
    before = {name: p.detach().clone() for name, p in runs[0].model.named_parameters()}
    records = []
    for run in runs:
        selection = trainer_loop.select_groups(run.store, run.config, state=run.state, limit=2)
        records.append(run.update(run.make_batch(selection.groups)))
    assert records[0]["micro_batches"] == 1 and records[1]["micro_batches"] == 8
    assert records[0]["loss"] == pytest.approx(records[1]["loss"], abs=1e-6)
    assert records[0]["grad_norm"] == pytest.approx(records[1]["grad_norm"], rel=1e-4)
    moved = 0
    for (name, one), two in zip(
        runs[0].model.named_parameters(), runs[1].model.parameters(), strict=True
    ):
        whole, split = one.detach() - before[name], two.detach() - before[name]
        scale = whole.abs().max().item()
        moved += scale > 0
        assert torch.allclose(whole, split, rtol=1e-3, atol=1e-3 * scale), name
    assert moved > 0
    for run in runs:
        run.close()


def trained_marks(db_path: Path) -> dict[str, str | None]:
    with store.Store(db_path) as db:
        return {r.rollout_id: r.trained_checkpoint for r in db.rollouts(JOB)}


def test_checkpoint_then_marks_then_the_next_groups(tmp_path: Path, model_dir: Path) -> None:
    ids = sample_into(tmp_path / "store.db", model_dir, ["a", "b", "c", "d"])
    config = settings(tmp_path, model_dir, steps=2)
    run = trainer(config)
    assert run.run() == 2
    run.close()
    first, second = checkpoint.path_for(config.run_dir, 1), checkpoint.path_for(config.run_dir, 2)
    marks = trained_marks(config.store)
    assert sorted(marks) == sorted(ids)
    assert sorted(marks.values()) == [str(first)] * 8 + [str(second)] * 8  # every rollout once
    state = checkpoint.load_state(second)
    assert (state.step, state.policy_version) == (2, 2)
    assert {
        rid: str(checkpoint.path_for(config.run_dir, step)) for rid, step in state.trained.items()
    } == marks
    assert sorted(state.trained_tasks.items()) == [
        ("a@v0", 1),
        ("b@v0", 1),
        ("c@v0", 2),
        ("d@v0", 2),
    ]
    assert sorted(p.name for p in (config.run_dir / "checkpoints").iterdir()) == [
        first.name,
        second.name,
    ]


def test_a_crash_between_checkpoint_and_marks_is_repaired_on_restart(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sample_into(tmp_path / "store.db", model_dir, ["a", "b", "c", "d"])
    config = settings(tmp_path, model_dir, steps=2)
    crashing = trainer(config)

    def crash(*args: object, **kwargs: object) -> int:
        raise RuntimeError("killed after the checkpoint, before the marks")

    monkeypatch.setattr(crashing.store, "mark_trained", crash)
    with pytest.raises(RuntimeError, match="before the marks"):
        crashing.run()
    crashing.close()
    first = checkpoint.path_for(config.run_dir, 1)
    assert first.is_dir()
    assert set(trained_marks(config.store).values()) == {None}

    restarted = trainer(config)
    assert restarted.state.step == 1 and restarted.remarked == 8
    marks = trained_marks(config.store)
    assert sorted(marks.values(), key=str) == [str(first)] * 8 + [None] * 8
    assert restarted.run() == 1  # the remaining groups, not the first ones again
    restarted.close()
    marks = trained_marks(config.store)
    second = str(checkpoint.path_for(config.run_dir, 2))
    assert sorted(marks.values()) == [str(first)] * 8 + [second] * 8
    assert sorted(checkpoint.load_state(Path(second)).trained_tasks.items()) == [
        ("a@v0", 1),
        ("b@v0", 1),
        ("c@v0", 2),
        ("d@v0", 2),
    ]


def test_a_crash_before_the_checkpoint_trains_the_groups_once_after_restart(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sample_into(tmp_path / "store.db", model_dir, ["a", "b", "c", "d"])
    config = settings(tmp_path, model_dir, steps=2)
    crashing = trainer(config)
    crashing.train_step(
        trainer_loop.select_groups(crashing.store, config, state=crashing.state, limit=2)
    )
    real_save = checkpoint.save

    def crash(*args: object, **kwargs: object) -> Path:
        raise RuntimeError("killed while writing the checkpoint")

    monkeypatch.setattr(checkpoint, "save", crash)
    failed = trainer_loop.select_groups(crashing.store, config, state=crashing.state, limit=2)
    with pytest.raises(RuntimeError, match="writing the checkpoint"):
        crashing.train_step(failed)
    crashing.close()
    monkeypatch.setattr(checkpoint, "save", real_save)
    first = checkpoint.path_for(config.run_dir, 1)
    assert checkpoint.latest(config.run_dir) == first
    assert sorted(trained_marks(config.store).values(), key=str) == [str(first)] * 8 + [None] * 8

    restarted = trainer(config)  # back at step 1, with step 1's weights
    saved = load_file(first / "model.safetensors")
    for name, tensor in restarted.model.state_dict().items():
        if name in saved:
            assert torch.equal(tensor, saved[name]), name
    assert restarted.run() == 1
    restarted.close()
    state = checkpoint.load_state(checkpoint.path_for(config.run_dir, 2))
    assert sorted(task for task, step in state.trained_tasks.items() if step == 2) == sorted(
        group.task_id for group in failed.groups
    )
    marks = trained_marks(config.store)
    second = str(checkpoint.path_for(config.run_dir, 2))
    assert sorted(marks.values()) == [str(first)] * 8 + [second] * 8


def test_the_staleness_limit_skips_and_counts_old_groups(tmp_path: Path, model_dir: Path) -> None:
    sample_into(tmp_path / "store.db", model_dir, ["a", "b", "c"], samples=2)
    config = settings(tmp_path, model_dir, groups_per_step=1, max_staleness=1)
    run = trainer(config)
    assert run.run() == 2  # a at staleness 0, b at 1; c would be 2 > 1
    stale = {rid: reason for rid, reason in run.state.skipped.items() if "-c-" in rid}
    assert len(stale) == 2
    assert all(
        r.startswith("stale: sampled at policy version 0, trainer at 2") for r in stale.values()
    )
    sample_into(tmp_path / "store.db", model_dir, ["d"], version=2, seed=7, samples=2)
    assert run.run() == 1  # fresh rollouts train
    run.close()
    last = metrics.read(config.run_dir / metrics.JSONL)[-1]
    assert (last["skipped_stale_total"], last["staleness_max"], last["step"]) == (2, 0, 3)
    assert set(trained_marks(config.store).values()) - {None} == {
        str(checkpoint.path_for(config.run_dir, step)) for step in (1, 2, 3)
    }
    assert [v for k, v in trained_marks(config.store).items() if "-c-" in k] == [None, None]


def record(rollout: str, task: str, sample: int, *, body: str, **fields: Any) -> Any:
    kinds = {
        "started": trajectory_pb2.RolloutStarted,
        "call": trajectory_pb2.ModelCall,
        "finished": trajectory_pb2.RolloutFinished,
    }
    values = {"task_id": task, "sample_index": sample, "attempt": 1} if body == "started" else {}
    return trajectory_pb2.Record(**{body: kinds[body](**{**values, **fields})})


def put(db_path: Path, rollout: str, records: list[Any]) -> None:
    for sequence, item in enumerate(records, start=1):
        item.sequence, item.job, item.rollout_id = sequence, JOB, rollout
        item.idempotency_key = f"{rollout}/{item.WhichOneof('body')}/{sequence}"
    with store.Store(db_path) as db:
        db.put(records)


def test_selection_waits_for_whole_groups_and_skips_what_cannot_train(
    tmp_path: Path, model_dir: Path
) -> None:
    db_path = tmp_path / "store.db"
    sample_into(db_path, model_dir, ["a", "b"], samples=3)
    # task a: one more rollout still running -> not ready while group_size is 0
    put(db_path, "a-running", [record("a-running", "a", 7, body="started")])
    # task b: a retry of sample 0 supersedes the first attempt; a rollout without a reward
    call = {
        "call_index": 0,
        "prompt_token_ids": [1, 11, 12],
        "completion_token_ids": [13, 2],
        "http_status": 200,
        "finish_reason": "stop",
    }
    put(
        db_path,
        "b-retry",
        [
            record("b-retry", "b", 0, body="started", attempt=2),
            record("b-retry", "b", 0, body="call", completion_logprobs=[-0.5, -0.5], **call),
            record("b-retry", "b", 0, body="finished", has_reward=True, reward=1.0, call_count=1),
        ],
    )
    put(
        db_path,
        "b-noreward",
        [
            record("b-noreward", "b", 5, body="started"),
            record("b-noreward", "b", 5, body="call", completion_logprobs=[-0.5, -0.5], **call),
            record("b-noreward", "b", 5, body="finished", call_count=1),
        ],
    )
    # task e: logprobs were not captured (passthrough) -> too small a group once skipped
    put(
        db_path,
        "e-0",
        [
            record("e-0", "e", 0, body="started"),
            record("e-0", "e", 0, body="call", **call),
            record("e-0", "e", 0, body="finished", has_reward=True, reward=1.0, call_count=1),
        ],
    )
    config = settings(tmp_path, model_dir, groups_per_step=5)
    state = checkpoint.TrainerState()
    with store.Store(db_path) as db:
        selection = trainer_loop.select_groups(db, config, state=state, limit=5)
        assert [g.task_id for g in selection.groups] == ["b@v0"]
        b_ids = sorted(r.rollout_id for r in selection.groups[0].rollouts)
        assert b_ids == sorted(["b-retry", "job-b-1-v0-s0", "job-b-2-v0-s0"])
        assert selection.skipped == {
            "job-b-0-v0-s0": "superseded by attempt 2",
            "b-noreward": "no reward",
        }
        # with an expected group size, three complete rollouts of a are enough
        sized = settings(tmp_path, model_dir, group_size=3)
        assert "a@v0" in [
            g.task_id for g in trainer_loop.select_groups(db, sized, state=state, limit=5).groups
        ]
        # a late rollout of a task that was already trained is skipped, never trained
        state.trained_tasks["b@v0"] = 1
        late = trainer_loop.select_groups(db, config, state=state, limit=5)
        assert late.skipped["b-retry"] == "late: task 'b@v0' was trained at step 1"
    # a group of two where one rollout has no logprobs is left with one: skipped whole
    put(
        db_path,
        "e-1",
        [
            record("e-1", "e", 1, body="started"),
            record("e-1", "e", 1, body="call", completion_logprobs=[-0.5, -0.5], **call),
            record("e-1", "e", 1, body="finished", has_reward=True, reward=0.0, call_count=1),
        ],
    )
    with store.Store(db_path) as db:
        skipped = trainer_loop.select_groups(
            db, config, state=checkpoint.TrainerState(), limit=5
        ).skipped
    assert skipped["e-0"] == "call 0: logprobs were not captured"
    assert skipped["e-1"] == "group too small: 1 usable rollout(s) in 'e@v0'"


def test_metrics_are_written_as_jsonl_tensorboard_and_a_png(
    tmp_path: Path, model_dir: Path
) -> None:
    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sample_into(tmp_path / "store.db", model_dir, ["a", "b", "c", "d"])
    config = settings(tmp_path, model_dir, steps=2, kl_coef=0.05)
    run = trainer(config)
    records = []
    while run.state.step < 2:
        records.append(
            run.train_step(trainer_loop.select_groups(run.store, config, state=run.state, limit=2))
        )
    run.close()
    lines = [json.loads(line) for line in (config.run_dir / metrics.JSONL).read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    for line, returned in zip(lines, records, strict=True):
        assert line == pytest.approx(returned)
    for key in (
        "reward_mean",
        "reward_std",
        "reward_min",
        "reward_max",
        "pass_rate",
        "kl",
        "entropy",
        "pg_clipfrac",
        "tokens_per_s",
        "staleness_mean",
        "grad_norm",
        "loss",
        "logprob_diff_max",
    ):
        assert key in lines[0], key
    assert lines[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # the policy is still the reference
    assert lines[1]["kl"] > 0
    with store.Store(config.store) as db:
        first = str(checkpoint.path_for(config.run_dir, 1))
        rewards = [r.reward for r in db.rollouts(JOB) if r.trained_checkpoint == first]
    assert lines[0]["reward_mean"] == pytest.approx(sum(rewards) / 8)
    assert lines[0]["pass_rate"] == pytest.approx(sum(r >= 1.0 for r in rewards) / 8)
    events = EventAccumulator(str(config.run_dir / metrics.TENSORBOARD))
    events.Reload()
    assert [(e.step, pytest.approx(e.value)) for e in events.Scalars("reward_mean")] == [
        (1, lines[0]["reward_mean"]),
        (2, lines[1]["reward_mean"]),
    ]
    with Image.open(config.run_dir / metrics.CURVE) as image:
        assert image.format == "PNG" and image.size[0] > 100


def test_resume_restores_optimizer_and_drops_metrics_of_unsaved_steps(
    tmp_path: Path, model_dir: Path
) -> None:
    sample_into(tmp_path / "store.db", model_dir, ["a", "b"])
    config = settings(tmp_path, model_dir, steps=1)
    run = trainer(config)
    run.run()
    moments = {k: v["exp_avg"].clone() for k, v in enumerate(run.optimizer.state.values())}
    run.close()
    with open(
        config.run_dir / metrics.JSONL, "a"
    ) as handle:  # a step whose checkpoint never landed
        handle.write(json.dumps({"step": 2, "reward_mean": 9.0}) + "\n")
    again = trainer(config)
    restored = {k: v["exp_avg"] for k, v in enumerate(again.optimizer.state.values())}
    assert restored.keys() == moments.keys()
    assert all(torch.equal(moments[k], restored[k]) for k in moments)
    assert [r["step"] for r in again.metrics.history] == [1]
    again.close()
    assert (
        dataclasses.asdict(checkpoint.load_state(checkpoint.path_for(config.run_dir, 1)))["step"]
        == 1
    )


def test_a_task_revisited_by_a_newer_policy_is_a_new_group(tmp_path: Path, model_dir: Path) -> None:
    """Iterations sample the same tasks again: the group is (task, policy version),
    so the second visit is trained, not skipped as late."""
    first = sample_into(tmp_path / "store.db", model_dir, ["a"])
    config = settings(tmp_path, model_dir, steps=1)
    run = trainer(config)
    assert run.run() == 1
    run.close()
    second = sample_into(tmp_path / "store.db", model_dir, ["a"], version=1, seed=1)
    assert not set(first) & set(second)
    run = trainer(settings(tmp_path, model_dir, steps=2))
    assert run.run() == 1  # resumes at step 1, trains step 2
    run.close()
    state = checkpoint.load_state(checkpoint.path_for(config.run_dir, 2))
    assert state.trained_tasks == {"a@v0": 1, "a@v1": 2}
    assert sorted(trained_marks(config.store).values()) == sorted(
        [str(checkpoint.path_for(config.run_dir, 1))] * len(first)
        + [str(checkpoint.path_for(config.run_dir, 2))] * len(second)
    )


def test_failed_calls_are_never_trained_and_a_rollout_of_failed_calls_only_is_skipped(
    tmp_path: Path,
) -> None:
    """Calls cut off mid-stream or refused stay out of the rows the trainer trains on."""
    db_path = tmp_path / "store.db"
    with store.Store(db_path) as db:
        for sample in (0, 1):
            db.put(
                call_outcomes.records(
                    f"f-{sample}",
                    call_outcomes.MIXED,
                    job=JOB,
                    task="f",
                    sample=sample,
                    reward=sample,
                )
            )
        failed = (
            call_outcomes.disconnected(0, [1, 2, 3], [7, 8]),
            call_outcomes.refused(1, [1, 2, 3]),
        )
        db.put(call_outcomes.records("f-2", failed, job=JOB, task="f", sample=2))
    config = settings(tmp_path, tmp_path / "model")  # selection loads no model
    with store.Store(db_path) as db:
        selection = trainer_loop.select_groups(db, config, state=checkpoint.TrainerState(), limit=5)
    [group] = selection.groups
    assert sorted(r.rollout_id for r in group.rollouts) == ["f-0", "f-1"]
    assert [(row.call_indices, row.response_ids) for row in group.rows] == [([0], [10, 11])] * 2
    assert selection.skipped == {
        "f-2": "no model tokens (failed calls not trained: 1 aborted, 1 refused)"
    }


def test_a_stopped_attempt_is_never_trained_nor_counted_towards_its_group(
    tmp_path: Path, model_dir: Path
) -> None:
    """A cut-off attempt (finished ``stopped``) does not make its group ready: the group
    waits for the attempt that replaces it."""
    db_path = tmp_path / "store.db"
    sample_into(db_path, model_dir, ["a"], samples=2)
    put(db_path, "a-stopped", [
        record("a-stopped", "a", 2, body="started"),
        record("a-stopped", "a", 2, body="finished", status="stopped", exit_code=-1),
    ])  # fmt: skip
    sized = settings(tmp_path, model_dir, group_size=3)
    with store.Store(db_path) as db:
        waiting = trainer_loop.select_groups(db, sized, state=checkpoint.TrainerState(), limit=5)
        assert waiting.groups == [] and "a-stopped" not in waiting.skipped
        # without a group size the group goes on without the cut-off sample, which may never
        # be tried again (a pod deleted at its job's deadline)
        unsized = settings(tmp_path, model_dir)
        state = checkpoint.TrainerState()
        [alone] = trainer_loop.select_groups(db, unsized, state=state, limit=5).groups
        assert len(alone.rollouts) == 2 and "a-stopped" not in {
            r.rollout_id for r in alone.rollouts
        }
    call = {
        "call_index": 0,
        "prompt_token_ids": [1, 11, 12],
        "completion_token_ids": [13, 2],
        "http_status": 200,
        "finish_reason": "stop",
    }
    put(db_path, "a-retry", [
        record("a-retry", "a", 2, body="started", attempt=2),
        record("a-retry", "a", 2, body="call", completion_logprobs=[-0.5, -0.5], **call),
        record("a-retry", "a", 2, body="finished", has_reward=True, reward=1.0, call_count=1),
    ])  # fmt: skip
    with store.Store(db_path) as db:
        [group] = trainer_loop.select_groups(
            db, sized, state=checkpoint.TrainerState(), limit=5
        ).groups
        assert "a-retry" in {r.rollout_id for r in group.rollouts}
        assert "a-stopped" not in {r.rollout_id for r in group.rollouts}


def test_two_batches_at_one_policy_version_are_two_groups_trained_a_batch_a_step(
    tmp_path: Path, model_dir: Path
) -> None:
    """Iterations 0 and 1 both sampled at v0 (a rerun after a stop before training):
    their groups never merge, a step takes one batch's groups, and a batch whose every
    rollout is complete is trained even with fewer groups than groups_per_step."""
    db_path = tmp_path / "store.db"
    sample_into(db_path, model_dir, ["a", "b"], samples=2)  # no batch: the operator's
    batches = tmp_path / "batches.db"
    model = trainer_loop.load_model(model_dir, dtype="float32", device="cpu")
    for batch, tasks in (("1/4", ["a", "b"]), ("0/6", ["a", "b"]), ("10/2", ["a"])):
        with store.Store(batches) as db:
            rollout_sampler.write_rollouts(
                db, model, job=JOB, tasks=tasks, samples=2, turns=2, max_new_tokens=6,
                reward=first_token_parity, batch=batch,
            )  # fmt: skip
    config = settings(tmp_path, model_dir, groups_per_step=8).model_copy(update={"store": batches})
    with store.Store(batches) as db:
        first = trainer_loop.select_groups(db, config, state=checkpoint.TrainerState(), limit=8)
        # batch 0 says it has 6 rollouts and 4 are in: its groups wait (not settled)
        assert (
            sorted(g.task_id for g in first.groups) == ["a@v0#0/6", "b@v0#0/6"]
            and not first.settled
        )
        assert {r.batch for g in first.groups for r in g.rollouts} == {"0/6"}
        rollout_sampler.write_rollouts(
            db, model, job=JOB, tasks=["c"], samples=2, turns=2, max_new_tokens=6,
            reward=first_token_parity, batch="0/6",
        )  # fmt: skip
        assert trainer_loop.select_groups(
            db, config, state=checkpoint.TrainerState(), limit=8
        ).settled
        done = trainer_loop.select_groups(db, config, state=checkpoint.TrainerState(), limit=8)
        state = checkpoint.TrainerState(
            trained_tasks={g.task_id: 1 for g in done.groups},
            trained={r.rollout_id: 1 for g in done.groups for r in g.rollouts},
        )
        second = trainer_loop.select_groups(db, config, state=state, limit=8)
        assert sorted(g.task_id for g in second.groups) == ["a@v0#1/4", "b@v0#1/4"]  # 1 before 10
        assert second.settled
    with store.Store(db_path) as db:  # rollouts without a batch group as before, never settled
        plain = trainer_loop.select_groups(
            db, settings(tmp_path, model_dir), state=checkpoint.TrainerState(), limit=8
        )
        assert sorted(g.task_id for g in plain.groups) == ["a@v0", "b@v0"] and not plain.settled


def attempt(db_path: Path, rollout: str, task: str, sample: int, **how: Any) -> None:
    """One attempt of ``task``'s ``sample`` in batch ``how["batch"]``: started only
    (``end`` None: still running), or ended ``succeeded`` (a reward), ``failed`` (none;
    ``retried``: tried again) or ``stopped`` (cut off)."""
    call = {
        "call_index": 0,
        "prompt_token_ids": [1, 11, 12],
        "completion_token_ids": [13 + sample, 2],
        "completion_logprobs": [-0.5, -0.5],
        "http_status": 200,
        "finish_reason": "stop",
    }
    started = record(
        rollout, task, sample, body="started", attempt=how["attempt"],
        labels={trajectory.BATCH_LABEL: how["batch"]},
    )  # fmt: skip
    end = how.get("end")
    records = [started]
    if end == "stopped":
        records.append(record(rollout, task, sample, body="finished", status="stopped"))
    elif end is not None:
        records += [
            record(rollout, task, sample, body="call", **call),
            record(
                rollout, task, sample, body="finished", call_count=1, status=end,
                has_reward=end == "succeeded", reward=float(sample % 2),
                retried=how.get("retried", False),
            ),
        ]  # fmt: skip
    put(db_path, rollout, records)


def test_a_group_is_ready_by_its_samples_latest_attempts_not_by_attempts(
    tmp_path: Path, model_dir: Path
) -> None:
    """The state a chaos run hung in: task t's sample 1 failed and was tried again, its
    sample 0 was cut off and its retry still ran. Two complete attempts (both of sample 1)
    made the group "ready"; it was skipped as too small, and the retry of sample 0 then
    sat alone in batch 1 for ever, so batch 2 was never trained."""
    db_path = tmp_path / "store.db"
    for task in ("t", "u"):
        for sample in (0, 1):
            attempt(db_path, f"2-{task}{sample}", task, sample, attempt=1, batch="2/4",
                    end="succeeded")  # fmt: skip
    attempt(db_path, "1-u0", "u", 0, attempt=1, batch="1/4", end="succeeded")
    attempt(db_path, "1-u1", "u", 1, attempt=1, batch="1/4", end="succeeded")
    attempt(db_path, "1-t0-a1", "t", 0, attempt=1, batch="1/4", end="stopped")
    attempt(db_path, "1-t0-a2", "t", 0, attempt=2, batch="1/4")  # still running
    attempt(db_path, "1-t1-a1", "t", 1, attempt=1, batch="1/4", end="failed")
    attempt(db_path, "1-t1-a2", "t", 1, attempt=2, batch="1/4", end="succeeded")
    config = settings(tmp_path, model_dir, group_size=2, groups_per_step=2)
    with store.Store(db_path) as db:
        waiting = trainer_loop.select_groups(db, config, state=checkpoint.TrainerState(), limit=2)
    assert [g.task_id for g in waiting.groups] == ["u@v0#1/4"]
    assert not waiting.settled and not waiting.closed
    assert not {"1-t0-a2", "1-t1-a1", "1-t1-a2"} & set(waiting.skipped)
    attempt(db_path, "1-t0-a2", "t", 0, attempt=2, batch="1/4", end="succeeded")
    run = trainer(config)
    try:
        assert run.run() == 2
    finally:
        run.close()
    marks = trained_marks(db_path)
    assert [r for r, mark in marks.items() if mark is None] == ["1-t0-a1", "1-t1-a1"]
    assert run.state.trained_tasks == {
        "t@v0#1/4": 1, "u@v0#1/4": 1, "t@v0#2/4": 2, "u@v0#2/4": 2
    }  # fmt: skip
    assert run.state.skipped == {"1-t1-a1": "superseded by attempt 2"}


def test_a_retry_after_its_group_was_skipped_is_late_and_never_blocks_the_next_batch(
    tmp_path: Path, model_dir: Path
) -> None:
    """Batch 1 settled with task t's sample 0 failed: the group is skipped, too small.
    The failed attempt is tried again after all; its retry alone can never make a group,
    so it is skipped as late (the decision is kept in the checkpoint), and batch 2 is
    trained."""
    db_path = tmp_path / "store.db"
    for task in ("t", "u"):
        attempt(db_path, f"1-{task}1", task, 1, attempt=1, batch="1/4", end="succeeded")
        for sample in (0, 1):
            attempt(db_path, f"2-{task}{sample}", task, sample, attempt=1, batch="2/4",
                    end="succeeded")  # fmt: skip
    attempt(db_path, "1-u0", "u", 0, attempt=1, batch="1/4", end="succeeded")
    attempt(db_path, "1-t0-a1", "t", 0, attempt=1, batch="1/4", end="failed")
    config = settings(tmp_path, model_dir, group_size=2, groups_per_step=2, steps=1)
    first = trainer(config)
    try:
        assert first.run() == 1
    finally:
        first.close()
    too_small = "group too small: 1 usable rollout(s) in 't@v0#1/4'"
    assert first.state.skipped_tasks == {"t@v0#1/4": too_small}
    attempt(db_path, "1-t0-a2", "t", 0, attempt=2, batch="1/4", end="succeeded")
    second = trainer(config.model_copy(update={"steps": None}))  # resumed from the checkpoint
    try:
        assert second.run() == 1
    finally:
        second.close()
    assert second.state.skipped["1-t0-a2"] == f"late: task 't@v0#1/4' was skipped ({too_small})"
    assert second.state.trained_tasks == {"u@v0#1/4": 1, "t@v0#2/4": 2, "u@v0#2/4": 2}


def test_without_a_group_size_or_a_batch_a_group_too_small_leaves_later_samples_a_group(
    tmp_path: Path, model_dir: Path
) -> None:
    """The operator's rollouts (no batch) without --group-size: the first two samples in,
    one without a reward, make a group too small. Its rollouts are skipped, but the group
    is not closed: the task's later samples still make a group of their own."""
    db_path = tmp_path / "store.db"
    attempt(db_path, "t0", "t", 0, attempt=1, batch="", end="failed")
    attempt(db_path, "t1", "t", 1, attempt=1, batch="", end="succeeded")
    config = settings(tmp_path, model_dir, groups_per_step=1)
    state = checkpoint.TrainerState()
    with store.Store(db_path) as db:
        first = trainer_loop.select_groups(db, config, state=state, limit=1)
    assert first.groups == [] and first.closed == {}
    assert first.skipped == {
        "t0": "no reward",
        "t1": "group too small: 1 usable rollout(s) in 't@v0'",
    }
    state.skipped.update(first.skipped)
    attempt(db_path, "t2", "t", 2, attempt=1, batch="", end="succeeded")
    attempt(db_path, "t3", "t", 3, attempt=1, batch="", end="succeeded")
    with store.Store(db_path) as db:
        [group] = trainer_loop.select_groups(db, config, state=state, limit=1).groups
    assert sorted(r.rollout_id for r in group.rollouts) == ["t2", "t3"]


def test_with_a_group_size_a_sample_skipped_on_an_earlier_poll_still_counts_as_done(
    tmp_path: Path, model_dir: Path
) -> None:
    """Group size 3, the operator's rollouts: task t's three samples are in, one without a
    reward. The first poll makes t a group of two, but the step waits for a second group,
    and the trainer keeps the skip of the rewardless sample. Its sample is still done: t
    stays ready, and is trained with u once u's samples are in (it was never ready again,
    and u waited for a second group for ever)."""
    db_path = tmp_path / "store.db"
    attempt(db_path, "t0", "t", 0, attempt=1, batch="", end="failed")
    for sample in (1, 2):
        attempt(db_path, f"t{sample}", "t", sample, attempt=1, batch="", end="succeeded")
    config = settings(tmp_path, model_dir, group_size=3, groups_per_step=2, steps=1)
    run = trainer(config)
    try:
        waiting = run.wait_for_groups(threading.Event())
        assert [g.task_id for g in waiting.groups] == ["t@v0"] and not waiting.full
        assert run.state.skipped == {"t0": "no reward"}
        again = trainer_loop.select_groups(run.store, config, state=run.state, limit=2)
        assert [g.task_id for g in again.groups] == ["t@v0"]
        for sample in (0, 1, 2):
            attempt(db_path, f"u{sample}", "u", sample, attempt=1, batch="", end="succeeded")
        assert run.run() == 1
    finally:
        run.close()
    assert run.state.trained_tasks == {"t@v0": 1, "u@v0": 1}
    assert sorted(run.state.trained) == ["t1", "t2", "u0", "u1", "u2"]


def succeeded_batch(db_path: Path, batch: str) -> None:
    """Batch ``batch`` (number/size): tasks t and u, two samples each, every one succeeded."""
    number = batch.partition("/")[0]
    for task in ("t", "u"):
        for sample in (0, 1):
            attempt(db_path, f"{number}-{task}{sample}", task, sample, attempt=1, batch=batch,
                    end="succeeded")  # fmt: skip


def test_a_batch_whose_every_group_is_skipped_gets_a_step_that_trains_nothing(
    tmp_path: Path, model_dir: Path
) -> None:
    """`openforge run` waits for a step per iteration. Every rollout of batch 1 failed, so
    both its groups are skipped whole: the batch still gets its step, the weights unchanged
    under the next policy version, checkpointed, and batch 2 is trained at step 2. Without
    it, the trainer waited for batch 2 and the run for the step of batch 1, for ever."""
    db_path = tmp_path / "store.db"
    for task in ("t", "u"):
        for sample in (0, 1):
            attempt(db_path, f"1-{task}{sample}", task, sample, attempt=1, batch="1/4",
                    end="failed")  # fmt: skip
    config = settings(tmp_path, model_dir, group_size=2, groups_per_step=2, steps=2)
    run = trainer(config)
    try:
        before = {k: v.clone() for k, v in run.model.state_dict().items()}
        empty = run.wait_for_groups(threading.Event())
        assert empty.empty_batch == "1/4" and empty.full and empty.groups == []
        assert run.state.step == 0  # deciding is not stepping
        record = run.skip_step(empty.empty_batch)
        assert (record["step"], record["policy_version"], record["groups"]) == (1.0, 1.0, 0.0)
        assert record["groups_skipped"] == 2.0
        saved = load_file(checkpoint.path_for(config.run_dir, 1) / "model.safetensors")
        assert all(torch.equal(saved[k], before[k]) for k in saved)
        kept = checkpoint.load_state(checkpoint.path_for(config.run_dir, 1))
        assert kept.empty_batches == {"1/4": 1} and len(kept.skipped_tasks) == 2
        assert run.wait_for_groups(threading.Event()).empty_batch == ""  # owed once
        succeeded_batch(db_path, "2/4")
        assert run.run() == 1
    finally:
        run.close()
    assert (run.state.step, run.state.policy_version) == (2, 2)
    assert run.state.trained_tasks == {"t@v0#2/4": 2, "u@v0#2/4": 2}
    assert sorted(run.state.skipped_tasks) == ["t@v0#1/4", "u@v0#1/4"]
    steps = [r["step"] for r in metrics.read(config.run_dir / metrics.JSONL)]
    assert steps == [1, 2]


def test_a_batch_with_a_step_gets_no_empty_one_when_its_last_groups_are_skipped(
    tmp_path: Path, model_dir: Path
) -> None:
    """One group a step: batch 1's group a is trained at step 1; b, every rollout failed,
    is skipped whole on the next poll, and batch 1 has had its step: no step that trains
    nothing."""
    db_path = tmp_path / "store.db"
    for sample in (0, 1):
        attempt(db_path, f"1-a{sample}", "a", sample, attempt=1, batch="1/4", end="succeeded")
        attempt(db_path, f"1-b{sample}", "b", sample, attempt=1, batch="1/4", end="failed")
    config = settings(tmp_path, model_dir, group_size=2, groups_per_step=1)
    run = trainer(config)
    try:
        assert run.run() == 1
        last = trainer_loop.select_groups(run.store, config, state=run.state, limit=1)
    finally:
        run.close()
    assert run.state.step == 1 and run.state.trained_tasks == {"a@v0#1/4": 1}
    assert sorted(run.state.skipped_tasks) == ["b@v0#1/4"]
    assert last.empty_batch == "" and last.groups == []


def test_a_batch_settled_by_a_late_retry_after_its_groups_were_skipped_gets_its_step(
    tmp_path: Path, model_dir: Path
) -> None:
    """Group size 2. Task t's two samples failed while u's run, and t is skipped whole;
    then t1 is tried again (its retry is late). u's fail too, and u is skipped, but t1's
    retry still runs: the batch is not settled. When the retry ends, the batch settles on
    a poll that decides no group, and it is still owed its step that trains nothing,
    before batch 2's."""
    db_path = tmp_path / "store.db"
    attempt(db_path, "1-t0", "t", 0, attempt=1, batch="1/4", end="failed")
    attempt(db_path, "1-t1-a1", "t", 1, attempt=1, batch="1/4", end="failed")
    attempt(db_path, "1-u0", "u", 0, attempt=1, batch="1/4")  # running
    attempt(db_path, "1-u1", "u", 1, attempt=1, batch="1/4")  # running
    config = settings(tmp_path, model_dir, group_size=2, groups_per_step=2)
    run = trainer(config)
    try:
        first = run.wait_for_groups(threading.Event())
        assert list(first.closed) == ["t@v0#1/4"] and not first.settled
        attempt(db_path, "1-t1-a2", "t", 1, attempt=2, batch="1/4")  # the retry, running
        attempt(db_path, "1-u0", "u", 0, attempt=1, batch="1/4", end="failed")
        attempt(db_path, "1-u1", "u", 1, attempt=1, batch="1/4", end="failed")
        second = run.wait_for_groups(threading.Event())
        assert list(second.closed) == ["u@v0#1/4"] and not second.settled
        assert second.empty_batch == ""
        attempt(db_path, "1-t1-a2", "t", 1, attempt=2, batch="1/4", end="failed")
        succeeded_batch(db_path, "2/4")
        assert run.run() == 2
    finally:
        run.close()
    assert run.state.empty_batches == {"1/4": 1}
    assert run.state.trained_tasks == {"t@v0#2/4": 2, "u@v0#2/4": 2}
    assert run.state.skipped["1-t1-a2"].startswith("late: task 't@v0#1/4' was skipped")


@pytest.mark.parametrize("group_size", [2, 0])
def test_a_failed_attempt_tried_again_holds_its_group_until_the_next_attempt(
    tmp_path: Path, model_dir: Path, group_size: int
) -> None:
    """Task t's sample 1 failed, and its finish says it is tried again. Until the next
    attempt is in, the sample is still running: t is not decided without it (it was, as a
    group too small, and the retry came late and was wasted). Then t is trained with the
    retry, and the failed attempt is skipped, saying it was tried again."""
    db_path = tmp_path / "store.db"
    attempt(db_path, "t0", "t", 0, attempt=1, batch="", end="succeeded")
    attempt(db_path, "t1-a1", "t", 1, attempt=1, batch="", end="failed", retried=True)
    for sample in (0, 1):
        attempt(db_path, f"u{sample}", "u", sample, attempt=1, batch="", end="succeeded")
    config = settings(tmp_path, model_dir, group_size=group_size, groups_per_step=2, steps=1)
    run = trainer(config)
    try:
        waiting = run.wait_for_groups(threading.Event())
        assert [g.task_id for g in waiting.groups] == ["u@v0"] and waiting.closed == {}
        assert "t1-a1" not in run.state.skipped
        attempt(db_path, "t1-a2", "t", 1, attempt=2, batch="", end="succeeded")
        assert run.run() == 1
    finally:
        run.close()
    assert run.state.trained_tasks == {"t@v0": 1, "u@v0": 1}
    assert sorted(run.state.trained) == ["t0", "t1-a2", "u0", "u1"]
    assert run.state.skipped == {"t1-a1": "failed, and tried again as attempt 2"}


def test_attempts_tried_again_at_another_policy_version_never_hold_their_batch(
    tmp_path: Path, model_dir: Path
) -> None:
    """Both of task t's samples failed at v0 and were tried again; the new attempts ran at
    v1, a group of their own. The v0 group is left with attempts tried again only: each is
    skipped once its next attempt has started, instead of waiting for ever and holding
    batch 1, so batch 2 is trained too."""
    db_path = tmp_path / "store.db"
    for sample in (0, 1):
        attempt(db_path, f"t{sample}-a1", "t", sample, attempt=1, batch="1/4", end="failed",
                retried=True)  # fmt: skip
        attempt(db_path, f"u{sample}", "u", sample, attempt=1, batch="1/4", end="succeeded")
        attempt(db_path, f"n{sample}", "n", sample, attempt=1, batch="2/2", end="succeeded")
    for sample in (0, 1):  # the new attempts, sampled by policy v1
        put(db_path, f"t{sample}-a2", [
            record(f"t{sample}-a2", "t", sample, body="started", attempt=2, policy_version=1,
                   labels={trajectory.BATCH_LABEL: "1/4"}),
            record(f"t{sample}-a2", "t", sample, body="call", call_index=0,
                   prompt_token_ids=[1, 11, 12], completion_token_ids=[13 + sample, 2],
                   completion_logprobs=[-0.5, -0.5], http_status=200, finish_reason="stop"),
            record(f"t{sample}-a2", "t", sample, body="finished", call_count=1,
                   status="succeeded", has_reward=True, reward=float(sample)),
        ])  # fmt: skip
    config = settings(tmp_path, model_dir, group_size=2, groups_per_step=2)
    run = trainer(config)
    try:
        assert run.run() == 2
    finally:
        run.close()
    assert run.state.trained_tasks == {"t@v1#1/4": 1, "u@v0#1/4": 1, "n@v0#2/2": 2}
    assert run.state.skipped == {
        "t0-a1": "failed, and tried again as attempt 2",
        "t1-a1": "failed, and tried again as attempt 2",
    }
