"""Warm-start demonstrations, their assistant-token mask, and a short training run."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import torch
from openforge_trainer.tiny import model_build, tokenizer_build, warmstart
from tokenizers import Tokenizer

torch.set_num_threads(1)

HARNESS = warmstart.HarnessSpec.load()
TASK = warmstart.TaskSpec.load()
EOT = tokenizer_build.EOS_TOKEN


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return warmstart.load_tokenizer()


def demo(kind: str, seed: int = 0) -> warmstart.Demo:
    return warmstart.make_demo(random.Random(seed), HARNESS, task=TASK, kind=kind)


def masked_text(tokenizer: Tokenizer, encoded: warmstart.Encoded) -> str:
    return "".join(
        tokenizer.decode([t], skip_special_tokens=False)
        for t, m in zip(encoded.ids, encoded.mask, strict=True)
        if m
    )


def test_demos_render_through_the_chat_template_as_the_harness_asks() -> None:
    tool = demo("tool")
    roles = [m["role"] for m in tool.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert tool.messages[0]["content"] == HARNESS.system_prompt
    item = tool.messages[1]["content"].split('"')[1]
    assert item in TASK.items and tool.messages[1]["content"] == TASK.question(item)
    assert tool.messages[3]["content"] == tool.messages[4]["content"] in TASK.colors
    pieces = warmstart.segments(tool.messages, HARNESS.tools)
    assert "".join(text for text, _ in pieces) == tokenizer_build.render_chat(
        tool.messages, HARNESS.tools
    )
    assert [text for text, assistant in pieces if assistant] == [
        '<tool_call>\n{"name": "lookup_color", "arguments": {}}\n</tool_call>' + EOT,
        tool.messages[4]["content"] + EOT,
    ]
    assert (
        '"name":"lookup_color"' in pieces[0][0]
    )  # the harness's tool schemas are in the system turn


def test_mask_covers_exactly_the_assistant_turns(tokenizer: Tokenizer) -> None:
    for kind in ("tool", "direct"):
        for seed in range(5):
            encoded = warmstart.encode(tokenizer, demo(kind, seed), tools=HARNESS.tools)
            assistant = [
                text
                for text, is_assistant in warmstart.segments(
                    demo(kind, seed).messages, HARNESS.tools
                )
                if is_assistant
            ]
            assert masked_text(tokenizer, encoded) == "".join(assistant)
            assert len(encoded.ids) == len(encoded.mask)
            # the masked tokens are contiguous runs that each end with <|im_end|>
            runs = "".join(map(str, encoded.mask)).split("0")
            ends = [
                i
                for i, (t, m) in enumerate(zip(encoded.ids, encoded.mask, strict=True))
                if m and (i + 1 == len(encoded.ids) or not encoded.mask[i + 1])
            ]
            assert len([r for r in runs if r]) == len(assistant) == len(ends)
            assert all(tokenizer.id_to_token(encoded.ids[i]) == EOT for i in ends)


def test_a_drill_trains_everything_but_the_decision_token(tokenizer: Tokenizer) -> None:
    tool = warmstart.encode(tokenizer, demo("tool"), tools=HARNESS.tools)
    drill = warmstart.encode(tokenizer, demo("drill"), tools=HARNESS.tools)
    assert drill.ids == tool.ids
    first = tool.mask.index(1)
    assert tokenizer.id_to_token(tool.ids[first]) == "<tool_call>"
    assert drill.mask[first] == 0 and drill.mask[first + 1 :] == tool.mask[first + 1 :]


def test_guesses_favour_the_first_color_by_guess_bias() -> None:
    rng = random.Random(0)
    guesses = [
        warmstart.make_demo(rng, HARNESS, task=TASK, kind="direct", guess_bias=0.5).messages[-1][
            "content"
        ]
        for _ in range(600)
    ]
    share = guesses.count(TASK.colors[0]) / len(guesses)
    assert 0.45 < share < 0.63  # 0.5 + 0.5 / 12
    assert set(guesses) == set(TASK.colors)


def test_shared_prefix_loss_equals_the_plain_loss(tokenizer: Tokenizer, tmp_path: Path) -> None:
    model = model_build.load_model(model_build.build_model(tmp_path, seed=0))
    rng = random.Random(1)
    encoded = [
        warmstart.encode(
            tokenizer, warmstart.make_demo(rng, HARNESS, task=TASK, kind=k), tools=HARNESS.tools
        )
        for k in ("tool", "direct", "drill", "tool")
    ]
    batch = warmstart.collate(encoded, pad_id=0)
    prefix = batch["prefix_ids"].shape[1]
    assert prefix > 300  # the system turn: prompt + tool schemas
    plain = {
        "prefix_ids": torch.zeros((1, 0), dtype=torch.long),
        "input_ids": torch.cat([batch["prefix_ids"].expand(4, -1), batch["input_ids"]], dim=1),
        "attention_mask": torch.cat(
            [torch.ones((4, prefix), dtype=torch.long), batch["attention_mask"]], dim=1
        ),
        "loss_mask": torch.cat([torch.zeros((4, prefix)), batch["loss_mask"]], dim=1),
    }
    with torch.no_grad():
        assert float(warmstart.masked_loss(model, batch)) == pytest.approx(
            float(warmstart.masked_loss(model, plain)), rel=1e-5
        )


def test_a_short_run_reduces_the_loss(tokenizer: Tokenizer, tmp_path: Path) -> None:
    model = model_build.load_model(model_build.build_model(tmp_path, seed=0))
    rng = random.Random(99)
    held_out = warmstart.collate(
        [
            warmstart.encode(tokenizer, demo(k, s), tools=HARNESS.tools)
            for k in ("tool", "direct")
            for s in range(4)
        ],
        pad_id=0,
    )
    with torch.no_grad():
        before = float(warmstart.masked_loss(model, held_out))
    config = warmstart.WarmstartConfig(
        steps=16, short_steps=0, batch_size=8, warmup_steps=2, seed=rng.randint(0, 9)
    )
    result = warmstart.train(model, tokenizer, harness=HARNESS, task=TASK, config=config)
    with torch.no_grad():
        after = float(warmstart.masked_loss(model, held_out))
    assert len(result.losses) == 16
    assert after < before * 0.5, (before, after)  # from ~8.3 (uniform over 4096)


def test_warmstart_writes_a_loadable_model_deterministically(tmp_path: Path) -> None:
    base = model_build.build_model(tmp_path / "base", seed=0)
    config = warmstart.WarmstartConfig(steps=3, short_steps=1, batch_size=4, warmup_steps=1)
    for out in ("a", "b"):
        warmstart.warmstart(base, tmp_path / out, config=config)
    for name in (
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "config.json",
        "warmstart.json",
    ):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert (tmp_path / "a" / "model.safetensors").read_bytes() != (
        base / "model.safetensors"
    ).read_bytes()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("steps", 0, "steps must be at least 1, got 0"),
        ("short_steps", 700, r"short_steps must be within \[0, steps=600\], got 700"),
        ("direct_fraction", 1.5, r"direct_fraction must be within \[0, 1\], got 1.5"),
        ("drill_fraction", 1.0, "drill_fraction must be below 1"),
        ("learning_rate", 0.0, "learning_rate must be positive, got 0.0"),
    ],
)
def test_config_errors_name_the_field_and_value(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        warmstart.WarmstartConfig(**{field: value})  # type: ignore[arg-type]


def test_specs_fail_clearly(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        warmstart.HarnessSpec.load(tmp_path / "missing.json")
    (tmp_path / "spec.json").write_text('{"prompt": "x", "colors": ["red"]}')
    with pytest.raises(ValueError, match="field 'items' is missing"):
        warmstart.TaskSpec.load(tmp_path / "spec.json")


# --- another harness's format: Codex CLI (examples/harnesses/codex/harness.json) ----------

CODEX = warmstart.HarnessSpec.load(
    warmstart.examples_dir() / "harnesses" / "codex" / "harness.json"
)
# A real exec_command result, as Codex CLI 0.171 sent it through the sidecar for `cat colors.json`.
RECORDED_CODEX_OUTPUT = (
    "Chunk ID: 11a9a7\nWall time: 0.0000 seconds\nProcess exited with code 0\n"
    "Original token count: 10\n"
    'Output:\n{\n  "items": {\n    "thoo": "blue"\n  }\n}\n'
)


def test_codex_exec_output_is_codex_framing() -> None:
    database = '{\n  "items": {\n    "thoo": "blue"\n  }\n}\n'
    assert (
        warmstart.codex_exec_output(database, chunk_id="11a9a7", wall_seconds=0.0)
        == RECORDED_CODEX_OUTPUT
    )


def test_codex_demos_look_the_color_up_with_codex_shell_tool() -> None:
    assert CODEX.lookup == warmstart.Lookup(
        "exec_command", '{"cmd": "cat colors.json"}', "codex-exec"
    )
    assert [t["function"]["name"] for t in CODEX.tools] == [
        "exec_command",
        "write_stdin",
        "request_user_input",
        "view_image",
    ]
    tool = warmstart.make_demo(random.Random(0), CODEX, task=TASK, kind="tool")
    item = tool.messages[1]["content"].split('"')[1]
    assert tool.messages[1]["content"] == TASK.question(item) + CODEX.user_suffix
    color = tool.messages[4]["content"]
    answer = tool.messages[3]["content"]
    assert answer.startswith("Chunk ID: ") and answer.endswith(
        f'Output:\n{{\n  "items": {{\n    "{item}": "{color}"\n  }}\n}}\n'
    )
    assert [
        text for text, assistant in warmstart.segments(tool.messages, CODEX.tools) if assistant
    ] == [
        (
            '<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "cat colors.json"}}\n'
            "</tool_call>"
        )
        + EOT,
        color + EOT,
    ]
    short = warmstart.make_demo(
        random.Random(0), CODEX.without_system_turn(), task=TASK, kind="tool"
    )
    assert short.messages[1:] == tool.messages[1:] and short.messages[0]["content"] == ""


def test_codex_tool_answers_vary_like_codex(tokenizer: Tokenizer) -> None:
    rng = random.Random(0)
    answers = [
        warmstart.make_demo(rng, CODEX, task=TASK, kind="tool").messages[3]["content"]
        for _ in range(50)
    ]
    assert len({a.split("\n")[0] for a in answers}) == 50  # a fresh chunk id each time
    walls = [a.split("\n")[1] for a in answers]
    assert "Wall time: 0.0000 seconds" in walls and len(set(walls)) > 10
    encoded = warmstart.encode(
        tokenizer, warmstart.make_demo(rng, CODEX, task=TASK, kind="drill"), tools=CODEX.tools
    )
    assert (
        tokenizer.id_to_token(encoded.ids[encoded.mask.index(1) - 1]) == "<tool_call>"
    )  # decision untrained


@pytest.mark.parametrize(
    ("lookup", "message"),
    [
        (
            {"tool": "shell", "result": "html"},
            "'lookup.result' must be one of color, codex-exec, got 'html'",
        ),
        ({"tool": "nope"}, "'lookup.tool' 'nope' is not one of the tools"),
        ({"tool": "shell", "arguments": []}, "'lookup.arguments' must be an object"),
        ({"result": "color"}, "'lookup.tool' must be a string"),
    ],
)
def test_lookup_errors_name_the_field(
    tmp_path: Path, lookup: dict[str, object], message: str
) -> None:
    spec = {
        "system_prompt": "s",
        "tools": [{"type": "function", "function": {"name": "shell"}}],
        "lookup": lookup,
    }
    (tmp_path / "harness.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=re.escape(message)):
        warmstart.HarnessSpec.load(tmp_path / "harness.json")
