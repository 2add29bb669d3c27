from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WireApi(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WIRE_API_UNSPECIFIED: _ClassVar[WireApi]
    WIRE_API_OPENAI_CHAT: _ClassVar[WireApi]
    WIRE_API_OPENAI_RESPONSES: _ClassVar[WireApi]
    WIRE_API_ANTHROPIC_MESSAGES: _ClassVar[WireApi]
    WIRE_API_GEMINI: _ClassVar[WireApi]

class CaptureMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CAPTURE_MODE_UNSPECIFIED: _ClassVar[CaptureMode]
    CAPTURE_MODE_TOKENS: _ClassVar[CaptureMode]
    CAPTURE_MODE_PASSTHROUGH: _ClassVar[CaptureMode]
WIRE_API_UNSPECIFIED: WireApi
WIRE_API_OPENAI_CHAT: WireApi
WIRE_API_OPENAI_RESPONSES: WireApi
WIRE_API_ANTHROPIC_MESSAGES: WireApi
WIRE_API_GEMINI: WireApi
CAPTURE_MODE_UNSPECIFIED: CaptureMode
CAPTURE_MODE_TOKENS: CaptureMode
CAPTURE_MODE_PASSTHROUGH: CaptureMode

class Timings(_message.Message):
    __slots__ = ("received_unix_nanos", "time_to_first_token_ms", "total_ms")
    RECEIVED_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    received_unix_nanos: int
    time_to_first_token_ms: float
    total_ms: float
    def __init__(self, received_unix_nanos: _Optional[int] = ..., time_to_first_token_ms: _Optional[float] = ..., total_ms: _Optional[float] = ...) -> None: ...

class ModelCall(_message.Message):
    __slots__ = ("call_index", "wire_api", "capture_mode", "stream", "model", "request_json", "response_json", "http_status", "request_headers", "prompt_token_ids", "completion_token_ids", "completion_logprobs", "finish_reason", "segment_index", "segment_reason", "prefix_token_count", "policy_version", "timings", "error", "token_exact")
    class RequestHeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CALL_INDEX_FIELD_NUMBER: _ClassVar[int]
    WIRE_API_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_MODE_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REQUEST_JSON_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_JSON_FIELD_NUMBER: _ClassVar[int]
    HTTP_STATUS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_HEADERS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_INDEX_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_REASON_FIELD_NUMBER: _ClassVar[int]
    PREFIX_TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TOKEN_EXACT_FIELD_NUMBER: _ClassVar[int]
    call_index: int
    wire_api: WireApi
    capture_mode: CaptureMode
    stream: bool
    model: str
    request_json: bytes
    response_json: bytes
    http_status: int
    request_headers: _containers.ScalarMap[str, str]
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    completion_token_ids: _containers.RepeatedScalarFieldContainer[int]
    completion_logprobs: _containers.RepeatedScalarFieldContainer[float]
    finish_reason: str
    segment_index: int
    segment_reason: str
    prefix_token_count: int
    policy_version: int
    timings: Timings
    error: str
    token_exact: bool
    def __init__(self, call_index: _Optional[int] = ..., wire_api: _Optional[_Union[WireApi, str]] = ..., capture_mode: _Optional[_Union[CaptureMode, str]] = ..., stream: _Optional[bool] = ..., model: _Optional[str] = ..., request_json: _Optional[bytes] = ..., response_json: _Optional[bytes] = ..., http_status: _Optional[int] = ..., request_headers: _Optional[_Mapping[str, str]] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., completion_token_ids: _Optional[_Iterable[int]] = ..., completion_logprobs: _Optional[_Iterable[float]] = ..., finish_reason: _Optional[str] = ..., segment_index: _Optional[int] = ..., segment_reason: _Optional[str] = ..., prefix_token_count: _Optional[int] = ..., policy_version: _Optional[int] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., error: _Optional[str] = ..., token_exact: _Optional[bool] = ...) -> None: ...

class RolloutStarted(_message.Message):
    __slots__ = ("task_id", "sample_index", "attempt", "harness", "policy_version", "started_unix_nanos", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    HARNESS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    sample_index: int
    attempt: int
    harness: str
    policy_version: int
    started_unix_nanos: int
    labels: _containers.ScalarMap[str, str]
    def __init__(self, task_id: _Optional[str] = ..., sample_index: _Optional[int] = ..., attempt: _Optional[int] = ..., harness: _Optional[str] = ..., policy_version: _Optional[int] = ..., started_unix_nanos: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RolloutFinished(_message.Message):
    __slots__ = ("exit_code", "has_reward", "reward", "grader_output", "call_count", "finished_unix_nanos", "status", "retried")
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    HAS_REWARD_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    GRADER_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    CALL_COUNT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RETRIED_FIELD_NUMBER: _ClassVar[int]
    exit_code: int
    has_reward: bool
    reward: float
    grader_output: str
    call_count: int
    finished_unix_nanos: int
    status: str
    retried: bool
    def __init__(self, exit_code: _Optional[int] = ..., has_reward: _Optional[bool] = ..., reward: _Optional[float] = ..., grader_output: _Optional[str] = ..., call_count: _Optional[int] = ..., finished_unix_nanos: _Optional[int] = ..., status: _Optional[str] = ..., retried: _Optional[bool] = ...) -> None: ...

class Lost(_message.Message):
    __slots__ = ("reason", "call_index", "whole_rollout")
    REASON_FIELD_NUMBER: _ClassVar[int]
    CALL_INDEX_FIELD_NUMBER: _ClassVar[int]
    WHOLE_ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    reason: str
    call_index: int
    whole_rollout: bool
    def __init__(self, reason: _Optional[str] = ..., call_index: _Optional[int] = ..., whole_rollout: _Optional[bool] = ...) -> None: ...

class RecordPart(_message.Message):
    __slots__ = ("offset", "total_bytes", "data")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    offset: int
    total_bytes: int
    data: bytes
    def __init__(self, offset: _Optional[int] = ..., total_bytes: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class Record(_message.Message):
    __slots__ = ("idempotency_key", "sequence", "job", "rollout_id", "started", "call", "finished", "lost", "part")
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_ID_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    CALL_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    idempotency_key: str
    sequence: int
    job: str
    rollout_id: str
    started: RolloutStarted
    call: ModelCall
    finished: RolloutFinished
    lost: Lost
    part: RecordPart
    def __init__(self, idempotency_key: _Optional[str] = ..., sequence: _Optional[int] = ..., job: _Optional[str] = ..., rollout_id: _Optional[str] = ..., started: _Optional[_Union[RolloutStarted, _Mapping]] = ..., call: _Optional[_Union[ModelCall, _Mapping]] = ..., finished: _Optional[_Union[RolloutFinished, _Mapping]] = ..., lost: _Optional[_Union[Lost, _Mapping]] = ..., part: _Optional[_Union[RecordPart, _Mapping]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("idempotency_key", "sequence", "duplicate", "error")
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    idempotency_key: str
    sequence: int
    duplicate: bool
    error: str
    def __init__(self, idempotency_key: _Optional[str] = ..., sequence: _Optional[int] = ..., duplicate: _Optional[bool] = ..., error: _Optional[str] = ...) -> None: ...

class WatermarkRequest(_message.Message):
    __slots__ = ("rollout_id",)
    ROLLOUT_ID_FIELD_NUMBER: _ClassVar[int]
    rollout_id: str
    def __init__(self, rollout_id: _Optional[str] = ...) -> None: ...

class Watermark(_message.Message):
    __slots__ = ("contiguous_sequence", "known")
    CONTIGUOUS_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    contiguous_sequence: int
    known: bool
    def __init__(self, contiguous_sequence: _Optional[int] = ..., known: _Optional[bool] = ...) -> None: ...
