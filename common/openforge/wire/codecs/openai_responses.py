"""OpenAI Responses (``POST /v1/responses``), JSON and SSE.

Reasoning is emitted as a reasoning item's ``summary`` (one ``summary_text``
part), not as ``reasoning_text`` content: Codex CLI sends summaries back in
its next request but drops ``reasoning_text`` content, and the policy needs
its own reasoning in the history. On input, ``content`` text wins over the
summary when an item has both.

A request that includes ``reasoning.encrypted_content`` (as clients that keep
no server-side state do) gets it on every signed reasoning item: the
reasoning's text and its signature (the sidecar's MAC of the text), so that a
client replaying only the item gives the policy its reasoning back exactly.
Replayed, such content is the reasoning's text whatever the summary says (as
the real API reads its own encrypted content), and its signature is checked
like a thinking block's. Another upstream's ``encrypted_content`` is kept out of
the conversation (it is opaque).

Freeform ``custom`` tools become canonical tools taking one string argument
``input``; the policy's call ``{"input": "..."}`` goes back to the harness as
a ``custom_tool_call`` whose ``input`` is that string. Which names are custom
is read from the raw ``tools`` array, kept in ``ChatRequest.extra["tools"]``
whenever the request offers anything but plain function tools.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

from openforge.wire import conversation as conv
from openforge.wire import sse
from openforge.wire.codecs import fields, ids, openai_chat
from openforge.wire.codecs.errors import CodecError

CUSTOM_TOOL_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"input": {"type": "string"}},
    "required": ["input"],
}
_MODELLED = frozenset(
    {
        "model", "input", "instructions", "tools", "tool_choice", "max_output_tokens",
        "temperature", "top_p", "stream",
    }
)  # fmt: skip
_ASSISTANT_ITEMS = frozenset({"reasoning", "function_call", "custom_tool_call"})
_FAILED_MESSAGE = "the model failed while generating"
#: The ``include`` value that asks for reasoning items' ``encrypted_content``.
ENCRYPTED_REASONING = "reasoning.encrypted_content"
#: How OpenForge's ``encrypted_content`` begins (then the text, base64url, ``.``, the signature).
CONTENT_PREFIX = "ofr1."


def encrypted_content(text: str, signature: str) -> str:
    """A reasoning item's ``encrypted_content``: its text and the text's signature."""
    body = base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")
    return f"{CONTENT_PREFIX}{body}.{signature}"


def _from_encrypted_content(value: str, path: str) -> conv.ReasoningPart | None:
    """The reasoning OpenForge's ``encrypted_content`` holds; None for another's."""
    if not value.startswith(CONTENT_PREFIX):
        return None
    body, dot, signature = value.removeprefix(CONTENT_PREFIX).partition(".")
    try:
        if not dot or not signature:
            raise ValueError("no signature")
        padded = body + "=" * (-len(body) % 4)
        text = base64.b64decode(padded, altchars=b"-_", validate=True).decode()
    except (ValueError, binascii.Error) as exc:
        raise CodecError(f"not OpenForge's encrypted content ({exc})", field=path) from None
    return conv.ReasoningPart(text, signature)


def _includes_encrypted_reasoning(request: conv.ChatRequest) -> bool:
    include = request.extra.get("include")
    return isinstance(include, list) and ENCRYPTED_REASONING in include


def wrap_custom_input(text: str) -> str:
    """The canonical arguments of a custom tool call carrying ``text``."""
    return fields.dumps({"input": text})


def unwrap_custom_input(arguments: str) -> str:
    """The freeform input of canonical ``arguments``; non-conforming text as is."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get("input"), str):
        return str(value["input"])
    return arguments


def _escaped(text: str) -> str:
    """``text`` as the inside of a JSON string; escapes concatenate, so deltas may be split."""
    return fields.dumps(text)[1:-1]


# --- requests -------------------------------------------------------------


