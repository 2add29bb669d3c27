from __future__ import annotations

import base64
import contextlib
import json
import re
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from codec_strategies import (
    Reply,
    byte_cuts,
    decode_stream,
    encode_stream,
    events_for,
    json_response,
    json_values,
    mock_client,
    sequenced_completions,
    sse_response,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from openforge.wire import conversation as conv
from openforge.wire import sse
from openforge.wire.codecs import anthropic_messages
from openforge.wire.codecs.errors import CodecError

CODEC = anthropic_messages.CODEC
HARNESS_REQUESTS = Path(__file__).parents[2] / "fixtures" / "harness_requests"
B64 = base64.b64encode(bytes(range(256)) * 2).decode()

CLAUDE_CODE_REQUEST: dict[str, Any] = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 32000,
    "system": [
        {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.",
         "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "\nYou are an interactive CLI tool.",
         "cache_control": {"type": "ephemeral"}},
    ],
    "messages": [
        {"role": "user", "content": [
            {"type": "text", "text": "<system-reminder>be careful</system-reminder>"},
            {"type": "text", "text": "fix the failing test",
             "cache_control": {"type": "ephemeral"}},
        ]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Run the tests first.", "signature": "EqQBCkgIBxAB"},
            {"type": "text", "text": "I'll run them."},
            {"type": "tool_use", "id": "toolu_01", "name": "Bash",
             "input": {"command": "pytest -x", "description": "Run tests"}},
            {"type": "tool_use", "id": "toolu_02", "name": "Read",
             "input": {"file_path": "/repo/a.py"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": "1 failed",
             "is_error": True},
            {"type": "tool_result", "tool_use_id": "toolu_02",
             "content": [{"type": "text", "text": "x = 1"}],
             "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "<system-reminder>todo list empty</system-reminder>"},
        ]},
        {"role": "assistant", "content": [
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Fixed."},
        ]},
        {"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64}},
            {"type": "image", "source": {"type": "url", "url": "https://example.test/a.png"}},
            {"type": "text", "text": "and this screenshot?"},
        ]},
    ],
    "tools": [
        {"name": "Bash", "description": "Executes a bash command.",
         "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                          "required": ["command"]}},
        {"name": "Read", "description": "Reads a file.",
         "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}}},
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
    ],
    "tool_choice": {"type": "auto"},
    "metadata": {"user_id": "user_abc"},
    "thinking": {"type": "enabled", "budget_tokens": 10000},
    "temperature": 1,
    "stop_sequences": ["\n\nHuman:"],
    "stream": True,
}  # fmt: skip


def _request(**fields: Any) -> conv.ChatRequest:
    body = {
        "model": "policy",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}],
        **fields,
    }
    return CODEC.parse_request(json.dumps(body).encode())


REQUEST = _request()


# --- properties ---------------------------------------------------------------


@settings(deadline=None)  # a shared 2-core machine makes timings noisy
@given(st.data())
def test_stream_decodes_to_the_encoded_completion(data: st.DataObject) -> None:
    completion = data.draw(sequenced_completions())
    events = data.draw(events_for(completion))
    wire = encode_stream(CODEC, REQUEST, events)
    bodies = [json.loads(e.data) for e in sse.SSEParser().feed(wire)]
    starts = [b["index"] for b in bodies if b["type"] == "content_block_start"]
    stops = [b["index"] for b in bodies if b["type"] == "content_block_stop"]
    assert starts == stops == list(range(len(starts)))
    assert conv.assemble(decode_stream(CODEC, data.draw(byte_cuts(wire)))) == completion


@settings(deadline=None)  # a shared 2-core machine makes timings noisy
@given(sequenced_completions(signatures=True))
def test_json_body_parses_back_to_the_completion(completion: conv.Completion) -> None:
    body = CODEC.build_response(REQUEST, completion, response_id="msg_1", created=1)
    assert CODEC.parse_response(json.dumps(body).encode()) == completion


