"""JSON on the hot path: the stdlib's results, orjson's speed, no oversized buffers."""

from __future__ import annotations

import json
import tracemalloc

import pytest
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
