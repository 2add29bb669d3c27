from __future__ import annotations

import base64
import contextlib
import json
import re
from typing import Any

import httpx
import openai
import pytest
from codec_strategies import (
    Reply,
    byte_cuts,
    chat_completions,
    decode_stream,
    encode_stream,
    events_for,
    json_response,
    json_values,
    mock_client,
    sse_response,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from openforge.wire import conversation as conv
from openforge.wire import sse
from openforge.wire.codecs import for_path, openai_chat
from openforge.wire.codecs.errors import CodecError

CODEC = openai_chat.CODEC
PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(256))).decode()


def _request(**extra: Any) -> conv.ChatRequest:
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], **extra}
    return CODEC.parse_request(json.dumps(body).encode())


USAGE_REQUEST = _request(stream=True, stream_options={"include_usage": True})


# --- properties ---------------------------------------------------------------


@settings(deadline=None)  # a shared 2-core machine makes timings noisy
@given(st.data())
def test_stream_decodes_to_the_encoded_completion(data: st.DataObject) -> None:
    completion = data.draw(chat_completions())
    events = data.draw(events_for(completion))
    wire = encode_stream(CODEC, USAGE_REQUEST, events)
    assert conv.assemble(decode_stream(CODEC, data.draw(byte_cuts(wire)))) == completion


@settings(deadline=None)  # a shared 2-core machine makes timings noisy
@given(chat_completions())
def test_json_body_parses_back_to_the_completion(completion: conv.Completion) -> None:
    body = CODEC.build_response(USAGE_REQUEST, completion, response_id="chatcmpl-1", created=1)
    assert CODEC.parse_response(json.dumps(body).encode()) == completion


@settings(deadline=None)  # a shared 2-core machine makes timings noisy
@given(st.data())
def test_a_stream_cut_before_its_end_never_ends(data: st.DataObject) -> None:
    completion = data.draw(chat_completions())
    wire = encode_stream(CODEC, USAGE_REQUEST, data.draw(events_for(completion)))
    cut = data.draw(st.integers(0, len(wire) - 1))
    events = decode_stream(CODEC, data.draw(byte_cuts(wire[:cut])))
    assert not any(isinstance(e, conv.StreamEnd) for e in events)


@settings(deadline=None)  # a shared 2-core machine makes timings noisy
@given(st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()))
def test_parse_request_raises_only_codec_errors(body: bytes) -> None:
    with contextlib.suppress(CodecError):
        CODEC.parse_request(body)


