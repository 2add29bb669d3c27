"""Faults through real processes: nothing the sidecar saw is lost silently.

Each test kills or withholds a real process (collector, sidecar, engine) and
checks the durable store afterwards: every call is stored exactly once, or
reported lost with a reason.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openforge_trainer.collection import store

CHAT = "/v1/chat/completions"


def ask(
    sidecar: Any, text: str = "hi", *, stream: bool = False, timeout: float = 30
) -> httpx.Response:
    return httpx.post(
        sidecar.url + CHAT,
        json={"model": "p", "stream": stream, "messages": [{"role": "user", "content": text}]},
        timeout=timeout,
    )


def ok(response: httpx.Response) -> httpx.Response:
    assert response.status_code == 200, response.text
    return response


def stats(sidecar: Any) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{sidecar.url}/openforge/v1/stats", timeout=10).json()
    return body


def finish(sidecar: Any, *, wait: float) -> dict[str, Any]:
    response = httpx.post(
        f"{sidecar.url}/openforge/v1/rollout/finish",
        json={"exit_code": 0, "reward": 0.5, "wait_seconds": wait},
        timeout=wait + 10,
    )
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def wait_until(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise TimeoutError("condition not met in time")


def stored(
    path: Path, rollout: str
) -> tuple[store.Rollout | None, list[store.ModelCall], list[store.LostRecord]]:
    with store.Store(path) as db:
        return db.rollout(rollout), db.calls(rollout), db.lost("faults")


def test_collector_down_then_back_delivers_everything_once(procs: Any, tmp_path: Path) -> None:
    engine = procs.engine()
    collector_port = procs.free_port()
    sidecar = procs.sidecar(
        "--collector",
        f"127.0.0.1:{collector_port}",
        "--job",
        "faults",
        "--rollout-id",
        "r-down",
        engine=engine,
    )
    for text in ("one", "two", "three"):
        ok(ask(sidecar, text))
    body = finish(sidecar, wait=0.5)
    assert not body["acknowledged"]  # nobody is listening yet
    assert body["unacked"] >= 4
    procs.collector(port=collector_port)
    db_path = tmp_path / "store.db"
    wait_until(lambda: stats(sidecar)["unacked"] == 0)
    rollout, calls, lost = stored(db_path, "r-down")
    assert rollout is not None and rollout.complete
    assert [c.call_index for c in calls] == [0, 1, 2]
    assert lost == []
    with store.Store(db_path) as db:
        assert db.record_count("faults") == 5  # started + 3 calls + finished, each once


def test_sidecar_killed_mid_call_restarts_and_reports_the_lost_call(
    procs: Any, tmp_path: Path
) -> None:
    # slow enough that the second call is surely still streaming when killed
    engine = procs.engine("--token-delay-ms", "1000")
    collector = procs.collector()
    spool = tmp_path / "spool"
    port = procs.free_port()
    args = (
        "--collector",
        f"127.0.0.1:{collector.port}",
        "--job",
        "faults",
        "--rollout-id",
        "r-kill",
    )
    sidecar = procs.sidecar(*args, engine=engine, spool=spool, port=port)
    ok(ask(sidecar, "first"))
    wait_until(lambda: stats(sidecar)["unacked"] == 0)

    # a second call is streaming when the sidecar is killed outright
    failure: list[BaseException] = []

    def doomed() -> None:
        try:
            with httpx.stream(
                "POST",
                sidecar.url + CHAT,
                json={
                    "model": "p",
                    "stream": True,
                    "messages": [{"role": "user", "content": "second"}],
                },
                timeout=30,
            ) as response:
                for _ in response.iter_bytes():
                    pass
        except httpx.HTTPError as exc:
            failure.append(exc)

    thread = threading.Thread(target=doomed)
    thread.start()
    wait_until(lambda: stats(sidecar)["calls"] == 2)
    sidecar.stop(signal.SIGKILL)
    thread.join(30)
    assert failure, "the harness must see the connection die"

    restarted = procs.sidecar(
        *args, engine=engine, spool=spool, port=port, name="sidecar-restarted"
    )
    third = ask(restarted, "third")
    assert third.status_code == 200
    done = finish(restarted, wait=20)
    assert done["acknowledged"], done

    rollout, calls, lost = stored(tmp_path / "store.db", "r-kill")
    assert rollout is not None and rollout.complete
    assert [c.call_index for c in calls] == [0, 2]
    assert calls[1].segment_reason == "sidecar_restarted"
    assert [(item.call_index, "in flight" in item.reason) for item in lost] == [(1, True)]
    assert rollout.call_count_expected == 3


def test_engine_dying_mid_stream_fails_the_call_and_the_sidecar_keeps_serving(
    procs: Any, tmp_path: Path
) -> None:
    engine = procs.engine("--token-delay-ms", "100")
    collector = procs.collector()
    sidecar = procs.sidecar(
        "--collector",
        f"127.0.0.1:{collector.port}",
        "--job",
        "faults",
        "--rollout-id",
        "r-engine",
        engine=engine,
    )
    client = openai.OpenAI(base_url=f"{sidecar.url}/v1", api_key="x", max_retries=0)
    stream = client.chat.completions.create(
        model="p", messages=[{"role": "user", "content": "hello"}], stream=True
    )
    next(iter(stream))  # the first token arrived
    engine.stop(signal.SIGKILL)
    with pytest.raises(
        (openai.APIError, httpx.HTTPError)
    ):  # the connection is cut, as a real API's would be
        for _ in stream:
            pass
    # a new engine on the same port; the sidecar carries on
    procs.start("engine2", engine.args, engine.port)
    ok = client.chat.completions.create(model="p", messages=[{"role": "user", "content": "again"}])
    assert ok.choices[0].message.content == "Done."
    finish(sidecar, wait=20)
    _, calls, _ = stored(tmp_path / "store.db", "r-engine")
    assert len(calls) == 2
    assert calls[0].error and calls[0].finish_reason == "error"
    assert not calls[1].error and calls[1].token_exact


def test_engine_refusal_reaches_the_harness_in_its_api_format(procs: Any, tmp_path: Path) -> None:
    engine = procs.engine("--max-model-len", "256")
    sidecar = procs.sidecar(
        "--job", "faults", "--rollout-id", "r-refused", "--max-model-len", "256", engine=engine
    )
    response = httpx.post(
        sidecar.url + "/v1/messages",
        json={
            "model": "m",
            "max_tokens": 10,
            "messages": [{"role": "user", "content": " ".join(f"word{i}" for i in range(400))}],
        },
        timeout=30,
    )
    assert response.status_code == 400
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "engine answered 400" in body["error"]["message"]
    ok(ask(sidecar, "short"))


@pytest.mark.parametrize("option", [(), ("--max-model-len", "32768")])
def test_max_tokens_is_a_ceiling_under_the_engines_context(
    procs: Any, option: tuple[str, ...]
) -> None:
    """A harness's default completion budget (16384) on an engine of 512 tokens is
    answered, as the real APIs answer it: the sidecar takes the context length from
    the engine's /v1/models, and an option above it is lowered to it (both were 400s:
    "you requested 16400 tokens")."""
    engine = procs.engine("--max-model-len", "512")
    sidecar = procs.sidecar("--job", "faults", "--rollout-id", "r-ceiling", *option, engine=engine)
    for path, body in (
        (
            "/v1/chat/completions",
            {"max_tokens": 16384, "messages": [{"role": "user", "content": "hi"}]},
        ),
        ("/v1/messages", {"max_tokens": 16384, "messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/responses", {"max_output_tokens": 4096, "input": "hi"}),
    ):
        ok(httpx.post(sidecar.url + path, json={"model": "m", **body}, timeout=30))


def test_sigterm_flushes_every_spooled_call_to_the_collector(procs: Any, tmp_path: Path) -> None:
    engine = procs.engine()
    collector = procs.collector()
    sidecar = procs.sidecar(
        "--collector",
        f"127.0.0.1:{collector.port}",
        "--job",
        "faults",
        "--rollout-id",
        "r-term",
        engine=engine,
    )
    for index in range(5):
        ok(ask(sidecar, f"call {index}"))
    assert sidecar.stop(signal.SIGTERM) == 0
    _, calls, _ = stored(tmp_path / "store.db", "r-term")
    assert [c.call_index for c in calls] == [0, 1, 2, 3, 4]


def test_sigterm_with_the_collector_away_keeps_the_spool_for_the_next_start(
    procs: Any, tmp_path: Path
) -> None:
    engine = procs.engine()
    collector_port = procs.free_port()
    spool = tmp_path / "spool"
    args = (
        "--collector",
        f"127.0.0.1:{collector_port}",
        "--job",
        "faults",
        "--rollout-id",
        "r-away",
        "--flush-timeout",
        "1",
    )
    sidecar = procs.sidecar(*args, engine=engine, spool=spool)
    ok(ask(sidecar, "kept"))
    sidecar.stop(signal.SIGTERM)
    assert "did not acknowledge" in sidecar.output()
    procs.collector(port=collector_port)
    again = procs.sidecar(*args, engine=engine, spool=spool, name="sidecar-again")
    finish(again, wait=20)
    rollout, calls, lost = stored(tmp_path / "store.db", "r-away")
    assert (
        rollout is not None
        and rollout.complete
        and [c.call_index for c in calls] == [0]
        and lost == []
    )


def test_oversized_bodies_are_refused_with_413_and_recorded(procs: Any, tmp_path: Path) -> None:
    engine = procs.engine()
    sidecar = procs.sidecar("--rollout-id", "r-big", engine=engine)
    huge = "x" * (33 * 1024 * 1024)
    response = httpx.post(
        sidecar.url + CHAT,
        json={"model": "p", "messages": [{"role": "user", "content": huge}]},
        timeout=60,
    )
    assert response.status_code == 413
    assert "exceeds the limit" in response.json()["error"]["message"]
    ok(ask(sidecar, "small"))
    assert stats(sidecar)["counters"]["rejected_413"] == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"exit_code": 2**40}, "exit_code must be a 32-bit integer"),
        ({"exit_code": True}, "exit_code must be a 32-bit integer"),
        ({"exit_code": 0, "reward": True}, "reward must be a finite number or null"),
        ({"exit_code": 0, "reward": "1.0"}, "reward must be a finite number or null"),
        ({"exit_code": 0, "status": "won"}, "status must be one of succeeded, failed, timeout"),
        ({"exit_code": 0, "grader_output": ["x"]}, "grader_output must be a string"),
        ({"exit_code": 0, "wait_seconds": 1e9}, "wait_seconds must be a number from 0 to 3600"),
        ({"exit_code": 0, "wait_seconds": False}, "wait_seconds must be a number from 0 to 3600"),
        ({"exit_code": 1, "retried": 1}, "retried must be true or false"),
        ({"exit_code": 0, "retried": True}, "retried must be false for a succeeded attempt"),
        ([1, 2], "body must be a JSON object"),
    ],
)
def test_a_malformed_finish_is_refused_naming_its_field_and_records_nothing(
    procs: Any, tmp_path: Path, body: Any, field: str
) -> None:
    collector = procs.collector()
    sidecar = procs.sidecar(
        "--collector",
        f"127.0.0.1:{collector.port}",
        "--job",
        "faults",
        "--rollout-id",
        "r-bad-finish",
        engine=procs.engine(),
    )
    refused = httpx.post(f"{sidecar.url}/openforge/v1/rollout/finish", json=body, timeout=10)
    assert refused.status_code == 400 and field in refused.json()["error"], refused.text
    # nothing was recorded: the rollout's one finish is still to come, and is stored
    assert finish(sidecar, wait=20)["acknowledged"]
    rollout, _, _ = stored(tmp_path / "store.db", "r-bad-finish")
    assert rollout is not None and rollout.finished and rollout.reward == 0.5


def test_a_reward_that_is_not_a_finite_number_is_refused(procs: Any, tmp_path: Path) -> None:
    """Python's JSON reads NaN and Infinity: a finish carrying one is refused before it is
    recorded (a NaN once broke the collector's insert and the export stalled for good)."""
    collector = procs.collector()
    sidecar = procs.sidecar(
        "--collector",
        f"127.0.0.1:{collector.port}",
        "--job",
        "faults",
        "--rollout-id",
        "r-nan",
        engine=procs.engine(),
    )
    for text in ('{"exit_code": 0, "reward": NaN}', '{"exit_code": 0, "reward": Infinity}'):
        refused = httpx.post(
            f"{sidecar.url}/openforge/v1/rollout/finish",
            content=text,
            headers={"content-type": "application/json"},
            timeout=10,
        )
        assert (
            refused.status_code == 400
            and "reward must be a finite number" in refused.json()["error"]
        ), refused.text
    assert finish(sidecar, wait=20)["acknowledged"]
    rollout, _, _ = stored(tmp_path / "store.db", "r-nan")
    assert rollout is not None and rollout.reward == 0.5


def test_a_record_larger_than_grpcs_default_limit_reaches_the_store(
    procs: Any, tmp_path: Path
) -> None:
    """A 5 MB request (refused by the engine: far past its context) makes a call record over
    gRPC's default 4 MiB; it once stalled the sidecar's export for good."""
    collector = procs.collector()
    sidecar = procs.sidecar(
        "--collector",
        f"127.0.0.1:{collector.port}",
        "--job",
        "faults",
        "--rollout-id",
        "r-big",
        engine=procs.engine(),
    )
    answer = ask(sidecar, "word " * 1_000_000, timeout=120)
    assert answer.status_code == 400, answer.text[
        :500
    ]  # as the real API answers a prompt past the context
    assert finish(sidecar, wait=60)["acknowledged"]
    rollout, calls, _ = stored(tmp_path / "store.db", "r-big")
    assert rollout is not None and rollout.finished
    assert len(calls) == 1 and len(calls[0].request_json) > 4 * 1024 * 1024


def test_a_large_prompt_echoed_by_the_engine_is_captured_token_exactly_streamed_or_not(
    procs: Any, tmp_path: Path
) -> None:
    """A prompt whose echo is far over 64 K characters: not streamed, the echo is cut from
    the engine's answer bytes (``policy.echo``); streamed, it arrives in many reads of
    one SSE line. Either way the call is stored token-exact, with the engine's own echo
    matching the planned prompt, and both answers say the same."""
    collector = procs.collector()
    sidecar = procs.sidecar(
        "--collector", f"127.0.0.1:{collector.port}", "--job", "faults", "--rollout-id", "r-echo",
        engine=procs.engine("--max-model-len", "1000000"),
    )  # fmt: skip
    text = "word " * 60_000
    whole, streamed = ask(sidecar, text, timeout=120), ask(sidecar, text, stream=True, timeout=120)
    assert whole.status_code == 200 and streamed.status_code == 200, whole.text[:300]
    said = "".join(
        json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        for line in streamed.text.splitlines()
        if line.startswith("data: {")
    )
    assert said == whole.json()["choices"][0]["message"]["content"]
    done = finish(sidecar, wait=60)
    assert done["acknowledged"] and not done["counters"].get("prompt_mismatch"), done
    _, calls, _ = stored(tmp_path / "store.db", "r-echo")
    assert len(calls) == 2 and all(c.token_exact and not c.error for c in calls), calls
    assert calls[0].prompt_token_ids == calls[1].prompt_token_ids
    assert len(calls[0].prompt_token_ids) >= 60_000  # its echo: well over 64 K characters


def test_a_large_request_waits_for_its_record_in_a_file_and_is_stored_as_it_came(
    procs: Any, tmp_path: Path
) -> None:
    """A request over a megabyte is not held while it is answered: the sidecar stashes its
    body beside the spool and writes the record from that file. The stored body is the
    harness's, byte for byte, and the file is gone once the record is spooled."""
    collector = procs.collector()
    sidecar = procs.sidecar(
        "--collector", f"127.0.0.1:{collector.port}", "--job", "faults", "--rollout-id", "r-big",
        engine=procs.engine("--max-model-len", "1000000"),
    )  # fmt: skip
    body = json.dumps(
        {"model": "p", "messages": [{"role": "user", "content": "word " * 300_000}]}
    ).encode()
    answer = httpx.post(
        sidecar.url + CHAT, content=body, headers={"content-type": "application/json"}, timeout=120
    )
    assert answer.status_code == 200, answer.text[:300]
    done = finish(sidecar, wait=60)
    assert done["acknowledged"] and not done["counters"].get("prompt_mismatch"), done
    _, calls, _ = stored(tmp_path / "store.db", "r-big")
    assert len(calls) == 1 and calls[0].token_exact and not calls[0].error, calls
    assert calls[0].request_json == body
    assert len(calls[0].prompt_token_ids) * 4 > 1024 * 1024  # its IDs were stashed too
    bodies = tmp_path / "spool" / "stash"
    left = [path.relative_to(bodies).as_posix() for path in bodies.rglob("*.*")]
    # it was stashed, and is gone; what is left is the conversation's head, for its next call
    assert bodies.is_dir() and all(name.startswith("heads/head-") for name in left), left


def test_a_finish_tried_again_is_stored_so(procs: Any, tmp_path: Path) -> None:
    """The runner says the failed attempt is tried again: its record, and the store, say
    so (the trainer's group waits for the next attempt instead of deciding without it)."""
    collector = procs.collector()
    sidecar = procs.sidecar(
        "--collector", f"127.0.0.1:{collector.port}", "--job", "faults",
        "--rollout-id", "r-retried", engine=procs.engine(),
    )  # fmt: skip
    body = {"exit_code": 3, "status": "failed", "retried": True, "wait_seconds": 20}
    response = httpx.post(f"{sidecar.url}/openforge/v1/rollout/finish", json=body, timeout=30)
    assert response.status_code == 200 and response.json()["acknowledged"], response.text
    rollout, _, _ = stored(tmp_path / "store.db", "r-retried")
    assert rollout is not None and rollout.finished
    assert (rollout.status, rollout.exit_code, rollout.retried) == ("failed", 3, True)
