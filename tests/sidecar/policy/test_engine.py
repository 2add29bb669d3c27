from __future__ import annotations

import json
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mitmproxy import http
from openforge.wire import conversation
from openforge_sidecar.policy import engine
from traced import traced


def test_completion_request_caps_max_tokens_to_the_context():
    body = engine.completion_request(
        model="tiny",
        prompt_ids=[1] * 90,
        sampling=conversation.SamplingParams(max_tokens=50, temperature=0.5, stop=("END",)),
        stop_token_ids=frozenset({7, 3}),
        max_model_len=100,
    )
    assert body["max_tokens"] == 10
    assert body["prompt"] == [1] * 90
    assert body["stream"] is True and body["return_token_ids"] is True
    assert body["stop_token_ids"] == [3, 7]
    assert body["temperature"] == 0.5 and body["stop"] == ["END"]
    assert "top_p" not in body


@pytest.mark.parametrize("length", [0, 1, 5, 64 * 1024, 64 * 1024 + 1, 200_000])
def test_the_body_sent_is_the_request_with_its_prompt_written_in_chunks(length: int) -> None:
    ids = array("i", (i * 7919 % 151_000 for i in range(length)))
    settings_ = dict(
        model='a "prompt":[] model',  # the key's text inside a value is escaped, never matched
        sampling=conversation.SamplingParams(max_tokens=50, seed=3),
        stop_token_ids=frozenset({2}),
        max_model_len=300_000,
    )
    sent = json.loads(engine.completion_body(prompt_ids=ids, **settings_))
    assert sent == engine.completion_request(prompt_ids=list(ids), **settings_)


def test_parse_chunk_reads_vllm_stream_chunk():
    data = {
        "id": "cmpl-1",
        "object": "text_completion",
        "choices": [
            {
                "index": 0,
                "text": "hi",
                "logprobs": {
                    "tokens": ["hi"],
                    "token_logprobs": [-0.5],
                    "text_offset": [0],
                    "top_logprobs": [{"hi": -0.5}],
                },
                "finish_reason": None,
                "token_ids": [42],
                "prompt_token_ids": [1, 2, 3],
            }
        ],
    }
    chunk = engine.parse_chunk(json.dumps(data))
    assert chunk.token_ids == [42]
    assert chunk.logprobs == [-0.5]
    assert chunk.prompt_token_ids is not None and list(chunk.prompt_token_ids) == [1, 2, 3]
    assert chunk.finish_reason is None


def test_prompt_token_ids_are_kept_as_an_int32_array() -> None:
    def echo(ids: object) -> object:
        body = {"choices": [{"index": 0, "text": "", "token_ids": [], "prompt_token_ids": ids}]}
        return engine.parse_chunk(json.dumps(body)).prompt_token_ids

    found = echo([0, 151643, 2**31 - 1])
    assert isinstance(found, array) and found.typecode == "i"
    assert list(found) == [0, 151643, 2**31 - 1]
    assert list(echo([1.0, 2.0])) == [1, 2]  # type: ignore[call-overload]
    for bad in ([2**31], ["x"], "123", {"a": 1}):
        with pytest.raises(engine.EngineError, match="prompt_token_ids"):
            echo(bad)


def test_parse_chunk_reads_usage_chunk():
    chunk = engine.parse_chunk(
        json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}})
    )
    assert (chunk.prompt_tokens, chunk.completion_tokens, chunk.token_ids) == (3, 4, [])


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("not json", "not JSON"),
        ("[1]", "not a JSON object"),
        ('{"object": "error", "message": "boom"}', "boom"),
        ('{"choices": [{"index": 0, "text": "x"}]}', "return_token_ids"),
        (
            '{"choices": [{"index": 0, "token_ids": [1, 2], '
            '"logprobs": {"token_logprobs": [-1]}}]}',
            "2 token_ids but 1",
        ),
    ],
)
def test_parse_chunk_rejects_what_vllm_never_sends(payload, message):
    with pytest.raises(engine.EngineError, match=message):
        engine.parse_chunk(payload)


def _rewritten_by_mitmproxy(
    fields: list[tuple[bytes, bytes]], host: str
) -> tuple[tuple[bytes, bytes], ...]:
    """The rewrite as mitmproxy's own header operations do it (what the capture addon did)."""
    headers = http.Headers(fields)
    for name in list(headers.keys()):
        if name.lower() not in ("host", "user-agent"):
            del headers[name]
    headers["host"] = host
    headers["content-type"] = "application/json"
    headers["accept-encoding"] = "identity"
    return headers.fields


_header_names = st.sampled_from(
    [b"Host", b"host", b"User-Agent", b"user-agent", b"Authorization", b"Accept-Encoding"]
)


@settings(deadline=None)
@given(
    st.lists(st.tuples(_header_names, st.binary(max_size=8)), max_size=10),
    st.sampled_from(["127.0.0.1:8000", "engine.rl.svc"]),
)
def test_request_headers_equal_mitmproxys_own_rewrite(
    fields: list[tuple[bytes, bytes]], host: str
) -> None:
    assert engine.request_headers(fields, host) == _rewritten_by_mitmproxy(fields, host)


def test_an_echoed_prompt_with_a_bad_id_names_the_field() -> None:
    prompt = ", ".join(["5"] * 40 + ['"x"'])
    choice = '{"index": 0, "token_ids": [1], "logprobs": {"token_logprobs": [-0.5]}, '
    data = '{"choices": [' + choice + '"prompt_token_ids": [' + prompt + "]}]}"
    with pytest.raises(engine.EngineError, match="prompt_token_ids"):
        engine.parse_chunk(data)


def test_the_body_is_built_in_one_buffer_not_in_copies() -> None:
    """The chunks joined, then bracketed, then spliced into the rest were three copies
    of the prompt's JSON at once; built in one buffer it is the body alone."""
    ids = array("i", (i * 7919 % 151_000 for i in range(2_000_000)))
    settings_ = dict(
        model="m", sampling=conversation.SamplingParams(max_tokens=5), stop_token_ids=frozenset()
    )
    built = traced(lambda: engine.completion_body(prompt_ids=ids, **settings_))
    body, peak = built.value, built.peak
    assert peak < len(body) * 1.5  # the buffer grows by an eighth; orjson sizes its own
