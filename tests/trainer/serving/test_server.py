"""``openforge serve`` over real HTTP with a tiny Qwen2 model built from a seed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from openforge import endpoints
from openforge_sidecar.policy import template
from openforge_trainer.serving import completions as protocol
from openforge_trainer.serving import server as serve
from openforge_trainer.testengine import engine as testengine
from openforge_trainer.tiny import tokenizer_build
from safetensors import torch as safetensors_torch
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

torch.set_num_threads(1)

ASSETS = tokenizer_build.committed_assets()
NAME = "tiny"
PROMPT = list(range(40, 70))


def build_model(directory: Path, seed: int) -> Path:
    """A tiny Qwen2 policy with the tiny tokenizer, as ``save_pretrained`` writes it."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=4096,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        initializer_range=0.3,  # a wide spread: greedy outputs vary from token to token
    )
    Qwen2ForCausalLM(config).save_pretrained(directory)
    for name in serve.TOKENIZER_FILES:
        shutil.copy(ASSETS / name, directory / name)
    return directory


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {"a": build_model(root / "a", 0), "b": build_model(root / "b", 1)}


def start(model_dir: Path, **options: Any) -> tuple[str, serve.Engine, Any]:
    config = serve.ServeConfig(model_dir=model_dir, model_name=NAME, **options)
    return serve.start_in_thread(config)


@pytest.fixture(scope="module")
def server(models: dict[str, Path]) -> Iterator[str]:
    url, _, stop = start(models["a"], policy_version=3, max_model_len=512)
    yield url
    stop()


@pytest.fixture
def fresh(models: dict[str, Path]) -> Iterator[tuple[str, serve.Engine]]:
    """A server of its own, for tests that change weights or pause."""
    url, engine, stop = start(models["a"])
    yield url, engine
    stop()


def reference_model(path: Path) -> PreTrainedModel:
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.requires_grad_(False)
    return model


def complete(url: str, **body: Any) -> httpx.Response:
    payload = {"model": NAME, "prompt": PROMPT, "max_tokens": 12, **body}
    return httpx.post(f"{url}/v1/completions", json=payload, timeout=60)


