"""Builders for the trajectory records a sidecar spools (pure)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openforge.trajectory.v1 import trajectory_pb2 as pb
from openforge.wire import conversation

from openforge_sidecar.policy import stored

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
    retried: bool = False,
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
            retried=retried,
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


@dataclass(frozen=True, slots=True)
class Stashed:
    """A large body kept in a file beside the spool while its call is answered, not in
    memory (see ``Recorder.stash``); the file goes once the spool has taken the record."""

    path: Path
    size: int

    def __len__(self) -> int:
        return self.size

    def pieces(self) -> Iterator[bytes]:
        """The body, a quarter megabyte at a time; OSError when the file is not the body."""
        read = 0
        with self.path.open("rb") as handle:
            while piece := handle.read(_PIECE_BYTES):
                read += len(piece)
                yield piece
        if read != self.size:
            raise OSError(f"{self.path} holds {read} bytes, not the body's {self.size}")

    def read(self) -> bytes:
        return b"".join(self.pieces())

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


#: A request body as a record takes it: in memory, or stashed in a file...
Body = bytes | Stashed
#: ...in this folder of the spool's directory (with a large call's prompt IDs, and large
#: conversation heads' IDs in ``heads/``).
STASH_DIRECTORY = "stash"
#: A stashed body is read back this much at a time (each piece is written as it is read).
_PIECE_BYTES = 256 * 1024


@dataclass(frozen=True, kw_only=True, slots=True)
class Call:
    """What the capture addon knows of a finished call: a ``ModelCall``'s values, held
    by reference (the bodies and token IDs are copied once, into the record)."""

    call_index: int
    api: conversation.WireApi
    token_mode: bool = True
    stream: bool = False
    model: str = ""
    request_json: Body = b""
    response_json: bytes = b""
    http_status: int = 200
    request_headers: Mapping[str, str] = field(default_factory=dict)
    prompt_ids: Sequence[int] | stored.StoredIds = ()
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


@dataclass(frozen=True, slots=True)
class CallRecord:
    """A call's record with its two large fields apart: the harness's request body and
    the prompt's IDs (a 30 MB request's are 30 MB and some 25 MB of IDs). The spool
    writes them where they are, in pieces (:meth:`serialized`), instead of a message
    holding copies of them and then its serialization another. Read back, the frame is
    the record :meth:`whole` builds."""

    record: pb.Record  # everything else
    request_json: Body
    prompt_ids: Sequence[int] | stored.StoredIds

    @property
    def idempotency_key(self) -> str:
        return str(self.record.idempotency_key)

    def whole(self) -> pb.Record:
        """The record as one message (tests, and readers that want one)."""
        record = pb.Record()
        record.CopyFrom(self.record)
        request = self.request_json
        record.call.request_json = request.read() if isinstance(request, Stashed) else request
        ids = self.prompt_ids
        _fill(
            record.call.prompt_token_ids, ids.load() if isinstance(ids, stored.StoredIds) else ids
        )
        return record

    def serialized(self, sequence: int) -> tuple[int, Iterator[bytes | memoryview]]:
        """The record with ``sequence``, serialized: its length, and its bytes in pieces.

        Protobuf's wire format lets the pieces be written apart: a message's fields
        may come in any order, and a packed repeated field in several runs, which a
        parser joins. The prompt's IDs are serialized a chunk at a time, twice: once
        for their size (which the call's length prefix needs first) and once to write.
        """
        self.record.sequence = sequence
        outer = self.record
        head = pb.Record(
            idempotency_key=outer.idempotency_key,
            sequence=sequence,
            job=outer.job,
            rollout_id=outer.rollout_id,
        ).SerializeToString()
        small = outer.call.SerializeToString()
        request = (
            _key(_REQUEST_JSON) + _varint(len(self.request_json)) if self.request_json else b""
        )
        ids_size = sum(chunk.ByteSize() for chunk in self._chunks())
        call_size = len(small) + len(request) + len(self.request_json) + ids_size
        opening = _key(_CALL) + _varint(call_size)
        total = len(head) + len(opening) + call_size

        def pieces() -> Iterator[bytes | memoryview]:
            yield head
            yield opening
            yield small
            if isinstance(self.request_json, Stashed):
                yield request
                yield from self.request_json.pieces()
            elif self.request_json:
                yield request
                yield memoryview(self.request_json)
            for chunk in self._chunks():
                yield chunk.SerializeToString()

        return total, pieces()

    @property
    def large(self) -> bool:
        """Whether its request or its prompt's IDs wait in a file (a large call's)."""
        return isinstance(self.request_json, Stashed) or isinstance(
            self.prompt_ids, stored.StoredIds
        )

    def release(self) -> None:
        """The spool took the record, or refused it: what was stashed is not needed again."""
        if isinstance(self.request_json, Stashed):
            self.request_json.discard()
        if isinstance(self.prompt_ids, stored.StoredIds):
            self.prompt_ids.discard()

    def _chunks(self) -> Iterator[pb.ModelCall]:
        """The prompt's IDs, a message of them at a time."""
        for piece in stored.chunks(self.prompt_ids, _IDS_PER_EXTEND):
            chunk = pb.ModelCall()
            chunk.prompt_token_ids.extend(piece)
            yield chunk