@settings(deadline=None)  # a shared 2-core machine makes timings noisy
@given(st.data())
def test_a_stream_cut_before_its_end_never_ends(data: st.DataObject) -> None:
    completion = data.draw(sequenced_completions())
    wire = encode_stream(CODEC, REQUEST, data.draw(events_for(completion)))
    cut = data.draw(st.integers(0, len(wire) - 1))
    events = decode_stream(CODEC, data.draw(byte_cuts(wire[:cut])))
    assert not any(isinstance(e, conv.StreamEnd) for e in events)


@settings(deadline=None)  # a shared 2-core machine makes timings noisy
@given(st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()))
def test_parse_request_raises_only_codec_errors(body: bytes) -> None:
    with contextlib.suppress(CodecError):
        CODEC.parse_request(body)


_keys = st.sampled_from(
    ["model", "max_tokens", "messages", "system", "role", "content", "type", "text", "source",
     "media_type", "data", "tool_use_id", "id", "name", "input", "thinking", "tools", "tool_choice"]
)  # fmt: skip
_values = st.sampled_from(
    ["user", "assistant", "text", "image", "tool_use", "tool_result", "thinking", "base64", "url",
     "tool", "any"]
)  # fmt: skip
_shaped = st.recursive(
    st.none() | st.text(max_size=5) | st.integers() | _values,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=6),
    max_leaves=25,
)


@settings(deadline=None)  # a shared 2-core machine makes timings noisy
@given(_shaped)
def test_parse_request_of_near_miss_shapes_raises_only_codec_errors(value: Any) -> None:
    with contextlib.suppress(CodecError):
        CODEC.parse_request(json.dumps(value).encode())


_event_types = st.sampled_from(
    ["message_start", "content_block_start", "content_block_delta", "content_block_stop",
     "message_delta", "message_stop", "error"]
)  # fmt: skip


@settings(deadline=None)  # a shared 2-core machine makes timings noisy
@given(st.lists(json_values | st.fixed_dictionaries({"type": _event_types}), max_size=5))
def test_stream_decoder_raises_only_codec_errors(values: list[Any]) -> None:
    decoder = CODEC.stream_decoder()
    for value in values:
        with contextlib.suppress(CodecError):
            decoder.feed(sse.Event(json.dumps(value)))


# --- requests -------------------------------------------------------------------


def test_a_claude_code_request_parses_to_the_canonical_form() -> None:
    request = CODEC.parse_request(json.dumps(CLAUDE_CODE_REQUEST).encode())
    roles = [m.role for m in request.messages]
    assert roles == ["system", "user", "assistant", "tool", "tool", "user", "assistant", "user"]
    assert request.messages[0].parts == (
        conv.TextPart("You are Claude Code, Anthropic's official CLI for Claude."),
        conv.TextPart("\nYou are an interactive CLI tool."),
    )
    assert request.messages[2].parts == (
        conv.ReasoningPart("Run the tests first.", "EqQBCkgIBxAB"),
        conv.TextPart("I'll run them."),
        conv.ToolCallPart("toolu_01", "Bash", '{"command":"pytest -x","description":"Run tests"}'),
        conv.ToolCallPart("toolu_02", "Read", '{"file_path":"/repo/a.py"}'),
    )
    assert request.messages[3].parts == (
        conv.ToolResultPart("toolu_01", (conv.TextPart("1 failed"),), is_error=True, name="Bash"),
    )
    assert request.messages[4].parts == (
        conv.ToolResultPart("toolu_02", (conv.TextPart("x = 1"),), name="Read"),
    )
    assert request.messages[5].text == "<system-reminder>todo list empty</system-reminder>"
    assert request.messages[6].parts == (conv.TextPart("Fixed."),)  # redacted thinking dropped
    assert request.messages[7].parts[:2] == (
        conv.ImagePart(f"data:image/png;base64,{B64}"),
        conv.ImagePart("https://example.test/a.png"),
    )
    assert [t.name for t in request.tools] == ["Bash", "Read"]
    assert request.tools[0].parameters["required"] == ["command"]
    assert request.extra["tools"] == CLAUDE_CODE_REQUEST["tools"]
    assert request.extra["thinking"] == {"type": "enabled", "budget_tokens": 10000}
    assert set(request.extra) == {"tools", "metadata", "thinking"}
    assert request.sampling == conv.SamplingParams(32000, 1.0, None, ("\n\nHuman:",), None)
    assert request.tool_choice == "auto" and request.stream


