"""Reading stored request/response bodies back into messages, per wire API.

The requests are the real ones Codex CLI, Claude Code and OpenClaw sent
(tests/fixtures/harness_requests, recorded as docs/harness-notes.md says);
the responses are the bodies the sidecar's codecs build.
"""

from __future__ import annotations

import json
from pathlib import Path

from openforge_trainer.trajectories import transcript

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "harness_requests"


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def test_codex_responses_follow_up() -> None:
    request = transcript.read_request(transcript.RESPONSES, fixture("codex/3-v1_responses.json"))
    roles = [m.role for m in request.messages]
    # the canonical roles the policy's template saw: Codex's developer turns are system turns
    assert roles == ["system", "system", "user", "user", "assistant", "tool"]
    assistant, tool = request.messages[-2:]
    assert assistant.reasoning == "Thinking about it."
    [call] = assistant.tool_calls
    assert call.name == "exec_command"
    assert json.loads(call.arguments) == {"cmd": "echo hi > hello.txt"}
    assert tool.tool_call_id == call.id and "Process exited with code 0" in tool.text
    assert "exec_command" in request.tools


def test_claude_code_messages_follow_up() -> None:
    request = transcript.read_request(
        transcript.ANTHROPIC, fixture("claude-code/3-v1_messages.json")
    )
    roles = [m.role for m in request.messages]
    assert roles[0] == "system" and roles[-2:] == ["assistant", "tool"]
    assert "system" in roles[1:]  # Claude Code's environment turn inside `messages`
    assistant, tool = request.messages[-2:]
    [call] = assistant.tool_calls
    assert call.name == "Bash" and "echo hi > hello.txt" in json.loads(call.arguments)["command"]
    assert assistant.reasoning and assistant.text
    assert tool.tool_call_id == call.id
    assert "Bash" in request.tools


def test_openclaw_chat_follow_up() -> None:
    request = transcript.read_request(
        transcript.CHAT, fixture("openclaw/2-v1_chat_completions.json")
    )
    assert [m.role for m in request.messages] == ["system", "user", "assistant", "tool", "user"]
    assistant, tool = request.messages[2:4]
    assert assistant.tool_calls[0].name == "exec"
    assert tool.text == "(no output)" and tool.tool_call_id == assistant.tool_calls[0].id


def test_responses_reply_with_reasoning_and_a_tool_call() -> None:
    body = {
        "output": [
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Look first."}]},
            {
                "type": "function_call",
                "name": "shell",
                "arguments": '{"cmd":"ls"}',
                "call_id": "c1",
            },
        ],
        "error": None,
    }
    reply = transcript.read_response(transcript.RESPONSES, json.dumps(body).encode())
    assert reply is not None
    assert reply.role == "assistant" and reply.reasoning == "Look first."
    assert reply.tool_calls == [transcript.ToolCall("shell", '{"cmd":"ls"}', "c1")]


def test_chat_and_anthropic_replies() -> None:
    chat = {"choices": [{"message": {"content": "hi", "reasoning_content": "hmm"}}]}
    reply = transcript.read_response(transcript.CHAT, json.dumps(chat).encode())
    assert reply is not None and (reply.text, reply.reasoning) == ("hi", "hmm")
    anthropic = {
        "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"path": "a"}}]
    }
    reply = transcript.read_response(transcript.ANTHROPIC, json.dumps(anthropic).encode())
    assert reply is not None and reply.tool_calls == [
        transcript.ToolCall("Read", '{"path":"a"}', "t1")  # the codec's compact JSON
    ]


def test_gemini_request_and_reply() -> None:
    request = {
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "contents": [
            {"role": "user", "parts": [{"text": "list files"}]},
            {"role": "model", "parts": [{"functionCall": {"name": "ls", "args": {"dir": "."}}}]},
            {
                "role": "user",
                "parts": [{"functionResponse": {"name": "ls", "response": {"out": "a"}}}],
            },
        ],
        "tools": [{"functionDeclarations": [{"name": "ls"}]}],
    }
    read = transcript.read_request(transcript.GEMINI, json.dumps(request).encode())
    assert [m.role for m in read.messages] == ["system", "user", "assistant", "tool"]
    assert read.messages[2].tool_calls[0].name == "ls" and read.tools == ["ls"]
    reply = {"candidates": [{"content": {"role": "model", "parts": [{"text": "a"}]}}]}
    message = transcript.read_response(transcript.GEMINI, json.dumps(reply).encode())
    assert message is not None and (message.role, message.text) == ("assistant", "a")


def test_bodies_the_codec_refuses_are_shown_with_its_error() -> None:
    assert transcript.read_request(transcript.CHAT, b"") == transcript.Request([], [])
    assert transcript.read_response(transcript.CHAT, b"") is None
    error = {"error": {"message": "prompt too long"}}
    assert transcript.read_response(transcript.CHAT, json.dumps(error).encode()) is None
    [message] = transcript.read_request(transcript.CHAT, b"not json").messages
    assert message.role == transcript.UNREADABLE
    assert message.text.startswith("body is not valid JSON") and message.text.endswith("not json")
    # a part the sidecar refused: the error names the field, the body is shown as sent
    odd = {"model": "m", "messages": [{"role": "user", "content": [{"type": "audio"}]}]}
    [message] = transcript.read_request(transcript.CHAT, json.dumps(odd).encode()).messages
    assert message.role == transcript.UNREADABLE
    first, shown = message.text.split("\n", 1)
    assert first.startswith("messages[0].content[0].type: unsupported") and json.loads(shown) == odd
    [message] = transcript.read_request("WIRE_API_UNSPECIFIED", b"{}").messages
    assert message.role == transcript.UNREADABLE and "WIRE_API_UNSPECIFIED" in message.text
    big = json.dumps({"messages": "x" * 10_000}).encode()
    [message] = transcript.read_request(transcript.CHAT, big).messages
    assert message.text.endswith(f"({len(big) - transcript.SHOWN_BYTES} more bytes)")
