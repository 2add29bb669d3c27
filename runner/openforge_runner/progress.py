"""The live view of a local run (rich), and the plain-text summary after it."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from openforge_runner import runner

# veRL's metric (its file logger writes {"step": s, "data": {...}}) for each of ours
VERL_METRICS = {"reward_mean": "critic/score/mean"}


def trainer_metrics(path: Path) -> list[dict[str, Any]]:
    """The trainer's per-step metrics (JSON lines), or [] before its first step; veRL's
    records are read as ``openforge train``'s (:data:`VERL_METRICS`)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("data"), dict):
            data = row["data"]
            row = {"step": row.get("step")} | {
                ours: data.get(theirs) for ours, theirs in VERL_METRICS.items()
            }
            # veRL's perf/throughput is per GPU (worker): the step's tokens over its time
            tokens, seconds = data.get("perf/total_num_tokens"), data.get("perf/time_per_step")
            if isinstance(tokens, int | float) and isinstance(seconds, int | float) and seconds:
                row["tokens_per_s"] = tokens / seconds
        rows.append(row)
    return rows


class Display:
    """One table, refreshed as rollouts and training steps finish."""

    def __init__(
        self, *, job: str, iterations: int, metrics: Path, console: Console | None = None
    ) -> None:
        self.job = job
        self.iterations = iterations
        self.metrics = metrics
        self.console = console or Console()
        self.history: dict[int, runner.IterationStats] = {}
        self.phase = "starting"
        self._lock = threading.Lock()
        self._live: Live | None = None

    def __enter__(self) -> Display:
        self._live = Live(
            self.render(), console=self.console, refresh_per_second=4, transient=False
        )
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.update(self.render())
            self._live.__exit__(None, None, None)

    def update(
        self, stats: runner.IterationStats | None = None, *, phase: str | None = None
    ) -> None:
        with self._lock:
            if stats is not None:
                self.history[stats.iteration] = stats
            if phase is not None:
                self.phase = phase
        if self._live is not None:
            self._live.update(self.render())

    def render(self) -> Table:
        steps = trainer_metrics(self.metrics)
        last = steps[-1] if steps else {}
        table = Table(title=f"openforge run {self.job}: {self.phase}", expand=False)
        for column in ("iteration", "rollouts", "running", "done", "failed", "retried", "reward"):
            table.add_column(column, justify="right")
        for iteration in sorted(self.history):
            stats = self.history[iteration]
            reward = stats.mean_reward
            table.add_row(
                f"{iteration + 1}/{self.iterations}",
                str(stats.total),
                str(stats.running),
                str(stats.done),
                str(stats.failed),
                str(stats.retried),
                "-" if reward is None else f"{reward:.3f}",
            )
        if last.get("groups") == 0:  # a batch whose every group was skipped whole
            table.caption = f"trainer step {last.get('step', '?')}: nothing to train"
        elif last:
            table.caption = (
                f"trainer step {last.get('step', '?')}: reward {_fmt(last.get('reward_mean'))}, "
                f"pass rate {_fmt(last.get('pass_rate'))}, {_fmt(last.get('tokens_per_s'), 0)} "
                "tokens/s"
            )
        return table


def summary(
    history: Sequence[runner.IterationStats],
    *,
    run_dir: Path | None = None,
    trained: bool = False,
    engine: str | None = "openforge",
    nothing_left: bool = False,
) -> str:
    """What a run did, after it (pure): a row an iteration, a partial one marked with what
    it got to; the reward's change; where the run's files are and how to look at them.

    ``trained``: the run trains (with ``engine`` openforge, the curve and TensorBoard logs
    exist; with verl, veRL's metrics and what each step trained on). ``nothing_left``:
    an earlier run of the same command had finished everything (and, training, trained
    on it): :func:`runner.finished_history`.
    """
    lines = []
    if nothing_left:
        done = "finished and been trained on" if trained else "finished"
        lines.append(
            f"already complete: every rollout had {done} in an earlier run; nothing was run"
        )
    lines.append("iteration  rollouts  failed  mean reward")
    for stats in history:
        reward = stats.mean_reward
        count = f"{stats.total}" if stats.done >= stats.total else f"{stats.done}/{stats.total}"
        partial = "  (stopped: partial)" if stats.done < stats.total else ""
        lines.append(
            f"{stats.iteration + 1:>9}  {count:>8}  {stats.failed:>6}  "
            f"{'-' if reward is None else f'{reward:.3f}':>11}{partial}"
        )
    rewards = [s.mean_reward for s in history if s.mean_reward is not None and s.done >= s.total]
    if len(rewards) >= 2:
        lines.append(
            f"reward: {rewards[0]:.3f} (first iteration) -> {rewards[-1]:.3f} (last), change "
            f"{rewards[-1] - rewards[0]:+.3f}"
        )
    if run_dir is not None:
        store = run_dir / "store.db"
        lines += ["", f"run directory  {run_dir}", f"store          {store}"]
        if trained and engine == "verl":
            lines += [
                f"veRL metrics   {run_dir / 'train' / 'metrics.jsonl'}",
                f"steps' samples {run_dir / 'train' / 'rollouts'}",
                f"trainer log    {run_dir / 'trainer.log'}",
            ]
        elif trained:
            lines += [
                f"reward curve   {run_dir / 'train' / 'reward_curve.png'}",
                f"metrics        {run_dir / 'train' / 'metrics.jsonl'}",
                f"TensorBoard    tensorboard --logdir {run_dir / 'train' / 'tensorboard'}",
            ]
        lines += [
            f"rollouts       openforge trajectories ls --store {store}",
            f"one rollout    openforge trajectories show ROLLOUT --store {store}",
        ]
    return "\n".join(lines)


def _fmt(value: Any, digits: int = 3) -> str:
    return f"{value:.{digits}f}" if isinstance(value, int | float) else "-"
