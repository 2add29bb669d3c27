"""The veRL batch built from rows of rollouts sampled by a real (tiny) model into a real store."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from openforge_trainer.collection import store
from openforge_trainer.training import loop as trainer_loop
from openforge_trainer.training import rl_batch, rollout_sampler
from openforge_trainer.trajectories import export
from verl import DataProto

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> list[export.Row]:
    base = tmp_path_factory.mktemp("batch")
    model = trainer_loop.load_model(
        rollout_sampler.build_tiny_model(base / "model"), dtype="float32", device="cpu"
    )
    with store.Store(base / "store.db") as db:
        rollout_sampler.write_rollouts(
            db, model, job="job", tasks=["t0", "t1"], samples=3, turns=2, max_new_tokens=6
        )
        # a different prompt length, so left padding shows
        rollout_sampler.write_rollouts(
            db, model, job="job", tasks=["t2"], samples=2, turns=1, prompt_tokens=5, seed=1
        )
        rows, _ = export.job_rows(db, "job")
    return rows


def test_keys_shapes_and_layout(rows: list[export.Row]) -> None:
    batch = rl_batch.build(rows)
    assert isinstance(batch, DataProto)
    tensors = batch.batch
    width = max(len(row.prompt_ids) for row in rows)
    length = max(len(row.response_ids) for row in rows)
    assert set(tensors.keys()) == set(rl_batch.TENSOR_KEYS)
    shapes = {key: tuple(tensors[key].shape) for key in rl_batch.TENSOR_KEYS}
    assert shapes == {
        "prompts": (len(rows), width),
        "responses": (len(rows), length),
        "response_mask": (len(rows), length),
        "input_ids": (len(rows), width + length),
        "attention_mask": (len(rows), width + length),
        "position_ids": (len(rows), width + length),
        "rollout_log_probs": (len(rows), length),
        "token_level_scores": (len(rows), length),
        "token_level_rewards": (len(rows), length),
    }
    assert len({len(row.prompt_ids) for row in rows}) > 1  # the padding below is exercised
    for i, row in enumerate(rows):
        p, r = len(row.prompt_ids), len(row.response_ids)
        assert tensors["prompts"][i, width - p :].tolist() == row.prompt_ids  # left-padded
        assert tensors["prompts"][i, : width - p].tolist() == [0] * (width - p)
        assert tensors["responses"][i, :r].tolist() == row.response_ids  # right-padded
        assert tensors["input_ids"][i].tolist() == (
            tensors["prompts"][i].tolist() + tensors["responses"][i].tolist()
        )
        attention = tensors["attention_mask"][i].tolist()
        assert attention == [0] * (width - p) + [1] * (p + r) + [0] * (length - r)
        positions = tensors["position_ids"][i].tolist()
        assert positions[width - p : width + r] == list(range(p + r))
        assert tensors["response_mask"][i].tolist() == row.response_mask + [0] * (length - r)
        assert tensors["rollout_log_probs"][i, :r].tolist() == pytest.approx(
            [
                lp if m else 0.0
                for lp, m in zip(row.response_logprobs, row.response_mask, strict=True)
            ]
        )
        scores = tensors["token_level_scores"][i].tolist()
        assert scores[r - 1] == row.reward and sum(scores) == row.reward
    assert torch.equal(tensors["token_level_rewards"], tensors["token_level_scores"])


def test_masks_cover_exactly_the_sampled_tokens(rows: list[export.Row]) -> None:
    """Model tokens are 1 and the tool result between two calls is 0, token for token."""
    two_turn = [row for row in rows if row.num_turns == 2]
    assert two_turn
    batch = rl_batch.build(two_turn)
    for i, row in enumerate(two_turn):
        mask = batch.batch["response_mask"][i].tolist()
        responses = batch.batch["responses"][i].tolist()
        first = row.response_mask.index(0)  # the first completion ends where the tool tokens start
        tool = row.response_mask[first:].index(1) + first
        assert responses[first] == rollout_sampler.TOOL_OPEN
        assert responses[tool - 1] == rollout_sampler.IM_START
        assert set(mask[:first]) == {1} and set(mask[first:tool]) == {0}
        assert set(mask[tool : len(row.response_ids)]) == {1}
        assert batch.batch["rollout_log_probs"][i, first:tool].abs().sum() == 0


def test_one_uid_per_task_group(rows: list[export.Row]) -> None:
    batch = rl_batch.build(rows)
    uid = batch.non_tensor_batch["uid"].tolist()
    assert uid == [f"job/{row.task_id}" for row in rows]
    assert len(set(uid)) == 3
    assert batch.non_tensor_batch["rollout_id"].tolist() == [row.rollout_id for row in rows]
    assert batch.non_tensor_batch["policy_version"].tolist() == [0] * len(rows)
    order, index = rl_batch.rollout_index(batch)
    assert [order[i] for i in index.tolist()] == [row.rollout_id for row in rows]


def test_bad_rows_are_refused_by_name(rows: list[export.Row]) -> None:
    short = dataclasses.replace(rows[0], response_mask=rows[0].response_mask[:-1])
    with pytest.raises(
        rl_batch.BatchError, match=rf"rollout '{rows[0].rollout_id}' segment 0: .* differ"
    ):
        rl_batch.build([rows[1], short])
    with pytest.raises(rl_batch.BatchError, match="prompt_ids is empty"):
        rl_batch.build([dataclasses.replace(rows[0], prompt_ids=[])])
    with pytest.raises(rl_batch.BatchError, match="no rows"):
        rl_batch.build([])


def test_path_fixture_is_real(tmp_path: Path) -> None:
    """The tiny model is the one the brief asks for (a real Qwen2, tied embeddings)."""
    directory = rollout_sampler.build_tiny_model(tmp_path / "m")
    config = trainer_loop.load_model(directory, dtype="float32", device="cpu").config
    assert (config.model_type, config.vocab_size, config.hidden_size) == ("qwen2", 4096, 64)
    assert (config.num_hidden_layers, config.num_key_value_heads, config.tie_word_embeddings) == (
        2,
        2,
        True,
    )
    assert (directory / "tokenizer.json").is_file() and (directory / "model.safetensors").is_file()
