from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import transformers
from openforge_trainer.training import checkpoint, rollout_sampler
from openforge_trainer.training import loop as trainer_loop

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return rollout_sampler.build_tiny_model(tmp_path_factory.mktemp("policy") / "model")


def save(run_dir: Path, model_dir: Path, step: int, *, keep: int = 3) -> Path:
    model = trainer_loop.load_model(model_dir, dtype="float32", device="cpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    state = checkpoint.TrainerState(step=step, policy_version=step, trained={f"r{step}": step})
    return checkpoint.save(
        run_dir, state=state, model=model, optimizer=optimizer, assets_from=model_dir, keep=keep
    )


def test_a_checkpoint_is_a_servable_model_directory(tmp_path: Path, model_dir: Path) -> None:
    path = save(tmp_path, model_dir, 1)
    assert path == tmp_path / "checkpoints" / "step-000001"
    names = {p.name for p in path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert {checkpoint.OPTIMIZER_FILE, checkpoint.STATE_FILE} <= names
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(path)
    original = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    for (name, a), b in zip(
        loaded.state_dict().items(), original.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    assert tokenizer.eos_token == "<|im_end|>"
    assert checkpoint.load_state(path).trained == {"r1": 1}


def test_latest_is_the_highest_complete_step_and_old_ones_are_pruned(
    tmp_path: Path, model_dir: Path
) -> None:
    assert checkpoint.latest(tmp_path) is None
    (tmp_path / "checkpoints").mkdir()
    dead = tmp_path / "checkpoints" / ".tmp-step-000003-999999"  # a crashed writer's leftovers
    dead.mkdir()
    for step in (1, 2, 10, 11):
        save(tmp_path, model_dir, step, keep=2)
    assert [p.name for p in checkpoint.all_steps(tmp_path)] == ["step-000010", "step-000011"]
    assert checkpoint.latest(tmp_path) == tmp_path / "checkpoints" / "step-000011"
    assert not dead.exists()


def test_state_round_trips_and_ignores_unknown_fields() -> None:
    state = checkpoint.TrainerState(
        step=4, policy_version=4, trained={"a": 1}, trained_tasks={"t": 1}, skipped={"b": "stale"}
    )
    assert checkpoint.TrainerState.from_json(state.to_json()) == state
    assert checkpoint.TrainerState.from_json('{"step": 2, "future_field": 1}').step == 2


def test_the_rename_is_the_commit_point(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def die(*args: object) -> None:
        raise OSError("power cut before the rename")

    monkeypatch.setattr(os, "rename", die)
    with pytest.raises(OSError, match="power cut"):
        save(tmp_path, model_dir, 1)
    assert checkpoint.latest(tmp_path) is None  # only a .tmp directory, which latest() ignores
