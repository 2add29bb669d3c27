"""Model calls as the sidecar stores them when they complete, are cut off, or are refused.

The fields follow ``openforge_sidecar.capture._spool_call``: a call whose
client disconnected mid-stream keeps HTTP 200 (the answer had begun), its
error, ``finish_reason`` "error", ``token_exact`` False and the tokens sampled
so far; a refused call has the refusal's 4xx status, its error and
``finish_reason`` "error". :func:`records` wraps calls into a finished
rollout's records, ready for ``Store.put``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from openforge.trajectory.v1 import trajectory_pb2


def _call(
    index: int, prompt: Sequence[int], segment: int, **fields: Any
) -> trajectory_pb2.ModelCall:
    """A token-level Chat Completions call; ``fields`` say how it ended."""
    return trajectory_pb2.ModelCall(
        call_index=index,
        wire_api=trajectory_pb2.WIRE_API_OPENAI_CHAT,
        capture_mode=trajectory_pb2.CAPTURE_MODE_TOKENS,
        prompt_token_ids=list(prompt),
        segment_index=segment,
        **fields,
    )


def completed(
    index: int, prompt: Sequence[int], completion: Sequence[int], *, segment: int = 0
) -> trajectory_pb2.ModelCall:
    return _call(
        index, prompt, segment,
        completion_token_ids=list(completion), completion_logprobs=[-0.5] * len(completion),
        finish_reason="stop", http_status=200, token_exact=True,
    )  # fmt: skip


def disconnected(
    index: int, prompt: Sequence[int], partial: Sequence[int], *, segment: int = 0
) -> trajectory_pb2.ModelCall:
    """The harness hung up mid-stream: the tokens sampled until then, no more."""
    return _call(
        index, prompt, segment,
        stream=True, completion_token_ids=list(partial), completion_logprobs=[-0.25] * len(partial),
        finish_reason="error", http_status=200, token_exact=False,
        error="connection failed: client disconnected",
    )  # fmt: skip


def refused(
    index: int, prompt: Sequence[int], *, status: int = 400, segment: int = 0
) -> trajectory_pb2.ModelCall:
    """The engine refused the tokenized request (its context was too long, say)."""
    return _call(
        index, prompt, segment,
        finish_reason="error", http_status=status,
        error=f"engine answered {status}: maximum context length exceeded",
    )  # fmt: skip


def records(
    rollout: str,
    calls: Sequence[trajectory_pb2.ModelCall],
    *,
    job: str = "job",
    task: str = "t",
    sample: int = 0,
    reward: float = 1.0,
) -> list[trajectory_pb2.Record]:
    """A finished, complete rollout of ``calls``: started, the calls, finished."""
    out = [
        trajectory_pb2.Record(
            started=trajectory_pb2.RolloutStarted(task_id=task, sample_index=sample, attempt=1)
        ),
        *(trajectory_pb2.Record(call=call) for call in calls),
        trajectory_pb2.Record(
            finished=trajectory_pb2.RolloutFinished(
                has_reward=True, reward=reward, call_count=len(calls), status="succeeded"
            )
        ),
    ]
    for sequence, record in enumerate(out, start=1):
        record.sequence, record.job, record.rollout_id = sequence, job, rollout
        record.idempotency_key = f"{rollout}/{record.WhichOneof('body')}/{sequence}"
    return out


# One rollout of each outcome, in call order: a completed turn, the next turn cut off
# mid-stream (10 partial tokens), then that turn again, refused.
PROMPT = [1, 2, 3]
ANSWER = [10, 11]
NEXT_PROMPT = [*PROMPT, *ANSWER, 20, 21]
MIXED = (
    completed(0, PROMPT, ANSWER),
    disconnected(1, NEXT_PROMPT, list(range(30, 40))),
    refused(2, NEXT_PROMPT),
)
