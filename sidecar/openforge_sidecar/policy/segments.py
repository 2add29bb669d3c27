"""Encoding a prompt piece by piece between its special tokens, the pieces cached.

A harness sends the same text over and over: the system prompt and tool
schemas on every call, each earlier message on every call after it. A
Hugging Face tokenizer first cuts its input at the added tokens it matches
on the raw text (those not ``normalized``: ``<|im_start|>``, ``<|im_end|>``,
...), then normalizes, pre-tokenizes and runs the model on each piece
between them on its own. So the IDs of a text are the IDs of its pieces and
of the tokens between them, in order, and a piece seen before need not be
encoded again.

That holds only where nothing looks across a cut, which
:meth:`SegmentEncoder.for_tokenizer` checks before it builds one (else it
returns None and the caller encodes whole texts):

* the cut tokens are exactly the ones the tokenizer would match there: no
  other raw-text added token contains one, or could start before one and
  overlap it (the tokenizer takes the leftmost, then longest, match);
* no added token strips the whitespace next to it or must stand as a single
  word (``lstrip``, ``rstrip``, ``single_word``: they look at neighbours);
* no pre-tokenizer treats the first piece of a text differently from the
  others (``Metaspace``, whose ``prepend_scheme`` may be ``first``);
* a BPE model without dropout, no truncation or padding, special tokens
  matched (``encode_special_tokens`` off);
* and, as a last guard, texts built to probe the cuts (the tokens next to
  each other, to whitespace, to non-ASCII text, at both ends) encode to the
  same IDs both ways.

A Hugging Face tokenizer's memory while encoding is some 90 bytes per
character of its input, so it is never given much at once: new pieces go to it
in batches of about ``batch_chars`` characters, in the order the text has
them, and the IDs of a batch are written out before the next batch is looked
at (a 10 MB conversation of 5,000 messages is 5,000 new pieces: given at once,
they took 28 times the request's size). A piece longer than
``max_piece_chars`` (a 10 MB message, say) is not cached but cut, between an
ASCII letter and a space followed by one (``word| word``), and encoded
``batch_chars`` at a time. Byte-level BPE pre-tokenizers (GPT-2's and its
descendants' patterns) start a pre-token at such a space, and normalizers
leave ASCII alone, so the IDs are the same; the probes check that too, with
long texts cut small.
"""

from __future__ import annotations

import logging
import re
import sys
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

from openforge_sidecar.policy import stored

log = logging.getLogger(__name__)

#: Cached pieces hold at most this many characters in all (the least recently
#: used go first); a piece over an eighth of it is encoded but not kept.
MAX_CACHED_CHARS = 512 * 1024
#: A piece longer than this is not cached, and is encoded in parts (see the module doc).
MAX_PIECE_CHARS = 64 * 1024
#: About the most characters given to the tokenizer at once (one piece may be longer).
BATCH_CHARS = 16 * 1024
#: A cut inside a long piece: before a space between two ASCII letters.
_SAFE_CUT = re.compile(r"(?<=[A-Za-z]) (?=[A-Za-z])")

EncodeBatch = Callable[[list[str]], Sequence[Sequence[int]]]