def test_claude_code_system_turns_inside_messages_stay_in_place() -> None:
    """Claude Code sends its environment as a ``role: "system"`` message after the prompt.

    It is a block list with ``cache_control`` on the first call and a plain
    string on the follow-up; both parse to the same message, so the follow-up
    still extends the first call's tokens.
    """
    first = CODEC.parse_request(
        (HARNESS_REQUESTS / "claude-code" / "2-v1_messages.json").read_bytes()
    )
    follow_up = CODEC.parse_request(
        (HARNESS_REQUESTS / "claude-code" / "3-v1_messages.json").read_bytes()
    )
    assert [m.role for m in first.messages] == ["system", "user", "system"]
    assert [m.role for m in follow_up.messages] == ["system", "user", "system", "assistant", "tool"]
    environment = first.messages[2]
    assert environment.text.startswith("# Environment\n")
    assert follow_up.messages[2] == environment
    assert follow_up.messages[:3] == first.messages


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
        ({"type": "tool", "name": "Bash"}, "Bash"),
    ],
)
def test_tool_choice_is_normalised(choice: dict[str, str], expected: str) -> None:
    assert _request(tool_choice=choice).tool_choice == expected


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{", ""),
        (b"null", ""),
        (b'{"max_tokens": 1, "messages": []}', "model"),
        (b'{"model": "m", "messages": []}', "max_tokens"),
        (b'{"model": "m", "max_tokens": "1", "messages": []}', "max_tokens"),
        (b'{"model": "m", "max_tokens": 1, "messages": [{"role": "tool", "content": "x"}]}',
         "messages[0].role"),
        (b'{"model": "m", "max_tokens": 1, "messages": [{"role": "system",'
         b' "content": [{"type": "image"}]}]}', "messages[0].content[0].type"),
        (b'{"model": "m", "max_tokens": 1, "messages": [{"role": "user"}]}', "messages[0].content"),
        (b'{"model": "m", "max_tokens": 1, "messages": [{"role": "user",'
         b' "content": [{"type": "document"}]}]}', "messages[0].content[0].type"),
        (b'{"model": "m", "max_tokens": 1, "messages": [{"role": "user",'
         b' "content": [{"type": "tool_result"}]}]}', "messages[0].content[0].tool_use_id"),
        (b'{"model": "m", "max_tokens": 1, "messages": [{"role": "assistant",'
         b' "content": [{"type": "tool_use", "id": "t", "name": "n", "input": []}]}]}',
         "messages[0].content[0].input"),
        (b'{"model": "m", "max_tokens": 1, "messages": [{"role": "user",'
         b' "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}]}',
         "messages[0].content[0].source.type"),
        (b'{"model": "m", "max_tokens": 1, "messages": [], "system": [{"type": "image"}]}',
         "system[0].type"),
        (b'{"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}],'
         b' "tools": [{"name": "t"}]}', "tools[0].input_schema"),
        (b'{"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}],'
         b' "tool_choice": "auto"}', "tool_choice"),
        (b'{"model": "m", "max_tokens": 1, "messages": []}', "messages"),
        (b'{"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}',
         "max_tokens"),
        (b'{"model": "m", "max_tokens": -1, "messages": [{"role": "user", "content": "x"}]}',
         "max_tokens"),
        (b'{"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}],'
         b' "temperature": 1e11}', "temperature"),
        (b'{"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}],'
         b' "top_p": -0.5}', "top_p"),
        (b'{"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}],'
         b' "tools": [{"type": "x", "name": "t"}]}', "tools[0].type"),
        (b'{"model": "\\ud800", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}',
         "model"),
        (b'{"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "a\\udfffb"}]}',
         "messages[0].content"),
    ],
)  # fmt: skip
def test_bad_requests_name_the_field_at_fault(body: bytes, field: str) -> None:
    with pytest.raises(CodecError) as caught:
        CODEC.parse_request(body)
    assert caught.value.field == field


# --- responses ------------------------------------------------------------------