def call(*, job: str, rollout_id: str, finished: Call) -> CallRecord:
    """The record of a finished call (see :class:`CallRecord`). Its ``ModelCall`` is
    filled in place: built apart and then set on the record, it was held twice."""
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
    _fill(record.call.completion_token_ids, finished.completion_ids)
    return CallRecord(
        record=record, request_json=finished.request_json, prompt_ids=finished.prompt_ids
    )


def _fill(target: Any, ids: Sequence[int]) -> None:
    """Extend the repeated field ``target`` with ``ids``.

    protobuf turns what a repeated field is extended with into a list first; and a
    field extended a piece at a time grows by doubling in the record's arena, which
    keeps each outgrown copy (twice the IDs' size in all). A large field is therefore
    sized at once, with a list of one shared 0, then filled a piece at a time."""
    if len(ids) <= _IDS_PER_EXTEND:
        target.extend(ids)
        return
    target.extend([0] * len(ids))
    for start in range(0, len(ids), _IDS_PER_EXTEND):
        target[start : start + _IDS_PER_EXTEND] = ids[start : start + _IDS_PER_EXTEND]


def part_head(*, sequence: int, offset: int, total_bytes: int, size: int) -> bytes:
    """The bytes of a serialized ``Record`` holding only ``sequence`` and a ``RecordPart``
    that come before its ``size`` bytes of data, the message's last field: the message
    is this head and the data, joined once (built as messages and then serialized, the
    data was copied three times: into the part, into the record, and out)."""
    part = pb.RecordPart(offset=offset, total_bytes=total_bytes).SerializeToString()
    part += _key(_PART_DATA) + _varint(size)
    record = pb.Record(sequence=sequence).SerializeToString()
    return record + _key(_PART) + _varint(len(part) + size) + part


def rollout_of(payload: bytes | memoryview) -> str:
    """The ``rollout_id`` of a serialized record, read without parsing the rest: parsed,
    a large call's record is a copy of its request and its prompt's IDs.

    ValueError when the bytes are not a record's wire format."""
    with memoryview(payload) as view:  # released even when a traceback keeps this frame
        return _rollout_of(view)


def _rollout_of(view: memoryview) -> str:
    position = 0
    found = ""
    while position < len(view):
        key, position = _read_varint(view, position)
        number, kind = key >> 3, key & 7
        if kind == 0:
            _, position = _read_varint(view, position)
        elif kind == 1:
            position += 8
        elif kind == 5:
            position += 4
        elif kind == 2:
            length, position = _read_varint(view, position)
            if number == _ROLLOUT_ID:
                found = bytes(view[position : position + length]).decode()  # the last one wins
            position += length
        else:
            raise ValueError(f"wire type {kind} at byte {position}")
    if position != len(view):
        raise ValueError(f"a field runs past the record's end ({position} of {len(view)} bytes)")
    return found


def _read_varint(view: memoryview, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if position >= len(view) or shift > 63:
            raise ValueError(f"a varint is cut short or too long at byte {position}")
        byte = view[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(field_number: int) -> bytes:
    """The key of a length-delimited field (wire type 2)."""
    return _varint(field_number << 3 | 2)


_CALL = pb.Record.DESCRIPTOR.fields_by_name["call"].number
_ROLLOUT_ID = pb.Record.DESCRIPTOR.fields_by_name["rollout_id"].number
_REQUEST_JSON = pb.ModelCall.DESCRIPTOR.fields_by_name["request_json"].number
_PART = pb.Record.DESCRIPTOR.fields_by_name["part"].number
_PART_DATA = pb.RecordPart.DESCRIPTOR.fields_by_name["data"].number
#: Token IDs are copied into a message this many at a time: protobuf makes a list of
#: them first, ~40 bytes an ID (64 Ki of them were 2.5 MB, for a 1 MB call's record).
_IDS_PER_EXTEND = 8 * 1024
