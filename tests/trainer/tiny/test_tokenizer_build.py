"""The tiny tokenizer: reproducible build, committed assets, template contract."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from openforge_trainer.tiny import tokenizer_build
from tokenizers import Tokenizer

ASSETS = tokenizer_build.committed_assets()


def test_rebuild_reproduces_committed_assets_byte_for_byte(tmp_path: Path) -> None:
    assert tokenizer_build.main(["build", "--out", str(tmp_path)]) == 0
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / name).read_bytes() == (ASSETS / name).read_bytes(), name


def test_assets_are_small_and_complete() -> None:
    assert (ASSETS / "tokenizer.json").stat().st_size < 1_000_000
    tokenizer = Tokenizer.from_file(str(ASSETS / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == tokenizer_build.VOCAB_SIZE
    config = json.loads((ASSETS / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>"
    assert config["pad_token"] == "<|endoftext|>"
    assert config["bos_token"] is None
    assert config["chat_template"] == tokenizer_build.CHAT_TEMPLATE
    decoder = {
        v["content"]: (int(k), v["special"]) for k, v in config["added_tokens_decoder"].items()
    }
    for token in (*tokenizer_build.CONTROL_TOKENS, *tokenizer_build.TAG_TOKENS):
        token_id, special = decoder[token]
        assert tokenizer.token_to_id(token) == token_id
        assert special == (token in tokenizer_build.CONTROL_TOKENS)


def test_tags_survive_skip_special_tokens_but_control_tokens_do_not() -> None:
    tokenizer = Tokenizer.from_file(str(ASSETS / "tokenizer.json"))
    text = "<|im_start|>assistant\n<think>\nx\n</think>\n\n<tool_call>\n{}\n</tool_call><|im_end|>"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    assert tokenizer.decode(ids, skip_special_tokens=True) == (
        "assistant\n<think>\nx\n</think>\n\n<tool_call>\n{}\n</tool_call>"
    )
    for tag in (*tokenizer_build.CONTROL_TOKENS, *tokenizer_build.TAG_TOKENS):
        assert len(tokenizer.encode(tag, add_special_tokens=False).ids) == 1


def test_template_tool_call_grouping_and_generation_prompt() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"type": "function", "function": {"name": "a", "arguments": {"x": 1}}},
                {"type": "function", "function": {"name": "b", "arguments": '{"raw": true}'}},
            ],
        },
        {"role": "tool", "content": "one"},
        {"role": "tool", "content": "two"},
    ]
    text = tokenizer_build.render_chat(messages, add_generation_prompt=True)
    assert text == (
        "<|im_start|>user\ngo<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": {"raw": true}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\none\n</tool_response>\n"
        "<tool_response>\ntwo\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_corpus_is_deterministic_and_varied() -> None:
    first = list(tokenizer_build.corpus(documents=50))
    assert first == list(tokenizer_build.corpus(documents=50))
    assert any("<tool_call>" in doc for doc in first)
    assert len(set(first)) > 40
