"""Passthrough capture: watch an upstream's answer go by without touching it.

A :class:`Tee` is the ``flow.response.stream`` callable in passthrough mode.
It returns every chunk unchanged (the harness gets the upstream's bytes,
still compressed if they were), and on the side decompresses and parses the
body into the canonical model, plus whatever token IDs and logprobs the
upstream reported (vLLM's ``return_token_ids`` on Chat Completions).
"""

from __future__ import annotations

import json
import zlib
from typing import Any, Protocol

import brotli  # type: ignore[import-untyped]
import zstandard
from openforge.wire import conversation, sse
from openforge.wire.codecs import Codec, StreamDecoder
from openforge.wire.codecs.errors import CodecError


class _Decompressor(Protocol):
    def decompress(self, data: bytes) -> bytes: ...


class _Identity:
    def decompress(self, data: bytes) -> bytes:
        return data


def decompressor(content_encoding: str) -> _Decompressor:
    """A streaming decompressor for a Content-Encoding header value."""
    encoding = content_encoding.strip().lower()
    if encoding in ("", "identity"):
        return _Identity()
    if encoding in ("gzip", "x-gzip", "deflate"):
        return zlib.decompressobj(47)  # 32 + 15: auto-detect gzip or zlib
    if encoding == "br":
        return brotli.Decompressor()  # type: ignore[no-any-return]
    if encoding == "zstd":
        return zstandard.ZstdDecompressor().decompressobj()
    raise ValueError(f"unsupported Content-Encoding {content_encoding!r}")


def _collect_tokens(body: Any, tokens: list[int], *, logprobs: list[float]) -> list[int] | None:
    """Token IDs / logprobs from a Chat Completions body or chunk, if present."""
    prompt_ids = body.get("prompt_token_ids") if isinstance(body, dict) else None
    for choice in body.get("choices") or [] if isinstance(body, dict) else []:
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        tokens.extend(int(t) for t in choice.get("token_ids") or [])
        content = (choice.get("logprobs") or {}).get("content") or []
        logprobs.extend(
            float(item.get("logprob", 0.0)) for item in content if isinstance(item, dict)
        )
    return [int(t) for t in prompt_ids] if isinstance(prompt_ids, list) else None


class Tee:
    def __init__(self, *, codec: Codec, streamed: bool, content_encoding: str) -> None:
        self._codec = codec
        self._streamed = streamed
        self._decompress = decompressor(content_encoding)
        self._sse = sse.SSEParser()
        self._decoder: StreamDecoder = codec.stream_decoder()
        self._buffer = bytearray()
        self.events: list[conversation.StreamEvent] = []
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.prompt_ids: list[int] | None = None
        self.completion: conversation.Completion | None = None
        self.error: str | None = None
        self.done = False

    def __call__(self, data: bytes) -> bytes:
        if self.done:
            return data
        try:
            if data:
                self._take(self._decompress.decompress(data))
            else:
                self._finish()
        except Exception as exc:  # the harness must get its bytes regardless
            self.error = f"capture failed: {exc}"
            self.done = True
        return data

    def _take(self, plain: bytes) -> None:
        if not self._streamed:
            self._buffer += plain
            return
        for event in self._sse.feed(plain):
            self.events.extend(self._decoder.feed(event))  # [DONE] included: it ends Chat streams
            try:
                chunk = json.loads(event.data)
            except ValueError:
                continue
            prompt = _collect_tokens(chunk, self.token_ids, logprobs=self.logprobs)
            self.prompt_ids = prompt or self.prompt_ids

    def _finish(self) -> None:
        self.done = True
        if self._streamed:
            if not any(isinstance(e, conversation.StreamEnd) for e in self.events):
                self.error = "upstream stream ended before its final event (truncated)"
            self.completion = conversation.assemble(self.events)
            return
        try:
            self.completion = self._codec.parse_response(bytes(self._buffer))
            self.prompt_ids = _collect_tokens(
                json.loads(self._buffer), self.token_ids, logprobs=self.logprobs
            )
        except (CodecError, ValueError) as exc:
            self.error = f"upstream body not understood: {exc}"

    @property
    def response_json(self) -> bytes:
        if not self._streamed:
            return bytes(self._buffer)
        return b""
