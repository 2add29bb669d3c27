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
from openforge.wire.codecs import openai_responses
from openforge.wire.codecs.errors import CodecError

CODEC = openai_responses.CODEC
PNG = "data:image/png;base64," + base64.b64encode(bytes(range(256)) * 3).decode()
PATCH = "*** Begin Patch\n*** Update File: a.py\n@@\n-x = 1\n+x = 2\n*** End Patch\n"

CODEX_REQUEST: dict[str, Any] = {
    "model": "gpt-5-codex",
    "instructions": "You are Codex, a coding agent.",
    "input": [
        {"type": "message", "role": "developer",
         "content": [{"type": "input_text", "text": "<permissions>workspace-write</permissions>"}]},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text",
                      "text": "<environment_context>cwd=/repo</environment_context>"}]},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "fix the bug"}]},
        {"type": "reasoning", "id": "rs_1",
         "summary": [{"type": "summary_text", "text": "List files."}],
         "content": None, "encrypted_content": "gAAAAB-opaque"},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Looking."}]},
        {"type": "function_call", "id": "fc_1", "name": "shell",
         "arguments": "{\"command\":[\"ls\"]}", "call_id": "call_1"},
        {"type": "function_call", "id": "fc_2", "name": "shell",
         "arguments": "{\"command\":[\"cat\",\"a.py\"]}", "call_id": "call_2"},
        {"type": "function_call_output", "call_id": "call_1", "output": "a.py\n"},
        {"type": "function_call_output", "call_id": "call_2", "output": "x = 1\n"},
        {"type": "custom_tool_call", "id": "ctc_1", "status": "completed", "call_id": "call_3",
         "name": "apply_patch", "input": PATCH},
        {"type": "custom_tool_call_output", "call_id": "call_3", "output": "Done!"},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Fixed."}]},
        {"role": "user", "content": [{"type": "input_text", "text": "and this?"},
                                     {"type": "input_image", "image_url": PNG, "detail": "auto"}]},
    ],
    "tools": [
        {"type": "function", "name": "shell", "description": "Runs a shell command.",
         "strict": False,
         "parameters": {"type": "object", "properties": {"command": {"type": "array"}},
                        "required": ["command"]}},
        {"type": "custom", "name": "apply_patch", "description": "Apply a patch.",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch"}},
        {"type": "web_search"},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "session-1",
}  # fmt: skip


def _request(**fields: Any) -> conv.ChatRequest:
    body = {"model": "policy", "input": "hi", **fields}
    return CODEC.parse_request(json.dumps(body).encode())


CUSTOM_REQUEST = _request(tools=CODEX_REQUEST["tools"])
custom_completions = sequenced_completions(custom_names=("apply_patch",))


# --- properties ---------------------------------------------------------------


def _check_grammar(wire: bytes) -> list[dict[str, Any]]:
    """Every event typed and numbered in order; items opened, filled and closed in place."""
    events = sse.SSEParser().feed(wire)
    bodies = [json.loads(e.data) for e in events]
    assert [e.event for e in events] == [b["type"] for b in bodies]
    assert [b["sequence_number"] for b in bodies] == list(range(len(bodies)))
    assert [b["type"] for b in bodies[:2]] == ["response.created", "response.in_progress"]
    open_items: dict[int, str] = {}
    added = 0
    for body in bodies[2:-1]:
        if body["type"] == "response.output_item.added":
            assert body["output_index"] == added and not open_items
            open_items[added] = body["item"]["id"]
            added += 1
        elif body["type"] == "response.output_item.done":
            assert open_items.pop(body["output_index"]) == body["item"]["id"]
        else:
            assert open_items[body["output_index"]] == body["item_id"]
    assert not open_items
    return bodies


@settings(deadline=None)  # a shared 2-core machine makes timings noisy
@given(st.data())
def test_stream_decodes_to_the_encoded_completion(data: st.DataObject) -> None:
    completion = data.draw(custom_completions)
    events = data.draw(events_for(completion))
    wire = encode_stream(CODEC, CUSTOM_REQUEST, events)
    bodies = _check_grammar(wire)
    final = CODEC.build_response(
        CUSTOM_REQUEST, completion, response_id="resp_1", created=1700000000
    )
    assert bodies[-1]["response"] == final
    assert [b["item"] for b in bodies if b["type"] == "response.output_item.done"] == final[
        "output"
    ]
    assert conv.assemble(decode_stream(CODEC, data.draw(byte_cuts(wire)))) == completion


@settings(deadline=None)  # a shared 2-core machine makes timings noisy
@given(custom_completions)
def test_json_body_parses_back_to_the_completion(completion: conv.Completion) -> None:
    body = CODEC.build_response(CUSTOM_REQUEST, completion, response_id="resp_1", created=1)
    assert CODEC.parse_response(json.dumps(body).encode()) == completion


@settings(deadline=None)  # a shared 2-core machine makes timings noisy
@given(st.data())
def test_a_stream_cut_before_its_end_never_ends(data: st.DataObject) -> None:
    completion = data.draw(custom_completions)
    wire = encode_stream(CODEC, CUSTOM_REQUEST, data.draw(events_for(completion)))
    cut = data.draw(st.integers(0, len(wire) - 1))
    events = decode_stream(CODEC, data.draw(byte_cuts(wire[:cut])))
    assert not any(isinstance(e, conv.StreamEnd) for e in events)


@settings(deadline=None)  # a shared 2-core machine makes timings noisy
@given(st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()))
def test_parse_request_raises_only_codec_errors(body: bytes) -> None:
    with contextlib.suppress(CodecError):
        CODEC.parse_request(body)


