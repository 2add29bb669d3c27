"""OutputParser: incremental parsing of generated text into stream events."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
import tiny_policy
from hypothesis import given, settings
from hypothesis import strategies as st
from openforge.wire import conversation as cv
from openforge_sidecar.policy import toolparse

TAGS = ("<think>", "</think>", "<tool_call>", "</tool_call>")


tiny = tiny_policy.load


def call_id(index: int) -> str:
    return f"call_{index}"


def parse(chunks: list[str], reason: str = "stop") -> list[cv.StreamEvent]:
    parser = toolparse.OutputParser(call_id)
    events: list[cv.StreamEvent] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    return events + parser.finish(reason)


def chars(text: str) -> list[str]:
    return list(text)


def test_plain_text_streams_immediately() -> None:
    parser = toolparse.OutputParser(call_id)
    assert parser.feed("Hello") == [cv.TextDelta("Hello")]
    assert parser.feed(" world") == [cv.TextDelta(" world")]
    assert parser.finish("stop") == [cv.StreamEnd("stop")]


def test_only_a_possible_tag_prefix_is_held_back() -> None:
    parser = toolparse.OutputParser(call_id)
    assert parser.feed("a <b> c\n<tool") == [cv.TextDelta("a <b> c")]
    assert parser.feed("box") == [cv.TextDelta("\n<toolbox")]
    assert parser.feed("\n") == []
    assert parser.finish("length") == [cv.TextDelta("\n"), cv.StreamEnd("length")]


def test_output_may_open_with_think_only_at_start() -> None:
    parser = toolparse.OutputParser(call_id)
    assert parser.feed("<thi") == []
    assert parser.feed("s is not thinking <think>") == [
        cv.TextDelta("<this is not thinking <think>")
    ]


def test_reasoning_then_text() -> None:
    text = "<think>\nLet me see.\nOK\n</think>\n\nThe answer."
    events = parse(chars(text))
    done = cv.assemble(events)
    assert done.message.parts == (cv.ReasoningPart("Let me see.\nOK"), cv.TextPart("The answer."))
    assert done.finish_reason == "stop"
    # reasoning streams before </think> arrives
    parser = toolparse.OutputParser(call_id)
    assert parser.feed("<think>\nabc") == [cv.ReasoningDelta("abc")]
    assert parser.feed("\n</thi") == []
    assert parser.feed("nk>\n\nx") == [cv.TextDelta("x")]


def test_empty_think_block_is_kept_as_empty_reasoning() -> None:
    done = cv.assemble(parse(["<think>\n\n</think>\n\n", "hi"]))
    assert done.message.parts == (cv.ReasoningPart(""), cv.TextPart("hi"))


def test_unterminated_think_is_all_reasoning() -> None:
    done = cv.assemble(parse(["<think>\nhmm\n</thi"], "length"))
    assert done.message.parts == (cv.ReasoningPart("hmm\n</thi"),)
    assert done.finish_reason == "length"


def test_tool_call_is_emitted_when_it_closes() -> None:
    parser = toolparse.OutputParser(call_id)
    assert parser.feed("I'll run it.\n<tool_call>\n") == [cv.TextDelta("I'll run it.")]
    assert parser.feed('{"name": "shell", "arguments": {"command": ["ls", "-l"]}}\n') == []
    assert parser.feed("</tool_call>") == [
        cv.ToolCallStart(0, "call_0", "shell"),
        cv.ToolCallArgumentsDelta(0, '{"command":["ls","-l"]}'),
    ]
    assert parser.finish("stop") == [cv.StreamEnd("tool_calls")]


def test_two_tool_calls_drop_the_newline_between() -> None:
    text = (
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": {"x": "ü"}}\n</tool_call>'
    )
    done = cv.assemble(parse(chars(text)))
    assert done.message.parts == (
        cv.ToolCallPart("call_0", "a", "{}"),
        cv.ToolCallPart("call_1", "b", '{"x":"ü"}'),
    )
    assert done.finish_reason == "tool_calls"


@pytest.mark.parametrize(
    "body",
    [
        "\n{not json}\n",
        '\n{"name": "x"}\n',  # no arguments
        '\n{"name": "", "arguments": {}}\n',
        '\n["name", "arguments"]\n',
        '\n{"name": 3, "arguments": {}}\n',
    ],
)
def test_malformed_tool_call_comes_out_as_text(body: str) -> None:
    text = f"Try:\n<tool_call>{body}</tool_call> after"
    events = parse(chars(text))
    done = cv.assemble(events)
    assert done.message.parts == (cv.TextPart(text),)
    assert done.finish_reason == "stop"


def test_unterminated_tool_call_comes_out_as_text_at_finish() -> None:
    text = 'ok\n<tool_call>\n{"name": "shell", "argu'
    parser = toolparse.OutputParser(call_id)
    assert parser.feed(text) == [cv.TextDelta("ok")]
    assert parser.finish("length") == [
        cv.TextDelta('\n<tool_call>\n{"name": "shell", "argu'),
        cv.StreamEnd("length"),
    ]


def test_text_after_a_tool_call_is_kept() -> None:
    text = '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\nmore'
    done = cv.assemble(parse([text]))
    assert done.message.parts == (cv.ToolCallPart("call_0", "a", "{}"), cv.TextPart("\nmore"))


def test_non_object_arguments_are_kept_as_json() -> None:
    done = cv.assemble(parse(['<tool_call>\n{"name": "a", "arguments": "ls -l"}\n</tool_call>']))
    assert done.message.parts == (cv.ToolCallPart("call_0", "a", '"ls -l"'),)


def test_finish_rules() -> None:
    parser = toolparse.OutputParser(call_id)
    with pytest.raises(ValueError, match="finish_reason 'abort'"):
        parser.finish("abort")
    assert parser.finish("stop") == [cv.StreamEnd("stop")]
    with pytest.raises(RuntimeError):
        parser.feed("x")
    with pytest.raises(RuntimeError):
        parser.finish("stop")


# --- the round trip through the chat template ---------------------------------

_plain = st.text(
    alphabet=st.sampled_from(list("abc xyz<>/\n\t{}\"':,é日🙂_")),
    max_size=30,
).filter(lambda s: not any(tag in s for tag in TAGS))

_json_scalar = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | _plain
_json_value = st.recursive(
    _json_scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_plain, inner, max_size=3),
    max_leaves=8,
)
_arguments = st.dictionaries(_plain, _json_value, max_size=4)
_name = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,20}", fullmatch=True)


@st.composite
def assistant_messages(draw: Any) -> cv.Message:
    parts: list[cv.Part] = []
    reasoning = draw(st.none() | _plain)
    if reasoning is not None:
        parts.append(cv.ReasoningPart(reasoning))
    content = draw(_plain)
    if content:
        parts.append(cv.TextPart(content))
    for index, (name, arguments) in enumerate(
        draw(st.lists(st.tuples(_name, _arguments), max_size=3))
    ):
        compact = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
        parts.append(cv.ToolCallPart(call_id(index), name, compact))
    return cv.Message("assistant", tuple(parts))


def generated_text(message: cv.Message) -> str:
    """The text a policy generates for ``message``, per the chat template."""
    history = [cv.Message("user", (cv.TextPart("hi"),))]
    prompt = tiny().render(history, [], add_generation_prompt=True)
    full = tiny().render([*history, message], [], add_generation_prompt=False)
    assert full.startswith(prompt) and full.endswith("<|im_end|>\n")
    return full[len(prompt) : -len("<|im_end|>\n")]


@settings(max_examples=300, deadline=None)
@given(assistant_messages(), st.data())
def test_round_trip_through_the_template(message: cv.Message, data: st.DataObject) -> None:
    text = generated_text(message)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=8)))
    bounds = [0, *cuts, len(text)]
    chunks = [text[a:b] for a, b in itertools.pairwise(bounds)]
    done = cv.assemble(parse(chunks))
    assert done.message == message
    assert done.finish_reason == ("tool_calls" if message.tool_calls else "stop")
    assert generated_text(done.message) == text


_PIECES = ["a", "b", "\n", "<", "/", "{", "}", '"', *TAGS, '{"name": "f", "arguments": {}}']


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=14).map("".join), st.data())
def test_chunking_never_matters_and_text_is_never_lost(text: str, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=6)))
    bounds = [0, *cuts, len(text)]
    events = parse([text[a:b] for a, b in itertools.pairwise(bounds)])
    assert cv.assemble(events) == cv.assemble(parse([text]))
    assert isinstance(events[-1], cv.StreamEnd)
    assert all(not isinstance(e, cv.StreamEnd) for e in events[:-1])
    parsed_anything = any(isinstance(e, cv.ToolCallStart | cv.ReasoningDelta) for e in events)
    if not parsed_anything:  # no tag took effect, so every character is text
        assert "".join(e.text for e in events if isinstance(e, cv.TextDelta)) == text