def test_stop_reasons_and_tool_use_input_objects() -> None:
    call = conv.ToolCallPart("toolu_1", "Bash", '{"command":"ls"}')
    completion = conv.Completion(conv.Message("assistant", (call,)), "stop", conv.Usage(7, 3))
    body = CODEC.build_response(REQUEST, completion, response_id="msg_1", created=1)
    assert body["stop_reason"] == "tool_use"
    assert body["content"] == [
        {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}
    ]
    length = conv.Completion(conv.Message("assistant", (conv.TextPart("x"),)), "length")
    assert (
        CODEC.build_response(REQUEST, length, response_id="m", created=1)["stop_reason"]
        == "max_tokens"
    )


def test_a_failed_stream_ends_with_an_error_event() -> None:
    wire = encode_stream(CODEC, REQUEST, [conv.TextDelta("a"), conv.StreamEnd("error")])
    last = sse.SSEParser().feed(wire)[-1]
    assert last.event == "error" and json.loads(last.data)["error"]["type"] == "api_error"
    assert decode_stream(CODEC, [wire])[-1] == conv.StreamEnd("error")


def test_a_thinking_signature_streams_as_a_signature_delta_and_assembles_onto_its_block() -> None:
    events = [
        conv.ReasoningDelta("hm"), conv.ReasoningSignature("sig-1"), conv.ReasoningDelta("again"),
        conv.TextDelta("a"), conv.StreamEnd("stop"),
    ]  # fmt: skip
    wire = encode_stream(CODEC, REQUEST, events)
    deltas = [
        json.loads(e.data)["delta"]
        for e in sse.SSEParser().feed(wire)
        if e.event == "content_block_delta"
    ]
    assert {"type": "signature_delta", "signature": "sig-1"} in deltas
    starts = [
        json.loads(e.data)["content_block"]["type"]
        for e in sse.SSEParser().feed(wire)
        if e.event == "content_block_start"
    ]
    assert starts == ["thinking", "thinking", "text"]  # a signature closes its block
    assert decode_stream(CODEC, [wire])[:3] == events[:3]
    completion = conv.assemble(decode_stream(CODEC, [wire]))
    assert completion.message.parts[:2] == (
        conv.ReasoningPart("hm", "sig-1"),
        conv.ReasoningPart("again"),
    )
    body = CODEC.build_response(REQUEST, completion, response_id="m", created=1)
    assert body["content"][0] == {"type": "thinking", "thinking": "hm", "signature": "sig-1"}


def test_message_start_reports_the_prompt_tokens_as_the_api_does() -> None:
    encoder = CODEC.stream_encoder(REQUEST, response_id="m", created=1, prompt_tokens=2143)
    start = sse.SSEParser().feed(encoder.start())[0]
    assert json.loads(start.data)["message"]["usage"]["input_tokens"] == 2143  # was 0


def test_tool_call_ids_are_anthropic_style_and_deterministic() -> None:
    assert re.fullmatch(r"toolu_[0-9a-f]{24}", CODEC.tool_call_id("s"))
    assert CODEC.tool_call_id("s") == CODEC.tool_call_id("s") != CODEC.tool_call_id("t")


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "invalid_request_error"), (401, "authentication_error"), (429, "rate_limit_error"),
     (500, "api_error"), (529, "overloaded_error"), (503, "api_error")],
)  # fmt: skip
def test_error_bodies_have_the_anthropic_shape(status: int, kind: str) -> None:
    assert CODEC.error_body(status, "no") == {
        "type": "error",
        "error": {"type": kind, "message": "no"},
    }


# --- the official SDK reads our bytes ------------------------------------------------


def _sdk(reply: Reply) -> tuple[anthropic.Anthropic, list[conv.ChatRequest]]:
    seen: list[conv.ChatRequest] = []

    def handler(http_request: httpx.Request) -> httpx.Response:
        request = CODEC.parse_request(http_request.content)
        seen.append(request)
        return reply(request)

    client = anthropic.Anthropic(
        api_key="k", base_url="http://sidecar.test", http_client=mock_client(handler), max_retries=0
    )
    return client, seen