_keys = st.sampled_from(
    ["model", "input", "instructions", "role", "content", "type", "text", "image_url", "call_id",
     "name", "arguments", "output", "summary", "tools", "tool_choice", "mode", "parameters"]
)  # fmt: skip
_values = st.sampled_from(
    ["user", "assistant", "developer", "message", "function_call", "function_call_output",
     "custom_tool_call", "reasoning", "input_text", "input_image", "custom", "function"]
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


@settings(deadline=None)  # a shared 2-core machine makes timings noisy
@given(
    st.lists(
        json_values | st.fixed_dictionaries({"type": _values.map("response.{}".format)}), max_size=5
    )
)
def test_stream_decoder_raises_only_codec_errors(values: list[Any]) -> None:
    decoder = CODEC.stream_decoder()
    for value in values:
        with contextlib.suppress(CodecError):
            decoder.feed(sse.Event(json.dumps(value)))


# --- requests -------------------------------------------------------------------


def test_a_codex_request_parses_to_the_canonical_form() -> None:
    request = CODEC.parse_request(json.dumps(CODEX_REQUEST).encode())
    roles = [m.role for m in request.messages]
    assert roles == ["system", "system", "user", "user", "assistant", "tool", "tool",
                     "assistant", "tool", "assistant", "user"]  # fmt: skip
    assert request.messages[0].text == "You are Codex, a coding agent."
    assert request.messages[1].text == "<permissions>workspace-write</permissions>"
    assert request.messages[4].parts == (
        conv.ReasoningPart("List files."),
        conv.TextPart("Looking."),
        conv.ToolCallPart("call_1", "shell", '{"command":["ls"]}'),
        conv.ToolCallPart("call_2", "shell", '{"command":["cat","a.py"]}'),
    )
    assert request.messages[6].parts == (
        conv.ToolResultPart("call_2", (conv.TextPart("x = 1\n"),), name="shell"),
    )
    patch_call = request.messages[7].parts[0]
    assert isinstance(patch_call, conv.ToolCallPart) and patch_call.name == "apply_patch"
    assert json.loads(patch_call.arguments) == {"input": PATCH}
    assert request.messages[8].parts[0] == conv.ToolResultPart(
        "call_3", (conv.TextPart("Done!"),), name="apply_patch"
    )
    assert request.messages[10].parts == (conv.TextPart("and this?"), conv.ImagePart(PNG, "auto"))
    assert [t.name for t in request.tools] == ["shell", "apply_patch"]
    assert request.tools[1].parameters == openai_responses.CUSTOM_TOOL_PARAMETERS
    assert request.tool_choice == "auto" and request.stream
    assert request.extra["tools"] == CODEX_REQUEST["tools"]
    assert request.extra["reasoning"] == {"effort": "medium", "summary": "auto"}
    assert set(request.extra) == {"tools", "parallel_tool_calls", "reasoning", "store", "include",
                                  "prompt_cache_key"}  # fmt: skip
    assert openai_responses.custom_tool_names(request) == {"apply_patch"}


def test_plain_string_input_and_sampling() -> None:
    request = _request(max_output_tokens=64, temperature=0.2, top_p=0.5,
                       tool_choice={"type": "function", "name": "shell"})  # fmt: skip
    assert request.messages == (conv.Message("user", (conv.TextPart("hi"),)),)
    assert request.sampling == conv.SamplingParams(max_tokens=64, temperature=0.2, top_p=0.5)
    assert request.tool_choice == "shell"
    assert "tools" not in request.extra


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"\xff\xfe", ""),
        (b'"text"', ""),
        (b'{"input": "x"}', "model"),
        (b'{"model": "m"}', "input"),
        (b'{"model": "m", "input": 3}', "input"),
        (b'{"model": "m", "input": [{"type": "message", "role": "user",'
         b' "content": [{"type": "input_file"}]}]}', "input[0].content[0].type"),
        (b'{"model": "m", "input": ["x", {"type": "function_call", "name": "f",'
         b' "arguments": "{}"}]}', "input[0]"),
        (b'{"model": "m", "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}',
         "input[0].call_id"),
        (b'{"model": "m", "input": [{"type": "function_call_output", "call_id": "c",'
         b' "output": 1}]}', "input[0].output"),
        (b'{"model": "m", "input": [{"type": "local_shell_call"}]}', "input[0].type"),
        (b'{"model": "m", "input": [{"type": "message", "role": "user",'
         b' "content": [{"type": "input_image", "file_id": "f"}]}]}',
         "input[0].content[0].image_url"),
        (b'{"model": "m", "input": "x", "tools": [{"type": "function"}]}', "tools[0].name"),
        (b'{"model": "m", "input": "x", "max_output_tokens": 1.5}', "max_output_tokens"),
        (b'{"model": "m", "input": "x", "instructions": ["a"]}', "instructions"),
        (b'{"model": "m", "input": "x", "max_output_tokens": 0}', "max_output_tokens"),
        (b'{"model": "m", "input": "x", "max_output_tokens": -1}', "max_output_tokens"),
        (b'{"model": "m", "input": "x", "temperature": 1e11}', "temperature"),
        (b'{"model": "m", "input": "x", "top_p": 1.5}', "top_p"),
        (b'{"model": "m", "input": "x", "tools": [{"type": "x"}]}', "tools[0].type"),
        (b'{"model": "m", "input": "\\ud800"}', "input"),
        (b'{"model": "m", "input": [{"type": "message", "role": "user",'
         b' "content": "\\ud800\\ud800"}]}', "input[0].content"),
    ],
)  # fmt: skip
def test_bad_requests_name_the_field_at_fault(body: bytes, field: str) -> None:
    with pytest.raises(CodecError) as caught:
        CODEC.parse_request(body)
    assert caught.value.field == field