def _content_parts(content: Any, path: str, *, images: bool) -> tuple[conv.Part, ...]:
    if isinstance(content, str):
        return (conv.TextPart(content),) if content else ()
    parts: list[conv.Part] = []
    for i, raw in enumerate(fields.as_list(content, path)):
        at = fields.join(path, i)
        part = fields.as_object(raw, at)
        kind = fields.req_str(part, "type", path=at)
        if kind in ("input_text", "output_text", "text"):
            parts.append(conv.TextPart(fields.req_str(part, "text", path=at)))
        elif kind == "refusal":
            parts.append(conv.TextPart(fields.req_str(part, "refusal", path=at)))
        elif kind == "input_image" and images:
            url = fields.opt_str(part, "image_url", path=at)
            if url is None:
                raise CodecError(
                    "only images given by image_url are supported", field=f"{at}.image_url"
                )
            parts.append(conv.ImagePart(url, fields.opt_str(part, "detail", path=at)))
        else:
            raise fields.unsupported("content part type", kind, path=f"{at}.type")
    return tuple(parts)


def _reasoning_part(item: dict[str, Any], path: str) -> conv.ReasoningPart | None:
    """A reasoning item's reasoning: from OpenForge's encrypted content when it has
    some, else its content or summary text; None when it holds no text."""
    encrypted = fields.opt_str(item, "encrypted_content", path=path)
    ours = _from_encrypted_content(encrypted, f"{path}.encrypted_content") if encrypted else None
    if ours is not None:
        return ours
    text = _reasoning_text(item, path)
    return conv.ReasoningPart(text) if text else None


def _reasoning_text(item: dict[str, Any], path: str) -> str:
    content = item.get("content")
    if content:
        texts = []
        for i, raw in enumerate(fields.as_list(content, f"{path}.content")):
            part = fields.as_object(raw, f"{path}.content[{i}]")
            texts.append(fields.req_str(part, "text", path=f"{path}.content[{i}]"))
        if any(texts):
            return "".join(texts)
    summary = []
    for i, raw in enumerate(fields.as_list(item.get("summary") or [], f"{path}.summary")):
        part = fields.as_object(raw, f"{path}.summary[{i}]")
        summary.append(fields.req_str(part, "text", path=f"{path}.summary[{i}]"))
    return "\n\n".join(summary)


@dataclass
class _History:
    """Messages so far; assistant-side items gather into one pending turn."""

    messages: list[conv.Message] = field(default_factory=list)
    pending: list[conv.Part] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)

    def flush(self) -> None:
        if self.pending:
            self.messages.append(conv.Message("assistant", tuple(self.pending)))
            self.pending = []

    def add(self, message: conv.Message) -> None:
        self.flush()
        self.messages.append(message)


def _tool_output(item: dict[str, Any], path: str, *, names: dict[str, str]) -> conv.Message:
    call_id = fields.req_str(item, "call_id", path=path)
    body = _content_parts(fields.required(item, "output", path=path), f"{path}.output", images=True)
    content = tuple(p for p in body if isinstance(p, conv.TextPart | conv.ImagePart))
    return conv.Message("tool", (conv.ToolResultPart(call_id, content, name=names.get(call_id)),))


def _item(raw: Any, path: str, *, history: _History) -> None:
    item = fields.as_object(raw, path)
    kind = fields.opt_str(item, "type", path=path) or "message"
    if kind == "message":
        role = fields.req_str(item, "role", path=path)
        content = fields.required(item, "content", path=path)
        if role == "assistant":
            history.pending.extend(_content_parts(content, f"{path}.content", images=False))
        elif role in ("system", "developer"):
            history.add(
                conv.Message("system", _content_parts(content, f"{path}.content", images=False))
            )
        elif role == "user":
            history.add(
                conv.Message("user", _content_parts(content, f"{path}.content", images=True))
            )
        else:
            raise fields.unsupported("role", role, path=f"{path}.role")
    elif kind == "reasoning":
        reasoning = _reasoning_part(item, path)
        if reasoning is not None:
            history.pending.append(reasoning)
    elif kind in ("function_call", "custom_tool_call"):
        call_id = fields.req_str(item, "call_id", path=path)
        name = fields.req_str(item, "name", path=path)
        if kind == "function_call":
            arguments = fields.req_str(item, "arguments", path=path)
        else:
            arguments = wrap_custom_input(fields.req_str(item, "input", path=path))
        history.names[call_id] = name
        history.pending.append(conv.ToolCallPart(call_id, name, arguments))
    elif kind in ("function_call_output", "custom_tool_call_output"):
        history.add(_tool_output(item, path, names=history.names))
    else:
        raise fields.unsupported("input item type", kind, path=f"{path}.type")


