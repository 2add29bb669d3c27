"""The summary after a local run: a row an iteration, partial ones marked, where the files are."""

from __future__ import annotations

from pathlib import Path

from openforge_runner import progress, runner


def stats(
    iteration: int, total: int, rewards: list[float], *, failed: int = 0
) -> runner.IterationStats:
    return runner.IterationStats(
        iteration, total=total, succeeded=len(rewards) - failed, failed=failed, rewards=rewards
    )


def test_a_stopped_iteration_shows_what_it_got_to_and_is_left_out_of_the_reward_change() -> None:
    text = progress.summary(
        [
            stats(0, 4, [0.0, 1.0, 0.0, 1.0]),
            stats(1, 4, [1.0, 1.0, 1.0, 1.0]),
            stats(2, 48, [1.0] * 10),
        ]
    )
    lines = text.splitlines()
    assert lines[1].split() == ["1", "4", "0", "0.500"]
    assert lines[3].split() == ["3", "10/48", "0", "1.000", "(stopped:", "partial)"]
    assert "reward: 0.500 (first iteration) -> 1.000 (last), change +0.500" in text


def test_it_says_where_the_run_is_and_how_to_look_at_it(tmp_path: Path) -> None:
    text = progress.summary([stats(0, 2, [1.0, 1.0])], run_dir=tmp_path, trained=True)
    assert f"run directory  {tmp_path}" in text
    assert f"reward curve   {tmp_path / 'train' / 'reward_curve.png'}" in text
    assert f"TensorBoard    tensorboard --logdir {tmp_path / 'train' / 'tensorboard'}" in text
    assert f"openforge trajectories ls --store {tmp_path / 'store.db'}" in text
    untrained = progress.summary([stats(0, 2, [1.0, 1.0])], run_dir=tmp_path, trained=False)
    assert "reward curve" not in untrained and "store.db" in untrained


def test_a_rerun_with_nothing_left_says_so() -> None:
    text = progress.summary([stats(0, 2, [1.0, 1.0])], trained=True, nothing_left=True)
    assert text.splitlines()[0] == (
        "already complete: every rollout had finished and been trained on in an earlier run; "
        "nothing was run"
    )
    assert "already complete" not in progress.summary([stats(0, 2, [1.0, 1.0])])


def test_a_verl_run_says_where_veRLs_metrics_and_samples_are(tmp_path: Path) -> None:
    text = progress.summary(
        [stats(0, 2, [1.0, 1.0])], run_dir=tmp_path, trained=True, engine="verl"
    )
    assert f"veRL metrics   {tmp_path / 'train' / 'metrics.jsonl'}" in text
    assert f"steps' samples {tmp_path / 'train' / 'rollouts'}" in text
    assert "reward curve" not in text and "TensorBoard" not in text  # veRL writes neither


def test_the_live_view_reads_veRLs_metrics_as_openforge_trains(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        '{"step": 1, "data": {"critic/score/mean": 0.25, "perf/throughput": 310.0, '
        '"perf/total_num_tokens": 6200, "perf/time_per_step": 10.0}}\n'
        "not json\n"
        '{"step": 2, "reward_mean": 0.5, "pass_rate": 0.5, "tokens_per_s": 4000.0}\n'
    )
    assert progress.trainer_metrics(path) == [
        # veRL's perf/throughput is per worker: the view shows the step's tokens per second
        {"step": 1, "reward_mean": 0.25, "tokens_per_s": 620.0},
        {"step": 2, "reward_mean": 0.5, "pass_rate": 0.5, "tokens_per_s": 4000.0},
    ]


def test_the_live_view_says_when_a_step_trained_nothing(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "reward_mean": 0.5, "groups": 2, "tokens_per_s": 900.0}\n')
    display = progress.Display(job="j", iterations=2, metrics=path)
    assert display.render().caption == ("trainer step 1: reward 0.500, pass rate -, 900 tokens/s")
    with open(path, "a") as handle:
        handle.write('{"step": 2, "groups": 0, "rollouts": 0}\n')
    assert display.render().caption == "trainer step 2: nothing to train"
