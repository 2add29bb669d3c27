from __future__ import annotations

import json
from pathlib import Path

import pytest
from openforge.trajectory.v1 import trajectory_pb2
from openforge_trainer.analysis import episodes
from openforge_trainer.collection import store
from wire_trajectories import RENDERERS, Call, Step, records

APIS = sorted(RENDERERS)
TOOLS = ("read_file", "write_file", "shell")

SCRIPT = [
    Step("I'll write the file.", [Call("write_file", {"path": "a.py", "content": "x"}, "wrote")]),
    Step(
        "",
        [
            Call("shell", {"command": "python a.py"}, "error: boom", is_error=True),
            Call("read_file", {"path": "a.py"}, "x"),
        ],
    ),
    Step("done"),
]


def stored_episode(tmp_path: Path, api: str, steps: list[Step]) -> episodes.Episode:
    with store.Store(tmp_path / "store.db") as db:
        db.put(records("r1", api=api, steps=steps, tools=TOOLS, reward=1.0, harness="h"))
        rollout = db.rollout("r1")
        assert rollout is not None
        return episodes.episode(rollout, db.calls("r1"))


@pytest.mark.parametrize("api", APIS)
def test_every_api_decodes_to_the_same_actions(tmp_path: Path, api: str) -> None:
    episode = stored_episode(tmp_path, api, SCRIPT)
    assert episode.problems == ()
    assert episode.harness == "h"
    assert episode.reward == 1.0
    assert episode.tools_offered == frozenset(TOOLS)
    assert [(a.call_index, a.position, a.name, a.arguments) for a in episode.actions] == [
        (0, 0, "write_file", {"path": "a.py", "content": "x"}),
        (1, 0, "shell", {"command": "python a.py"}),
        (1, 1, "read_file", {"path": "a.py"}),
    ]
    texts = [a.result.text if a.result else None for a in episode.actions]
    assert texts == ["wrote", "error: boom", "x"]
    assert [t.text for t in episode.turns] == ["I'll write the file.", "", "done"]
    assert [t.final for t in episode.turns] == [False, False, True]
    assert episode.wire_apis == {api}


@pytest.mark.parametrize(
    ("api", "flags"),
    [
        ("WIRE_API_OPENAI_CHAT", [None, None, None]),
        ("WIRE_API_OPENAI_RESPONSES", [None, None, None]),
        ("WIRE_API_ANTHROPIC_MESSAGES", [False, True, False]),
        ("WIRE_API_GEMINI", [False, True, False]),
    ],
)
def test_the_apis_own_error_flags_are_kept(tmp_path: Path, api: str, flags: list[bool]) -> None:
    episode = stored_episode(tmp_path, api, SCRIPT)
    assert [a.result.flagged_error if a.result else "none" for a in episode.actions] == flags


def test_an_unanswered_last_call_has_no_result(tmp_path: Path) -> None:
    steps = [Step("", [Call("shell", {"command": "ls"}, "a.py")])]
    episode = stored_episode(tmp_path, "WIRE_API_OPENAI_CHAT", steps)
    assert [a.result for a in episode.actions] == [None]


def test_gemini_results_without_ids_pair_by_position_and_name(tmp_path: Path) -> None:
    steps = [
        Step(
            "", [Call("shell", {"command": "ls"}, "one"), Call("shell", {"command": "pwd"}, "two")]
        ),
        Step("", [Call("read_file", {"path": "x"}, "three")]),
        Step("done"),
    ]
    episode = stored_episode(tmp_path, "WIRE_API_GEMINI", steps)
    # the bodies carry no ids: the actions have the codec's own, in Gemini's style
    assert all(a.id.startswith("call_") for a in episode.actions)
    assert [a.result.text if a.result else None for a in episode.actions] == [
        "one",
        "two",
        "three",
    ]


def test_responses_custom_tool_input_becomes_the_input_argument(tmp_path: Path) -> None:
    patch = "*** Begin Patch\n*** Add File: b.py\n+x\n*** End Patch\n"
    steps = [Step("", [Call("apply_patch", {"input": patch}, "Done!")]), Step("ok")]
    episode = stored_episode(tmp_path, "WIRE_API_OPENAI_RESPONSES", steps)
    (action,) = episode.actions
    assert (action.name, action.arguments, action.result) == (
        "apply_patch",
        {"input": patch},
        episodes.ToolResult("Done!"),
    )


def rollout(rollout_id: str = "r") -> store.Rollout:
    return store.Rollout(
        rollout_id=rollout_id, job="j", task_id="t", sample_index=0, attempt=0, harness="h",
        policy_version=2, started=True, status="failed", exit_code=1, reward=0.0,
        has_reward=False, call_count_expected=0, calls_stored=0, finished=True,
        trained_at=None, trained_checkpoint=None, calls_present=0,
    )  # fmt: skip


def model_call(
    index: int,
    request: object,
    response: object,
    *,
    api: str = "WIRE_API_OPENAI_CHAT",
    error: str = "",
) -> store.ModelCall:
    record = trajectory_pb2.Record(
        rollout_id="r",
        call=trajectory_pb2.ModelCall(
            call_index=index,
            wire_api=trajectory_pb2.WireApi.Value(api),
            request_json=json.dumps(request).encode()
            if not isinstance(request, bytes)
            else request,
            response_json=json.dumps(response).encode() if response is not None else b"",
            http_status=200 if not error else 502,
            error=error,
            policy_version=7,
        ),
    )
    return store.ModelCall.from_record(record)