def _messages(body: dict[str, Any]) -> tuple[conv.Message, ...]:
    history = _History()
    instructions = fields.opt_str(body, "instructions", path="")
    if instructions:
        history.add(conv.Message("system", (conv.TextPart(instructions),)))
    raw = fields.required(body, "input", path="")
    if isinstance(raw, str):
        history.add(conv.Message("user", (conv.TextPart(raw),)))
    else:
        for i, item in enumerate(fields.as_list(raw, "input")):
            _item(item, f"input[{i}]", history=history)
    history.flush()
    return tuple(history.messages)


#: The API's other tool types (hosted tools, Codex's ``namespace`` groups), by name
#: or as the prefix of a dated or preview variant (``web_search_preview``,
#: ``computer_use_preview``): kept raw, never run. Any other type is refused, as
#: the API refuses it; tests/wire/codecs/test_dispatch.py parses every captured
#: harness request, so a harness that starts sending a new type says so there.
_HOSTED_TOOLS = (
    "file_search", "web_search", "computer", "code_interpreter", "image_generation",
    "local_shell", "shell", "mcp", "apply_patch", "namespace",
)  # fmt: skip


def _tools(body: dict[str, Any]) -> tuple[tuple[conv.Tool, ...], bool]:
    """The function and custom tools, and whether the raw array must be kept."""
    raw = body.get("tools")
    if raw is None:
        return (), False
    tools: list[conv.Tool] = []
    keep = False
    for i, item in enumerate(fields.as_list(raw, "tools")):
        at = f"tools[{i}]"
        tool = fields.as_object(item, at)
        kind = fields.req_str(tool, "type", path=at)
        if kind == "function":
            name = fields.req_str(tool, "name", path=at)
            description = fields.opt_str(tool, "description", path=at) or ""
            tools.append(
                conv.Tool(name, description, fields.opt_object(tool, "parameters", path=at) or {})
            )
        elif kind == "custom":
            keep = True
            name = fields.req_str(tool, "name", path=at)
            description = fields.opt_str(tool, "description", path=at) or ""
            tools.append(conv.Tool(name, description, CUSTOM_TOOL_PARAMETERS))
        elif kind.startswith(_HOSTED_TOOLS) or kind in _HOSTED_TOOLS:
            keep = True
        else:
            raise fields.unsupported("tool type", kind, path=f"{at}.type")
    return tuple(tools), keep


def _tool_choice(value: Any) -> str:
    if value is None:
        return "auto"
    if isinstance(value, str):
        if value in ("auto", "none", "required"):
            return value
        raise fields.unsupported("tool_choice", value, path="tool_choice")
    choice = fields.as_object(value, "tool_choice")
    kind = fields.req_str(choice, "type", path="tool_choice")
    if kind in ("function", "custom"):
        return fields.req_str(choice, "name", path="tool_choice")
    if kind == "allowed_tools":
        mode = fields.req_str(choice, "mode", path="tool_choice")
        if mode in ("auto", "required"):
            return mode
        raise fields.unsupported("mode", mode, path="tool_choice.mode")
    raise fields.unsupported("tool_choice type", kind, path="tool_choice.type")


def custom_tool_names(request: conv.ChatRequest) -> frozenset[str]:
    raw = request.extra.get("tools")
    if not isinstance(raw, list):
        return frozenset()
    return frozenset(
        t["name"]
        for t in raw
        if isinstance(t, dict) and t.get("type") == "custom" and isinstance(t.get("name"), str)
    )


# --- output items and the response object ---------------------------------


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(item_id: str, text: str, *, status: str = "completed") -> dict[str, Any]:
    content = [_text_part(text)] if status == "completed" else []
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    }


def _reasoning_item(
    item_id: str, text: str | None, *, encrypted: str | None = None
) -> dict[str, Any]:
    summary = [] if text is None else [{"type": "summary_text", "text": text}]
    item = {"id": item_id, "type": "reasoning", "summary": summary}
    if encrypted is not None:
        item["encrypted_content"] = encrypted
    return item


def _call_item(
    *, item_id: str, call: conv.ToolCallPart, custom: bool, status: str = "completed"
) -> dict[str, Any]:
    if custom:
        text = unwrap_custom_input(call.arguments) if status == "completed" else ""
        return {
            "id": item_id, "type": "custom_tool_call", "status": status,
            "call_id": call.id, "name": call.name, "input": text,
        }  # fmt: skip
    return {
        "id": item_id, "type": "function_call", "status": status,
        "arguments": call.arguments if status == "completed" else "",
        "call_id": call.id, "name": call.name,
    }  # fmt: skip


