"""The engine's echo of the prompt's IDs, cut out of its stream as the bytes arrive.

vLLM answers ``return_token_ids`` with the whole prompt's IDs (``prompt_token_ids``)
in the first chunk of its completions stream: one SSE line of some 6 bytes per
ID, 12 MB for a 10 MB request. Read as text it was buffered, joined, decoded,
sliced and parsed, two or three copies of it held at once. An :class:`EchoCutter`
stands in front of the SSE parser: it passes the stream on with each such list
emptied (``"prompt_token_ids":[]``) and reads the IDs from the bytes as they
arrive, a piece at a time, into a sink: :class:`Collected` keeps them (an int32
array), :class:`Compared` only compares them with the prompt's planned IDs (in
memory or in their file, read along), so that nothing holds more of the echo
than one read of it. It does no I/O but what ``Compared`` reads.

Only a flat list of decimal IDs (digits, commas, spaces and tabs) is read so;
anything else in the list is an error that names the byte of the stream at
fault, and the rest of the stream is passed on as it came.
"""

from __future__ import annotations

import re
from array import array
from collections import deque
from collections.abc import Callable
from enum import Enum
from typing import Protocol

from openforge_sidecar.policy import stored

_KEY = b'"prompt_token_ids"'
_SPACES = frozenset(b" \t\r\n")
_COLON, _OPEN, _CLOSE = ord(":"), ord("["), b"]"
#: The key's own bytes, one at a time (an end of a read that has none cannot begin it).
_KEY_BYTES = frozenset(_KEY[i : i + 1] for i in range(len(_KEY)))
#: What opens the list after the key; and what may still open it when a read ends.
_OPENING = re.compile(rb"[ \t\r\n]*:[ \t\r\n]*\[")
_OPENING_SO_FAR = re.compile(rb"[ \t\r\n]*(?::[ \t\r\n]*)?")
#: The key as a key (a colon after it), not the word as a value.
_COLON_AFTER = re.compile(rb"[ \t\r\n]*:")
#: Bytes of the list read at a time (a non-streamed answer comes as one read).
PIECE = 64 * 1024
#: A list shorter than this (bytes), whole in one read, is left in place: the JSON
#: parser reads a few thousand IDs faster than this module does.
MIN_CUT = 64 * 1024
#: The most bytes one ID (with the spaces around it) may take.
_MAX_ID_BYTES = 64
_ID_RUN = re.compile(rb"[0-9, \t]*")
#: An ID as JSON writes a non-negative integer: no leading zero (``007`` is not JSON).
_ONE_ID = re.compile(rb"[ \t]*(0|[1-9][0-9]*)[ \t]*")
_LEADING_ZERO = re.compile(rb"(?:^|(?<=[, \t]))0[0-9]")
_MAX_ID = 2**31 - 1


class Sink(Protocol):
    """Where one list's IDs go, a run at a time, in order."""

    def add(self, ids: array[int]) -> None: ...


class Collected:
    """A list's IDs, kept."""

    def __init__(self) -> None:
        self.ids: array[int] = array("i")

    def add(self, ids: array[int]) -> None:
        self.ids.extend(ids)


class Compared:
    """Whether a list's IDs are ``expected``, compared as they come; none are kept. If the
    expected IDs cannot be read (their file gone or cut short), ``unread`` says why and
    nothing is compared (the relay must not fail the harness's stream for it)."""

    def __init__(self, expected: stored.Ids) -> None:
        self._count = len(expected)
        self._expected = stored.chunks(expected)
        self._ahead: array[int] = array("i")  # expected IDs read, not yet compared
        self._seen = 0
        self._equal = True
        self.unread: str | None = None

    def add(self, ids: array[int]) -> None:
        self._seen += len(ids)
        if not self._equal or self.unread is not None or self._seen > self._count:
            self._equal = False
            return
        try:
            while len(self._ahead) < len(ids):
                self._ahead.extend(next(self._expected))
        except (OSError, StopIteration) as exc:
            self.unread = f"the planned prompt's IDs could not be read: {exc or 'too few'}"
            return
        if self._ahead[: len(ids)] != ids:
            self._equal = False
        del self._ahead[: len(ids)]

    @property
    def equal(self) -> bool:
        """All the list's IDs were the expected ones, and none is missing."""
        return self._equal and self._seen == self._count