# --- responses ------------------------------------------------------------------


ANSWER = conv.Completion(
    conv.Message(
        "assistant",
        (
            conv.ReasoningPart("Need to patch a.py."),
            conv.TextPart("Patching now."),
            conv.ToolCallPart("call_s", "shell", '{"command":["ls"]}'),
            conv.ToolCallPart("call_p", "apply_patch", json.dumps({"input": PATCH})),
        ),
    ),
    "tool_calls",
    conv.Usage(40, 25),
)


def test_custom_tool_calls_go_out_as_custom_tool_call_items_with_raw_input() -> None:
    body = CODEC.build_response(CUSTOM_REQUEST, ANSWER, response_id="resp_a", created=3)
    kinds = [item["type"] for item in body["output"]]
    assert kinds == ["reasoning", "message", "function_call", "custom_tool_call"]
    assert body["output"][3]["input"] == PATCH and body["output"][3]["call_id"] == "call_p"
    assert body["output"][2]["id"].startswith("fc_") and body["output"][2]["call_id"] == "call_s"
    assert body["status"] == "completed" and body["usage"]["total_tokens"] == 65
    assert body["tools"] == CODEX_REQUEST["tools"]


def test_a_length_stop_is_an_incomplete_response() -> None:
    completion = conv.Completion(conv.Message("assistant", (conv.TextPart("cut"),)), "length")
    body = CODEC.build_response(CUSTOM_REQUEST, completion, response_id="r", created=1700000000)
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    wire = encode_stream(
        CODEC, CUSTOM_REQUEST, [conv.TextDelta("cut"), conv.StreamEnd("length")], "r"
    )
    last = sse.SSEParser().feed(wire)[-1]
    assert last.event == "response.incomplete"
    assert json.loads(last.data)["response"] == body


