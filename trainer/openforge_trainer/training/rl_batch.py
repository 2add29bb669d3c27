"""Training rows -> one veRL batch (``verl.DataProto``), laid out as veRL lays it out.

veRL's agent loop pads prompts on the left and responses on the right
(``verl/experimental/agent_loop/agent_loop.py``, ``_agent_loop_postprocess``),
so every row's response starts at the same column ``P``. For rows of prompt
lengths p_i and response lengths r_i (P = max p_i, R = max r_i):

==================== ========== =============================================
key                  shape      content
==================== ========== =============================================
prompts              [B, P]     prompt ids, left-padded with ``pad_token_id``
responses            [B, R]     response ids (model + tool tokens), right-padded
response_mask        [B, R]     1 on model-sampled tokens; 0 on tool/user
                                tokens and padding (the loss mask)
input_ids            [B, P+R]   prompts ++ responses
attention_mask       [B, P+R]   1 on real tokens, 0 on padding
position_ids         [B, P+R]   cumsum(attention_mask) - 1, clipped at 0
rollout_log_probs    [B, R]     the log-probs captured when the tokens were
                                sampled (0 outside response_mask)
token_level_scores   [B, R]     the rollout's reward on the row's last
                                response token, 0 elsewhere
token_level_rewards  [B, R]     the same (no KL in the reward)
==================== ========== =============================================

``non_tensor_batch`` (numpy object/int arrays, one entry per row): ``uid``
(the GRPO group: ``<job>/<task_id>``), ``rollout_id``, ``task_id``,
``sample_index``, ``segment_index``, ``policy_version``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from verl import DataProto

from openforge_trainer.trajectories import export

TENSOR_KEYS = (
    "prompts",
    "responses",
    "response_mask",
    "input_ids",
    "attention_mask",
    "position_ids",
    "rollout_log_probs",
    "token_level_scores",
    "token_level_rewards",
)


class BatchError(ValueError):
    """Rows that cannot make a batch (names the row at fault)."""


def group_key(row: export.Row) -> str:
    return f"{row.job}/{row.task_id}"


def build(rows: Sequence[export.Row], *, pad_token_id: int = 0) -> DataProto:
    """The veRL batch of ``rows`` (see the module docstring for the layout)."""
    if not rows:
        raise BatchError("no rows to batch")
    for row in rows:
        _check(row)
    prompt_width = max(len(row.prompt_ids) for row in rows)
    response_width = max(len(row.response_ids) for row in rows)
    size = (len(rows), prompt_width + response_width)
    input_ids = torch.full(size, pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(size, dtype=torch.long)
    response_mask = torch.zeros((len(rows), response_width), dtype=torch.long)
    log_probs = torch.zeros((len(rows), response_width), dtype=torch.float32)
    scores = torch.zeros((len(rows), response_width), dtype=torch.float32)
    for i, row in enumerate(rows):
        start, end = prompt_width - len(row.prompt_ids), prompt_width + len(row.response_ids)
        input_ids[i, start:end] = torch.tensor(row.prompt_ids + row.response_ids)
        attention_mask[i, start:end] = 1
        length = len(row.response_ids)
        response_mask[i, :length] = torch.tensor(row.response_mask)
        log_probs[i, :length] = torch.tensor(row.response_logprobs)
        if length:
            scores[i, length - 1] = row.reward
    log_probs *= response_mask
    tensors = {
        "prompts": input_ids[:, :prompt_width].clone(),
        "responses": input_ids[:, prompt_width:].clone(),
        "response_mask": response_mask,
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0),
        "rollout_log_probs": log_probs,
        "token_level_scores": scores,
        "token_level_rewards": scores.clone(),
    }
    non_tensors = {
        "uid": np.array([group_key(row) for row in rows], dtype=object),
        "rollout_id": np.array([row.rollout_id for row in rows], dtype=object),
        "task_id": np.array([row.task_id for row in rows], dtype=object),
        "sample_index": np.array([row.sample_index for row in rows], dtype=np.int64),
        "segment_index": np.array([row.segment_index for row in rows], dtype=np.int64),
        "policy_version": np.array([row.policy_version for row in rows], dtype=np.int64),
    }
    meta = {"pad_token_id": pad_token_id, "prompt_width": prompt_width}
    batch: DataProto = DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta)
    return batch


def _check(row: export.Row) -> None:
    lengths = (len(row.response_ids), len(row.response_mask), len(row.response_logprobs))
    if len(set(lengths)) != 1:
        raise BatchError(
            f"row of rollout {row.rollout_id!r} segment {row.segment_index}: response_ids, "
            f"response_mask and response_logprobs differ in length {lengths}"
        )
    if not row.prompt_ids:
        raise BatchError(f"row of rollout {row.rollout_id!r}: prompt_ids is empty")


def rollout_index(batch: DataProto) -> tuple[list[str], torch.Tensor]:
    """Rollout ids in first-seen order, and each row's index into them ([B])."""
    order: dict[str, int] = {}
    index = [order.setdefault(str(rid), len(order)) for rid in batch.non_tensor_batch["rollout_id"]]
    return list(order), torch.tensor(index, dtype=torch.long)
