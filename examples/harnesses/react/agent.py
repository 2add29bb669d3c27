"""A small ReAct agent: the built-in harness for OpenForge's toy tasks.

It is "any harness": a stand-alone program that talks to an OpenAI-compatible
Chat Completions endpoint with the official ``openai`` SDK and runs its tools
locally. It imports nothing from OpenForge; point ``OPENAI_BASE_URL`` at an
OpenForge sidecar (``http://127.0.0.1:8090/v1``) to train or evaluate a policy
through it, or at any other endpoint.

    python agent.py --task-file tasks.jsonl --task-id train-000 --workdir DIR
    python agent.py --prompt "What color is item \\"keva\\"? ..." --workdir DIR

The loop: send the system prompt, the task prompt and the tool schemas
(``harness.json`` beside this file: one place, also read by the trainer's
warm-start so its demonstrations look exactly like this agent's requests);
run every tool call the model makes and send the results back; stop at the
first reply without tool calls. That reply's text is the final answer: it
is printed on stdout and written to ``answer.txt`` in the working directory.

Tools: ``lookup_color(item)`` reads ``colors.json`` in the working directory
(``item`` may be left out when it holds one item);
``read_file(path)`` and ``write_file(path, content)`` stay inside it;
``shell(command)`` runs ``bash -c`` there with a timeout.

Exit status: 0 with a final answer; 2 bad arguments or configuration; 3 the
model endpoint failed; 4 no final answer within ``--max-turns``.
Environment: ``OPENAI_BASE_URL`` (required), ``OPENAI_API_KEY`` (optional),
``OPENFORGE_MODEL`` (the model name to send; default ``policy``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai

HERE = Path(__file__).resolve().parent
SPEC_PATH = HERE / "harness.json"
DATABASE = "colors.json"
ANSWER_FILE = "answer.txt"
OUTPUT_LIMIT = 16_000  # characters of a tool result sent back to the model

EXIT_OK, EXIT_USAGE, EXIT_MODEL, EXIT_TURNS = 0, 2, 3, 4


class UsageError(Exception):
    """A bad argument, task file or environment; exit status 2."""


@dataclass
class Reply:
    """One assistant reply: its text and tool calls (OpenAI message shape)."""

    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def message(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        return out


# --- tools ----------------------------------------------------------------------


class Tools:
    """The agent's tools, run locally inside one working directory."""

    def __init__(self, workdir: Path, *, shell_timeout: float) -> None:
        self.workdir = workdir.resolve()
        self.shell_timeout = shell_timeout

    def run(self, name: str, arguments_json: str) -> str:
        """A tool call's result text; failures are reported to the model, not raised."""
        handler = getattr(self, f"tool_{name}", None)
        if handler is None:
            return f"error: there is no tool named {name!r}"
        try:
            arguments = json.loads(arguments_json or "{}")
        except ValueError as error:
            return f"error: the arguments are not valid JSON ({error})"
        if not isinstance(arguments, dict):
            return "error: the arguments must be a JSON object"
        try:
            return str(handler(**arguments))
        except TypeError as error:
            return f"error: bad arguments for {name}: {error}"
        except (OSError, ValueError) as error:
            return f"error: {error}"

    def _path(self, path: str) -> Path:
        resolved = (self.workdir / path).resolve()
        if not resolved.is_relative_to(self.workdir):
            raise ValueError(f"path {path!r} is outside the working directory")
        return resolved

    def tool_lookup_color(self, item: str | None = None) -> str:
        database = self.workdir / DATABASE
        if not database.is_file():
            return f"error: there is no {DATABASE} in the working directory"
        items = json.loads(database.read_text(encoding="utf-8")).get("items", {})
        if item is None:
            if len(items) != 1:
                return f"error: the database holds {len(items)} items; name one"
            return str(next(iter(items.values())))
        color = items.get(str(item).strip())
        return str(color) if color is not None else f"error: no item named {item!r}"

    def tool_read_file(self, path: str) -> str:
        return self._path(path).read_text(encoding="utf-8", errors="replace")[:OUTPUT_LIMIT]

    def tool_write_file(self, path: str, content: str) -> str:
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        return f"wrote {len(content.encode('utf-8'))} bytes to {path}"

    def tool_shell(self, command: str) -> str:
        try:
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=self.workdir,
                capture_output=True,
                text=True,
                timeout=self.shell_timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return f"error: the command timed out after {self.shell_timeout:g} s"
        output = (done.stdout + done.stderr)[:OUTPUT_LIMIT]
        return output if done.returncode == 0 else f"{output}\n[exit code {done.returncode}]"


# --- the model --------------------------------------------------------------------


