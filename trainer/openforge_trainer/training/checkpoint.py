"""Atomic training checkpoints: model, optimiser and trainer state in one directory.

A checkpoint is ``<run_dir>/checkpoints/step-NNNNNN/`` holding the model as a
Hugging Face directory (``config.json``, ``model.safetensors``, the
tokenizer files copied from the model it started from), so an inference
server can load it as is, plus ``optimizer.pt`` and ``trainer_state.json``.

It is written under a temporary name, every file and the directory are
fsync'd, and only then renamed into place (and the parent fsync'd): a
``step-*`` directory either is complete or does not exist. The latest
checkpoint is simply the highest step; there is no pointer file to go stale.

``trainer_state.json`` records which rollouts each step trained, so that on
restart the store's trained marks can be brought level with the checkpoint
(the marks are written after the checkpoint; a crash between the two leaves
marks missing, never extra).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"
PREFIX = "step-"
# Files of a model directory that a checkpoint writes itself, never copies.
_OWN_FILES = {"config.json", "generation_config.json", OPTIMIZER_FILE, STATE_FILE}
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".index.json")


@dataclasses.dataclass
class TrainerState:
    """Where training stands; saved with every checkpoint."""

    step: int = 0
    policy_version: int = 0
    # rollout id -> the step that trained it
    trained: dict[str, int] = dataclasses.field(default_factory=dict)
    # task id -> the step that trained its group (late rollouts of it are skipped)
    trained_tasks: dict[str, int] = dataclasses.field(default_factory=dict)
    # rollout id -> why it will never be trained (stale, no reward, ...)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    # task id -> why its group was skipped whole (late rollouts of it are skipped too)
    skipped_tasks: dict[str, str] = dataclasses.field(default_factory=dict)
    # batch -> the step that trained nothing for it (every group of it was skipped)
    empty_batches: dict[str, int] = dataclasses.field(default_factory=dict)
    base_model: str = ""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TrainerState:
        data: dict[str, Any] = json.loads(text)
        known = {field.name for field in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


def root(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def path_for(run_dir: Path, step: int) -> Path:
    return root(run_dir) / f"{PREFIX}{step:06d}"


def all_steps(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not root(run_dir).is_dir():
        return []
    found = [
        path
        for path in root(run_dir).iterdir()
        if path.is_dir() and path.name.startswith(PREFIX) and path.name[len(PREFIX) :].isdigit()
    ]
    return sorted(found, key=lambda path: int(path.name[len(PREFIX) :]))


def latest(run_dir: Path) -> Path | None:
    steps = all_steps(run_dir)
    return steps[-1] if steps else None


def load_state(checkpoint: Path) -> TrainerState:
    return TrainerState.from_json((checkpoint / STATE_FILE).read_text())


def load_optimizer(checkpoint: Path, optimizer: torch.optim.Optimizer) -> None:
    state = torch.load(checkpoint / OPTIMIZER_FILE, map_location="cpu", weights_only=True)
    optimizer.load_state_dict(state)


def save(
    run_dir: Path,
    *,
    state: TrainerState,
    model: Any,
    optimizer: torch.optim.Optimizer,
    assets_from: Path,
    keep: int,
) -> Path:
    """Write the checkpoint for ``state.step`` atomically; return its directory.

    ``model`` is a transformers PreTrainedModel; ``assets_from`` the model
    directory whose tokenizer and other non-weight files are copied along.
    Checkpoints beyond the newest ``keep`` are deleted afterwards.
    """
    final = path_for(run_dir, state.step)
    root(run_dir).mkdir(parents=True, exist_ok=True)
    temporary = root(run_dir) / f".tmp-{final.name}-{os.getpid()}"
    if temporary.exists():
        shutil.rmtree(temporary)
    temporary.mkdir()
    model.save_pretrained(temporary)
    copy_assets(assets_from, temporary)
    torch.save(optimizer.state_dict(), temporary / OPTIMIZER_FILE)
    (temporary / STATE_FILE).write_text(state.to_json())
    _fsync_tree(temporary)
    if final.exists():  # a leftover of the same step that was never recorded as trained
        shutil.rmtree(final)
    os.rename(temporary, final)
    _fsync_dir(root(run_dir))
    prune(run_dir, keep=keep)
    return final


def copy_assets(source: Path, target: Path) -> None:
    """Copy a model directory's tokenizer and other non-weight files."""
    for path in sorted(source.iterdir()):
        if (
            path.is_file()
            and path.name not in _OWN_FILES
            and not path.name.endswith(_WEIGHT_SUFFIXES)
        ):
            shutil.copy2(path, target / path.name)


def prune(run_dir: Path, *, keep: int) -> None:
    for old in all_steps(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for leftover in root(run_dir).glob(".tmp-*"):
        if leftover.name.endswith(f"-{os.getpid()}"):
            continue
        shutil.rmtree(leftover, ignore_errors=True)


def _fsync_tree(directory: Path) -> None:
    for path in directory.iterdir():
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