class _State(Enum):
    SCAN = "scan"  # looking for the key
    KEY = "key"  # after the key, before its list (":" and "[")
    IDS = "ids"  # inside the list
    PASS = "pass"  # the key was met, or an error: the rest passes as it is


class EchoCutter:
    """Feed the engine's stream; get it back with its echo of the prompt IDs cut out, the
    IDs given to a sink (``sink`` makes it). Only the key's first appearance is looked
    at, as engines echo once, in their first chunk (vLLM's later chunks say ``null``);
    the rest of the stream passes as it is, costing a token's event one state check.
    A list under ``min_cut`` bytes that a read holds whole is left as it is too (then
    :meth:`take` has no sink for it)."""

    def __init__(self, sink: Callable[[], Sink] = Collected, *, min_cut: int = MIN_CUT) -> None:
        self._make_sink = sink
        self._min_cut = min_cut
        self._sink: Sink | None = None  # the list being cut's (each list makes its own)
        self._state = _State.SCAN
        self._held = b""  # the end of a read that may start the key, or an ID cut in two
        self._colon = False  # KEY: the ":" has been seen
        self._offset = 0  # where in the stream the next read (after _held) starts
        self._first = True  # IDS: no ID read yet
        self._cut: deque[Sink] = deque()
        self.error: str | None = None

    def feed(self, data: bytes) -> bytes:
        """``data`` as the stream goes on, with the lists' contents cut (some bytes may be
        held back until the next read shows they start the key or end an ID)."""
        if self._state is _State.PASS or (
            self._state is _State.SCAN
            and not self._held
            and _KEY not in data
            and data[-1:] not in _KEY_BYTES
        ):  # nothing to cut or hold
            self._offset += len(data)
            return data
        start = self._offset - len(self._held)  # where `data` below starts in the stream
        self._offset += len(data)
        if self._held:
            data, self._held = self._held + data, b""
        out: list[bytes] = []
        position = 0
        while position < len(data):
            if self._state is _State.SCAN:
                position = self._scan(data, position, out=out)
            elif self._state is _State.KEY:
                position = self._after_key(data, position, out=out)
            elif self._state is _State.IDS:
                position = self._read_ids(data, (position, start), out=out)
            else:
                out.append(data[position:] if position else data)
                break
        return b"".join(out) if len(out) != 1 else out[0]

    def take(self) -> Sink | None:
        """The sink of the oldest list cut and not taken yet, or None."""
        return self._cut.popleft() if self._cut else None

    def _scan(self, data: bytes, position: int, *, out: list[bytes]) -> int:
        """Pass ``data[position:]`` on up to a list to cut (then read it: IDS), or to the
        end (then hold back what may begin the key). The key followed by no list (vLLM's
        ``"prompt_token_ids": null`` in every chunk after the first) is passed at once."""
        search = position
        while (found := data.find(_KEY, search)) >= 0:
            end = found + len(_KEY)
            opening = _OPENING.match(data, end)
            short = (
                opening is not None
                and self._min_cut > 0
                and data.find(_CLOSE, opening.end(), opening.end() + self._min_cut) >= 0
            )  # and whole in this read: the JSON parser reads it
            if opening is not None and not short:  # passed up to its "[", then read
                out.append(data[position : opening.end()])
                self._state, self._sink, self._first = _State.IDS, self._make_sink(), True
                return opening.end()
            if not short and _OPENING_SO_FAR.fullmatch(data, end):  # the read ends first
                out.append(data[position:end])
                self._state, self._colon = _State.KEY, False
                return end
            if short or _COLON_AFTER.match(data, end):  # not a list to cut: no more looked at
                out.append(data[position:] if position else data)
                self._state = _State.PASS
                return len(data)
            search = end  # the word as a value (``"text":"prompt_token_ids"``)
        keep = _key_start(data, search)
        out.append(data[position:keep] if position or keep < len(data) else data)
        self._held = data[keep:]
        return len(data)

    def _after_key(self, data: bytes, position: int, *, out: list[bytes]) -> int:
        """Past the key: spaces, ":", spaces, "[" open the list; anything else was the
        word as a value (``"text":"prompt_token_ids"``) or not a list: scan on."""
        byte = data[position]
        if byte in _SPACES or (byte == _COLON and not self._colon):
            self._colon = self._colon or byte == _COLON
        elif byte == _OPEN and self._colon:
            self._state, self._sink, self._first = _State.IDS, self._make_sink(), True
        else:  # after its ":", no list (``null``): no more looked at; else the word
            self._state = _State.PASS if self._colon else _State.SCAN
            return position
        out.append(data[position : position + 1])
        return position + 1

    def _read_ids(self, data: bytes, where: tuple[int, int], *, out: list[bytes]) -> int:
        """Read IDs from ``data[position:]`` (``where``: position, and where ``data``
        starts in the stream) up to the list's end or a piece's length."""
        position, start = where
        stop = min(len(data), position + PIECE)
        end = data.find(_CLOSE, position, stop)
        run = data[position : stop if end < 0 else end]
        if end < 0:  # the last ID may go on in the next piece or read
            last = run.rfind(b",") + 1
            tail = run[last:]
            if stop == len(data):
                if len(tail) > _MAX_ID_BYTES:
                    where = (position + last, start)
                    return self._fail(data, where, what="an ID too long", out=out)
                self._held, run = tail, run[:last]
            elif last == 0:
                return self._fail(data, (position, start), what="an ID too long", out=out)
            else:
                run, stop = run[:last], position + last
        problem = self._take_run(run, closed=end >= 0)
        if problem is not None:
            return self._fail(data, (position + problem[0], start), what=problem[1], out=out)
        if end < 0:
            return stop if stop < len(data) else len(data)
        assert self._sink is not None  # made when the list began
        self._cut.append(self._sink)
        self._state = _State.PASS
        return end  # the "]" and the rest are passed

    def _take_run(self, run: bytes, *, closed: bool) -> tuple[int, str] | None:
        """Add the IDs of ``run`` (whole IDs, each followed by a comma unless ``closed``
        ends the list); the offset in it and what is wrong, or None."""
        pieces = run.split(b",")
        if not closed:
            pieces.pop()  # the run ends with its comma
        elif self._first and len(pieces) == 1 and not pieces[0].strip(b" \t"):
            return None  # an empty list
        ids: array[int] = array("i")
        if _ID_RUN.fullmatch(run) is not None and _LEADING_ZERO.search(run) is None:
            try:
                ids = array("i", map(int, pieces))
            except (ValueError, OverflowError):
                ids = array("i")
        if len(ids) != len(pieces):  # something is wrong: find the first ID at fault
            return _first_fault(pieces)
        assert self._sink is not None  # made when the list began
        self._sink.add(ids)
        self._first = self._first and not pieces
        return None

    def _fail(self, data: bytes, where: tuple[int, int], *, what: str, out: list[bytes]) -> int:
        position, start = where
        self.error = f"engine's prompt_token_ids: {what} at byte {start + position} of its stream"
        self._state, self._held = _State.PASS, b""
        out.append(data[position:])
        return len(data)