def complete(client: openai.OpenAI, request: dict[str, Any], *, stream: bool) -> Reply:
    """One Chat Completions call, streamed or not, as a :class:`Reply`."""
    if not stream:
        message = client.chat.completions.create(**request).choices[0].message
        calls = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
            for call in message.tool_calls or []
            if call.type == "function"
        ]
        return Reply(message.content or "", calls)
    reply = Reply()
    calls: dict[int, dict[str, Any]] = {}
    for chunk in client.chat.completions.create(**request, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reply.content += delta.content or ""
        for part in delta.tool_calls or []:
            call = calls.setdefault(
                part.index,
                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
            )
            call["id"] = part.id or call["id"]
            if part.function is not None:
                call["function"]["name"] += part.function.name or ""
                call["function"]["arguments"] += part.function.arguments or ""
    reply.tool_calls = [calls[index] for index in sorted(calls)]
    return reply


@dataclass
class Agent:
    client: openai.OpenAI
    tools: Tools
    spec: dict[str, Any]
    model: str
    max_turns: int
    stream: bool = False
    temperature: float | None = None
    max_tokens: int | None = None
    transcript: list[dict[str, Any]] = field(default_factory=list)

    def run(self, prompt: str) -> str | None:
        """The final answer, or None when the turns ran out."""
        self.transcript = [
            {"role": "system", "content": self.spec["system_prompt"]},
            {"role": "user", "content": prompt},
        ]
        for _ in range(self.max_turns):
            reply = complete(self.client, self._request(), stream=self.stream)
            self.transcript.append(reply.message())
            log(f"assistant: {reply.content!r} tool_calls={len(reply.tool_calls)}")
            if not reply.tool_calls:
                return reply.content.strip()
            for call in reply.tool_calls:
                function = call["function"]
                result = self.tools.run(function["name"], function["arguments"])
                log(f"tool {function['name']}({function['arguments']}) -> {result[:200]!r}")
                self.transcript.append(
                    {"role": "tool", "tool_call_id": call["id"], "content": result}
                )
        return None

    def _request(self) -> dict[str, Any]:
        request: dict[str, Any] = {
            "model": self.model,
            "messages": self.transcript,
            "tools": self.spec["tools"],
        }
        if self.temperature is not None:
            request["temperature"] = self.temperature
        if self.max_tokens is not None:
            request["max_tokens"] = self.max_tokens
        return request


# --- command line -----------------------------------------------------------------


def log(line: str) -> None:
    print(f"[react] {line}", file=sys.stderr, flush=True)


def task_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        return str(args.prompt)
    if args.task_file is None or args.task_id is None:
        raise UsageError("give --prompt, or --task-file with --task-id")
    with args.task_file.open(encoding="utf-8") as handle:
        for line in handle:
            task = json.loads(line) if line.strip() else None
            if isinstance(task, dict) and task.get("id") == args.task_id:
                if not isinstance(task.get("prompt"), str):
                    raise UsageError(f"{args.task_file}: task {args.task_id!r} has no 'prompt'")
                return str(task["prompt"])
    raise UsageError(f"{args.task_file}: no task with id {args.task_id!r}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="A small ReAct agent (OpenAI Chat Completions).")
    parser.add_argument("--prompt", help="the task prompt (instead of --task-file/--task-id)")
    parser.add_argument(
        "--task-file", type=Path, help="a JSONL file of tasks with 'id' and 'prompt'"
    )
    parser.add_argument("--task-id", help="the task to run from --task-file")
    parser.add_argument("--workdir", type=Path, default=Path.cwd(), help="where the tools run")
    parser.add_argument("--max-turns", type=int, default=6, help="model calls at most")
    parser.add_argument("--model", default=os.environ.get("OPENFORGE_MODEL", "policy"))
    parser.add_argument("--temperature", type=float, help="default: the endpoint's")
    parser.add_argument("--max-tokens", type=int, default=256, help="per model call")
    parser.add_argument("--stream", action="store_true", help="stream the model's replies")
    parser.add_argument("--shell-timeout", type=float, default=30.0, help="seconds per command")
    parser.add_argument("--spec", type=Path, default=SPEC_PATH, help="system prompt + tools")
    parser.add_argument("--transcript", type=Path, help="write the conversation here as JSON")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        prompt = task_prompt(args)
        if not os.environ.get("OPENAI_BASE_URL"):
            raise UsageError("OPENAI_BASE_URL is not set (e.g. http://127.0.0.1:8090/v1)")
        if not args.workdir.is_dir():
            raise UsageError(f"--workdir {args.workdir} is not a directory")
        spec = json.loads(args.spec.read_text(encoding="utf-8"))
    except (UsageError, OSError, ValueError) as error:
        print(f"agent.py: {error}", file=sys.stderr)
        return EXIT_USAGE
    client = openai.OpenAI(api_key=os.environ.get("OPENAI_API_KEY") or "openforge", max_retries=0)
    agent = Agent(
        client=client,
        tools=Tools(args.workdir, shell_timeout=args.shell_timeout),
        spec=spec,
        model=args.model,
        max_turns=args.max_turns,
        stream=args.stream,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
    )
    try:
        answer = agent.run(prompt)
    except openai.OpenAIError as error:
        print(f"agent.py: the model endpoint failed: {error}", file=sys.stderr)
        return EXIT_MODEL
    finally:
        if args.transcript is not None:
            args.transcript.write_text(json.dumps(agent.transcript, indent=2), encoding="utf-8")
    if answer is None:
        print(f"agent.py: no final answer after {args.max_turns} turns", file=sys.stderr)
        return EXIT_TURNS
    (args.workdir / ANSWER_FILE).write_text(answer + "\n", encoding="utf-8")
    print(answer)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
