"""OpenAI Chat Completions (``POST /v1/chat/completions``), JSON and SSE.

Reasoning travels as ``reasoning_content`` (the field vLLM, SGLang and
DeepSeek use) on the assistant message and on stream deltas; requests may
also carry it as ``reasoning``. Tools other than function tools are not
modelled: the raw ``tools`` array is then kept in ``ChatRequest.extra``.
"""

from __future__ import annotations

import json
from typing import Any

from openforge.wire import conversation as conv
from openforge.wire import sse
from openforge.wire.codecs import fields, ids
from openforge.wire.codecs.errors import CodecError

_MODELLED = frozenset(
    {
        "model", "messages", "tools", "tool_choice", "max_tokens", "max_completion_tokens",
        "temperature", "top_p", "stop", "seed", "stream",
    }
)  # fmt: skip
_FINISH_OUT: dict[str, str] = {
    "stop": "stop", "length": "length", "tool_calls": "tool_calls", "error": "stop",
}  # fmt: skip
_FINISH_IN: dict[str, conv.FinishReason] = {
    "stop": "stop", "length": "length", "tool_calls": "tool_calls",
    "function_call": "tool_calls", "content_filter": "stop",
}  # fmt: skip


# --- requests -------------------------------------------------------------


def _text_parts(content: Any, path: str, *, images: bool) -> tuple[conv.Part, ...]:
    """A message ``content``: null, a string, or an array of content parts."""
    if content is None:
        return ()
    if isinstance(content, str):
        return (conv.TextPart(content),) if content else ()
    parts: list[conv.Part] = []
    for i, raw in enumerate(fields.as_list(content, path)):
        at = fields.join(path, i)
        part = fields.as_object(raw, at)
        kind = fields.req_str(part, "type", path=at)
        if kind == "text":
            parts.append(conv.TextPart(fields.req_str(part, "text", path=at)))
        elif kind == "refusal":
            parts.append(conv.TextPart(fields.req_str(part, "refusal", path=at)))
        elif kind == "image_url" and images:
            image = fields.as_object(fields.required(part, "image_url", path=at), f"{at}.image_url")
            url = fields.req_str(image, "url", path=f"{at}.image_url")
            parts.append(
                conv.ImagePart(url, fields.opt_str(image, "detail", path=f"{at}.image_url"))
            )
        else:
            raise fields.unsupported("content part type", kind, path=f"{at}.type")
    return tuple(parts)


def _tool_call(raw: Any, path: str) -> conv.ToolCallPart:
    call = fields.as_object(raw, path)
    kind = call.get("type", "function")
    if kind != "function":
        raise fields.unsupported("tool call type", kind, path=f"{path}.type")
    function = fields.as_object(fields.required(call, "function", path=path), f"{path}.function")
    return conv.ToolCallPart(
        fields.req_str(call, "id", path=path),
        fields.req_str(function, "name", path=f"{path}.function"),
        fields.opt_str(function, "arguments", path=f"{path}.function") or "",
    )


def _message(raw: Any, path: str, *, names: dict[str, str]) -> conv.Message:
    msg = fields.as_object(raw, path)
    role = fields.req_str(msg, "role", path=path)
    content = msg.get("content")
    if role in ("system", "developer"):
        return conv.Message("system", _text_parts(content, f"{path}.content", images=False))
    if role == "user":
        return conv.Message("user", _text_parts(content, f"{path}.content", images=True))
    if role == "assistant":
        parts: list[conv.Part] = []
        for key in ("reasoning_content", "reasoning"):
            reasoning = fields.opt_str(msg, key, path=path)
            if reasoning:
                parts.append(conv.ReasoningPart(reasoning))
                break
        parts.extend(_text_parts(content, f"{path}.content", images=False))
        raw_calls = msg.get("tool_calls")
        if raw_calls is not None:
            for i, raw_call in enumerate(fields.as_list(raw_calls, f"{path}.tool_calls")):
                call = _tool_call(raw_call, f"{path}.tool_calls[{i}]")
                names[call.id] = call.name
                parts.append(call)
        return conv.Message("assistant", tuple(parts))
    if role == "tool":
        call_id = fields.req_str(msg, "tool_call_id", path=path)
        body = _text_parts(content, f"{path}.content", images=True)
        result = conv.ToolResultPart(
            call_id,
            tuple(p for p in body if isinstance(p, conv.TextPart | conv.ImagePart)),
            name=names.get(call_id),
        )
        return conv.Message("tool", (result,))
    raise fields.unsupported("role", role, path=f"{path}.role")


