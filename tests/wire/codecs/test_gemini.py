from __future__ import annotations

import base64
import contextlib
import json
import re
from pathlib import Path
from typing import Any

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
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types
from hypothesis import given, settings
from hypothesis import strategies as st
from openforge.wire import codecs, sse
from openforge.wire import conversation as conv
from openforge.wire.codecs import gemini
from openforge.wire.codecs.errors import CodecError

STREAM_PATH = "/v1beta/models/policy:streamGenerateContent?alt=sse"


def _bound(path: str) -> gemini.GeminiCodec:
    codec = gemini.for_path(path)
    assert codec is not None, path
    return codec


CODEC = _bound(STREAM_PATH)
PLAIN = _bound("/v1beta/models/policy:generateContent")
GEMINI_CLI = Path(__file__).parents[2] / "fixtures" / "harness_requests" / "gemini-cli"
PNG = base64.b64encode(bytes(range(256)) * 2).decode()
THOUGHTS: dict[str, Any] = {"generationConfig": {"thinkingConfig": {"includeThoughts": True}}}


def _request(codec: gemini.GeminiCodec = CODEC, **fields: Any) -> conv.ChatRequest:
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], **fields}
    return codec.parse_request(json.dumps(body).encode())


REQUEST = _request(**THOUGHTS)


# --- properties -----------------------------------------------------------------


@settings(deadline=None)  # a shared 2-core machine makes timings noisy
@given(st.data())
def test_stream_decodes_to_the_encoded_completion(data: st.DataObject) -> None:
    completion = data.draw(sequenced_completions())
    events = data.draw(events_for(completion))
    wire = encode_stream(CODEC, REQUEST, events)
    chunks = [json.loads(e.data) for e in sse.SSEParser().feed(wire)]
    assert all(c["candidates"][0]["index"] == 0 and c["responseId"] == "resp_1" for c in chunks)
    assert [("finishReason" in c["candidates"][0]) for c in chunks] == [False] * (
        len(chunks) - 1
    ) + [True]
    assert conv.assemble(decode_stream(CODEC, data.draw(byte_cuts(wire)))) == completion


@settings(deadline=None)  # a shared 2-core machine makes timings noisy
@given(sequenced_completions(signatures=True))
def test_json_body_parses_back_to_the_completion(completion: conv.Completion) -> None:
    body = CODEC.build_response(REQUEST, completion, response_id="r1", created=1)
    assert CODEC.parse_response(json.dumps(body).encode()) == completion


@settings(deadline=None)  # a shared 2-core machine makes timings noisy
@given(st.data())
def test_a_stream_cut_before_its_end_never_ends(data: st.DataObject) -> None:
    """Gemini streams end with the chunk carrying ``finishReason``; no cut one may end.

    The last cut kept is before the final blank line's CR: a stream cut after
    that CR has delivered the whole final event (a lone CR ends a line).
    """
    completion = data.draw(sequenced_completions())
    wire = encode_stream(CODEC, REQUEST, data.draw(events_for(completion)))
    assert wire.endswith(b"\r\n\r\n")
    cut = data.draw(st.integers(0, len(wire) - 2))
    events = decode_stream(CODEC, data.draw(byte_cuts(wire[:cut])))
    assert not any(isinstance(e, conv.StreamEnd) for e in events)


@settings(deadline=None)  # a shared 2-core machine makes timings noisy
@given(st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()))
def test_parse_request_raises_only_codec_errors(body: bytes) -> None:
    with contextlib.suppress(CodecError):
        CODEC.parse_request(body)
    with contextlib.suppress(CodecError):
        CODEC.parse_count_request(body)


_keys = st.sampled_from(
    ["contents", "role", "parts", "text", "thought", "thoughtSignature", "inlineData",
     "inline_data", "mimeType", "data", "fileData", "fileUri", "functionCall", "functionResponse",
     "name", "args", "response", "id", "output", "error", "systemInstruction", "tools",
     "functionDeclarations", "parameters", "parametersJsonSchema", "toolConfig",
     "functionCallingConfig", "mode", "allowedFunctionNames", "generationConfig", "maxOutputTokens",
     "stopSequences", "thinkingConfig", "includeThoughts", "generateContentRequest"]
)  # fmt: skip
_values = st.sampled_from(
    ["user", "model", "function", "image/png", "text/plain", "ANY", "NONE", "AUTO", "x"]
)  # fmt: skip
_shaped = st.recursive(
    st.none() | st.booleans() | st.text(max_size=5) | st.integers() | _values,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=6),
    max_leaves=25,
)


