"""The test engine's OpenAI Chat Completions endpoint, as vLLM serves ``/v1/chat/completions``.

A harness that talks to an engine without OpenForge in between sends its Chat
Completions requests to the engine itself, which renders them with the
model's chat template, generates, and parses tool calls out of the text. This
module is that path for the test engine, so that a benchmark can send the
same harness requests straight to the engine, through a stock proxy and
through the sidecar. Like vLLM with the ``hermes`` tool parser: the request's
messages go to the tokenizer's chat template as Hugging Face message dicts
(tool-call arguments parsed when they are a JSON object), the answer's text
streams as ``content`` deltas, and a ``<tool_call>`` block becomes a tool
call once it closes. No reasoning parser: a ``<think>`` block stays content.

It is independent of the sidecar's codecs on purpose (the components do not
import each other): two implementations of one wire format check each other.
Pure: no I/O here.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import jinja2

from openforge_trainer.serving import completions as protocol
from openforge_trainer.tiny import tokenizer_build

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
_ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True, slots=True)
class ChatRequest:
    model: str | None
    messages: list[dict[str, Any]]  # Hugging Face message dicts, for the chat template
    tools: list[dict[str, Any]]
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None


def parse_chat_request(body: bytes) -> ChatRequest:
    """Validate a Chat Completions body; errors name the field at fault."""
    try:
        data = json.loads(body)
    except ValueError as error:
        raise protocol.RequestError(f"request body is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise protocol.RequestError("request body must be a JSON object")
    raw_messages = data.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise protocol.RequestError("messages must be a non-empty list", param="messages")
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise protocol.RequestError("stream must be a boolean", param="stream")
    options = data.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise protocol.RequestError("stream_options must be an object", param="stream_options")
    field = (
        "max_completion_tokens" if data.get("max_completion_tokens") is not None else "max_tokens"
    )
    max_tokens = data.get(field)
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        raise protocol.RequestError(f"{field} must be a positive integer", param=field)
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise protocol.RequestError("model must be a string", param="model")
    return ChatRequest(
        model=model,
        messages=[_message(m, f"messages[{i}]") for i, m in enumerate(raw_messages)],
        tools=_tools(data.get("tools")),
        stream=stream,
        include_usage=stream and isinstance(options, dict) and options.get("include_usage") is True,
        max_tokens=max_tokens,
    )


def chat_template(config: dict[str, Any]) -> jinja2.Template:
    """The tokenizer's chat template, compiled as transformers compiles it."""
    source = config.get("chat_template")
    if not isinstance(source, str):
        raise protocol.RequestError(
            "the model's tokenizer_config.json has no chat_template: chat is not served"
        )
    return tokenizer_build.chat_environment().from_string(source)


def render(template: jinja2.Template, request: ChatRequest) -> str:
    """The prompt text: the conversation so far and the assistant's turn opened."""
    try:
        return template.render(
            messages=request.messages, tools=request.tools, add_generation_prompt=True
        )
    except jinja2.TemplateError as error:  # the template refused the conversation
        raise protocol.RequestError(f"chat template: {error}", param="messages") from None


# --- the answer ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Answer:
    """What the engine generated for a chat request, and how to read it."""

    model: str
    prompt_tokens: int
    token_ids: list[int]
    stop_terminated: bool  # the last token is a stop token, left out of the text
    finish_reason: str
    decode: Callable[[list[int]], str]

    @property
    def visible(self) -> list[int]:
        return self.token_ids[:-1] if self.stop_terminated else self.token_ids


#: How a Hermes call's JSON begins, up to its arguments: once this much is in,
#: the call can be announced and its arguments streamed as they come.
_CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]+)"\s*,\s*"arguments"\s*:\s*')


