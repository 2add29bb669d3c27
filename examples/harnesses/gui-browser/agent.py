"""A GUI browser agent: screenshots in, mouse and keyboard tool calls out.

A stand-alone harness for OpenForge's multimodal path. It starts Chromium on
an Xvfb display (``browser.py`` beside this file; ``--headless`` needs no
display), opens the task's start page, and talks to an OpenAI-compatible Chat
Completions endpoint with the official ``openai`` SDK. Every observation is a
user turn holding the page's title and URL, the list of its interactive
elements with their centres, and a screenshot as an ``image_url`` part (a
``data:image/png;base64`` URL of the PNG exactly as Chromium encoded it).
The model acts through tool calls (``harness.json``: ``click``, ``type_text``,
``press_key``, ``scroll``, ``navigate``); after each turn's calls run, a new
observation follows. The first reply without tool calls is the final answer:
printed on stdout and written to ``answer.txt`` in the working directory.

    python agent.py --task-file tasks.jsonl --task-id ID --start-url URL --workdir DIR
    python agent.py --prompt "Click the \\"Orders\\" link." --start-url URL --headless

The task is graded by what the browser did to the site, not by the answer
(``examples/tasks/web-forms``). Each screenshot sent is also written to
``--screenshots`` (default ``DIR/screenshots``) as ``step-NNN.png``, so what
the model saw can be compared with what the sidecar recorded.

Exit status: 0 with a final answer; 2 bad arguments or configuration; 3 the
model endpoint failed; 4 no final answer within ``--max-turns``; 5 the browser
could not be started or died. Environment: ``OPENAI_BASE_URL`` (required),
``OPENAI_API_KEY`` (optional), ``OPENFORGE_MODEL`` (model name; default
``policy``), ``WEB_TASK_URL`` and ``WEB_TASK_PROMPT`` (defaults for
``--start-url`` and ``--prompt``, as ``examples/tasks/web-forms/serve.py`` sets them).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import sys
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import browser
import openai

HERE = Path(__file__).resolve().parent
SPEC_PATH = HERE / "harness.json"
ANSWER_FILE = "answer.txt"

EXIT_OK, EXIT_USAGE, EXIT_MODEL, EXIT_TURNS, EXIT_BROWSER = 0, 2, 3, 4, 5


class UsageError(Exception):
    """A bad argument, task file or environment; exit status 2."""


@dataclass(frozen=True, slots=True)
class Observation:
    """What the model is shown of the page after an action."""

    png: bytes
    url: str
    title: str
    elements: tuple[browser.Element, ...]

    def text(self, *, element_list: bool) -> str:
        lines = [f"Page: {self.title} ({self.url})"]
        if element_list:
            lines.append("Elements:")
            lines += [f"- {element.describe()}" for element in self.elements]
        return "\n".join(lines)

    def data_url(self) -> str:
        return "data:image/png;base64," + base64.b64encode(self.png).decode("ascii")


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


# --- tools ----------------------------------------------------------------------------


class Tools:
    """The agent's tools: input events to the one page, and navigation within its site."""

    def __init__(self, page: browser.Browser, *, origin: str) -> None:
        self.page = page
        self.origin = origin

    def run(self, name: str, arguments_json: str) -> str:
        """A tool call's result text; bad calls are reported to the model, not raised."""
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
        except ValueError as error:
            return f"error: {error}"

    def _point(self, x: Any, y: Any) -> tuple[int, int]:
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (x, y)):
            raise ValueError(f"x and y must be numbers, got {x!r} and {y!r}")
        px, py = round(x), round(y)
        if not (0 <= px < self.page.width and 0 <= py < self.page.height):
            raise ValueError(
                f"({px}, {py}) is outside the {self.page.width}x{self.page.height} screenshot"
            )
        return px, py

    def tool_click(self, x: Any, y: Any) -> str:
        px, py = self._point(x, y)
        self.page.click(px, py)
        return f"clicked at ({px}, {py})"

    def tool_type_text(self, text: Any) -> str:
        if not isinstance(text, str):
            raise ValueError("text must be a string")
        self.page.type_text(text)
        return f"typed {len(text)} characters"

    def tool_press_key(self, key: Any) -> str:
        self.page.press_key(str(key))
        return f"pressed {key}"

    def tool_scroll(self, x: Any, y: Any, delta_y: Any) -> str:
        px, py = self._point(x, y)
        if not isinstance(delta_y, int | float) or isinstance(delta_y, bool):
            raise ValueError(f"delta_y must be a number, got {delta_y!r}")
        self.page.scroll(px, py, round(delta_y))
        return f"scrolled by {round(delta_y)} at ({px}, {py})"

    def tool_navigate(self, url: Any) -> str:
        target = str(url)
        if _origin(target) != self.origin:
            raise ValueError(f"{target!r} is not on the task's site ({self.origin})")
        self.page.navigate(target)
        return f"opened {target}"


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


