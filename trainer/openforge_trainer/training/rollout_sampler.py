"""Rollouts sampled in-process from a Hugging Face model, written as trajectory records.

For tests, benchmarks and smoke runs of the trainer without a harness, a
sidecar or an inference server: it builds a tiny Qwen2 policy from a seed
(with the committed tiny tokenizer), samples multi-turn "agent" rollouts
from it with torch (temperature 1, recording each sampled token's raw
log-prob, as vLLM reports it), and stores them exactly as the collector
would: ``RolloutStarted``, one ``ModelCall`` per turn (each prompt extends
the previous prompt + completion + a tool result, so export merges them into
one row), ``RolloutFinished`` with a reward. This is not the capture path.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import transformers
from openforge import trajectory
from openforge.trajectory.v1 import trajectory_pb2

from openforge_trainer.collection import store as store_module
from openforge_trainer.tiny import tokenizer_build

VOCAB = 4096
PAD, IM_START, IM_END, TOOL_OPEN, TOOL_CLOSE = 0, 1, 2, 5, 6
FIRST_ORDINARY = 10


def build_tiny_model(
    directory: Path,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
) -> Path:
    """Save a randomly initialised Qwen2 causal LM (+ the tiny tokenizer) in ``directory``."""
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    config = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
        pad_token_id=PAD,
        eos_token_id=IM_END,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(config)  # type: ignore[no-untyped-call]
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    for path in tokenizer_build.committed_assets().iterdir():
        if path.is_file():
            shutil.copy2(path, directory / path.name)
    return directory


@torch.no_grad()
def sample(
    model: Any,
    prompt: Sequence[int],
    *,
    max_new_tokens: int,
    generator: torch.Generator,
    stop: int = IM_END,
) -> tuple[list[int], list[float]]:
    """Sample up to ``max_new_tokens`` at temperature 1; the tokens and their log-probs."""
    tokens: list[int] = []
    log_probs: list[float] = []
    past = None
    feed = torch.tensor([list(prompt)])
    for _ in range(max_new_tokens):
        output = model(input_ids=feed, past_key_values=past, use_cache=True)
        past = output.past_key_values
        distribution = torch.log_softmax(output.logits[0, -1].float(), dim=-1)
        token = int(torch.multinomial(distribution.exp(), 1, generator=generator))
        tokens.append(token)
        log_probs.append(float(distribution[token]))
        if token == stop:
            break
        feed = torch.tensor([[token]])
    return tokens, log_probs


def even_share_reward(completions: Sequence[Sequence[int]]) -> float:
    """1.0 when most sampled tokens are even ids, else 0.0 (an arbitrary, learnable goal)."""
    tokens = [token for completion in completions for token in completion]
    return 1.0 if tokens and sum(token % 2 == 0 for token in tokens) * 2 > len(tokens) else 0.0


def write_rollouts(
    db: store_module.Store,
    model: Any,
    *,
    job: str,
    tasks: Sequence[str],
    samples: int,
    turns: int = 2,
    prompt_tokens: int = 12,
    max_new_tokens: int = 8,
    tool_tokens: int = 4,
    policy_version: int = 0,
    seed: int = 0,
    reward: Callable[[Sequence[Sequence[int]]], float] = even_share_reward,
    batch: str = "",
) -> list[str]:
    """Sample ``samples`` rollouts per task and store them (labelled with ``batch``, if
    given, as a runner labels an iteration's); their rollout ids."""
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    ids = []
    for task in tasks:
        rng = random.Random(f"{seed}/{task}")
        prompt = [IM_START, *_ordinary(rng, prompt_tokens), IM_END, IM_START]
        for sample_index in range(samples):
            rollout_id = f"{job}-{task}-{sample_index}-v{policy_version}-s{seed}" + (
                f"-b{batch}" if batch else ""
            )
            calls, completions = _turns(
                model,
                prompt,
                rng=rng,
                generator=generator,
                turns=turns,
                max_new_tokens=max_new_tokens,
                tool_tokens=tool_tokens,
            )
            records = rollout_records(
                rollout_id,
                job=job,
                task=task,
                sample_index=sample_index,
                calls=calls,
                policy_version=policy_version,
                reward=reward(completions),
                batch=batch,
            )
            db.put(records)
            ids.append(rollout_id)
    return ids


def _ordinary(rng: random.Random, count: int) -> list[int]:
    return [rng.randrange(FIRST_ORDINARY, VOCAB) for _ in range(count)]


def _turns(
    model: Any,
    prompt: list[int],
    *,
    rng: random.Random,
    generator: torch.Generator,
    turns: int,
    max_new_tokens: int,
    tool_tokens: int,
) -> tuple[list[tuple[list[int], list[int], list[float]]], list[list[int]]]:
    calls = []
    completions = []
    context = list(prompt)
    for turn in range(turns):
        tokens, log_probs = sample(
            model, context, max_new_tokens=max_new_tokens, generator=generator
        )
        calls.append((list(context), tokens, log_probs))
        completions.append(tokens)
        if turn + 1 < turns:  # the harness answers with a tool result, then asks again
            tool = [TOOL_OPEN, *_ordinary(rng, tool_tokens), TOOL_CLOSE, IM_START]
            context = context + tokens + tool
    return calls, completions


def rollout_records(
    rollout_id: str,
    *,
    job: str,
    task: str,
    sample_index: int,
    calls: list[tuple[list[int], list[int], list[float]]],
    policy_version: int,
    reward: float,
    batch: str = "",
) -> list[Any]:
    """The records the collector would store for one rollout of ``calls``.

    ``calls`` holds (prompt ids, completion ids, completion log-probs) per
    model call, in order.
    """
    records = [
        trajectory_pb2.Record(
            idempotency_key=f"{rollout_id}/started/0",
            started=trajectory_pb2.RolloutStarted(
                task_id=task,
                sample_index=sample_index,
                attempt=1,
                harness="in-process",
                policy_version=policy_version,
                labels={trajectory.BATCH_LABEL: batch} if batch else {},
            ),
        )
    ]
    for index, (prompt, completion, log_probs) in enumerate(calls):
        records.append(
            trajectory_pb2.Record(
                idempotency_key=f"{rollout_id}/call/{index}",
                call=trajectory_pb2.ModelCall(
                    call_index=index,
                    wire_api=trajectory_pb2.WIRE_API_OPENAI_CHAT,
                    capture_mode=trajectory_pb2.CAPTURE_MODE_TOKENS,
                    prompt_token_ids=prompt,
                    completion_token_ids=completion,
                    completion_logprobs=log_probs,
                    finish_reason="stop" if completion and completion[-1] == IM_END else "length",
                    segment_index=0,
                    segment_reason="first" if index == 0 else "",
                    prefix_token_count=0 if index == 0 else len(calls[index - 1][0]),
                    policy_version=policy_version,
                    token_exact=True,
                    http_status=200,
                ),
            )
        )
    records.append(
        trajectory_pb2.Record(
            idempotency_key=f"{rollout_id}/finished/0",
            finished=trajectory_pb2.RolloutFinished(
                exit_code=0,
                has_reward=True,
                reward=reward,
                call_count=len(calls),
                status="succeeded",
            ),
        )
    )
    for sequence, record in enumerate(records, start=1):
        record.sequence, record.job, record.rollout_id = sequence, job, rollout_id
    return records