@settings(deadline=None)  # a shared 2-core machine makes timings noisy
@given(_shaped)
def test_parse_request_of_near_miss_shapes_raises_only_codec_errors(value: Any) -> None:
    body = json.dumps(value).encode()
    with contextlib.suppress(CodecError):
        CODEC.parse_request(body)
    with contextlib.suppress(CodecError):
        CODEC.parse_count_request(body)


_chunk_keys = st.sampled_from(
    ["candidates", "content", "parts", "text", "thought", "functionCall", "name", "args", "id",
     "finishReason", "index", "usageMetadata", "promptTokenCount", "candidatesTokenCount",
     "responseId", "error"]
)  # fmt: skip
_chunks = st.recursive(
    st.none() | st.booleans() | st.text(max_size=5) | st.integers() | st.just("STOP"),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_chunk_keys, inner, max_size=5),
    max_leaves=20,
)


@settings(deadline=None)  # a shared 2-core machine makes timings noisy
@given(st.lists(_chunks, max_size=5))
def test_stream_decoder_and_response_parser_raise_only_codec_errors(values: list[Any]) -> None:
    decoder = CODEC.stream_decoder()
    for value in values:
        with contextlib.suppress(CodecError):
            decoder.feed(sse.Event(json.dumps(value)))
        with contextlib.suppress(CodecError):
            CODEC.parse_response(json.dumps(value).encode())


# --- routing ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "model", "method", "alt_sse"),
    [
        ("/v1beta/models/gemini-2.5-pro:generateContent",
         "gemini-2.5-pro", "generateContent", False),
        (STREAM_PATH, "policy", "streamGenerateContent", True),
        ("/proxy/v1/models/m.1:streamGenerateContent?key=k&alt=sse",
         "m.1", "streamGenerateContent", True),
        ("/v1beta/tunedModels/t-1:generateContent/", "t-1", "generateContent", False),
    ],
)  # fmt: skip
def test_paths_bind_model_method_and_alt(path: str, model: str, method: str, alt_sse: bool) -> None:
    codec = codecs.for_path(path)
    assert isinstance(codec, gemini.GeminiCodec) and codec.api is conv.WireApi.GEMINI
    assert (codec.model, codec.method, codec.sse) == (model, method, alt_sse)
    assert codecs.counter_for_path(path) is None


def test_count_tokens_paths_pick_the_counter_and_no_codec() -> None:
    path = "/v1beta/models/policy:countTokens"
    assert codecs.for_path(path) is None
    counter = codecs.counter_for_path(path)
    assert isinstance(counter, gemini.GeminiCodec) and counter.model == "policy"
    assert codecs.counter_for_path("/v1/messages/count_tokens") is None
    assert codecs.for_path("/v1beta/models") is None


def test_streams_without_alt_sse_are_refused_naming_alt() -> None:
    codec = codecs.for_path("/v1beta/models/policy:streamGenerateContent")
    assert codec is not None
    with pytest.raises(CodecError) as caught:
        codec.parse_request(b'{"contents": [{"parts": [{"text": "hi"}]}]}')
    assert caught.value.field == "alt" and "alt=sse" in str(caught.value)


# --- requests ---------------------------------------------------------------------


