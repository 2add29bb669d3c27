"""JSON on the hot path: orjson where it can, the stdlib where it cannot.

Every engine chunk and every event the sidecar relays is parsed or written
once per token, so the encoder matters. orjson is several times faster, but
stricter than the stdlib (lone surrogates, integers beyond 64 bits, NaN);
on anything it refuses, these functions fall back to :mod:`json`, so the
semantics stay the stdlib's and only the speed changes.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def loads(data: bytes | str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def dumps(value: Any) -> str:
    """Compact JSON text with non-ASCII kept as is (as on every wire API)."""
    return _dumps(value).decode()


def dumps_bytes(value: Any) -> bytes:
    """:func:`dumps` as bytes, in an object of their own size.

    orjson returns its working buffer, which grows in large steps (a 3.5 KB
    engine request sits in 130 KB, a 165 KB one in 8 MB) and lives as long
    as the bytes do, here a whole call. Copying out costs well under a
    microsecond per kilobyte.
    """
    return memoryview(_dumps(value)).tobytes()


def dumps_line(value: Any) -> bytes:
    """:func:`dumps` as UTF-8 bytes, for a short-lived line (no copy to an exact size)."""
    return _dumps(value)


def _dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