CHAT_REQUEST = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def chat_response(*calls: tuple[str, str, str]) -> dict[str, object]:
    tool_calls = [
        {"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in calls
    ]
    message = {"role": "assistant", "content": "t", "tool_calls": tool_calls}
    return {"choices": [{"message": message}]}


def test_bad_bodies_are_reported_naming_call_and_field_and_the_rest_is_decoded() -> None:
    calls = [
        model_call(0, b"{not json", chat_response(("c0", "shell", '{"command": "ls"}'))),
        model_call(
            1, {"model": "m", "messages": [{"role": "tool", "content": "x"}]}, chat_response()
        ),
        model_call(2, CHAT_REQUEST, {"choices": [{"message": {"tool_calls": [{"function": {}}]}}]}),
    ]
    episode = episodes.episode(rollout(), calls)
    assert episode.problems[0].startswith("call 0 request_json: body is not valid JSON")
    assert episode.problems[1] == (
        "call 1 request_json: messages[0].tool_call_id: required field is missing"
    )
    assert episode.problems[2] == (
        "call 2 response_json: choices[0].message.tool_calls[0].id: required field is missing"
    )
    assert [a.name for a in episode.actions] == ["shell"]
    assert episode.reward is None  # the rollout has no reward
    assert episode.policy_version == 2  # the rollout's, not the calls'
    assert [t.policy_version for t in episode.turns] == [7, 7, 7]


def test_failed_calls_and_unknown_apis() -> None:
    calls = [
        model_call(0, CHAT_REQUEST, None, error="engine unreachable"),
        model_call(1, CHAT_REQUEST, chat_response(), api="WIRE_API_UNSPECIFIED"),
    ]
    episode = episodes.episode(rollout(), calls)
    assert [(t.failed, t.actions) for t in episode.turns] == [(True, 0), (False, 0)]
    assert episode.problems == (
        "call 1 wire API WIRE_API_UNSPECIFIED is not one this analysis reads",
        "call 1 wire API WIRE_API_UNSPECIFIED is not one this analysis reads",
    )


def test_an_empty_episode() -> None:
    episode = episodes.episode(rollout(), [])
    assert (episode.turns, episode.actions, episode.tools_offered) == ((), (), frozenset())


def test_a_result_with_an_unknown_id_pairs_by_position_when_names_agree() -> None:
    # the harness rewrote the ids in its history; the positions still agree
    first = chat_response(("c0", "shell", '{"command": "ls"}'), ("c1", "read_file", "{}"))
    history = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "X", "type": "function", "function": {"name": "shell", "arguments": ""}},
                    {"id": "Y", "type": "function", "function": {"name": "grep", "arguments": ""}},
                ],
            },
            {"role": "tool", "tool_call_id": "X", "content": "out"},
            {"role": "tool", "tool_call_id": "Y", "content": "other"},
        ],
    }
    episode = episodes.episode(
        rollout(), [model_call(0, CHAT_REQUEST, first), model_call(1, history, chat_response())]
    )
    # "Y" sits where read_file was, but names a different tool: not attached
    assert [a.result.text if a.result else None for a in episode.actions] == ["out", None]


def test_a_body_its_codec_refuses_is_a_problem_not_a_guess() -> None:
    # the sidecar refuses such a request (and records it as failed); a reply it
    # could not read is kept whole, so the analysis names the field it stops at
    broken = {"output": [{"type": "function_call", "name": "shell", "call_id": "s1"}]}
    responses = "WIRE_API_OPENAI_RESPONSES"
    episode = episodes.episode(
        rollout(),
        [
            model_call(0, {"model": "m", "input": "go"}, broken, api=responses),
            model_call(1, {"model": "m", "input": [{"type": "audio"}]}, None, api=responses),
        ],
    )
    assert episode.problems == (
        "call 0 response_json: output[0].arguments: required field is missing",
        "call 1 request_json: input[0].type: unsupported input item type 'audio'",
    )
    assert episode.actions == ()


GEMINI_REQUEST = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
GEMINI_REPLY = {"candidates": [{"content": {"role": "model", "parts": [{"text": "done"}]}}]}


def test_gemini_snake_case_and_non_function_tools() -> None:
    request = {
        "tools": [{"google_search": {}}, {"function_declarations": [{"name": "ls"}]}],
        "contents": [
            {"role": "user", "parts": [{"text": "hi"}]},
            {"role": "model", "parts": [{"function_call": {"id": "g1", "name": "ls", "args": {}}}]},
            {
                "role": "user",
                "parts": [{"function_response": {"id": "g1", "name": "ls", "response": {"x": 1}}}],
            },
        ],
    }
    first = {
        "candidates": [{"content": {"parts": [{"function_call": {"id": "g1", "name": "ls"}}]}}]
    }
    episode = episodes.episode(
        rollout(),
        [
            model_call(0, GEMINI_REQUEST, first, api="WIRE_API_GEMINI"),
            model_call(1, request, GEMINI_REPLY, api="WIRE_API_GEMINI"),
        ],
    )
    assert episode.problems == ()
    assert episode.tools_offered == {"ls"}
    (action,) = episode.actions
    assert (action.id, action.result) == ("g1", episodes.ToolResult('{"x":1}', False))