_keys = st.sampled_from(
    ["model", "messages", "role", "content", "type", "text", "image_url", "url", "tool_calls",
     "function", "name", "arguments", "tool_call_id", "tools", "tool_choice", "stop", "id"]
)  # fmt: skip
_shaped = st.recursive(
    st.none()
    | st.text(max_size=5)
    | st.integers()
    | st.sampled_from(["user", "assistant", "tool", "text"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=5),
    max_leaves=20,
)


@settings(deadline=None)  # a shared 2-core machine makes timings noisy
@given(_shaped)
def test_parse_request_of_near_miss_shapes_raises_only_codec_errors(value: Any) -> None:
    try:
        CODEC.parse_request(json.dumps(value).encode())
    except CodecError as exc:
        assert isinstance(exc.field, str)


@settings(deadline=None)  # a shared 2-core machine makes timings noisy
@given(st.lists(json_values, max_size=5))
def test_stream_decoder_raises_only_codec_errors(values: list[Any]) -> None:
    decoder = CODEC.stream_decoder()
    for value in values:
        with contextlib.suppress(CodecError):
            decoder.feed(sse.Event(json.dumps(value)))


# --- wire details ---------------------------------------------------------------


def test_stream_without_include_usage_has_no_usage_chunk() -> None:
    request = _request(stream=True)
    events: list[conv.StreamEvent] = [
        conv.TextDelta("ok"),
        conv.StreamEnd("stop", conv.Usage(5, 1)),
    ]
    wire = encode_stream(CODEC, request, events)
    chunks = [json.loads(e.data) for e in sse.SSEParser().feed(wire) if e.data != "[DONE]"]
    assert all("usage" not in c for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert wire.endswith(b"data: [DONE]\n\n")


def test_natural_stop_after_tool_calls_is_reported_as_tool_calls() -> None:
    call = conv.ToolCallPart("call_1", "f", "{}")
    completion = conv.Completion(conv.Message("assistant", (call,)), "stop")
    body = CODEC.build_response(USAGE_REQUEST, completion, response_id="c", created=1)
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert body["choices"][0]["message"]["content"] is None


def test_a_failed_stream_ends_with_an_error_chunk_the_decoder_reads_as_error() -> None:
    wire = encode_stream(CODEC, USAGE_REQUEST, [conv.TextDelta("par"), conv.StreamEnd("error")])
    assert b"[DONE]" not in wire
    events = decode_stream(CODEC, [wire])
    assert events[-1] == conv.StreamEnd("error")


def test_tool_call_ids_are_openai_style_and_deterministic() -> None:
    first = CODEC.tool_call_id("seed-1")
    assert re.fullmatch(r"call_[0-9a-f]{24}", first)
    assert first == CODEC.tool_call_id("seed-1") != CODEC.tool_call_id("seed-2")


@pytest.mark.parametrize(
    ("path", "api"),
    [
        ("/v1/chat/completions", conv.WireApi.OPENAI_CHAT),
        ("/openai/v1/chat/completions/?x=1", conv.WireApi.OPENAI_CHAT),
        ("/v1/responses", conv.WireApi.OPENAI_RESPONSES),
        ("/v1/messages", conv.WireApi.ANTHROPIC_MESSAGES),
        ("/v1/messages?beta=true", conv.WireApi.ANTHROPIC_MESSAGES),
    ],
)
def test_paths_pick_their_codec(path: str, api: conv.WireApi) -> None:
    codec = for_path(path)
    assert codec is not None and codec.api is api


def test_count_tokens_and_other_paths_pick_no_codec() -> None:
    assert for_path("/v1/messages/count_tokens") is None
    assert for_path("/v1/models") is None


# --- requests ---------------------------------------------------------------


def test_a_chat_request_with_images_tools_and_history_parses_to_the_canonical_form() -> None:
    body = {
        "model": "policy",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "developer", "content": [{"type": "text", "text": "dev rules"}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": PNG, "detail": "high"}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "look closer",
                "tool_calls": [
                    {
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "zoom", "arguments": '{"level": 2}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_a", "content": "zoomed"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "zoom",
                    "description": "Zoom in.",
                    "parameters": {"type": "object", "properties": {"level": {"type": "integer"}}},
                },
            },
        ],
        "tool_choice": {"type": "function", "function": {"name": "zoom"}},
        "max_completion_tokens": 256,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": "END",
        "seed": 7,
        "stream": True,
        "stream_options": {"include_usage": True},
        "n": 1,
    }
    request = CODEC.parse_request(json.dumps(body).encode())
    assert request.model == "policy" and request.stream
    assert [m.role for m in request.messages] == ["system", "system", "user", "assistant", "tool"]
    assert request.messages[2].parts[1] == conv.ImagePart(PNG, "high")
    assert request.messages[3].parts == (
        conv.ReasoningPart("look closer"),
        conv.ToolCallPart("call_a", "zoom", '{"level": 2}'),
    )
    assert request.messages[4].parts == (
        conv.ToolResultPart("call_a", (conv.TextPart("zoomed"),), name="zoom"),
    )
    assert request.tools[0].name == "zoom" and request.tools[0].description == "Zoom in."
    assert request.tool_choice == "zoom"
    assert request.sampling == conv.SamplingParams(256, 0.5, 0.9, ("END",), 7)
    assert request.extra == {"stream_options": {"include_usage": True}, "n": 1}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"not json", ""),
        (b"[1, 2]", ""),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
        (b'{"model": "m"}', "messages"),
        (b'{"model": "m", "messages": []}', "messages"),
        (b'{"model": "m", "messages": [{"role": "user", "content": 5}]}', "messages[0].content"),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "a"}, {"role": "user",'
            b' "content": [{"type": "text", "text": "b"}, {"type": "input_audio"}]}]}',
            "messages[1].content[1].type",
        ),
        (
            b'{"model": "m", "messages": [{"role": "tool", "content": "r"}]}',
            "messages[0].tool_call_id",
        ),
        (b'{"model": "m", "messages": [{"role": "robot", "content": "r"}]}', "messages[0].role"),
        (
            b'{"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"id": "c"}]}]}',
            "messages[0].tool_calls[0].function",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}',
            "temperature",
        ),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": [1]}', "stop[0]"),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": '
            b'"maybe"}',
            "tool_choice",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}',
            "max_tokens",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}',
            "max_tokens",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], '
            b'"max_completion_tokens": 0}',
            "max_completion_tokens",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 1e11}',
            "temperature",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": -1}',
            "temperature",
        ),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "top_p": 2}', "top_p"),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": '
            b'"x"}]}',
            "tools[0].type",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "seed": 1, "user": '
            b'"\\ud800"}',
            "user",
        ),
        (b'{"model": "\\udbff", "messages": [{"role": "user", "content": "x"}]}', "model"),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}],'
            b' "tools": [{"type": "function", "function": {"name": "a\\ud800"}}]}',
            "tools[0].function.name",
        ),
    ],
)
def test_bad_requests_name_the_field_at_fault(body: bytes, field: str) -> None:
    with pytest.raises(CodecError) as caught:
        CODEC.parse_request(body)
    assert caught.value.field == field
    assert caught.value.status == 400


# --- the official SDK reads our bytes ------------------------------------------------


