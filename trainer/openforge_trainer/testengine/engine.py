"""A deterministic stand-in for vLLM's token-in/token-out completions server.

It serves what the sidecar uses of vLLM (>= 0.10.2): ``POST /v1/completions``
with a token-ID prompt, ``return_token_ids``, per-token logprobs and
streaming, plus ``GET /v1/models`` and ``/health``; what a harness would use
without the sidecar, ``POST /v1/chat/completions`` (:mod:`testengine_chat`:
the benchmarks' baseline); and the OpenForge
extras a real engine deployment also serves: ``GET /openforge/v1/policy`` and
the policy tokenizer's files under ``/openforge/v1/tokenizer/``.

What it generates comes from :mod:`testengine_policy`, a script that lets real
agent harnesses complete a one-tool-call task; logprobs are a hash of
(prompt IDs, position, token ID), so every answer is reproducible. The server
is stdlib-only (``ThreadingHTTPServer`` speaking HTTP/1.1, chunked transfer
encoding for streams) and binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from openforge import endpoints
from tokenizers import Tokenizer

from openforge_trainer.serving import completions as protocol
from openforge_trainer.testengine import chat, policy
from openforge_trainer.tiny import tokenizer_build

DEFAULT_MODEL = "openforge-tiny"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    tokenizer_dir: Path
    model: str = DEFAULT_MODEL
    policy_version: int = 0
    reasoning: bool = False
    max_model_len: int = 32768
    token_delay_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class Generation:
    prompt_ids: list[int]
    token_ids: list[int]
    finish_reason: str
    stop_reason: int | None
    stop_terminated: bool  # the last token is a stop token, left out of the text


class ScriptedEngine:
    """Generates deterministically from a token prompt; no HTTP here."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.files = {name: (config.tokenizer_dir / name).read_bytes() for name in TOKENIZER_FILES}
        self.tokenizer = Tokenizer.from_str(self.files["tokenizer.json"].decode("utf-8"))
        self._chat_config = json.loads(self.files["tokenizer_config.json"])
        eos = self._chat_config["eos_token"]
        eos_id = self.tokenizer.token_to_id(eos["content"] if isinstance(eos, dict) else eos)
        if eos_id is None:
            raise ValueError(f"eos_token {eos!r} is not in the tokenizer's vocabulary")
        self.eos_id = int(eos_id)
        self.vocab_size = int(self.tokenizer.get_vocab_size(with_added_tokens=True))
        self._chat_template: Any = None  # compiled when a chat request first needs it

    def chat_prompt_ids(self, request: chat.ChatRequest) -> list[int]:
        """A chat request rendered with the tokenizer's chat template, as token IDs."""
        if self._chat_template is None:
            self._chat_template = chat.chat_template(self._chat_config)
        return protocol.check_prompt(
            protocol.CompletionRequest(
                model=request.model,
                prompt=chat.render(self._chat_template, request),
                max_tokens=request.max_tokens,
            ),
            encode=lambda text: list(self.tokenizer.encode(text, add_special_tokens=False).ids),
            vocab_size=self.vocab_size,
            max_model_len=self.config.max_model_len,
        )

    def prompt_ids(self, request: protocol.CompletionRequest) -> list[int]:
        """The request's prompt as token IDs, checked against vocabulary and context."""
        return protocol.check_prompt(
            request,
            encode=lambda text: list(self.tokenizer.encode(text, add_special_tokens=False).ids),
            vocab_size=self.vocab_size,
            max_model_len=self.config.max_model_len,
        )

    def generate(self, request: protocol.CompletionRequest, prompt_ids: list[int]) -> Generation:
        """Run the script, then stop the way vLLM's scheduler does (length first)."""
        prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        answer = policy.respond(prompt, reasoning=self.config.reasoning)
        script = [*self.tokenizer.encode(answer, add_special_tokens=False).ids, self.eos_id]
        limit = request.max_tokens or self.config.max_model_len - len(prompt_ids)
        stops = set(request.stop_token_ids)
        out: list[int] = []
        for token in script:
            out.append(token)
            if len(out) >= limit:
                return Generation(prompt_ids, out, "length", None, False)
            if token == self.eos_id:
                return Generation(prompt_ids, out, "stop", None, True)
            if token in stops:
                return Generation(prompt_ids, out, "stop", token, True)
        raise AssertionError("the script always ends with the EOS token")

    def text(self, ids: list[int], *, skip_special_tokens: bool) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    def token_logprobs(self, generation: Generation, top: int) -> list[protocol.TokenLogprob]:
        """Each generated token's logprob: a hash of (prompt, position, token)."""
        seed = hashlib.blake2b(
            struct.pack(f"<{len(generation.prompt_ids)}q", *generation.prompt_ids), digest_size=16
        ).digest()
        entries = []
        for position, token in enumerate(generation.token_ids):
            chosen = _logprob(seed, position, token_id=token)
            alternatives = {self._token(token): chosen}
            for rank in range(1, top + 1):
                other = (token + rank * 997) % self.vocab_size
                alternatives.setdefault(
                    self._token(other), _logprob(seed, position, token_id=other) - 5.0
                )
            entries.append(protocol.TokenLogprob(self._token(token), chosen, alternatives))
        return entries

    def _token(self, token_id: int) -> str:
        return str(self.tokenizer.decode([token_id], skip_special_tokens=False))


