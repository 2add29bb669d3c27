"""An engine that hangs, stalls, resets or cannot be reached, through a real sidecar.

The harness gets its API's error in time, never mitmproxy's HTML page or its
ten-minute wait: the error object (504 past a deadline, 502 for a reset or a
refused connection) before any byte of the answer, else the end of the stream
with the API's error event, which the official SDKs raise on. The call is stored
with what happened, and the sidecar carries on.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import scripted_engine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openforge_trainer.collection import store
from scripted_engine import ScriptedEngine, finish

DEADLINES = (
    "--engine-connect-timeout", "1", "--engine-first-byte-timeout", "1",
    "--engine-idle-timeout", "1",
)  # fmt: skip


def start(procs: Any, engine: ScriptedEngine, rollout: str, tokenizer: Path) -> Any:
    return scripted_engine.sidecar_for(
        procs, engine, job="engine-failures", rollout=rollout, tokenizer=tokenizer, extra=DEADLINES
    )


def chat(sidecar: Any, *, stream: bool = False) -> httpx.Response:
    return httpx.post(
        sidecar.url + "/v1/chat/completions",
        json={"model": "p", "stream": stream, "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )


def stored(tmp_path: Path, rollout: str) -> list[Any]:
    with store.Store(tmp_path / "store.db") as db:
        return db.calls(rollout)


@pytest.mark.parametrize(
    ("fault", "status", "says"),
    [
        ("hang", 504, "no response head from the engine within 1 s"),
        ("reset", 502, "the engine failed"),
    ],
)
def test_before_its_answer_the_engine_failing_is_the_apis_error_object(
    procs: Any,
    engine: ScriptedEngine,
    tmp_path: Path,
    tiny_tokenizer_dir: Path,
    fault: str,
    status: int,
    says: str,
) -> None:
    sidecar = start(procs, engine, f"r-{fault}", tiny_tokenizer_dir)
    engine.script += [fault, fault, "good"]
    began = time.monotonic()
    failed = chat(sidecar)
    assert time.monotonic() - began < 10  # mitmproxy's own wait is ten minutes
    assert failed.status_code == status, failed.text
    assert failed.headers["content-type"] == "application/json"
    error = failed.json()["error"]
    assert error["type"] == "server_error" and says in error["message"], error
    anthropic_failed = httpx.post(
        sidecar.url + "/v1/messages",
        json={"model": "p", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert anthropic_failed.status_code == status
    assert anthropic_failed.json()["type"] == "error", anthropic_failed.text
    assert chat(sidecar).status_code == 200  # the sidecar carries on
    finish(sidecar)
    calls = stored(tmp_path, f"r-{fault}")
    assert [(c.http_status, says in c.error) for c in calls] == [
        (status, True),
        (status, True),
        (200, False),
    ]


@pytest.mark.parametrize("fault", ["stall", "reset-mid"])
@pytest.mark.parametrize(("harness", "failure"), scripted_engine.STREAMING_SDKS)
def test_within_a_stream_the_engine_failing_ends_it_with_the_apis_error_event(
    procs: Any,
    engine: ScriptedEngine,
    tmp_path: Path,
    tiny_tokenizer_dir: Path,
    fault: str,
    harness: Any,
    failure: type,
) -> None:
    sidecar = start(procs, engine, f"r-mid-{fault}", tiny_tokenizer_dir)
    engine.script += [fault, "good"]
    began = time.monotonic()
    with pytest.raises(failure):  # the API's error event (the reason is in the record)
        harness(sidecar)
    assert time.monotonic() - began < 10
    harness(sidecar)  # the next call is answered
    finish(sidecar)
    first, second = stored(tmp_path, f"r-mid-{fault}")
    assert first.finish_reason == "error" and "the engine failed" in first.error
    assert list(first.completion_token_ids) == [72]  # what was relayed before the failure
    assert (second.finish_reason, second.error) == ("stop", "")


def test_an_engine_that_accepts_no_connection_is_a_504_after_the_connect_deadline(
    procs: Any, engine: ScriptedEngine, tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    sidecar = start(procs, engine, "r-connect", tiny_tokenizer_dir)
    engine.script += ["good-close"]  # the engine closes the connection after it
    assert chat(sidecar).status_code == 200
    engine.stop_accepting()
    began = time.monotonic()
    failed = chat(sidecar)
    assert time.monotonic() - began < 10
    assert failed.status_code == 504, failed.text
    assert "no connection to the engine within 1 s" in failed.json()["error"]["message"]
    finish(sidecar)
    assert [c.http_status for c in stored(tmp_path, "r-connect")] == [200, 504]


#: What an answer may be, by the engine's behaviour: the statuses the harness may get.
BEHAVIOURS = {
    "good": {200},
    "hang": {504},
    "stall": {200, 504},  # streamed: the head went out; not streamed: nothing did
    "reset": {502},
    "reset-mid": {200, 502},
    "truncated": {200, 502},
    "not-json": {200, 502},
    "engine-error-event": {200, 502},
    "busy": {429},
    "down": {502},
}

ERROR_SHAPED = {
    "/v1/chat/completions": lambda b: isinstance(b.get("error", {}).get("message"), str),
    "/v1/responses": lambda b: isinstance(b.get("error", {}).get("message"), str),
    "/v1/messages": lambda b: b.get("type") == "error" and isinstance(b["error"]["message"], str),
}
REQUESTS = {
    "/v1/chat/completions": {"model": "p", "messages": [{"role": "user", "content": "hi"}]},
    "/v1/responses": {"model": "p", "input": "hi"},
    "/v1/messages": {
        "model": "p",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "hi"}],
    },
}


@pytest.mark.timeout(600)
def test_any_engine_behaviour_gets_the_apis_answer_in_time_and_each_call_is_recorded(
    procs: Any, engine: ScriptedEngine, tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    """Hypothesis picks an engine behaviour, an API and streaming or not for each call:
    every answer is in time and either a 2xx or the API's error object, a stream ends
    with ``[DONE]`` or the API's last event, or, broken off, with the API's error
    event, and the store holds each call once with the status the harness got."""
    sidecar = start(procs, engine, "r-any", tiny_tokenizer_dir)
    statuses: list[int] = []
    with httpx.Client(base_url=sidecar.url, timeout=30) as client:

        @settings(max_examples=30, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
        @given(
            behaviour=st.sampled_from(sorted(BEHAVIOURS)),
            path=st.sampled_from(sorted(REQUESTS)),
            stream=st.booleans(),
        )
        def one(behaviour: str, path: str, stream: bool) -> None:
            engine.script.append(behaviour)
            began = time.monotonic()
            body = {**REQUESTS[path], "stream": stream}
            parts: list[bytes] = []
            broken = False
            with client.stream("POST", path, json=body) as response:
                try:
                    parts += response.iter_bytes()
                except httpx.RemoteProtocolError:  # the connection closed mid-body
                    broken = True
            text = b"".join(parts)
            assert time.monotonic() - began < 10
            statuses.append(response.status_code)
            assert response.status_code in BEHAVIOURS[behaviour], (behaviour, text[:300])
            if response.status_code != 200:
                assert ERROR_SHAPED[path](json.loads(text)), text[:300]
            elif broken:  # a stream the engine broke off: the API's error event came first
                assert stream and b"error" in text.rsplit(b"\n\n", 2)[-2], text[-300:]
            elif stream:
                assert text.rstrip().endswith((b"[DONE]", b"}")), text[-300:]
            else:
                json.loads(text)

        one()
    finish(sidecar)
    calls = stored(tmp_path, "r-any")
    assert [c.call_index for c in calls] == list(range(len(statuses)))
    assert [c.http_status for c in calls] == statuses


def test_a_harness_that_hangs_up_on_a_silent_engine_is_not_the_engines_failure(
    procs: Any, engine: ScriptedEngine, tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    """The harness gave up before any deadline: its call is recorded as its hang-up,
    and nothing is written to it."""
    sidecar = start(procs, engine, "r-gone", tiny_tokenizer_dir)
    engine.script += ["hang", "good"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            sidecar.url + "/v1/chat/completions",
            json={"model": "p", "messages": [{"role": "user", "content": "hi"}]},
            timeout=0.3,
        )
    time.sleep(1.5)  # past the deadline the harness no longer waited for
    assert chat(sidecar).status_code == 200
    finish(sidecar)
    gone, answered = stored(tmp_path, "r-gone")
    assert gone.error.startswith("connection failed") and "engine" not in gone.error, gone.error
    assert answered.error == ""
