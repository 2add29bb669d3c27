"""The canonical conversation model every wire codec maps to and from.

A harness speaks one of several wire APIs (OpenAI Chat Completions, OpenAI
Responses, Anthropic Messages, ...). Each codec parses a request into a
:class:`ChatRequest`, and renders a :class:`Completion` (or a stream of
:class:`StreamEvent` values) back into that API's own JSON or SSE grammar.
Everything between, the chat template, the token history and the engine, sees
only these types.

The types are plain frozen dataclasses: they sit on the proxy's hot path, and
they are built only by codecs, which validate their input and raise
:class:`~openforge.wire.codecs.errors.CodecError` naming the field at fault.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any, Literal

#: The proto enum ``openforge.trajectory.v1.WireApi`` names each API
#: ``WIRE_API_<MEMBER>``; the store and every record spell it that way.
PROTO_PREFIX = "WIRE_API_"


class WireApi(enum.Enum):
    """A wire API a harness may speak.

    Member names are the proto enum's names without :data:`PROTO_PREFIX`
    (``tests/wire/test_conversation.py`` holds the two to each other); a
    value is also the name of the codec module that speaks it, and, with
    ``-`` for ``_``, ``HarnessEnv``'s ``spec.api``.
    """

    OPENAI_CHAT = "openai_chat"
    OPENAI_RESPONSES = "openai_responses"
    ANTHROPIC_MESSAGES = "anthropic_messages"
    GEMINI = "gemini"

    @property
    def spec_name(self) -> str:
        """The name ``HarnessEnv``'s ``spec.api`` gives it, e.g. ``openai-chat``."""
        return self.value.replace("_", "-")

    @property
    def proto_name(self) -> str:
        """The proto enum's name, e.g. ``WIRE_API_OPENAI_CHAT``."""
        return PROTO_PREFIX + self.name

    @classmethod
    def from_proto_name(cls, name: str) -> WireApi:
        """The API a stored call names; ValueError for any other name."""
        member = name.removeprefix(PROTO_PREFIX) if name.startswith(PROTO_PREFIX) else ""
        if member not in cls.__members__:
            raise ValueError(f"wire API {name!r} is not one of {[api.proto_name for api in cls]}")
        return cls[member]


Role = Literal["system", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length", "tool_calls", "error"]


@dataclass(frozen=True, slots=True)
class TextPart:
    text: str


@dataclass(frozen=True, slots=True)
class ImagePart:
    """An image, kept exactly as the harness sent it (lossless capture).

    ``url`` is either an ``http(s)`` URL or a ``data:`` URL; for base64
    sources the codec builds the ``data:<media_type>;base64,<data>`` form.
    """

    url: str
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class ReasoningPart:
    """Model reasoning ("thinking"). ``signature`` round-trips Anthropic's."""

    text: str
    signature: str | None = None


@dataclass(frozen=True, slots=True)
class ToolCallPart:
    """A call the assistant made. ``arguments`` is the JSON text, verbatim."""

    id: str
    name: str
    arguments: str

    def parsed_arguments(self) -> Any:
        """The arguments as JSON, or the raw string when they are not JSON."""
        try:
            return json.loads(self.arguments)
        except ValueError:
            return self.arguments


@dataclass(frozen=True, slots=True)
class ToolResultPart:
    """The result of a tool call, sent back by the harness."""

    tool_call_id: str
    content: tuple[TextPart | ImagePart, ...]
    is_error: bool = False
    name: str | None = None

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.content if isinstance(p, TextPart))


Part = TextPart | ImagePart | ReasoningPart | ToolCallPart | ToolResultPart


@dataclass(frozen=True, slots=True)
class Message:
    """One conversation turn.

    Tool results travel as ``role="tool"`` messages holding exactly one
    :class:`ToolResultPart` each, whatever the wire API's own grouping
    (Anthropic puts them in user turns; codecs split and join them).
    """

    role: Role
    parts: tuple[Part, ...]

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))

    @property
    def tool_calls(self) -> tuple[ToolCallPart, ...]:
        return tuple(p for p in self.parts if isinstance(p, ToolCallPart))

    @property
    def reasoning(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, ReasoningPart))


@dataclass(frozen=True, slots=True)
class Tool:
    """A function tool the harness offers, with its JSON-schema parameters."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A model call as the harness asked for it, API-independent.

    ``tool_choice`` is normalised to "auto", "none", "required" or a tool
    name. ``extra`` keeps request fields the canonical model does not cover,
    so that passthrough and records lose nothing.
    """

    api: WireApi
    model: str
    messages: tuple[Message, ...]
    tools: tuple[Tool, ...] = ()
    tool_choice: str = "auto"
    sampling: SamplingParams = SamplingParams()
    stream: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class Completion:
    """What the policy answered: an assistant message and why it stopped."""

    message: Message
    finish_reason: FinishReason
    usage: Usage = Usage()


# --- Streaming ----------------------------------------------------------
# The model's output as it is produced. A codec's stream encoder turns these
# into its API's SSE events; its stream decoder (passthrough) does the reverse.


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ReasoningSignature:
    """The signature that closes the reasoning block before it (Anthropic's
    ``signature_delta``); an API whose reasoning carries none ignores it."""

    signature: str


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """A new tool call begins; ``index`` counts tool calls from 0."""

    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolCallArgumentsDelta:
    index: int
    arguments: str


@dataclass(frozen=True, slots=True)
class StreamEnd:
    finish_reason: FinishReason
    usage: Usage = Usage()


StreamEvent = (
    TextDelta
    | ReasoningDelta
    | ReasoningSignature
    | ToolCallStart
    | ToolCallArgumentsDelta
    | StreamEnd
)


def assemble(events: list[StreamEvent]) -> Completion:
    """Fold a stream of events into the equivalent non-streamed completion.

    Consecutive deltas of one kind become one part, in the order they came; a
    signature closes the reasoning part before it (reasoning after it is a new part).
    """
    parts: list[Part] = []
    call_slots: dict[int, int] = {}  # tool-call index -> position in parts
    arguments: dict[int, list[str]] = {}
    finish: StreamEnd | None = None
    for event in events:
        if isinstance(event, TextDelta | ReasoningDelta):
            kind = TextPart if isinstance(event, TextDelta) else ReasoningPart
            last = parts[-1] if parts else None
            open_ = isinstance(last, TextPart) or (
                isinstance(last, ReasoningPart) and not last.signature
            )
            if open_ and type(last) is kind:
                assert isinstance(last, TextPart | ReasoningPart)
                parts[-1] = kind(last.text + event.text)
            else:
                parts.append(kind(event.text))
        elif isinstance(event, ReasoningSignature):
            last = parts[-1] if parts else None
            if isinstance(last, ReasoningPart) and not last.signature:
                parts[-1] = ReasoningPart(last.text, event.signature)
        elif isinstance(event, ToolCallStart):
            call_slots[event.index] = len(parts)
            arguments[event.index] = []
            parts.append(ToolCallPart(event.id, event.name, ""))
        elif isinstance(event, ToolCallArgumentsDelta):
            arguments.setdefault(event.index, []).append(event.arguments)
        else:
            finish = event
    for index, slot in call_slots.items():
        head = parts[slot]
        assert isinstance(head, ToolCallPart)
        parts[slot] = ToolCallPart(head.id, head.name, "".join(arguments[index]))
    if finish is None:
        finish = StreamEnd("error")
    return Completion(Message("assistant", tuple(parts)), finish.finish_reason, finish.usage)
