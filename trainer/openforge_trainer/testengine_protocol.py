"""vLLM's ``/v1/completions`` wire shapes, as pure parse and build functions.

The field names, nesting and null conventions follow vLLM (>= 0.10.2)
``vllm/entrypoints/openai/protocol.py`` and ``serving_completion.py``: a
non-streamed :func:`completion_response`; streamed chunks with one token each
(:func:`stream_chunk`), the first also carrying ``prompt_token_ids``; a final
usage-only chunk (:func:`usage_chunk`) dumped without null fields; errors as
``{"object": "error", "message", "type", "param", "code"}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_LOGPROBS = 20


class RequestError(Exception):
    """A request the engine refuses, with the HTTP status vLLM would answer."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        kind: str = "BadRequestError",
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.kind = kind
        self.param = param


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    model: str | None
    prompt: list[int] | str
    max_tokens: int | None = None
    temperature: float | None = None
    logprobs: int | None = None
    stream: bool = False
    include_usage: bool = False
    continuous_usage_stats: bool = False
    return_token_ids: bool = False
    stop_token_ids: tuple[int, ...] = ()
    skip_special_tokens: bool = True
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token's logprob and its top alternatives, decoded."""

    token: str
    logprob: float
    top: dict[str, float]


def parse_request(body: bytes) -> CompletionRequest:
    """Validate a completions request body; errors name the field at fault."""
    try:
        data = json.loads(body)
    except ValueError as error:
        raise RequestError(f"request body is not valid JSON: {error}") from error
    if not isinstance(data, dict):
        raise RequestError("request body must be a JSON object")
    options = data.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError("stream_options: must be an object or null", param="stream_options")
    options = options or {}
    return CompletionRequest(
        model=_optional(data, "model", str),
        prompt=_prompt(data.get("prompt")),
        max_tokens=_positive(data, "max_tokens"),
        temperature=_temperature(data.get("temperature")),
        logprobs=_logprobs(data.get("logprobs")),
        stream=_flag(data, "stream", False),
        include_usage=_flag(options, "include_usage", False, "stream_options."),
        continuous_usage_stats=_flag(options, "continuous_usage_stats", False, "stream_options."),
        return_token_ids=_flag(data, "return_token_ids", False),
        stop_token_ids=_token_ids(data.get("stop_token_ids")),
        skip_special_tokens=_flag(data, "skip_special_tokens", True),
        seed=_optional(data, "seed", int),
    )


def error_body(error: RequestError) -> dict[str, Any]:
    return {
        "object": "error",
        "message": error.message,
        "type": error.kind,
        "param": error.param,
        "code": error.status,
    }


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }


def logprobs_object(tokens: list[TokenLogprob], *, text_offset: int = 0) -> dict[str, Any]:
    """vLLM's ``CompletionLogProbs``; offsets advance by each token's text length."""
    offsets: list[int] = []
    for entry in tokens:
        offsets.append(text_offset)
        text_offset += len(entry.token)
    return {
        "text_offset": offsets,
        "token_logprobs": [t.logprob for t in tokens],
        "tokens": [t.token for t in tokens],
        "top_logprobs": [t.top for t in tokens],
    }


def completion_response(
    *,
    request_id: str,
    created: int,
    model: str,
    text: str,
    logprobs: dict[str, Any] | None,
    finish_reason: str,
    stop_reason: int | None,
    token_ids: list[int] | None,
    prompt_token_ids: list[int] | None,
    prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, Any]:
    choice = {
        "index": 0,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
        "token_ids": token_ids,
        "prompt_logprobs": None,
        "prompt_token_ids": prompt_token_ids,
    }
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage(prompt_tokens, completion_tokens),
        "kv_transfer_params": None,
    }


def stream_chunk(
    *,
    request_id: str,
    created: int,
    model: str,
    text: str,
    logprobs: dict[str, Any] | None,
    finish_reason: str | None,
    stop_reason: int | None,
    prompt_token_ids: list[int] | None,
    token_ids: list[int] | None,
    chunk_usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    choice = {
        "index": 0,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
        "prompt_token_ids": prompt_token_ids,
        "token_ids": token_ids,
    }
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": chunk_usage,
    }


def usage_chunk(
    *, request_id: str, created: int, model: str, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """The final usage-only chunk; vLLM dumps it without its null fields."""
    totals = {k: v for k, v in usage(prompt_tokens, completion_tokens).items() if v is not None}
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [],
        "usage": totals,
    }


# --- field validation ---------------------------------------------------------


def _optional(data: dict[str, Any], field: str, kind: type) -> Any:
    value = data.get(field)
    if value is None:
        return None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise RequestError(
            f"{field}: must be a {kind.__name__} or null, got {value!r}", param=field
        )
    return value


def _flag(data: dict[str, Any], field: str, default: bool, prefix: str = "") -> bool:
    value = data.get(field)
    if value is None:
        return default
    if not isinstance(value, bool):
        name = prefix + field
        raise RequestError(f"{name}: must be a boolean, got {value!r}", param=name)
    return value


def _positive(data: dict[str, Any], field: str) -> int | None:
    value = data.get(field)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise RequestError(f"{field}: must be a positive integer, got {value!r}", param=field)
    return value


def _temperature(value: Any) -> float | None:
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise RequestError(
            f"temperature: must be a non-negative number, got {value!r}", param="temperature"
        )
    return float(value)


def _logprobs(value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_LOGPROBS:
        raise RequestError(
            f"logprobs: must be an integer from 0 to {MAX_LOGPROBS} or null, got {value!r}",
            param="logprobs",
        )
    return value


def _prompt(value: Any) -> list[int] | str:
    if isinstance(value, str):
        if not value:
            raise RequestError("prompt: cannot be empty", param="prompt")
        return value
    if isinstance(value, list) and value and all(_is_int(v) for v in value):
        return list(value)
    if isinstance(value, list) and not value:
        raise RequestError("prompt: cannot be empty", param="prompt")
    raise RequestError(
        "prompt: must be a string or one list of token IDs (batches are not supported)",
        param="prompt",
    )


def _token_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(_is_int(v) for v in value):
        raise RequestError(
            f"stop_token_ids: must be a list of integers, got {value!r}", param="stop_token_ids"
        )
    return tuple(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
