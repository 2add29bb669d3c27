"""vLLM's ``/v1/completions`` wire shapes, as pure parse and build functions.

The field names, nesting and null conventions follow vLLM (>= 0.10.2)
``vllm/entrypoints/openai/protocol.py`` and ``serving_completion.py``: a
non-streamed :func:`completion_response`; streamed chunks with one token each
(:func:`stream_chunk`), the first also carrying ``prompt_token_ids``; a final
usage-only chunk (:func:`usage_chunk`) dumped without null fields; errors as
``{"object": "error", "message", "type", "param", "code"}``.

Both engines use it: the scripted test engine (``testengine.py``) and the real
one (``openforge serve``, ``serve.py``). What depends on a tokenizer comes in
as a function (:func:`check_prompt`'s ``encode``, :class:`TextDeltas`'s
``decode``), so this module stays free of I/O and of any model.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
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
    top_p: float | None = None
    stop: tuple[str, ...] = ()


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
        model=_optional(data, "model", kind=str),
        prompt=_prompt(data.get("prompt")),
        max_tokens=_positive(data, "max_tokens"),
        temperature=_temperature(data.get("temperature")),
        logprobs=_logprobs(data.get("logprobs")),
        stream=_flag(data, "stream", default=False),
        include_usage=_flag(options, "include_usage", default=False, prefix="stream_options."),
        continuous_usage_stats=_flag(
            options, "continuous_usage_stats", default=False, prefix="stream_options."
        ),
        return_token_ids=_flag(data, "return_token_ids", default=False),
        stop_token_ids=_token_ids(data.get("stop_token_ids")),
        stop=_stop(data.get("stop")),
        skip_special_tokens=_flag(data, "skip_special_tokens", default=True),
        seed=_optional(data, "seed", kind=int),
        top_p=_top_p(data.get("top_p")),
    )


def check_prompt(
    request: CompletionRequest,
    *,
    encode: Callable[[str], list[int]],
    vocab_size: int,
    max_model_len: int,
) -> list[int]:
    """The request's prompt as token IDs, checked against vocabulary and context.

    The messages are vLLM's, so a client sees the same refusal from either engine.
    """
    if isinstance(request.prompt, str):
        ids = encode(request.prompt)
    else:
        ids = request.prompt
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise RequestError(
                f"prompt: token id {bad} is out of vocabulary (size {vocab_size})",
                param="prompt",
            )
    if len(ids) >= max_model_len:
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"request has {len(ids)} input tokens. Please reduce the length of the input "
            "messages.",
            param="prompt",
        )
    if request.max_tokens is not None and len(ids) + request.max_tokens > max_model_len:
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {len(ids) + request.max_tokens} tokens ({len(ids)} in the messages, "
            f"{request.max_tokens} in the completion). Please reduce the length of the "
            "messages or completion.",
            param="max_tokens",
        )
    return ids


def find_stop_string(text: str, start: int, *, stops: tuple[str, ...]) -> tuple[str, int] | None:
    """vLLM's stop-string check after a token changed ``text`` from index ``start`` on.

    The first of ``stops``, in request order, that ends in the new characters
    wins; returns it and the index the text is cut at (the stop string itself
    is not part of the output).
    """
    for stop in stops:
        index = text.find(stop, max(0, start - len(stop) + 1))
        if index != -1:
            return stop, index
    return None


class OutputText:
    """A completion's text as its tokens arrive, the way vLLM's detokenizer builds it.

    ``decode`` turns the visible token IDs so far into text. A stop token
    (EOS or ``stop_token_ids``) is left out of the text; a stop string ends
    the text where it begins. When streaming, a token that ends in the middle
    of a UTF-8 character (the text ends in U+FFFD) adds nothing until a later
    token completes it, and the last ``len(longest stop string) - 1``
    characters are held back while they could still begin a stop string; the
    final token flushes the rest, so the deltas always add up to :attr:`text`.
    Without stop strings or streaming nothing is decoded until :attr:`text`.
    """

    def __init__(
        self,
        decode: Callable[[list[int]], str],
        *,
        stops: tuple[str, ...] = (),
        streaming: bool = False,
    ) -> None:
        self._decode = decode
        self._stops = stops
        self._streaming = streaming
        self._hold = max((len(stop) for stop in stops), default=1) - 1
        self._ids: list[int] = []
        self._text: str | None = ""
        self.emitted = ""

    def add(self, token_id: int, *, stop_token: bool, final: bool) -> tuple[str | None, str]:
        """Take one token; return the stop string it completed (or None) and the delta to stream."""
        if stop_token:
            final = True
        else:
            self._ids.append(token_id)
        if not (self._stops or self._streaming):
            self._text = None  # decoded once, when asked for
            return None, ""
        before = self.text
        text = before if stop_token else self._decode(self._ids)
        found = None
        if self._stops and not stop_token:
            stable = len(before.rstrip("\ufffd"))  # a partial character may have changed
            found = find_stop_string(text, stable, stops=self._stops)
            if found is not None:
                text, final = text[: found[1]], True
        self._text = text
        stop = found[0] if found is not None else None
        if not self._streaming:
            return stop, ""
        if not final:
            if text.endswith("\ufffd"):
                return stop, ""
            text = text[: max(len(self.emitted), len(text) - self._hold)]
        delta = text[len(self.emitted) :]
        self.emitted += delta
        return stop, delta

    @property
    def text(self) -> str:
        """The output text so far (cut at a stop string once one was found)."""
        if self._text is None:
            self._text = self._decode(self._ids)
        return self._text


def models_body(*, model: str, max_model_len: int, policy_version: int) -> dict[str, Any]:
    """vLLM's ``GET /v1/models`` list with one model, plus ``openforge_policy_version``."""
    card = {
        "id": model,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "vllm",
        "root": model,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [],
        "openforge_policy_version": policy_version,
    }
    return {"object": "list", "data": [card]}


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
    stop_reason: int | str | None,
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
    stop_reason: int | str | None,
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


def _optional(data: dict[str, Any], field: str, *, kind: type) -> Any:
    value = data.get(field)
    if value is None:
        return None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise RequestError(
            f"{field}: must be a {kind.__name__} or null, got {value!r}", param=field
        )
    return value


def _flag(data: dict[str, Any], field: str, *, default: bool, prefix: str = "") -> bool:
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


def _top_p(value: Any) -> float | None:
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value <= 1:
        raise RequestError(f"top_p: must be in (0, 1], got {value!r}", param="top_p")
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


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(v, str) and v for v in stops):
        raise RequestError(
            f"stop: must be a non-empty string or a list of them, got {value!r}", param="stop"
        )
    return tuple(stops)


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
