"""The relay on its own: the engine's whole answer in, the harness's answer out."""

from __future__ import annotations

import json
from array import array
from pathlib import Path

import pytest
import tiny_policy
from openforge.wire import codecs
from openforge_sidecar import relay
from openforge_sidecar.policy import stored, template

PROMPT = array("i", ((i * 7919) % 5_000 for i in range(30_000)))  # an echo of ~150 KB


def _answer(echoed: list[int]) -> bytes:
    first = {"index": 0, "text": "Hi", "token_ids": [72], "prompt_token_ids": echoed}
    first["logprobs"] = {"token_logprobs": [-0.5]}
    last = {"index": 0, "text": "", "token_ids": [2], "finish_reason": "stop"}
    last["logprobs"] = {"token_logprobs": [-0.1]}
    events = [{"choices": [first]}, {"choices": [last]}]
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + (
        b"data: [DONE]\n\n"
    )


def _relay(prompt_ids: stored.Ids) -> relay.Relay:
    codec = codecs.for_path("/v1/chat/completions")
    assert codec is not None
    request = codec.parse_request(b'{"model": "p", "messages": [{"role": "user", "content": "x"}]}')
    tokenizer = tiny_policy.load()
    return relay.Relay(
        codec=codec,
        request=request,
        detokenizer=template.IncrementalDetokenizer(tokenizer),
        stop_token_ids=tokenizer.stop_token_ids,
        prompt_ids=prompt_ids,
        response_id="chatcmpl-1",
        created=0,
    )


@pytest.mark.parametrize("in_file", [False, True])
@pytest.mark.parametrize(("echoed", "matches"), [(PROMPT.tolist(), True), ([1, 2, 3], False)])
def test_a_whole_answer_is_relayed_and_its_echo_compared(
    tmp_path: Path, in_file: bool, echoed: list[int], matches: bool
) -> None:
    planned: stored.Ids = PROMPT
    if in_file:
        planned = stored.StoredIds.write(tmp_path / "p.ids", PROMPT)
    answer = _relay(planned)
    body = json.loads(answer.whole(_answer(echoed)))
    assert body["choices"][0]["finish_reason"] == "stop" and answer.error is None
    assert answer.token_ids == [72, 2] and answer.echo_matches is matches


def test_a_planned_prompt_whose_file_is_gone_leaves_the_answer_whole(tmp_path: Path) -> None:
    """Its echo is not compared (the record will say the prompt is lost); the harness's
    answer is not failed for it: the relay ran inside mitmproxy's stream callable, where
    an exception ends the harness's connection."""
    planned = stored.StoredIds.write(tmp_path / "p.ids", PROMPT)
    planned.path.unlink()
    answer = _relay(planned)
    body = json.loads(answer.whole(_answer(PROMPT.tolist())))
    assert body["choices"][0]["message"]["content"] is not None and answer.error is None
    assert answer.echo_matches is None and "p.ids" in (answer.echo_unread or "")
