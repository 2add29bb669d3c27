"""The test engine's "policy": a deterministic script over the prompt text.

It reads a prompt rendered with the tiny tokenizer's chat template (ChatML
turns, tools listed one JSON object per line in a ``<tools>`` block) and
answers the way a well-behaved agent model would on a one-tool-call task:

* a user turn after the assistant's last turn asks to ``run `some command```:
  call the first offered shell-like tool, with arguments shaped by that
  tool's JSON schema (an array ``command`` gets ``["bash", "-lc", cmd]``, a
  string one gets ``cmd``; other required parameters get plausible defaults);
* a user turn after the assistant's last turn asks ``What color is item
  "name"?`` (the toy task set, ``examples/tasks/toy-tools``): call the
  ``lookup_color`` tool with ``{"item": name}`` when it is offered, else
  read the task's database with the shell tool (``cat colors.json``), as an
  agent in a real harness would;
* a turn after the assistant's last turn holds tool responses: the first
  line of the last output when the assistant's last turn called
  ``lookup_color`` (the color, as the toy task asks); the asked item's color
  when the last output holds the database's ``"name": "color"`` entry (also
  JSON-escaped, as some harnesses wrap tool output); else "Done: <first
  line of the last output>";
* the GUI browser harness's ``click`` and ``type_text`` tools are offered
  and the task is in the web-forms grammar: the next step of its plan
  (:mod:`testengine_gui`);
* anything else: "Done.".

The answer text is laid out exactly as the chat template renders an assistant
turn, so re-rendering the parsed answer reproduces it. It excludes the stop
token, which the engine appends.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from openforge_trainer.testengine import gui as testengine_gui

SHELL_TOOL_NAMES = (
    "shell",
    "exec_command",
    "Bash",
    "bash",
    "exec",
    "shell_command",
    "run_shell_command",
    "run_command",
    "execute_command",
)

_TOOLS_BLOCK = re.compile(r"<tools>\n(.*?)\n</tools>", re.DOTALL)
_COMMAND = re.compile(r"\brun\b[^`]*?`([^`]+)`", re.IGNORECASE)
_COLOR_QUESTION = re.compile(r'What colou?r is item "([^"]+)"\?', re.IGNORECASE)
LOOKUP_TOOL = "lookup_color"
DATABASE = "colors.json"  # where the toy task keeps the answer, in the working directory
_TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)
_TURN_START = "<|im_start|>"
_TURN_END = "<|im_end|>"


@dataclass(frozen=True, slots=True)
class Turn:
    role: str
    content: str


def respond(prompt: str, *, reasoning: bool = False) -> str:
    """The assistant's answer to a rendered prompt (without the stop token)."""
    turns = completed_turns(prompt)
    gui = testengine_gui.next_action(turns, {t["name"] for t in offered_tools(prompt)})
    if gui is not None:
        action = tool_call_text(gui.name, gui.arguments) if gui.name else gui.text
        return _think(reasoning, "I will act on the page.") + action
    pending = pending_turns(turns)
    responses = [t for t in pending if t.role == "user" and t.content.startswith("<tool_response>")]
    if responses and _called_lookup(turns):
        return _think(reasoning, "The lookup has answered.") + _first_line(responses[-1].content)
    color = _database_color(responses[-1].content, _color_item(turns)) if responses else None
    if color is not None:
        return _think(reasoning, "The database has answered.") + color
    if responses:
        return _think(reasoning, "The command has finished.") + _done(responses[-1].content)
    item = _color_item(pending)
    if item is not None and any(t["name"] == LOOKUP_TOOL for t in offered_tools(prompt)):
        return _think(reasoning, "I will look it up.") + tool_call_text(LOOKUP_TOOL, {"item": item})
    shell = _shell_tool(offered_tools(prompt)) if item is not None else None
    if shell is not None:
        arguments = arguments_for(shell.get("parameters") or {}, f"cat {DATABASE}")
        return _think(reasoning, "I will read the database.") + tool_call_text(
            shell["name"], arguments
        )
    command = _command(pending)
    tool = _shell_tool(offered_tools(prompt)) if command is not None else None
    if command is None or tool is None:
        return _think(reasoning, "There is nothing to run.") + "Done."
    arguments = arguments_for(tool.get("parameters") or {}, command)
    return _think(reasoning, "I will run the command.") + tool_call_text(tool["name"], arguments)


def pending_turns(turns: list[Turn]) -> list[Turn]:
    """The turns the assistant has not answered yet: those after its last turn.

    Harnesses put more than one turn there: Claude Code adds a ``system``
    turn (its environment) after the user's prompt, OpenClaw a second
    ``user`` turn (its internal context) after the prompt or the tool
    responses; the request may be in any of them.
    """
    last = max((i for i, t in enumerate(turns) if t.role == "assistant"), default=-1)
    return turns[last + 1 :]