def ok(url: str, **body: Any) -> dict[str, Any]:
    response = complete(url, **body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def stream(url: str, **body: Any) -> tuple[httpx.Headers, list[dict[str, Any]]]:
    payload = {"model": NAME, "prompt": PROMPT, "max_tokens": 12, "stream": True, **body}
    with httpx.stream("POST", f"{url}/v1/completions", json=payload, timeout=60) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [e for e in response.read().decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    return response.headers, [json.loads(e.removeprefix("data: ")) for e in events[:-1]]


def greedy_ids(model: PreTrainedModel, prompt: list[int], count: int) -> list[int]:
    """Greedy decoding by full forward passes, no cache: what the server must match."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(count):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def keys(value: Any) -> Any:
    """The nested key structure of a response, for shape comparison."""
    if isinstance(value, dict):
        return {k: "token->logprob" if k == "top_logprobs" else keys(v) for k, v in value.items()}
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return [keys(value[0])]
    return type(value).__name__ if value is not None else None


# --- the endpoints --------------------------------------------------------------


def test_read_endpoints_and_the_tokenizer_files_the_sidecar_loads(
    server: str, models: dict[str, Path]
) -> None:
    assert httpx.get(f"{server}/health").status_code == 200
    listing = httpx.get(f"{server}/v1/models").json()
    card = listing["data"][0]
    assert (card["id"], card["max_model_len"], card["openforge_policy_version"]) == (NAME, 512, 3)
    policy = httpx.get(f"{server}/openforge/v1/policy").json()
    assert policy == {"model": NAME, "policy_version": 3}
    for name in serve.TOKENIZER_FILES:
        served = httpx.get(f"{server}/openforge/v1/tokenizer/{name}")
        assert served.status_code == 200
        assert served.content == (models["a"] / name).read_bytes()
    assert httpx.get(f"{server}/openforge/v1/tokenizer/secrets.txt").status_code == 404
    # The sidecar's own loader reads the policy tokenizer from the server.
    policy_tokenizer = template.PolicyTokenizer.load(server)
    assert policy_tokenizer.vocab_size == 4096
    assert policy_tokenizer.eos_token == "<|im_end|>"
    assert httpx.get(f"{server}/v1/completions").status_code == 405
    assert httpx.post(f"{server}/v1/chat/completions", json={}).status_code == 404


def test_vllm_field_shapes_match_the_test_engine(server: str) -> None:
    engine_url, stop = testengine.start_in_thread(
        testengine.EngineConfig(ASSETS, model=NAME, max_model_len=512)
    )
    try:
        for body in (
            {},
            {"logprobs": 2, "return_token_ids": True},
            {"logprobs": 0, "return_token_ids": True, "skip_special_tokens": False},
        ):
            assert keys(ok(server, **body)) == keys(ok(engine_url, **body))
        options = {"include_usage": True, "continuous_usage_stats": True}
        for body in (
            {"logprobs": 1, "return_token_ids": True, "stream_options": options},
            {"stream_options": {"include_usage": False}},
        ):
            _, ours = stream(server, **body)
            _, theirs = stream(engine_url, **body)
            assert keys(ours[0]) == keys(theirs[0])  # the first chunk has prompt_token_ids
            assert keys(ours[1]) == keys(theirs[1])
        _, ours = stream(server, stream_options={"include_usage": True})
        _, theirs = stream(engine_url, stream_options={"include_usage": True})
        usage = ours[-1]
        assert usage["choices"] == [] and usage.pop("openforge_policy_version") == 3
        assert keys(usage) == keys(theirs[-1])
    finally:
        stop()


def test_completion_fields_and_policy_header(server: str) -> None:
    response = complete(server, logprobs=3, return_token_ids=True, temperature=0)
    assert response.headers[endpoints.POLICY_VERSION_HEADER] == "3"
    body = response.json()
    choice = body["choices"][0]
    assert body["model"] == NAME and body["object"] == "text_completion"
    assert choice["prompt_token_ids"] == PROMPT and len(choice["token_ids"]) == 12
    assert choice["finish_reason"] == "length" and choice["stop_reason"] is None
    assert body["usage"] == {
        "prompt_tokens": 30,
        "total_tokens": 42,
        "completion_tokens": 12,
        "prompt_tokens_details": None,
    }
    logprobs = choice["logprobs"]
    assert len(logprobs["token_logprobs"]) == 12
    for token, value, top in zip(
        logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True
    ):
        assert top[token] == value and 3 <= len(top) <= 4
        assert max(top.values()) == value  # greedy picks the best token
    assert choice["text"] == "".join(logprobs["tokens"])


def test_stream_concatenates_to_the_non_streamed_answer(server: str) -> None:
    for sampling in ({"temperature": 0}, {"temperature": 0.9, "top_p": 0.8, "seed": 17}):
        body = {"logprobs": 1, "return_token_ids": True, "max_tokens": 20, **sampling}
        whole = ok(server, **body)["choices"][0]
        headers, chunks = stream(server, stream_options={"include_usage": True}, **body)
        assert headers[endpoints.POLICY_VERSION_HEADER] == "3"
        choices = [c["choices"][0] for c in chunks if c["choices"]]
        assert len(choices) == 20  # one chunk per token
        assert [t for c in choices for t in c["token_ids"]] == whole["token_ids"]
        assert "".join(c["text"] for c in choices) == whole["text"]
        streamed = [v for c in choices for v in c["logprobs"]["token_logprobs"]]
        assert streamed == whole["logprobs"]["token_logprobs"]
        assert choices[0]["prompt_token_ids"] == PROMPT
        assert all(c["prompt_token_ids"] is None for c in choices[1:])
        assert [c["finish_reason"] for c in choices] == [None] * 19 + ["length"]
        assert chunks[-1]["usage"]["completion_tokens"] == 20


def test_logprobs_equal_a_full_forward_recomputation(server: str, models: dict[str, Path]) -> None:
    model = reference_model(models["a"])
    for sampling in (
        {"temperature": 1.0, "seed": 1},
        {"temperature": 0.6, "top_p": 0.9, "seed": 2},
    ):
        choice = ok(server, logprobs=0, return_token_ids=True, max_tokens=24, **sampling)[
            "choices"
        ][0]
        ids = PROMPT + choice["token_ids"]
        with torch.no_grad():
            full = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
        expected = [
            full[len(PROMPT) - 1 + i, token].item() for i, token in enumerate(choice["token_ids"])
        ]
        served = choice["logprobs"]["token_logprobs"]
        # Raw (temperature 1) logprobs, whatever temperature sampled the token. The
        # server decodes with a KV cache, the reference in one forward pass: fp32
        # rounding apart, 1.1e-5 seen on CI. Temperature-scaled or shifted logprobs
        # miss by 1e-2 or more.
        assert max(abs(a - b) for a, b in zip(expected, served, strict=True)) < 1e-4


def test_greedy_matches_uncached_decoding_and_is_batch_invariant(
    server: str, models: dict[str, Path]
) -> None:
    prompts = [PROMPT[: 5 + 3 * i] for i in range(8)]
    alone = [
        ok(server, prompt=p, temperature=0, logprobs=0, return_token_ids=True) for p in prompts
    ]
    model = reference_model(models["a"])
    assert alone[7]["choices"][0]["token_ids"] == greedy_ids(model, prompts[7], 12)
    together: list[dict[str, Any]] = [{}] * 8

    def run(index: int) -> None:
        together[index] = ok(
            server, prompt=prompts[index], temperature=0, logprobs=0, return_token_ids=True
        )

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for solo, batched in zip(alone, together, strict=True):
        a, b = solo["choices"][0], batched["choices"][0]
        assert a["token_ids"] == b["token_ids"]
        pairs = zip(a["logprobs"]["token_logprobs"], b["logprobs"]["token_logprobs"], strict=True)
        assert max(abs(x - y) for x, y in pairs) < 1e-4


def test_max_tokens_and_stop_token_ids(server: str) -> None:
    free = ok(server, temperature=0, return_token_ids=True, skip_special_tokens=False)
    ids = free["choices"][0]["token_ids"]
    assert (
        ok(server, temperature=0, max_tokens=2, return_token_ids=True)["choices"][0]["token_ids"]
        == ids[:2]
    )
    stop_id = ids[4]
    assert stop_id not in ids[:4]
    stopped = ok(
        server,
        temperature=0,
        return_token_ids=True,
        stop_token_ids=[stop_id],
        skip_special_tokens=False,
    )
    choice = stopped["choices"][0]
    assert choice["token_ids"] == ids[:5]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", stop_id)
    head = ok(server, temperature=0, max_tokens=4, skip_special_tokens=False)["choices"][0]
    assert choice["text"] == head["text"]  # the stop token is left out of the text
    _, chunks = stream(server, temperature=0, return_token_ids=True, stop_token_ids=[stop_id])
    last = chunks[-1]["choices"][0]
    assert (last["finish_reason"], last["stop_reason"], last["text"]) == ("stop", stop_id, "")


def test_stop_strings_cut_the_text_like_vllm(server: str) -> None:
    body = {"temperature": 0, "return_token_ids": True, "max_tokens": 30, "logprobs": 0}
    full = ok(server, **body)["choices"][0]
    text = full["text"]
    at = next(i for i in range(8, len(text) - 3) if text.find(text[i : i + 3]) == i)
    stop = text[at : at + 3]
    assert "\ufffd" not in stop
    cut = ok(server, stop=["never-there", stop], **body)["choices"][0]
    assert cut["text"] == text[:at]
    assert (cut["finish_reason"], cut["stop_reason"]) == ("stop", stop)
    ids = cut["token_ids"]
    assert ids == full["token_ids"][: len(ids)] and len(ids) < 30
    assert len(cut["logprobs"]["token_logprobs"]) == len(ids)
    _, chunks = stream(server, stop=stop, **body)
    choices = [c["choices"][0] for c in chunks]
    assert "".join(c["text"] for c in choices) == cut["text"]
    assert [t for c in choices for t in c["token_ids"]] == ids
    assert (choices[-1]["finish_reason"], choices[-1]["stop_reason"]) == ("stop", stop)


def test_output_text_holds_partial_characters_and_possible_stop_strings() -> None:
    pieces = {1: b"ab", 2: b"\xc3", 3: b"\xa9c", 4: b"X", 5: b"Yd", 6: b"!"}

    def decode(ids: list[int]) -> str:
        return b"".join(pieces[i] for i in ids).decode("utf-8", errors="replace")

    streamed = protocol.OutputText(decode, streaming=True)
    deltas = [streamed.add(i, stop_token=False, final=False)[1] for i in (1, 2, 3)]
    assert deltas == ["ab", "", "\u00e9c"]  # the half character waits for its second byte
    assert streamed.add(6, stop_token=True, final=True) == (None, "")
    assert streamed.text == "ab\u00e9c"

    held = protocol.OutputText(decode, stops=("XYZ", "cX"), streaming=True)
    steps = [held.add(i, stop_token=False, final=False) for i in (1, 3, 4)]
    # Two characters are held back ("XYZ" is 3 long): "ab" waits, then "ab\ufffdc" frees "ab".
    assert steps[:2] == [(None, ""), (None, "ab")]
    assert steps[2] == ("cX", "\ufffd")  # "cX" ends in the new text: cut before it
    assert held.text == "ab\ufffd" == held.emitted

    lazy = protocol.OutputText(decode)
    assert [lazy.add(i, stop_token=False, final=False) for i in (1, 5)] == [(None, "")] * 2
    assert lazy.text == "abYd"


def test_request_errors_name_the_field(server: str) -> None:
    cases = [
        ({"model": "other"}, 404, "model"),
        ({"prompt": [1, 99999]}, 400, "prompt"),
        ({"prompt": []}, 400, "prompt"),
        ({"top_p": 0}, 400, "top_p"),
        ({"stop": ["ok", ""]}, 400, "stop"),
        ({"temperature": -1}, 400, "temperature"),
        ({"max_tokens": 500}, 400, "max_tokens"),  # 30 + 500 > 512
        ({"prompt": list(range(600))}, 400, "prompt"),
    ]
    for body, status, param in cases:
        response = complete(server, **body)
        assert response.status_code == status, (body, response.text)
        error = response.json()
        assert (error["object"], error["param"], error["code"]) == ("error", param, status)


def test_string_prompt_is_tokenized(server: str) -> None:
    text = "hello world"
    ids = template.PolicyTokenizer.load(str(ASSETS)).encode(text)
    by_text = ok(server, prompt=text, temperature=0, return_token_ids=True)["choices"][0]
    by_ids = ok(server, prompt=ids, temperature=0, return_token_ids=True)["choices"][0]
    assert by_text["prompt_token_ids"] == ids
    assert by_text["token_ids"] == by_ids["token_ids"]


# --- weights, pause and resume --------------------------------------------------------


def generate(url: str) -> tuple[list[int], str]:
    response = complete(url, temperature=0, return_token_ids=True)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["token_ids"], response.headers[
        endpoints.POLICY_VERSION_HEADER
    ]


def post_weights(url: str, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{url}/openforge/v1/weights", timeout=60, **kwargs)


def state_bytes(model_dir: Path, edit: Any = None) -> bytes:
    tensors = dict(safetensors_torch.load_file(str(model_dir / "model.safetensors")))
    if edit is not None:
        edit(tensors)
    return bytes(safetensors_torch.save(tensors))


def test_weight_update_by_path_and_by_pushed_bytes(
    fresh: tuple[str, serve.Engine], models: dict[str, Path]
) -> None:
    url, _ = fresh
    tokens_a, version = generate(url)
    assert version == "0"
    expected_b = greedy_ids(reference_model(models["b"]), PROMPT, 12)
    assert expected_b != tokens_a

    response = post_weights(url, json={"path": str(models["b"]), "policy_version": 5})
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["policy_version"] == 5 and result["load_ms"] >= 0 and result["tensors"] == 26
    assert generate(url) == (expected_b, "5")
    assert httpx.get(f"{url}/openforge/v1/policy").json()["policy_version"] == 5
    assert httpx.get(f"{url}/v1/models").json()["data"][0]["openforge_policy_version"] == 5

    pushed = post_weights(
        url,
        content=state_bytes(models["a"]),
        headers={"content-type": "application/octet-stream", endpoints.POLICY_VERSION_HEADER: "6"},
    )
    assert pushed.status_code == 200, pushed.text
    assert pushed.json()["policy_version"] == 6
    assert generate(url) == (tokens_a, "6")

    # A single .safetensors file, no version given: the version moves on by one.
    by_file = post_weights(url, json={"path": str(models["b"] / "model.safetensors")})
    assert by_file.json()["policy_version"] == 7
    _, stream_chunks = stream(url, temperature=0, stream_options={"include_usage": True})
    assert stream_chunks[-1]["openforge_policy_version"] == 7


def test_bad_updates_are_refused_whole_and_name_the_tensor(
    fresh: tuple[str, serve.Engine], models: dict[str, Path]
) -> None:
    url, _ = fresh
    before = generate(url)
    name = "model.layers.0.mlp.gate_proj.weight"

    def rename(tensors: dict[str, torch.Tensor]) -> None:
        tensors["model.layers.0.mlp.gate.weight"] = tensors.pop(name)

    def reshape(tensors: dict[str, torch.Tensor]) -> None:
        tensors[name] = tensors[name][:, :32].contiguous()

    def drop(tensors: dict[str, torch.Tensor]) -> None:
        del tensors[name]

    octet = {"content-type": "application/octet-stream"}
    for edit, needle in (
        (rename, "tensor model.layers.0.mlp.gate.weight: the served model has no tensor"),
        (reshape, f"tensor {name}: shape [128, 32] does not match the served model's [128, 64]"),
        (drop, f"tensor {name}: missing from the update"),
    ):
        response = post_weights(url, content=state_bytes(models["b"], edit), headers=octet)
        assert response.status_code == 400, response.text
        assert needle in response.json()["message"]
    assert generate(url) == before  # nothing was copied, the version did not move

    for body, needle in (
        ({"path": str(models["b"] / "nothing")}, "neither"),
        ({"path": 5}, "path: must be a non-empty string"),
        ({"path": str(models["b"]), "policy_version": -1}, "policy_version"),
        ({"path": str(models["b"]), "drain": "yes"}, "drain: must be a boolean"),
    ):
        response = post_weights(url, json=body)
        assert response.status_code == 400 and needle in response.json()["message"]
    garbage = post_weights(url, content=b"\x00" * 32, headers=octet)
    assert garbage.status_code == 400 and "not a safetensors" in garbage.json()["message"]
    bad_header = post_weights(
        url,
        content=state_bytes(models["b"]),
        headers={**octet, endpoints.POLICY_VERSION_HEADER: "v2"},
    )
    assert (
        bad_header.status_code == 400
        and endpoints.POLICY_VERSION_HEADER in bad_header.json()["message"]
    )

    partial = post_weights(
        url, content=state_bytes(models["b"], drop), headers=octet, params={"partial": "true"}
    )
    assert partial.status_code == 200 and partial.json()["tensors"] == 25
    assert generate(url)[1] == "1"


def test_pause_resume_and_update_while_paused(
    fresh: tuple[str, serve.Engine], models: dict[str, Path]
) -> None:
    url, _ = fresh
    tokens_a, _ = generate(url)
    paused = httpx.post(f"{url}/openforge/v1/pause", timeout=30).json()
    assert paused["paused"] is True
    results: list[tuple[list[int], str]] = []
    waiter = threading.Thread(target=lambda: results.append(generate(url)))
    waiter.start()
    deadline = time.monotonic() + 30
    while httpx.get(f"{url}/openforge/v1/status").json()["waiting"] != 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.2)
    assert not results  # held while paused
    update = post_weights(url, json={"path": str(models["b"]), "policy_version": 2})
    assert update.json()["policy_version"] == 2
    drain_refused = post_weights(url, json={"path": str(models["b"]), "drain": True})
    assert drain_refused.status_code == 409
    assert httpx.get(f"{url}/openforge/v1/status").json()["paused"] is True
    assert httpx.post(f"{url}/openforge/v1/resume", timeout=30).json()["paused"] is False
    waiter.join(timeout=60)
    tokens, version = results[0]
    assert version == "2" and tokens != tokens_a  # its first token came from the new weights


LONG = {
    "model": NAME,
    "prompt": PROMPT,
    "max_tokens": 300,
    "temperature": 0,
    "return_token_ids": True,
    "stream_options": {"include_usage": True},
}


def stream_ids(lines: list[str]) -> list[int]:
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    return [t for c in chunks if c["choices"] for t in c["choices"][0]["token_ids"]]


def wait_until(condition: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_in_flight_stream_continues_on_new_weights(
    fresh: tuple[str, serve.Engine], models: dict[str, Path]
) -> None:
    url, _ = fresh
    full_a = ok(url, **LONG)["choices"][0]["token_ids"]
    with httpx.stream("POST", f"{url}/v1/completions", json={**LONG, "stream": True}) as response:
        lines = response.iter_lines()
        first = next(lines)
        assert response.headers[endpoints.POLICY_VERSION_HEADER] == "0"
        assert httpx.post(f"{url}/openforge/v1/pause", timeout=30).json()["running"] == 1
        update = post_weights(url, json={"path": str(models["b"]), "policy_version": 4})
        assert update.json()["policy_version"] == 4
        httpx.post(f"{url}/openforge/v1/resume", timeout=30)
        rest = list(lines)
    ids = stream_ids([first, *rest])
    assert len(ids) == 300 and ids[0] == full_a[0]
    assert ids != full_a  # the tokens after the swap came from the new weights
    usage = json.loads(next(line for line in rest if '"choices": []' in line)[6:])
    assert usage["openforge_policy_version"] == 0  # the version of its first token
    assert generate(url)[1] == "4"


def test_drain_update_waits_for_the_stream_and_holds_new_requests(
    fresh: tuple[str, serve.Engine], models: dict[str, Path]
) -> None:
    url, _ = fresh
    full_a = ok(url, **LONG)["choices"][0]["token_ids"]
    outcome: dict[str, Any] = {}

    def update() -> None:
        body = {"path": str(models["b"]), "policy_version": 4, "drain": True}
        outcome["update"] = post_weights(url, json=body).json()

    def newcomer() -> None:
        outcome["newcomer"] = generate(url)

    threads = [threading.Thread(target=update), threading.Thread(target=newcomer)]
    with httpx.stream("POST", f"{url}/v1/completions", json={**LONG, "stream": True}) as response:
        lines = response.iter_lines()
        first = next(lines)
        threads[0].start()
        wait_until(lambda: "update" in outcome or status(url)["draining"] == 1)
        threads[1].start()  # arrives during the drain: must wait for the new weights
        wait_until(lambda: "update" in outcome or status(url)["waiting"] == 1)
        rest = list(lines)
    for thread in threads:
        thread.join(timeout=60)
    assert stream_ids([first, *rest]) == full_a  # the whole request ran on the old weights
    assert outcome["update"]["policy_version"] == 4
    assert outcome["newcomer"][1] == "4"


def status(url: str) -> dict[str, Any]:
    result: dict[str, Any] = httpx.get(f"{url}/openforge/v1/status").json()
    return result


def test_a_client_that_leaves_mid_stream_stops_its_generation(
    fresh: tuple[str, serve.Engine],
) -> None:
    url, engine = fresh
    body = {**LONG, "max_tokens": 2000, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body) as response:
        next(response.iter_lines())
    wait_until(lambda: status(url)["running"] == 0)
    assert engine.scheduler.steps < 1000  # dropped long before its 2000 tokens
    assert generate(url)[1] == "0"  # and the server goes on serving


# --- the command ------------------------------------------------------------------


def test_cli_serves_and_stops_on_sigterm(models: dict[str, Path]) -> None:
    port = _free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "openforge_trainer.serving.server",
            "--model",
            str(models["a"]),
            "--port",
            str(port),
            "--threads",
            "1",
            "--model-name",
            NAME,
            "--policy-version",
            "8",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"},
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode()
        assert line == (
            f"openforge serve: serving {NAME} on http://127.0.0.1:{port} (torch threads: 1)\n"
        )
        tokens, version = generate(f"http://127.0.0.1:{port}")
        assert version == "8" and len(tokens) == 12
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
    stderr = process.stderr.read() if process.stderr else b""
    assert code == 0, stderr.decode(errors="replace")[-4000:]
    assert b"Loading weights" not in stderr


def test_cli_refuses_a_directory_without_tokenizer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert serve.main(["--model", str(tmp_path), "--port", "0"]) == 1
    assert f"model directory {tmp_path} has no tokenizer.json" in capsys.readouterr().err


def test_sliding_window_models_are_refused(tmp_path: Path) -> None:
    config = Qwen2Config(
        vocab_size=4096,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        use_sliding_window=True,
        sliding_window=8,
        max_window_layers=1,
    )
    Qwen2ForCausalLM(config).save_pretrained(tmp_path)
    for name in serve.TOKENIZER_FILES:
        shutil.copy(ASSETS / name, tmp_path / name)
    with pytest.raises(ValueError, match="full-attention models only"):
        serve.Engine(serve.ServeConfig(model_dir=tmp_path))


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