def _tools(body: dict[str, Any]) -> tuple[tuple[conv.Tool, ...], bool]:
    """The function tools, and whether any other kind was offered."""
    raw = body.get("tools")
    if raw is None:
        return (), False
    tools: list[conv.Tool] = []
    others = False
    for i, item in enumerate(fields.as_list(raw, "tools")):
        at = f"tools[{i}]"
        tool = fields.as_object(item, at)
        kind = fields.req_str(tool, "type", path=at)
        if kind == "custom":
            others = True
            continue
        if kind != "function":
            raise fields.unsupported("tool type", kind, path=f"{at}.type")
        function = fields.as_object(fields.required(tool, "function", path=at), f"{at}.function")
        tools.append(
            conv.Tool(
                fields.req_str(function, "name", path=f"{at}.function"),
                fields.opt_str(function, "description", path=f"{at}.function") or "",
                fields.opt_object(function, "parameters", path=f"{at}.function") or {},
            )
        )
    return tuple(tools), others


def _tool_choice(value: Any) -> str:
    if value is None:
        return "auto"
    if isinstance(value, str):
        if value in ("auto", "none", "required"):
            return value
        raise fields.unsupported("tool_choice", value, path="tool_choice")
    choice = fields.as_object(value, "tool_choice")
    kind = fields.req_str(choice, "type", path="tool_choice")
    if kind == "function":
        function = fields.as_object(
            fields.required(choice, "function", path="tool_choice"), "tool_choice.function"
        )
        return fields.req_str(function, "name", path="tool_choice.function")
    if kind == "allowed_tools":
        allowed = fields.as_object(
            fields.required(choice, "allowed_tools", path="tool_choice"),
            "tool_choice.allowed_tools",
        )
        mode = fields.req_str(allowed, "mode", path="tool_choice.allowed_tools")
        if mode in ("auto", "required"):
            return mode
        raise fields.unsupported("mode", mode, path="tool_choice.allowed_tools.mode")
    raise fields.unsupported("tool_choice type", kind, path="tool_choice.type")


def _sampling(body: dict[str, Any]) -> conv.SamplingParams:
    max_tokens = fields.opt_int(body, "max_completion_tokens", path="", minimum=1)
    if max_tokens is None:
        max_tokens = fields.opt_int(body, "max_tokens", path="", minimum=1)
    return conv.SamplingParams(
        max_tokens=max_tokens,
        temperature=fields.opt_number(body, "temperature", path="", minimum=0, maximum=2),
        top_p=fields.opt_number(body, "top_p", path="", minimum=0, maximum=1),
        stop=fields.stop_list(body, "stop", path=""),
        seed=fields.opt_int(body, "seed", path=""),
    )


# --- responses ------------------------------------------------------------


def _finish(completion_finish: conv.FinishReason, has_calls: bool) -> str:
    """A natural stop after tool calls is a tool-call stop, as the real API reports it."""
    if completion_finish == "stop" and has_calls:
        return "tool_calls"
    return _FINISH_OUT[completion_finish]


