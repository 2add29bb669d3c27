"""The test engine's Chat Completions endpoint: what a harness gets from an engine without the
sidecar."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import engine_calls
import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openforge_trainer.serving import completions as protocol
from openforge_trainer.testengine import chat as testengine_chat
from openforge_trainer.testengine import engine as testengine
from openforge_trainer.tiny import tokenizer_build
from tokenizers import Tokenizer

ASSETS = tokenizer_build.committed_assets()
TOKENIZER = Tokenizer.from_file(str(ASSETS / "tokenizer.json"))
SHELL = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": "Runs a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "array", "items": {"type": "string"}}},
            "required": ["command"],
        },
    },
}
TASK = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Please run `echo hi > hello.txt` and then say done"},
]


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    url, stop = testengine.start_in_thread(
        testengine.EngineConfig(ASSETS, model="tiny", max_model_len=4096)
    )
    yield url
    stop()


def chat(url: str, **body: Any) -> dict[str, Any]:
    return engine_calls.answer(url, "/v1/chat/completions", **body)


def chat_stream(url: str, **body: Any) -> list[dict[str, Any]]:
    return engine_calls.stream(url, "/v1/chat/completions", **body)


def after_the_call(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The task's conversation continued with ``answer``'s tool call and its output."""
    message = answer["choices"][0]["message"]
    call = message["tool_calls"][0]
    return [
        *TASK,
        {"role": "assistant", "content": None, "tool_calls": message["tool_calls"]},
        {"role": "tool", "tool_call_id": call["id"], "content": "ok"},
    ]


# --- the endpoint ----------------------------------------------------------------------


def test_the_prompt_is_the_chat_template_rendering(engine: str) -> None:
    answer = chat(engine, messages=TASK, tools=[SHELL])
    text = tokenizer_build.render_chat(TASK, [SHELL], add_generation_prompt=True)
    expected = len(TOKENIZER.encode(text, add_special_tokens=False).ids)
    assert answer["usage"]["prompt_tokens"] == expected
    assert answer["object"] == "chat.completion" and answer["model"] == "tiny"


def test_a_tool_call_is_parsed_out_of_the_text(engine: str) -> None:
    answer = chat(engine, messages=TASK, tools=[SHELL])
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "shell"
    assert json.loads(call["function"]["arguments"]) == {
        "command": ["bash", "-lc", "echo hi > hello.txt"]
    }


def test_the_stream_says_what_the_whole_answer_says(engine: str) -> None:
    for messages in (TASK, after_the_call(chat(engine, messages=TASK, tools=[SHELL]))):
        whole = chat(engine, messages=messages, tools=[SHELL])["choices"][0]
        chunks = chat_stream(
            engine, messages=messages, tools=[SHELL], stream_options={"include_usage": True}
        )
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        content, calls = outcome(deltas)
        assert content == (whole["message"]["content"] or "")
        assert calls == [
            (c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in whole["message"].get("tool_calls", [])
        ]
        finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
        assert finishes[-1] == whole["finish_reason"] and set(finishes[:-1]) == {None}
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


def test_a_text_answer_streams_token_by_token(engine: str) -> None:
    messages = after_the_call(chat(engine, messages=TASK, tools=[SHELL]))
    chunks = chat_stream(engine, messages=messages, tools=[SHELL])
    texts = [c["choices"][0]["delta"].get("content") for c in chunks[1:-1]]
    assert len(texts) > 3 and all(texts), texts
    assert "".join(texts).startswith("Done")


def test_the_openai_sdk_reads_both_forms(engine: str) -> None:
    client = openai.OpenAI(base_url=f"{engine}/v1", api_key="unused", max_retries=0)
    whole = client.chat.completions.create(model="tiny", messages=TASK, tools=[SHELL])  # type: ignore[arg-type]
    assert whole.choices[0].message.tool_calls
    streamed = client.chat.completions.create(  # type: ignore[call-overload]
        model="tiny",
        messages=TASK,
        tools=[SHELL],
        stream=True,
    )
    names = [
        call.function.name
        for chunk in streamed
        for call in (chunk.choices[0].delta.tool_calls or [] if chunk.choices else [])
        if call.function and call.function.name
    ]
    assert names == ["shell"]


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (b"{", 400, "not valid JSON"),
        (
            b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}',
            400,
            "stream must be a boolean",
        ),
        (
            b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], '
            b'"max_completion_tokens": -1}',
            400,
            "max_completion_tokens must be a positive integer",
        ),
        (b'{"model": "tiny"}', 400, "messages must be a non-empty list"),
        (
            b'{"model": "tiny", "messages": [{"role": "robot", "content": "x"}]}',
            400,
            "messages[0].role",
        ),
        (
            b'{"model": "other", "messages": [{"role": "user", "content": "x"}]}',
            404,
            "does not exist",
        ),
        (
            b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}',
            400,
            "max_tokens",
        ),
    ],
)
def test_errors_name_the_field(engine: str, body: bytes, status: int, fragment: str) -> None:
    response = httpx.post(f"{engine}/v1/chat/completions", content=body, timeout=10)
    assert response.status_code == status and fragment in response.json()["message"]


