"""The Gemini API end to end through a real sidecar process (mitmdump + capture addon).

Google's own SDK (google-genai) talks to the sidecar, which answers from the
deterministic test engine (tokens mode) or forwards to a stand-in Gemini
upstream (passthrough); the collector stores what the sidecar captured.
Every captured token is checked against what the engine consumes and
produces for that prompt, asked again directly.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types
from openforge.wire import conversation as conv
from openforge_sidecar.policy import template
from openforge_trainer.collection import store

PROMPT = "Please run `echo hi > hello.txt` and then say done."
SHELL = types.FunctionDeclaration(
    name="run_shell_command",
    description="Runs a shell command.",
    parameters_json_schema={
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
)
CONFIG = types.GenerateContentConfig(
    system_instruction="You are an agent.",
    tools=[types.Tool(function_declarations=[SHELL])],
    automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
)


def client(base_url: str, key: str = "gm-secret-key") -> genai.Client:
    options = types.HttpOptions(
        base_url=base_url, retry_options=types.HttpRetryOptions(attempts=1), timeout=60_000
    )
    return genai.Client(api_key=key, http_options=options)


@pytest.fixture
def stack(procs: Any, tmp_path: Path) -> dict[str, Any]:
    engine = procs.engine()
    collector = procs.collector()
    sidecar = procs.sidecar(
        "--collector", f"127.0.0.1:{collector.port}", "--job", "e2e", "--rollout-id", "g1",
        engine=engine,
    )  # fmt: skip
    return {"engine": engine, "sidecar": sidecar, "store": tmp_path / "store.db"}


def finish(sidecar: Any) -> dict[str, Any]:
    response = httpx.post(
        f"{sidecar.url}/openforge/v1/rollout/finish",
        json={"exit_code": 0, "reward": 1.0, "wait_seconds": 20},
        timeout=30,
    )
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    assert body["acknowledged"], body
    return body


def stored_calls(path: Path, rollout: str) -> list[store.ModelCall]:
    with store.Store(path) as db:
        assert db.rollout(rollout) is not None
        return db.calls(rollout)


def check_token_exact(engine: Any, call: store.ModelCall) -> None:
    assert call.token_exact, call.error
    model = httpx.get(f"{engine.url}/v1/models").json()["data"][0]["id"]
    direct = httpx.post(
        f"{engine.url}/v1/completions",
        json={"model": model, "prompt": list(call.prompt_token_ids), "max_tokens": 1024,
              "logprobs": 1, "return_token_ids": True, "skip_special_tokens": False},
        timeout=30,
    ).json()["choices"][0]  # fmt: skip
    assert direct["prompt_token_ids"] == list(call.prompt_token_ids)
    assert direct["token_ids"] == list(call.completion_token_ids)
    assert direct["logprobs"]["token_logprobs"] == pytest.approx(
        list(call.completion_logprobs), abs=1e-6
    )


def test_streamed_tool_round_trip_is_token_exact(stack: dict[str, Any]) -> None:
    gemini = client(stack["sidecar"].url)
    contents: list[Any] = [types.Content(role="user", parts=[types.Part(text=PROMPT)])]
    chunks = list(
        gemini.models.generate_content_stream(model="policy", contents=contents, config=CONFIG)
    )
    calls = [call for chunk in chunks for call in chunk.function_calls or []]
    assert [(c.name, c.args) for c in calls] == [
        ("run_shell_command", {"command": "echo hi > hello.txt"})
    ]
    last = chunks[-1]
    assert last.candidates and last.candidates[0].finish_reason == types.FinishReason.STOP
    assert last.usage_metadata and last.usage_metadata.prompt_token_count

    model_turn = types.Content(role="model", parts=[types.Part(function_call=calls[0])])
    result = types.Part.from_function_response(name="run_shell_command", response={"output": "hi"})
    contents += [model_turn, types.Content(role="user", parts=[result])]
    streamed = list(
        gemini.models.generate_content_stream(model="policy", contents=contents, config=CONFIG)
    )
    assert "".join(c.text or "" for c in streamed) == "Done: hi"
    assert len([c for c in streamed if c.text]) > 1  # relayed as generated, not in one piece
    reply = gemini.models.generate_content(model="policy", contents=contents, config=CONFIG)
    assert reply.text == "Done: hi" and reply.response_id and reply.model_version == "policy"

    stats = finish(stack["sidecar"])
    assert stats["counters"]["calls"] == 3
    assert stats["merge_rate"] == 0.5  # the follow-up extends the first call; the retry cannot
    captured = stored_calls(stack["store"], "g1")
    assert [c.wire_api for c in captured] == ["WIRE_API_GEMINI"] * 3
    assert [(c.stream, c.model) for c in captured] == [(True, "policy")] * 2 + [(False, "policy")]
    for call in captured:
        check_token_exact(stack["engine"], call)
    first, second, third = captured
    prefix = list(first.prompt_token_ids) + list(first.completion_token_ids)
    assert second.segment_reason == "" and second.prefix_token_count == len(prefix)
    assert list(second.prompt_token_ids[: len(prefix)]) == prefix
    assert third.segment_reason == "retry"  # the same conversation asked again
    assert json.loads(second.response_json)["candidates"][0]["content"]["parts"] == [
        {"text": "Done: hi"}
    ]
    with store.Store(stack["store"]) as db:
        records = list(db.records("g1"))
    headers = [dict(r.call.request_headers) for r in records if r.HasField("call")]
    assert [h["x-goog-api-key"] for h in headers] == ["[redacted]"] * 3
    assert b"gm-secret-key" not in b"".join(r.SerializeToString() for r in records)


def test_count_tokens_is_answered_from_the_policy_tokenizer(
    stack: dict[str, Any], tiny_tokenizer_dir: Path
) -> None:
    gemini = client(stack["sidecar"].url)
    counted = gemini.models.count_tokens(model="policy", contents="How many tokens is this?")
    tokenizer = template.PolicyTokenizer.load(str(tiny_tokenizer_dir))
    message = conv.Message("user", (conv.TextPart("How many tokens is this?"),))
    text = tokenizer.render([message], [], add_generation_prompt=False)
    assert counted.total_tokens == len(tokenizer.encode(text)) > 5
    # What Gemini CLI counts before sending an image it read: the result and the image.
    png = (
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/"
        "pLvAAAAAElFTkSuQmCC"
    )
    parts = [
        {"functionResponse": {"id": "c1", "name": "read_file", "response": {"output": "1 item"}}},
        {"inlineData": {"data": png, "mimeType": "image/png"}},
    ]
    raw = httpx.post(
        f"{stack['sidecar'].url}/v1beta/models/policy:countTokens",
        json={"contents": [{"role": "user", "parts": parts}]},
    )
    result = conv.ToolResultPart("c1", (conv.TextPart("1 item"),), name="read_file")
    messages = [
        conv.Message("tool", (result,)),
        conv.Message("user", (conv.ImagePart(f"data:image/png;base64,{png}"),)),
    ]
    text = tokenizer.render(messages, [], add_generation_prompt=False)
    assert raw.json() == {"totalTokens": len(tokenizer.encode(text))}
    stats = finish(stack["sidecar"])
    assert stats["calls"] == 0 and stats["counters"]["token_counts_answered"] == 2


def test_bad_requests_get_google_errors_naming_the_field(stack: dict[str, Any]) -> None:
    base = stack["sidecar"].url
    bad = httpx.post(
        f"{base}/v1beta/models/policy:generateContent",
        json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
              "generationConfig": {"temperature": "hot"}},
    )  # fmt: skip
    assert bad.status_code == 400
    error = bad.json()["error"]
    assert (error["code"], error["status"]) == (400, "INVALID_ARGUMENT")
    assert error["message"].startswith("generationConfig.temperature:")
    unstreamable = httpx.post(
        f"{base}/v1beta/models/policy:streamGenerateContent",
        json={"contents": [{"parts": [{"text": "hi"}]}]},
    )
    assert unstreamable.status_code == 400 and "alt=sse" in unstreamable.json()["error"]["message"]
    gemini = client(base)  # kept: a Client closes its connection pool when collected
    with pytest.raises(genai_errors.ClientError) as caught:
        gemini.models.generate_content(model="policy", contents=[{"role": "tool"}])
    assert caught.value.code == 400 and "contents[0]" in str(caught.value.message)
    ok = gemini.models.generate_content(model="policy", contents="hi")
    assert ok.text == "Done."
    stats = finish(stack["sidecar"])
    assert stats["counters"]["rejected_400"] == 3
    captured = stored_calls(stack["store"], "g1")
    assert [c.http_status for c in captured] == [400, 400, 400, 200]
    assert captured[0].error.startswith("rejected:")


# --- passthrough: a stand-in for Google's API upstream ---------------------------------

UPSTREAM_CHUNKS = [
    {"candidates": [{"content": {"role": "model", "parts": [{"text": "Hello"}]}, "index": 0}],
     "modelVersion": "gemini-up", "responseId": "up-1"},
    {"candidates": [{"content": {"role": "model", "parts": [
        {"text": " there."},
        {"functionCall": {"name": "run_shell_command", "args": {"command": "ls"}}}]},
        "finishReason": "STOP", "index": 0}],
     "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 7, "totalTokenCount": 16},
     "modelVersion": "gemini-up", "responseId": "up-1"},
]  # fmt: skip


class Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[dict[str, Any]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        Upstream.seen.append(
            {"path": self.path, "body": body, "key": self.headers["x-goog-api-key"]}
        )
        self.send_response(200)
        if "alt=sse" in self.path:
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for chunk in UPSTREAM_CHUNKS:
                data = f"data: {json.dumps(chunk)}\r\n\r\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.write(b"0\r\n\r\n")
        else:
            data = json.dumps(UPSTREAM_CHUNKS[-1]).encode()
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)


@pytest.fixture
def upstream() -> Iterator[str]:
    Upstream.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_passthrough_forwards_unchanged_and_records_no_token_ids(
    procs: Any, tmp_path: Path, upstream: str
) -> None:
    collector = procs.collector()
    sidecar = procs.sidecar(
        "--capture", "passthrough", "--upstream", upstream,
        "--collector", f"127.0.0.1:{collector.port}", "--job", "pt", "--rollout-id", "g-pt",
    )  # fmt: skip
    gemini = client(sidecar.url, key="gm-upstream-key")
    chunks = list(gemini.models.generate_content_stream(model="gemini-up", contents="hi"))
    assert "".join(c.text or "" for c in chunks) == "Hello there."
    plain = gemini.models.generate_content(model="gemini-up", contents="hi")
    assert plain.function_calls and plain.function_calls[0].args == {"command": "ls"}
    assert [s["key"] for s in Upstream.seen] == ["gm-upstream-key"] * 2
    assert Upstream.seen[0]["path"] == "/v1beta/models/gemini-up:streamGenerateContent?alt=sse"
    finish(sidecar)
    calls = stored_calls(tmp_path / "store.db", "g-pt")
    assert [c.stream for c in calls] == [True, False]
    for call in calls:
        # Google's API reports no token IDs: recorded as such, never guessed.
        assert not call.error and not call.token_exact
        assert list(call.prompt_token_ids) == list(call.completion_token_ids) == []
        assert (
            call.finish_reason == "tool_calls" and call.capture_mode == "CAPTURE_MODE_PASSTHROUGH"
        )
        parts = json.loads(call.response_json)["candidates"][0]["content"]["parts"]
        assert parts[-1]["functionCall"]["name"] == "run_shell_command"
    streamed_parts = json.loads(calls[0].response_json)["candidates"][0]["content"]["parts"]
    assert streamed_parts[0] == {"text": "Hello there."}