def test_a_failed_stream_ends_with_response_failed() -> None:
    wire = encode_stream(CODEC, CUSTOM_REQUEST, [conv.TextDelta("a"), conv.StreamEnd("error")])
    assert sse.SSEParser().feed(wire)[-1].event == "response.failed"
    assert decode_stream(CODEC, [wire])[-1].finish_reason == "error"  # type: ignore[union-attr]


def test_decoder_folds_multi_part_summaries_and_final_only_arguments() -> None:
    events: list[dict[str, Any]] = [
        {"type": "response.output_item.added", "output_index": 0, "item": {"type": "reasoning"}},
        {"type": "response.reasoning_summary_part.added", "output_index": 0, "summary_index": 0},
        {"type": "response.reasoning_summary_text.delta", "output_index": 0, "delta": "one"},
        {"type": "response.reasoning_summary_part.added", "output_index": 0, "summary_index": 1},
        {"type": "response.reasoning_summary_text.delta", "output_index": 0, "delta": "two"},
        {"type": "response.output_item.added", "output_index": 1,
         "item": {"type": "function_call", "call_id": "c1", "name": "f", "arguments": ""}},
        {"type": "response.output_item.done", "output_index": 1,
         "item": {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"a\":1}"}},
        {"type": "response.completed", "response": {"status": "completed",
         "usage": {"input_tokens": 3, "output_tokens": 4}}},
    ]  # fmt: skip
    decoder = CODEC.stream_decoder()
    out = [e for body in events for e in decoder.feed(sse.Event(json.dumps(body)))]
    assert conv.assemble(out) == conv.Completion(
        conv.Message(
            "assistant", (conv.ReasoningPart("one\n\ntwo"), conv.ToolCallPart("c1", "f", '{"a":1}'))
        ),
        "tool_calls",
        conv.Usage(3, 4),
    )


def test_tool_call_ids_are_openai_style_and_deterministic() -> None:
    assert re.fullmatch(r"call_[0-9a-f]{24}", CODEC.tool_call_id("s"))
    assert CODEC.tool_call_id("s") == CODEC.tool_call_id("s") != CODEC.tool_call_id("t")


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


def _stream_reply(request: conv.ChatRequest) -> httpx.Response:
    events: list[conv.StreamEvent] = [
        conv.ReasoningDelta("Need to "),
        conv.ReasoningDelta("patch a.py."),
        conv.TextDelta("Patching "),
        conv.TextDelta("now."),
        conv.ToolCallStart(0, "call_s", "shell"),
        conv.ToolCallArgumentsDelta(0, '{"command":'),
        conv.ToolCallArgumentsDelta(0, '["ls"]}'),
        conv.ToolCallStart(1, "call_p", "apply_patch"),
        conv.ToolCallArgumentsDelta(1, json.dumps({"input": PATCH})[:20]),
        conv.ToolCallArgumentsDelta(1, json.dumps({"input": PATCH})[20:]),
        conv.StreamEnd("tool_calls", conv.Usage(40, 25)),
    ]
    return sse_response(encode_stream(CODEC, request, events, response_id="resp_s"))


def _check_output(response: Any) -> None:
    assert response.status == "completed"
    assert response.output_text == "Patching now."
    reasoning, _, shell, patch = response.output
    assert reasoning.type == "reasoning" and reasoning.summary[0].text == "Need to patch a.py."
    assert shell.type == "function_call" and (shell.call_id, shell.arguments) == (
        "call_s",
        '{"command":["ls"]}',
    )
    assert patch.type == "custom_tool_call" and (patch.call_id, patch.input) == ("call_p", PATCH)
    assert response.usage.input_tokens == 40 and response.usage.total_tokens == 65


def test_sdk_reads_our_json_response() -> None:
    client, seen = _sdk(
        lambda r: json_response(CODEC.build_response(r, ANSWER, response_id="resp_j", created=5))
    )
    response = client.responses.create(model="policy", input="fix it", tools=CODEX_REQUEST["tools"])
    assert openai_responses.custom_tool_names(seen[0]) == {"apply_patch"}
    assert response.id == "resp_j"
    _check_output(response)


def test_sdk_reads_our_event_stream() -> None:
    client, _ = _sdk(_stream_reply)
    events = list(
        client.responses.create(
            model="policy", input="fix it", tools=CODEX_REQUEST["tools"], stream=True
        )
    )
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert (
        "".join(e.delta for e in events if e.type == "response.output_text.delta")
        == "Patching now."
    )
    assert [e.input for e in events if e.type == "response.custom_tool_call_input.done"] == [PATCH]
    completed = events[-1]
    assert completed.type == "response.completed"
    _check_output(completed.response)