def _output(
    message: conv.Message, response_id: str, *, custom: frozenset[str], encrypt: bool
) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for part in message.parts:
        index = len(items)
        if isinstance(part, conv.TextPart) and part.text:
            items.append(_message_item(ids.item_id("msg_", response_id, index=index), part.text))
        elif isinstance(part, conv.ReasoningPart) and part.text:
            sealed = (
                encrypted_content(part.text, part.signature) if encrypt and part.signature else None
            )
            items.append(
                _reasoning_item(
                    ids.item_id("rs_", response_id, index=index), part.text, encrypted=sealed
                )
            )
        elif isinstance(part, conv.ToolCallPart):
            is_custom = part.name in custom
            prefix = "ctc_" if is_custom else "fc_"
            items.append(
                _call_item(
                    item_id=ids.item_id(prefix, response_id, index=index),
                    call=part,
                    custom=is_custom,
                )
            )
    return items


def _usage(usage: conv.Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
    }


def _echo_tool_choice(request: conv.ChatRequest, custom: frozenset[str]) -> Any:
    choice = request.tool_choice
    if choice in ("auto", "none", "required"):
        return choice
    return {"type": "custom" if choice in custom else "function", "name": choice}


def _echo_tools(request: conv.ChatRequest) -> list[Any]:
    raw = request.extra.get("tools")
    if isinstance(raw, list):
        return raw
    return [
        {"type": "function", "name": t.name, "description": t.description,
         "parameters": t.parameters, "strict": False}
        for t in request.tools
    ]  # fmt: skip


def _response(
    request: conv.ChatRequest,
    *,
    response_id: str,
    created: int,
    finish: conv.FinishReason | None,
    output: list[dict[str, Any]],
    usage: conv.Usage | None,
) -> dict[str, Any]:
    """The response object; ``finish`` None means still in progress."""
    custom = custom_tool_names(request)
    status = {None: "in_progress", "length": "incomplete", "error": "failed"}.get(
        finish, "completed"
    )
    extra = request.extra
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "background": False,
        "error": {"code": "server_error", "message": _FAILED_MESSAGE}
        if finish == "error"
        else None,
        "incomplete_details": {"reason": "max_output_tokens"} if finish == "length" else None,
        "instructions": None,
        "max_output_tokens": request.sampling.max_tokens,
        "model": request.model,
        "output": output,
        "parallel_tool_calls": extra.get("parallel_tool_calls", True),
        "previous_response_id": extra.get("previous_response_id"),
        "reasoning": extra.get("reasoning") or {"effort": None, "summary": None},
        "store": extra.get("store", True),
        "temperature": 1.0
        if request.sampling.temperature is None
        else request.sampling.temperature,
        "text": extra.get("text") or {"format": {"type": "text"}},
        "tool_choice": _echo_tool_choice(request, custom),
        "tools": _echo_tools(request),
        "top_p": 1.0 if request.sampling.top_p is None else request.sampling.top_p,
        "truncation": extra.get("truncation") or "disabled",
        "usage": None if usage is None else _usage(usage),
        "user": extra.get("user"),
        "metadata": extra.get("metadata") or {},
    }


# --- parsing an upstream's answer -----------------------------------------


def _finish_of(response: dict[str, Any], has_calls: bool) -> conv.FinishReason:
    status = response.get("status")
    if status == "incomplete":
        return "length"
    if status in ("failed", "cancelled"):
        return "error"
    return "tool_calls" if has_calls else "stop"


def _parse_usage(raw: Any, path: str) -> conv.Usage:
    if raw is None:
        return conv.Usage()
    usage = fields.as_object(raw, path)
    return conv.Usage(
        fields.opt_int(usage, "input_tokens", path=path) or 0,
        fields.opt_int(usage, "output_tokens", path=path) or 0,
    )