class ToolCallText:
    """Splits generated text into content and Hermes tool calls, as it arrives.

    :meth:`feed` returns the chat deltas the new text completes: content up
    to where a ``<tool_call>`` tag may begin, and tool calls. Streaming
    (``incremental``), a call is announced (id, type, name, empty
    arguments) as soon as its name and the start of its arguments are in,
    and its arguments follow as they are generated, as vLLM's ``hermes``
    parser streams them; otherwise each call comes whole once its
    ``</tool_call>`` arrives. The newlines around a block are not content.
    A block that does not begin like ``{"name": ..., "arguments": ...`` and
    is not a JSON object with both stays text, as does one never closed.
    However the text is cut into pieces, the deltas add up to the same
    content and calls.
    """

    def __init__(self, call_id: Callable[[int], str], *, incremental: bool = False) -> None:
        self._call_id = call_id
        self._incremental = incremental
        self._buffer = ""
        self._in_call = False
        self._after_block = False  # newlines still to drop after a block
        self._arguments_at = -1  # where the streamed call's arguments begin in the buffer
        self._arguments_sent = 0
        self.calls = 0

    def feed(self, text: str, *, final: bool = False) -> list[dict[str, Any]]:
        self._buffer += text
        out: list[dict[str, Any]] = []
        while True:
            if self._in_call:
                end = self._buffer.find(CALL_CLOSE)
                if end < 0:
                    streaming = self._arguments_at >= 0 or (
                        self._incremental and self._announce(out)
                    )
                    if streaming:
                        out += self._arguments(len(self._buffer), closed=final)
                    elif final:  # never closed: give it back as text
                        out.append({"content": CALL_OPEN + self._buffer})
                    if final:
                        self._in_call, self._arguments_at, self._buffer = False, -1, ""
                    return out
                if self._arguments_at < 0 and self._incremental:
                    self._announce(out)
                if self._arguments_at >= 0:
                    out += self._arguments(end, closed=True)
                    self._arguments_at = -1
                else:
                    out.append(self._call(self._buffer[:end]))
                self._buffer = self._buffer[end + len(CALL_CLOSE) :]
                self._in_call, self._after_block = False, True
                continue
            if self._after_block:
                self._buffer = self._buffer.lstrip("\n")
                if not self._buffer and not final:
                    return out  # more newlines may follow
                self._after_block = False
            start = self._buffer.find(CALL_OPEN)
            if start >= 0:
                before = self._buffer[:start].rstrip("\n")
                if before:
                    out.append({"content": before})
                self._buffer = self._buffer[start + len(CALL_OPEN) :]
                self._in_call = True
                continue
            keep = 0 if final else _held_back(self._buffer)
            if len(self._buffer) > keep:
                out.append({"content": self._buffer[: len(self._buffer) - keep]})
                self._buffer = self._buffer[len(self._buffer) - keep :]
            return out

    def _announce(self, out: list[dict[str, Any]]) -> bool:
        """Open a streamed call once its name is in; False while it cannot be told yet."""
        head = _CALL_HEAD.match(self._buffer)
        if head is None:
            return False
        index = self.calls
        self.calls += 1
        call = {"name": head[1], "arguments": ""}
        out.append(
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": self._call_id(index),
                        "type": "function",
                        "function": call,
                    }
                ]
            }
        )
        self._arguments_at, self._arguments_sent = head.end(), 0
        return True

    def _arguments(self, end: int, *, closed: bool) -> list[dict[str, Any]]:
        """The streamed call's arguments text that is certain by ``end``.

        The call object closes with a ``}`` after its arguments, so a tail of
        closing braces and spaces (and what may begin ``</tool_call>``) waits
        until ``</tool_call>`` shows which of them end the arguments.
        """
        text = self._buffer[self._arguments_at : end].lstrip()
        if closed:
            text = text.rstrip()
            text = text[:-1].rstrip() if text.endswith("}") else text
            ready = len(text)
        else:  # nor can a beginning of </tool_call> be arguments
            tag = next(
                (
                    n
                    for n in range(min(len(text), len(CALL_CLOSE) - 1), 0, -1)
                    if CALL_CLOSE.startswith(text[-n:])
                ),
                0,
            )
            ready = len(text[: len(text) - tag].rstrip("} \n\t\r"))
        if ready <= self._arguments_sent:
            return []
        piece = text[self._arguments_sent : ready]
        self._arguments_sent = ready
        return [{"tool_calls": [{"index": self.calls - 1, "function": {"arguments": piece}}]}]

    def _call(self, inner: str) -> dict[str, Any]:
        try:
            parsed = json.loads(inner)
        except ValueError:
            parsed = None
        name = parsed.get("name") if isinstance(parsed, dict) else None
        if not isinstance(name, str) or not name or "arguments" not in parsed:
            return {"content": CALL_OPEN + inner + CALL_CLOSE}
        index = self.calls
        self.calls += 1
        call = {
            "index": index,
            "id": self._call_id(index),
            "type": "function",
            "function": {
                "name": name,
                "arguments": json.dumps(parsed["arguments"], ensure_ascii=False),
            },
        }
        return {"tool_calls": [call]}


def stream_bodies(
    request: ChatRequest, answer: Answer
) -> Iterator[tuple[dict[str, Any] | None, bool]]:
    """The stream's chunks, each with whether a generated token precedes it.

    One item per generated token (``None`` when the token completes no
    delta: inside a tool call, or half a character), between the opening
    role chunk and the closing finish (and usage) chunks.
    """
    request_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    model, token_ids, decode = answer.model, answer.token_ids, answer.decode

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return _head(request_id, "chat.completion.chunk", created=created, model=model) | {
            "choices": [choice]
        }

    yield chunk({"role": "assistant", "content": ""}), False
    text = ToolCallText(_call_ids(request_id), incremental=True)
    visible = answer.visible
    emitted = ""
    for i in range(len(token_ids)):
        deltas: list[dict[str, Any]] = []
        if i < len(visible):
            decoded = decode(visible[: i + 1])
            if i == len(visible) - 1 or not decoded.endswith("\ufffd"):
                deltas = text.feed(decoded[len(emitted) :])
                emitted = decoded
        if i == len(token_ids) - 1:
            deltas += text.feed("", final=True)
        if not deltas:
            yield None, True
            continue
        yield chunk(_merged(deltas)), True
    yield chunk({}, "tool_calls" if text.calls else answer.finish_reason), False
    if request.include_usage:
        usage = protocol.usage(answer.prompt_tokens, len(token_ids))
        yield (
            _head(request_id, "chat.completion.chunk", created=created, model=model)
            | {
                "choices": [],
                "usage": usage,
            },
            False,
        )


