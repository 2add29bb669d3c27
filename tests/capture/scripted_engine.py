"""An engine that answers the sidecar's token-in/token-out requests as a test scripts.

A stdlib HTTP server in the test's process, on 127.0.0.1: ``GET /v1/models``
lists the model card ``card`` (model ``m``; a test may change it); each ``POST``
takes the next answer named in ``script`` (``default`` once it is empty) from
:data:`ANSWERS`, and its path and body are kept in ``posts`` and ``bodies``, so
a test can tell what reached the engine.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai


def chunk(ids: list[int], *, finish: str | None = None, logprobs: bool = True) -> bytes:
    """One ``data:`` event of a completions stream carrying ``ids``."""
    choice: dict[str, Any] = {
        "index": 0,
        "text": "x" * len(ids),
        "token_ids": ids,
        "finish_reason": finish,
    }
    if logprobs:
        choice["logprobs"] = {"token_logprobs": [-0.5] * len(ids)}
    return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"
# "<think>\nI think so.\n</think>\n\nHello.<|im_end|>" in the tiny tokenizer, a token a chunk
THINKING_IDS = [7, 208, 50, 1040, 803, 23, 208, 8, 208, 208, 2219, 23, 2]

#: Each answer: status, extra headers, body.
ANSWERS: dict[str, tuple[int, dict[str, str], bytes]] = {
    "good": (200, {}, chunk([72]) + chunk([105], finish="stop") + DONE),
    "thinking": (
        200,
        {},
        b"".join(chunk([t]) for t in THINKING_IDS[:-1]) + chunk([2], finish="stop") + DONE,
    ),
    "not-json": (200, {}, chunk([72]) + b"data: {not json\n\n" + DONE),
    "truncated": (200, {}, chunk([72]) + chunk([105])),
    "no-logprobs": (200, {}, chunk([72], logprobs=False) + chunk([105], finish="stop")),
    "engine-error-event": (
        200,
        {},
        chunk([72]) + b'data: {"error": {"message": "out of memory"}}\n\n',
    ),
    "good-v1": (
        200,
        {"x-openforge-policy-version": "1"},
        chunk([72]) + chunk([105], finish="stop") + DONE,
    ),
    "good-v2": (
        200,
        {"x-openforge-policy-version": "2"},
        chunk([72]) + chunk([105], finish="stop") + DONE,
    ),
    "good-close": (
        200,
        {"connection": "close"},
        chunk([72]) + chunk([105], finish="stop") + DONE,
    ),
    "busy": (429, {"retry-after": "7"}, b'{"error": {"message": "too many requests"}}'),
    "down": (500, {}, b"internal"),
    "too-long": (400, {}, b'{"error": {"message": "the prompt exceeds the context length"}}'),
}


#: Answers that echo the request's prompt (vLLM's ``prompt_token_ids`` in the first chunk):
#: as it came, or with its middle ID changed.
ECHOES = frozenset({"echo", "echo-other"})


def echoing(prompt: list[int], *, changed: bool) -> bytes:
    """A good answer whose first chunk echoes ``prompt`` (its middle ID changed)."""
    echoed = list(prompt)
    if changed:
        echoed[len(echoed) // 2] += 1
    first = chunk([72]).replace(
        b'"finish_reason"',
        b'"prompt_token_ids": %s, "finish_reason"' % (json.dumps(echoed).encode()),
    )
    return first + chunk([105], finish="stop") + DONE


#: Answers that fail at the connection: ``hang`` reads the request and says nothing,
#: ``stall`` sends the head and one chunk of a chunked stream and then nothing,
#: ``reset`` and ``reset-mid`` reset the connection before the head and after a chunk.
#: The silent ones hold until the engine stops.
FAILURES = frozenset({"hang", "stall", "reset", "reset-mid"})


class ScriptedEngine:
    def __init__(self, *, default: str | None = None) -> None:
        self.script: list[str] = []
        self.default = default
        self.posts: list[str] = []  # the paths of the requests that reached the engine
        self.bodies: list[dict[str, Any]] = []  # and their JSON bodies
        self.card: dict[str, Any] = {"id": "m"}
        self.stopping = threading.Event()  # releases the answers that hang
        self._fillers: list[socket.socket] = []
        self.models_read = 0  # GET /v1/models answered
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedEngine:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        for filler in self._fillers:
            filler.close()

    def stop_accepting(self) -> None:
        """Accept no more connections, and let a new one hang in its connect: the
        listening socket stays, its backlog filled by connections nobody accepts."""
        self._server.shutdown()
        port = self._server.server_address[1]
        for _ in range(self._server.request_queue_size + 3):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            self._fillers.append(filler)

    def next_name(self) -> str | None:
        return self.script.pop(0) if self.script else self.default

    def next_answer(self, name: str | None) -> tuple[int, dict[str, str], bytes]:
        if name is None:
            return 500, {}, b'{"error": {"message": "the test scripted no answer"}}'
        return ANSWERS[name]


def _handler(engine: ScriptedEngine) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # as vLLM and openforge serve answer (kept alive)

        def log_message(self, *args: Any) -> None:
            del args

        def do_GET(self) -> None:
            body = json.dumps({"data": [engine.card]}).encode()
            engine.models_read += 1
            self._send(200, {}, body, "application/json")

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            engine.bodies.append(json.loads(body) if body else {})
            engine.posts.append(self.path)
            name = engine.next_name()
            if name in FAILURES:
                self._fail(name)
                return
            if name in ECHOES:
                prompt = engine.bodies[-1]["prompt"]
                status, headers, body = 200, {}, echoing(prompt, changed=name == "echo-other")
            else:
                status, headers, body = engine.next_answer(name)
            self._send(
                status, headers, body, "text/event-stream" if status == 200 else "application/json"
            )

        def _fail(self, name: str) -> None:
            if name in ("stall", "reset-mid"):
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                data = chunk([72])
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            if name in ("reset", "reset-mid"):
                linger = struct.pack("ii", 1, 0)  # close with a RST
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
            else:
                engine.stopping.wait(60)
            self.close_connection = True
            if name not in ("reset", "reset-mid"):
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
            self.connection.close()

        def finish(self) -> None:
            with contextlib.suppress(OSError, ValueError):
                super().finish()

        def _send(self, status: int, headers: dict[str, str], body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(body)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

    return Handler


def wait_for(predicate: Callable[[], bool], *, timeout: float = 10.0) -> None:
    """Wait until ``predicate()`` holds; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def sidecar_for(
    procs: Any,
    engine: ScriptedEngine,
    *,
    job: str,
    rollout: str,
    tokenizer: Path,
    extra: tuple[str, ...] = (),
) -> Any:
    """A real sidecar (with a collector and its store) generating from ``engine``."""
    collector = procs.collector()
    return procs.sidecar(
        "--engine", engine.url, "--engine-model", "m", "--tokenizer", str(tokenizer),
        "--collector", f"127.0.0.1:{collector.port}", "--job", job, "--rollout-id", rollout,
        *extra,
    )  # fmt: skip


