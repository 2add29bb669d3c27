"""Per-step training metrics: ``metrics.jsonl``, TensorBoard events, a reward-curve PNG.

All three live in the run directory:

* ``metrics.jsonl``: one JSON object per step (flushed and fsync'd), the
  source of truth; on resume the existing lines are kept and extended;
* ``tensorboard/``: the same numbers as scalars (``tensorboard --logdir``);
* ``reward_curve.png``: reward mean +- std (never past the step's lowest and
  highest reward) and pass rate per step, redrawn after every step
  (matplotlib, Agg backend: no display needed).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # (after matplotlib.use: the backend must be chosen first)
from torch.utils.tensorboard import SummaryWriter

JSONL = "metrics.jsonl"
TENSORBOARD = "tensorboard"
CURVE = "reward_curve.png"

Number = int | float
Record = dict[str, Number | None]


class MetricsWriter:
    """Append one step's numbers to every sink; keeps the history for the curve."""

    def __init__(self, run_dir: Path, *, resume_step: int = 0, title: str = "") -> None:
        self.run_dir = run_dir
        self.title = title or f"{run_dir.name}: reward per training step"
        run_dir.mkdir(parents=True, exist_ok=True)
        self.history = [
            r for r in read(run_dir / JSONL) if _value(r, "step", default=0) <= resume_step
        ]
        _rewrite(run_dir / JSONL, self.history)  # drop lines of steps no checkpoint holds
        self._tensorboard = SummaryWriter(
            log_dir=str(run_dir / TENSORBOARD), purge_step=resume_step + 1
        )

    def write(self, record: Mapping[str, Number]) -> None:
        step = int(record["step"])
        clean = {key: _finite(value) for key, value in record.items()}
        with open(self.run_dir / JSONL, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(clean, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        for key, value in clean.items():
            if key != "step" and value is not None:
                self._tensorboard.add_scalar(key, value, global_step=step)
        self._tensorboard.flush()
        self.history.append(clean)
        plot(self.history, self.run_dir / CURVE, title=self.title)

    def close(self) -> None:
        self._tensorboard.close()


def read(path: Path) -> list[Record]:
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def band(history: list[Record]) -> tuple[list[float], list[float]]:
    """Per step, reward mean - std and + std, each kept within that step's lowest and
    highest reward where the record has them: a std band around a 0/1 reward would
    otherwise claim rewards below 0 and above 1 that no rollout got (pure)."""
    lower, upper = [], []
    for record in history:
        mean, std = (
            _value(record, "reward_mean", default=math.nan),
            _value(record, "reward_std", default=0.0),
        )
        low, high = (
            _value(record, "reward_min", default=-math.inf),
            _value(record, "reward_max", default=math.inf),
        )
        lower.append(max(mean - std, low))
        upper.append(min(mean + std, high))
    return lower, upper


def figure(history: list[Record], *, title: str = "") -> Any:
    """The reward curve: reward mean (with its band) and pass rate against step."""
    steps = [_value(r, "step", default=0.0) for r in history]
    mean = [_value(r, "reward_mean", default=math.nan) for r in history]
    passed = [_value(r, "pass_rate", default=math.nan) for r in history]
    lower, upper = band(history)
    drawn, axis = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    axis.plot(steps, mean, marker="o", label="reward mean")
    axis.fill_between(steps, lower, upper, alpha=0.2, label="reward ± std")
    axis.plot(steps, passed, marker=".", linestyle="--", label="pass rate")
    axis.set_xlabel("step")
    axis.set_ylabel("reward")
    if title:
        axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend(loc="best")
    drawn.tight_layout()
    return drawn


def plot(history: list[Record], path: Path, *, title: str = "") -> None:
    """Write :func:`figure` to ``path`` whole (a reader never sees half a PNG)."""
    drawn = figure(history, title=title)
    temporary = path.with_suffix(".tmp.png")
    drawn.savefig(temporary)
    plt.close(drawn)
    os.replace(temporary, path)


def _value(record: Record, key: str, *, default: float) -> float:
    value = record.get(key)
    return default if value is None else float(value)


def _finite(value: Number) -> Number | None:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; None reads as "not measured this step"
    return value


def _rewrite(path: Path, records: list[Record]) -> None:
    if not path.exists():
        return
    temporary = path.with_suffix(".tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
    os.replace(temporary, path)
