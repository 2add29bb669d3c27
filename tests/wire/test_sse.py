from __future__ import annotations

import itertools
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from openforge.wire import fastjson, sse

_no_cr = st.characters(exclude_characters="\r", exclude_categories=["Cs"])
_one_line = st.characters(exclude_characters="\r\n\0", exclude_categories=["Cs"])
events = st.builds(
    sse.Event,
    data=st.text(_no_cr, max_size=30),
    event=st.none() | st.text(_one_line, max_size=10),
    id=st.none() | st.text(_one_line, max_size=8),
)
endings = st.sampled_from(["\n", "\r", "\r\n"])


def _wire(items: list[sse.Event], ending: str, comments: bool) -> bytes:
    out = b""
    for event in items:
        if comments:
            out += b": keep-alive\n"
        if event.id is not None:
            out += f"id: {event.id}\n".encode()
        out += sse.encode(event.data, event.event)
    return out.replace(b"\n", ending.encode())


def _expected(items: list[sse.Event]) -> list[sse.Event]:
    """The last event id persists until another id field replaces it, per spec."""
    last: str | None = None
    out = []
    for event in items:
        last = event.id if event.id is not None else last
        out.append(replace(event, id=last))
    return out


@st.composite
def _cuts(draw: st.DrawFn, data: bytes) -> list[bytes]:
    cuts = sorted(draw(st.sets(st.integers(0, len(data)), max_size=10)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def _parse(chunks: list[bytes]) -> tuple[list[sse.Event], sse.SSEParser]:
    parser = sse.SSEParser()
    out = [e for chunk in chunks for e in parser.feed(chunk)]
    return out, parser


@settings(deadline=None)  # a shared 2-core machine makes timings noisy
@given(st.lists(events, max_size=6), endings, st.booleans(), st.data())
def test_events_survive_any_line_ending_and_any_chunking(
    items: list[sse.Event], ending: str, comments: bool, data: st.DataObject
) -> None:
    wire = _wire(items, ending, comments)
    parsed, parser = _parse(data.draw(_cuts(wire)))
    assert parsed == _expected(items)
    assert not parser.has_partial
    assert parser.close() == []


@settings(deadline=None)  # a shared 2-core machine makes timings noisy
@given(st.lists(events, min_size=1, max_size=6), endings, st.data())
def test_a_truncated_stream_yields_only_whole_events(
    items: list[sse.Event], ending: str, data: st.DataObject
) -> None:
    wire = _wire(items, ending, comments=False)
    cut = data.draw(st.integers(0, len(wire) - 1))
    parsed, parser = _parse(data.draw(_cuts(wire[:cut])))
    assert parsed == _expected(items)[: len(parsed)]
    whole = cut == len(wire) - 1 and ending == "\r\n"  # only the LF of the last CRLF is missing
    if not whole:
        assert len(parsed) < len(items)
    assert parser.close() == []


def test_multi_line_data_joins_with_newlines() -> None:
    wire = sse.encode("a\nb\n", "x")
    assert wire == b"event: x\ndata: a\ndata: b\ndata: \n\n"
    assert sse.SSEParser().feed(wire) == [sse.Event("a\nb\n", "x")]


def test_field_rules() -> None:
    parser = sse.SSEParser()
    wire = (
        b": comment\n"
        b"data\n\n"  # a field without a colon has an empty value
        b"data:no-space\ndata:  two spaces\n\n"  # only one leading space is dropped
        b"event: only-a-name\n\n"  # no data: nothing is dispatched
        b"retry: 1500\ndata: r\n\n"
        b"retry: soon\nunknown: field\ndata: s\n\n"
    )
    assert parser.feed(wire) == [
        sse.Event(""),
        sse.Event("no-space\n two spaces"),
        sse.Event("r", retry=1500),
        sse.Event("s"),
    ]


def test_a_utf8_sequence_cut_between_chunks_decodes_whole() -> None:
    wire = sse.encode("héllo ✓")
    parser = sse.SSEParser()
    out = [e for i in range(len(wire)) for e in parser.feed(wire[i : i + 1])]
    assert out == [sse.Event("héllo ✓")]


def test_partial_event_is_reported_and_discarded_at_close() -> None:
    parser = sse.SSEParser()
    assert parser.feed(b"data: half") == []
    assert parser.has_partial
    assert parser.close() == []
    assert not parser.has_partial


def test_a_leading_byte_order_mark_is_ignored() -> None:
    assert sse.SSEParser().feed(b"\xef\xbb\xbfdata: x\n\n") == [sse.Event("x")]
    parser = sse.SSEParser()  # the BOM cut across chunks
    assert parser.feed(b"\xef\xbb") + parser.feed(b"\xbfdata: x\n\n") == [sse.Event("x")]
    # only at the very start
    assert sse.SSEParser().feed(b"data: \xef\xbb\xbfx\n\n") == [sse.Event("\ufeffx")]


def test_a_crlf_cut_after_its_cr_then_a_blank_line_in_the_next_chunks() -> None:
    parser = sse.SSEParser()
    out = parser.feed(b"data: a\r") + parser.feed(b"\n") + parser.feed(b"\n")
    assert out == [sse.Event("a")]
    parser = sse.SSEParser()
    assert parser.feed(b"data: a\r") + parser.feed(b"\n") + parser.feed(b"\r\n") == [sse.Event("a")]


_sse_lines = st.lists(
    st.sampled_from(
        ["data: x", "data:y", "data", "data:  z", "id: 7", "id", "event: e", ": c", "retry: 9", ""]
    )
    | st.text(_one_line, max_size=12).map(lambda s: "data: " + s),
    max_size=12,
)


@settings(deadline=None)  # a shared 2-core machine makes timings noisy
@given(st.lists(_sse_lines, max_size=4))
def test_whole_event_chunks_parse_as_the_same_bytes_fed_one_at_a_time(
    chunks: list[list[str]],
) -> None:
    """Chunks of whole events take a shortcut; it must give what the general path gives."""
    wire = [("\n".join(lines) + "\n\n").encode() for lines in chunks]
    whole = sse.SSEParser()
    fast = [e for chunk in wire for e in whole.feed(chunk)]
    slow_parser = sse.SSEParser()
    joined = b"".join(wire)
    slow = [e for i in range(len(joined)) for e in slow_parser.feed(joined[i : i + 1])]
    assert fast == slow
    assert whole.has_partial == slow_parser.has_partial


def test_a_chunk_of_one_line_events_parses_each() -> None:
    parser = sse.SSEParser()
    assert parser.feed(b"id: 1\ndata: a\n\n") == [sse.Event("a", id="1")]
    assert parser.feed(b"data: b\n\ndata:c\n\n\ndata: [DONE]\n\n") == [
        sse.Event("b", id="1"),
        sse.Event("c", id="1"),
        sse.Event("[DONE]", id="1"),
    ]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES, st.none() | st.sampled_from(["message_start", "response.output_text.delta"]))
def test_a_json_event_is_written_as_encode_writes_its_compact_json(
    value: object, event: str | None
) -> None:
    assert sse.encode_json(value, event) == sse.encode(fastjson.dumps(value), event)
