"""Anthropic Messages (``POST /v1/messages``), JSON and SSE.

``tool_result`` blocks inside a user turn become separate ``tool`` messages,
in order, followed by the rest of that turn as a user message. Thinking
signatures round-trip through ``ReasoningPart.signature`` in JSON bodies and
as ``ReasoningSignature`` events in streams (``signature_delta``); the sidecar
signs the policy's own thinking. ``redacted_thinking`` blocks are dropped:
their content is encrypted for Anthropic's models and means nothing to ours.
Server tools (typed tools such as ``web_search_20250305``) are not modelled:
the raw ``tools`` array is then kept in ``ChatRequest.extra``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from openforge.wire import conversation as conv
from openforge.wire import sse
from openforge.wire.codecs import fields, ids
from openforge.wire.codecs.errors import CodecError

_MODELLED = frozenset(
    {
        "model", "messages", "system", "max_tokens", "tools", "tool_choice",
        "temperature", "top_p", "stop_sequences", "stream",
    }
)  # fmt: skip
_STOP_OUT: dict[str, str] = {
    "stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "error": "end_turn",
}  # fmt: skip
_STOP_IN: dict[str, conv.FinishReason] = {
    "end_turn": "stop", "stop_sequence": "stop", "pause_turn": "stop", "refusal": "stop",
    "max_tokens": "length", "model_context_window_exceeded": "length", "tool_use": "tool_calls",
}  # fmt: skip
_ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
    403: "permission_error", 404: "not_found_error", 413: "request_too_large",
    429: "rate_limit_error", 500: "api_error", 504: "timeout_error", 529: "overloaded_error",
}  # fmt: skip


# --- requests -------------------------------------------------------------


def _image(block: dict[str, Any], path: str) -> conv.ImagePart:
    at = f"{path}.source"
    source = fields.as_object(fields.required(block, "source", path=path), at)
    kind = fields.req_str(source, "type", path=at)
    if kind == "base64":
        media_type = fields.req_str(source, "media_type", path=at)
        return conv.ImagePart(f"data:{media_type};base64,{fields.req_str(source, 'data', path=at)}")
    if kind == "url":
        return conv.ImagePart(fields.req_str(source, "url", path=at))
    raise fields.unsupported("image source type", kind, path=f"{at}.type")


def _result_content(value: Any, path: str) -> tuple[conv.TextPart | conv.ImagePart, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (conv.TextPart(value),) if value else ()
    parts: list[conv.TextPart | conv.ImagePart] = []
    for i, raw in enumerate(fields.as_list(value, path)):
        at = f"{path}[{i}]"
        block = fields.as_object(raw, at)
        kind = fields.req_str(block, "type", path=at)
        if kind == "text":
            parts.append(conv.TextPart(fields.req_str(block, "text", path=at)))
        elif kind == "image":
            parts.append(_image(block, at))
        else:
            raise fields.unsupported("tool result content type", kind, path=f"{at}.type")
    return tuple(parts)


def _user_turn(content: Any, path: str, *, names: dict[str, str]) -> list[conv.Message]:
    if isinstance(content, str):
        return [conv.Message("user", (conv.TextPart(content),) if content else ())]
    results: list[conv.Message] = []
    parts: list[conv.Part] = []
    for i, raw in enumerate(fields.as_list(content, path)):
        at = f"{path}[{i}]"
        block = fields.as_object(raw, at)
        kind = fields.req_str(block, "type", path=at)
        if kind == "text":
            parts.append(conv.TextPart(fields.req_str(block, "text", path=at)))
        elif kind == "image":
            parts.append(_image(block, at))
        elif kind == "tool_result":
            call_id = fields.req_str(block, "tool_use_id", path=at)
            result = conv.ToolResultPart(
                call_id,
                _result_content(block.get("content"), f"{at}.content"),
                is_error=bool(fields.opt_bool(block, "is_error", path=at)),
                name=names.get(call_id),
            )
            results.append(conv.Message("tool", (result,)))
        else:
            raise fields.unsupported("content block type", kind, path=f"{at}.type")
    if parts or not results:
        results.append(conv.Message("user", tuple(parts)))
    return results


def _assistant_turn(content: Any, path: str, *, names: dict[str, str]) -> conv.Message:
    if isinstance(content, str):
        return conv.Message("assistant", (conv.TextPart(content),) if content else ())
    parts: list[conv.Part] = []
    for i, raw in enumerate(fields.as_list(content, path)):
        at = f"{path}[{i}]"
        block = fields.as_object(raw, at)
        kind = fields.req_str(block, "type", path=at)
        if kind == "text":
            parts.append(conv.TextPart(fields.req_str(block, "text", path=at)))
        elif kind == "thinking":
            signature = fields.opt_str(block, "signature", path=at) or None
            parts.append(conv.ReasoningPart(fields.req_str(block, "thinking", path=at), signature))
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use":
            call_id = fields.req_str(block, "id", path=at)
            name = fields.req_str(block, "name", path=at)
            arguments = fields.as_object(fields.required(block, "input", path=at), f"{at}.input")
            names[call_id] = name
            parts.append(conv.ToolCallPart(call_id, name, fields.dumps(arguments)))
        else:
            raise fields.unsupported("content block type", kind, path=f"{at}.type")
    return conv.Message("assistant", tuple(parts))


def _system(value: Any, path: str) -> list[conv.Message]:
    """The top-level ``system`` prompt, or a ``system`` turn inside ``messages``.

    Claude Code sends both: besides the top-level prompt, a ``role: "system"``
    message after the user's prompt (environment, deferred tools, skills;
    the ``per-turn-control`` beta). It stays where it was sent.
    """
    if value is None:
        return []
    if isinstance(value, str):
        return [conv.Message("system", (conv.TextPart(value),))] if value else []
    parts = []
    for i, raw in enumerate(fields.as_list(value, path)):
        at = f"{path}[{i}]"
        block = fields.as_object(raw, at)
        kind = fields.req_str(block, "type", path=at)
        if kind != "text":
            raise fields.unsupported("system block type", kind, path=f"{at}.type")
        parts.append(conv.TextPart(fields.req_str(block, "text", path=at)))
    return [conv.Message("system", tuple(parts))] if parts else []


def _messages(body: dict[str, Any]) -> tuple[conv.Message, ...]:
    messages = _system(body.get("system"), "system")
    names: dict[str, str] = {}
    raw_messages = fields.req_list(body, "messages", path="")
    if not raw_messages:
        raise CodecError("must hold at least one message", field="messages")
    for i, raw in enumerate(raw_messages):
        at = f"messages[{i}]"
        turn = fields.as_object(raw, at)
        role = fields.req_str(turn, "role", path=at)
        content = fields.required(turn, "content", path=at)
        if role == "user":
            messages.extend(_user_turn(content, f"{at}.content", names=names))
        elif role == "assistant":
            messages.append(_assistant_turn(content, f"{at}.content", names=names))
        elif role == "system":
            messages.extend(_system(content, f"{at}.content"))
        else:
            raise fields.unsupported("role", role, path=f"{at}.role")
    return tuple(messages)


#: Anthropic's server and client tools are versioned by date (``bash_20250124``,
#: ``web_search_20250305``); ``mcp_toolset`` is the one without.
_SERVER_TOOL = re.compile(r"[a-z][a-z0-9_]*_\d{8}|mcp_toolset")


def _tools(body: dict[str, Any]) -> tuple[tuple[conv.Tool, ...], bool]:
    raw = body.get("tools")
    if raw is None:
        return (), False
    tools: list[conv.Tool] = []
    others = False
    for i, item in enumerate(fields.as_list(raw, "tools")):
        at = f"tools[{i}]"
        tool = fields.as_object(item, at)
        kind = fields.opt_str(tool, "type", path=at)
        if kind not in (None, "custom"):
            if not _SERVER_TOOL.fullmatch(kind):
                raise fields.unsupported("tool type", kind, path=f"{at}.type")
            others = True
            continue
        tools.append(
            conv.Tool(
                fields.req_str(tool, "name", path=at),
                fields.opt_str(tool, "description", path=at) or "",
                fields.as_object(
                    fields.required(tool, "input_schema", path=at), f"{at}.input_schema"
                ),
            )
        )
    return tuple(tools), others


def _tool_choice(value: Any) -> str:
    if value is None:
        return "auto"
    choice = fields.as_object(value, "tool_choice")
    kind = fields.req_str(choice, "type", path="tool_choice")
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool":
        return fields.req_str(choice, "name", path="tool_choice")
    raise fields.unsupported("tool_choice type", kind, path="tool_choice.type")


# --- responses ------------------------------------------------------------


def _stop_reason(finish: conv.FinishReason, has_calls: bool) -> str:
    """A natural stop after tool calls is ``tool_use``, as the real API reports it."""
    return "tool_use" if finish == "stop" and has_calls else _STOP_OUT[finish]


def _usage(usage: conv.Usage) -> dict[str, int]:
    return {
        "input_tokens": usage.prompt_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": usage.completion_tokens,
    }


def _block(part: conv.Part) -> dict[str, Any] | None:
    if isinstance(part, conv.TextPart) and part.text:
        return {"type": "text", "text": part.text}
    if isinstance(part, conv.ReasoningPart) and (part.text or part.signature):
        return {"type": "thinking", "thinking": part.text, "signature": part.signature or ""}
    if isinstance(part, conv.ToolCallPart):
        arguments = part.parsed_arguments() if part.arguments else {}
        # The API admits only objects; the tool-call parser is expected to produce them.
        data = arguments if isinstance(arguments, dict) else {}
        return {"type": "tool_use", "id": part.id, "name": part.name, "input": data}
    return None


def _parse_block(raw: Any, path: str) -> conv.Part | None:
    block = fields.as_object(raw, path)
    kind = fields.req_str(block, "type", path=path)
    if kind == "text":
        text = fields.req_str(block, "text", path=path)
        return conv.TextPart(text) if text else None
    if kind == "thinking":
        text = fields.req_str(block, "thinking", path=path)
        signature = fields.opt_str(block, "signature", path=path) or None
        return conv.ReasoningPart(text, signature) if text or signature else None
    if kind == "tool_use":
        data = fields.as_object(fields.required(block, "input", path=path), f"{path}.input")
        return conv.ToolCallPart(
            fields.req_str(block, "id", path=path),
            fields.req_str(block, "name", path=path),
            fields.dumps(data),
        )
    return None  # redacted thinking and server tool blocks have no canonical form


def _parse_usage(raw: Any, path: str) -> tuple[int | None, int | None]:
    if raw is None:
        return None, None
    usage = fields.as_object(raw, path)
    return fields.opt_int(usage, "input_tokens", path=path), fields.opt_int(
        usage, "output_tokens", path=path
    )


def _message_head(request: conv.ChatRequest, response_id: str) -> dict[str, Any]:
    return {"id": response_id, "type": "message", "role": "assistant", "model": request.model}


class _Encoder:
    """Content blocks as the events arrive; a tool call's events must be contiguous."""

    def __init__(
        self, request: conv.ChatRequest, response_id: str, *, prompt_tokens: int = 0
    ) -> None:
        self._head = _message_head(request, response_id)
        self._prompt_tokens = prompt_tokens  # message_start's input_tokens, as the API reports
        self._blocks = 0
        self._open: str | None = None  # "text" | "thinking" | "signed" (thinking) | "tool"
        self._tool_blocks: dict[int, int] = {}
        self._has_calls = False

    @staticmethod
    def _emit(kind: str, **payload: Any) -> bytes:
        return sse.encode_json({"type": kind, **payload}, event=kind)

    def start(self) -> bytes:
        message = {
            **self._head,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _usage(conv.Usage(self._prompt_tokens, 0)),
        }
        return self._emit("message_start", message=message) + self._emit("ping")

    def encode(self, event: conv.StreamEvent) -> bytes:
        if isinstance(event, conv.TextDelta):
            return self._delta("text", {"type": "text_delta", "text": event.text}, text=event.text)
        if isinstance(event, conv.ReasoningDelta):
            delta = {"type": "thinking_delta", "thinking": event.text}
            return self._delta("thinking", delta, text=event.text)
        if isinstance(event, conv.ReasoningSignature):
            if self._open != "thinking":
                return b""
            delta = {"type": "signature_delta", "signature": event.signature}
            self._open = "signed"  # the block is complete: more thinking opens another
            return self._emit("content_block_delta", index=self._blocks - 1, delta=delta)
        if isinstance(event, conv.ToolCallStart):
            self._has_calls = True
            block = {"type": "tool_use", "id": event.id, "name": event.name, "input": {}}
            out = self._begin("tool", block)
            self._tool_blocks[event.index] = self._blocks - 1
            return out
        if isinstance(event, conv.ToolCallArgumentsDelta):
            index = self._tool_blocks.get(event.index)
            if index is None or not event.arguments:
                return b""
            delta = {"type": "input_json_delta", "partial_json": event.arguments}
            return self._emit("content_block_delta", index=index, delta=delta)
        return self._end(event)

    def _begin(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._close()
        self._open = kind
        self._blocks += 1
        return out + self._emit("content_block_start", index=self._blocks - 1, content_block=block)

    def _delta(self, kind: str, delta: dict[str, Any], *, text: str) -> bytes:
        if not text:
            return b""
        out = b""
        if self._open != kind:
            empty = {"type": "text", "text": ""} if kind == "text" else {
                "type": "thinking", "thinking": "", "signature": ""
            }  # fmt: skip
            out = self._begin(kind, empty)
        return out + self._emit("content_block_delta", index=self._blocks - 1, delta=delta)

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return self._emit("content_block_stop", index=self._blocks - 1)

    def _end(self, event: conv.StreamEnd) -> bytes:
        out = self._close()
        if event.finish_reason == "error":
            error = {"type": "api_error", "message": "the model failed while generating"}
            return out + self._emit("error", error=error)
        delta = {
            "stop_reason": _stop_reason(event.finish_reason, self._has_calls),
            "stop_sequence": None,
        }
        usage = _usage(event.usage)
        return (
            out + self._emit("message_delta", delta=delta, usage=usage) + self._emit("message_stop")
        )


class _Decoder:
    def __init__(self) -> None:
        self._tools: dict[int, int] = {}  # block index -> tool-call index
        self._tool_args: dict[int, bool] = {}  # tool-call index -> any arguments seen
        self._input: int | None = None
        self._output: int | None = None
        self._finish: conv.FinishReason = "stop"
        self._ended = False

    def feed(self, event: sse.Event) -> list[conv.StreamEvent]:
        if self._ended:
            return []
        try:
            body = fields.as_object(json.loads(event.data), "")
        except (ValueError, RecursionError) as exc:
            raise CodecError(f"stream event is not a JSON object: {exc}") from None
        kind = body.get("type", event.event)
        if kind == "error":
            self._ended = True
            return [conv.StreamEnd("error", self._usage())]
        if kind == "message_start":
            message = fields.as_object(body.get("message") or {}, "message")
            self._input, self._output = _parse_usage(message.get("usage"), "message.usage")
        elif kind == "content_block_start":
            return self._start(body)
        elif kind == "content_block_delta":
            return self._delta(body)
        elif kind == "content_block_stop":
            return self._stop(body)
        elif kind == "message_delta":
            delta = fields.as_object(body.get("delta") or {}, "delta")
            reason = fields.opt_str(delta, "stop_reason", path="delta")
            self._finish = _STOP_IN.get(reason or "end_turn", "stop")
            tokens_in, tokens_out = _parse_usage(body.get("usage"), "usage")
            self._input = self._input if tokens_in is None else tokens_in
            self._output = self._output if tokens_out is None else tokens_out
        elif kind == "message_stop":
            self._ended = True
            return [conv.StreamEnd(self._finish, self._usage())]
        return []

    def _usage(self) -> conv.Usage:
        return conv.Usage(self._input or 0, self._output or 0)

    def _start(self, body: dict[str, Any]) -> list[conv.StreamEvent]:
        block = fields.as_object(fields.required(body, "content_block", path=""), "content_block")
        kind = block.get("type")
        if kind == "text":
            text = fields.opt_str(block, "text", path="content_block")
            return [conv.TextDelta(text)] if text else []
        if kind == "thinking":
            text = fields.opt_str(block, "thinking", path="content_block")
            return [conv.ReasoningDelta(text)] if text else []
        if kind != "tool_use":
            return []
        index = len(self._tools)
        self._tools[fields.opt_int(body, "index", path="") or 0] = index
        self._tool_args[index] = False
        call_id = fields.req_str(block, "id", path="content_block")
        return [
            conv.ToolCallStart(index, call_id, fields.req_str(block, "name", path="content_block"))
        ]

    def _delta(self, body: dict[str, Any]) -> list[conv.StreamEvent]:
        delta = fields.as_object(fields.required(body, "delta", path=""), "delta")
        kind = delta.get("type")
        if kind == "text_delta":
            return [conv.TextDelta(fields.req_str(delta, "text", path="delta"))]
        if kind == "thinking_delta":
            return [conv.ReasoningDelta(fields.req_str(delta, "thinking", path="delta"))]
        if kind == "signature_delta":
            return [conv.ReasoningSignature(fields.req_str(delta, "signature", path="delta"))]
        if kind == "input_json_delta":
            index = self._tools.get(fields.opt_int(body, "index", path="") or 0)
            partial = fields.req_str(delta, "partial_json", path="delta")
            if index is None or not partial:
                return []
            self._tool_args[index] = True
            return [conv.ToolCallArgumentsDelta(index, partial)]
        return []  # citation deltas have no canonical event

    def _stop(self, body: dict[str, Any]) -> list[conv.StreamEvent]:
        """A tool call that streamed no input has the input ``{}``, as in JSON bodies."""
        index = self._tools.get(fields.opt_int(body, "index", path="") or 0)
        if index is None or self._tool_args[index]:
            return []
        self._tool_args[index] = True
        return [conv.ToolCallArgumentsDelta(index, "{}")]


class AnthropicMessagesCodec:
    api: conv.WireApi = conv.WireApi.ANTHROPIC_MESSAGES
    paths: tuple[str, ...] = ("/messages",)

    def parse_request(self, body: bytes) -> conv.ChatRequest:
        obj = fields.load_object(body)
        model = fields.req_str(obj, "model", path="")
        max_tokens = fields.opt_int(obj, "max_tokens", path="", minimum=1)
        if max_tokens is None:
            raise CodecError("required field is missing", field="max_tokens")
        messages = _messages(obj)
        tools, other_tools = _tools(obj)
        extra = fields.rest(obj, _MODELLED)
        if other_tools:
            extra["tools"] = obj["tools"]
        return conv.ChatRequest(
            api=self.api,
            model=model,
            messages=messages,
            tools=tools,
            tool_choice=_tool_choice(obj.get("tool_choice")),
            sampling=conv.SamplingParams(
                max_tokens=max_tokens,
                temperature=fields.opt_number(obj, "temperature", path="", minimum=0, maximum=1),
                top_p=fields.opt_number(obj, "top_p", path="", minimum=0, maximum=1),
                stop=fields.stop_list(obj, "stop_sequences", path=""),
            ),
            stream=bool(fields.opt_bool(obj, "stream", path="")),
            extra=extra,
        )

    def build_response(
        self,
        request: conv.ChatRequest,
        completion: conv.Completion,
        *,
        response_id: str,
        created: int,
    ) -> dict[str, Any]:
        blocks = [b for b in map(_block, completion.message.parts) if b is not None]
        has_calls = bool(completion.message.tool_calls)
        return {
            **_message_head(request, response_id),
            "content": blocks,
            "stop_reason": _stop_reason(completion.finish_reason, has_calls),
            "stop_sequence": None,
            "usage": _usage(completion.usage),
        }

    def stream_encoder(
        self, request: conv.ChatRequest, *, response_id: str, created: int, prompt_tokens: int = 0
    ) -> _Encoder:
        return _Encoder(request, response_id, prompt_tokens=prompt_tokens)

    def parse_response(self, body: bytes) -> conv.Completion:
        obj = fields.load_object(body)
        parts = []
        for i, raw in enumerate(fields.req_list(obj, "content", path="")):
            part = _parse_block(raw, f"content[{i}]")
            if part is not None:
                parts.append(part)
        reason = fields.opt_str(obj, "stop_reason", path="") or "end_turn"
        tokens_in, tokens_out = _parse_usage(obj.get("usage"), "usage")
        return conv.Completion(
            conv.Message("assistant", tuple(parts)),
            _STOP_IN.get(reason, "stop"),
            conv.Usage(tokens_in or 0, tokens_out or 0),
        )

    def stream_decoder(self) -> _Decoder:
        return _Decoder()

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        kind = _ERROR_TYPES.get(status) or (
            "api_error" if status >= 500 else "invalid_request_error"
        )
        return {"type": "error", "error": {"type": kind, "message": message}}

    def tool_call_id(self, seed: str) -> str:
        return ids.derive("toolu_", seed)


CODEC = AnthropicMessagesCodec()
