"""The test engine's scripted policy, as a pure function of the prompt text."""

from __future__ import annotations

import json
from typing import Any

from openforge_trainer.testengine import policy
from openforge_trainer.tiny import tokenizer_build


def tool(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def prompt(tools: list[dict[str, Any]], messages: list[dict[str, Any]]) -> str:
    return tokenizer_build.render_chat(messages, tools, add_generation_prompt=True)


def test_parses_turns_and_tools_from_a_rendered_prompt() -> None:
    shell = tool("shell", {"type": "object", "properties": {}})
    text = prompt(
        [shell], [{"role": "user", "content": "a\nb"}, {"role": "assistant", "content": "c"}]
    )
    assert [(t.role, t.content) for t in policy.completed_turns(text)] == [
        ("system", text.split("<|im_start|>system\n", 1)[1].split("<|im_end|>")[0]),
        ("user", "a\nb"),
        ("assistant", "c"),
    ]
    assert policy.offered_tools(text) == [shell["function"]]
    assert policy.offered_tools("no tools here") == []


def test_first_matching_shell_tool_wins_in_offered_order() -> None:
    tools = [
        tool("read", {}),
        tool("exec_command", {"properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}),
        tool("shell", {"properties": {"command": {"type": "array"}}}),
    ]
    answer = policy.respond(prompt(tools, [{"role": "user", "content": "Now RUN `ls -l` please"}]))
    assert answer == policy.tool_call_text("exec_command", {"cmd": "ls -l"})
    assert (
        answer
        == '<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "ls -l"}}\n</tool_call>'
    )


def test_required_parameters_get_plausible_defaults() -> None:
    parameters = {
        "properties": {
            "command": {"type": ["array", "null"]},
            "workdir": {"type": "string"},
            "timeout_ms": {"type": "integer"},
            "sandbox": {"type": "string", "enum": ["on", "off"]},
            "login": {"type": "boolean", "default": True},
            "justification": {"type": "string"},
            "env": {"type": "object"},
            "optional": {"type": "string"},
        },
        "required": [
            "command",
            "workdir",
            "timeout_ms",
            "sandbox",
            "login",
            "justification",
            "env",
        ],
    }
    assert policy.arguments_for(parameters, "pwd") == {
        "command": ["bash", "-lc", "pwd"],
        "workdir": ".",
        "timeout_ms": 60000,
        "sandbox": "on",
        "login": True,
        "justification": "run the command",
        "env": {},
    }
    assert policy.arguments_for({}, "pwd") == {"command": "pwd"}


def test_answers_done_without_a_command_or_tool() -> None:
    shell = tool("shell", {})
    assert policy.respond(prompt([shell], [{"role": "user", "content": "hello"}])) == "Done."
    assert policy.respond(prompt([], [{"role": "user", "content": "run `ls`"}])) == "Done."
    assert policy.respond("") == "Done."


def test_tool_responses_answer_with_the_last_outputs_first_line() -> None:
    messages = [
        {"role": "user", "content": "run `ls`"},
        {"role": "tool", "content": "first"},
        {"role": "tool", "content": "\n\nsecond output\nmore"},
    ]
    assert policy.respond(prompt([tool("shell", {})], messages)) == "Done: second output"
    empty = [{"role": "user", "content": "run `ls`"}, {"role": "tool", "content": ""}]
    assert policy.respond(prompt([], empty)) == "Done."


def test_reasoning_opens_the_answer_with_a_think_block() -> None:
    text = prompt([], [{"role": "user", "content": "hi"}])
    assert policy.respond(text, reasoning=True) == (
        "<think>\nThere is nothing to run.\n</think>\n\nDone."
    )


def test_the_request_may_be_followed_by_system_and_context_turns() -> None:
    """Claude Code puts a system turn after the prompt; OpenClaw a second user turn."""
    shell = tool("Bash", {"properties": {"command": {"type": "string"}}, "required": ["command"]})
    claude = [
        {"role": "system", "content": "You are Claude."},
        {
            "role": "user",
            "content": (
                "<system-reminder>run `rm -rf /` never</system-reminder>\nPlease run `echo hi`."
            ),
        },
        {"role": "system", "content": "# Environment\nYou may run `git status` to look around."},
    ]
    assert policy.respond(prompt([shell], claude)) == policy.tool_call_text(
        "Bash", {"command": "echo hi"}
    )
    openclaw = [
        {"role": "user", "content": "Please run `echo hi`."},
        {"role": "user", "content": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"},
    ]
    assert policy.respond(prompt([shell], openclaw)) == policy.tool_call_text(
        "Bash", {"command": "echo hi"}
    )


def test_tool_responses_followed_by_a_context_turn_still_finish() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Please run `echo hi`."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "exec", "arguments": {"command": "echo hi"}}}],
        },
        {"role": "tool", "content": "hi"},
        {"role": "user", "content": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"},
    ]
    assert policy.respond(prompt([tool("exec", {})], messages)) == "Done: hi"


def test_a_request_answered_before_is_not_run_again() -> None:
    messages = [
        {"role": "user", "content": "Please run `echo hi`."},
        {"role": "assistant", "content": "Done: hi"},
        {"role": "user", "content": "thanks"},
    ]
    assert policy.respond(prompt([tool("shell", {})], messages)) == "Done."


# --- the toy color task (examples/tasks/toy-tools) ---------------------------


def schema_tool(name: str, **properties: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {k: {"type": v} for k, v in properties.items()}}
    return {
        "type": "function",
        "function": {"name": name, "description": name, "parameters": schema},
    }


LOOKUP = schema_tool("lookup_color", item="string")
SHELL = schema_tool("shell", command="string")
QUESTION = 'What color is item "vobipo"? Use the lookup tool, then answer with the color only.'


def assistant_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}],
    }


