"""Parse the policy's generated text into stream events, incrementally.

The chat template (Qwen2.5/Hermes style) lays an assistant turn out as::

    ["<think>\\n" reasoning "\\n</think>\\n\\n"] content
    ["\\n"] "<tool_call>\\n" {"name": ..., "arguments": {...}} "\\n</tool_call>" ...

where the "\\n" before a tool call is there unless it is the first thing in
the turn. :class:`OutputParser` undoes exactly that layout: it strips the
newlines the template adds (one after ``<think>``, one before ``</think>``,
up to two after it, one before each ``<tool_call>``) and nothing else, so
re-rendering the parsed message reproduces well-formed generated text
character for character.

Text streams out as soon as it cannot be the start of a tag; only a possible
partial tag (and a newline that may precede one) is held back. A tool call is
emitted whole once its closing tag arrives. Nothing is ever lost: a tool call
whose JSON does not parse, or that never closes, comes out as text, together
with the newline stripped before it.

Callers feed the text of generated tokens *excluding* the stop token
(``<|im_end|>``), which ends the turn rather than belonging to it.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable

from openforge.wire import conversation

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"

_ENGINE_REASONS: dict[str, conversation.FinishReason] = {
    "stop": "stop",
    "length": "length",
    "error": "error",
}


class _Mode(enum.Enum):
    START = "start"  # nothing decided yet: output may open with <think>
    THINK = "think"  # inside <think>...</think>
    CONTENT = "content"  # plain text, watching for <tool_call>
    CALL = "call"  # inside <tool_call>...</tool_call>


class OutputParser:
    """Feed generated text in any cuts; get the stream events it completes.

    ``tool_call_id(index)`` names the tool call with that index (from 0).
    """

    def __init__(self, tool_call_id: Callable[[int], str]) -> None:
        self._tool_call_id = tool_call_id
        self._mode = _Mode.START
        self._buffer = ""
        self._events: list[conversation.StreamEvent] = []
        self._strip_after_open = False  # the "\n" after <think> is still to come
        self._strip_after_close = 0  # newlines after </think> still to drop
        self._reasoning_emitted = False
        self._call_prefix = ""  # raw text consumed when the open tool call began
        self._calls = 0
        self._finished = False

    @property
    def tool_calls(self) -> int:
        """How many tool calls have been emitted so far."""
        return self._calls

    def feed(self, text: str) -> list[conversation.StreamEvent]:
        if self._finished:
            raise RuntimeError("OutputParser.feed after finish")
        self._buffer += text
        return self._drain(final=False)

    def finish(self, engine_finish_reason: str) -> list[conversation.StreamEvent]:
        """Flush what is held back and end the stream.

        The finish reason is "tool_calls" when a tool call was emitted, else
        the engine's own ("stop", "length" or "error").
        """
        if self._finished:
            raise RuntimeError("OutputParser.finish called twice")
        reason = _ENGINE_REASONS.get(engine_finish_reason)
        if reason is None:
            raise ValueError(
                f"engine finish_reason {engine_finish_reason!r} is not one of "
                f"{sorted(_ENGINE_REASONS)}"
            )
        events = self._drain(final=True)
        self._finished = True
        end_reason: conversation.FinishReason = "tool_calls" if self._calls else reason
        events.append(conversation.StreamEnd(end_reason, conversation.Usage()))
        return events

    # --- the state machine ---------------------------------------------------

    def _drain(self, *, final: bool) -> list[conversation.StreamEvent]:
        while _STEPS[self._mode](self, final):
            pass
        events, self._events = self._events, []
        return events

    def _start(self, final: bool) -> bool:
        if self._buffer.startswith(THINK_OPEN):
            self._buffer = self._buffer[len(THINK_OPEN) :]
            self._mode, self._strip_after_open = _Mode.THINK, True
            return True
        if THINK_OPEN.startswith(self._buffer) and not final:
            return False  # still could be "<think>"
        self._mode = _Mode.CONTENT
        return True

    def _think(self, final: bool) -> bool:
        if self._strip_after_open:
            if not self._buffer and not final:
                return False
            self._strip_after_open = False
            if self._buffer.startswith("\n"):
                self._buffer = self._buffer[1:]
        end = self._buffer.find(THINK_CLOSE)
        if end >= 0:
            self._emit_reasoning(_drop_newline(self._buffer[:end]), closing=True)
            self._buffer = self._buffer[end + len(THINK_CLOSE) :]
            self._mode, self._strip_after_close = _Mode.CONTENT, 2
            return True
        if final:  # cut off while thinking: all of it is reasoning
            self._emit_reasoning(self._buffer, closing=True)
            self._buffer = ""
            return False
        keep = _held_back(self._buffer, THINK_CLOSE)
        self._emit_reasoning(self._buffer[: len(self._buffer) - keep], closing=False)
        self._buffer = self._buffer[len(self._buffer) - keep :]
        return False

    def _content(self, final: bool) -> bool:
        if self._strip_after_close:
            if not self._buffer:
                if final:
                    self._strip_after_close = 0
                return False
            if self._buffer.startswith("\n"):
                self._buffer = self._buffer[1:]
                self._strip_after_close -= 1
            else:
                self._strip_after_close = 0
            return True
        start = self._buffer.find(CALL_OPEN)
        if start >= 0:
            text = self._buffer[:start]
            stripped = _drop_newline(text)
            self._emit_text(stripped)
            self._call_prefix = text[len(stripped) :] + CALL_OPEN
            self._buffer = self._buffer[start + len(CALL_OPEN) :]
            self._mode = _Mode.CALL
            return True
        keep = 0 if final else _held_back(self._buffer, CALL_OPEN)
        self._emit_text(self._buffer[: len(self._buffer) - keep])
        self._buffer = self._buffer[len(self._buffer) - keep :]
        return False

    def _call(self, final: bool) -> bool:
        end = self._buffer.find(CALL_CLOSE)
        if end < 0:
            if final:  # never closed: give it back as text
                self._emit_text(self._call_prefix + self._buffer)
                self._buffer = ""
            return False
        inner = self._buffer[:end]
        self._buffer = self._buffer[end + len(CALL_CLOSE) :]
        self._mode = _Mode.CONTENT
        parsed = _parse_call(inner)
        if parsed is None:
            self._emit_text(self._call_prefix + inner + CALL_CLOSE)
            return True
        name, arguments = parsed
        index = self._calls
        self._calls += 1
        self._events.append(conversation.ToolCallStart(index, self._tool_call_id(index), name))
        self._events.append(conversation.ToolCallArgumentsDelta(index, arguments))
        return True

    def _emit_text(self, text: str) -> None:
        if text:
            self._events.append(conversation.TextDelta(text))

    def _emit_reasoning(self, text: str, *, closing: bool) -> None:
        """Emit reasoning; an empty think block still yields one (empty) delta."""
        if text or (closing and not self._reasoning_emitted):
            self._events.append(conversation.ReasoningDelta(text))
            self._reasoning_emitted = True


_STEPS: dict[_Mode, Callable[[OutputParser, bool], bool]] = {
    _Mode.START: OutputParser._start,
    _Mode.THINK: OutputParser._think,
    _Mode.CONTENT: OutputParser._content,
    _Mode.CALL: OutputParser._call,
}


def _drop_newline(text: str) -> str:
    return text[:-1] if text.endswith("\n") else text


def _held_back(buffer: str, tag: str) -> int:
    """Length of the longest tail of ``buffer`` that may begin ``tag`` or "\n" + ``tag``."""
    window = buffer[-len(tag) :]
    if tag[0] not in window and "\n" not in window:
        return 0  # such a tail starts with one of the two: the common case, plain text
    with_newline = "\n" + tag
    for size in range(min(len(buffer), len(tag)), 0, -1):
        tail = buffer[-size:]
        if with_newline.startswith(tail) or tag.startswith(tail):
            return size
    return 0


def _parse_call(inner: str) -> tuple[str, str] | None:
    """(name, compact JSON arguments) of a Hermes tool call body, or None if malformed."""
    try:
        call = json.loads(inner)
    except ValueError:
        return None
    if not isinstance(call, dict) or "arguments" not in call:
        return None
    name = call.get("name")
    if not isinstance(name, str) or not name:
        return None
    arguments = json.dumps(call["arguments"], ensure_ascii=False, separators=(",", ":"))
    return name, arguments