def _output_parts(raw: Any, path: str) -> list[conv.Part]:
    item = fields.as_object(raw, path)
    kind = fields.req_str(item, "type", path=path)
    if kind == "message":
        content = fields.required(item, "content", path=path)
        return list(_content_parts(content, f"{path}.content", images=False))
    if kind == "reasoning":
        reasoning = _reasoning_part(item, path)
        return [reasoning] if reasoning is not None else []
    if kind == "function_call":
        args = fields.req_str(item, "arguments", path=path)
        return [
            conv.ToolCallPart(
                fields.req_str(item, "call_id", path=path),
                fields.req_str(item, "name", path=path),
                args,
            )
        ]
    if kind == "custom_tool_call":
        args = wrap_custom_input(fields.req_str(item, "input", path=path))
        return [
            conv.ToolCallPart(
                fields.req_str(item, "call_id", path=path),
                fields.req_str(item, "name", path=path),
                args,
            )
        ]
    return []  # hosted tool calls (web search...) have no canonical form


# --- streaming --------------------------------------------------------------


@dataclass
class _Open:
    """The output item being streamed."""

    kind: str  # "message" | "reasoning" | "call"
    index: int
    item_id: str
    text: list[str] = field(default_factory=list)
    call: conv.ToolCallStart | None = None
    custom: bool = False
    signature: str | None = None  # a reasoning item's, when the relay signed it


class _Encoder:
    def __init__(
        self,
        codec: OpenAIResponsesCodec,
        request: conv.ChatRequest,
        *,
        response_id: str,
        created: int,
    ) -> None:
        self._codec = codec
        self._request = request
        self._id = response_id
        self._created = created
        self._custom = custom_tool_names(request)
        self._seq = 0
        self._count = 0  # output items opened
        self._open: _Open | None = None
        self._calls: dict[int, _Open] = {}
        self._events: list[conv.StreamEvent] = []
        self._encrypt = _includes_encrypted_reasoning(request)

    def _emit(self, kind: str, **payload: Any) -> bytes:
        body = {"type": kind, "sequence_number": self._seq, **payload}
        self._seq += 1
        return sse.encode_json(body, event=kind)

    def start(self) -> bytes:
        response = _response(
            self._request,
            response_id=self._id,
            created=self._created,
            finish=None,
            output=[],
            usage=None,
        )
        return self._emit("response.created", response=response) + self._emit(
            "response.in_progress", response=response
        )

    def encode(self, event: conv.StreamEvent) -> bytes:
        if isinstance(event, conv.ReasoningSignature):
            # it ends the open reasoning item, which carries it in its encrypted content
            self._events.append(event)
            if self._open is not None and self._open.kind == "reasoning":
                self._open.signature = event.signature
            return b""
        if isinstance(event, conv.TextDelta | conv.ReasoningDelta):
            return self._delta(event) if event.text else b""
        self._events.append(event)
        if isinstance(event, conv.ToolCallStart):
            return self._close() + self._open_call(event)
        if isinstance(event, conv.ToolCallArgumentsDelta):
            return self._arguments(event)
        return self._close() + self._end(event)

    def _next(self, kind: str, prefix: str) -> _Open:
        item = _Open(kind, self._count, ids.item_id(prefix, self._id, index=self._count))
        self._count += 1
        self._open = item
        return item

    def _delta(self, event: conv.TextDelta | conv.ReasoningDelta) -> bytes:
        self._events.append(event)
        kind = "message" if isinstance(event, conv.TextDelta) else "reasoning"
        out = b""
        if self._open is None or self._open.kind != kind:
            out += self._close()
            out += self._open_message() if kind == "message" else self._open_reasoning()
        item = self._open
        assert item is not None
        item.text.append(event.text)
        where = {"item_id": item.item_id, "output_index": item.index}
        if kind == "message":
            return out + self._emit(
                "response.output_text.delta",
                **where,
                content_index=0,
                delta=event.text,
                logprobs=[],
            )
        return out + self._emit(
            "response.reasoning_summary_text.delta", **where, summary_index=0, delta=event.text
        )

    def _open_message(self) -> bytes:
        item = self._next("message", "msg_")
        where = {"item_id": item.item_id, "output_index": item.index}
        added = _message_item(item.item_id, "", status="in_progress")
        return self._emit(
            "response.output_item.added", output_index=item.index, item=added
        ) + self._emit("response.content_part.added", **where, content_index=0, part=_text_part(""))

    def _open_reasoning(self) -> bytes:
        item = self._next("reasoning", "rs_")
        where = {"item_id": item.item_id, "output_index": item.index}
        added = _reasoning_item(item.item_id, None)
        part = {"type": "summary_text", "text": ""}
        return self._emit(
            "response.output_item.added", output_index=item.index, item=added
        ) + self._emit("response.reasoning_summary_part.added", **where, summary_index=0, part=part)

    def _open_call(self, event: conv.ToolCallStart) -> bytes:
        custom = event.name in self._custom
        item = self._next("call", "ctc_" if custom else "fc_")
        item.call, item.custom = event, custom
        self._calls[event.index] = item
        call = conv.ToolCallPart(event.id, event.name, "")
        added = _call_item(item_id=item.item_id, call=call, custom=custom, status="in_progress")
        return self._emit("response.output_item.added", output_index=item.index, item=added)

    def _arguments(self, event: conv.ToolCallArgumentsDelta) -> bytes:
        item = self._calls.get(event.index)
        if item is None or not event.arguments:
            return b""
        item.text.append(event.arguments)
        if item.custom:
            return b""  # the freeform input is unwrapped once the call is complete
        return self._emit(
            "response.function_call_arguments.delta",
            item_id=item.item_id, output_index=item.index, delta=event.arguments,
        )  # fmt: skip

    def _close(self) -> bytes:
        item, self._open = self._open, None
        if item is None:
            return b""
        text = "".join(item.text)
        where = {"item_id": item.item_id, "output_index": item.index}
        if item.kind == "message":
            part = _text_part(text)
            return (
                self._emit(
                    "response.output_text.done", **where, content_index=0, text=text, logprobs=[]
                )
                + self._emit("response.content_part.done", **where, content_index=0, part=part)
                + self._done(item.index, _message_item(item.item_id, text))
            )
        if item.kind == "reasoning":
            part = {"type": "summary_text", "text": text}
            return (
                self._emit(
                    "response.reasoning_summary_text.done", **where, summary_index=0, text=text
                )
                + self._emit(
                    "response.reasoning_summary_part.done", **where, summary_index=0, part=part
                )
                + self._done(
                    item.index,
                    _reasoning_item(
                        item.item_id,
                        text,
                        encrypted=encrypted_content(text, item.signature)
                        if self._encrypt and item.signature
                        else None,
                    ),
                )
            )
        assert item.call is not None
        call = conv.ToolCallPart(item.call.id, item.call.name, text)
        full = _call_item(item_id=item.item_id, call=call, custom=item.custom)
        if item.custom:
            out = b""
            if full["input"]:
                out = self._emit(
                    "response.custom_tool_call_input.delta", **where, delta=full["input"]
                )
            out += self._emit("response.custom_tool_call_input.done", **where, input=full["input"])
        else:
            out = self._emit(
                "response.function_call_arguments.done", **where, name=call.name, arguments=text
            )
        return out + self._done(item.index, full)

    def _done(self, index: int, item: dict[str, Any]) -> bytes:
        return self._emit("response.output_item.done", output_index=index, item=item)

    def _end(self, event: conv.StreamEnd) -> bytes:
        completion = conv.assemble(self._events)
        response = self._codec.build_response(
            self._request, completion, response_id=self._id, created=self._created
        )
        kind = {"length": "response.incomplete", "error": "response.failed"}.get(
            event.finish_reason, "response.completed"
        )
        return self._emit(kind, response=response)