def test_a_gemini_cli_follow_up_parses_to_the_canonical_form() -> None:
    first = CODEC.parse_request(
        (GEMINI_CLI / "1-v1beta_models_policy_streamGenerateContent.json").read_bytes()
    )
    follow_up = CODEC.parse_request(
        (GEMINI_CLI / "2-v1beta_models_policy_streamGenerateContent.json").read_bytes()
    )
    assert [m.role for m in first.messages] == ["system", "user"]
    assert [m.role for m in follow_up.messages] == ["system", "user", "assistant", "tool"]
    assert follow_up.messages[:2] == first.messages
    assert first.messages[1].parts[0].text.startswith("<session_context>")  # type: ignore[union-attr]
    assert first.messages[1].parts[1] == conv.TextPart(
        "Please run `echo hi > hello.txt` and then say done."
    )
    [call] = follow_up.messages[2].tool_calls
    assert call.name == "run_shell_command"
    assert json.loads(call.arguments)["command"] == "echo hi > hello.txt"
    [result] = follow_up.messages[3].parts
    assert isinstance(result, conv.ToolResultPart)
    assert result.tool_call_id == call.id and result.name == "run_shell_command"
    assert result.text.startswith("<untrusted_context>\nOutput: (empty)")
    assert "run_shell_command" in [t.name for t in first.tools]
    shell = next(t for t in first.tools if t.name == "run_shell_command")
    assert shell.parameters["properties"]["command"]["type"] == "string"
    assert first.model == "policy" and first.stream
    assert first.sampling == conv.SamplingParams(None, 1.0, 0.95, (), None)
    assert first.extra == {
        "generationConfig": {"topK": 64, "thinkingConfig": {"includeThoughts": True}}
    }


def test_parts_roles_and_ids() -> None:
    body = {
        "systemInstruction": {"parts": [{"text": "Be brief."}, {"text": " Really."}]},
        "contents": [
            {"parts": [{"text": "look"}, {"inlineData": {"mimeType": "image/png", "data": PNG}},
                       {"fileData": {"mimeType": "image/jpeg", "fileUri": "https://example.test/a.jpg"}}]},
            {"role": "model", "parts": [
                {"text": "Checking.", "thought": True, "thoughtSignature": "sig1"},
                {"text": "Two reads."},
                {"functionCall": {"name": "read", "args": {"path": "a"}}},
                {"functionCall": {"name": "read", "args": {"path": "b"}},
                 "thoughtSignature": "sig2"},
                {"functionCall": {"id": "c9", "name": "ls"}},
            ]},
            {"role": "user", "parts": [
                {"functionResponse": {"id": "c9", "name": "ls", "response": {"output": "a b"}}},
                {"functionResponse": {"name": "read", "response": {"output": {"bytes": 3}}}},
                {"functionResponse": {"name": "read", "response": {"error": "no such file"},
                                      "parts": [{"inlineData": {"mimeType": "image/gif",
                                                                "data": "R0lG"}}]}},
                {"text": "and now?"},
            ]},
        ],
    }  # fmt: skip
    request = PLAIN.parse_request(json.dumps(body).encode())
    roles = [m.role for m in request.messages]
    assert roles == ["system", "user", "assistant", "tool", "tool", "tool", "user"]
    assert request.messages[0].parts == (conv.TextPart("Be brief."), conv.TextPart(" Really."))
    assert request.messages[1].parts == (
        conv.TextPart("look"),
        conv.ImagePart(f"data:image/png;base64,{PNG}"),  # lossless: the base64 text as sent
        conv.ImagePart("https://example.test/a.jpg"),
    )
    assert request.messages[2].parts == (
        conv.ReasoningPart("Checking.", "sig1"),
        conv.TextPart("Two reads."),
        conv.ToolCallPart("call_1_2", "read", '{"path":"a"}'),
        conv.ToolCallPart("call_1_3", "read", '{"path":"b"}'),
        conv.ToolCallPart("c9", "ls", "{}"),
    )
    results = [m.parts[0] for m in request.messages[3:6]]
    assert results == [
        conv.ToolResultPart("c9", (conv.TextPart("a b"),), name="ls"),
        conv.ToolResultPart("call_1_2", (conv.TextPart('{"bytes":3}'),), name="read"),
        conv.ToolResultPart(
            "call_1_3",
            (conv.TextPart("no such file"), conv.ImagePart("data:image/gif;base64,R0lG")),
            is_error=True,
            name="read",
        ),
    ]
    assert request.messages[6].parts == (conv.TextPart("and now?"),)
    assert request.model == "policy" and not request.stream


