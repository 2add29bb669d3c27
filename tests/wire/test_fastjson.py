"""JSON on the hot path: the stdlib's results, msgspec's and orjson's speed, no oversized
buffers, and a body parsed with no second copy of it."""

from __future__ import annotations

import json
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openforge.wire import fastjson

CASES = [
    {"a": [1, 2.5, None, True], "é": "ü 日本", "nested": {"k": []}},
    {"big": 2**70},  # beyond 64 bits: orjson refuses, the stdlib takes over
]


@pytest.mark.parametrize("value", CASES)
def test_dumps_gives_the_stdlibs_compact_text(value: object) -> None:
    expected = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    assert fastjson.dumps(value) == expected
    assert fastjson.dumps_bytes(value) == expected.encode()


def test_loads_accepts_what_the_stdlib_accepts() -> None:
    assert fastjson.loads('{"x": NaN}')["x"] != fastjson.loads('{"x": NaN}')["x"]
    assert fastjson.loads(b'{"n": 100000000000000000000}') == {"n": 10**20}


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats()
    | st.text(st.characters(exclude_categories=())),  # lone surrogates too
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(st.characters(exclude_categories=())), inner, max_size=4)
    ),
    max_leaves=20,
)


def _stdlib(data: bytes | str) -> tuple[str, object]:
    try:
        return "ok", json.loads(data)
    except (ValueError, RecursionError) as exc:
        return "error", type(exc)


def _ours(data: bytes | str) -> tuple[str, object]:
    try:
        return "ok", fastjson.loads(data)
    except (ValueError, RecursionError) as exc:
        return "error", type(exc)


@settings(max_examples=400, deadline=None)
@given(
    value=_JSON,
    ascii_only=st.booleans(),
    spacing=st.sampled_from([None, 1, (", ", ": ")]),
    as_bytes=st.booleans(),
)
def test_loads_gives_what_the_stdlib_gives(
    value: object, ascii_only: bool, spacing: object, as_bytes: bool
) -> None:
    """NaN, surrogates, big integers and all: what the fast parsers refuse goes to the
    stdlib (repr compares NaN, and -0.0 against 0.0)."""
    text = json.dumps(
        value,
        ensure_ascii=ascii_only,
        **(  # type: ignore[arg-type]
            {"indent": spacing} if isinstance(spacing, int) else {"separators": spacing}
        ),
    )
    data = text.encode("utf-8", "surrogatepass") if as_bytes else text
    assert repr(_ours(data)) == repr(_stdlib(data))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=60) | st.text(max_size=60).map(str.encode))
def test_loads_refuses_what_the_stdlib_refuses(data: bytes) -> None:
    assert repr(_ours(data)) == repr(_stdlib(data))


def test_a_large_body_is_parsed_with_no_copy_of_it_beside_its_objects() -> None:
    """orjson held a parse tree of many times the body (~1x of it resident) while it
    parsed: with the harness's body held too, a 10 MB conversation peaked at three
    copies of it."""
    body = json.dumps(
        {
            "messages": [
                {"role": "user", "content": f"turn {i} " + "word " * 398} for i in range(2000)
            ]
        }
    ).encode()
    tracemalloc.start()
    try:
        value = fastjson.loads(body)
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(value["messages"]) == 2000
    assert peak < kept * 1.1 + 64 * 1024, (peak, kept, len(body))


def test_dumps_bytes_holds_no_more_memory_than_its_length() -> None:
    """A call keeps its engine request for its whole life: no spare buffer with it."""
    body = {"prompt": list(range(1000, 1700)), "stream": True}
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = fastjson.dumps_bytes(body)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(kept) > 3000
    assert held < 2 * len(kept), f"{held} bytes held for {len(kept)} bytes of JSON"


def test_text_with_a_lone_surrogate_is_read_as_the_stdlib_reads_it() -> None:
    """msgspec encodes text to UTF-8 first, which a lone surrogate cannot be."""
    assert fastjson.loads('{"a": "x\ud800"}') == {"a": "x\ud800"}