def _logprob(seed: bytes, position: int, *, token_id: int) -> float:
    digest = hashlib.blake2b(seed + struct.pack("<qq", position, token_id), digest_size=8).digest()
    unit = int.from_bytes(digest, "little") / 2**64
    return -round(0.001 + 4.0 * unit, 6)


# --- responses ----------------------------------------------------------------


def completion_body(
    engine: ScriptedEngine, request: protocol.CompletionRequest, *, generation: Generation
) -> dict[str, Any]:
    ids = generation.token_ids
    visible = ids[:-1] if generation.stop_terminated else ids
    logprobs = None
    if request.logprobs is not None:
        logprobs = protocol.logprobs_object(engine.token_logprobs(generation, request.logprobs))
    return protocol.completion_response(
        request_id=_request_id(),
        created=int(time.time()),
        model=engine.config.model,
        text=engine.text(visible, skip_special_tokens=request.skip_special_tokens),
        logprobs=logprobs,
        finish_reason=generation.finish_reason,
        stop_reason=generation.stop_reason,
        token_ids=list(ids) if request.return_token_ids else None,
        prompt_token_ids=list(generation.prompt_ids) if request.return_token_ids else None,
        prompt_tokens=len(generation.prompt_ids),
        completion_tokens=len(ids),
    )


def stream_bodies(
    engine: ScriptedEngine, request: protocol.CompletionRequest, *, generation: Generation
) -> Iterator[dict[str, Any]]:
    """One chunk per generated token, then the usage chunk if asked for."""
    request_id, created, model = _request_id(), int(time.time()), engine.config.model
    ids = generation.token_ids
    visible = ids[:-1] if generation.stop_terminated else ids
    entries = None
    if request.logprobs is not None:
        entries = engine.token_logprobs(generation, request.logprobs)
    emitted = ""
    for i, token in enumerate(ids):
        last = i == len(ids) - 1
        delta = ""
        if i < len(visible):
            text = engine.text(visible[: i + 1], skip_special_tokens=request.skip_special_tokens)
            if i == len(visible) - 1 or not text.endswith("\ufffd"):
                delta = text[len(emitted) :]
        logprobs = None
        if entries is not None:
            logprobs = protocol.logprobs_object([entries[i]], text_offset=len(emitted))
        emitted += delta
        yield protocol.stream_chunk(
            request_id=request_id,
            created=created,
            model=model,
            text=delta,
            logprobs=logprobs,
            finish_reason=generation.finish_reason if last else None,
            stop_reason=generation.stop_reason if last else None,
            prompt_token_ids=list(generation.prompt_ids) if i == 0 else None,
            token_ids=[token] if request.return_token_ids else None,
            chunk_usage=(
                protocol.usage(len(generation.prompt_ids), i + 1)
                if request.include_usage and request.continuous_usage_stats
                else None
            ),
        )
    if request.include_usage:
        yield protocol.usage_chunk(
            request_id=request_id,
            created=created,
            model=model,
            prompt_tokens=len(generation.prompt_ids),
            completion_tokens=len(ids),
        )


def _request_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"


# --- HTTP -----------------------------------------------------------------------


class EngineServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], engine: ScriptedEngine) -> None:
        super().__init__(address, _Handler)
        self.engine = engine


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: EngineServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: tests and harness runs read stdout

    def do_GET(self) -> None:
        engine = self.server.engine
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._send(HTTPStatus.OK, b"", content_type="application/json")
        elif path == "/v1/models":
            self._json(HTTPStatus.OK, _models_body(engine))
        elif path == endpoints.POLICY:
            body = {"model": engine.config.model, "policy_version": engine.config.policy_version}
            self._json(HTTPStatus.OK, body)
        elif path.startswith(endpoints.TOKENIZER + "/") and path.rsplit("/", 1)[1] in engine.files:
            self._send(
                HTTPStatus.OK, engine.files[path.rsplit("/", 1)[1]], content_type="application/json"
            )
        elif path == "/v1/completions":
            self._json(HTTPStatus.METHOD_NOT_ALLOWED, {"detail": "Method Not Allowed"})
        else:
            self._json(HTTPStatus.NOT_FOUND, {"detail": "Not Found"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/v1/chat/completions":
            self._chat()
            return
        if path != "/v1/completions":
            self._read_body()
            self._json(HTTPStatus.NOT_FOUND, {"detail": "Not Found"})
            return
        try:
            request = protocol.parse_request(self._read_body())
            engine = self.server.engine
            _check_model(engine, request.model)
            generation = engine.generate(request, engine.prompt_ids(request))
        except protocol.RequestError as error:
            self._json(HTTPStatus(error.status), protocol.error_body(error))
            return
        if request.stream:
            bodies = stream_bodies(engine, request, generation=generation)
            self._stream((body, bool(body["choices"])) for body in bodies)
        else:
            self._json(HTTPStatus.OK, completion_body(engine, request, generation=generation))

    def _chat(self) -> None:
        engine = self.server.engine
        try:
            request = chat.parse_chat_request(self._read_body())
            _check_model(engine, request.model)
            prompt_ids = engine.chat_prompt_ids(request)
            generation = engine.generate(
                protocol.CompletionRequest(
                    model=request.model, prompt=prompt_ids, max_tokens=request.max_tokens
                ),
                prompt_ids,
            )
        except protocol.RequestError as error:
            self._json(HTTPStatus(error.status), protocol.error_body(error))
            return
        answer = chat.Answer(
            model=engine.config.model,
            prompt_tokens=len(prompt_ids),
            token_ids=generation.token_ids,
            stop_terminated=generation.stop_terminated,
            finish_reason=generation.finish_reason,
            decode=lambda ids: engine.text(ids, skip_special_tokens=True),
        )
        if request.stream:
            self._stream(chat.stream_bodies(request, answer))
        else:
            self._json(HTTPStatus.OK, chat.response_body(answer))

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _json(self, status: HTTPStatus, body: dict[str, Any]) -> None:
        self._send(status, json.dumps(body).encode("utf-8"), content_type="application/json")

    def _send(self, status: HTTPStatus, body: bytes, *, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _stream(self, bodies: Iterator[tuple[dict[str, Any] | None, bool]]) -> None:
        """Send ``(chunk, after a token)`` pairs as SSE; each generated token is paced."""
        delay = self.server.engine.config.token_delay_ms / 1000.0
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        # like `openforge serve`: which policy version produced this answer
        self.send_header(
            endpoints.POLICY_VERSION_HEADER, str(self.server.engine.config.policy_version)
        )
        self.end_headers()
        try:
            for body, token in bodies:
                if delay and token:
                    time.sleep(delay)
                if body is not None:
                    self._chunk(f"data: {json.dumps(body)}\n\n".encode())
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away mid-stream

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


def _check_model(engine: ScriptedEngine, model: str | None) -> None:
    if model is not None and model != engine.config.model:
        raise protocol.RequestError(
            f"The model `{model}` does not exist.", status=404, kind="NotFoundError", param="model"
        )


def _models_body(engine: ScriptedEngine) -> dict[str, Any]:
    config = engine.config
    return protocol.models_body(
        model=config.model, max_model_len=config.max_model_len, policy_version=config.policy_version
    )


def start_in_thread(
    config: EngineConfig | None = None, *, host: str = "127.0.0.1", port: int = 0
) -> tuple[str, Callable[[], None]]:
    """Serve in a background thread; return the base URL and a stop function."""
    engine = ScriptedEngine(config or EngineConfig(tokenizer_build.committed_assets()))
    server = EngineServer((host, port), engine)
    thread = threading.Thread(
        target=server.serve_forever, name="openforge-test-engine", daemon=True
    )
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join()

    return f"http://{host}:{server.server_address[1]}", stop


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="openforge test-engine",
        description="Serve the deterministic token-in/token-out test engine (vLLM-compatible).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one")
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="tokenizer directory (default: the committed tiny tokenizer)",
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, help="model name to serve")
    parser.add_argument("--policy-version", type=int, default=0, help="policy version to report")
    parser.add_argument("--max-model-len", type=int, default=32768, help="context length")
    parser.add_argument(
        "--token-delay-ms", type=float, default=0.0, help="pause before each streamed token"
    )
    parser.add_argument(
        "--reasoning", action="store_true", help="open every answer with a short <think> block"
    )
    args = parser.parse_args(argv)
    config = EngineConfig(
        tokenizer_dir=args.tokenizer or tokenizer_build.committed_assets(),
        model=args.model,
        policy_version=args.policy_version,
        reasoning=args.reasoning,
        max_model_len=args.max_model_len,
        token_delay_ms=args.token_delay_ms,
    )
    server = EngineServer((args.host, args.port), ScriptedEngine(config))
    url = f"http://{args.host}:{server.server_address[1]}"
    print(f"openforge test-engine: serving {config.model} on {url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