class SegmentEncoder:
    """Token IDs of texts, encoding only the pieces between cut tokens not seen recently."""

    def __init__(
        self,
        encode_batch: EncodeBatch,
        cut_tokens: dict[str, int],
        *,
        max_cached_chars: int = MAX_CACHED_CHARS,
        max_piece_chars: int = MAX_PIECE_CHARS,
        batch_chars: int = BATCH_CHARS,
    ) -> None:
        self._encode_batch = encode_batch
        self._ids = dict(cut_tokens)
        longest_first = sorted(cut_tokens, key=len, reverse=True)
        self._pattern = re.compile("(" + "|".join(map(re.escape, longest_first)) + ")")
        self._overlap = len(longest_first[0]) - 1 if longest_first else 0
        self._cache: OrderedDict[str, array[int]] = OrderedDict()
        self._chars = 0
        self._max_chars = max_cached_chars
        self._max_piece = max_piece_chars
        self._batch = batch_chars
        self.hits = 0
        self.misses = 0

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, encode_batch: EncodeBatch) -> SegmentEncoder | None:
        """An encoder equal to ``encode_batch`` on whole texts for this tokenizer, or None."""
        cut_tokens, reason = _cut_tokens(tokenizer)
        if not cut_tokens:
            log.info("prompt pieces are not cached: %s", reason)
            return None
        encoder = cls(
            encode_batch, cut_tokens, max_piece_chars=sys.maxsize, batch_chars=sys.maxsize
        )
        for text in _probes(list(cut_tokens)):
            whole = list(encode_batch([text])[0])
            if encoder.encode(text) != whole:
                log.warning("prompt pieces are not cached: %r encodes otherwise in pieces", text)
                return None
        cutting = cls(encode_batch, cut_tokens, max_piece_chars=16, batch_chars=16)  # cut small
        for text in _LONG_PROBES:
            if cutting.encode(text) != list(encode_batch([text])[0]):
                log.warning("long prompt pieces are encoded whole: %r encodes otherwise cut", text)
                return cls(encode_batch, cut_tokens, max_piece_chars=sys.maxsize)
        return cls(encode_batch, cut_tokens)

    def encode(self, text: str) -> list[int]:
        return self.encode_ids(text).tolist()

    def encode_ids(self, text: str) -> array[int]:
        """:meth:`encode` as an array, with no int object per token on the way.

        The text is walked piece by piece and encoded a batch of new pieces at a
        time (see the module doc), so that what is held besides the text and its IDs
        is one batch. A piece longer than ``max_piece_chars`` is never cached: it is
        encoded where it lies in ``text``, a part at a time, straight into the IDs,
        and no copy of it is made."""
        out: array[int] = array("i")
        self._encode(self._lay_out(text), into=out)
        return out

    def encode_chunks(self, chunks: Iterable[str], *, spill: Path | None = None) -> stored.Ids:
        """:meth:`encode_ids` of ``"".join(chunks)``, the text never joined: a chat
        template's output as it is written, the chunks let go of once encoded (a
        conversation of many messages is never held as one prompt text). A piece
        that spans chunks is joined alone; a cut token may span them too. With
        ``spill``, IDs past :data:`stored.SPILL_IDS` go to that file as they come
        (:class:`stored.Writer`), and so do the IDs: a 30 MB prompt's are 25 MB."""
        out = stored.Writer(spill)
        try:
            self._encode(self._lay_out_chunks(chunks), into=out)
        except BaseException:
            out.discard()
            raise
        return out.done()

    def _encode(self, items: Iterable[_Item], *, into: array[int] | stored.Writer) -> None:
        """Add the IDs of ``items`` to ``into``, a batch of new pieces at a time."""
        out = into
        window: list[_Item] = []  # pieces and IDs in order, from the first new piece on
        new: dict[str, None] = {}  # the window's new pieces, each once
        chars = 0
        for item in items:
            if isinstance(item, str):
                ids = self._cache.get(item)
                if ids is not None:  # held here: a batch learned later may evict it
                    self._cache.move_to_end(item)
                    self.hits += 1
                    item = ids
                elif item not in new:
                    new[item] = None
                    chars += len(item)
            window.append(item)
            if chars >= self._batch or len(window) >= _MAX_WINDOW:
                self._write(window, self._learn(list(new)), into=out)
                window, new, chars = [], {}, 0
        self._write(window, self._learn(list(new)), into=out)

    def _lay_out(self, text: str) -> Iterator[_Item]:
        """The text's pieces in order: a piece's text, a cut token's ID, or where a long
        piece lies (see :meth:`encode_ids`)."""
        position = 0
        for match in self._pattern.finditer(text):
            yield from self._piece(text, (position, match.start()))
            yield self._ids[match.group()]
            position = match.end()
        yield from self._piece(text, (position, len(text)))

    def _lay_out_chunks(self, chunks: Iterable[str]) -> Iterator[_Item]:
        """:meth:`_lay_out` of the chunks' text, chunk by chunk (:meth:`encode_chunks`)."""
        held: list[str] = []  # the open piece's text, as it came; never a whole cut token
        for chunk in chunks:
            start = 0
            if held and self._overlap:
                # A cut token begun in what is held and ended in this chunk: the leftmost
                # match, since what is held has none.
                tail = _tail(held, self._overlap)
                match = self._pattern.search(tail + chunk[: self._overlap])
                if match is not None and match.start() < len(tail) < match.end():
                    _drop_end(held, len(tail) - match.start())
                    yield from self._joined(held)
                    yield self._ids[match.group()]
                    held, start = [], match.end() - len(tail)
            for match in self._pattern.finditer(chunk, start):
                if held:
                    held.append(chunk[start : match.start()])
                    yield from self._joined(held)
                    held = []
                else:
                    yield from self._piece(chunk, (start, match.start()))
                yield self._ids[match.group()]
                start = match.end()
            if start < len(chunk):
                held.append(chunk[start:] if start else chunk)
        yield from self._joined(held)

    def _joined(self, held: list[str]) -> Iterator[_Item]:
        text = held[0] if len(held) == 1 else "".join(held)
        return self._piece(text, (0, len(text)))

    def _piece(self, text: str, span: tuple[int, int]) -> Iterator[_Item]:
        start, end = span
        if end - start > self._max_piece:
            yield _Long(text, start, end)
        elif end > start:
            yield text[start:end]

    def _write(
        self,
        window: list[_Item],
        learned: dict[str, array[int]],
        *,
        into: array[int] | stored.Writer,
    ) -> None:
        """Add the IDs of a window's items to ``into``, in order."""
        for item in window:
            if isinstance(item, int):
                into.append(item)
            elif isinstance(item, str):
                into.extend(learned[item])
            elif isinstance(item, array):
                into.extend(item)
            else:
                self.misses += 1
                text = item.text
                for start, end in _parts(text, (item.start, item.end), size=self._batch):
                    into.extend(self._encode_batch([text[start:end]])[0])

    def clear(self) -> None:
        self._cache.clear()
        self._chars = 0

    def _learn(self, pieces: list[str]) -> dict[str, array[int]]:
        """Encode pieces (each on its own) and keep those not too long."""
        if not pieces:
            return {}
        self.misses += len(pieces)
        learned: dict[str, array[int]] = {}
        for piece, ids in zip(pieces, self._encode_batch(pieces), strict=True):
            learned[piece] = array("i", ids)
        for piece, ids in learned.items():
            if len(piece) <= self._max_chars // 8:
                self._cache[piece] = ids
                self._chars += len(piece)
        while self._chars > self._max_chars:
            piece, _ = self._cache.popitem(last=False)
            self._chars -= len(piece)
        return learned


