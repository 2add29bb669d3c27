"""The veRL agent-loop integration, on CPU: conversion and veRL's own base class."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import call_outcomes
import pytest
import torch
import transformers
from omegaconf import OmegaConf
from openforge import policy_servers
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
        # the same task's group in a later batch, sampled by policy version 1
        rollout_sampler.write_rollouts(
            db, model, job="job", tasks=["t"], samples=2, turns=2, policy_version=1, batch="1"
        )
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
    loop = agent_loop(db_path, model_dir, job="job", poll_interval=0.05, timeout=0.3)
    sample = {"raw_prompt": [], "extra_info": {verl_agent_loop.ROLLOUT_KEY: ids[0]}}
    (output,) = asyncio.run(loop.run({"temperature": 1.0}, session_id=0, **sample))
    assert output.response_ids == row_of(db_path, ids[0]).response_ids
    assert (output.extra_fields["min_global_steps"], output.extra_fields["max_global_steps"]) == (
        0,
        0,
    )
    with pytest.raises(
        verl_agent_loop.RolloutUnavailable, match=r"rollout 'running' not complete .* after 0\.3 s"
    ):
        asyncio.run(loop.run({}, **{verl_agent_loop.ROLLOUT_KEY: "running"}))
    with pytest.raises(verl_agent_loop.RolloutUnavailable, match="has none of openforge_task_id"):
        asyncio.run(loop.run({}, raw_prompt=[]))
    other = agent_loop(db_path, model_dir, job="other-job")
    with pytest.raises(
        verl_agent_loop.RolloutUnavailable, match="belongs to job 'job', not 'other-job'"
    ):
        asyncio.run(other.run({}, **{verl_agent_loop.ROLLOUT_KEY: ids[0]}))


def test_a_group_of_n_sessions_is_n_distinct_rollouts_of_the_task(
    captured: tuple[Path, Path, list[str]],
) -> None:
    db_path, model_dir, _ = captured
    loop = agent_loop(db_path, model_dir, job="job", poll_interval=0.05, timeout=0.3)
    for batch, version in (("", 0), ("1", 1)):
        sample = {"extra_info": {verl_agent_loop.TASK_KEY: "t", verl_agent_loop.BATCH_KEY: batch}}
        outputs = [asyncio.run(loop.run({}, session_id=k, **sample)) for k in range(2)]
        ids = [out.extra_fields[verl_agent_loop.ROLLOUT_KEY] for (out,) in outputs]
        assert len(set(ids)) == 2, ids
        with store.Store(db_path) as db:
            rollouts = [db.rollout(i) for i in ids]
        assert [(r.task_id, r.sample_index, r.batch) for r in rollouts if r] == [
            ("t", 0, batch),
            ("t", 1, batch),
        ]
        assert {out.extra_fields["max_global_steps"] for (out,) in outputs} == {version}
    with pytest.raises(
        verl_agent_loop.RolloutUnavailable, match="sample 2 of task 't' in batch '1' not complete"
    ):
        asyncio.run(
            loop.run(
                {}, session_id=2, **{verl_agent_loop.TASK_KEY: "t", verl_agent_loop.BATCH_KEY: "1"}
            )
        )
    # one rollout id cannot answer a group: the bug that made a group of n one rollout n times
    with pytest.raises(
        verl_agent_loop.RolloutUnavailable, match="a group needs one rollout per session"
    ):
        asyncio.run(loop.run({}, session_id=1, **{verl_agent_loop.ROLLOUT_KEY: "x"}))
    named = {verl_agent_loop.ROLLOUT_IDS_KEY: list(reversed(_ids_of(db_path)))}
    (first,) = asyncio.run(loop.run({}, session_id=0, **named))
    assert (
        first.extra_fields[verl_agent_loop.ROLLOUT_KEY] == named[verl_agent_loop.ROLLOUT_IDS_KEY][0]
    )
    with pytest.raises(verl_agent_loop.RolloutUnavailable, match="no rollout for session 9"):
        asyncio.run(loop.run({}, session_id=9, **named))


def _ids_of(db_path: Path) -> list[str]:
    with store.Store(db_path) as db:
        return [r.rollout_id for r in db.rollouts("job") if r.complete and not r.batch]


VERL_WORKER = """
import asyncio, sys
import hydra, transformers
from omegaconf import OmegaConf
from verl.experimental.agent_loop import agent_loop as verl_loop
from verl.utils.dataset.rl_dataset import RLHFDataset

yaml_path, model_dir = sys.argv[1:3]
for entry in OmegaConf.load(yaml_path):  # as AgentLoopWorker.__init__ loads the YAML
    verl_loop._agent_loop_registry[entry.name] = entry
config = OmegaConf.create(
    {"actor_rollout_ref": {"rollout": {"prompt_length": 64, "response_length": 64}}, "data": {}}
)
tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
for session in range(2):  # as AgentLoopWorker._run_agent_loop does, once per session
    loop = hydra.utils.instantiate(
        config=verl_loop._agent_loop_registry["openforge"],
        trainer_config=verl_loop.DictConfigWrap(config), server_manager=None, tokenizer=tokenizer,
        processor=None, dataset_cls=RLHFDataset, data_config=verl_loop.DictConfigWrap(config.data),
    )
    (output,) = asyncio.run(loop.run({}, session_id=session, openforge_task_id="t"))
    print(output.extra_fields["openforge_rollout_id"])