def _first_fault(pieces: list[bytes]) -> tuple[int, str]:
    """Where in their run (comma-joined) the first bad one of ``pieces`` is, and what is
    wrong with it."""
    offset = 0
    for piece in pieces:
        digits = _ONE_ID.fullmatch(piece)
        if not piece.strip(b" \t"):
            return offset, "an empty element"
        if len(piece) > _MAX_ID_BYTES:
            return offset, "an ID too long"
        if digits is None:
            at = offset + len(piece) - len(piece.lstrip(b" \t"))
            if _LEADING_ZERO.match(piece, at - offset):
                return at, "an ID with a leading zero"
            while at < offset + len(piece) and piece[at - offset] in b"0123456789":
                at += 1
            return at, "not a decimal ID"
        if int(digits.group(1)) > _MAX_ID:
            return offset + digits.start(1), "an ID over 2**31 - 1"
        offset += len(piece) + 1
    return offset, "not a decimal ID"  # not reached: one of them is at fault


def _key_start(data: bytes, position: int) -> int:
    """Where the longest end of ``data[position:]`` that could begin the key starts (its
    length if none)."""
    if data[-1:] not in _KEY_BYTES:  # an event's "\n", as nearly every read ends
        return len(data)
    earliest = max(position, len(data) - len(_KEY) + 1)
    at = data.find(b'"', earliest)
    while at >= 0:
        if _KEY.startswith(data[at:]):
            return at
        at = data.find(b'"', at + 1)
    return len(data)
