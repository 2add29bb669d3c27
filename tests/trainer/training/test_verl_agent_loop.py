"""The veRL agent-loop integration, on CPU: conversion and veRL's own base class."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import io
from pathlib import Path

import pytest
import torch
import transformers
from omegaconf import OmegaConf
from openforge.trajectory.v1 import trajectory_pb2
from openforge_trainer.collection import store
from openforge_trainer.training import loop as trainer_loop
from openforge_trainer.training import rollout_sampler, verl_agent_loop
from openforge_trainer.trajectories import export
from PIL import Image
from verl.experimental.agent_loop import agent_loop as verl_loop
from verl.utils.dataset.rl_dataset import RLHFDataset

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[str]]:
    base = tmp_path_factory.mktemp("agentloop")
    model_dir = rollout_sampler.build_tiny_model(base / "model")
    model = trainer_loop.load_model(model_dir, dtype="float32", device="cpu")
    with store.Store(base / "store.db") as db:
        ids = rollout_sampler.write_rollouts(db, model, job="job", tasks=["t"], samples=2, turns=3)
        db.put(
            [  # started, never finished
                trajectory_pb2.Record(
                    idempotency_key="running/started/0",
                    sequence=1,
                    job="job",
                    rollout_id="running",
                    started=trajectory_pb2.RolloutStarted(task_id="t", sample_index=9),
                )
            ]
        )
    return base / "store.db", model_dir, ids


def row_of(db_path: Path, rollout_id: str) -> export.Row:
    with store.Store(db_path) as db:
        rollout = db.rollout(rollout_id)
        assert rollout is not None
        (row,), _ = export.rollout_rows(rollout, db.calls(rollout_id))
    return row


def test_a_captured_row_becomes_verl_agent_loop_output(
    captured: tuple[Path, Path, list[str]],
) -> None:
    db_path, _, ids = captured
    row = row_of(db_path, ids[0])
    output = verl_agent_loop.to_output(row)
    assert isinstance(output, verl_loop.AgentLoopOutput)
    assert (output.prompt_ids, output.response_ids) == (row.prompt_ids, row.response_ids)
    assert (output.response_mask, output.response_logprobs) == (
        row.response_mask,
        row.response_logprobs,
    )
    assert (output.reward_score, output.num_turns) == (row.reward, 6)
    assert output.extra_fields[verl_agent_loop.ROLLOUT_KEY] == ids[0]
    tensors = output.as_dict()  # veRL's own conversion to its batch fields
    assert tensors["responses"].tolist() == row.response_ids
    assert tensors["rollout_log_probs"].tolist() == pytest.approx(row.response_logprobs)
    rm_scores = tensors["rm_scores"].tolist()
    assert rm_scores[-1] == row.reward and sum(rm_scores) == row.reward


def test_long_responses_are_cut_and_long_prompts_refused(
    captured: tuple[Path, Path, list[str]],
) -> None:
    db_path, _, ids = captured
    row = row_of(db_path, ids[1])
    cut = verl_agent_loop.to_output(row, max_response_length=5)
    assert (
        cut.response_ids == row.response_ids[:5]
        and cut.response_logprobs == row.response_logprobs[:5]
    )
    assert cut.extra_fields["openforge_truncated_tokens"] == len(row.response_ids) - 5
    with pytest.raises(
        verl_agent_loop.RolloutUnavailable, match=rf"prompt has {len(row.prompt_ids)} tokens"
    ):
        verl_agent_loop.to_output(row, max_prompt_length=3)


def agent_loop(
    db_path: Path, model_dir: Path, **kwargs: object
) -> verl_agent_loop.OpenForgeAgentLoop:
    config = OmegaConf.create(
        {"actor_rollout_ref": {"rollout": {"prompt_length": 64, "response_length": 64}}, "data": {}}
    )
    return verl_agent_loop.OpenForgeAgentLoop(
        trainer_config=verl_loop.DictConfigWrap(config),
        server_manager=None,
        tokenizer=transformers.AutoTokenizer.from_pretrained(model_dir),
        processor=None,
        dataset_cls=RLHFDataset,
        data_config=verl_loop.DictConfigWrap(config.data),
        store=str(db_path),
        **kwargs,
    )


def test_the_agent_loop_runs_under_verl_base_class(captured: tuple[Path, Path, list[str]]) -> None:
    db_path, model_dir, ids = captured
    assert verl_loop._agent_loop_registry["openforge"] == {
        "_target_": "openforge_trainer.training.verl_agent_loop.OpenForgeAgentLoop"
    }
    loop = agent_loop(db_path, model_dir, job="job", poll_interval=0.05, timeout=0.3)
    sample = {"raw_prompt": [], "extra_info": {verl_agent_loop.ROLLOUT_KEY: ids[0]}}
    output = asyncio.run(loop.run({"temperature": 1.0}, **sample))
    assert output.response_ids == row_of(db_path, ids[0]).response_ids
    with pytest.raises(
        verl_agent_loop.RolloutUnavailable, match=r"'running' not complete .* after 0\.3 s"
    ):
        asyncio.run(loop.run({}, **{verl_agent_loop.ROLLOUT_KEY: "running"}))
    with pytest.raises(verl_agent_loop.RolloutUnavailable, match="no openforge_rollout_id"):
        asyncio.run(loop.run({}, raw_prompt=[]))
    other = agent_loop(db_path, model_dir, job="other-job")
    with pytest.raises(
        verl_agent_loop.RolloutUnavailable, match="belongs to job 'job', not 'other-job'"
    ):
        asyncio.run(other.run({}, **{verl_agent_loop.ROLLOUT_KEY: ids[0]}))


def png_url(color: tuple[int, int, int], size: tuple[int, int] = (30, 20)) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_a_row_with_images_gives_verl_its_multi_modal_data(captured: tuple[Path, Path, list[str]]) -> None:
    db_path, _, ids = captured
    urls = [png_url((255, 0, 0)), png_url((0, 0, 255), (40, 28))]
    row = dataclasses.replace(row_of(db_path, ids[0]), images=urls)
    output = verl_agent_loop.to_output(row)
    assert output.multi_modal_data is not None
    first, second = output.multi_modal_data["images"]
    assert (first.mode, first.size, first.getpixel((0, 0))) == ("RGB", (30, 20), (255, 0, 0))
    assert (second.size, second.getpixel((39, 27))) == ((40, 28), (0, 0, 255))
    assert verl_agent_loop.to_output(row_of(db_path, ids[0])).multi_modal_data is None
    # A cut response would keep the images but lose placeholders: refused.
    with pytest.raises(verl_agent_loop.RolloutUnavailable, match="separate images from their placeholders"):
        verl_agent_loop.to_output(row, max_response_length=1)
    with pytest.raises(verl_agent_loop.RolloutUnavailable, match="cannot be decoded"):
        verl_agent_loop.to_output(dataclasses.replace(row, images=["https://x/y.png"]))