def test_max_tokens_cuts_the_answer_with_length(engine: str) -> None:
    messages = after_the_call(chat(engine, messages=TASK, tools=[SHELL]))
    answer = chat(engine, messages=messages, tools=[SHELL], max_tokens=3)
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 3


# --- the parts ---------------------------------------------------------------------------


def split(texts: list[str], *, incremental: bool = False) -> list[dict[str, Any]]:
    parser = testengine_chat.ToolCallText(lambda index: f"id{index}", incremental=incremental)
    out = [d for text in texts for d in parser.feed(text)]
    return out + parser.feed("", final=True)


def outcome(deltas: list[dict[str, Any]]) -> tuple[str, list[tuple[str, Any]]]:
    """Content, and each call's name and parsed arguments, as an SDK assembles them from deltas."""
    content = "".join(d.get("content") or "" for d in deltas)
    calls: dict[int, list[str]] = {}
    for call in (c for d in deltas for c in d.get("tool_calls", [])):
        named = calls.setdefault(call["index"], ["", ""])
        named[0] += call["function"].get("name", "")
        named[1] += call["function"].get("arguments", "")
    return content, [(name, json.loads(arguments)) for name, arguments in calls.values()]


def test_text_is_held_back_only_where_a_tag_may_begin() -> None:
    parser = testengine_chat.ToolCallText(lambda index: f"id{index}")
    assert parser.feed("Hello <to") == [{"content": "Hello "}]
    assert parser.feed("day") == [{"content": "<today"}]


def test_a_call_comes_whole_when_its_block_closes() -> None:
    pieces = [
        "Let me look.\n<tool",
        '_call>\n{"name": "ls", ',
        '"arguments": {"path": "."}}\n</tool_call>',
    ]
    deltas = split(pieces)
    assert deltas[0] == {"content": "Let me look."}
    (call,) = deltas[1]["tool_calls"]
    assert call["id"] == "id0" and call["function"] == {"name": "ls", "arguments": '{"path": "."}'}
    assert len(deltas) == 2


@pytest.mark.parametrize(
    "block",
    [
        "<tool_call>not json</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        "<tool_call>{}",
    ],
)
def test_a_block_that_is_no_call_stays_text(block: str) -> None:
    deltas = split([block])
    assert "".join(d["content"] for d in deltas) == block


def test_request_messages_become_template_dicts() -> None:
    body = {
        "messages": [
            {
                "role": "developer",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "f", "arguments": '{"x": 1}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "out"},
        ]
    }
    parsed = testengine_chat.parse_chat_request(json.dumps(body).encode())
    assert parsed.messages == [
        {"role": "system", "content": "ab"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "id": "c1", "function": {"name": "f", "arguments": {"x": 1}}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "out"},
    ]


def test_an_image_part_is_refused_by_name() -> None:
    body = {
        "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
        ]
    }
    with pytest.raises(protocol.RequestError, match=r"messages\[0\]\.content\[0\]"):
        testengine_chat.parse_chat_request(json.dumps(body).encode())


CALL = '<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call>'
PIECES = st.sampled_from(
    ["Done", " ok", "\n", "\n\n", "<", "<tool", CALL, "</tool_call>", "<tool_call>", "{}"]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(PIECES, max_size=12), st.data())
def test_however_the_text_is_cut_the_answer_is_the_same(
    pieces: list[str], data: st.DataObject
) -> None:
    text = "".join(pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    parts = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    whole = outcome(split([text]))
    assert outcome(split(parts)) == whole
    if text.count("<tool_call>") == text.count("</tool_call>") == text.count(CALL):
        # well-formed calls only: streamed, they come as a start and argument pieces
        assert outcome(split(parts, incremental=True)) == whole


def test_newlines_around_a_call_are_not_content() -> None:
    assert outcome(split(["foo\n", "\n", CALL])) == ("foo", [("ls", {"path": "."})])
    assert outcome(split([CALL, "\n"])) == ("", [("ls", {"path": "."})])
    assert outcome(split(["Hello\n\n", "world"])) == ("Hello\n\nworld", [])


def test_a_streamed_call_is_announced_then_its_arguments_follow_as_generated() -> None:
    parser = testengine_chat.ToolCallText(lambda index: f"id{index}", incremental=True)
    assert parser.feed('<tool_call>\n{"name": "ls", "argu') == []
    start, first = parser.feed('ments": {"pa')
    assert start["tool_calls"] == [
        {"index": 0, "id": "id0", "type": "function", "function": {"name": "ls", "arguments": ""}}
    ]
    assert first == {"tool_calls": [{"index": 0, "function": {"arguments": '{"pa'}}]}
    assert parser.feed('th": "."}') == [
        {"tool_calls": [{"index": 0, "function": {"arguments": 'th": "."'}}]}
    ]
    assert parser.feed("}\n</tool_call>") == [
        {"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}
    ]
