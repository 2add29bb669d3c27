"""Relays the engine's token stream to the harness in the harness's wire API.

A :class:`Relay` is the callable mitmproxy runs on each chunk of the engine's
response (``flow.response.stream``): it parses the engine's SSE, keeps every
token ID and logprob, detokenizes incrementally, parses reasoning and tool
calls out of the text, and returns the bytes of the harness's own events for
those tokens at once, so tokens reach the harness as they are generated. For
a harness that asked for no stream it returns nothing until the end, then the
whole JSON body. An engine answer that fails ends a stream with the API's error
event and leaves ``error`` set. It does no I/O; what it gathered is read once it
is done.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable

from openforge.wire import conversation, fastjson, sse
from openforge.wire.codecs import Codec

from openforge_sidecar.policy import echo, engine, stored, template, toolparse


class Relay:
    def __init__(
        self,
        *,
        codec: Codec,
        request: conversation.ChatRequest,
        detokenizer: template.IncrementalDetokenizer,
        stop_token_ids: frozenset[int],
        prompt_ids: stored.Ids,
        response_id: str,
        created: int,
        clock: Callable[[], float] = time.monotonic,
        sign: Callable[[str], str] | None = None,
    ) -> None:
        self._codec = codec
        self._request = request
        self._detokenizer = detokenizer
        self._stop_token_ids = stop_token_ids
        self._prompt_ids = prompt_ids
        self._prompt_tokens = prompt_tokens = len(prompt_ids)
        self._response_id = response_id
        self._created = created
        self._clock = clock
        self._sign = sign
        self._reasoning: list[str] = []  # the open reasoning block's text, to sign at its end
        # the engine's echo of the prompt, compared with it as the bytes come
        self._echo = echo.EchoCutter(lambda: echo.Compared(prompt_ids))
        self._sse = sse.SSEParser()
        self._parser = toolparse.OutputParser(
            lambda index: codec.tool_call_id(f"{response_id}/{index}")
        )
        self._encoder = (
            codec.stream_encoder(
                request, response_id=response_id, created=created, prompt_tokens=prompt_tokens
            )
            if request.stream
            else None
        )
        self._started = False
        self.events: list[conversation.StreamEvent] = []
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.engine_finish_reason: str | None = None
        self.echo_matches: bool | None = None  # None: no echo, or not compared
        self.echo_unread: str | None = None  # why the echo could not be compared
        self.error: str | None = None
        self.done = False
        self.first_output_at: float | None = None
        self._completion: conversation.Completion | None = None
        self._final_events: list[conversation.StreamEvent] | None = None  # once done
        self._response_json: bytes | None = None
        self._answered = False  # the stream ended well: the body can be built

    @property
    def completion(self) -> conversation.Completion | None:
        """The whole answer, once the stream is done (assembled when first read)."""
        if self._completion is None and self._final_events is not None:
            self._completion = conversation.assemble(self._final_events)
        return self._completion

    @property
    def response_json(self) -> bytes:
        """The non-streamed body equivalent to what the harness received (once done).

        For a streamed answer it is built when first read, which is when the
        call is recorded, after the harness has the end of its stream.
        """
        if self._response_json is None:
            completion = self.completion
            if not self._answered or completion is None:
                return b""
            body = self._codec.build_response(
                self._request, completion, response_id=self._response_id, created=self._created
            )
            self._response_json = fastjson.dumps_bytes(body)
        return self._response_json

    def __call__(self, data: bytes) -> bytes:
        """Relay some of the engine's stream; empty ``data`` ends it."""
        if self.done:
            return b""
        if not data:
            return self._finish()
        out: list[bytes] = []
        for event in self._sse.feed(self._echo.feed(data)):
            if event.data.strip() == "[DONE]":
                continue
            try:
                chunk = engine.parse_chunk(event.data)
            except engine.EngineError as exc:
                self.error = str(exc)
                continue
            out.append(self._take(chunk))
        if self._echo.error is not None:
            self.error = self._echo.error
        return self._emit(b"".join(out))

    def whole(self, stream: bytes) -> bytes:
        """``self(stream) + self(b"")``: the answer to the engine's whole stream (a
        non-streamed call's)."""
        return self(stream) + self(b"")

    def _take(self, chunk: engine.EngineChunk) -> bytes:
        if chunk.prompt_token_ids is not None and self._echo.error is None:
            self._check_echo(chunk.prompt_token_ids)
        if chunk.finish_reason is not None:
            self.engine_finish_reason = chunk.finish_reason
        if not chunk.token_ids:
            return b""
        ids = chunk.token_ids
        self.token_ids += ids
        self.logprobs += chunk.logprobs
        # Stop tokens end the turn; their text is not part of the answer.
        stops, push = self._stop_token_ids, self._detokenizer.push
        if len(ids) == 1:  # one token a chunk, as engines stream
            text = "" if ids[0] in stops else push(ids[0])
        else:
            text = "".join(push(t) for t in ids if t not in stops)
        return self._encode(self._parser.feed(text))

    def _check_echo(self, parsed: array[int]) -> None:
        """Whether the engine's echo is the planned prompt: as the cutter compared it, or
        (a short echo left in the chunk) as parsed; unknown when the planned IDs could
        not be read (their file gone), which must not fail the harness's answer."""
        cut = self._echo.take()
        if isinstance(cut, echo.Compared):
            self.echo_matches = cut.equal if cut.unread is None else None
            self.echo_unread = cut.unread
            return
        try:
            self.echo_matches = stored.same(parsed, self._prompt_ids)
        except OSError as exc:
            self.echo_unread = f"the planned prompt's IDs could not be read: {exc}"

    def _encode(self, events: list[conversation.StreamEvent]) -> bytes:
        if self._sign is not None:
            events = self._signed(events)
        self.events += events
        encoder = self._encoder
        if encoder is None or not events:
            return b""
        head = b""
        if not self._started:
            self._started = True
            head = encoder.start()
        if len(events) == 1:
            return head + encoder.encode(events[0])
        return head + b"".join(encoder.encode(e) for e in events)

    def _signed(self, events: list[conversation.StreamEvent]) -> list[conversation.StreamEvent]:
        """``events`` with a :class:`~conversation.ReasoningSignature` after each block of
        reasoning, before the first event that is not reasoning (see policy.signatures)."""
        out: list[conversation.StreamEvent] = []
        for event in events:
            if isinstance(event, conversation.ReasoningDelta):
                self._reasoning.append(event.text)
            elif self._reasoning:
                assert self._sign is not None
                out.append(conversation.ReasoningSignature(self._sign("".join(self._reasoning))))
                self._reasoning = []
            out.append(event)
        return out

    def fail(self, reason: str) -> bytes:
        """End a stream the engine broke off: what is left of the answer, then the API's
        error event (``reason`` kept as :attr:`error`)."""
        if self.done:
            return b""
        if self.error is None:
            self.error = reason
        return self._finish()

    def _finish(self) -> bytes:
        self.done = True
        if self.engine_finish_reason is None and self.error is None:
            self.error = "engine stream ended before its finish_reason (truncated)"
        tail = self._parser.feed(self._detokenizer.flush())
        reason = self.engine_finish_reason or "error"
        closing = self._parser.finish(reason if reason in ("stop", "length") else "stop")
        usage = conversation.Usage(self._prompt_tokens, len(self.token_ids))
        if self.error is not None:
            # A stream ends with the API's own error event (its SDK raises on it)
            # rather than a silently shortened answer; a harness that asked for one
            # body gets nothing here and is answered with the API's error object.
            out = self._encode([*tail, conversation.StreamEnd("error", usage)])
            self._final_events = self.events
            return self._emit(out)
        closing = [
            conversation.StreamEnd(e.finish_reason, usage)
            if isinstance(e, conversation.StreamEnd)
            else e
            for e in closing
        ]
        out = self._encode([*tail, *closing])
        self._final_events = self.events
        self._answered = True
        return self._emit(out if self._encoder is not None else self.response_json)

    def _emit(self, out: bytes) -> bytes:
        if out and self.first_output_at is None:
            self.first_output_at = self._clock()
        return out
