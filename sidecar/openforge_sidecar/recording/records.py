"""Builders for the trajectory records a sidecar spools (pure)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from openforge.trajectory.v1 import trajectory_pb2 as pb
from openforge.wire import conversation

STOPPED_EXIT_CODE = -1
"""The exit code recorded for a rollout closed before it was finished (stopped, or drained)."""


def started(
    *,
    job: str,
    rollout_id: str,
    task_id: str,
    sample_index: int,
    attempt: int,
    harness: str,
    policy_version: int,
    labels: Mapping[str, str],
) -> pb.Record:
    return pb.Record(
        idempotency_key=f"{rollout_id}/started",
        job=job,
        rollout_id=rollout_id,
        started=pb.RolloutStarted(
            task_id=task_id,
            sample_index=sample_index,
            attempt=attempt,
            harness=harness,
            policy_version=policy_version,
            started_unix_nanos=time.time_ns(),
            labels=dict(labels),
        ),
    )


def call(*, job: str, rollout_id: str, model_call: pb.ModelCall) -> pb.Record:
    return pb.Record(
        idempotency_key=f"{rollout_id}/call/{model_call.call_index}",
        job=job,
        rollout_id=rollout_id,
        call=model_call,
    )


def finished(
    *,
    job: str,
    rollout_id: str,
    exit_code: int,
    reward: float | None,
    grader_output: str,
    call_count: int,
    status: str,
) -> pb.Record:
    return pb.Record(
        idempotency_key=f"{rollout_id}/finished",
        job=job,
        rollout_id=rollout_id,
        finished=pb.RolloutFinished(
            exit_code=exit_code,
            has_reward=reward is not None,
            reward=reward or 0.0,
            grader_output=grader_output,
            call_count=call_count,
            finished_unix_nanos=time.time_ns(),
            status=status,
        ),
    )


def lost(
    *, job: str, rollout_id: str, index: int, reason: str, call_index: int = 0, whole: bool = False
) -> pb.Record:
    return pb.Record(
        idempotency_key=f"{rollout_id}/lost/{index}",
        job=job,
        rollout_id=rollout_id,
        lost=pb.Lost(reason=reason, call_index=call_index, whole_rollout=whole),
    )


def model_call(
    *,
    call_index: int,
    api: conversation.WireApi,
    token_mode: bool,
    stream: bool,
    model: str,
    request_json: bytes,
    response_json: bytes,
    http_status: int,
    request_headers: Mapping[str, str],
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    logprobs: Sequence[float],
    finish_reason: str,
    segment_index: int,
    segment_reason: str,
    prefix_token_count: int,
    policy_version: int,
    received_ns: int,
    ttft_ms: float,
    total_ms: float,
    error: str,
) -> pb.ModelCall:
    return pb.ModelCall(
        call_index=call_index,
        wire_api=api.proto_name,
        capture_mode=pb.CAPTURE_MODE_TOKENS if token_mode else pb.CAPTURE_MODE_PASSTHROUGH,
        stream=stream,
        model=model,
        request_json=request_json,
        response_json=response_json,
        http_status=http_status,
        request_headers=dict(request_headers),
        prompt_token_ids=list(prompt_ids),
        completion_token_ids=list(completion_ids),
        completion_logprobs=list(logprobs),
        finish_reason=finish_reason,
        segment_index=segment_index,
        segment_reason=segment_reason,
        prefix_token_count=prefix_token_count,
        policy_version=policy_version,
        timings=pb.Timings(
            received_unix_nanos=received_ns, time_to_first_token_ms=ttft_ms, total_ms=total_ms
        ),
        error=error,
        token_exact=token_mode and bool(completion_ids) and not error,
    )