def _sdk(reply: Reply) -> tuple[openai.OpenAI, list[conv.ChatRequest]]:
    seen: list[conv.ChatRequest] = []

    def handler(http_request: httpx.Request) -> httpx.Response:
        request = CODEC.parse_request(http_request.content)
        seen.append(request)
        return reply(request)

    client = openai.OpenAI(
        api_key="k", base_url="http://sidecar.test/v1", http_client=mock_client(handler)
    )
    return client, seen


ANSWER = conv.Completion(
    conv.Message(
        "assistant",
        (
            conv.ReasoningPart("the user wants weather"),
            conv.TextPart("Checking."),
            conv.ToolCallPart("call_x", "weather", '{"city":"Paris"}'),
            conv.ToolCallPart("call_y", "time", '{"tz":"CET"}'),
        ),
    ),
    "tool_calls",
    conv.Usage(12, 9),
)
TOOLS: Any = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
    for n in ("weather", "time")
]


def test_sdk_reads_our_json_completion() -> None:
    client, seen = _sdk(
        lambda r: json_response(
            CODEC.build_response(r, ANSWER, response_id="chatcmpl-9", created=5)
        )
    )
    result = client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "weather?"}], tools=TOOLS
    )
    assert seen[0].tools[0].name == "weather"
    message = result.choices[0].message
    assert result.id == "chatcmpl-9" and result.choices[0].finish_reason == "tool_calls"
    assert message.content == "Checking."
    assert (message.model_extra or {})["reasoning_content"] == "the user wants weather"
    calls = message.tool_calls or []
    assert [
        (c.id, c.function.name, c.function.arguments) for c in calls if c.type == "function"
    ] == [
        ("call_x", "weather", '{"city":"Paris"}'),
        ("call_y", "time", '{"tz":"CET"}'),
    ]
    assert result.usage is not None and result.usage.total_tokens == 21


def _stream_reply(request: conv.ChatRequest) -> httpx.Response:
    events: list[conv.StreamEvent] = [
        conv.ReasoningDelta("the user "),
        conv.ReasoningDelta("wants weather"),
        conv.TextDelta("Check"),
        conv.TextDelta("ing."),
        conv.ToolCallStart(0, "call_x", "weather"),
        conv.ToolCallArgumentsDelta(0, '{"city":'),
        conv.ToolCallArgumentsDelta(0, '"Paris"}'),
        conv.ToolCallStart(1, "call_y", "time"),
        conv.ToolCallArgumentsDelta(1, '{"tz":"CET"}'),
        conv.StreamEnd("tool_calls", conv.Usage(12, 9)),
    ]
    return sse_response(encode_stream(CODEC, request, events, response_id="chatcmpl-9"))


def test_sdk_accumulates_our_stream() -> None:
    client, seen = _sdk(_stream_reply)
    with client.chat.completions.stream(
        model="policy", messages=[{"role": "user", "content": "weather?"}], tools=TOOLS,
        stream_options={"include_usage": True},
    ) as stream:  # fmt: skip
        final = stream.get_final_completion()
    assert seen[0].stream and seen[0].extra["stream_options"] == {"include_usage": True}
    message = final.choices[0].message
    assert message.content == "Checking." and final.choices[0].finish_reason == "tool_calls"
    assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []] == [
        ("call_x", "weather", '{"city":"Paris"}'),
        ("call_y", "time", '{"tz":"CET"}'),
    ]
    assert final.usage is not None and final.usage.prompt_tokens == 12


def test_sdk_sees_reasoning_deltas_in_raw_chunks() -> None:
    client, _ = _sdk(_stream_reply)
    chunks = list(
        client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "weather?"}], stream=True
        )
    )
    reasoning = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content", "")
        for c in chunks
        if c.choices
    )
    assert reasoning == "the user wants weather"


def test_sdk_raises_on_our_error_body_and_failed_stream() -> None:
    def refuse(request: conv.ChatRequest) -> httpx.Response:
        return httpx.Response(400, json=CODEC.error_body(400, "messages[0]: bad"))

    client, _ = _sdk(refuse)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
    assert (
        caught.value.type == "invalid_request_error" and "messages[0]: bad" in caught.value.message
    )

    def fail(request: conv.ChatRequest) -> httpx.Response:
        return sse_response(
            encode_stream(CODEC, request, [conv.TextDelta("a"), conv.StreamEnd("error")])
        )

    client, _ = _sdk(fail)
    with pytest.raises(openai.APIError):
        list(
            client.chat.completions.create(
                model="p", messages=[{"role": "user", "content": "x"}], stream=True
            )
        )


@pytest.mark.parametrize(
    ("status", "kind"), [(400, "invalid_request_error"), (429, "requests"), (500, "server_error")]
)
def test_error_bodies_have_the_openai_shape(status: int, kind: str) -> None:
    body = CODEC.error_body(status, "nope")
    assert body["error"]["type"] == kind and body["error"]["message"] == "nope"
    assert set(body["error"]) == {"message", "type", "param", "code"}