def test_snake_case_fields_parse_like_camel_case() -> None:
    camel = {
        "systemInstruction": {"parts": [{"text": "s"}]},
        "contents": [{"role": "user",
                      "parts": [{"inlineData": {"mimeType": "image/png", "data": "AA=="}}]}],
        "tools": [{"functionDeclarations": [{"name": "f",
                                             "parametersJsonSchema": {"type": "object"}}]}],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["f"]}},
        "generationConfig": {"maxOutputTokens": 9, "topP": 0.5, "stopSequences": ["X"],
                             "thinkingConfig": {"includeThoughts": True}},
    }  # fmt: skip
    snake = {
        "system_instruction": {"parts": [{"text": "s"}]},
        "contents": [{"role": "user",
                      "parts": [{"inline_data": {"mime_type": "image/png", "data": "AA=="}}]}],
        "tools": [{"function_declarations": [{"name": "f",
                                              "parameters_json_schema": {"type": "object"}}]}],
        "tool_config": {"function_calling_config": {"mode": "ANY",
                                                    "allowed_function_names": ["f"]}},
        "generation_config": {"max_output_tokens": 9, "top_p": 0.5, "stop_sequences": ["X"],
                              "thinking_config": {"include_thoughts": True}},
    }  # fmt: skip
    a = PLAIN.parse_request(json.dumps(camel).encode())
    b = PLAIN.parse_request(json.dumps(snake).encode())
    assert (a.messages, a.tools, a.tool_choice, a.sampling) == (
        b.messages,
        b.tools,
        b.tool_choice,
        b.sampling,
    )
    assert a.tool_choice == "f" and a.sampling == conv.SamplingParams(9, None, 0.5, ("X",), None)
    done = conv.Completion(conv.Message("assistant", (conv.ReasoningPart("hm"),)), "stop")
    for request in (a, b):  # includeThoughts is honoured in either spelling
        parts = PLAIN.build_response(request, done, response_id="r", created=1)["candidates"][0][
            "content"
        ]["parts"]
        assert parts == [{"text": "hm", "thought": True}]


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"functionCallingConfig": {"mode": "NONE"}}, "none"),
        ({"functionCallingConfig": {"mode": "ANY"}}, "required"),
        (
            {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["a", "b"]}},
            "required",
        ),
        ({"functionCallingConfig": {"mode": "VALIDATED"}}, "auto"),
        ({}, "auto"),
    ],
)
def test_tool_config_is_normalised(config: dict[str, Any], expected: str) -> None:
    assert _request(toolConfig=config).tool_choice == expected


def test_built_in_tools_and_unmodelled_fields_are_kept_in_extra() -> None:
    tools = [
        {"functionDeclarations": [{"name": "f", "parameters": {"type": "OBJECT"}}]},
        {"googleSearch": {}},
    ]
    request = _request(
        tools=tools, safetySettings=[{"category": "X"}], generationConfig={"topK": 3, "seed": 5}
    )
    assert [t.name for t in request.tools] == ["f"]
    assert request.tools[0].parameters == {"type": "OBJECT"}  # OpenAPI-style schema kept as sent
    assert request.extra == {
        "tools": tools,
        "safetySettings": [{"category": "X"}],
        "generationConfig": {"topK": 3},
    }
    assert request.sampling.seed == 5


