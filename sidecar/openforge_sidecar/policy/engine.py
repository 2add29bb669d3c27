"""The engine side of token-in/token-out generation, as pure functions.

The sidecar asks the inference engine for ``/v1/completions`` with a prompt of
token IDs, streaming, with logprobs and ``return_token_ids`` (vLLM >= 0.10.2;
``openforge serve`` and the test engine speak the same dialect). This module
builds that request body and reads the engine's stream chunks back into
token IDs, logprobs and a finish reason; it does no I/O.
"""

from __future__ import annotations

import io
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from openforge.wire import conversation, fastjson

from openforge_sidecar.policy import stored


class EngineError(ValueError):
    """The engine's stream did not have the shape vLLM gives it."""


def completion_request(
    *,
    model: str,
    prompt_ids: Sequence[int],
    sampling: conversation.SamplingParams,
    stop_token_ids: frozenset[int],
    max_model_len: int | None = None,
    default_max_tokens: int = 1024,
    prompt_tokens: int | None = None,
) -> dict[str, Any]:
    """The ``/v1/completions`` body for one model call.

    Special tokens are kept in the text (``skip_special_tokens`` false) but the
    sidecar only ever trusts ``token_ids``; stop strings are left to the
    engine so the token record matches what it returned. ``prompt_tokens``
    stands for ``len(prompt_ids)`` where the IDs are written apart
    (:func:`completion_body`).
    """
    max_tokens = sampling.max_tokens or default_max_tokens
    length = len(prompt_ids) if prompt_tokens is None else prompt_tokens
    if max_model_len is not None:
        max_tokens = max(1, min(max_tokens, max_model_len - length))
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt_ids),
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logprobs": 0,  # the sampled token's logprob only (vLLM: 0 = no alternatives)
        "return_token_ids": True,
        "skip_special_tokens": False,
        "stop_token_ids": sorted(stop_token_ids),
    }
    if sampling.temperature is not None:
        body["temperature"] = sampling.temperature
    if sampling.top_p is not None:
        body["top_p"] = sampling.top_p
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    return body


#: Prompt IDs are written to JSON this many at a time (see :func:`completion_body`):
#: orjson sizes its buffer by the list's length, 256 bytes an item (2 MB here).
_IDS_PER_CHUNK = 8 * 1024


def completion_body(
    *,
    model: str,
    prompt_ids: stored.Ids,
    sampling: conversation.SamplingParams,
    stop_token_ids: frozenset[int],
    max_model_len: int | None = None,
) -> bytes:
    """:func:`completion_request` as the JSON bytes sent, the prompt written from
    its array (or its file) a chunk at a time into one buffer, which becomes the body
    without a copy: a list of a 2-million-token prompt's IDs would be 2 million int
    objects (~70 MB), and the chunks joined, then spliced into the rest, three copies
    of the prompt's JSON at once. OSError when the prompt's file is unreadable."""
    head = completion_request(
        model=model, prompt_ids=(), sampling=sampling, stop_token_ids=stop_token_ids,
        max_model_len=max_model_len, prompt_tokens=len(prompt_ids),
    )  # fmt: skip
    # the first "prompt":[] is the key's: a JSON string cannot hold an unescaped quote
    before, after = fastjson.dumps_bytes(head).split(b'"prompt":[]', 1)
    out = io.BytesIO()
    out.write(before)
    out.write(b'"prompt":[')
    for index, ids in enumerate(stored.chunks(prompt_ids, _IDS_PER_CHUNK)):
        if index:
            out.write(b",")
        chunk = fastjson.dumps_line(ids.tolist() if isinstance(ids, array) else list(ids))
        out.write(memoryview(chunk)[1:-1])
    out.write(b"]")
    out.write(after)
    return out.getvalue()  # the buffer itself (CPython), not a copy


def request_headers(
    fields: Iterable[tuple[bytes, bytes]], host: str
) -> tuple[tuple[bytes, bytes], ...]:
    """The header fields of the rewritten request, from the harness's.

    Only the harness's ``User-Agent`` is kept, and its ``Host`` field (its
    name's case and place) with the engine's address as value; then JSON
    content, and no compression, since the relay reads the stream as it
    comes. Built from the raw fields in one pass (deleting names one by one
    through mitmproxy's headers costs ~0.2 ms for a typical SDK's 17).
    """
    out: list[tuple[bytes, bytes]] = []
    engine_host = host.encode("utf-8", "surrogateescape")
    for name, value in fields:
        lower = name.lower()
        if lower == b"host":
            if not any(kept.lower() == b"host" for kept, _ in out):
                out.append((name, engine_host))
        elif lower == b"user-agent":
            out.append((name, value))
    if not any(kept.lower() == b"host" for kept, _ in out):
        out.append((b"host", engine_host))
    out += [(b"content-type", b"application/json"), (b"accept-encoding", b"identity")]
    return tuple(out)


@dataclass(slots=True)
class EngineChunk:
    """What one engine stream chunk added."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_token_ids: array[int] | None = None  # 4 bytes an ID: kept for the whole call
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


def parse_chunk(data: str) -> EngineChunk:
    """Read one ``data:`` payload of the engine's completions stream (a large echo of
    the prompt's IDs is cut out of the stream before: :mod:`.echo`)."""
    try:
        body = fastjson.loads(data)
    except ValueError as exc:
        raise EngineError(f"engine chunk is not JSON: {data[:80]!r}") from exc
    if not isinstance(body, dict):
        raise EngineError("engine chunk is not a JSON object")
    if "error" in body or body.get("object") == "error":
        error = body.get("error", body)
        message = error.get("message", error) if isinstance(error, dict) else error
        raise EngineError(f"engine error: {message}")
    chunk = EngineChunk()
    usage = body.get("usage")
    if isinstance(usage, dict):
        chunk.prompt_tokens = usage.get("prompt_tokens")
        chunk.completion_tokens = usage.get("completion_tokens")
    for choice in body.get("choices") or ():
        if choice.get("index", 0) != 0:
            continue
        token_ids = choice.get("token_ids")
        if token_ids is None:
            if choice.get("text"):
                raise EngineError(
                    "engine chunk has text but no token_ids: "
                    "the engine must support return_token_ids (vLLM >= 0.10.2)"
                )
            token_ids = ()
        chunk.token_ids = list(map(int, token_ids))
        logprobs = choice.get("logprobs") or {}
        values = logprobs.get("token_logprobs") or ()
        chunk.logprobs = [0.0 if v is None else float(v) for v in values]
        if len(chunk.logprobs) != len(chunk.token_ids):
            raise EngineError(
                f"engine chunk has {len(chunk.token_ids)} token_ids "
                f"but {len(chunk.logprobs)} token_logprobs"
            )
        if choice.get("prompt_token_ids") is not None:
            chunk.prompt_token_ids = _token_array(choice["prompt_token_ids"])
        chunk.finish_reason = choice.get("finish_reason")
    return chunk


def _token_array(ids: Any) -> array[int]:
    """The engine's prompt token IDs (a JSON list of ints) as an int32 array."""
    if not isinstance(ids, list):
        raise EngineError("engine chunk's prompt_token_ids is not a list")
    try:
        return array("i", ids)
    except (TypeError, OverflowError):  # not all ints: read them as int() does
        try:
            return array("i", [int(t) for t in ids])
        except (TypeError, ValueError, OverflowError) as exc:
            raise EngineError(f"engine chunk has invalid prompt_token_ids: {exc}") from exc
