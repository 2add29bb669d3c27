"""Hypothesis strategies and helpers shared by the codec tests.

Completions are generated in the shapes each wire API can carry: Chat holds
reasoning, then text, then tool calls; Responses and Anthropic hold any
sequence of items/blocks. Adjacent text (or reasoning) parts never occur,
since a stream folds them into one part.
"""

from __future__ import annotations

import itertools
import json
import string
from collections.abc import Callable, Iterator
from typing import Any

import httpx
from hypothesis import strategies as st
from openforge.wire import conversation as conv
from openforge.wire import sse
from openforge.wire.codecs import Codec, fields

texts = st.text(min_size=1, max_size=40)
names = st.text(alphabet=string.ascii_letters + "_", min_size=1, max_size=12)
call_ids = st.text(alphabet=string.ascii_letters + string.digits + "_", min_size=1, max_size=20)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
arguments = st.dictionaries(st.text(max_size=6), json_values, max_size=4).map(fields.dumps)
usages = st.builds(conv.Usage, st.integers(0, 10**6), st.integers(0, 10**6))


def tool_calls(custom_names: tuple[str, ...] = ()) -> st.SearchStrategy[conv.ToolCallPart]:
    plain = st.builds(conv.ToolCallPart, call_ids, names, arguments)
    if not custom_names:
        return plain
    custom = st.builds(
        conv.ToolCallPart,
        call_ids,
        st.sampled_from(custom_names),
        texts.map(lambda t: fields.dumps({"input": t})),
    )
    return plain | custom


@st.composite
def _finish(draw: st.DrawFn, parts: tuple[conv.Part, ...]) -> conv.Completion:
    has_calls = any(isinstance(p, conv.ToolCallPart) for p in parts)
    choices: list[conv.FinishReason] = ["tool_calls", "length"] if has_calls else ["stop", "length"]
    finish = draw(st.sampled_from(choices))
    return conv.Completion(conv.Message("assistant", parts), finish, draw(usages))


def _call_id(call: conv.ToolCallPart) -> str:
    return call.id


@st.composite
def chat_completions(draw: st.DrawFn) -> conv.Completion:
    parts: list[conv.Part] = []
    if draw(st.booleans()):
        parts.append(conv.ReasoningPart(draw(texts)))
    if draw(st.booleans()):
        parts.append(conv.TextPart(draw(texts)))
    calls: list[conv.ToolCallPart] = draw(st.lists(tool_calls(), max_size=3, unique_by=_call_id))
    parts.extend(calls)
    return draw(_finish(tuple(parts)))


@st.composite
def sequenced_completions(
    draw: st.DrawFn, custom_names: tuple[str, ...] = (), signatures: bool = False
) -> conv.Completion:
    """Any order of text, reasoning and tool calls (Responses items, Anthropic blocks)."""
    kinds = draw(st.lists(st.sampled_from(["text", "reasoning", "call"]), max_size=6))
    parts: list[conv.Part] = []
    used_ids: set[str] = set()
    for kind in kinds:
        last = parts[-1] if parts else None
        if kind == "text" and not isinstance(last, conv.TextPart):
            parts.append(conv.TextPart(draw(texts)))
        elif kind == "reasoning" and not isinstance(last, conv.ReasoningPart):
            signature = draw(st.none() | st.text(min_size=1, max_size=20)) if signatures else None
            parts.append(conv.ReasoningPart(draw(texts), signature))
        elif kind == "call":
            call = draw(tool_calls(custom_names))
            if call.id not in used_ids:
                used_ids.add(call.id)
                parts.append(call)
    return draw(_finish(tuple(parts)))


@st.composite
def _chunks(draw: st.DrawFn, text: str) -> list[str]:
    """``text`` cut into non-empty pieces at random points."""
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=4)))
    bounds = [0, *[c for c in cuts if c < len(text)], len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if a < b]


@st.composite
def events_for(draw: st.DrawFn, completion: conv.Completion) -> list[conv.StreamEvent]:
    """Stream events that ``assemble`` folds back into ``completion``."""
    events: list[conv.StreamEvent] = []
    calls = 0
    for part in completion.message.parts:
        if isinstance(part, conv.TextPart):
            events += [conv.TextDelta(t) for t in draw(_chunks(part.text))]
        elif isinstance(part, conv.ReasoningPart):
            events += [conv.ReasoningDelta(t) for t in draw(_chunks(part.text))]
        elif isinstance(part, conv.ToolCallPart):
            events.append(conv.ToolCallStart(calls, part.id, part.name))
            pieces = draw(_chunks(part.arguments)) if part.arguments else []
            events += [conv.ToolCallArgumentsDelta(calls, a) for a in pieces]
            calls += 1
    events.append(conv.StreamEnd(completion.finish_reason, completion.usage))
    return events


@st.composite
def byte_cuts(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """``data`` cut into chunks anywhere, even inside a UTF-8 sequence."""
    cuts = sorted(draw(st.sets(st.integers(0, len(data)), max_size=8)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def encode_stream(
    codec: Codec,
    request: conv.ChatRequest,
    events: list[conv.StreamEvent],
    response_id: str = "resp_1",
) -> bytes:
    encoder = codec.stream_encoder(request, response_id=response_id, created=1700000000)
    return encoder.start() + b"".join(encoder.encode(e) for e in events)


def decode_stream(codec: Codec, chunks: list[bytes]) -> list[conv.StreamEvent]:
    parser = sse.SSEParser()
    decoder = codec.stream_decoder()
    out: list[conv.StreamEvent] = []
    for chunk in chunks:
        for event in parser.feed(chunk):
            out += decoder.feed(event)
    parser.close()
    return out


# --- driving the official SDKs against our bytes ---------------------------

Handler = Callable[[httpx.Request], httpx.Response]
Reply = Callable[[conv.ChatRequest], httpx.Response]


def mock_client(handler: Handler) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(handler))


def json_response(body: dict[str, Any]) -> httpx.Response:
    return httpx.Response(
        200, content=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )


def sse_response(data: bytes, chunk: int = 7) -> httpx.Response:
    """An SSE response delivered in small chunks, as a real socket would."""

    def pieces() -> Iterator[bytes]:
        for i in range(0, len(data), chunk):
            yield data[i : i + chunk]

    return httpx.Response(200, content=pieces(), headers={"content-type": "text/event-stream"})
