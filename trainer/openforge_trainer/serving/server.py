"""``openforge serve``: the embedded inference server the sidecars generate from.

It serves a Hugging Face causal LM (a ``save_pretrained`` directory with the
policy's ``tokenizer.json`` and ``tokenizer_config.json``) with torch and
transformers, on CPU or GPU, and speaks exactly the part of vLLM (>= 0.10.2)
the sidecar uses: ``POST /v1/completions`` with a token-ID prompt,
``return_token_ids``, per-token logprobs, ``stop_token_ids``, ``stop``
strings, ``temperature``/``top_p``/``seed`` and streaming (request parsing and
response bodies come from :mod:`testengine_protocol`, shared with the test
engine), ``GET /v1/models`` and ``/health``. Each token's logprob is the raw
one (``log_softmax`` of the logits at temperature 1, float32; see
:mod:`batching`), which is what the trainer recomputes. The OpenForge extras:

- ``GET /openforge/v1/policy``: ``{"model", "policy_version"}``;
- ``GET /openforge/v1/tokenizer/tokenizer.json`` and ``.../tokenizer_config.json``:
  the files the sidecar loads the policy tokenizer from;
- ``POST /openforge/v1/weights``: new weights without a restart, either JSON
  ``{"path": <checkpoint dir or .safetensors file>, "policy_version": N,
  "drain": false, "partial": false}`` or an ``application/octet-stream`` body
  holding a safetensors state dict with header ``x-openforge-policy-version: N``
  (``?drain=true`` / ``?partial=true`` as query parameters). Without a
  version the current one goes up by 1; every model tensor must be present
  unless ``partial``. Answers ``{"policy_version", "load_ms", "wait_ms",
  "tensors"}``; a tensor whose name or shape does not fit is a 400 naming it,
  and nothing is changed. See :mod:`batching` for what happens to requests in
  flight (they continue on the new weights; ``drain`` waits for them instead);
- ``POST /openforge/v1/pause`` and ``/openforge/v1/resume``;
  ``GET /openforge/v1/status`` (policy version, paused, running, waiting).

Every ``/v1/completions`` answer carries the header
``x-openforge-policy-version``: the version of the weights that produced its
first token. A stream's final usage chunk (``stream_options.include_usage``)
repeats it as ``openforge_policy_version``.

Generation runs on one scheduler thread (:mod:`batching`: continuous
batching); HTTP is the stdlib ``ThreadingHTTPServer`` speaking HTTP/1.1 with
chunked transfer encoding for streams, like the test engine. Sampling
defaults (``temperature``, ``top_p``) come from the model's
``generation_config.json`` when it sets them, else 1.0, as vLLM's
``--generation-config auto`` does.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn
from urllib.parse import parse_qs, urlsplit

import torch
from openforge import endpoints
from tokenizers import Tokenizer

from openforge_trainer.serving import batching, weights
from openforge_trainer.serving import completions as protocol

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
GREEDY_EPS = 1e-5  # vLLM treats a temperature below this as greedy


@dataclass(frozen=True, slots=True)
class ServeConfig:
    model_dir: Path
    model_name: str | None = None  # default: the model directory as given, like vLLM
    policy_version: int = 0
    max_batch: int = 32
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    device: str = "cpu"
    dtype: str = "float32"


class Engine:
    """The model, its tokenizer and the scheduler; no HTTP here."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.name = config.model_name or str(config.model_dir)
        self.files = _tokenizer_files(config.model_dir)
        self.tokenizer = Tokenizer.from_str(self.files["tokenizer.json"].decode("utf-8"))
        self.vocab_size = int(self.tokenizer.get_vocab_size(with_added_tokens=True))
        self.model = weights.load_model(config.model_dir, device=config.device, dtype=config.dtype)
        layer_types = set(getattr(self.model.config, "layer_types", None) or ["full_attention"])
        if layer_types != {"full_attention"}:
            raise ValueError(
                f"model layer types {sorted(layer_types)}: openforge serve batches "
                "full-attention models only"
            )
        embeddings = int(self.model.config.vocab_size)
        if self.vocab_size > embeddings:
            raise ValueError(
                f"tokenizer has {self.vocab_size} tokens but the model embeds only {embeddings}"
            )
        generation = _generation_config(config.model_dir)
        self.default_temperature = float(generation.get("temperature", 1.0))
        self.default_top_p = float(generation.get("top_p", 1.0))
        self.max_model_len = config.max_model_len or int(self.model.config.max_position_embeddings)
        self.scheduler = batching.Scheduler(
            self.model,
            eos_token_id=self._eos_id(),
            extra_stop_ids=_as_ids(generation.get("eos_token_id")),
            max_batch=config.max_batch,
            max_model_len=self.max_model_len,
            policy_version=config.policy_version,
        )
        self._token_cache: dict[int, str] = {}

    def start(self) -> None:
        self.scheduler.start()

    def close(self) -> None:
        self.scheduler.stop()

    def _eos_id(self) -> int | None:
        eos = json.loads(self.files["tokenizer_config.json"]).get("eos_token")
        if eos is None:
            return None
        eos_id = self.tokenizer.token_to_id(eos["content"] if isinstance(eos, dict) else eos)
        if eos_id is None:
            raise ValueError(f"eos_token {eos!r} is not in the tokenizer's vocabulary")
        return int(eos_id)

    # --- requests ---------------------------------------------------------------

    def submit(self, request: protocol.CompletionRequest) -> tuple[list[int], batching.Sequence]:
        """Validate a request and queue it for generation."""
        if request.model is not None and request.model != self.name:
            raise protocol.RequestError(
                f"The model `{request.model}` does not exist.",
                status=404,
                kind="NotFoundError",
                param="model",
            )
        prompt_ids = protocol.check_prompt(
            request,
            encode=lambda text: list(self.tokenizer.encode(text, add_special_tokens=False).ids),
            vocab_size=self.vocab_size,
            max_model_len=self.max_model_len,
        )
        try:
            return prompt_ids, self.scheduler.submit(prompt_ids, self.sampling(request, prompt_ids))
        except batching.SchedulerError as error:
            raise protocol.RequestError(
                str(error), status=503, kind="ServiceUnavailable"
            ) from error

    def sampling(
        self, request: protocol.CompletionRequest, prompt_ids: list[int]
    ) -> batching.SamplingParams:
        temperature = (
            self.default_temperature if request.temperature is None else request.temperature
        )
        return batching.SamplingParams(
            max_tokens=request.max_tokens or self.max_model_len - len(prompt_ids),
            temperature=0.0 if temperature < GREEDY_EPS else temperature,
            top_p=self.default_top_p if request.top_p is None else request.top_p,
            seed=request.seed,
            stop_token_ids=frozenset(request.stop_token_ids),
            top_logprobs=request.logprobs or 0,
        )

    def text(self, ids: list[int], *, skip_special_tokens: bool) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    def token(self, token_id: int) -> str:
        """One token's text, as the logprobs object names it."""
        text = self._token_cache.get(token_id)
        if text is None:
            text = str(self.tokenizer.decode([token_id], skip_special_tokens=False))
            self._token_cache[token_id] = text
        return text

    def logprob_entry(self, event: batching.TokenEvent) -> protocol.TokenLogprob:
        """vLLM's per-token logprobs: the sampled token first, then the top alternatives."""
        top = {self.token(event.token_id): event.logprob}
        for token_id, value in event.top:
            top.setdefault(self.token(token_id), value)
        return protocol.TokenLogprob(self.token(event.token_id), event.logprob, top)

    # --- weights ----------------------------------------------------------------

    def update_weights(
        self, source: Path | bytes, *, policy_version: int | None, drain: bool, partial: bool
    ) -> dict[str, Any]:
        """Read and check new weights, then swap them in at a step boundary."""
        tensors, read_ms = weights.timed_read(source)
        update = weights.plan(self.model, tensors, partial=partial)
        copy_ms = 0.0

        def apply() -> None:
            nonlocal copy_ms
            start = time.perf_counter()
            weights.apply(update)
            copy_ms = (time.perf_counter() - start) * 1000.0

        version, wait_ms = self.scheduler.update(apply, policy_version=policy_version, drain=drain)
        return {
            "policy_version": version,
            "load_ms": round(read_ms + copy_ms, 3),
            "wait_ms": round(wait_ms, 3),
            "tensors": len(update.names),
        }