def response_body(answer: Answer) -> dict[str, Any]:
    """The whole answer as one ``chat.completion`` object."""
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    text = ToolCallText(_call_ids(request_id))
    whole = _merged(text.feed(answer.decode(answer.visible), final=True))
    content, calls = whole.get("content", ""), whole.get("tool_calls", [])
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in calls]
    choice = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": "tool_calls" if calls else answer.finish_reason,
    }
    return _head(request_id, "chat.completion", created=int(time.time()), model=answer.model) | {
        "choices": [choice],
        "usage": protocol.usage(answer.prompt_tokens, len(answer.token_ids)),
    }


# --- helpers ---------------------------------------------------------------------------


def _head(request_id: str, kind: str, *, created: int, model: str) -> dict[str, Any]:
    return {"id": request_id, "object": kind, "created": created, "model": model}


def _call_ids(request_id: str) -> Callable[[int], str]:
    """Tool-call ids in OpenAI's style, from the answer's own id."""
    return lambda index: f"call_{request_id[9:33]}{index}"


def _merged(deltas: list[dict[str, Any]]) -> dict[str, Any]:
    """One delta from several: those one token completed (text, a call's start, its
    arguments), or a whole answer's."""
    if len(deltas) == 1:
        return deltas[0]
    content = "".join(d.get("content", "") for d in deltas)
    calls: dict[int, dict[str, Any]] = {}
    for call in (c for d in deltas for c in d.get("tool_calls", [])):
        known = calls.get(call["index"])
        if known is None:
            calls[call["index"]] = {**call, "function": dict(call["function"])}
        else:
            function = known["function"]
            function["arguments"] = function.get("arguments", "") + call["function"]["arguments"]
    merged: dict[str, Any] = {}
    if content:
        merged["content"] = content
    if calls:
        merged["tool_calls"] = list(calls.values())
    return merged


def _held_back(buffer: str) -> int:
    """Length of the tail of ``buffer`` that may still turn out to precede a tool call:
    newlines, then a beginning of ``<tool_call>`` (either may be empty)."""
    tag = 0
    for size in range(min(len(buffer), len(CALL_OPEN) - 1), 0, -1):
        if CALL_OPEN.startswith(buffer[-size:]):
            tag = size
            break
    rest = buffer[: len(buffer) - tag]
    return tag + len(rest) - len(rest.rstrip("\n"))


def _text(value: Any, at: str) -> str:
    """Message content: a string, or a list of text parts joined."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for i, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise protocol.RequestError(
                    f"{at}[{i}]: only text content parts are supported", param=at
                )
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise protocol.RequestError(f"{at} must be a string or a list of parts", param=at)


def _message(raw: Any, at: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise protocol.RequestError(f"{at} must be an object", param=at)
    role = raw.get("role")
    if role not in _ROLES:
        raise protocol.RequestError(f"{at}.role must be one of {_ROLES}", param=f"{at}.role")
    if role == "tool":
        out = {
            "role": "tool",
            "tool_call_id": str(raw.get("tool_call_id", "")),
            "content": _text(raw.get("content"), f"{at}.content"),
        }
        if isinstance(raw.get("name"), str):
            out["name"] = raw["name"]
        return out
    message: dict[str, Any] = {
        "role": "system" if role == "developer" else role,
        "content": _text(raw.get("content"), f"{at}.content"),
    }
    if role == "assistant":
        if isinstance(raw.get("reasoning_content"), str):
            message["reasoning_content"] = raw["reasoning_content"]
        calls = raw.get("tool_calls")
        if calls:
            message["tool_calls"] = [
                _tool_call(c, f"{at}.tool_calls[{i}]") for i, c in enumerate(calls)
            ]
    return message


def _tool_call(raw: Any, at: str) -> dict[str, Any]:
    function = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise protocol.RequestError(f"{at}.function.name is required", param=at)
    arguments = function.get("arguments", "")
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            arguments = parsed
    return {
        "type": "function",
        "id": str(raw.get("id", "")),
        "function": {"name": function["name"], "arguments": arguments},
    }


def _tools(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise protocol.RequestError("tools must be a list", param="tools")
    tools = []
    for i, item in enumerate(raw):
        function = item.get("function") if isinstance(item, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise protocol.RequestError(f"tools[{i}].function.name is required", param="tools")
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": function["name"],
                    "description": function.get("description") or "",
                    "parameters": function.get("parameters") or {},
                },
            }
        )
    return tools