C0 = '{"contents": [{"parts": [{"text": "x"}]}]'


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{", ""),
        (b"[]", ""),
        (b"{}", "contents"),
        (b'{"contents": []}', "contents"),
        (b'{"contents": [{"role": "system", "parts": []}]}', "contents[0].role"),
        (b'{"contents": [{"role": "user"}]}', "contents[0].parts"),
        (b'{"contents": [{"parts": [{}]}]}', "contents[0].parts[0]"),
        (b'{"contents": [{"parts": [{"text": 1}]}]}', "contents[0].parts[0].text"),
        (b'{"contents": [{"parts": [{"inlineData": {"data": "AA=="}}]}]}',
         "contents[0].parts[0].inlineData.mimeType"),
        (b'{"contents": [{"parts": [{"inlineData": {"mimeType": "application/pdf",'
         b' "data": "AA=="}}]}]}', "contents[0].parts[0].inlineData.mimeType"),
        (b'{"contents": [{"parts": [{"inline_data": {"mime_type": "audio/wav",'
         b' "data": "AA=="}}]}]}', "contents[0].parts[0].inline_data.mime_type"),
        (b'{"contents": [{"parts": [{"functionCall": {"name": "f"}}]}]}',
         "contents[0].parts[0].functionCall"),
        (b'{"contents": [{"role": "model", "parts": [{"functionCall": {"name": "f",'
         b' "args": []}}]}]}', "contents[0].parts[0].functionCall.args"),
        (b'{"contents": [{"role": "model", "parts": [{"functionCall": {"args": {}}}]}]}',
         "contents[0].parts[0].functionCall.name"),
        (b'{"contents": [{"parts": [{"functionResponse": {"name": "f"}}]}]}',
         "contents[0].parts[0].functionResponse.response"),
        (b'{"contents": [{"parts": [{"functionResponse": {"name": "f", "response": {},'
         b' "parts": [{"text": "t"}]}}]}]}', "contents[0].parts[0].functionResponse.parts[0].text"),
        (b'{"contents": [{"role": "model", "parts": [{"inlineData": {"mimeType": "image/png",'
         b' "data": ""}}]}]}', "contents[0].parts[0].inlineData"),
        (b'{"contents": [{"parts": [{"executableCode": {}}]}]}',
         "contents[0].parts[0].executableCode"),
        (C0.encode() + b', "systemInstruction": "be nice"}', "systemInstruction"),
        (C0.encode() + b', "systemInstruction": {"parts": [{"fileData": {}}]}}',
         "systemInstruction.parts[0].fileData"),
        (C0.encode() + b', "tools": {}}', "tools"),
        (C0.encode() + b', "tools": [{"functionDeclarations": [{"name": "f", "parameters": []}]}]}',
         "tools[0].functionDeclarations[0].parameters"),
        (C0.encode() + b', "tools": [{"function_declarations": [{"description": "d"}]}]}',
         "tools[0].function_declarations[0].name"),
        (C0.encode() + b', "toolConfig": {"functionCallingConfig": {"mode": "SOME"}}}',
         "toolConfig.functionCallingConfig.mode"),
        (C0.encode() + b', "generationConfig": {"temperature": "hot"}}',
         "generationConfig.temperature"),
        (C0.encode() + b', "generationConfig": {"maxOutputTokens": 0}}',
         "generationConfig.maxOutputTokens"),
        (C0.encode() + b', "generationConfig": {"maxOutputTokens": -1}}',
         "generationConfig.maxOutputTokens"),
        (C0.encode() + b', "generationConfig": {"temperature": 1e11}}',
         "generationConfig.temperature"),
        (C0.encode() + b', "generationConfig": {"topP": -1}}', "generationConfig.topP"),
        (b'{"contents": [{"parts": [{"text": "\\ud800"}]}]}', "contents[0].parts[0].text"),
        (C0.encode() + b', "generation_config": {"max_output_tokens": 1.5}}',
         "generation_config.max_output_tokens"),
        (C0.encode() + b', "generationConfig": {"stopSequences": [1]}}',
         "generationConfig.stopSequences[0]"),
        (C0.encode() + b', "generationConfig": {"thinkingConfig": {"includeThoughts": "yes"}}}',
         "generationConfig.thinkingConfig.includeThoughts"),
        (C0.encode() + b', "generationConfig": {"thinkingConfig": {"thinkingBudget": "lots"}}}',
         "generationConfig.thinkingConfig.thinkingBudget"),
    ],
)  # fmt: skip
def test_bad_requests_name_the_field_at_fault(body: bytes, field: str) -> None:
    with pytest.raises(CodecError) as caught:
        PLAIN.parse_request(body)
    assert caught.value.field == field and caught.value.status == 400


def test_count_tokens_requests_take_contents_or_a_whole_request() -> None:
    counter = codecs.counter_for_path("/v1beta/models/policy:countTokens")
    assert counter is not None
    plain = counter.parse_count_request(
        b'{"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}'
    )
    assert [m.text for m in plain.messages] == ["hi"] and plain.model == "policy"
    inner = {"model": "models/policy", "contents": [{"parts": [{"text": "hi"}]}],
             "systemInstruction": {"parts": [{"text": "s"}]},
             "tools": [{"functionDeclarations": [{"name": "f"}]}]}  # fmt: skip
    whole = counter.parse_count_request(json.dumps({"generateContentRequest": inner}).encode())
    assert [m.role for m in whole.messages] == ["system", "user"] and whole.tools[0].name == "f"
    with pytest.raises(CodecError) as caught:
        counter.parse_count_request(b'{"generateContentRequest": {"contents": [{"parts": [7]}]}}')
    assert caught.value.field == "generateContentRequest.contents[0].parts[0]"
    assert counter.count_response(42) == {"totalTokens": 42}


