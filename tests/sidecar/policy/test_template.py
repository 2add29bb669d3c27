"""PolicyTokenizer and IncrementalDetokenizer against the committed tiny tokenizer."""

from __future__ import annotations

import functools
import http.server
import json
from array import array
from collections.abc import Iterator
from pathlib import Path

import local_http
import pytest
import tiny_policy
from hypothesis import given, settings
from hypothesis import strategies as st
from openforge import chat_template
from openforge.wire import codecs
from openforge.wire import conversation as cv
from openforge_sidecar.policy import stored, template
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from traced import traced

TINY = tiny_policy.DIR

SHELL = cv.Tool(
    name="shell",
    description="Run a command.",
    parameters={
        "type": "object",
        "properties": {"command": {"type": "array", "items": {"type": "string"}}},
        "required": ["command"],
    },
)


tiny = tiny_policy.load


def user(text: str) -> cv.Message:
    return cv.Message("user", (cv.TextPart(text),))


def tool_result(call_id: str, text: str) -> cv.Message:
    return cv.Message("tool", (cv.ToolResultPart(call_id, (cv.TextPart(text),)),))


def test_render_full_conversation_exactly() -> None:
    messages = [
        cv.Message("system", (cv.TextPart("Be brief."),)),
        user("Please run `ls` now"),
        cv.Message(
            "assistant",
            (
                cv.ReasoningPart("I will run it."),
                cv.TextPart("Running."),
                cv.ToolCallPart("call_0", "shell", '{"command":["bash","-lc","ls"]}'),
                cv.ToolCallPart("call_1", "shell", '{"command":["pwd"]}'),
            ),
        ),
        tool_result("call_0", "a.txt"),
        tool_result("call_1", "/work"),
        cv.Message("assistant", (cv.TextPart("Done."),)),
        user("Thanks"),
    ]
    tools_json = json.dumps(
        {
            "type": "function",
            "function": {
                "name": "shell",
                "description": "Run a command.",
                "parameters": SHELL.parameters,
            },
        },
        separators=(",", ":"),
    )
    expected = (
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to "
        "assist with the user query.\n\nYou are provided with function signatures within "
        "<tools></tools> XML tags:\n<tools>\n" + tools_json + "\n</tools>\n\nFor each function "
        "call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\nPlease run `ls` now<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nI will run it.\n</think>\n\nRunning.\n"
        '<tool_call>\n{"name": "shell", "arguments": {"command": ["bash", "-lc", "ls"]}}\n'
        "</tool_call>\n"
        '<tool_call>\n{"name": "shell", "arguments": {"command": ["pwd"]}}\n</tool_call>'
        "<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\na.txt\n</tool_response>\n"
        "<tool_response>\n/work\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nDone.<|im_end|>\n"
        "<|im_start|>user\nThanks<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tiny().render(messages, [SHELL], add_generation_prompt=True) == expected


HARNESS_REQUESTS = Path(__file__).resolve().parents[2] / "fixtures" / "harness_requests"
RECORDED = [
    (
        folder.name,
        entry["file"],
        entry["path"] + (f"?{entry['query']}" if entry.get("query") else ""),
    )
    for folder in sorted(HARNESS_REQUESTS.iterdir())
    for entry in json.loads((folder / "index.json").read_text())
]


@pytest.mark.parametrize(("harness", "file", "path"), RECORDED)
def test_render_ids_are_the_ids_of_the_rendered_text(
    harness: str, file: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real harnesses' requests (system prompts of 20 K characters, tools, tool calls):
    the template's text encoded as it is written is the IDs of the text."""
    monkeypatch.setattr(template, "WHOLE_PROMPT_CHARS", 0)  # chunk by chunk, however short
    codec = codecs.for_path(path)
    assert codec is not None, path
    request = codec.parse_request((HARNESS_REQUESTS / harness / file).read_bytes())
    whole = tiny().encode_ids(
        tiny().render(request.messages, request.tools, add_generation_prompt=True)
    )
    assert tiny().render_ids(request.messages, request.tools, add_generation_prompt=True) == whole


def test_render_ids_never_hold_the_prompts_whole_text() -> None:
    """A conversation of 1,000 turns: rendered whole, its text (and the template's
    pieces of it) were held beside the messages and the IDs; written piece by piece,
    what is held beyond the IDs is a batch."""
    turns = [
        cv.Message(("user", "assistant")[i % 2], (cv.TextPart(f"turn {i} " + "word " * 398),))
        for i in range(1_001)
    ]
    text = tiny().render(turns, (), add_generation_prompt=True)
    rendered = traced(lambda: tiny().render_ids(turns, (), add_generation_prompt=True))
    ids, kept, peak = rendered.value, rendered.kept, rendered.peak  # kept: IDs, pieces cached
    assert ids == tiny().encode_ids(text)
    assert peak - kept < len(text) / 4, (peak, kept, len(text))  # rendered whole: ~len(text)


def test_render_without_tools_has_no_default_system() -> None:
    text = tiny().render([user("hi")], [], add_generation_prompt=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n"


def test_render_tools_without_system_uses_default_system() -> None:
    text = tiny().render([user("hi")], [SHELL], add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n")
    assert text.endswith("<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_tool_call_first_in_turn_has_no_leading_newline() -> None:
    call = cv.ToolCallPart("c", "shell", '{"command":["ls"]}')
    text = tiny().render([cv.Message("assistant", (call,))], [], add_generation_prompt=False)
    assert text == (
        '<|im_start|>assistant\n<tool_call>\n{"name": "shell", "arguments": {"command": ["ls"]}}'
        "\n</tool_call><|im_end|>\n"
    )


def test_non_object_arguments_render_verbatim() -> None:
    call = cv.ToolCallPart("c", "shell", "not json {")
    text = tiny().render([cv.Message("assistant", (call,))], [], add_generation_prompt=False)
    assert '"arguments": not json {}' in text


def test_images_render_as_placeholder_token() -> None:
    message = cv.Message(
        "user", (cv.TextPart("look: "), cv.ImagePart("data:image/png;base64,AA=="))
    )
    text = tiny().render([message], [], add_generation_prompt=False)
    assert text == "<|im_start|>user\nlook: <image><|im_end|>\n"
    image_id = tiny().encode("<image>")
    assert len(image_id) == 1
    assert image_id[0] in tiny().encode(text)


def test_image_in_tool_result_renders_as_placeholder() -> None:
    result = cv.ToolResultPart("c", (cv.TextPart("shot:"), cv.ImagePart("https://x/y.png")))
    text = tiny().render([cv.Message("tool", (result,))], [], add_generation_prompt=False)
    assert text == "<|im_start|>user\n<tool_response>\nshot:<image>\n</tool_response><|im_end|>\n"


def test_wrong_parts_are_rejected_naming_the_message() -> None:
    bad = cv.Message("user", (cv.ToolCallPart("c", "x", "{}"),))
    with pytest.raises(ValueError, match=r"messages\[1\]"):
        tiny().render([user("hi"), bad], [], add_generation_prompt=False)
    with pytest.raises(ValueError, match=r"messages\[0\]: a tool message"):
        tiny().render([cv.Message("tool", (cv.TextPart("x"),))], [], add_generation_prompt=False)


def test_special_tokens_are_single_ids_and_nothing_is_added() -> None:
    tok = tiny()
    for tag in (
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
        "<think>",
        "</think>",
        "<image>",
    ):
        assert len(tok.encode(tag)) == 1, tag
    assert tok.encode("") == []
    text = "<|im_start|>user\nhé 日本 🙂 <tool_call>{}</tool_call><|im_end|>\n"
    assert tok.decode(tok.encode(text)) == text


def test_stop_tokens_and_eos() -> None:
    tok = tiny()
    assert tok.eos_token == "<|im_end|>"
    expected = {tok.encode("<|im_end|>")[0], tok.encode("<|endoftext|>")[0]}
    assert tok.stop_token_ids == frozenset(expected)


def test_config_errors_name_the_field() -> None:
    tokenizer_json = (TINY / "tokenizer.json").read_text()
    config = json.loads((TINY / "tokenizer_config.json").read_text())
    del config["chat_template"]
    with pytest.raises(ValueError, match="chat_template"):
        template.PolicyTokenizer.from_texts(
            tokenizer_json=tokenizer_json, config_json=json.dumps(config)
        )
    config = json.loads((TINY / "tokenizer_config.json").read_text())
    config["eos_token"] = None
    with pytest.raises(ValueError, match="eos_token"):
        template.PolicyTokenizer.from_texts(
            tokenizer_json=tokenizer_json, config_json=json.dumps(config)
        )
    with pytest.raises(FileNotFoundError):
        template.PolicyTokenizer.load("/nonexistent/tokenizer/dir")


def test_named_template_list_and_object_eos_are_accepted() -> None:
    config = json.loads((TINY / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "default", "template": config["chat_template"]}]
    config["eos_token"] = {"content": "<|im_end|>"}
    tok = template.PolicyTokenizer.from_texts(
        tokenizer_json=(TINY / "tokenizer.json").read_text(), config_json=json.dumps(config)
    )
    assert tok.render([user("x")], [], add_generation_prompt=False) == (
        "<|im_start|>user\nx<|im_end|>\n"
    )
    assert tok.eos_token == "<|im_end|>"


@pytest.fixture
def file_server() -> Iterator[str]:
    """Serve the tiny tokenizer the way the engine does, on 127.0.0.1."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            prefix = "/openforge/v1/tokenizer/"
            name = self.path[len(prefix) :] if self.path.startswith(prefix) else ""
            if name not in {"tokenizer.json", "tokenizer_config.json"}:
                self.send_error(404)
                return
            body = (TINY / name).read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with local_http.serving(Handler) as url:
        yield url + "/"


def test_load_from_engine_url(file_server: str) -> None:
    tok = template.PolicyTokenizer.load(file_server)
    messages = [user("hi")]
    assert tok.render(messages, [SHELL], add_generation_prompt=True) == tiny().render(
        messages, [SHELL], add_generation_prompt=True
    )
    assert tok.encode("hello world") == tiny().encode("hello world")


# --- incremental detokenization ------------------------------------------------


def detokenize(tok: template.PolicyTokenizer, ids: list[int]) -> list[str]:
    detok = template.IncrementalDetokenizer(tok)
    return [detok.push(i) for i in ids] + [detok.flush()]


def test_characters_split_across_tokens_come_out_whole() -> None:
    tok = tiny()
    ids = tok.encode("日本🙂")
    assert len(ids) > 3  # the tiny vocabulary splits these into byte tokens
    deltas = detokenize(tok, ids)
    assert "".join(deltas) == "日本🙂"
    assert all(d in {"", "日", "本", "🙂"} for d in deltas)


def test_unfinished_character_is_flushed_as_replacement() -> None:
    tok = tiny()
    ids = tok.encode("🙂")
    deltas = detokenize(tok, ids[:-1])
    assert deltas[:-1] == [""] * (len(ids) - 1)
    assert deltas[-1] == tok.decode(ids[:-1]) == "\ufffd"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=4095), max_size=40))
def test_deltas_concatenate_to_decode_of_any_ids(ids: list[int]) -> None:
    tok = tiny()
    assert "".join(detokenize(tok, ids)) == tok.decode(ids)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=60))
def test_deltas_of_encoded_text_are_the_text(text: str) -> None:
    tok = tiny()
    assert "".join(detokenize(tok, tok.encode(text))) == text


@functools.cache
def metaspace_tokenizer() -> template.PolicyTokenizer:
    """A non-byte-level (SentencePiece-like) tokenizer, for the windowed path."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=200, special_tokens=["<unk>", "<|im_end|>"], show_progress=False
    )
    tok.train_from_iterator(["hello world the quick brown fox"] * 5 + ["über café"], trainer)
    config = {"chat_template": "{{ messages[0].content }}", "eos_token": "<|im_end|>"}
    return template.PolicyTokenizer.from_texts(
        tokenizer_json=tok.to_str(), config_json=json.dumps(config)
    )


def test_windowed_detokenizer_for_non_byte_level_tokenizers() -> None:
    tok = metaspace_tokenizer()
    assert tok.token_bytes(0) is None
    ids = tok.encode("hello world über the café")
    assert "".join(detokenize(tok, ids)) == tok.decode(ids)
    assert tok.stop_token_ids == frozenset(tok.encode("<|im_end|>"))


def test_out_of_vocabulary_id_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="outside the vocabulary"):
        template.IncrementalDetokenizer(tiny()).push(10**6)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.sampled_from(["<|im_start|>", "<|im_end|>", "<tool_call>", "\n", " ", "  "])
        | st.text(max_size=20),
        max_size=8,
    ).map("".join)
)
def test_encode_gives_the_ids_of_the_tokenizers_own_encode(text: str) -> None:
    """encode skips the offsets; the IDs must be exactly those of a plain encode."""
    for tok in (tiny(), metaspace_tokenizer()):
        assert tok.encode(text) == tok._tokenizer.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize(
    "source",
    [
        "{{ m.role }}|{{ m.missing is defined }}|{{ m.missing }}|{{ m.get('role') }}",
        "{% for k, v in m.items() %}{{ k }}={{ v }};{% endfor %}{{ m.keys() | list | length }}",
        "{{ m.items }}{{ m.values is defined }}{{ m.nested.deep }}"
        "{{ m.nested.missing is defined }}",
        "{{ m.__class__ }}|{{ m.copy is defined }}|{{ m.update is defined }}",
    ],
)
def test_dict_attribute_lookup_matches_the_stock_sandbox(source: str) -> None:
    """The shortcut for plain dicts gives what Jinja's own sandbox gives, unsafe names included."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    stock = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    message = {"role": "user", "items": "a key named like a method", "nested": {"deep": 1}}
    ours = chat_template.environment().from_string(source).render(m=message)
    assert ours == stock.from_string(source).render(m=message)


def test_a_long_prompts_ids_go_to_a_file_as_they_are_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a file to spill to, a long prompt's IDs are never all in memory (a 30 MB
    prompt's are 25 MB, which the history held beside its messages and the template's
    text of them): past ``stored.SPILL_IDS``, they are written as they are made."""
    monkeypatch.setattr(template, "WHOLE_PROMPT_CHARS", 0)
    turns = [
        cv.Message(("user", "assistant")[i % 2], (cv.TextPart(f"turn {i} " + "word " * 398),))
        for i in range(1_001)
    ]
    held = traced(lambda: tiny().render_ids(turns, (), add_generation_prompt=True))
    whole = held.value
    assert isinstance(whole, array) and len(whole) > 4 * stored.SPILL_IDS // 3
    path = tmp_path / "prompt.ids"
    spilled = traced(lambda: tiny().render_ids(turns, (), add_generation_prompt=True, spill=path))
    ids = spilled.value
    assert isinstance(ids, stored.StoredIds) and ids.path == path and ids.load() == whole
    beyond = (len(whole) - stored.SPILL_IDS) * whole.itemsize  # what the file spares
    assert held.peak - spilled.peak > beyond * 3 / 4, (held.peak, spilled.peak, beyond)