ANSWER = conv.Completion(
    conv.Message(
        "assistant",
        (
            conv.ReasoningPart("Check both files."),
            conv.TextPart("Reading."),
            conv.ToolCallPart("toolu_a", "Read", '{"file_path":"a.py"}'),
            conv.ToolCallPart("toolu_b", "Read", '{"file_path":"b.py"}'),
        ),
    ),
    "tool_calls",
    conv.Usage(50, 20),
)
TOOLS: Any = [{"name": "Read", "input_schema": {"type": "object"}}]
MESSAGES: Any = [{"role": "user", "content": "read them"}]


def _check_message(message: Any) -> None:
    assert message.stop_reason == "tool_use"
    thinking, text, first, second = message.content
    assert thinking.type == "thinking" and thinking.thinking == "Check both files."
    assert text.type == "text" and text.text == "Reading."
    assert (first.id, first.name, first.input) == ("toolu_a", "Read", {"file_path": "a.py"})
    assert (second.id, second.input) == ("toolu_b", {"file_path": "b.py"})
    assert (message.usage.input_tokens, message.usage.output_tokens) == (50, 20)


def test_sdk_reads_our_json_message() -> None:
    client, seen = _sdk(
        lambda r: json_response(CODEC.build_response(r, ANSWER, response_id="msg_j", created=5))
    )
    message = client.messages.create(model="policy", max_tokens=64, messages=MESSAGES, tools=TOOLS)
    assert seen[0].sampling.max_tokens == 64 and seen[0].tools[0].name == "Read"
    assert message.id == "msg_j"
    _check_message(message)


def _stream_reply(request: conv.ChatRequest) -> httpx.Response:
    events: list[conv.StreamEvent] = [
        conv.ReasoningDelta("Check both "),
        conv.ReasoningDelta("files."),
        conv.TextDelta("Read"),
        conv.TextDelta("ing."),
        conv.ToolCallStart(0, "toolu_a", "Read"),
        conv.ToolCallArgumentsDelta(0, '{"file_'),
        conv.ToolCallArgumentsDelta(0, 'path":"a.py"}'),
        conv.ToolCallStart(1, "toolu_b", "Read"),
        conv.ToolCallArgumentsDelta(1, '{"file_path":"b.py"}'),
        conv.StreamEnd("tool_calls", conv.Usage(50, 20)),
    ]
    return sse_response(encode_stream(CODEC, request, events, response_id="msg_s"))


def test_sdk_stream_helper_accumulates_our_stream() -> None:
    client, seen = _sdk(_stream_reply)
    with client.messages.stream(
        model="policy", max_tokens=64, messages=MESSAGES, tools=TOOLS
    ) as stream:
        text = "".join(stream.text_stream)
        message = stream.get_final_message()
    assert seen[0].stream
    assert text == "Reading." and message.id == "msg_s"
    _check_message(message)


def test_sdk_reads_our_raw_events() -> None:
    client, _ = _sdk(_stream_reply)
    events = list(
        client.messages.create(model="policy", max_tokens=64, messages=MESSAGES, stream=True)
    )
    assert [e.type for e in events][:1] + [e.type for e in events][-2:] == [
        "message_start", "message_delta", "message_stop"
    ]  # fmt: skip
    thinking = [
        e.delta.thinking
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "thinking_delta"
    ]
    assert "".join(thinking) == "Check both files."


def test_sdk_raises_on_our_errors() -> None:
    client, _ = _sdk(lambda r: httpx.Response(529, json=CODEC.error_body(529, "busy")))
    with pytest.raises(anthropic.APIStatusError) as caught:
        client.messages.create(model="policy", max_tokens=8, messages=MESSAGES)
    assert caught.value.status_code == 529 and "busy" in caught.value.message

    def fail(request: conv.ChatRequest) -> httpx.Response:
        return sse_response(
            encode_stream(CODEC, request, [conv.TextDelta("a"), conv.StreamEnd("error")])
        )

    client, _ = _sdk(fail)
    with (
        pytest.raises(anthropic.APIStatusError),
        client.messages.stream(model="policy", max_tokens=8, messages=MESSAGES) as stream,
    ):
        stream.get_final_message()
