"""Builders for the trajectory records a sidecar spools (pure)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

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


@dataclass(frozen=True, kw_only=True, slots=True)
class Call:
    """What the capture addon knows of a finished call: a ``ModelCall``'s values, held
    by reference (the bodies and token IDs are copied once, into the record)."""

    call_index: int
    api: conversation.WireApi
    token_mode: bool = True
    stream: bool = False
    model: str = ""
    request_json: bytes = b""
    response_json: bytes = b""
    http_status: int = 200
    request_headers: Mapping[str, str] = field(default_factory=dict)
    prompt_ids: Sequence[int] = ()
    completion_ids: Sequence[int] = ()
    logprobs: Sequence[float] = ()
    finish_reason: str = ""
    segment_index: int = 0
    segment_reason: str = ""
    prefix_token_count: int = 0
    policy_version: int = 0
    received_ns: int = 0
    ttft_ms: float = 0.0
    total_ms: float = 0.0
    error: str = ""


def call(*, job: str, rollout_id: str, finished: Call) -> pb.Record:
    """The record of a finished call. Its ``ModelCall`` is filled in place: built apart
    and then set on the record, the bodies and token IDs were held twice, and the token
    IDs passed as a list (a 2-million-token prompt's list is ~70 MB of int objects)."""
    record = pb.Record(
        idempotency_key=f"{rollout_id}/call/{finished.call_index}",
        job=job,
        rollout_id=rollout_id,
        call={
            "call_index": finished.call_index,
            "wire_api": finished.api.proto_name,
            "capture_mode": "CAPTURE_MODE_TOKENS"
            if finished.token_mode
            else "CAPTURE_MODE_PASSTHROUGH",
            "stream": finished.stream,
            "model": finished.model,
            "request_json": finished.request_json,
            "response_json": finished.response_json,
            "http_status": finished.http_status,
            "request_headers": finished.request_headers,
            "completion_logprobs": finished.logprobs,
            "finish_reason": finished.finish_reason,
            "segment_index": finished.segment_index,
            "segment_reason": finished.segment_reason,
            "prefix_token_count": finished.prefix_token_count,
            "policy_version": finished.policy_version,
            "timings": {
                "received_unix_nanos": finished.received_ns,
                "time_to_first_token_ms": finished.ttft_ms,
                "total_ms": finished.total_ms,
            },
            "error": finished.error,
            "token_exact": finished.token_mode
            and bool(finished.completion_ids)
            and not finished.error,
        },
    )
    # protobuf turns what a repeated field is extended with into a list first; and a
    # field extended a piece at a time grows by doubling in the record's arena, which
    # keeps each outgrown copy (twice the IDs' size in all). A large field is therefore
    # sized at once, with a list of one shared 0, then filled a piece at a time.
    for ids, target in (
        (finished.prompt_ids, record.call.prompt_token_ids),
        (finished.completion_ids, record.call.completion_token_ids),
    ):
        if len(ids) <= _IDS_PER_EXTEND:
            target.extend(ids)
            continue
        target.extend([0] * len(ids))
        for start in range(0, len(ids), _IDS_PER_EXTEND):
            target[start : start + _IDS_PER_EXTEND] = ids[start : start + _IDS_PER_EXTEND]
    return record


#: Token IDs are copied into a record this many at a time (see :func:`call`).
_IDS_PER_EXTEND = 64 * 1024
