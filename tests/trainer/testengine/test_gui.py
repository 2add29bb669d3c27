"""The test engine's GUI script: plans from web-forms tasks, clicks from element lists."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openforge_trainer.testengine import gui, policy
from openforge_trainer.tiny import tokenizer_build

ROOT = Path(__file__).resolve().parents[3]
HARNESS_SPEC = json.loads(
    (ROOT / "examples" / "harnesses" / "gui-browser" / "harness.json").read_text()
)
TASKS = [
    json.loads(line)
    for line in (ROOT / "examples" / "tasks" / "web-forms" / "tasks.jsonl").read_text().splitlines()
]

PAGE = """Page: Search (http://127.0.0.1:5000/search)
Elements:
- link "Search" at (481, 35)
- textbox "Search" at (190, 172)
- button "Go \\"now\\"" at (60, 220)<image>"""


def prompt(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
    return tokenizer_build.render_chat(
        [{"role": "system", "content": HARNESS_SPEC["system_prompt"]}, *messages],
        HARNESS_SPEC["tools"] if tools is None else tools,
        add_generation_prompt=True,
    )


def call(name: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"role": "assistant", "content": "",
            "tool_calls": [{"id": call_id, "type": "function",
                            "function": {"name": name, "arguments": arguments}}]}  # fmt: skip


def test_plan_reads_the_steps_in_order() -> None:
    steps = gui.plan('Click the "Orders" link, type "a b" into the "Name" field, '
                     'click the "Weekly digest" checkbox, then press the "Enter" key.')  # fmt: skip
    assert steps == [
        gui.Click("Orders", ("link",)),
        gui.Click("Name", ("textbox", "combobox")),
        gui.Call("type_text", {"text": "a b"}),
        gui.Click("Weekly digest", ("checkbox",)),
        gui.Call("press_key", {"key": "Enter"}),
    ]
    assert gui.plan('What color is item "x"?') == []


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t["id"])
def test_every_web_forms_task_is_in_the_grammar(task: dict[str, Any]) -> None:
    assert gui.plan(task["prompt"]), task["prompt"]


def test_one_action_per_turn_with_coordinates_from_the_latest_element_list() -> None:
    task = 'Type "blue kettle" into the "Search" field, then press the "Enter" key.'
    first = [{"role": "user", "content": f"{task}\n\n{PAGE}"}]
    # the textbox, not the nav link of the same label
    assert policy.respond(prompt(first)) == policy.tool_call_text("click", {"x": 190, "y": 172})

    moved = PAGE.replace("(190, 172)", "(200, 300)")
    second = [*first, call("click", {"x": 190, "y": 172}, "c1"),
              {"role": "tool", "tool_call_id": "c1", "content": "clicked at (190, 172)"},
              {"role": "user", "content": moved}]  # fmt: skip
    assert policy.respond(prompt(second)) == policy.tool_call_text(
        "type_text", {"text": "blue kettle"}
    )

    third = [*second, call("type_text", {"text": "blue kettle"}, "c2"),
             {"role": "tool", "tool_call_id": "c2", "content": "typed 11 characters"},
             {"role": "user", "content": moved}]  # fmt: skip
    assert policy.respond(prompt(third)) == policy.tool_call_text("press_key", {"key": "Enter"})

    done = [*third, call("press_key", {"key": "Enter"}, "c3"),
            {"role": "tool", "tool_call_id": "c3", "content": "pressed Enter"},
            {"role": "user", "content": moved}]  # fmt: skip
    assert policy.respond(prompt(done)) == "Done."
    assert (
        policy.respond(prompt(done), reasoning=True)
        == "<think>\nI will act on the page.\n</think>\n\nDone."
    )


def test_labels_are_json_strings_and_missing_elements_end_the_episode() -> None:
    assert gui.plan('Click the "Go" button.') == [gui.Click("Go", ("button",))]
    missing = [{"role": "user", "content": f'Click the "Checkout" button.\n\n{PAGE}'}]
    assert policy.respond(prompt(missing)) == 'I cannot find the "Checkout" element on the page.'
    # A label with escaped quotes in the element list is compared decoded.
    turns = policy.completed_turns(prompt([{"role": "user", "content": PAGE}]))
    assert gui.locate(turns, gui.Click('Go "now"', ("button",))) == (60, 220)


def test_without_the_gui_tools_the_other_scripts_answer() -> None:
    task = [{"role": "user", "content": f'Click the "Search" link.\n\n{PAGE}'}]
    assert policy.respond(prompt(task, tools=[])) == "Done."
    shell = [
        {
            "type": "function",
            "function": {
                "name": "shell",
                "parameters": {"properties": {"command": {"type": "string"}}},
            },
        }
    ]
    asked = [{"role": "user", "content": "Please run `ls` now."}]
    assert policy.respond(
        prompt(asked, tools=[*HARNESS_SPEC["tools"], *shell])
    ) == policy.tool_call_text("shell", {"command": "ls"})
