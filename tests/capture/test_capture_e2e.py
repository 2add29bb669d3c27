"""End to end through a real sidecar process (mitmdump + capture addon).

The official `openai` and `anthropic` SDKs talk to the sidecar, which answers
from the deterministic test engine; the collector stores what the sidecar
captured. Every captured token is checked against what the engine consumes
and produces for that prompt (asked again, directly), multi-turn calls must
merge into one token sequence, and a rewritten history must split.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from openforge_trainer.collection import store
from openforge_trainer.trajectories import export

PROMPT = "Please run `echo hi > hello.txt` and then say done."
SHELL_SCHEMA = {
    "type": "object",
    "properties": {"command": {"type": "string", "description": "the command"}},
    "required": ["command"],
}


@pytest.fixture
def stack(procs: Any, tmp_path: Path) -> dict[str, Any]:
    engine = procs.engine("--policy-version", "7")
    collector = procs.collector()
    sidecar = procs.sidecar(
        "--collector",
        f"127.0.0.1:{collector.port}",
        "--job",
        "e2e",
        "--rollout-id",
        "r1",
        "--task-id",
        "t1",
        engine=engine,
    )
    return {
        "engine": engine,
        "collector": collector,
        "sidecar": sidecar,
        "store": tmp_path / "store.db",
    }


def finish(sidecar: Any, reward: float = 1.0) -> dict[str, Any]:
    response = httpx.post(
        f"{sidecar.url}/openforge/v1/rollout/finish",
        json={"exit_code": 0, "reward": reward, "wait_seconds": 20},
        timeout=30,
    )
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    assert body["acknowledged"], body
    return body


def engine_answer(engine: Any, prompt_ids: list[int]) -> dict[str, Any]:
    """Ask the engine directly, non-streamed, for the same prompt."""
    model = httpx.get(f"{engine.url}/v1/models").json()["data"][0]["id"]
    response = httpx.post(
        f"{engine.url}/v1/completions",
        json={
            "model": model,
            "prompt": prompt_ids,
            "max_tokens": 1024,
            "logprobs": 1,
            "return_token_ids": True,
            "skip_special_tokens": False,
        },
        timeout=30,
    )
    response.raise_for_status()
    choice: dict[str, Any] = response.json()["choices"][0]
    return choice


def check_tokens_exact(engine: Any, calls: list[store.ModelCall]) -> None:
    for call in calls:
        assert call.token_exact, call.error
        direct = engine_answer(engine, list(call.prompt_token_ids))
        assert direct["prompt_token_ids"] == list(call.prompt_token_ids)
        assert direct["token_ids"] == list(call.completion_token_ids)
        assert direct["logprobs"]["token_logprobs"] == pytest.approx(
            list(call.completion_logprobs), abs=1e-6
        )


def check_merged(calls: list[store.ModelCall]) -> None:
    first, second = calls
    assert second.segment_index == first.segment_index and second.segment_reason == ""
    prefix = list(first.prompt_token_ids) + list(first.completion_token_ids)
    assert list(second.prompt_token_ids[: len(prefix)]) == prefix
    assert second.prefix_token_count == len(prefix)


def stored_calls(path: Path, rollout: str = "r1") -> list[store.ModelCall]:
    with store.Store(path) as db:
        assert db.rollout(rollout) is not None
        return db.calls(rollout)


def test_openai_chat_streaming_tool_round_trip_is_token_exact(stack: dict[str, Any]) -> None:
    client = openai.OpenAI(
        base_url=f"{stack['sidecar'].url}/v1", api_key="sk-test-secret", max_retries=0
    )
    tools = [
        {
            "type": "function",
            "function": {"name": "shell", "description": "run", "parameters": SHELL_SCHEMA},
        }
    ]
    messages: list[Any] = [{"role": "user", "content": PROMPT}]
    stream = client.chat.completions.create(
        model="policy", messages=messages, tools=tools, stream=True
    )
    chunks = list(stream)
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls and calls[0].function.name == "shell"
    arguments = "".join(tc.function.arguments or "" for tc in calls)
    assert json.loads(arguments) == {"command": "echo hi > hello.txt"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": calls[0].id,
                    "type": "function",
                    "function": {"name": "shell", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": calls[0].id, "content": "hi"},
    ]
    reply = client.chat.completions.create(model="policy", messages=messages, tools=tools)
    assert reply.choices[0].message.content == "Done: hi"
    assert reply.choices[0].finish_reason == "stop"
    finish(stack["sidecar"])

    captured = stored_calls(stack["store"])
    assert [c.stream for c in captured] == [True, False]
    assert [c.policy_version for c in captured] == [7, 7]  # as the engine reported it
    check_tokens_exact(stack["engine"], captured)
    check_merged(captured)
    with store.Store(stack["store"]) as db:
        raw = b"".join(record.SerializeToString() for record in db.records("r1"))
        headers = [
            dict(record.call.request_headers)
            for record in db.records("r1")
            if record.HasField("call")
        ]
    assert b"sk-test-secret" not in raw
    assert all(h["authorization"] == "[redacted]" for h in headers)
    rows, _ = export.rollout_rows(stored_rollout(stack["store"]), stored_calls(stack["store"]))
    assert len(rows) == 1
    row = rows[0]
    first, second = captured
    assert row.prompt_ids == list(first.prompt_token_ids)
    expected_mask = [1] * len(first.completion_token_ids)
    expected_mask += [0] * (len(second.prompt_token_ids) - second.prefix_token_count)
    expected_mask += [1] * len(second.completion_token_ids)
    assert row.response_mask == expected_mask
    assert row.reward == 1.0


def stored_rollout(path: Path, rollout: str = "r1") -> store.Rollout:
    with store.Store(path) as db:
        found = db.rollout(rollout)
        assert found is not None
        return found


@pytest.mark.parametrize("streamed", [True, False])
def test_openai_responses_tool_round_trip(stack: dict[str, Any], streamed: bool) -> None:
    client = openai.OpenAI(base_url=f"{stack['sidecar'].url}/v1", api_key="sk-test", max_retries=0)
    tools: list[Any] = [
        {
            "type": "function",
            "name": "exec_command",
            "description": "run",
            "parameters": {
                "type": "object",
                "properties": {"cmd": {"type": "string"}},
                "required": ["cmd"],
            },
        }
    ]
    items: list[Any] = [{"role": "user", "content": PROMPT}]
    if streamed:
        with client.responses.stream(
            model="policy", input=items, tools=tools, instructions="You are an agent."
        ) as stream:
            for _ in stream:
                pass
            first = stream.get_final_response()
    else:
        first = client.responses.create(
            model="policy", input=items, tools=tools, instructions="You are an agent."
        )
    call = next(item for item in first.output if item.type == "function_call")
    assert call.name == "exec_command" and json.loads(call.arguments) == {
        "cmd": "echo hi > hello.txt"
    }
    items += [item.model_dump(exclude_none=True) for item in first.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "hi"})
    second = client.responses.create(
        model="policy", input=items, tools=tools, instructions="You are an agent.", stream=False
    )
    assert second.output_text == "Done: hi"
    finish(stack["sidecar"])
    captured = stored_calls(stack["store"])
    check_tokens_exact(stack["engine"], captured)
    check_merged(captured)


@pytest.mark.parametrize("streamed", [True, False])
def test_anthropic_messages_tool_round_trip(stack: dict[str, Any], streamed: bool) -> None:
    client = anthropic.Anthropic(
        base_url=stack["sidecar"].url, api_key="sk-ant-test", max_retries=0
    )
    tools: list[Any] = [{"name": "Bash", "description": "run", "input_schema": SHELL_SCHEMA}]
    messages: list[Any] = [{"role": "user", "content": PROMPT}]
    if streamed:
        with client.messages.stream(
            model="policy", max_tokens=512, messages=messages, tools=tools, system="You are Claude."
        ) as stream:
            first = stream.get_final_message()
    else:
        first = client.messages.create(
            model="policy", max_tokens=512, messages=messages, tools=tools, system="You are Claude."
        )
    assert first.stop_reason == "tool_use"
    use = next(block for block in first.content if block.type == "tool_use")
    assert use.name == "Bash" and use.input == {"command": "echo hi > hello.txt"}
    messages += [
        {
            "role": "assistant",
            "content": [block.model_dump(exclude_none=True) for block in first.content],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "hi"}],
        },
    ]
    second = client.messages.create(
        model="policy", max_tokens=512, messages=messages, tools=tools, system="You are Claude."
    )
    assert second.content[0].type == "text" and second.content[0].text == "Done: hi"
    finish(stack["sidecar"])
    captured = stored_calls(stack["store"])
    check_tokens_exact(stack["engine"], captured)
    check_merged(captured)


def test_history_rewrite_starts_a_new_segment(stack: dict[str, Any]) -> None:
    client = openai.OpenAI(base_url=f"{stack['sidecar'].url}/v1", api_key="x", max_retries=0)
    system = {"role": "system", "content": "You are an agent."}
    client.chat.completions.create(
        model="p", messages=[system, {"role": "user", "content": "hello there"}]
    )
    # the harness compacts: the same system prompt, but the history is rewritten
    client.chat.completions.create(
        model="p",
        messages=[
            system,
            {"role": "user", "content": "summary of earlier work"},
            {"role": "user", "content": "continue"},
        ],
    )
    # a side call (a title) shares neither the system prompt nor the opening turn
    client.chat.completions.create(
        model="p",
        messages=[
            {"role": "system", "content": "Write a title."},
            {"role": "user", "content": "the chat so far"},
        ],
    )
    finish(stack["sidecar"])
    first, second, title = stored_calls(stack["store"])
    assert second.segment_index == first.segment_index + 1
    assert second.segment_reason == "history_rewritten"
    assert second.prefix_token_count == 0
    assert title.segment_reason == "new_conversation"
    rows, _ = export.rollout_rows(stored_rollout(stack["store"]), stored_calls(stack["store"]))
    assert [row.conversation for row in rows] == [0, 0, 1]


def test_bad_requests_get_the_real_api_error_and_the_sidecar_keeps_serving(
    stack: dict[str, Any],
) -> None:
    base = stack["sidecar"].url
    not_json = httpx.post(
        f"{base}/v1/chat/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert not_json.status_code == 400
    assert not_json.json()["error"]["type"] == "invalid_request_error"
    bad_field = httpx.post(
        f"{base}/v1/messages",
        json={"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": 7}]},
    )
    assert bad_field.status_code == 400
    body = bad_field.json()
    assert body["type"] == "error" and "messages[0].content" in body["error"]["message"]
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
    ok = client.chat.completions.create(model="p", messages=[{"role": "user", "content": "hi"}])
    assert ok.choices[0].message.content == "Done."
    stats = finish(stack["sidecar"])
    assert stats["counters"]["rejected_400"] == 2
    captured = stored_calls(stack["store"])
    assert [c.http_status for c in captured] == [400, 400, 200]
    assert captured[0].error.startswith("rejected:")


def test_non_llm_traffic_passes_through_untouched(stack: dict[str, Any]) -> None:
    models = httpx.get(f"{stack['sidecar'].url}/v1/models")
    assert models.status_code == 200
    direct = httpx.get(f"{stack['engine'].url}/v1/models").json()

    def without_created(listing: dict[str, Any]) -> dict[str, Any]:
        # the engine stamps each listing with the second it answered (as vLLM does)
        return {
            **listing,
            "data": [{k: v for k, v in m.items() if k != "created"} for m in listing["data"]],
        }

    assert without_created(models.json()) == without_created(direct)


def test_the_sidecar_answers_what_the_engine_itself_answers_in_chat_form(
    stack: dict[str, Any],
) -> None:
    """Two implementations of one wire format agree: the sidecar (rendering,
    token-in/token-out, its own tool-call parser and Chat encoder) and the
    engine's own Chat Completions endpoint, which renders and parses itself."""
    model = httpx.get(f"{stack['engine'].url}/v1/models").json()["data"][0]["id"]
    tools = [
        {
            "type": "function",
            "function": {"name": "shell", "description": "run", "parameters": SHELL_SCHEMA},
        }
    ]
    messages: list[dict[str, Any]] = [{"role": "user", "content": PROMPT}]
    for _ in range(2):  # the tool call, then the answer after its result
        answers = []
        for url in (stack["sidecar"].url, stack["engine"].url):
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
            whole = client.chat.completions.create(model=model, messages=messages, tools=tools)  # type: ignore[arg-type]
            stream = client.chat.completions.create(
                model=model, messages=messages, tools=tools, stream=True
            )  # type: ignore[call-overload]
            deltas = [chunk.choices[0].delta for chunk in stream if chunk.choices]
            parts: dict[int, list[str]] = {}
            for piece in (c for d in deltas for c in d.tool_calls or []):
                named = parts.setdefault(piece.index, ["", ""])
                if piece.function:
                    named[0] += piece.function.name or ""
                    named[1] += piece.function.arguments or ""
            streamed = (
                "".join(d.content or "" for d in deltas),
                [(name, json.loads(arguments)) for name, arguments in parts.values()],
            )
            message = whole.choices[0].message
            calls = [
                (c.function.name, json.loads(c.function.arguments))
                for c in message.tool_calls or []
            ]  # type: ignore[union-attr]
            assert streamed == (message.content or "", calls)
            answers.append(
                (message.content, calls, whole.choices[0].finish_reason, whole.usage.prompt_tokens)
            )  # type: ignore[union-attr]
        assert answers[0] == answers[1]
        message = whole.choices[0].message
        if not message.tool_calls:
            assert answers[0][0]
            return
        call = message.tool_calls[0]
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "ok"},
        ]
    raise AssertionError("no text answer after the tool call")