class _Decoder:
    def __init__(self) -> None:
        self._calls: dict[int, tuple[int, bool]] = {}  # output index -> (call index, custom)
        self._sent: dict[int, str] = {}  # call index -> arguments or input streamed so far
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
            return [conv.StreamEnd("error")]
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            self._ended = True
            response = fields.as_object(body.get("response") or {}, "response")
            finish = _finish_of(response, bool(self._calls))
            return [conv.StreamEnd(finish, _parse_usage(response.get("usage"), "response.usage"))]
        return self._content(str(kind), body)

    def _content(self, kind: str, body: dict[str, Any]) -> list[conv.StreamEvent]:
        if kind in ("response.output_text.delta", "response.refusal.delta"):
            return [conv.TextDelta(fields.req_str(body, "delta", path=""))]
        if kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            return [conv.ReasoningDelta(fields.req_str(body, "delta", path=""))]
        if kind == "response.reasoning_summary_part.added" and fields.opt_int(
            body, "summary_index", path=""
        ):
            return [conv.ReasoningDelta("\n\n")]
        if kind == "response.output_item.added":
            return self._added(body)
        if kind in (
            "response.function_call_arguments.delta",
            "response.custom_tool_call_input.delta",
        ):
            return self._arguments(body, fields.req_str(body, "delta", path=""))
        if kind == "response.output_item.done":
            return self._item_done(body)
        return []

    def _added(self, body: dict[str, Any]) -> list[conv.StreamEvent]:
        item = fields.as_object(fields.required(body, "item", path=""), "item")
        kind = item.get("type")
        if kind not in ("function_call", "custom_tool_call"):
            return []
        index = len(self._calls)
        output_index = fields.opt_int(body, "output_index", path="") or 0
        custom = kind == "custom_tool_call"
        self._calls[output_index] = (index, custom)
        self._sent[index] = ""
        start = conv.ToolCallStart(
            index,
            fields.req_str(item, "call_id", path="item"),
            fields.req_str(item, "name", path="item"),
        )
        if not custom:
            return [start]
        return [start, conv.ToolCallArgumentsDelta(index, '{"input":"')]

    def _arguments(self, body: dict[str, Any], delta: str) -> list[conv.StreamEvent]:
        slot = self._calls.get(fields.opt_int(body, "output_index", path="") or 0)
        if slot is None or not delta:
            return []
        index, custom = slot
        self._sent[index] += delta
        return [conv.ToolCallArgumentsDelta(index, _escaped(delta) if custom else delta)]

    def _item_done(self, body: dict[str, Any]) -> list[conv.StreamEvent]:
        """Closes a call, first sending what its final item holds beyond the deltas."""
        slot = self._calls.get(fields.opt_int(body, "output_index", path="") or 0)
        if slot is None:
            return []
        index, custom = slot
        item = fields.as_object(fields.required(body, "item", path=""), "item")
        final = item.get("input" if custom else "arguments")
        out: list[conv.StreamEvent] = []
        sent = self._sent[index]
        if isinstance(final, str) and len(final) > len(sent) and final.startswith(sent):
            out += self._arguments(body, final[len(sent) :])
        if custom:
            out.append(conv.ToolCallArgumentsDelta(index, '"}'))
        return out