def _tokenizer_files(directory: Path) -> dict[str, bytes]:
    files = {}
    for name in TOKENIZER_FILES:
        path = directory / name
        if not path.is_file():
            raise FileNotFoundError(f"model directory {directory} has no {name}")
        files[name] = path.read_bytes()
    return files


def _generation_config(directory: Path) -> dict[str, Any]:
    path = directory / "generation_config.json"
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else {}


def _as_ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


# --- response bodies ------------------------------------------------------------


class Output:
    """One request's tokens as the scheduler sends them, with their text.

    Iterating gives each token event with the text it adds to a stream. A
    stop string ends the request at the token that completes it (that event
    is given ``finish_reason`` "stop" and the string as ``stop_reason``, as
    vLLM reports it) and the scheduler is told to drop the request.
    """

    def __init__(
        self,
        engine: Engine,
        request: protocol.CompletionRequest,
        *,
        seq: batching.Sequence,
        first: batching.TokenEvent,
    ) -> None:
        self.seq = seq
        self.first = first
        self.events: list[batching.TokenEvent] = []
        self.text = protocol.OutputText(
            lambda ids: engine.text(ids, skip_special_tokens=request.skip_special_tokens),
            stops=request.stop,
            streaming=request.stream,
        )

    def __iter__(self) -> Iterator[tuple[batching.TokenEvent, str]]:
        event: batching.Event = self.first
        while True:
            if isinstance(event, batching.ErrorEvent):
                raise protocol.RequestError(event.message, status=500, kind="InternalServerError")
            stop, delta = self.text.add(
                event.token_id,
                stop_token=event.finish_reason == "stop",
                final=event.finish_reason is not None,
            )
            if stop is not None:
                self.seq.cancel()
                event = dataclasses.replace(event, finish_reason="stop", stop_reason=stop)
            self.events.append(event)
            yield event, delta
            if event.finish_reason is not None:
                return
            event = self.seq.events.get()