"""


def test_verl_constructs_the_loop_from_its_yaml_entry_for_every_sample(
    captured: tuple[Path, Path, list[str]], tmp_path: Path
) -> None:
    """veRL's worker loads the agent-loop YAML, then hydra imports this module on the first
    sample: the module must not replace that entry (and its store) as it is imported. Run in
    a fresh interpreter, as a worker is, so the import happens after the YAML is loaded."""
    db_path, model_dir, ids = captured
    yaml_path = tmp_path / "agent_loops.yaml"
    OmegaConf.save(
        OmegaConf.create(
            [
                {
                    "name": "openforge",
                    "_target_": f"{verl_agent_loop.__name__}.OpenForgeAgentLoop",
                    "store": str(db_path),
                    "job": "job",
                    "timeout": 5,
                }
            ]
        ),
        yaml_path,
    )
    done = subprocess.run(
        [sys.executable, "-c", VERL_WORKER, str(yaml_path), str(model_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ids[:2]


def test_a_rewritten_history_gives_one_output_per_segment(
    captured: tuple[Path, Path, list[str]],
) -> None:
    db_path, _, ids = captured
    row = row_of(db_path, ids[0])
    second = dataclasses.replace(row, segment_index=1, policy_versions=[2, 3], policy_version=2)
    outputs = [verl_agent_loop.to_output(r, segments=2) for r in (row, second)]
    assert [o.extra_fields["openforge_segments"] for o in outputs] == [2, 2]
    assert (
        outputs[1].extra_fields["min_global_steps"],
        outputs[1].extra_fields["max_global_steps"],
    ) == (2, 3)
    assert all(o.reward_score == row.reward for o in outputs)


def test_failed_calls_never_become_verl_outputs(tmp_path: Path) -> None:
    """A call cut off mid-stream or refused gives veRL nothing; the completed calls do."""
    failed = (call_outcomes.disconnected(0, [1, 2, 3], [7, 8]), call_outcomes.refused(1, [1, 2, 3]))
    with store.Store(tmp_path / "store.db") as db:
        db.put(call_outcomes.records("mixed", call_outcomes.MIXED))
        db.put(call_outcomes.records("failed", failed, sample=1))
        outputs = verl_agent_loop.captured_outputs(
            db, verl_agent_loop.SessionRef(rollout_id="mixed")
        )
        assert outputs is not None
        assert [
            (o.response_ids, o.response_mask, o.extra_fields["openforge_segments"]) for o in outputs
        ] == [([10, 11], [1, 1], 1)]
        with pytest.raises(
            verl_agent_loop.RolloutUnavailable,
            match=r"rollout 'failed' has no completed token-level calls "
            r"\(failed calls not trained: 1 aborted, 1 refused\)",
        ):
            verl_agent_loop.captured_outputs(db, verl_agent_loop.SessionRef(rollout_id="failed"))


def png_url(color: tuple[int, int, int], size: tuple[int, int] = (30, 20)) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_a_row_with_images_gives_verl_its_multi_modal_data(
    captured: tuple[Path, Path, list[str]],
) -> None:
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
    with pytest.raises(
        verl_agent_loop.RolloutUnavailable, match="separate images from their placeholders"
    ):
        verl_agent_loop.to_output(row, max_response_length=1)
    with pytest.raises(verl_agent_loop.RolloutUnavailable, match="cannot be decoded"):
        verl_agent_loop.to_output(dataclasses.replace(row, images=["https://x/y.png"]))


def test_with_veRLs_own_servers_the_loop_says_where_they_are(
    captured: tuple[Path, Path, list[str]], tmp_path: Path, verl_client: Any
) -> None:
    """With ``engines_file`` (``train-verl --rollout vllm``) each step's first session writes
    the addresses veRL's load balancer holds, with the step, before it waits for its
    rollout; a session without veRL's step is refused."""
    db_path, model_dir, _ids = captured
    engines = tmp_path / policy_servers.FILE
    loop = agent_loop(db_path, model_dir, job="job", engines_file=str(engines), timeout=5)
    loop.server_manager = verl_client(["10.0.0.5:41234"])
    sample = {"extra_info": {verl_agent_loop.TASK_KEY: "t", verl_agent_loop.BATCH_KEY: "1"}}
    (output,) = asyncio.run(loop.run({}, session_id=0, global_steps=4, **sample))
    assert output.extra_fields["openforge_rollout_id"]
    assert policy_servers.read(engines) == policy_servers.Engines(
        step=4, addresses=("10.0.0.5:41234",)
    )
    with pytest.raises(verl_agent_loop.RolloutUnavailable, match="needs its global_steps"):
        asyncio.run(loop.run({}, session_id=0, **sample))
    loop.server_manager = None  # veRL's external rollout gives no balancer
    with pytest.raises(verl_agent_loop.RolloutUnavailable, match="no load balancer"):
        asyncio.run(loop.run({}, session_id=0, global_steps=5, **sample))


def test_an_attempt_tried_again_is_waited_for_not_given_to_verl(tmp_path: Path) -> None:
    """The sample's latest attempt failed and its finish says it is tried again: the
    session waits (None) for the next attempt, which it then gets."""
    retried = call_outcomes.records("a1", call_outcomes.MIXED)
    retried[-1].finished.status, retried[-1].finished.retried = "failed", True
    session = verl_agent_loop.SessionRef(task_id="t", sample_index=0, batch="")
    with store.Store(tmp_path / "store.db") as db:
        db.put(retried)
        assert verl_agent_loop.captured_outputs(db, session, job="job") is None
        again = call_outcomes.records("a2", call_outcomes.MIXED)
        again[0].started.attempt = 2
        db.put(again)
        outputs = verl_agent_loop.captured_outputs(db, session, job="job")
    assert outputs is not None
    assert {o.extra_fields[verl_agent_loop.ROLLOUT_KEY] for o in outputs} == {"a2"}
