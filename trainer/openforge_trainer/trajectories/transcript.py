"""The conversation of a stored model call, read from its request and response JSON.

For people, not for training: ``openforge trajectories show`` lists what the
harness sent and what it got back as plain messages (role, text, reasoning,
tool calls with their arguments, tool results), whatever the wire API. The
bodies are read by the codec the sidecar parsed them with
(:mod:`openforge.wire.codecs`), so ``show`` lists the conversation the policy
was given: the canonical roles (``system``, ``user``, ``assistant``,
``tool``), one ``tool`` message per tool result.

The reading is lenient where the codec is strict: a body it refuses (the
sidecar records a refused request too, with its error) is shown as one
``unreadable`` message holding the codec's error, which names the field at
fault, and the body's text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from openforge.wire import codecs, conversation
from openforge.wire.codecs.errors import CodecError

CHAT = conversation.WireApi.OPENAI_CHAT.proto_name
RESPONSES = conversation.WireApi.OPENAI_RESPONSES.proto_name
ANTHROPIC = conversation.WireApi.ANTHROPIC_MESSAGES.proto_name
GEMINI = conversation.WireApi.GEMINI.proto_name
#: The role of the one message an unreadable body is shown as.
UNREADABLE = "unreadable"
#: How much of an unreadable body is shown.
SHOWN_BYTES = 4000


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str  # as sent: JSON text
    id: str = ""


@dataclass(slots=True)
class Message:
    role: str  # system, user, assistant, tool; or "unreadable"
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
    """The messages and offered tool names of a request body (none when it is empty)."""
    if not body:
        return Request([], [])
    try:
        request = _codec(wire_api).parse_request(body)
    except ValueError as error:  # a CodecError, or a wire API without a codec
        return Request([_unreadable(error, body)], [])
    return Request([_message(m) for m in request.messages], [t.name for t in request.tools])


def read_response(wire_api: str, body: bytes) -> Message | None:
    """The assistant message of a response body; None when there is none (no body, an error
    body)."""
    if not body:
        return None
    codec = _codec_or_none(wire_api)
    if codec is None:
        return _unreadable(ValueError(f"wire API {wire_api!r} has no codec"), body)
    try:
        completion = codec.parse_response(body)
    except CodecError as error:
        if _is_error_body(body):
            return None
        return _unreadable(error, body)
    return _message(completion.message)


def _codec(wire_api: str) -> codecs.Codec:
    return codecs.for_api(conversation.WireApi.from_proto_name(wire_api))


def _codec_or_none(wire_api: str) -> codecs.Codec | None:
    try:
        return _codec(wire_api)
    except ValueError:
        return None


def _is_error_body(body: bytes) -> bool:
    """An API's error answer (``{"error": ...}``): a failed call's reply, not a message."""
    try:
        document = json.loads(body)
    except ValueError:
        return False
    return isinstance(document, dict) and bool(document.get("error"))


def _unreadable(error: Exception, body: bytes) -> Message:
    text = body[:SHOWN_BYTES].decode("utf-8", "replace")
    more = len(body) - SHOWN_BYTES
    return Message(
        UNREADABLE, f"{error}\n{text}" + (f"\n... ({more} more bytes)" if more > 0 else "")
    )


def _message(message: conversation.Message) -> Message:
    if message.role == "tool":
        results = [p for p in message.parts if isinstance(p, conversation.ToolResultPart)]
        result = results[0] if results else None
        return Message(
            "tool",
            _text(result.content) if result else "",
            tool_call_id=result.tool_call_id if result else "",
        )
    return Message(
        message.role,
        _text(message.parts),
        reasoning=message.reasoning,
        tool_calls=[ToolCall(c.name, c.arguments, c.id) for c in message.tool_calls],
    )


def _text(parts: tuple[conversation.Part, ...]) -> str:
    """The visible text of parts: texts as they are, each image as ``[image]``."""
    shown: list[str] = []
    for part in parts:
        if isinstance(part, conversation.TextPart):
            shown.append(part.text)
        elif isinstance(part, conversation.ImagePart):
            shown.append("[image]")
    return "\n".join(filter(None, shown))
