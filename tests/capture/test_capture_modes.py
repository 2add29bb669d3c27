"""The other capture and network modes, through a real sidecar process.

* passthrough: requests go unchanged to an upstream (a commercial API in real
  use; here a small stand-in that answers like vLLM's Chat Completions, with
  token IDs, gzip-compressed), the harness gets the upstream's bytes
  untouched, and the sidecar records the call with the upstream's tokens;
* regular proxy mode: the harness reaches `https://api.openai.com` through
  HTTPS_PROXY trusting the sidecar's CA, and is answered by the policy.
"""

from __future__ import annotations

import gzip
import json
import ssl
import threading
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openforge_trainer.collection import store

COMPLETION = {
    "id": "chatcmpl-up",
    "object": "chat.completion",
    "created": 1,
    "model": "upstream-model",
    "prompt_token_ids": [11, 12, 13],
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello from upstream"},
            "finish_reason": "stop",
            "token_ids": [21, 22, 23],
            "logprobs": {
                "content": [
                    {"token": t, "logprob": -0.25, "bytes": None, "top_logprobs": []}
                    for t in ("Hello", " from", " upstream")
                ]
            },
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
}


def stream_events() -> list[bytes]:
    chunks = []
    for index, (text, token) in enumerate((("Hello", 21), (" from", 22), (" upstream", 23))):
        delta: dict[str, Any] = {"content": text}
        if index == 0:
            delta["role"] = "assistant"
        choice = {"index": 0, "delta": delta, "finish_reason": None, "token_ids": [token]}
        chunk = {
            "id": "chatcmpl-up",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "upstream-model",
            "choices": [choice],
        }
        if index == 0:
            chunk["prompt_token_ids"] = [11, 12, 13]
        chunks.append(chunk)
    chunks.append(
        {
            "id": "chatcmpl-up",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "upstream-model",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        }
    )
    return [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]


class Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[dict[str, Any]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        Upstream.seen.append(
            {"path": self.path, "body": body, "auth": self.headers.get("authorization")}
        )
        self.send_response(200)
        self.send_header("content-encoding", "gzip")
        if body.get("stream"):
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            compressor = zlib.compressobj(wbits=31)
            for event in stream_events():
                data = compressor.compress(event) + compressor.flush(zlib.Z_SYNC_FLUSH)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            tail = compressor.flush()
            self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(tail), tail))
        else:
            data = gzip.compress(json.dumps(COMPLETION).encode())
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


def finish(sidecar: Any) -> None:
    response = httpx.post(
        f"{sidecar.url}/openforge/v1/rollout/finish",
        json={"exit_code": 0, "wait_seconds": 20},
        timeout=30,
    )
    assert response.json()["acknowledged"]


def test_passthrough_forwards_unchanged_and_records_upstream_tokens(
    procs: Any, tmp_path: Path, upstream: str
) -> None:
    collector = procs.collector()
    sidecar = procs.sidecar(
        "--capture",
        "passthrough",
        "--upstream",
        upstream,
        "--collector",
        f"127.0.0.1:{collector.port}",
        "--job",
        "pt",
        "--rollout-id",
        "r-pt",
    )
    client = openai.OpenAI(base_url=f"{sidecar.url}/v1", api_key="sk-upstream-key", max_retries=0)
    plain = client.chat.completions.create(
        model="upstream-model", messages=[{"role": "user", "content": "hi"}]
    )
    assert plain.choices[0].message.content == "Hello from upstream"
    streamed = client.chat.completions.create(
        model="upstream-model", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    assert (
        "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        == "Hello from upstream"
    )
    # the upstream saw the harness's own request, credentials included
    assert [s["auth"] for s in Upstream.seen] == ["Bearer sk-upstream-key"] * 2
    assert Upstream.seen[0]["body"]["messages"] == [{"role": "user", "content": "hi"}]
    finish(sidecar)
    with store.Store(tmp_path / "store.db") as db:
        calls = db.calls("r-pt")
        raw = b"".join(r.SerializeToString() for r in db.records("r-pt"))
    assert b"sk-upstream-key" not in raw
    assert len(calls) == 2
    for call in calls:
        assert not call.error
        assert list(call.prompt_token_ids) == [11, 12, 13]
        assert list(call.completion_token_ids) == [21, 22, 23]
        assert (
            json.loads(call.response_json)["choices"][0]["message"]["content"]
            == "Hello from upstream"
        )
    assert list(calls[0].completion_logprobs) == [-0.25] * 3


def test_regular_proxy_mode_answers_https_calls_from_the_policy(procs: Any, tmp_path: Path) -> None:
    engine = procs.engine()
    confdir = tmp_path / "ca"
    sidecar = procs.sidecar(
        "--mode", "regular", "--confdir", str(confdir), "--rollout-id", "r-proxy", engine=engine
    )
    ca = confdir / "mitmproxy-ca-cert.pem"
    assert ca.exists()
    http_client = httpx.Client(proxy=sidecar.url, verify=ssl.create_default_context(cafile=str(ca)))
    client = openai.OpenAI(
        base_url="https://api.openai.com/v1",
        api_key="sk-real-looking",
        http_client=http_client,
        max_retries=0,
    )
    reply = client.chat.completions.create(
        model="gpt-x", messages=[{"role": "user", "content": "hello"}]
    )
    assert reply.choices[0].message.content == "Done."
    stats = httpx.get(f"{sidecar.url}/openforge/v1/stats", timeout=10)
    assert stats.status_code == 200 and stats.json()["calls"] == 1
    # without trusting the CA the harness refuses the connection
    untrusting = openai.OpenAI(
        base_url="https://api.openai.com/v1",
        api_key="k",
        http_client=httpx.Client(proxy=sidecar.url),
        max_retries=0,
    )
    with pytest.raises(openai.APIConnectionError):
        untrusting.chat.completions.create(
            model="gpt-x", messages=[{"role": "user", "content": "hello"}]
        )