def test_sdk_stream_helper_accumulates_our_stream() -> None:
    client, _ = _sdk(_stream_reply)
    with client.responses.stream(
        model="policy", input="fix it", tools=CODEX_REQUEST["tools"]
    ) as stream:
        deltas = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == '{"command":["ls"]}'
    assert final.id == "resp_s"
    _check_output(final)


def test_sdk_raises_on_our_error_body() -> None:
    client, _ = _sdk(lambda r: httpx.Response(429, json=CODEC.error_body(429, "slow down")))
    client = client.with_options(max_retries=0)
    with pytest.raises(openai.RateLimitError) as caught:
        client.responses.create(model="policy", input="x")
    assert caught.value.code == "rate_limit_exceeded"


def _asking(include: list[str] | None) -> conv.ChatRequest:
    body: dict[str, Any] = {"model": "m", "input": "hi", "store": False}
    if include is not None:
        body["include"] = include
    return CODEC.parse_request(json.dumps(body).encode())


SIGNED = conv.Message(
    "assistant", (conv.ReasoningPart("I think so.", "ofs1.sig"), conv.TextPart("Hi"))
)


def test_encrypted_reasoning_is_given_only_when_included_and_only_for_signed_reasoning() -> None:
    completion = conv.Completion(SIGNED, "stop")
    asked = CODEC.build_response(
        _asking([openai_responses.ENCRYPTED_REASONING]), completion, response_id="r", created=1
    )
    sealed = asked["output"][0]["encrypted_content"]
    assert sealed == openai_responses.encrypted_content("I think so.", "ofs1.sig")
    assert sealed.startswith(openai_responses.CONTENT_PREFIX) and sealed.endswith(".ofs1.sig")
    plain = CODEC.build_response(_asking(None), completion, response_id="r", created=1)
    assert "encrypted_content" not in plain["output"][0]
    unsigned = conv.Completion(conv.Message("assistant", (conv.ReasoningPart("x"),)), "stop")
    body = CODEC.build_response(
        _asking([openai_responses.ENCRYPTED_REASONING]), unsigned, response_id="r", created=1
    )
    assert "encrypted_content" not in body["output"][0]


def test_a_streamed_reasoning_item_ends_with_its_encrypted_content() -> None:
    request = _asking([openai_responses.ENCRYPTED_REASONING])
    events = [
        conv.ReasoningDelta("I think "), conv.ReasoningDelta("so."),
        conv.ReasoningSignature("ofs1.sig"), conv.TextDelta("Hi"), conv.StreamEnd("stop"),
    ]  # fmt: skip
    parsed = [
        json.loads(e.data) for e in sse.SSEParser().feed(encode_stream(CODEC, request, events))
    ]
    done = [e["item"] for e in parsed if e["type"] == "response.output_item.done"]
    expected = openai_responses.encrypted_content("I think so.", "ofs1.sig")
    assert done[0]["type"] == "reasoning" and done[0]["encrypted_content"] == expected
    assert parsed[-1]["response"]["output"][0]["encrypted_content"] == expected


def test_replayed_encrypted_content_is_the_reasoning_whatever_the_summary_says() -> None:
    sealed = openai_responses.encrypted_content("I think so.", "ofs1.sig")
    body = {"model": "m", "input": [
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "edited"}],
         "encrypted_content": sealed},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Hi"}]},
    ]}  # fmt: skip
    request = CODEC.parse_request(json.dumps(body).encode())
    assert request.messages[1].parts[0] == conv.ReasoningPart("I think so.", "ofs1.sig")
    # another upstream's encrypted content is opaque: the summary is the reasoning
    body["input"][1]["encrypted_content"] = "gAAAAABo-opaque"
    other = CODEC.parse_request(json.dumps(body).encode())
    assert other.messages[1].parts[0] == conv.ReasoningPart("edited")


@pytest.mark.parametrize("sealed", ["ofr1.", "ofr1.SGk", "ofr1.%%%.ofs1.x", "ofr1.__8.ofs1.x"])
def test_broken_encrypted_content_of_ours_is_refused_naming_the_field(sealed: str) -> None:
    body = {"model": "m", "input": [
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "reasoning", "summary": [], "encrypted_content": sealed},
    ]}  # fmt: skip
    with pytest.raises(CodecError, match=r"input\[1\]\.encrypted_content"):
        CODEC.parse_request(json.dumps(body).encode())