def _usage(usage: conv.Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def _parse_usage(raw: Any, path: str) -> conv.Usage:
    if raw is None:
        return conv.Usage()
    usage = fields.as_object(raw, path)
    return conv.Usage(
        fields.opt_int(usage, "prompt_tokens", path=path) or 0,
        fields.opt_int(usage, "completion_tokens", path=path) or 0,
    )


def _error_type(status: int) -> tuple[str, str | None]:
    if status == 401:
        return "invalid_request_error", "invalid_api_key"
    if status == 403:
        return "invalid_request_error", "unsupported_country_region_territory"
    if status == 404:
        return "invalid_request_error", "model_not_found"
    if status == 429:
        return "requests", "rate_limit_exceeded"
    if status >= 500:
        return "server_error", None
    return "invalid_request_error", None


def openai_error_body(status: int, message: str) -> dict[str, Any]:
    """The error JSON every OpenAI API answers with (shared with Responses)."""
    kind, code = _error_type(status)
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


class _Encoder:
    """Chat chunks as the events arrive; tool-call indexes are the canonical ones."""

    def __init__(self, request: conv.ChatRequest, response_id: str, *, created: int) -> None:
        self._head = {
            "id": response_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": request.model,
        }
        options = request.extra.get("stream_options")
        self._usage = isinstance(options, dict) and options.get("include_usage") is True
        self._has_calls = False

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        body: dict[str, Any] = {**self._head, "choices": [choice]}
        if self._usage:
            body["usage"] = None
        return sse.encode_json(body)

    def start(self) -> bytes:
        return self._chunk({"role": "assistant", "content": "", "refusal": None})

    def encode(self, event: conv.StreamEvent) -> bytes:
        if isinstance(event, conv.ReasoningSignature):
            return b""  # this API's reasoning carries no signature
        if isinstance(event, conv.TextDelta):
            return self._chunk({"content": event.text}) if event.text else b""
        if isinstance(event, conv.ReasoningDelta):
            return self._chunk({"reasoning_content": event.text}) if event.text else b""
        if isinstance(event, conv.ToolCallStart):
            self._has_calls = True
            call = {
                "index": event.index,
                "id": event.id,
                "type": "function",
                "function": {"name": event.name, "arguments": ""},
            }
            return self._chunk({"tool_calls": [call]})
        if isinstance(event, conv.ToolCallArgumentsDelta):
            if not event.arguments:
                return b""
            call = {"index": event.index, "function": {"arguments": event.arguments}}
            return self._chunk({"tool_calls": [call]})
        return self._end(event)

    def _end(self, event: conv.StreamEnd) -> bytes:
        if event.finish_reason == "error":
            error = openai_error_body(500, "the model failed while generating")
            return sse.encode_json(error)
        out = self._chunk({}, _finish(event.finish_reason, self._has_calls))
        if self._usage:
            body = {**self._head, "choices": [], "usage": _usage(event.usage)}
            out += sse.encode_json(body)
        return out + sse.encode("[DONE]")


class _Decoder:
    """Chunks from an upstream back into canonical events; ends at ``[DONE]``."""

    def __init__(self) -> None:
        self._finish: conv.FinishReason = "stop"
        self._usage = conv.Usage()
        self._ended = False

    def feed(self, event: sse.Event) -> list[conv.StreamEvent]:
        if self._ended:
            return []
        if event.data.strip() == "[DONE]":
            self._ended = True
            return [conv.StreamEnd(self._finish, self._usage)]
        try:
            chunk = fields.as_object(json.loads(event.data), "")
        except (ValueError, RecursionError) as exc:
            raise CodecError(f"stream chunk is not a JSON object: {exc}") from None
        if "error" in chunk:
            self._ended = True
            return [conv.StreamEnd("error", self._usage)]
        if chunk.get("usage") is not None:
            self._usage = _parse_usage(chunk["usage"], "usage")
        out: list[conv.StreamEvent] = []
        for i, raw in enumerate(fields.as_list(chunk.get("choices") or [], "choices")):
            choice = fields.as_object(raw, f"choices[{i}]")
            if choice.get("index", 0) != 0:
                continue
            delta = fields.as_object(choice.get("delta") or {}, f"choices[{i}].delta")
            out.extend(self._delta(delta, f"choices[{i}].delta"))
            finish = choice.get("finish_reason")
            if finish is not None:
                self._finish = _FINISH_IN.get(str(finish), "stop")
        return out

    def _delta(self, delta: dict[str, Any], path: str) -> list[conv.StreamEvent]:
        out: list[conv.StreamEvent] = []
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if reasoning:
            out.append(conv.ReasoningDelta(fields.as_str(reasoning, f"{path}.reasoning_content")))
        for key in ("content", "refusal"):
            text = fields.opt_str(delta, key, path=path)
            if text:
                out.append(conv.TextDelta(text))
        for i, raw in enumerate(
            fields.as_list(delta.get("tool_calls") or [], f"{path}.tool_calls")
        ):
            at = f"{path}.tool_calls[{i}]"
            call = fields.as_object(raw, at)
            index = fields.opt_int(call, "index", path=at) or 0
            function = fields.as_object(call.get("function") or {}, f"{at}.function")
            call_id = fields.opt_str(call, "id", path=at)
            if call_id:
                name = fields.opt_str(function, "name", path=f"{at}.function") or ""
                out.append(conv.ToolCallStart(index, call_id, name))
            arguments = fields.opt_str(function, "arguments", path=f"{at}.function")
            if arguments:
                out.append(conv.ToolCallArgumentsDelta(index, arguments))
        return out


class OpenAIChatCodec:
    api: conv.WireApi = conv.WireApi.OPENAI_CHAT
    paths: tuple[str, ...] = ("/chat/completions",)

    def parse_request(self, body: bytes) -> conv.ChatRequest:
        obj = fields.load_object(body)
        raw_messages = fields.req_list(obj, "messages", path="")
        if not raw_messages:
            raise CodecError("must hold at least one message", field="messages")
        names: dict[str, str] = {}
        messages = tuple(
            _message(m, f"messages[{i}]", names=names) for i, m in enumerate(raw_messages)
        )
        tools, other_tools = _tools(obj)
        extra = fields.rest(obj, _MODELLED)
        if other_tools:
            extra["tools"] = obj["tools"]
        return conv.ChatRequest(
            api=self.api,
            model=fields.req_str(obj, "model", path=""),
            messages=messages,
            tools=tools,
            tool_choice=_tool_choice(obj.get("tool_choice")),
            sampling=_sampling(obj),
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
        msg = completion.message
        message: dict[str, Any] = {
            "role": "assistant",
            "content": msg.text or None,
            "refusal": None,
        }
        if msg.reasoning:
            message["reasoning_content"] = msg.reasoning
        calls = msg.tool_calls
        if calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in calls
            ]
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": _finish(completion.finish_reason, bool(calls)),
        }
        return {
            "id": response_id,
            "object": "chat.completion",
            "created": created,
            "model": request.model,
            "choices": [choice],
            "usage": _usage(completion.usage),
        }

    def stream_encoder(
        self, request: conv.ChatRequest, *, response_id: str, created: int, prompt_tokens: int = 0
    ) -> _Encoder:
        del prompt_tokens  # this API reports usage only at the end
        return _Encoder(request, response_id, created=created)

    def parse_response(self, body: bytes) -> conv.Completion:
        obj = fields.load_object(body)
        choices = fields.req_list(obj, "choices", path="")
        if not choices:
            raise CodecError("must hold at least one choice", field="choices")
        choice = fields.as_object(choices[0], "choices[0]")
        raw = fields.as_object(
            fields.required(choice, "message", path="choices[0]"), "choices[0].message"
        )
        message = _message({**raw, "role": "assistant"}, "choices[0].message", names={})
        if not message.text and isinstance(raw.get("refusal"), str) and raw["refusal"]:
            message = conv.Message("assistant", (*message.parts, conv.TextPart(raw["refusal"])))
        finish = fields.opt_str(choice, "finish_reason", path="choices[0]") or "stop"
        return conv.Completion(
            message, _FINISH_IN.get(finish, "stop"), _parse_usage(obj.get("usage"), "usage")
        )

    def stream_decoder(self) -> _Decoder:
        return _Decoder()

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        return openai_error_body(status, message)

    def tool_call_id(self, seed: str) -> str:
        return ids.derive("call_", seed)


CODEC = OpenAIChatCodec()
