"""The images a stored request carries, in the order the policy's prompt shows them.

The sidecar records every request body exactly as the harness sent it, so an
image (a ``data:`` URL with the PNG's base64, or an Anthropic/Gemini base64
source) is in the store bit for bit. It renders each image part into the
prompt as the chat template's image placeholder (``<image>``, one token in
the tiny tokenizer): the *n*-th placeholder in a call's prompt tokens is the
*n*-th image this module returns for that call's request.

The order follows the sidecar's codecs: messages in order; in an Anthropic
``user`` turn or a Gemini ``user`` content, the tool results (with any images
inside them) come first, then the turn's other parts, because that is how the
codecs split such a turn into ``tool`` messages and a ``user`` message.
Images are returned as URLs: ``data:<media type>;base64,<data>`` for inline
data (the codecs' own form), the URL as sent otherwise. :func:`image_bytes`
decodes a data URL.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any


class ImageError(ValueError):
    """A request's image cannot be read (names the JSON path at fault)."""


def request_images(wire_api: str, request_json: bytes) -> list[str]:
    """The image URLs of one stored request (``wire_api`` as the store names it)."""
    if not request_json:
        return []
    try:
        body = json.loads(request_json)
    except ValueError as error:
        raise ImageError(f"request body is not JSON: {error}") from error
    if not isinstance(body, dict):
        return []
    reader = _READERS.get(wire_api.removeprefix("WIRE_API_").lower())
    return reader(body) if reader is not None else []


def image_bytes(url: str) -> bytes:
    """The bytes of a base64 ``data:`` URL, exactly as encoded."""
    head, sep, data = url.partition(",")
    if not (url.startswith("data:") and sep and head.endswith(";base64")):
        raise ImageError(f"not a base64 data: URL: {url[:60]!r}")
    try:
        return base64.b64decode(data, validate=True)
    except binascii.Error as error:
        raise ImageError(f"bad base64 in data: URL ({error})") from error


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in _list(value) if isinstance(item, dict)]


# --- OpenAI Chat Completions ---------------------------------------------------------


def _openai_chat(body: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for message in _dicts(body.get("messages")):
        for part in _dicts(message.get("content")):
            if part.get("type") == "image_url":
                image = part.get("image_url")
                url = image.get("url") if isinstance(image, dict) else image
                if isinstance(url, str):
                    out.append(url)
    return out


# --- OpenAI Responses -----------------------------------------------------------------


def _openai_responses(body: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for item in _dicts(body.get("input")):
        content = item.get("output") if item.get("type") == "function_call_output" else item.get("content")
        for part in _dicts(content):
            if part.get("type") == "input_image" and isinstance(part.get("image_url"), str):
                out.append(part["image_url"])
    return out


# --- Anthropic Messages ----------------------------------------------------------------


def _anthropic_image(block: dict[str, Any]) -> str | None:
    source = block.get("source")
    if not isinstance(source, dict):
        return None
    if source.get("type") == "base64":
        return f"data:{source.get('media_type')};base64,{source.get('data')}"
    url = source.get("url")
    return url if isinstance(url, str) else None


def _anthropic_messages(body: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for message in _dicts(body.get("messages")):
        blocks = _dicts(message.get("content"))
        results = [b for b in blocks if b.get("type") == "tool_result"]
        nested = [p for r in results for p in _dicts(r.get("content")) if p.get("type") == "image"]
        direct = [b for b in blocks if b.get("type") == "image"]
        out += [url for url in map(_anthropic_image, nested + direct) if url is not None]
    return out


# --- Gemini ----------------------------------------------------------------------------


def _gemini_image(part: dict[str, Any]) -> str | None:
    inline = part.get("inlineData", part.get("inline_data"))
    if isinstance(inline, dict):
        mime = inline.get("mimeType", inline.get("mime_type"))
        return f"data:{mime};base64,{inline.get('data')}"
    file = part.get("fileData", part.get("file_data"))
    if isinstance(file, dict):
        uri = file.get("fileUri", file.get("file_uri"))
        return uri if isinstance(uri, str) else None
    return None


def _gemini(body: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for content in _dicts(body.get("contents")):
        parts = _dicts(content.get("parts"))
        responses = [p.get("functionResponse", p.get("function_response")) for p in parts]
        nested = [q for r in responses if isinstance(r, dict) for q in _dicts(r.get("parts"))]
        out += [url for url in map(_gemini_image, nested + parts) if url is not None]
    return out


_READERS = {
    "openai_chat": _openai_chat,
    "openai_responses": _openai_responses,
    "anthropic_messages": _anthropic_messages,
    "gemini": _gemini,
}