def test_color_question_calls_lookup_with_the_item() -> None:
    answer = policy.respond(prompt([SHELL, LOOKUP], [{"role": "user", "content": QUESTION}]))
    assert answer == policy.tool_call_text("lookup_color", {"item": "vobipo"})
    body = answer.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>")
    assert json.loads(body) == {"name": "lookup_color", "arguments": {"item": "vobipo"}}


def test_lookup_response_is_answered_with_its_first_line_only() -> None:
    messages = [
        {"role": "user", "content": QUESTION},
        assistant_call("lookup_color", {"item": "vobipo"}),
        {"role": "tool", "content": "brown\n"},
    ]
    assert policy.respond(prompt([LOOKUP], messages)) == "brown"


def test_shell_response_still_gets_done() -> None:
    messages = [
        {"role": "user", "content": "Please run `echo brown`."},
        assistant_call("shell", {"command": "echo brown"}),
        {"role": "tool", "content": "brown"},
    ]
    assert policy.respond(prompt([SHELL, LOOKUP], messages)) == "Done: brown"


def test_color_question_without_lookup_tool_reads_the_database_with_the_shell() -> None:
    exec_command = schema_tool("exec_command", cmd="string")
    answer = policy.respond(prompt([exec_command], [{"role": "user", "content": QUESTION}]))
    assert answer == policy.tool_call_text("exec_command", {"cmd": "cat colors.json"})


def test_color_question_without_any_tool_is_not_a_tool_call() -> None:
    assert (
        policy.respond(
            prompt([schema_tool("read", path="string")], [{"role": "user", "content": QUESTION}])
        )
        == "Done."
    )


DATABASE = '{\n  "items": {\n    "vobipo": "teal"\n  }\n}\n'


def test_the_database_read_back_is_answered_with_the_items_color() -> None:
    for output in [
        "Chunk ID: 1a\nProcess exited with code 0\nOutput:\n" + DATABASE,  # Codex's exec output
        json.dumps({"output": DATABASE}),  # inside a JSON string, as Gemini CLI sends it
    ]:
        messages = [
            {"role": "user", "content": QUESTION},
            assistant_call("shell", {"command": "cat colors.json"}),
            {"role": "tool", "content": output},
        ]
        assert policy.respond(prompt([SHELL], messages)) == "teal", output


def test_a_database_without_the_item_gets_done() -> None:
    messages = [
        {"role": "user", "content": QUESTION},
        assistant_call("shell", {"command": "cat colors.json"}),
        {"role": "tool", "content": DATABASE.replace("vobipo", "other")},
    ]
    assert policy.respond(prompt([SHELL], messages)) == "Done: {"


def test_reasoning_mode_thinks_before_the_lookup() -> None:
    answer = policy.respond(
        prompt([LOOKUP], [{"role": "user", "content": QUESTION}]), reasoning=True
    )
    assert answer.startswith("<think>\n") and answer.endswith(
        policy.tool_call_text("lookup_color", {"item": "vobipo"})
    )