def completion_body(
    engine: Engine, request: protocol.CompletionRequest, *, prompt_ids: list[int], output: Output
) -> dict[str, Any]:
    """The non-streamed answer, once every token is in."""
    for _ in output:
        pass
    ids = [event.token_id for event in output.events]
    logprobs = None
    if request.logprobs is not None:
        logprobs = protocol.logprobs_object([engine.logprob_entry(e) for e in output.events])
    last = output.events[-1]
    return protocol.completion_response(
        request_id=_request_id(),
        created=int(time.time()),
        model=engine.name,
        text=output.text.text,
        logprobs=logprobs,
        finish_reason=last.finish_reason or "length",
        stop_reason=last.stop_reason,
        token_ids=ids if request.return_token_ids else None,
        prompt_token_ids=list(prompt_ids) if request.return_token_ids else None,
        prompt_tokens=len(prompt_ids),
        completion_tokens=len(ids),
    )


def stream_bodies(
    engine: Engine, request: protocol.CompletionRequest, *, prompt_ids: list[int], output: Output
) -> Iterator[dict[str, Any]]:
    """One chunk per token as it is sampled, then the usage chunk if asked for."""
    request_id, created = _request_id(), int(time.time())
    count = 0
    for event, delta in output:
        count += 1
        logprobs = None
        if request.logprobs is not None:
            offset = len(output.text.emitted) - len(delta)
            logprobs = protocol.logprobs_object([engine.logprob_entry(event)], text_offset=offset)
        yield protocol.stream_chunk(
            request_id=request_id,
            created=created,
            model=engine.name,
            text=delta,
            logprobs=logprobs,
            finish_reason=event.finish_reason,
            stop_reason=event.stop_reason,
            prompt_token_ids=list(prompt_ids) if count == 1 else None,
            token_ids=[event.token_id] if request.return_token_ids else None,
            chunk_usage=(
                protocol.usage(len(prompt_ids), count)
                if request.include_usage and request.continuous_usage_stats
                else None
            ),
        )
    if request.include_usage:
        chunk = protocol.usage_chunk(
            request_id=request_id,
            created=created,
            model=engine.name,
            prompt_tokens=len(prompt_ids),
            completion_tokens=count,
        )
        chunk["openforge_policy_version"] = output.first.policy_version
        yield chunk


def _request_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"


# --- HTTP -------------------------------------------------------------------------


class ServeServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], engine: Engine) -> None:
        super().__init__(address, _Handler)
        self.engine = engine


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: ServeServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the ready line on stdout is what callers read

    def do_GET(self) -> None:
        engine = self.server.engine
        path = urlsplit(self.path).path
        name = path.rsplit("/", 1)[1]
        if path == "/health":
            self._send(HTTPStatus.OK, b"", content_type="application/json")
        elif path == "/v1/models":
            body = protocol.models_body(
                model=engine.name,
                max_model_len=engine.max_model_len,
                policy_version=engine.scheduler.policy_version,
            )
            self._json(HTTPStatus.OK, body)
        elif path == endpoints.POLICY:
            body = {"model": engine.name, "policy_version": engine.scheduler.policy_version}
            self._json(HTTPStatus.OK, body)
        elif path == endpoints.STATUS:
            self._json(HTTPStatus.OK, _status(engine))
        elif path.startswith(endpoints.TOKENIZER + "/") and name in engine.files:
            self._send(HTTPStatus.OK, engine.files[name], content_type="application/json")
        elif path in POST_ROUTES:
            self._json(HTTPStatus.METHOD_NOT_ALLOWED, {"detail": "Method Not Allowed"})
        else:
            self._json(HTTPStatus.NOT_FOUND, {"detail": "Not Found"})

    def do_POST(self) -> None:
        route = POST_ROUTES.get(urlsplit(self.path).path)
        if route is None:
            self._read_body()
            self._json(HTTPStatus.NOT_FOUND, {"detail": "Not Found"})
            return
        try:
            route(self)
        except protocol.RequestError as error:
            self._json(HTTPStatus(error.status), protocol.error_body(error))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client left before its answer was ready

    # --- routes -------------------------------------------------------------------

    def _completions(self) -> None:
        engine = self.server.engine
        request = protocol.parse_request(self._read_body())
        prompt_ids, seq = engine.submit(request)
        first = seq.events.get()
        if isinstance(first, batching.ErrorEvent):
            raise protocol.RequestError(first.message, status=500, kind="InternalServerError")
        output = Output(engine, request, seq=seq, first=first)
        headers = {endpoints.POLICY_VERSION_HEADER: str(first.policy_version)}
        if request.stream:
            self._stream(
                stream_bodies(engine, request, prompt_ids=prompt_ids, output=output),
                seq,
                headers=headers,
            )
        else:
            body = completion_body(engine, request, prompt_ids=prompt_ids, output=output)
            self._json(HTTPStatus.OK, body, headers=headers)

    def _weights(self) -> None:
        engine = self.server.engine
        query = parse_qs(urlsplit(self.path).query)
        content_type = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip()
        try:
            if content_type == "application/octet-stream":
                update = WeightsRequest(
                    source=self._read_body(),
                    policy_version=_int_header(self.headers.get(endpoints.POLICY_VERSION_HEADER)),
                    drain=_query_flag(query, "drain"),
                    partial=_query_flag(query, "partial"),
                )
            else:
                update = _weights_request(self._read_body())
            result = engine.update_weights(
                update.source,
                policy_version=update.policy_version,
                drain=update.drain,
                partial=update.partial,
            )
        except weights.WeightsError as error:
            raise protocol.RequestError(str(error), param=_param(str(error))) from error
        except batching.SchedulerError as error:
            raise protocol.RequestError(str(error), status=409, kind="Conflict") from error
        self._json(HTTPStatus.OK, result)

    def _pause(self) -> None:
        self._read_body()
        self.server.engine.scheduler.pause()
        self._json(HTTPStatus.OK, _status(self.server.engine))

    def _resume(self) -> None:
        self._read_body()
        self.server.engine.scheduler.resume()
        self._json(HTTPStatus.OK, _status(self.server.engine))

    # --- plumbing -----------------------------------------------------------------

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _json(
        self, status: HTTPStatus, body: dict[str, Any], *, headers: dict[str, str] | None = None
    ) -> None:
        self._send(
            status,
            json.dumps(body).encode("utf-8"),
            content_type="application/json",
            headers=headers,
        )

    def _send(
        self,
        status: HTTPStatus,
        body: bytes,
        *,
        content_type: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _stream(
        self,
        bodies: Iterator[dict[str, Any]],
        seq: batching.Sequence,
        *,
        headers: dict[str, str],
    ) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        try:
            try:
                for body in bodies:
                    self._chunk(f"data: {json.dumps(body)}\n\n".encode())
            except protocol.RequestError as error:  # the headers are out: report in-stream
                self._chunk(f"data: {json.dumps(protocol.error_body(error))}\n\n".encode())
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            seq.cancel()  # the client went away: stop generating for it
            self.close_connection = True

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


POST_ROUTES: dict[str, Callable[[_Handler], None]] = {
    "/v1/completions": _Handler._completions,
    endpoints.WEIGHTS: _Handler._weights,
    endpoints.PAUSE: _Handler._pause,
    endpoints.RESUME: _Handler._resume,
}


def _status(engine: Engine) -> dict[str, Any]:
    scheduler = engine.scheduler
    return {
        "model": engine.name,
        "policy_version": scheduler.policy_version,
        "paused": scheduler.paused,
        **scheduler.load(),
    }


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WeightsRequest:
    """A ``POST /openforge/v1/weights``: new weights (a safetensors file's path, or its
    bytes uploaded), the policy version they are, and how to swap them in."""

    source: Path | bytes
    policy_version: int | None
    drain: bool = False
    partial: bool = False


def _weights_request(body: bytes) -> WeightsRequest:
    """Parse ``{"path", "policy_version", "drain", "partial"}``; errors name the field."""
    try:
        data = json.loads(body or b"null")
    except ValueError as error:
        raise weights.WeightsError(f"request body is not valid JSON: {error}") from error
    if not isinstance(data, dict):
        raise weights.WeightsError(
            "request body must be a JSON object with a path, or an application/octet-stream "
            "safetensors state dict"
        )
    path = data.get("path")
    if not isinstance(path, str) or not path:
        raise weights.WeightsError(f"path: must be a non-empty string, got {path!r}")
    version = data.get("policy_version")
    if version is not None and (
        not isinstance(version, int) or isinstance(version, bool) or version < 0
    ):
        raise weights.WeightsError(
            f"policy_version: must be a non-negative integer or null, got {version!r}"
        )
    flags = {}
    for field in ("drain", "partial"):
        value = data.get(field, False)
        if not isinstance(value, bool):
            raise weights.WeightsError(f"{field}: must be a boolean, got {value!r}")
        flags[field] = value
    return WeightsRequest(
        source=Path(path), policy_version=version, drain=flags["drain"], partial=flags["partial"]
    )


def _int_header(value: str | None) -> int | None:
    if value is None:
        return None
    if not value.strip().isdigit():
        raise weights.WeightsError(
            f"{endpoints.POLICY_VERSION_HEADER}: must be a non-negative integer, got {value!r}"
        )
    return int(value)


def _query_flag(query: dict[str, list[str]], name: str) -> bool:
    values = query.get(name, ["false"])
    value = values[-1].lower()
    if value not in {"true", "false", "1", "0"}:
        raise weights.WeightsError(f"{name}: must be true or false, got {values[-1]!r}")
    return value in {"true", "1"}


def _param(message: str) -> str | None:
    """The field a weights error names (``tensor x: ...`` -> ``x``), for the error body."""
    head = message.split(":", 1)[0]
    if head.startswith("tensor "):
        return head[len("tensor ") :]
    return head if " " not in head else None


# --- running it -----------------------------------------------------------------


def start_in_thread(
    config: ServeConfig, *, host: str = "127.0.0.1", port: int = 0
) -> tuple[str, Engine, Callable[[], None]]:
    """Serve in background threads; return the base URL, the engine and a stop function."""
    engine = Engine(config)
    engine.start()
    server = ServeServer((host, port), engine)
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": 0.05},
        name="openforge-serve",
        daemon=True,
    )
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        engine.close()
        thread.join()

    return f"http://{host}:{server.server_address[1]}", engine, stop


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="openforge serve",
        description="Serve a Hugging Face causal LM over vLLM's token-in/token-out "
        "/v1/completions, with continuous batching and live weight updates.",
    )
    parser.add_argument(
        "--model",
        required=True,
        type=Path,
        help="save_pretrained directory with tokenizer.json and tokenizer_config.json",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one")
    parser.add_argument("--model-name", help="name to serve the model under (default: --model)")
    parser.add_argument("--policy-version", type=int, default=0, help="initial policy version")
    parser.add_argument("--max-batch", type=int, default=32, help="most requests decoded together")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument(
        "--max-model-len",
        type=int,
        help="context length (default: the model's max_position_embeddings)",
    )
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=sorted(weights.DTYPES),
        help="weight dtype (default float32); logprobs are float32 regardless",
    )
    args = parser.parse_args(argv)
    if args.max_batch < 1:
        parser.error(f"--max-batch: must be at least 1, got {args.max_batch}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    _quiet_transformers()
    config = ServeConfig(
        model_dir=args.model,
        model_name=args.model_name,
        policy_version=args.policy_version,
        max_batch=args.max_batch,
        max_model_len=args.max_model_len,
        device=args.device,
        dtype=args.dtype,
    )
    try:
        engine = Engine(config)
    except (OSError, ValueError) as error:
        print(f"openforge serve: {error}", file=sys.stderr)
        return 1
    engine.start()
    server = ServeServer((args.host, args.port), engine)
    signal.signal(signal.SIGTERM, _interrupt)
    url = f"http://{args.host}:{server.server_address[1]}"
    print(
        f"openforge serve: serving {engine.name} on {url} "
        f"(torch threads: {torch.get_num_threads()})",
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        engine.close()
    _exit_closed(0)


def _exit_closed(code: int) -> NoReturn:
    """Exit, everything the server owns closed, without the interpreter's finalization.

    A thread that ran torch (the scheduler; a handler that loaded weights) can still be
    tearing down its native thread-locals after ``join`` returned. One that then needs the
    GIL while the interpreter finalizes is ended by ``pthread_exit`` inside a C++
    destructor, and the process aborts: "terminate called without an active exception",
    exit -6 on SIGTERM, seen in CI under load (pytorch/pytorch#38228, #117762).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
