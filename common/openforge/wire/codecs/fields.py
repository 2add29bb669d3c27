"""Typed reads from decoded JSON, each failure a CodecError naming its path.

Codecs parse request and response bodies through these helpers so that
every bad value is reported with the JSON path at fault
(``messages[2].content[0].type``) and nothing but CodecError escapes.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from openforge.wire import fastjson
from openforge.wire.codecs.errors import CodecError

_MISSING: Any = object()


#: A surrogate's escape (``\\ud800``) or its three bytes as UTF-8 would have them.
_MAY_SPELL_A_SURROGATE = re.compile(rb"\\u[dD]|\xed[\xa0-\xbf]")


def load_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object of valid text, or CodecError.

    JSON can spell a lone UTF-16 surrogate (``"\\ud800"``), which is no Unicode
    character: such a string cannot be encoded, tokenized or stored, so it is
    refused here, naming the string's path, before anything reads the body.
    """
    encoding = json.detect_encoding(body)
    if encoding not in ("utf-8", "utf-8-sig"):  # the stdlib's parser would read it
        raise CodecError(f"body must be JSON in UTF-8 (RFC 8259), not {encoding}")
    try:
        value = fastjson.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise CodecError(f"body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise CodecError(f"body must be a JSON object, not {type_name(value)}")
    # Only an escape, or bytes that are no UTF-8 (which the stdlib's parser lets through
    # as surrogates), can spell one: walk only bodies with either.
    if _MAY_SPELL_A_SURROGATE.search(body):
        at = invalid_text(value)
        if at is not None:
            raise CodecError(
                "invalid text: a lone UTF-16 surrogate (\\ud800-\\udfff) is not a character",
                field=at,
            )
    return value


def invalid_text(value: Any) -> str | None:
    """The JSON path of the first string (or key) that is not valid Unicode, or None."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if not _encodable(item):
                return path
        elif isinstance(item, dict):
            for key, child in item.items():
                if not _encodable(key):
                    return join(path, key.encode("utf-8", "backslashreplace").decode())
                stack.append((join(path, key), child))
        elif isinstance(item, list):
            stack.extend((join(path, i), child) for i, child in enumerate(item))
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def dumps(value: Any) -> str:
    """Compact JSON text, non-ASCII kept as is (the form used on every wire)."""
    return fastjson.dumps(value)


def join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def wrong_type(expected: str, value: Any, *, path: str) -> CodecError:
    return CodecError(f"expected {expected}, got {type_name(value)}", field=path)


def as_object(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise wrong_type("an object", value, path=path)
    return value


def as_list(value: Any, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise wrong_type("an array", value, path=path)
    return value


def as_str(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise wrong_type("a string", value, path=path)
    return value


def required(obj: dict[str, Any], key: str, *, path: str) -> Any:
    value = obj.get(key, _MISSING)
    if value is _MISSING:
        raise CodecError("required field is missing", field=join(path, key))
    return value


def req_str(obj: dict[str, Any], key: str, *, path: str) -> str:
    return as_str(required(obj, key, path=path), join(path, key))


def req_list(obj: dict[str, Any], key: str, *, path: str) -> list[Any]:
    return as_list(required(obj, key, path=path), join(path, key))


def opt_str(obj: dict[str, Any], key: str, *, path: str) -> str | None:
    value = obj.get(key)
    return None if value is None else as_str(value, join(path, key))


def opt_bool(obj: dict[str, Any], key: str, *, path: str) -> bool | None:
    value = obj.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise wrong_type("a boolean", value, path=join(path, key))


def opt_int(obj: dict[str, Any], key: str, *, path: str, minimum: int | None = None) -> int | None:
    """An optional integer; below ``minimum`` is refused as the real APIs refuse it."""
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise wrong_type("an integer", value, path=join(path, key))
    if minimum is not None and value < minimum:
        raise CodecError(f"must be at least {minimum}, got {value}", field=join(path, key))
    return value


def opt_number(
    obj: dict[str, Any],
    key: str,
    *,
    path: str,
    minimum: float | None = None,
    maximum: float | None = None,
) -> float | None:
    """An optional number within [``minimum``, ``maximum``] where given (NaN never is)."""
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise wrong_type("a number", value, path=join(path, key))
    number = float(value)
    low = -math.inf if minimum is None else minimum
    high = math.inf if maximum is None else maximum
    if not low <= number <= high:  # NaN fails both comparisons
        bounds = (
            f"between {minimum:g} and {maximum:g}"
            if minimum is not None and maximum is not None
            else f"at least {minimum:g}"
            if minimum is not None
            else f"at most {maximum:g}"
            if maximum is not None
            else "a finite number"
        )
        raise CodecError(f"must be {bounds}, got {value!r}", field=join(path, key))
    return number


def opt_object(obj: dict[str, Any], key: str, *, path: str) -> dict[str, Any] | None:
    value = obj.get(key)
    return None if value is None else as_object(value, join(path, key))


def stop_list(obj: dict[str, Any], key: str, *, path: str) -> tuple[str, ...]:
    """A stop field: null, one string, or an array of strings."""
    value = obj.get(key)
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    items = as_list(value, join(path, key))
    return tuple(as_str(s, join(join(path, key), i)) for i, s in enumerate(items))


def unsupported(kind: str, value: Any, *, path: str) -> CodecError:
    shown = value if isinstance(value, str) else type_name(value)
    return CodecError(f"unsupported {kind} {shown!r}", field=path)


def rest(obj: dict[str, Any], modelled: frozenset[str]) -> dict[str, Any]:
    """The top-level fields the canonical model does not cover, kept verbatim."""
    return {k: v for k, v in obj.items() if k not in modelled}
