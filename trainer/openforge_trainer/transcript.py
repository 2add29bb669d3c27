"""The conversation of a stored model call, read from its request and response JSON.

For people, not for training: ``openforge trajectories show`` lists what the
harness sent and what it got back as plain messages (role, text, reasoning,
tool calls with their arguments, tool results), whatever the wire API. The
reading is lenient: a field of an unexpected shape is shown as JSON text
rather than rejected, because a body the sidecar stored is worth seeing even
when it is odd (the sidecar's codecs are the strict readers; the components
do not share code, so this is a small separate one).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

CHAT = "WIRE_API_OPENAI_CHAT"
RESPONSES = "WIRE_API_OPENAI_RESPONSES"
ANTHROPIC = "WIRE_API_ANTHROPIC_MESSAGES"
GEMINI = "WIRE_API_GEMINI"


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str  # as sent: JSON text
    id: str = ""


@dataclass(slots=True)
class Message:
    role: str  # system, developer, user, assistant, tool
    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str = ""  # for a tool result: the call it answers

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "text": self.text}
        if self.reasoning:
            out["reasoning"] = self.reasoning
        if self.tool_calls:
            out["tool_calls"] = [
                {"name": c.name, "arguments": c.arguments, "id": c.id} for c in self.tool_calls
            ]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        return out


@dataclass(frozen=True, slots=True)
class Request:
    messages: list[Message]
    tools: list[str]  # names of the tools offered


def read_request(wire_api: str, body: bytes) -> Request:
    """The messages and offered tool names of a request body (empty when unreadable)."""
    document = _load(body)
    if not isinstance(document, dict):
        return Request([], [])
    reader = _REQUEST_READERS.get(wire_api)
    messages = reader(document) if reader else []
    return Request(messages, _tool_names(document))


def read_response(wire_api: str, body: bytes) -> Message | None:
    """The assistant message of a response body; None when there is none (an error body)."""
    document = _load(body)
    if not isinstance(document, dict) or document.get("error"):
        return None
    reader = _RESPONSE_READERS.get(wire_api)
    return reader(document) if reader else None


def _load(body: bytes) -> Any:
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


def _text(value: Any) -> str:
    """Text of a content value: a string, or a list of text-bearing parts."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(filter(None, (_part_text(part) for part in value)))
    return json.dumps(value, ensure_ascii=False)


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        return json.dumps(part, ensure_ascii=False)
    if isinstance(part.get("text"), str):
        return str(part["text"])
    kind = str(part.get("type", ""))
    if "image" in kind:
        return "[image]"
    if kind == "tool_result" or "content" in part:
        return _text(part.get("content"))
    return json.dumps(part, ensure_ascii=False)


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _tool_names(document: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for tool in document.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        nested = tool.get("function")
        function: dict[str, Any] = nested if isinstance(nested, dict) else tool
        if isinstance(function.get("name"), str):
            names.append(function["name"])
        for declaration in (
            tool.get("functionDeclarations") or tool.get("function_declarations") or []
        ):
            if isinstance(declaration, dict) and isinstance(declaration.get("name"), str):
                names.append(declaration["name"])
        if not function.get("name") and tool.get("type") and tool.get("type") != "function":
            names.append(str(tool["type"]))
    return names


# --- OpenAI Chat Completions ------------------------------------------------------


def _chat_message(raw: dict[str, Any]) -> Message:
    calls = [
        ToolCall(
            name=str((call.get("function") or {}).get("name", "")),
            arguments=_arguments((call.get("function") or {}).get("arguments", "")),
            id=str(call.get("id") or ""),
        )
        for call in raw.get("tool_calls") or []
        if isinstance(call, dict)
    ]
    return Message(
        role=str(raw.get("role", "")),
        text=_text(raw.get("content")),
        reasoning=str(raw.get("reasoning_content") or raw.get("reasoning") or ""),
        tool_calls=calls,
        tool_call_id=str(raw.get("tool_call_id") or ""),
    )


def _chat_request(document: dict[str, Any]) -> list[Message]:
    return [_chat_message(m) for m in document.get("messages") or [] if isinstance(m, dict)]


def _chat_response(document: dict[str, Any]) -> Message | None:
    choices = document.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return None
    return _chat_message({"role": "assistant", **(choices[0].get("message") or {})})


# --- OpenAI Responses -------------------------------------------------------------


def _responses_items(items: Any, messages: list[Message]) -> None:
    """Append the messages of a Responses ``input`` or ``output`` item list."""
    if isinstance(items, str):
        messages.append(Message("user", items))
        return
    for item in items or []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(Message(str(item.get("role", "")), _text(item.get("content"))))
        elif kind == "reasoning":
            summary = _text(item.get("summary")) or _text(item.get("content"))
            _assistant(messages).reasoning += summary
        elif kind in ("function_call", "custom_tool_call"):
            arguments = item.get("arguments", item.get("input", ""))
            call = ToolCall(
                str(item.get("name", "")), _arguments(arguments), str(item.get("call_id", ""))
            )
            _assistant(messages).tool_calls.append(call)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            messages.append(
                Message(
                    "tool", _text(item.get("output")), tool_call_id=str(item.get("call_id", ""))
                )
            )
        else:
            messages.append(Message(str(kind), json.dumps(item, ensure_ascii=False)))


def _assistant(messages: list[Message]) -> Message:
    """The assistant message items attach to: the last one, unless a turn followed it."""
    if not messages or messages[-1].role != "assistant":
        messages.append(Message("assistant"))
    return messages[-1]


def _responses_request(document: dict[str, Any]) -> list[Message]:
    messages: list[Message] = []
    if document.get("instructions"):
        messages.append(Message("system", _text(document["instructions"])))
    _responses_items(document.get("input"), messages)
    return messages


def _responses_response(document: dict[str, Any]) -> Message | None:
    messages: list[Message] = []
    _responses_items(document.get("output"), messages)
    merged = Message("assistant")
    for message in messages:
        merged.text = "\n".join(filter(None, [merged.text, message.text]))
        merged.reasoning += message.reasoning
        merged.tool_calls += message.tool_calls
    return merged


# --- Anthropic Messages -----------------------------------------------------------


def _anthropic_message(role: str, content: Any, out: list[Message]) -> None:
    if not isinstance(content, list):
        out.append(Message(role, _text(content)))
        return
    message = Message(role)
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_result":
            out.append(
                Message(
                    "tool",
                    _text(block.get("content")),
                    tool_call_id=str(block.get("tool_use_id", "")),
                )
            )
        elif kind == "tool_use":
            message.tool_calls.append(
                ToolCall(
                    str(block.get("name", "")),
                    _arguments(block.get("input", {})),
                    str(block.get("id", "")),
                )
            )
        elif kind in ("thinking", "redacted_thinking"):
            message.reasoning += str(block.get("thinking", "[redacted]"))
        else:
            message.text = "\n".join(filter(None, [message.text, _part_text(block)]))
    if message.text or message.reasoning or message.tool_calls:
        out.append(message)


def _anthropic_request(document: dict[str, Any]) -> list[Message]:
    messages: list[Message] = []
    if document.get("system"):
        messages.append(Message("system", _text(document["system"])))
    for raw in document.get("messages") or []:
        if isinstance(raw, dict):
            _anthropic_message(str(raw.get("role", "")), raw.get("content"), messages)
    return messages


def _anthropic_response(document: dict[str, Any]) -> Message | None:
    messages: list[Message] = []
    _anthropic_message("assistant", document.get("content") or [], messages)
    return next((m for m in messages if m.role == "assistant"), Message("assistant"))


# --- Gemini -----------------------------------------------------------------------


def _gemini_content(raw: dict[str, Any], out: list[Message]) -> None:
    role = {"model": "assistant"}.get(str(raw.get("role", "user")), str(raw.get("role", "user")))
    message = Message(role)
    for part in raw.get("parts") or []:
        if not isinstance(part, dict):
            continue
        call = part.get("functionCall") or part.get("function_call")
        result = part.get("functionResponse") or part.get("function_response")
        if isinstance(call, dict):
            message.tool_calls.append(
                ToolCall(
                    str(call.get("name", "")),
                    _arguments(call.get("args", {})),
                    str(call.get("id", "")),
                )
            )
        elif isinstance(result, dict):
            out.append(
                Message(
                    "tool",
                    _arguments(result.get("response", {})),
                    tool_call_id=str(result.get("name", "")),
                )
            )
        elif part.get("thought") and isinstance(part.get("text"), str):
            message.reasoning += part["text"]
        else:
            message.text = "\n".join(filter(None, [message.text, _part_text(part)]))
    if message.text or message.reasoning or message.tool_calls:
        out.append(message)


def _gemini_request(document: dict[str, Any]) -> list[Message]:
    messages: list[Message] = []
    system = document.get("systemInstruction") or document.get("system_instruction")
    if isinstance(system, dict):
        messages.append(Message("system", _text(system.get("parts"))))
    for raw in document.get("contents") or []:
        if isinstance(raw, dict):
            _gemini_content(raw, messages)
    return messages


def _gemini_response(document: dict[str, Any]) -> Message | None:
    candidates = document.get("candidates") or []
    if not candidates or not isinstance(candidates[0], dict):
        return None
    messages: list[Message] = []
    _gemini_content({"role": "model", **(candidates[0].get("content") or {})}, messages)
    return messages[0] if messages else Message("assistant")


_REQUEST_READERS = {
    CHAT: _chat_request,
    RESPONSES: _responses_request,
    ANTHROPIC: _anthropic_request,
    GEMINI: _gemini_request,
}
_RESPONSE_READERS = {
    CHAT: _chat_response,
    RESPONSES: _responses_response,
    ANTHROPIC: _anthropic_response,
    GEMINI: _gemini_response,
}
