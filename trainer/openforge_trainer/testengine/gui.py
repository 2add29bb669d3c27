"""The test engine's script for GUI tasks: a plan from the task, coordinates from the page.

Used by :mod:`testengine_policy` when the prompt offers the GUI browser
harness's ``click`` and ``type_text`` tools (``examples/harnesses/gui-browser``)
and the first user turn states its task in the web-forms grammar
(``examples/tasks/web-forms``), as an ordered list of steps:

* ``type "TEXT" into the "LABEL" field``: click the textbox labelled LABEL,
  then ``type_text`` TEXT (two actions);
* ``click the "LABEL" button`` (or ``link``, ``checkbox``): click it;
* ``press the "KEY" key``: ``press_key`` KEY.

The script acts once per turn: the next action is the plan's action number N,
where N counts the tool calls in the assistant's earlier turns; when the plan
is done it answers ``Done.``. A click's coordinates are read from the latest
observation's element list, a line ``- ROLE "LABEL" at (X, Y)`` as the
harness writes it; the script never sees the screenshot (the tiny
tokenizer renders an image as one ``<image>`` token). An element it cannot
find gets a plain-text answer saying so, which ends the episode.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

GUI_TOOLS = frozenset({"click", "type_text"})
_STEP = re.compile(
    r'type "(?P<text>[^"]*)" into the "(?P<field>[^"]+)" field'
    r'|click the "(?P<target>[^"]+)" (?P<kind>button|link|checkbox)'
    r'|press the "(?P<key>[^"]+)" key',
    re.IGNORECASE,
)
_ROLES = {
    "field": ("textbox", "combobox"),
    "button": ("button",),
    "link": ("link",),
    "checkbox": ("checkbox",),
}
_ELEMENT = re.compile(
    r'^- (?P<role>[\w-]+) (?P<label>"(?:[^"\\]|\\.)*") at \((?P<x>-?\d+), (?P<y>-?\d+)\)',
    re.MULTILINE,
)


class TurnLike(Protocol):
    @property
    def role(self) -> str: ...

    @property
    def content(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Click:
    label: str
    roles: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Call:
    """A tool call to make, or (``name`` empty) a final text answer."""

    name: str
    arguments: dict[str, Any]
    text: str = ""


def plan(task: str) -> list[Click | Call]:
    """The actions a task asks for, in order ([] when it is not in the grammar)."""
    steps: list[Click | Call] = []
    for match in _STEP.finditer(task):
        if match.group("field") is not None:
            steps.append(Click(match.group("field"), _ROLES["field"]))
            steps.append(Call("type_text", {"text": match.group("text")}))
        elif match.group("target") is not None:
            steps.append(Click(match.group("target"), _ROLES[match.group("kind").lower()]))
        else:
            steps.append(Call("press_key", {"key": match.group("key")}))
    return steps


def next_action(turns: Sequence[TurnLike], tool_names: set[str]) -> Call | None:
    """The next action for a GUI task, or None when this is not one."""
    if not GUI_TOOLS.issubset(tool_names):
        return None
    task = next((t.content for t in turns if t.role == "user"), "")
    steps = plan(task)
    if not steps:
        return None
    done = sum(t.content.count("<tool_call>") for t in turns if t.role == "assistant")
    if done >= len(steps):
        return Call("", {}, "Done.")
    step = steps[done]
    if isinstance(step, Call):
        return step
    point = locate(turns, step)
    if point is None:
        return Call("", {}, f"I cannot find the {json.dumps(step.label)} element on the page.")
    return Call("click", {"x": point[0], "y": point[1]})


def locate(turns: Sequence[TurnLike], target: Click) -> tuple[int, int] | None:
    """The centre of ``target`` in the latest user turn that lists elements."""
    for turn in reversed(turns):
        if turn.role != "user" or "\nElements:\n" not in turn.content:
            continue
        for match in _ELEMENT.finditer(turn.content):
            if (
                match.group("role") in target.roles
                and json.loads(match.group("label")) == target.label
            ):
                return int(match.group("x")), int(match.group("y"))
        return None
    return None
