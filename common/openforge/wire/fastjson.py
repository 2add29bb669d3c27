"""JSON on the hot path: msgspec and orjson where they can, the stdlib where they cannot.

Every engine chunk and every event the sidecar relays is parsed or written
once per token, so the speed matters; and a request body is parsed once, so
the memory does: msgspec decodes straight into Python objects, where orjson
(and the stdlib, which decodes the text first) holds a second copy of the
body's size while it parses. Both are stricter than the stdlib (lone
surrogates, NaN, a byte-order mark, numbers beyond a float); on anything they
refuse, these functions fall back to :mod:`json`, so the semantics stay the
stdlib's and only the speed and the memory change.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import orjson

_decode = msgspec.json.Decoder().decode


def loads(data: bytes | str) -> Any:
    try:
        return _decode(data)
    except (msgspec.DecodeError, RecursionError, UnicodeEncodeError):
        # ValidationError is a DecodeError; text with a lone surrogate cannot be encoded
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
