"""Server-sent events: an incremental parser and an encoder.

The parser follows the WHATWG event-stream rules: lines end in CRLF, LF or
CR; a blank line dispatches the event; ``data`` lines join with "\\n"; lines
starting with ":" are comments; a field name without a colon has an empty
value; one leading space after the colon is dropped. It accepts bytes in
chunks cut anywhere (even inside a UTF-8 sequence or between CR and LF) and
yields each event as soon as its blank line arrives.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from typing import Any

from openforge.wire import fastjson

_LINE_END = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class Event:
    data: str
    event: str | None = None
    id: str | None = None
    retry: int | None = None


class SSEParser:
    """Feed bytes, get the events completed so far."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._line: list[str] = []  # the unfinished line, in the pieces it came in
        self._pending_cr = False
        self._data: list[str] = []
        self._event: str | None = None
        self._id: str | None = None
        self._retry: int | None = None
        self._has_fields = False
        self._at_start = True
        self._clean = False  # nothing buffered, past the start: whole events may skip the lines

    def feed(self, chunk: bytes) -> list[Event]:
        if self._clean and chunk.startswith(b"data: ") and chunk.endswith(b"\n\n"):
            # One whole event of one data line, nothing buffered before it:
            # what an engine sends per token. The same event the lines would give.
            value = chunk[6:-2]
            if b"\n" not in value and b"\r" not in value:
                return [Event(value.decode("utf-8", "replace"), None, self._id, None)]
        text = self._decoder.decode(chunk)
        if self._at_start and text:
            self._at_start = False
            if text.startswith("\ufeff"):  # a leading BOM is not part of the stream
                text = text[1:]
        events = self._feed_text(text)
        self._clean = (
            not self._at_start
            and not self._line
            and not self._has_fields
            and not self._pending_cr
            and not self._decoder.getstate()[0]
        )
        return events

    def close(self) -> list[Event]:
        """End of stream: an event without its blank line is discarded, per spec."""
        self._feed_text(self._decoder.decode(b"", final=True))
        self._line = []
        self._reset()
        return []

    @property
    def has_partial(self) -> bool:
        """True when bytes of an unfinished event are buffered (truncation)."""
        return bool(self._line) or self._has_fields

    def _feed_text(self, text: str) -> list[Event]:
        if self._pending_cr and text.startswith("\n"):
            text = text[1:]  # the LF of a CRLF cut between two chunks
        self._pending_cr = False
        if not text:
            return []
        if not self._line and not self._has_fields and text.endswith("\n\n") and "\r" not in text:
            return self._feed_whole_events(text[:-2])
        # Only the new text is searched for line ends (none spans the pieces: a CR at the
        # end of one is a line end already, its LF skipped above). A long line arriving in
        # many chunks (an engine's echo of a large prompt) is joined once, when it ends,
        # not copied and searched again with every chunk.
        lines = _LINE_END.split(text)
        rest = lines.pop()  # what follows the last line end: unfinished
        if not lines:
            self._line.append(rest)
            return []
        if self._line:
            lines[0] = "".join([*self._line, lines[0]])
        self._line = [rest] if rest else []
        # A CR at the very end ended a line, but its LF may be in the next chunk.
        self._pending_cr = text.endswith("\r")
        events: list[Event] = []
        for line in lines:
            event = self._process_line(line)
            if event is not None:
                events.append(event)
        return events

    def _feed_whole_events(self, body: str) -> list[Event]:
        """The common case: whole events, LF endings, nothing buffered.

        ``body`` is the chunk without its final blank line. An event that is a
        single ``data`` line (what engines and APIs send per token) is made
        directly; any other goes through :meth:`_process_line` as usual.
        """
        events: list[Event] = []
        for block in body.split("\n\n"):
            if block.startswith("data:") and "\n" not in block:
                value = block[6:] if block.startswith("data: ") else block[5:]
                events.append(Event(value, None, self._id, None))
                continue
            for line in [*block.split("\n"), ""]:
                event = self._process_line(line)
                if event is not None:
                    events.append(event)
        return events

    def _process_line(self, line: str) -> Event | None:
        if not line:
            if not self._has_fields:
                return None
            event = Event("\n".join(self._data), self._event, self._id, self._retry)
            has_data = bool(self._data)
            self._reset()
            return event if has_data else None
        if line.startswith(":"):
            return None
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        self._has_fields = True
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._id = value
        elif name == "retry" and value.isdigit():
            self._retry = int(value)
        return None

    def _reset(self) -> None:
        self._data = []
        self._event = None
        self._retry = None
        self._has_fields = False


def encode_json(value: Any, event: str | None = None) -> bytes:
    """One event whose data is ``value`` as compact JSON: :func:`encode` of
    ``fastjson.dumps(value)``, written as bytes in one step (compact JSON is
    one line: newlines in strings are escaped)."""
    head = b"event: %s\n" % event.encode() if event is not None else b""
    return head + b"data: " + fastjson.dumps_line(value) + b"\n\n"


def encode(data: str, event: str | None = None) -> bytes:
    """One event, ready for the wire. Multi-line data becomes several lines."""
    head = f"event: {event}\n" if event is not None else ""
    body = "".join(f"data: {line}\n" for line in data.split("\n"))
    return (head + body + "\n").encode()
