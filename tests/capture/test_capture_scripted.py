"""The real sidecar against a scripted engine: broken answers, invalid requests, signed thinking.

A scripted engine (a stdlib HTTP server in this process, on 127.0.0.1) answers
the real sidecar's token-in/token-out requests with what each test scripts:
broken streams (a chunk that is not JSON, a stream cut before its
finish_reason, token ids without logprobs, an engine error event), an engine
429 with ``retry-after``, or the tiny tokenizer's ids for a reply with
thinking. A harness that asked for one JSON body must get the API's error
object with a 5xx (it used to get 200 and an empty body), and a stream must
end with the API's error event; the call is stored with its error, never as
a finished answer. Invalid requests are refused before anything reaches the
engine. The policy's thinking is signed and round-trips through the official
Anthropic SDK as thinking.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import scripted_engine
from openforge_trainer.collection import store
from scripted_engine import ScriptedEngine, finish


def chat(sidecar: Any, *, stream: bool = False) -> httpx.Response:
    return httpx.post(
        sidecar.url + "/v1/chat/completions",
        json={"model": "p", "stream": stream, "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )


def messages(sidecar: Any) -> httpx.Response:
    return httpx.post(
        sidecar.url + "/v1/messages",
        json={"model": "p", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )


def start(procs: Any, engine: ScriptedEngine, rollout: str, tokenizer: Path) -> Any:
    return scripted_engine.sidecar_for(
        procs, engine, job="engine-faults", rollout=rollout, tokenizer=tokenizer
    )


@pytest.mark.parametrize("fault", ["not-json", "truncated", "no-logprobs", "engine-error-event"])
def test_a_non_streamed_answer_that_fails_midway_is_the_apis_error(
    procs: Any, engine: ScriptedEngine, tmp_path: Path, tiny_tokenizer_dir: Path, fault: str
) -> None:
    sidecar = start(procs, engine, f"r-{fault}", tiny_tokenizer_dir)
    engine.script += ["good", fault, "good"]
    first = chat(sidecar)
    assert first.status_code == 200 and first.json()["choices"][0]["message"]["content"]
    failed = chat(sidecar)
    assert failed.status_code == 502, failed.text
    error = failed.json()["error"]
    assert error["type"] == "server_error" and "the engine's answer failed" in error["message"]
    assert chat(sidecar).status_code == 200  # the sidecar carries on
    finish(sidecar)
    with store.Store(tmp_path / "store.db") as db:
        calls = db.calls(f"r-{fault}")
    assert [bool(c.error) for c in calls] == [False, True, False]
    assert calls[1].finish_reason == "error" and calls[1].http_status == 502


@pytest.mark.parametrize("stream", [False, True])
def test_an_engine_that_echoes_another_prompt_is_caught_as_the_echo_comes(
    procs: Any, engine: ScriptedEngine, tmp_path: Path, tiny_tokenizer_dir: Path, stream: bool
) -> None:
    """The echo is compared with the planned prompt while it is read (none of it kept):
    the same prompt passes, one ID changed mid-way is a prompt_mismatch on that call
    only, in a small prompt and in one of 100,000 IDs (read in many pieces)."""
    sidecar = start(procs, engine, f"r-echo-{stream}", tiny_tokenizer_dir)
    long = "word " * 100_000
    engine.script += ["echo", "echo-other", "echo", "echo-other"]
    for text in ("hi", "hi", long, long):
        answer = httpx.post(
            sidecar.url + "/v1/chat/completions",
            json={"model": "p", "stream": stream, "messages": [{"role": "user", "content": text}]},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text[:300]
    stats = httpx.get(sidecar.url + "/openforge/v1/stats", timeout=10).json()
    assert stats["counters"]["prompt_mismatch"] == 2, stats
    finish(sidecar)
    with store.Store(tmp_path / "store.db") as db:
        calls = db.calls(f"r-echo-{stream}")
    assert ["echoed different" in c.error for c in calls] == [False, True, False, True]
    assert len(calls[2].prompt_token_ids) > 100_000


def test_anthropics_shape_too(procs: Any, engine: ScriptedEngine, tiny_tokenizer_dir: Path) -> None:
    sidecar = start(procs, engine, "r-anthropic", tiny_tokenizer_dir)
    engine.script += ["truncated"]
    failed = messages(sidecar)
    assert failed.status_code == 502
    assert failed.json()["type"] == "error" and failed.json()["error"]["type"] == "api_error"


def test_an_engine_429_reaches_the_harness_with_its_retry_after(
    procs: Any, engine: ScriptedEngine, tiny_tokenizer_dir: Path
) -> None:
    sidecar = start(procs, engine, "r-busy", tiny_tokenizer_dir)
    engine.script += ["busy", "busy", "down"]
    for ask in (chat, messages):
        busy = ask(sidecar)
        assert busy.status_code == 429 and busy.headers["retry-after"] == "7", busy.text
    assert busy.json()["error"]["type"] == "rate_limit_error"
    down = chat(sidecar)
    assert down.status_code == 502 and "retry-after" not in down.headers


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/chat/completions",
         '{"model": "p", "messages": [{"role": "user", "content": "a\\ud800"}]}',
         "messages[0].content"),
        ("/v1/chat/completions",
         '{"model": "\\udc00", "messages": [{"role": "user", "content": "a"}]}', "model"),
        ("/v1/messages",
         '{"model": "p", "max_tokens": 5, "messages": [{"role": "user", "content": "a"}],'
         ' "tools": [{"name": "\\ud800", "input_schema": {}}]}', "tools[0].name"),
        ("/v1/responses",
         '{"model": "p", "input": "a", "max_output_tokens": 0}', "max_output_tokens"),
    ],
)  # fmt: skip
def test_invalid_text_and_values_are_refused_and_never_reach_the_engine(
    procs: Any,
    engine: ScriptedEngine,
    tmp_path: Path,
    tiny_tokenizer_dir: Path,
    path: str,
    body: str,
    field: str,
) -> None:
    """A lone surrogate used to raise inside the addon, which then sent the request
    upstream unrewritten (the engine answered 404), or in ``model`` never answered."""
    sidecar = start(procs, engine, "r-hostile", tiny_tokenizer_dir)
    refused = httpx.post(sidecar.url + path, content=body.encode(), timeout=30,
                         headers={"content-type": "application/json"})  # fmt: skip
    assert refused.status_code == 400, refused.text
    assert field in json.dumps(refused.json())
    engine.script += ["good"]
    assert chat(sidecar).status_code == 200
    assert engine.posts == ["/v1/completions"]  # only the good call's
    finish(sidecar)
    with store.Store(tmp_path / "store.db") as db:
        calls = db.calls("r-hostile")
    assert [c.http_status for c in calls] == [400, 200]
    assert calls[0].error.startswith("rejected:")


@pytest.mark.parametrize(("harness", "failure"), scripted_engine.STREAMING_SDKS)
def test_a_stream_that_fails_midway_ends_with_the_apis_error_event(
    procs: Any,
    engine: ScriptedEngine,
    tmp_path: Path,
    tiny_tokenizer_dir: Path,
    harness: Any,
    failure: type,
) -> None:
    """The official SDKs raise on it; a stream left unterminated (as before) reads,
    to some of them, as an answer that simply ended."""
    sidecar = start(procs, engine, "r-stream", tiny_tokenizer_dir)
    engine.script += ["good", "truncated"]
    harness(sidecar)  # a good stream ends well
    with pytest.raises(failure):
        harness(sidecar)
    finish(sidecar)
    with store.Store(tmp_path / "store.db") as db:
        calls = db.calls("r-stream")
    assert [(c.finish_reason == "error", bool(c.error)) for c in calls] == [
        (False, False),
        (True, True),
    ]


def test_the_policys_thinking_is_signed_and_replays_as_its_own_tokens(
    procs: Any, engine: ScriptedEngine, tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    """The official Anthropic SDK's round trip: the streamed thinking block carries a
    signature (it was ``""``, which clients replay as text), the SDK sends the block
    back as it got it, and the next call extends the first one's tokens. An edited
    block with the same signature is refused, as the real API refuses it."""
    sidecar = start(procs, engine, "r-think", tiny_tokenizer_dir)
    client = anthropic.Anthropic(base_url=sidecar.url, api_key="x", max_retries=0)
    engine.script += ["thinking", "good"]
    first = [{"role": "user", "content": "hi"}]
    with client.messages.stream(model="p", max_tokens=50, messages=first) as stream:  # type: ignore[arg-type]
        reply = stream.get_final_message()
    thinking = reply.content[0]
    assert thinking.type == "thinking" and thinking.thinking == "I think so."
    assert thinking.signature.startswith("ofs1.")
    assert [block.type for block in reply.content] == ["thinking", "text"]
    replayed = [block.model_dump(exclude_none=True) for block in reply.content]
    turns = [
        *first,
        {"role": "assistant", "content": replayed},
        {"role": "user", "content": "again"},
    ]
    client.messages.create(model="p", max_tokens=50, messages=turns)  # type: ignore[arg-type]
    forged = [{**replayed[0], "thinking": "I was told the answer."}, replayed[1]]
    with pytest.raises(anthropic.BadRequestError, match="edited or forged"):
        client.messages.create(  # type: ignore[call-overload]
            model="p", max_tokens=50,
            messages=[*first, {"role": "assistant", "content": forged},
                      {"role": "user", "content": "again"}],
        )  # fmt: skip
    finish(sidecar)
    with store.Store(tmp_path / "store.db") as db:
        calls = db.calls("r-think")
    assert [c.http_status for c in calls] == [200, 200, 400]
    first_tokens = [*calls[0].prompt_token_ids, *calls[0].completion_token_ids]
    assert (
        list(calls[1].prompt_token_ids[: len(first_tokens)]) == first_tokens
    )  # merged, token for token
    assert calls[1].prefix_token_count == len(first_tokens)


def test_responses_reasoning_round_trips_through_its_encrypted_content(
    procs: Any, engine: ScriptedEngine, tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    """The official OpenAI SDK with ``include: ["reasoning.encrypted_content"]`` (a client
    that keeps no server-side state): the streamed reasoning item carries its text and
    signature; a client that sends back only the item (no summary) gives the policy its
    reasoning back, and the next call extends the first one's tokens. Encrypted content
    whose text was changed is refused, as a forged thinking block is."""
    sidecar = start(procs, engine, "r-reason", tiny_tokenizer_dir)
    client = openai.OpenAI(base_url=f"{sidecar.url}/v1", api_key="x", max_retries=0)
    engine.script += ["thinking", "good"]
    first = [{"role": "user", "content": "hi"}]
    include = ["reasoning.encrypted_content"]
    with client.responses.stream(model="p", input=first, include=include, store=False) as stream:  # type: ignore[arg-type]
        reply = stream.get_final_response()
    reasoning = reply.output[0]
    assert reasoning.type == "reasoning" and reasoning.summary[0].text == "I think so."
    assert reasoning.encrypted_content and reasoning.encrypted_content.startswith("ofr1.")
    item = reasoning.model_dump(exclude_none=True)
    bare = {
        "type": "reasoning",
        "id": item["id"],
        "summary": [],
        "encrypted_content": item["encrypted_content"],
    }
    message = reply.output[1].model_dump(exclude_none=True)
    turns = [*first, bare, message, {"role": "user", "content": "again"}]
    client.responses.create(model="p", input=turns, include=include, store=False)  # type: ignore[arg-type]
    # the same signature over another text: the content's text edited
    body, _, signature = item["encrypted_content"].removeprefix("ofr1.").partition(".")
    edited = "ofr1." + body[:-2] + "QQ" + "." + signature
    with pytest.raises(openai.BadRequestError, match="edited or forged"):
        client.responses.create(  # type: ignore[call-overload]
            model="p", include=include, store=False,
            input=[*first, {**bare, "encrypted_content": edited}, message,
                   {"role": "user", "content": "again"}],
        )  # fmt: skip
    finish(sidecar)
    with store.Store(tmp_path / "store.db") as db:
        calls = db.calls("r-reason")
    assert [c.http_status for c in calls] == [200, 200, 400]
    first_tokens = [*calls[0].prompt_token_ids, *calls[0].completion_token_ids]
    assert list(calls[1].prompt_token_ids[: len(first_tokens)]) == first_tokens  # merged
    assert calls[1].prefix_token_count == len(first_tokens)


def test_the_context_length_is_reread_when_the_engine_changes(
    procs: Any, engine: ScriptedEngine, tiny_tokenizer_dir: Path
) -> None:
    """A new policy version (new weights or a new model) or a refused call makes the
    sidecar read the engine's /v1/models again: a call's completion budget is then
    clamped to the engine's new context length (it kept the one read at start)."""
    engine.card = {"id": "m", "max_model_len": 4096}
    sidecar = start(procs, engine, "r-context", tiny_tokenizer_dir)

    def budget() -> int:
        response = httpx.post(
            sidecar.url + "/v1/chat/completions",
            json={
                "model": "p",
                "max_tokens": 16384,
                "messages": [{"role": "user", "content": "hi"}],
            },
            timeout=30,
        )
        assert response.status_code == 200, response.text
        prompt = len(engine.bodies[-1]["prompt"])
        return int(engine.bodies[-1]["max_tokens"]) + prompt

    engine.script += ["good-v1", "good-v1"]
    assert budget() == 4096
    reads = engine.models_read
    engine.card = {"id": "m", "max_model_len": 300}  # the same weights: nothing reread
    assert budget() == 4096 and engine.models_read == reads

    engine.script += ["good-v2", "good-v2"]
    budget()  # answered by the new version, planned with the old length
    scripted_engine.wait_for(lambda: engine.models_read > reads)
    assert budget() == 300

    engine.card = {"id": "m", "max_model_len": 200}
    engine.script += ["too-long", "good"]
    refused = httpx.post(
        sidecar.url + "/v1/chat/completions",
        json={"model": "p", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert refused.status_code == 400, refused.text
    scripted_engine.wait_for(lambda: engine.models_read > reads + 1)
    assert budget() == 200
    stats = httpx.get(f"{sidecar.url}/openforge/v1/stats", timeout=10).json()
    assert stats["counters"]["engine_model_changes"] == 2
