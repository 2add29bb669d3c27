"""The images a stored request carries, in the order the policy's prompt shows them.

The sidecar records every request body exactly as the harness sent it, so an
image (a ``data:`` URL with the PNG's base64, or an Anthropic/Gemini base64
source) is in the store bit for bit. The sidecar renders each image part into
the prompt as the chat template's image placeholder (``<image>``, one token in
the tiny tokenizer): the *n*-th placeholder in a call's prompt tokens is the
*n*-th image this module returns for that call's request.

The request is read by the same codec the sidecar parsed it with
(:mod:`openforge.wire.codecs`), so the order is the canonical conversation's:
messages in order, each message's parts in order, a tool result's images
inside the result (an Anthropic ``user`` turn or a Gemini ``user`` content is
split into its tool results first, then the rest of the turn, as the template
sees it). Images are returned as URLs: ``data:<media type>;base64,<data>`` for
inline data, the URL as sent otherwise. :func:`image_bytes` decodes a data URL.
"""

from __future__ import annotations

import base64
import binascii

from openforge.wire import codecs, conversation
from openforge.wire.codecs.errors import CodecError


class ImageError(ValueError):
    """A request's image cannot be read (names the JSON path at fault)."""


def request_images(wire_api: str, request_json: bytes) -> list[str]:
    """The image URLs of one stored request (``wire_api`` as the store names it)."""
    if not request_json:
        return []
    try:
        api = conversation.WireApi.from_proto_name(wire_api)
    except ValueError:
        return []  # WIRE_API_UNSPECIFIED: no codec, no images
    try:
        request = codecs.for_api(api).parse_request(request_json)
    except CodecError as error:
        raise ImageError(f"request_json: {error}") from error
    return [image.url for message in request.messages for image in _images(message.parts)]


def image_bytes(url: str) -> bytes:
    """The bytes of a base64 ``data:`` URL, exactly as encoded."""
    head, sep, data = url.partition(",")
    if not (url.startswith("data:") and sep and head.endswith(";base64")):
        raise ImageError(f"not a base64 data: URL: {url[:60]!r}")
    try:
        return base64.b64decode(data, validate=True)
    except binascii.Error as error:
        raise ImageError(f"bad base64 in data: URL ({error})") from error


def _images(parts: tuple[conversation.Part, ...]) -> list[conversation.ImagePart]:
    out: list[conversation.ImagePart] = []
    for part in parts:
        if isinstance(part, conversation.ImagePart):
            out.append(part)
        elif isinstance(part, conversation.ToolResultPart):
            out += [p for p in part.content if isinstance(p, conversation.ImagePart)]
    return out