# --- responses --------------------------------------------------------------------


CALL = conv.ToolCallPart("call_1", "run_shell_command", '{"command":"ls"}')


def test_responses_have_gemini_shape_with_whole_function_calls() -> None:
    completion = conv.Completion(
        conv.Message("assistant", (conv.ReasoningPart("Look."), conv.TextPart("Running."), CALL)),
        "tool_calls",
        conv.Usage(7, 3),
    )
    body = PLAIN.build_response(_request(PLAIN), completion, response_id="r9", created=1)
    assert body == {
        "candidates": [{
            "content": {"parts": [
                {"text": "Running."},  # thoughts hidden: the request did not ask to include them
                {"functionCall": {"id": "call_1", "name": "run_shell_command",
                                  "args": {"command": "ls"}}},
            ], "role": "model"},
            "finishReason": "STOP",
            "index": 0,
        }],
        "usageMetadata": {"promptTokenCount": 7, "candidatesTokenCount": 3, "totalTokenCount": 10},
        "modelVersion": "policy",
        "responseId": "r9",
    }  # fmt: skip
    length = conv.Completion(conv.Message("assistant", (conv.TextPart("x"),)), "length")
    assert (
        PLAIN.build_response(REQUEST, length, response_id="r", created=1)["candidates"][0][
            "finishReason"
        ]
        == "MAX_TOKENS"
    )


def test_streams_send_each_delta_at_once_and_each_call_whole() -> None:
    encoder = CODEC.stream_encoder(_request(), response_id="r1", created=1)
    assert encoder.start() == b""
    first = encoder.encode(conv.TextDelta("Run"))
    assert first == (
        b'data: {"candidates":[{"content":{"parts":[{"text":"Run"}],"role":"model"},"index":0}],'
        b'"modelVersion":"policy","responseId":"r1"}\r\n\r\n'
    )
    assert encoder.encode(conv.ReasoningDelta("hidden")) == b""
    assert encoder.encode(conv.ToolCallStart(0, "call_1", "run_shell_command")) == b""
    assert encoder.encode(conv.ToolCallArgumentsDelta(0, '{"command":')) == b""
    assert encoder.encode(conv.ToolCallArgumentsDelta(0, '"ls"}')) == b""
    [last] = sse.SSEParser().feed(encoder.encode(conv.StreamEnd("tool_calls", conv.Usage(5, 4))))
    chunk = json.loads(last.data)
    assert chunk["candidates"][0] == {
        "content": {"parts": [{"functionCall": {"id": "call_1", "name": "run_shell_command",
                                                "args": {"command": "ls"}}}], "role": "model"},
        "finishReason": "STOP",
        "index": 0,
    }  # fmt: skip
    assert chunk["usageMetadata"] == {
        "promptTokenCount": 5,
        "candidatesTokenCount": 4,
        "totalTokenCount": 9,
    }


def test_a_failed_stream_ends_with_an_error_chunk() -> None:
    wire = encode_stream(CODEC, REQUEST, [conv.TextDelta("a"), conv.StreamEnd("error")])
    last = json.loads(sse.SSEParser().feed(wire)[-1].data)
    assert last == {
        "error": {"code": 500, "message": "the model failed while generating", "status": "INTERNAL"}
    }
    assert decode_stream(CODEC, [wire])[-1] == conv.StreamEnd("error")


