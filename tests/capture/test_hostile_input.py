"""Hostile input through the real sidecar: it stays up, answers in the API's shape, records every
call.

Hypothesis mutates a valid request of each wire API (a value anywhere replaced
by one of another type or an absurd number; a lone surrogate put into any of
its strings; keys added; the JSON cut short; bytes that are no JSON) and sends each to a real
sidecar whose engine is scripted (scripted_engine) to answer well. For every request:

* the answer is 200, or a 4xx whose body is the API's own error object;
* nothing but the sidecar's rewritten ``/v1/completions`` reaches the engine
  (no request goes upstream unrewritten);
* after all of them, the store holds exactly one call per request sent (each
  refused one recorded as refused) and nothing reported lost.

A bounded socket fuzzer then sends non-HTTP bytes and broken HTTP on 60
connections (each read for at most 0.5 s), and the sidecar must still answer
a valid call. Examples are derandomized: each run sends the same requests.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import scripted_engine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openforge_trainer.collection import store
from scripted_engine import ScriptedEngine, finish

#: Each API: its path, a valid request, and whether an error body has its shape.
APIS: dict[str, tuple[str, dict[str, Any], Callable[[Any], bool]]] = {
    "openai_chat": (
        "/v1/chat/completions",
        {"model": "p", "max_tokens": 5, "temperature": 0.5, "stream": False,
         "messages": [{"role": "system", "content": "s"},
                      {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
         "tools": [{"type": "function",
                    "function": {"name": "f", "parameters": {"type": "object"}}}]},
        lambda b: isinstance(b.get("error"), dict) and isinstance(b["error"].get("message"), str),
    ),
    "openai_responses": (
        "/v1/responses",
        {"model": "p", "max_output_tokens": 5, "top_p": 0.9, "instructions": "s",
         "input": [{"type": "message", "role": "user",
                    "content": [{"type": "input_text", "text": "hi"}]}],
         "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]},
        lambda b: isinstance(b.get("error"), dict) and isinstance(b["error"].get("message"), str),
    ),
    "anthropic_messages": (
        "/v1/messages",
        {"model": "p", "max_tokens": 5, "system": "s", "temperature": 0.5,
         "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
         "tools": [{"name": "f", "input_schema": {"type": "object"}}]},
        lambda b: b.get("type") == "error" and isinstance(b.get("error", {}).get("message"), str),
    ),
    "gemini": (
        "/v1beta/models/p:generateContent",
        {"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
         "generationConfig": {"maxOutputTokens": 5, "temperature": 0.5},
         "tools": [{"functionDeclarations": [{"name": "f", "parameters": {"type": "object"}}]}]},
        lambda b: isinstance(b.get("error"), dict) and isinstance(b["error"].get("code"), int),
    ),
}  # fmt: skip

hostile_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([0, -1, 1e11, -1e-300, "", "\ud800", "a\udfffb", "\x00", "x" * 5000])
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every JSON path in ``value`` (its keys and indexes), the root included."""
    out = [at]
    if isinstance(value, dict):
        for key, child in value.items():
            out += _paths(child, (*at, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            out += _paths(child, (*at, index))
    return out


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        value = value[key]
    return value


def _replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, *rest = path
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = _replaced(value[head], tuple(rest), new)
    return copy


@st.composite
def hostile_bodies(draw: st.DrawFn, base: dict[str, Any]) -> bytes:
    kind = draw(st.sampled_from(["replace", "surrogate", "add", "truncate", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    body: Any = base
    if kind == "replace":
        path = draw(st.sampled_from(_paths(base)[1:]))
        body = _replaced(base, path, draw(hostile_values))
    elif kind == "surrogate":  # any string of the request, text or name, made invalid
        strings = [p for p in _paths(base) if isinstance(_at(base, p), str)]
        path = draw(st.sampled_from(strings))
        cut = draw(st.integers(0, len(_at(base, path))))
        lone = draw(st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"]))
        body = _replaced(base, path, _at(base, path)[:cut] + lone + _at(base, path)[cut:])
        if draw(st.booleans()):  # as the three bytes UTF-8 would give it, were it text
            return json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
    elif kind == "add":
        body = {**base, draw(st.text(max_size=8)): draw(hostile_values)}
    encoded = json.dumps(body).encode()  # lone surrogates as escapes, as a client sends them
    if kind == "truncate":
        return encoded[: draw(st.integers(0, len(encoded) - 1))]
    return encoded


def start(procs: Any, engine: ScriptedEngine, rollout: str, tokenizer: Path) -> Any:
    return scripted_engine.sidecar_for(
        procs, engine, job="hostile", rollout=rollout, tokenizer=tokenizer
    )


@pytest.mark.timeout(600)
@pytest.mark.parametrize("api", sorted(APIS))
def test_mutated_requests_get_the_apis_answer_and_are_each_recorded_once(
    procs: Any, engine: ScriptedEngine, tmp_path: Path, tiny_tokenizer_dir: Path, api: str
) -> None:
    path, base, error_shaped = APIS[api]
    engine.default = "good"
    sidecar = start(procs, engine, f"r-{api}", tiny_tokenizer_dir)
    statuses: list[int] = []
    with httpx.Client(base_url=sidecar.url, timeout=30) as client:
        valid = client.post(path, content=json.dumps(base).encode())
        assert valid.status_code == 200, valid.text
        statuses.append(200)

        @settings(max_examples=80, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow,
                                         HealthCheck.data_too_large])  # fmt: skip
        @given(body=hostile_bodies(base))
        def one(body: bytes) -> None:
            response = client.post(path, content=body, headers={"content-type": "application/json"})
            statuses.append(response.status_code)
            assert response.status_code in (200, 400, 413), (body[:300], response.text[:300])
            if response.status_code != 200:
                assert error_shaped(response.json()), response.text[:300]

        one()
    assert set(engine.posts) == {"/v1/completions"}  # nothing went upstream unrewritten
    assert engine.posts.count("/v1/completions") == statuses.count(200)
    finish(sidecar)
    with store.Store(tmp_path / "store.db") as db:
        calls = db.calls(f"r-{api}")
        lost = db.lost("hostile")
    assert [c.call_index for c in calls] == list(range(len(statuses)))  # each once, in order
    assert [c.http_status for c in calls] == statuses
    assert not lost


def test_a_call_in_another_api_than_the_declared_one_is_refused_and_recorded(
    procs: Any, engine: ScriptedEngine, tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    """``--api`` (the HarnessEnv's ``spec.api``): a call in another API is answered with that
    API's own error naming both, recorded as refused; the declared API's calls go on."""
    engine.default = "good"
    sidecar = scripted_engine.sidecar_for(
        procs,
        engine,
        job="declared",
        rollout="r-declared",
        tokenizer=tiny_tokenizer_dir,
        extra=("--api", "openai-chat"),
    )
    path, body, error_shaped = APIS["anthropic_messages"]
    with httpx.Client(base_url=sidecar.url, timeout=30) as client:
        refused = client.post(path, json=body)
        chat_path, chat_body, _ = APIS["openai_chat"]
        answered = client.post(chat_path, json=chat_body)
    assert refused.status_code == 400 and error_shaped(refused.json()), refused.text
    message = refused.json()["error"]["message"]
    assert "anthropic-messages API (POST /v1/messages)" in message, message
    assert "spec.api: openai-chat" in message, message
    assert answered.status_code == 200, answered.text
    assert engine.posts == ["/v1/completions"]  # the refused call never reached the engine
    finish(sidecar)
    with store.Store(tmp_path / "store.db") as db:
        calls = db.calls("r-declared")
    assert [(c.call_index, c.http_status) for c in calls] == [(0, 400), (1, 200)]
    assert "spec.api: openai-chat" in calls[0].error


JUNK_PREFIXES = [
    b"",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS client hello to a plain port
    b"GET / HTTP/9.9\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 999999\r\n\r\n{",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"POST /v1/messages HTTP/1.1\r\nHost: x\r\n" + b"X-A: " + b"a" * 70_000 + b"\r\n\r\n",
]


def test_non_http_bytes_and_broken_http_leave_the_sidecar_serving(
    procs: Any, engine: ScriptedEngine, tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    engine.default = "good"
    sidecar = start(procs, engine, "r-junk", tiny_tokenizer_dir)
    rng = random.Random(1)
    host, port = "127.0.0.1", int(sidecar.url.rsplit(":", 1)[1])
    for attempt in range(60):
        junk = JUNK_PREFIXES[attempt % len(JUNK_PREFIXES)] + rng.randbytes(rng.randrange(0, 400))
        with socket.create_connection((host, port), timeout=5) as conn:
            conn.sendall(junk)
            conn.shutdown(socket.SHUT_WR)
            conn.settimeout(0.5)
            with contextlib.suppress(TimeoutError, ConnectionError):
                conn.recv(4096)
    answer = httpx.post(
        sidecar.url + "/v1/chat/completions",
        json={"model": "p", "messages": [{"role": "user", "content": "still there?"}]},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    assert engine.posts == ["/v1/completions"]
    finish(sidecar)
    with store.Store(tmp_path / "store.db") as db:
        *junk_calls, last = db.calls("r-junk")
    assert last.http_status == 200
    # The only whole HTTP request among the junk is the header-bloated POST with an empty
    # body: when mitmproxy reads it before the bytes after it break the connection (a
    # race), it is a call, refused with a 400 that is recorded. Nothing else is a call.
    assert len(junk_calls) <= sum(1 for i in range(60) if i % len(JUNK_PREFIXES) == 6)
    for call in junk_calls:
        assert (call.wire_api, call.http_status) == ("WIRE_API_ANTHROPIC_MESSAGES", 400)
        assert call.error.startswith("rejected: body is not valid JSON"), call.error


def _status_line(conn: socket.socket) -> bytes:
    """One whole HTTP/1.1 response read from ``conn`` (its head, then its content-length
    body); its status line."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        assert chunk, f"closed mid-response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = conn.recv(65536)
        assert chunk, "closed mid-body"
        body += chunk
    return head.split(b"\r\n", 1)[0]


def _closed_within(conn: socket.socket, seconds: float) -> bool:
    """Whether the sidecar closes ``conn`` (EOF or reset) within ``seconds``."""
    conn.settimeout(seconds)
    try:
        return conn.recv(4096) == b""
    except ConnectionError:
        return True
    except TimeoutError:
        return False


def test_connections_beyond_the_limit_and_silent_ones_are_closed(
    procs: Any, engine: ScriptedEngine, tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    """``--max-connections``: one more connection is closed as it connects, and one is
    accepted again once others close. ``--header-timeout``: a connection that sends no
    whole request head in time is closed (one byte a second does not keep it), while a
    kept-alive connection idle between its requests is not."""
    engine.default = "good"
    sidecar = scripted_engine.sidecar_for(
        procs,
        engine,
        job="limits",
        rollout="r-limits",
        tokenizer=tiny_tokenizer_dir,
        extra=("--max-connections", "3", "--header-timeout", "2"),
    )
    address = ("127.0.0.1", int(sidecar.url.rsplit(":", 1)[1]))
    request = json.dumps({"model": "p", "messages": [{"role": "user", "content": "hi"}]})
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(request)}\r\n\r\n"
    ).encode()
    with contextlib.ExitStack() as stack:
        # a kept-alive connection: a call, idle past the header timeout, another call
        kept = stack.enter_context(socket.create_connection(address, timeout=30))
        kept.sendall(head + request.encode())
        assert _status_line(kept) == b"HTTP/1.1 200 OK"
        drip = stack.enter_context(socket.create_connection(address, timeout=5))
        silent = stack.enter_context(socket.create_connection(address, timeout=5))
        extra = stack.enter_context(socket.create_connection(address, timeout=5))
        assert _closed_within(extra, 2), "a fourth connection was kept"
        for byte in head[:3]:  # one byte a second, never a whole head
            drip.sendall(bytes([byte]))
            time.sleep(1)
        assert _closed_within(drip, 3) and _closed_within(silent, 3)
        kept.sendall(head + request.encode())
        assert _status_line(kept) == b"HTTP/1.1 200 OK", "the kept-alive one was answered"
        # with two of three closed, a new connection is accepted and answered
        again = httpx.post(sidecar.url + "/v1/chat/completions", content=request, timeout=30)
        assert again.status_code == 200, again.text
    stats = httpx.get(sidecar.url + "/openforge/v1/stats", timeout=10).json()["counters"]
    assert stats["connections_refused"] >= 1 and stats["header_timeouts"] == 2, stats
    finish(sidecar)
