"""Hand-built agent episodes, rendered as each wire API's request/response bodies.

A scripted episode is a list of :class:`Step` (one model call each): what the
assistant said and which tools it called, then what each tool returned. The
renderers produce what a harness speaking that API would have sent and
received, call by call: every request carries the whole history so far, as
real harnesses do. :func:`records` wraps them into the trajectory records a
sidecar streams, ready for ``Store.put``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from openforge.trajectory.v1 import trajectory_pb2

Body = dict[str, Any]


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict[str, Any]
    result: str = ""
    is_error: bool = False  # sent as the API's error flag where it has one


@dataclass(frozen=True)
class Step:
    text: str = ""
    calls: Sequence[Call] = field(default_factory=tuple)


Tools = Sequence[str]


def _call_id(step: int, index: int) -> str:
    return f"call_{step}_{index}"


def _schema() -> Body:
    return {"type": "object", "properties": {}}


# -- OpenAI Chat Completions ----------------------------------------------------------------


def chat(steps: Sequence[Step], tools: Tools, prompt: str) -> list[tuple[Body, Body]]:
    messages: list[Body] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": prompt},
    ]
    offered = [
        {"type": "function", "function": {"name": name, "parameters": _schema()}} for name in tools
    ]
    pairs = []
    for s, step in enumerate(steps):
        request = {"model": "policy", "messages": list(messages), "tools": offered}
        message: Body = {"role": "assistant", "content": step.text or None}
        if step.calls:
            message["tool_calls"] = [
                {
                    "id": _call_id(s, i),
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                }
                for i, c in enumerate(step.calls)
            ]
        response = {
            "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        }
        pairs.append((request, response))
        messages.append(message)
        messages += [
            {"role": "tool", "tool_call_id": _call_id(s, i), "content": c.result}
            for i, c in enumerate(step.calls)
        ]
    return pairs


# -- OpenAI Responses (Codex's shape: apply_patch as a custom tool) ----------------------------


def responses(steps: Sequence[Step], tools: Tools, prompt: str) -> list[tuple[Body, Body]]:
    items: list[Body] = [{"type": "message", "role": "user", "content": prompt}]
    offered = [
        {"type": "custom", "name": name}
        if name == "apply_patch"
        else {"type": "function", "name": name, "parameters": _schema()}
        for name in tools
    ]
    pairs = []
    for s, step in enumerate(steps):
        request = {"model": "policy", "instructions": "Be an agent.", "input": list(items)}
        request["tools"] = offered
        output: list[Body] = []
        if step.text:
            output.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": step.text}],
                }
            )
        for i, c in enumerate(step.calls):
            if c.name == "apply_patch":
                output.append(
                    {
                        "type": "custom_tool_call",
                        "call_id": _call_id(s, i),
                        "name": c.name,
                        "input": c.arguments["input"],
                    }
                )
            else:
                output.append(
                    {
                        "type": "function_call",
                        "call_id": _call_id(s, i),
                        "name": c.name,
                        "arguments": json.dumps(c.arguments),
                    }
                )
        pairs.append((request, {"object": "response", "status": "completed", "output": output}))
        items += output
        for i, c in enumerate(step.calls):
            kind = "custom_tool_call_output" if c.name == "apply_patch" else "function_call_output"
            items.append({"type": kind, "call_id": _call_id(s, i), "output": c.result})
    return pairs


# -- Anthropic Messages (Claude Code's shape) --------------------------------------------------


def anthropic(steps: Sequence[Step], tools: Tools, prompt: str) -> list[tuple[Body, Body]]:
    messages: list[Body] = [{"role": "user", "content": prompt}]
    offered = [{"name": name, "input_schema": _schema()} for name in tools]
    pairs = []
    for s, step in enumerate(steps):
        request = {
            "model": "policy",
            "max_tokens": 256,
            "system": "Agent.",
            "messages": list(messages),
        }
        request["tools"] = offered
        content: list[Body] = [{"type": "text", "text": step.text}] if step.text else []
        content += [
            {"type": "tool_use", "id": _call_id(s, i), "name": c.name, "input": c.arguments}
            for i, c in enumerate(step.calls)
        ]
        pairs.append((request, {"type": "message", "role": "assistant", "content": content}))
        messages.append({"role": "assistant", "content": content})
        if step.calls:
            results: list[Body] = []
            for i, c in enumerate(step.calls):
                block: Body = {
                    "type": "tool_result",
                    "tool_use_id": _call_id(s, i),
                    "content": [{"type": "text", "text": c.result}],
                }
                if c.is_error:
                    block["is_error"] = True
                results.append(block)
            messages.append({"role": "user", "content": results})
    return pairs


# -- Gemini generateContent (Gemini CLI's shape: no call ids) --------------------------------


def gemini(steps: Sequence[Step], tools: Tools, prompt: str) -> list[tuple[Body, Body]]:
    contents: list[Body] = [{"role": "user", "parts": [{"text": prompt}]}]
    offered = [
        {"functionDeclarations": [{"name": name, "parameters": _schema()} for name in tools]}
    ]
    pairs = []
    for step in steps:
        request = {"contents": list(contents), "tools": offered}
        parts: list[Body] = [{"text": step.text}] if step.text else []
        parts += [{"functionCall": {"name": c.name, "args": c.arguments}} for c in step.calls]
        content = {"role": "model", "parts": parts}
        pairs.append((request, {"candidates": [{"content": content, "finishReason": "STOP"}]}))
        contents.append(content)
        if step.calls:
            answers = [
                {
                    "functionResponse": {
                        "name": c.name,
                        "response": {"error": c.result} if c.is_error else {"output": c.result},
                    }
                }
                for c in step.calls
            ]
            contents.append({"role": "user", "parts": answers})
    return pairs


RENDERERS: dict[str, Callable[[Sequence[Step], Tools, str], list[tuple[Body, Body]]]] = {
    "WIRE_API_OPENAI_CHAT": chat,
    "WIRE_API_OPENAI_RESPONSES": responses,
    "WIRE_API_ANTHROPIC_MESSAGES": anthropic,
    "WIRE_API_GEMINI": gemini,
}


def records(
    rollout: str,
    *,
    api: str,
    steps: Sequence[Step],
    tools: Tools,
    reward: float | None,
    harness: str = "react",
    policy_version: int = 0,
    job: str = "job",
    prompt: str = "Do the task.",
) -> list[trajectory_pb2.Record]:
    """A finished rollout's records: started, one call per step, finished."""
    out = [
        trajectory_pb2.Record(
            idempotency_key=f"{rollout}/started",
            job=job,
            rollout_id=rollout,
            started=trajectory_pb2.RolloutStarted(
                task_id=f"task-{rollout}", harness=harness, policy_version=policy_version
            ),
        )
    ]
    for index, (request, response) in enumerate(RENDERERS[api](steps, tools, prompt)):
        out.append(
            trajectory_pb2.Record(
                idempotency_key=f"{rollout}/call/{index}",
                job=job,
                rollout_id=rollout,
                call=trajectory_pb2.ModelCall(
                    call_index=index,
                    wire_api=trajectory_pb2.WireApi.Value(api),
                    request_json=json.dumps(request).encode(),
                    response_json=json.dumps(response).encode(),
                    http_status=200,
                    policy_version=policy_version,
                ),
            )
        )
    out.append(
        trajectory_pb2.Record(
            idempotency_key=f"{rollout}/finished",
            job=job,
            rollout_id=rollout,
            finished=trajectory_pb2.RolloutFinished(
                has_reward=reward is not None,
                reward=reward or 0.0,
                call_count=len(steps),
                status="succeeded",
            ),
        )
    )
    for sequence, record in enumerate(out, start=1):
        record.sequence = sequence
    return out