def test_upstream_replies_without_call_ids_get_ids_and_thoughts_count_as_generated() -> None:
    body = {
        "candidates": [{"content": {"role": "model", "parts": [
            {"text": "plan", "thought": True},
            {"functionCall": {"name": "f", "args": {"a": 1}}, "thoughtSignature": "s"},
            {"functionCall": {"name": "g"}},
        ]}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 4,
                          "thoughtsTokenCount": 6, "totalTokenCount": 20},
        "responseId": "abc",
    }  # fmt: skip
    completion = CODEC.parse_response(json.dumps(body).encode())
    assert completion.finish_reason == "tool_calls" and completion.usage == conv.Usage(10, 10)
    assert completion.message.parts == (
        conv.ReasoningPart("plan"),
        conv.ToolCallPart(CODEC.tool_call_id("abc/0"), "f", '{"a":1}'),
        conv.ToolCallPart(CODEC.tool_call_id("abc/1"), "g", "{}"),
    )
    streamed = decode_stream(CODEC, [b"data: " + json.dumps(body).encode() + b"\r\n\r\n"])
    assert conv.assemble(streamed) == completion
    malformed = {
        "candidates": [{"content": {"role": "model"}, "finishReason": "MALFORMED_FUNCTION_CALL"}]
    }
    assert CODEC.parse_response(json.dumps(malformed).encode()).finish_reason == "error"
    blocked = {"promptFeedback": {"blockReason": "SAFETY"}}
    assert CODEC.parse_response(json.dumps(blocked).encode()).message.parts == ()


def test_tool_call_ids_are_deterministic() -> None:
    assert re.fullmatch(r"call_[0-9a-f]{24}", CODEC.tool_call_id("s"))
    assert CODEC.tool_call_id("s") == CODEC.tool_call_id("s") != CODEC.tool_call_id("t")


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "INVALID_ARGUMENT"), (401, "UNAUTHENTICATED"), (404, "NOT_FOUND"),
     (413, "INVALID_ARGUMENT"), (429, "RESOURCE_EXHAUSTED"), (500, "INTERNAL"),
     (502, "UNAVAILABLE"), (503, "UNAVAILABLE"), (418, "FAILED_PRECONDITION"), (599, "INTERNAL")],
)  # fmt: skip
def test_error_bodies_have_the_google_shape(status: int, kind: str) -> None:
    assert CODEC.error_body(status, "no") == {
        "error": {"code": status, "message": "no", "status": kind}
    }


# --- the official SDK (google-genai) reads our bytes, and we read its requests --------------


def _sdk(reply: Reply) -> tuple[genai.Client, list[conv.ChatRequest]]:
    seen: list[conv.ChatRequest] = []

    def handler(http_request: httpx.Request) -> httpx.Response:
        path = http_request.url.raw_path.decode()
        codec = codecs.for_path(path)
        assert codec is not None, path
        request = codec.parse_request(http_request.content)
        seen.append(request)
        return reply(request)

    options = genai_types.HttpOptions(
        base_url="http://sidecar.test", httpx_client=mock_client(handler)
    )
    return genai.Client(api_key="k", http_options=options), seen


ANSWER = conv.Completion(
    conv.Message(
        "assistant",
        (
            conv.ReasoningPart("Check both files."),
            conv.TextPart("Reading."),
            conv.ToolCallPart("call_a", "read_file", '{"path":"a.py"}'),
            conv.ToolCallPart("call_b", "read_file", '{"path":"b.py"}'),
        ),
    ),
    "tool_calls",
    conv.Usage(50, 20),
)
TOOLS: list[Any] = [
    genai_types.Tool(
        function_declarations=[
            genai_types.FunctionDeclaration(
                name="read_file",
                description="Reads a file.",
                parameters_json_schema={
                    "type": "object",
                    "properties": {"path": {"type": "string"}},
                },
            )
        ]
    )
]
CONFIG = genai_types.GenerateContentConfig(
    system_instruction="You are an agent.",
    tools=TOOLS,
    max_output_tokens=64,
    temperature=0.5,
    thinking_config=genai_types.ThinkingConfig(include_thoughts=True),
    automatic_function_calling=genai_types.AutomaticFunctionCallingConfig(disable=True),
)


def _check_response(response: genai_types.GenerateContentResponse) -> None:
    assert response.candidates is not None
    candidate = response.candidates[0]
    assert candidate.finish_reason == genai_types.FinishReason.STOP
    assert candidate.content is not None and candidate.content.parts is not None
    thought, text = candidate.content.parts[:2]
    assert thought.thought is True and thought.text == "Check both files."
    assert text.text == "Reading."
    calls = response.function_calls or []
    assert [(c.id, c.name, c.args) for c in calls] == [
        ("call_a", "read_file", {"path": "a.py"}),
        ("call_b", "read_file", {"path": "b.py"}),
    ]
    assert response.usage_metadata is not None
    assert (
        response.usage_metadata.prompt_token_count,
        response.usage_metadata.candidates_token_count,
    ) == (50, 20)


