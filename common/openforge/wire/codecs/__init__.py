"""Wire codecs: one module per wire API, each pure (no I/O).

A codec parses the harness's request into the canonical model, builds the
response body (or the SSE stream) the real API would have sent, and, for
passthrough capture, parses an upstream's response back into the canonical
model. ``for_path`` picks the codec that serves an HTTP path;
``counter_for_path`` the one behind a token-counting path (Gemini's
``countTokens``), which tokens mode answers from the policy tokenizer.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from openforge.wire import conversation, sse


class StreamEncoder(Protocol):
    """Turns canonical stream events into one API's SSE bytes, in order.

    ``start`` returns the events that open the stream (may be b"");
    ``encode`` is called per event; the :class:`~conversation.StreamEnd`
    event produces every closing event (``[DONE]``, ``message_stop``,
    ``response.completed``...).
    """

    def start(self) -> bytes: ...

    def encode(self, event: conversation.StreamEvent) -> bytes: ...


class StreamDecoder(Protocol):
    """Turns one API's SSE events (from an upstream) into canonical events."""

    def feed(self, event: sse.Event) -> list[conversation.StreamEvent]: ...


class Codec(Protocol):
    api: conversation.WireApi
    #: HTTP paths (suffixes after any base path prefix) this codec serves.
    paths: tuple[str, ...]

    def parse_request(self, body: bytes) -> conversation.ChatRequest:
        """Parse and validate; raise CodecError naming the field at fault."""
        ...

    def build_response(
        self,
        request: conversation.ChatRequest,
        completion: conversation.Completion,
        *,
        response_id: str,
        created: int,
    ) -> dict[str, Any]: ...

    def stream_encoder(
        self,
        request: conversation.ChatRequest,
        *,
        response_id: str,
        created: int,
        prompt_tokens: int = 0,
    ) -> StreamEncoder:
        """The encoder of one answer; ``prompt_tokens`` is reported where the API
        reports usage as the stream opens (Anthropic's ``message_start``)."""
        ...

    def parse_response(self, body: bytes) -> conversation.Completion: ...

    def stream_decoder(self) -> StreamDecoder: ...

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        """The error JSON the real API returns for this status."""
        ...

    def tool_call_id(self, seed: str) -> str:
        """A tool-call id in this API's own style (``call_…``, ``toolu_…``)."""
        ...


class TokenCounter(Protocol):
    """A wire API's token-counting endpoint: no model call, just a count."""

    def parse_count_request(self, body: bytes) -> conversation.ChatRequest:
        """Parse and validate; raise CodecError naming the field at fault."""
        ...

    def count_response(self, total_tokens: int) -> dict[str, Any]: ...

    def error_body(self, status: int, message: str) -> dict[str, Any]: ...


def all_codecs() -> list[Codec]:
    from openforge.wire.codecs import anthropic_messages, gemini, openai_chat, openai_responses

    return [openai_chat.CODEC, openai_responses.CODEC, anthropic_messages.CODEC, gemini.CODEC]


#: Which codec module serves a path, by how the path ends (query and trailing
#: slashes aside). A module is imported when a request first needs it: one
#: harness speaks one API, and each codec module is ~0.2-1.6 MB resident.
SUFFIXES = (
    ("/chat/completions", "openai_chat"),
    ("/responses", "openai_responses"),
    ("/messages", "anthropic_messages"),
)
#: Gemini names the model and the method in the path's last segment.
GEMINI_METHODS = (":generateContent", ":streamGenerateContent", ":countTokens")


def for_path(path: str) -> Codec | None:
    """The codec serving ``path``, or None.

    Gemini names the model and the method in the path (and streaming in
    the query), so its codec comes bound to the path; for the others the
    query string is ignored.
    """
    bare = path.split("?", 1)[0].rstrip("/")
    if bare.endswith(GEMINI_METHODS):
        return _module("gemini").for_path(path)  # type: ignore[no-any-return]
    for suffix, name in SUFFIXES:
        if bare.endswith(suffix):
            return _module(name).CODEC  # type: ignore[no-any-return]
    return None


def counter_for_path(path: str) -> TokenCounter | None:
    """The token counter serving ``path`` (Gemini's ``:countTokens``), or None."""
    if not path.split("?", 1)[0].rstrip("/").endswith(GEMINI_METHODS[-1]):
        return None
    return _module("gemini").counter_for_path(path)  # type: ignore[no-any-return]


def for_api(api: conversation.WireApi) -> Codec:
    """The codec of ``api`` (Gemini's unbound to a model: for reading stored bodies)."""
    return _module(api.value).CODEC  # type: ignore[no-any-return]


def _module(name: str) -> Any:
    return importlib.import_module(f"openforge.wire.codecs.{name}")
