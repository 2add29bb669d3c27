"""The benchmark's workload: one agent turn pair, as each path asks for it.

An agent loop on a coding task, in OpenAI Chat Completions form: a system
prompt, four function tools, an earlier exchange, then

* ``tool_call``: the user asks to run a command; the test engine's policy
  answers with a ``shell`` tool call (~45 tokens);
* ``text``: the same conversation continued with that tool call and its
  output; the policy answers in text (~45 tokens).

The ``text`` request extends the ``tool_call`` one exactly as a harness
would, so the sidecar's token history merges it into the earlier call's
tokens. These Chat Completions bodies are what every path of the benchmark
is sent (to the sidecar, or to the engine's own chat endpoint, directly or
through stock mitmdump). For the token-level diagnostics, the same calls
are also given as the token-in/token-out ``/v1/completions`` bodies the
sidecar itself sends the engine: rendered with the policy's chat template
and built by :func:`openforge_sidecar.policy.engine.completion_request`. Pure: no
I/O here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from openforge.wire.codecs import openai_chat
from openforge_sidecar.policy import engine, template

SCENARIOS = ("tool_call", "text")

SYSTEM = (
    "You are a careful coding agent working in a sandboxed Linux workspace. Use the tools to "
    "inspect files, run commands and edit code. Prefer small, verifiable steps, and explain "
    "briefly what you did when you finish. Never run destructive commands outside the "
    "workspace and never print secrets such as API keys or tokens."
)
COMMAND = "make test PYTEST_ARGS='-q --timeout 60 -k capture'"
TOOL_OUTPUT = (
    "build finished: 214 tests passed, 3 skipped, 0 failed in 12.8 seconds; "
    "coverage 91 percent\nlog written to build/test.log\n"
)


def _function(
    name: str, description: str, properties: dict[str, Any], required: list[str]
) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": required}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


TOOLS = [
    _function(
        "shell",
        "Run a shell command in the workspace and return its combined output.",
        {
            "command": {"type": "string", "description": "the command line to run"},
            "timeout_ms": {"type": "integer", "description": "time limit in milliseconds"},
        },
        ["command"],
    ),
    _function(
        "read_file",
        "Read a text file from the workspace.",
        {"path": {"type": "string", "description": "path relative to the workspace"}},
        ["path"],
    ),
    _function(
        "write_file",
        "Create or overwrite a text file in the workspace.",
        {"path": {"type": "string"}, "content": {"type": "string"}},
        ["path", "content"],
    ),
    _function(
        "search",
        "Search the workspace for a regular expression.",
        {
            "pattern": {"type": "string"},
            "glob": {"type": "string", "description": "files to search"},
        },
        ["pattern"],
    ),
]


def messages(scenario: str) -> list[dict[str, Any]]:
    """The conversation a harness sends for ``scenario``."""
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario must be one of {SCENARIOS}, not {scenario!r}")
    turns: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What does this repository contain?"},
        {
            "role": "assistant",
            "content": "It is a Python monorepo with a sidecar, a trainer and an operator, "
            "each with its own package and tests.",
        },
        {
            "role": "user",
            "content": f"Please run `{COMMAND}` and tell me whether the build passes.",
        },
    ]
    if scenario == "text":
        call = {
            "id": "call_bench_1",
            "type": "function",
            "function": {"name": "shell", "arguments": json.dumps({"command": COMMAND})},
        }
        turns += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_bench_1", "content": TOOL_OUTPUT},
        ]
    return turns


def chat_body(scenario: str, *, stream: bool, model: str = "policy") -> bytes:
    """The OpenAI Chat Completions request body a harness sends.

    ``model`` is the name the harness is configured with: any name for the
    sidecar (it asks the engine for the policy it serves), the served model's
    name for an engine's own endpoint.
    """
    body = {"model": model, "messages": messages(scenario), "tools": TOOLS, "stream": stream}
    return json.dumps(body).encode()


@dataclass(frozen=True, slots=True)
class EngineCall:
    """The token-in/token-out request equivalent to one scenario's chat call."""

    body: bytes
    prompt_tokens: int


def engine_call(tokenizer: template.PolicyTokenizer, scenario: str, *, model: str) -> EngineCall:
    request = openai_chat.CODEC.parse_request(chat_body(scenario, stream=True))
    text = tokenizer.render(request.messages, request.tools, add_generation_prompt=True)
    prompt_ids = tokenizer.encode(text)
    body = engine.completion_request(
        model=model,
        prompt_ids=prompt_ids,
        sampling=request.sampling,
        stop_token_ids=tokenizer.stop_token_ids,
        max_model_len=32768,
    )
    return EngineCall(json.dumps(body, separators=(",", ":")).encode(), len(prompt_ids))