def test_sdk_reads_our_json_response_and_we_read_its_request() -> None:
    client, seen = _sdk(
        lambda r: json_response(PLAIN.build_response(r, ANSWER, response_id="r-j", created=5))
    )
    response = client.models.generate_content(model="policy", contents="read them", config=CONFIG)
    [request] = seen
    assert [m.role for m in request.messages] == ["system", "user"]
    assert request.tools[0].name == "read_file" and request.tools[0].parameters["type"] == "object"
    assert request.sampling.max_tokens == 64 and request.sampling.temperature == 0.5
    assert request.model == "policy" and not request.stream
    assert response.response_id == "r-j" and response.model_version == "policy"
    _check_response(response)


def _stream_reply(request: conv.ChatRequest) -> httpx.Response:
    events: list[conv.StreamEvent] = [
        conv.ReasoningDelta("Check both "),
        conv.ReasoningDelta("files."),
        conv.TextDelta("Read"),
        conv.TextDelta("ing."),
        conv.ToolCallStart(0, "call_a", "read_file"),
        conv.ToolCallArgumentsDelta(0, '{"path":'),
        conv.ToolCallArgumentsDelta(0, '"a.py"}'),
        conv.ToolCallStart(1, "call_b", "read_file"),
        conv.ToolCallArgumentsDelta(1, '{"path":"b.py"}'),
        conv.StreamEnd("tool_calls", conv.Usage(50, 20)),
    ]
    return sse_response(encode_stream(CODEC, request, events, response_id="r-s"))


def test_sdk_reads_our_stream() -> None:
    client, seen = _sdk(_stream_reply)
    chunks = list(
        client.models.generate_content_stream(model="policy", contents="read them", config=CONFIG)
    )
    assert seen[0].stream
    assert "".join(c.text or "" for c in chunks) == "Reading."
    thoughts = [p.text for c in chunks for p in (c.candidates[0].content.parts or []) if p.thought]  # type: ignore[index, union-attr]
    assert "".join(t or "" for t in thoughts) == "Check both files."
    calls = [(f.id, f.args) for c in chunks for f in (c.function_calls or [])]
    assert calls == [("call_a", {"path": "a.py"}), ("call_b", {"path": "b.py"})]
    last = chunks[-1]
    assert last.candidates and last.candidates[0].finish_reason == genai_types.FinishReason.STOP
    assert last.usage_metadata is not None and last.usage_metadata.total_token_count == 70
    assert all(c.response_id == "r-s" for c in chunks)


def test_sdk_sends_the_follow_up_we_parse_and_raises_on_our_errors() -> None:
    client, seen = _sdk(
        lambda r: json_response(PLAIN.build_response(r, ANSWER, response_id="r", created=1))
    )
    first = client.models.generate_content(model="policy", contents="read them", config=CONFIG)
    assert first.candidates is not None and first.candidates[0].content is not None
    results = [
        genai_types.Part.from_function_response(name="read_file", response={"output": "x = 1"}),
        genai_types.Part.from_function_response(name="read_file", response={"error": "missing"}),
    ]
    contents = [
        genai_types.Content(role="user", parts=[genai_types.Part(text="read them")]),
        first.candidates[0].content,
        genai_types.Content(role="user", parts=results),
    ]
    client.models.generate_content(model="policy", contents=contents, config=CONFIG)
    follow_up = seen[-1]
    assert [m.role for m in follow_up.messages] == ["system", "user", "assistant", "tool", "tool"]
    tool_results = [m.parts[0] for m in follow_up.messages[3:]]
    assert [(r.tool_call_id, r.text, r.is_error) for r in tool_results] == [  # type: ignore[union-attr]
        ("call_a", "x = 1", False),
        ("call_b", "missing", True),
    ]

    failing, _ = _sdk(lambda r: httpx.Response(400, json=CODEC.error_body(400, "contents[0]: bad")))
    with pytest.raises(genai_errors.ClientError) as caught:
        failing.models.generate_content(model="policy", contents="hi")
    assert (caught.value.code, caught.value.status) == (400, "INVALID_ARGUMENT")
    assert "contents[0]: bad" in str(caught.value.message)