class OpenAIResponsesCodec:
    api: conv.WireApi = conv.WireApi.OPENAI_RESPONSES
    paths: tuple[str, ...] = ("/responses",)

    def parse_request(self, body: bytes) -> conv.ChatRequest:
        obj = fields.load_object(body)
        model = fields.req_str(obj, "model", path="")
        messages = _messages(obj)
        tools, keep_raw_tools = _tools(obj)
        extra = fields.rest(obj, _MODELLED)
        if keep_raw_tools:
            extra["tools"] = obj["tools"]
        return conv.ChatRequest(
            api=self.api,
            model=model,
            messages=messages,
            tools=tools,
            tool_choice=_tool_choice(obj.get("tool_choice")),
            sampling=conv.SamplingParams(
                max_tokens=fields.opt_int(obj, "max_output_tokens", path="", minimum=1),
                temperature=fields.opt_number(obj, "temperature", path="", minimum=0, maximum=2),
                top_p=fields.opt_number(obj, "top_p", path="", minimum=0, maximum=1),
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
        output = _output(
            completion.message,
            response_id,
            custom=custom_tool_names(request),
            encrypt=_includes_encrypted_reasoning(request),
        )
        return _response(
            request,
            response_id=response_id,
            created=created,
            finish=completion.finish_reason,
            output=output,
            usage=completion.usage,
        )

    def stream_encoder(
        self, request: conv.ChatRequest, *, response_id: str, created: int, prompt_tokens: int = 0
    ) -> _Encoder:
        del prompt_tokens  # this API reports usage only at the end
        return _Encoder(self, request, response_id=response_id, created=created)

    def parse_response(self, body: bytes) -> conv.Completion:
        obj = fields.load_object(body)
        parts: list[conv.Part] = []
        for i, raw in enumerate(fields.req_list(obj, "output", path="")):
            parts.extend(_output_parts(raw, f"output[{i}]"))
        message = conv.Message("assistant", tuple(parts))
        finish = _finish_of(obj, bool(message.tool_calls))
        return conv.Completion(message, finish, _parse_usage(obj.get("usage"), "usage"))

    def stream_decoder(self) -> _Decoder:
        return _Decoder()

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        return openai_chat.openai_error_body(status, message)

    def tool_call_id(self, seed: str) -> str:
        return ids.derive("call_", seed)


CODEC = OpenAIResponsesCodec()