# --- the model ------------------------------------------------------------------------


def complete(client: openai.OpenAI, request: dict[str, Any], *, stream: bool) -> Reply:
    """One Chat Completions call, streamed or not, as a :class:`Reply`."""
    if not stream:
        message = client.chat.completions.create(**request).choices[0].message
        calls = [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}
            for call in message.tool_calls or []
            if call.type == "function"
        ]  # fmt: skip
        return Reply(message.content or "", calls)
    reply = Reply()
    calls_by_index: dict[int, dict[str, Any]] = {}
    for chunk in client.chat.completions.create(**request, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reply.content += delta.content or ""
        for part in delta.tool_calls or []:
            call = calls_by_index.setdefault(
                part.index,
                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
            )
            call["id"] = part.id or call["id"]
            if part.function is not None:
                call["function"]["name"] += part.function.name or ""
                call["function"]["arguments"] += part.function.arguments or ""
    reply.tool_calls = [calls_by_index[index] for index in sorted(calls_by_index)]
    return reply


@dataclass
class Agent:
    client: openai.OpenAI
    page: browser.Browser
    tools: Tools
    spec: dict[str, Any]
    model: str
    max_turns: int
    screenshots: Path
    element_list: bool = True
    stream: bool = False
    temperature: float | None = None
    max_tokens: int | None = None
    transcript: list[dict[str, Any]] = field(default_factory=list)
    shots: int = 0

    def run(self, prompt: str) -> str | None:
        """The final answer, or None when the turns ran out."""
        self.transcript = [
            {"role": "system", "content": self.spec["system_prompt"]},
            self._observation_turn(f"{prompt}\n\n"),
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
                log(f"tool {function['name']}({function['arguments']}) -> {result!r}")
                self.transcript.append(
                    {"role": "tool", "tool_call_id": call["id"], "content": result}
                )
            self.transcript.append(self._observation_turn(""))
        return None

    def observe(self) -> Observation:
        url, title = self.page.location()
        return Observation(self.page.screenshot(), url, title, tuple(self.page.elements()))

    def _observation_turn(self, lead: str) -> dict[str, Any]:
        """A user turn: ``lead``, the page's text, and its screenshot (saved as sent)."""
        seen = self.observe()
        (self.screenshots / f"step-{self.shots:03d}.png").write_bytes(seen.png)
        self.shots += 1
        return {
            "role": "user",
            "content": [
                {"type": "text", "text": lead + seen.text(element_list=self.element_list)},
                {"type": "image_url", "image_url": {"url": seen.data_url()}},
            ],
        }

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


# --- command line ---------------------------------------------------------------------


def log(line: str) -> None:
    print(f"[gui-browser] {line}", file=sys.stderr, flush=True)


def task_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        return str(args.prompt)
    if args.task_file is not None and args.task_id is not None:
        with args.task_file.open(encoding="utf-8") as handle:
            for line in handle:
                task = json.loads(line) if line.strip() else None
                if isinstance(task, dict) and task.get("id") == args.task_id:
                    if not isinstance(task.get("prompt"), str):
                        raise UsageError(f"{args.task_file}: task {args.task_id!r} has no 'prompt'")
                    return str(task["prompt"])
        raise UsageError(f"{args.task_file}: no task with id {args.task_id!r}")
    if os.environ.get("WEB_TASK_PROMPT"):
        return os.environ["WEB_TASK_PROMPT"]
    raise UsageError("give --prompt, or --task-file with --task-id (or set WEB_TASK_PROMPT)")


def viewport(text: str) -> tuple[int, int]:
    width, sep, height = text.partition("x")
    if not (
        sep
        and width.isdigit()
        and height.isdigit()
        and 200 <= int(width) <= 4096
        and 200 <= int(height) <= 4096
    ):
        raise argparse.ArgumentTypeError(
            f"--viewport must be WIDTHxHEIGHT in 200..4096, got {text!r}"
        )
    return int(width), int(height)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="A GUI browser agent (OpenAI Chat Completions, screenshots)."
    )
    parser.add_argument("--prompt", help="the task (instead of --task-file/--task-id)")
    parser.add_argument(
        "--task-file", type=Path, help="a JSONL file of tasks with 'id' and 'prompt'"
    )
    parser.add_argument("--task-id", help="the task to run from --task-file")
    parser.add_argument(
        "--start-url", default=os.environ.get("WEB_TASK_URL"), help="default: $WEB_TASK_URL"
    )
    parser.add_argument("--workdir", type=Path, default=Path.cwd(), help="where answer.txt goes")
    parser.add_argument("--screenshots", type=Path, help="default: WORKDIR/screenshots")
    parser.add_argument(
        "--viewport", type=viewport, default=(800, 600), help="WIDTHxHEIGHT (800x600)"
    )
    parser.add_argument(
        "--headless", action="store_true", help="no Xvfb: Chromium's own headless mode"
    )
    parser.add_argument("--no-element-list", dest="element_list", action="store_false",
                        help="show the model the screenshot, title and URL only")  # fmt: skip
    parser.add_argument(
        "--chromium", help="browser binary (default: Debian's, or chromium on PATH)"
    )
    parser.add_argument("--no-sandbox", action="store_true",
                        help="run Chromium without its sandbox"
                             " (always so as root; needed in most pods)")  # fmt: skip
    parser.add_argument("--browser-log", type=Path, help="write Chromium's own output here")
    parser.add_argument("--max-turns", type=int, default=12, help="model calls at most")
    parser.add_argument("--model", default=os.environ.get("OPENFORGE_MODEL", "policy"))
    parser.add_argument("--temperature", type=float, help="default: the endpoint's")
    parser.add_argument("--max-tokens", type=int, default=256, help="per model call")
    parser.add_argument("--stream", action="store_true", help="stream the model's replies")
    parser.add_argument("--spec", type=Path, default=SPEC_PATH, help="system prompt + tools")
    parser.add_argument("--transcript", type=Path, help="write the conversation here as JSON")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        prompt = task_prompt(args)
        if not os.environ.get("OPENAI_BASE_URL"):
            raise UsageError("OPENAI_BASE_URL is not set (e.g. http://127.0.0.1:8090/v1)")
        if not args.start_url or urlsplit(args.start_url).scheme not in ("http", "https"):
            raise UsageError(
                f"--start-url must be an http(s) URL (or set WEB_TASK_URL), got {args.start_url!r}"
            )
        if not args.workdir.is_dir():
            raise UsageError(f"--workdir {args.workdir} is not a directory")
        spec = json.loads(args.spec.read_text(encoding="utf-8"))
    except (UsageError, OSError, ValueError) as error:
        print(f"agent.py: {error}", file=sys.stderr)
        return EXIT_USAGE
    screenshots = args.screenshots or args.workdir / "screenshots"
    screenshots.mkdir(parents=True, exist_ok=True)
    width, height = args.viewport
    client = openai.OpenAI(api_key=os.environ.get("OPENAI_API_KEY") or "openforge", max_retries=0)
    agent: Agent | None = None
    with ExitStack() as stack:
        try:
            log_file = (
                stack.enter_context(args.browser_log.open("ab")) if args.browser_log else None
            )
            display = None
            if not args.headless:
                display = browser.Display(width=width, height=height)
                stack.callback(display.close)
            page = browser.Browser(binary=browser.find_chromium(args.chromium),
                                   width=width, height=height,
                                   display=display.name if display else None, log=log_file,
                                   no_sandbox=args.no_sandbox)  # fmt: skip
            stack.callback(page.close)
            page.navigate(args.start_url)
            agent = Agent(
                client=client, page=page, tools=Tools(page, origin=_origin(args.start_url)),
                spec=spec, model=args.model, max_turns=args.max_turns, screenshots=screenshots,
                element_list=args.element_list, stream=args.stream, temperature=args.temperature,
                max_tokens=args.max_tokens,
            )  # fmt: skip
            answer = agent.run(prompt)
        except browser.BrowserError as error:
            print(f"agent.py: the browser failed: {error}", file=sys.stderr)
            return EXIT_BROWSER
        except openai.OpenAIError as error:
            print(f"agent.py: the model endpoint failed: {error}", file=sys.stderr)
            return EXIT_MODEL
        finally:
            if args.transcript is not None and agent is not None:
                args.transcript.write_text(json.dumps(agent.transcript, indent=2), encoding="utf-8")
    if answer is None:
        print(f"agent.py: no final answer after {args.max_turns} turns", file=sys.stderr)
        return EXIT_TURNS
    (args.workdir / ANSWER_FILE).write_text(answer + "\n", encoding="utf-8")
    print(answer)
    return EXIT_OK


if __name__ == "__main__":
    # A SIGTERM (a runner's timeout, serve.py passing one on) unwinds like an
    # error, so the browser and the display are closed on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    sys.exit(main(sys.argv[1:]))