#: Items held before a window is written (hits only hold no text, but add up).
_MAX_WINDOW = 4096


@dataclass(frozen=True, slots=True)
class _Long:
    """A piece longer than ``max_piece_chars``, where it lies in a text."""

    text: str
    start: int
    end: int


#: A piece's text, a cut token's ID, a cached piece's IDs, or where a long piece lies.
_Item: TypeAlias = "str | int | array[int] | _Long"


def _tail(held: list[str], size: int) -> str:
    """The last ``size`` characters of the held text (all of it if shorter)."""
    parts: list[str] = []
    for part in reversed(held):
        parts.append(part[-size:])
        size -= len(parts[-1])
        if size <= 0:
            break
    return "".join(reversed(parts))


def _drop_end(held: list[str], count: int) -> None:
    """Take the last ``count`` characters off the held text, in place."""
    while count and held:
        if len(held[-1]) <= count:
            count -= len(held.pop())
        else:
            held[-1] = held[-1][:-count]
            count = 0


def _parts(text: str, span: tuple[int, int], *, size: int) -> list[tuple[int, int]]:
    """Where ``text[start:end]`` (``span``) is cut at safe places (:data:`_SAFE_CUT`) into parts
    of about ``size`` characters, as (start, end) pairs; a stretch with no safe place
    stays whole. Nothing outside ``text[start:end]`` is looked at."""
    start, end = span
    parts: list[tuple[int, int]] = []
    while end - start > size:
        cut = None
        for match in _SAFE_CUT.finditer(text, start + size // 2, start + size):
            cut = match.start()
        if cut is None:  # none in the second half of the window: the next one at all
            found = _SAFE_CUT.search(text, start + size, end)
            if found is None:
                break
            cut = found.start()
        parts.append((start, cut))
        start = cut
    parts.append((start, end))
    return parts


def _cut_tokens(tokenizer: Any) -> tuple[dict[str, int], str]:
    """The added tokens texts may be cut at, by content, or ({}, why none)."""
    model = tokenizer.model
    if type(model).__name__ != "BPE" or getattr(model, "dropout", None):
        return {}, f"model {type(model).__name__} (only BPE without dropout is checked)"
    if tokenizer.truncation is not None or tokenizer.padding is not None:
        return {}, "the tokenizer truncates or pads"
    if getattr(tokenizer, "encode_special_tokens", False):
        return {}, "special tokens are encoded as text"
    if "Metaspace" in repr(tokenizer.pre_tokenizer):
        return {}, "a Metaspace pre-tokenizer (may treat a text's first piece apart)"
    added = tokenizer.get_added_tokens_decoder()
    if any(t.lstrip or t.rstrip or t.single_word for t in added.values()):
        return {}, "an added token strips whitespace or must be a single word"
    raw = {t.content: int(i) for i, t in added.items() if not t.normalized and t.content}
    cut = {
        token: token_id
        for token, token_id in raw.items()
        if not any(other != token and _conflict(other, token) for other in raw)
    }
    return cut, "" if cut else "no added token matched on the raw text stands alone"


def _conflict(other: str, token: str) -> bool:
    """Whether a match of ``other`` could take the place of ``token`` at a cut."""
    if token in other:
        return True
    return any(token.startswith(other[start:]) for start in range(1, len(other)))


#: Texts that a cut long piece must encode to the same IDs as whole: words,
#: contractions, digits, punctuation, runs of spaces, tabs, non-ASCII letters.
_LONG_PROBES = (
    "It's the end, isn't it? 42 words  and   spaces\tand tabs " * 6,
    "über naïve café words then ASCII words again and again " * 4,
    "CamelCase words: don't DON'T we'll I'd they've  x y z " * 4,
)


def _probes(tokens: list[str]) -> list[str]:
    texts = ["", " ", "\n", "plain text, no tokens"]
    fillers = ["", " ", "  ", "\n", "\n\n", " \t\n", "x", " x ", "über 日本🙂 12 345", "'s?!"]
    for index, token in enumerate(tokens):
        other = tokens[(index + 1) % len(tokens)]
        for filler in fillers:
            texts.append(f"{filler}{token}{filler}")
            texts.append(f"{token}{filler}{other}{filler}{token}")
            texts.append(f"a{filler}{token}b{token}{token}{filler}c")
    return texts