def finish(sidecar: Any) -> None:
    """Finish the sidecar's rollout and wait until the collector has every record."""
    response = httpx.post(
        f"{sidecar.url}/openforge/v1/rollout/finish",
        json={"exit_code": 0, "reward": 0.0, "wait_seconds": 30},
        timeout=45,
    )
    assert response.status_code == 200 and response.json()["acknowledged"], response.text


def stream_openai_chat(sidecar: Any) -> None:
    """One streamed call through the official OpenAI SDK (it raises on an error event)."""
    client = openai.OpenAI(base_url=f"{sidecar.url}/v1", api_key="x", max_retries=0)
    stream = client.chat.completions.create(
        model="p", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    for _ in stream:
        pass


def stream_openai_responses(sidecar: Any) -> None:
    """One streamed Responses call; a failed response raises as the SDK's error."""
    client = openai.OpenAI(base_url=f"{sidecar.url}/v1", api_key="x", max_retries=0)
    for event in client.responses.create(model="p", input="hi", stream=True):
        if event.type in ("response.failed", "error"):
            raise openai.APIError(event.type, request=httpx.Request("POST", sidecar.url), body=None)


def stream_anthropic(sidecar: Any) -> None:
    """One streamed call through the official Anthropic SDK (it raises on an error event)."""
    client = anthropic.Anthropic(base_url=sidecar.url, api_key="x", max_retries=0)
    with client.messages.stream(
        model="p", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        for _ in stream:
            pass


#: Each official SDK's streamed call, and the error it raises on the API's error event.
STREAMING_SDKS = [
    (stream_openai_chat, openai.APIError),
    (stream_openai_responses, openai.APIError),
    (stream_anthropic, anthropic.APIError),
]
