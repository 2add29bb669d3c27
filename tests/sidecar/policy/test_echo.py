from __future__ import annotations

import itertools
import json
import re
from array import array
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openforge.wire import sse
from openforge_sidecar.policy import echo, engine, stored
from traced import traced

_IDS = [(i * 7919) % 150000 for i in range(60_000)]
_LIST = re.compile(rb'("prompt_token_ids"\s*:\s*\[)[^\]]*\]')


def _stream(echo_text: str, *, before: str = "", after: str = "") -> bytes:
    choice = '{"index": 0, "text": "Hi", "token_ids": [9], "logprobs": {"token_logprobs": [-0.5]}'
    first = '{"choices": [' + choice + ', "prompt_token_ids": ' + echo_text + "}]}"
    last = '{"choices": [{"index": 0, "text": "", "token_ids": [2], "finish_reason": "stop"}]}'
    return f"{before}data: {first}\n\n{after}data: {last}\n\ndata: [DONE]\n\n".encode()


def _reads(stream: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted({c % (len(stream) + 1) for c in cuts}), len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def _parsed(reads: list[bytes], *, cutter: echo.EchoCutter | None) -> list[object]:
    """The chunks the engine's stream gives (an error's text in place of a chunk that
    fails), read through ``cutter`` as the relay reads it, or as plain JSON."""
    parser, out = sse.SSEParser(), []
    for data in reads:
        for event in parser.feed(cutter.feed(data) if cutter else data):
            if event.data.strip() == "[DONE]":
                continue
            try:
                chunk = engine.parse_chunk(event.data)
            except engine.EngineError as exc:
                out.append(str(exc))
                continue
            if cutter is not None and chunk.prompt_token_ids is not None:
                taken = cutter.take()  # None: a list left in place (only the first is cut)
                if taken is not None:
                    assert isinstance(taken, echo.Collected)
                    chunk.prompt_token_ids = taken.ids
            out.append(chunk)
    return out


@settings(deadline=None, max_examples=300)
@given(
    before=st.sampled_from(["", 'data: {"choices": [{"text": "prompt_token_ids"}]}\n\n']),
    lists=st.lists(st.lists(st.integers(0, 2**31 - 1), max_size=40), min_size=1, max_size=3),
    separator=st.sampled_from([",", ", ", " , ", ",\t"]),
    spaced_key=st.sampled_from(
        ['"prompt_token_ids": ', '"prompt_token_ids" :', '"prompt_token_ids":']
    ),
    cuts=st.lists(st.integers(0, 10_000), max_size=12),
)
def test_a_stream_read_through_the_cutter_gives_the_chunks_json_gives_cut_anywhere(
    before: str, lists: list[list[int]], separator: str, spaced_key: str, cuts: list[int]
) -> None:
    """The first echo is cut, wherever the reads cut the stream; the word as a value
    before it is not taken for the key; later lists (and ``null``) are left as they are."""
    events = [before]
    for i, ids in enumerate(lists):
        listed = "[" + separator.join(map(str, ids)) + "]"
        logprobs = '"logprobs": {"token_logprobs": [-0.5]}'
        choice = f'{{"index": 0, "text": "{i}", "token_ids": [{i}], {logprobs}'
        events.append(f'data: {{"choices": [{choice}, {spaced_key}{listed}}}]}}\n\n')
    events.append('data: {"choices": [{"text": "prompt_token_ids", "token_ids": []}]}\n\n')
    stream = "".join(events).encode()
    reads = _reads(stream, cuts)
    cutter = echo.EchoCutter(min_cut=0)
    assert _parsed(reads, cutter=cutter) == _parsed([stream], cutter=None)
    assert cutter.error is None and cutter.take() is None  # the first list, taken
    again = echo.EchoCutter(min_cut=0)
    out = b"".join(again.feed(r) for r in reads)
    assert out == _LIST.sub(rb"\1]", stream, count=1)  # the first list only: engines echo once
    first = again.take()
    assert isinstance(first, echo.Collected) and first.ids.tolist() == lists[0]


@pytest.mark.parametrize(
    "stream",
    [
        _stream(json.dumps(_IDS)),
        _stream(json.dumps(_IDS).replace(", ", ",")),
        _stream(json.dumps(_IDS), before=": hi\n\ndata: {}\n\n", after="event: x\n"),
        _stream(json.dumps(_IDS)).replace(b"\n", b"\r\n"),
        b"\xef\xbb\xbf" + _stream(json.dumps(_IDS)),  # a BOM
        _stream(json.dumps(_IDS), after="data: more\n"),
        _stream("[]"),
        _stream("[ ]"),
        _stream("null"),
        _stream(json.dumps(_IDS)).replace(b'"prompt_token_ids"', b'"prompt_token_idz"'),
    ],
)
def test_a_large_echo_reads_as_json_reads_it_whole_or_in_reads(stream: bytes) -> None:
    expected = _parsed([stream], cutter=None)
    for size in (len(stream), 65_536, 4_099, 7):
        reads = [stream[i : i + size] for i in range(0, len(stream), size)]
        cutter = echo.EchoCutter(min_cut=0)
        assert _parsed(reads, cutter=cutter) == expected, size
        assert cutter.error is None


@pytest.mark.parametrize(
    ("listed", "at", "what"),
    [
        (json.dumps(_IDS)[:-1] + ', "x"]', '"x"]', "not a decimal ID"),
        (json.dumps(_IDS)[:-1] + ", \u0661]", "\u0661", "not a decimal ID"),
        (json.dumps(_IDS)[:-1] + ", -5]", "-5]", "not a decimal ID"),
        (json.dumps(_IDS)[:-1] + ", 1 2]", " 2]", "not a decimal ID"),
        (json.dumps(_IDS)[:-1] + ", 9999999999999]", "9999999999999", "an ID over 2**31 - 1"),
        ("[" + json.dumps(_IDS) + "]", "[0, 7919", "not a decimal ID"),  # nested
        (json.dumps(_IDS)[:-1] + ",, 5]", ", 5]", "an empty element"),
        (json.dumps(_IDS)[:-1] + ",]", "]}]}", "an empty element"),
        (json.dumps(_IDS).replace(", ", " ,\n "), "\n", "not a decimal ID"),  # spans lines
        ("[" + "1" * 200 + "]", "1" * 200, "an ID too long"),
        # JSON has no leading zeros (the JSON parser refuses a short echo with one)
        (json.dumps(_IDS)[:-1] + ", 007]", "007]", "an ID with a leading zero"),
        ("[00, 1]", "00, 1]", "an ID with a leading zero"),
        (json.dumps(_IDS)[:-1] + ", 0 7]", " 7]", "not a decimal ID"),
        (json.dumps(_IDS)[:-1] + ", 0 07]", " 07]", "not a decimal ID"),  # the first fault
        ("[" + "1" * 100_000 + "]", "1" * 100_000, "an ID too long"),
    ],
)
def test_an_echo_that_is_not_a_flat_list_of_ids_is_an_error_naming_its_byte(
    listed: str, at: str, what: str
) -> None:
    """The byte named is the first of the ID at fault (the element after a comma, for
    an empty one), however the reads cut the stream."""
    stream = _stream(listed)
    expected = stream.index(at.encode())
    for size in (len(stream), 4_099, 100):
        cutter = echo.EchoCutter(min_cut=0)
        out = b"".join(cutter.feed(stream[i : i + size]) for i in range(0, len(stream), size))
        assert cutter.error == f"engine's prompt_token_ids: {what} at byte {expected} of its stream"
        assert out.endswith(stream[expected:])  # the rest is passed on as it came
        assert cutter.take() is None  # nothing compared or kept of a list at fault


def test_when_the_planned_ids_cannot_be_read_nothing_is_compared(tmp_path: Path) -> None:
    """A stashed prompt's file gone (or cut short) under the sidecar: the echo is read and
    passed on, ``unread`` says why, and nothing raises into the harness's stream."""
    planned = stored.StoredIds.write(tmp_path / "p.ids", array("i", _IDS))
    planned.path.unlink()
    cutter = echo.EchoCutter(lambda: echo.Compared(planned), min_cut=0)
    out = b"".join(cutter.feed(r) for r in _reads(_stream(json.dumps(_IDS)), [5_000, 90_000]))
    taken = cutter.take()
    assert isinstance(taken, echo.Compared) and not taken.equal
    assert taken.unread is not None and "p.ids" in taken.unread
    assert cutter.error is None and len(out) < 400


def test_only_a_read_of_the_echo_is_held_at_a_time() -> None:
    """A 500,000-ID echo (some 3 MB) arriving in 64 K reads: what the cutter holds
    beyond the IDs' own array is a read's worth, not the line."""
    ids = array("i", ((i * 7919) % 150_000 for i in range(500_000)))
    stream = _stream("[" + ",".join(map(str, ids)) + "]")
    reads = [stream[i : i + 65_536] for i in range(0, len(stream), 65_536)]
    cutter = echo.EchoCutter(min_cut=0)
    fed = traced(lambda: [cutter.feed(r) for r in reads])
    out, peak = fed.value, fed.peak
    taken = cutter.take()
    assert isinstance(taken, echo.Collected) and taken.ids == ids and sum(map(len, out)) < 400
    assert peak < ids.itemsize * len(ids) * 1.2 + 1024 * 1024, peak


def test_a_whole_answer_in_one_read_is_cut_without_a_copy_of_the_echo() -> None:
    ids = array("i", ((i * 7919) % 150_000 for i in range(300_000)))
    stream = _stream("[" + ",".join(map(str, ids)) + "]")
    cutter = echo.EchoCutter(min_cut=0)
    fed = traced(lambda: cutter.feed(stream))
    out, peak = fed.value, fed.peak
    taken = cutter.take()
    assert isinstance(taken, echo.Collected) and taken.ids == ids and len(out) < 400
    assert peak < ids.itemsize * len(ids) * 1.2 + 1024 * 1024, peak


@pytest.mark.parametrize("in_file", [False, True])
@pytest.mark.parametrize(
    ("echoed", "equal"),
    [
        (_IDS, True),
        (_IDS[:-1], False),  # one short
        ([*_IDS, 5], False),  # one more
        ([*_IDS[:30_000], 1, *_IDS[30_001:]], False),  # one other, mid-way
        ([], False),
    ],
)
def test_an_echo_is_compared_with_the_planned_prompt_as_it_comes(
    tmp_path: Path, in_file: bool, echoed: list[int], equal: bool
) -> None:
    """Compared (what the relay uses) keeps no IDs: it reads the planned ones along, from
    memory or from their file, a chunk at a time."""
    planned: stored.Ids = array("i", _IDS)
    if in_file:
        planned = stored.StoredIds.write(tmp_path / "p.ids", array("i", _IDS))
    stream = _stream(json.dumps(echoed))
    cutter = echo.EchoCutter(lambda: echo.Compared(planned), min_cut=0)
    for i in range(0, len(stream), 4_099):
        cutter.feed(stream[i : i + 4_099])
    taken = cutter.take()
    assert isinstance(taken, echo.Compared) and taken.equal is equal
    assert cutter.error is None and cutter.take() is None


def test_an_empty_echo_of_an_empty_prompt_is_equal() -> None:
    cutter = echo.EchoCutter(lambda: echo.Compared(array("i")), min_cut=0)
    cutter.feed(_stream("[]"))
    taken = cutter.take()
    assert isinstance(taken, echo.Compared) and taken.equal


def test_a_short_list_whole_in_one_read_is_left_to_the_json_parser() -> None:
    """A few thousand IDs are parsed faster by msgspec than here; a list that may be long
    (its end not in the read) is cut whatever its size."""
    short = _stream(json.dumps(_IDS[:1000]))
    cutter = echo.EchoCutter()
    assert cutter.feed(short) == short and cutter.take() is None
    cut = echo.EchoCutter()
    out = b"".join(cut.feed(short[i : i + 100]) for i in range(0, len(short), 100))
    taken = cut.take()
    assert isinstance(taken, echo.Collected) and taken.ids.tolist() == _IDS[:1000]
    assert len(out) < 400
    long = _stream(json.dumps(_IDS))
    whole = echo.EchoCutter()
    assert len(whole.feed(long)) < 400 and whole.take() is not None


def test_after_a_null_echo_the_rest_passes_untouched() -> None:
    """vLLM's chunks after the first say ``"prompt_token_ids": null``; an engine that
    echoes nothing says it in every chunk: each passes as it came, a state check each."""
    null = _stream("null")
    cutter = echo.EchoCutter(min_cut=0)
    assert cutter.feed(null) == null
    later = _stream(json.dumps(_IDS))
    assert cutter.feed(later) == later and cutter.take() is None
    split = echo.EchoCutter(min_cut=0)  # the read ends between the key and its value
    at = null.index(b"null")
    assert split.feed(null[:at]) + split.feed(null[at:]) == null
    assert split.feed(later) == later and split.take() is None
