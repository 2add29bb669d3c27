"""Credentials never reach a record: which headers, query keys and body fields to keep.

Headers are an allow-list: a header this module does not know to be safe keeps its name
and loses its value (``[redacted]``), so that a credential under a name nobody listed
(``openai-api-key``, ``x-auth-token``, a gateway's own) is never stored. Request bodies
keep every field but the top-level ones that carry credentials in some client
(``api_key``, ``access_token`` and their spellings); the conversation inside is content,
and is kept as the harness sent it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from urllib.parse import parse_qsl, urlencode

SAFE_HEADERS = frozenset(
    {
        "accept",
        "accept-encoding",
        "accept-language",
        "anthropic-beta",
        "anthropic-version",
        "cache-control",
        "connection",
        "content-encoding",
        "content-length",
        "content-type",
        "host",
        "openai-beta",
        "originator",
        "priority",
        "te",
        "traceparent",
        "transfer-encoding",
        "user-agent",
        "x-goog-api-client",
        "x-request-id",
    }
)
"""Headers kept verbatim: what they say is about the client and the request, never who it is."""
SAFE_HEADER_PREFIXES = ("x-stainless-",)
"""The OpenAI and Anthropic SDKs' own descriptions of themselves (language, version, retry
count)."""
SECRET_QUERY_KEYS = frozenset({"key", "api_key", "apikey", "access_token", "token"})
SECRET_BODY_FIELDS = frozenset(
    {
        "apikey",
        "accesstoken",
        "authorization",
        "clientsecret",
        "password",
        "refreshtoken",
        "secret",
        "token",
        "idtoken",
        "sessiontoken",
    }
)
"""Top-level request fields that carry a credential, by their name lowercased without ``_`` and
``-``."""
REDACTED = "[redacted]"


def safe_header(name: str) -> bool:
    """Whether a header's value is kept (``name`` lowercased)."""
    return name in SAFE_HEADERS or name.startswith(SAFE_HEADER_PREFIXES)


def headers(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Every header's name, with its value unless the header is not known to be safe."""
    kept: dict[str, str] = {}
    for name, value in items:
        lower = name.lower()
        kept[lower] = value if safe_header(lower) else REDACTED
    return kept


def secret_field(name: str) -> bool:
    """Whether a top-level request field carries a credential."""
    return name.lower().replace("_", "").replace("-", "") in SECRET_BODY_FIELDS


def body(raw: bytes, fields: Iterable[str] | None = None) -> bytes:
    """A request body with the values of its top-level credential fields redacted; the
    bytes unchanged when it has none. ``fields`` are the top-level fields the codec did
    not model (``ChatRequest.extra``: where a credential would be), which decides without
    reading the body again; without them (a body the codec refused, a rare path) the
    body is parsed to see."""
    if fields is not None and not any(secret_field(name) for name in fields):
        return raw
    try:
        parsed = json.loads(raw)
    except ValueError:
        return raw  # not JSON: the codec refused it, and it is stored as it came
    if not isinstance(parsed, dict):
        return raw
    secret = [key for key in parsed if secret_field(key)]
    if not secret:
        return raw
    for key in secret:
        parsed[key] = REDACTED
    return json.dumps(parsed, ensure_ascii=False, separators=(",", ":")).encode()


def header_fields(fields: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """:func:`headers` of raw ``(name, value)`` byte pairs, as mitmproxy holds them.

    Gives what ``headers(flow.request.headers.items())`` gives (names matched
    without regard to ASCII case, repeated headers folded with ", ", bytes
    read as UTF-8 with surrogate escapes) in one pass: mitmproxy's
    ``items()`` looks each name up again across all fields, ~70 µs a request.
    """
    folded: dict[bytes, tuple[bytes, list[bytes]]] = {}
    for name, value in fields:
        key = name.lower()
        if key in folded:
            folded[key][1].append(value)
        else:
            folded[key] = (name, [value])
    return headers(
        (_text(name), ", ".join(_text(value) for value in values))
        for name, values in folded.values()
    )


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def path(raw: str) -> str:
    """A request path with credential query parameters redacted."""
    base, sep, query = raw.partition("?")
    if not sep:
        return raw
    pairs = [
        (k, REDACTED if k.lower() in SECRET_QUERY_KEYS else v)
        for k, v in parse_qsl(query, keep_blank_values=True)
    ]
    return f"{base}?{urlencode(pairs)}"