def _command(pending: list[Turn]) -> str | None:
    """The last ``run `cmd``` asked for in the latest user turn that asks for one."""
    for turn in reversed(pending):
        matches = _COMMAND.findall(turn.content) if turn.role == "user" else []
        if matches:
            return str(matches[-1])
    return None


def _color_item(pending: list[Turn]) -> str | None:
    """The item a pending user turn asks the color of, if one does."""
    for turn in reversed(pending):
        match = _COLOR_QUESTION.search(turn.content) if turn.role == "user" else None
        if match:
            return match.group(1)
    return None


def _database_color(tool_responses: str, item: str | None) -> str | None:
    """The color the last tool output gives ``item`` as a ``"item": "color"`` JSON entry.

    Backslashes before the quotes are allowed: a harness that hands tool
    output back inside a JSON string (Gemini CLI's ``functionResponse``)
    renders the database escaped.
    """
    outputs = _TOOL_RESPONSE.findall(tool_responses)
    if item is None or not outputs:
        return None
    entry = re.search(rf'\\*"{re.escape(item)}\\*"\s*:\s*\\*"([^"\\]+)\\*"', outputs[-1])
    return entry.group(1) if entry else None


def _called_lookup(turns: list[Turn]) -> bool:
    """Whether the assistant's last turn called the lookup tool."""
    last = next((t for t in reversed(turns) if t.role == "assistant"), None)
    return last is not None and f'"name": "{LOOKUP_TOOL}"' in last.content


def completed_turns(prompt: str) -> list[Turn]:
    """The ChatML turns of a prompt that are closed by ``<|im_end|>``."""
    turns = []
    for segment in prompt.split(_TURN_START)[1:]:
        if _TURN_END not in segment:
            continue  # the generation prompt (or a cut turn)
        role, _, content = segment.split(_TURN_END, 1)[0].partition("\n")
        turns.append(Turn(role, content))
    return turns


def offered_tools(prompt: str) -> list[dict[str, Any]]:
    """The function tools listed in the system turn's ``<tools>`` block."""
    block = _TOOLS_BLOCK.search(prompt)
    if block is None:
        return []
    tools = []
    for line in block.group(1).splitlines():
        try:
            tool = json.loads(line)
        except ValueError:
            continue
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            tools.append(function)
    return tools


def arguments_for(parameters: dict[str, Any], command: str) -> dict[str, Any]:
    """Arguments for a shell tool with JSON schema ``parameters`` running ``command``."""
    properties = parameters.get("properties") or {}
    key = next((k for k in ("command", "cmd") if k in properties), "command")
    as_array = _schema_type(properties.get(key) or {}) == "array"
    arguments: dict[str, Any] = {key: ["bash", "-lc", command] if as_array else command}
    for name in parameters.get("required") or []:
        if name not in arguments:
            arguments[name] = _default(name, properties.get(name) or {})
    return arguments


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """A tool call exactly as the chat template renders it (``tojson`` spacing)."""
    payload = json.dumps(arguments, ensure_ascii=False)
    return f'<tool_call>\n{{"name": "{name}", "arguments": {payload}}}\n</tool_call>'


def _shell_tool(tools: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((t for t in tools if t["name"] in SHELL_TOOL_NAMES), None)


def _think(enabled: bool, thought: str) -> str:
    return f"<think>\n{thought}\n</think>\n\n" if enabled else ""


def _first_line(tool_responses: str) -> str:
    """The first non-blank line of the last tool output, stripped ("" if none)."""
    outputs = _TOOL_RESPONSE.findall(tool_responses)
    lines = [line.strip() for line in (outputs[-1] if outputs else "").splitlines()]
    return next((line for line in lines if line), "")


def _done(tool_responses: str) -> str:
    first = _first_line(tool_responses)
    return f"Done: {first}" if first else "Done."


def _schema_type(schema: dict[str, Any]) -> str | None:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    return kind if isinstance(kind, str) else None


def _default(name: str, schema: dict[str, Any]) -> Any:
    """A plausible value for a required parameter we know nothing else about."""
    if "default" in schema:
        return schema["default"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    kind = _schema_type(schema)
    lowered = name.lower()
    if kind in ("integer", "number"):
        return 60000 if "timeout" in lowered else 1
    if kind == "boolean":
        return False
    if kind == "array":
        return []
    if kind == "object":
        return {}
    if lowered in ("workdir", "cwd", "dir", "directory", "working_directory", "path"):
        return "."
    return "run the command"
