"""The continuous-batching scheduler on a real tiny Qwen2 model, without HTTP."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from openforge_trainer.serving import batching, weights
from transformers import PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

torch.set_num_threads(1)


def tiny_model(seed: int) -> PreTrainedModel:
    """The tiny Qwen2 the serve tests use; a large init spread makes greedy outputs vary."""
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
        initializer_range=0.3,
    )
    model = Qwen2ForCausalLM(config)
    model.eval()
    model.requires_grad_(False)
    return model


@pytest.fixture(scope="module")
def model() -> PreTrainedModel:
    return tiny_model(0)


@pytest.fixture
def scheduler(model: PreTrainedModel) -> Iterator[batching.Scheduler]:
    running = batching.Scheduler(model, eos_token_id=None, max_batch=32, max_model_len=2048)
    running.start()
    yield running
    running.stop()


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(4096) for _ in range(rng.randrange(3, 60))] for _ in range(count)]


def greedy(max_tokens: int, **extra: object) -> batching.SamplingParams:
    return batching.SamplingParams(max_tokens=max_tokens, temperature=0.0, **extra)  # type: ignore[arg-type]


def drain(seq: batching.Sequence) -> list[batching.TokenEvent]:
    events: list[batching.TokenEvent] = []
    while not events or events[-1].finish_reason is None:
        event = seq.events.get(timeout=30)
        assert isinstance(event, batching.TokenEvent), event
        events.append(event)
    return events


def tokens(events: list[batching.TokenEvent]) -> list[int]:
    return [e.token_id for e in events]


def logprobs(events: list[batching.TokenEvent]) -> list[float]:
    return [e.logprob for e in events]


def test_greedy_is_batch_invariant_with_joins_and_leaves(scheduler: batching.Scheduler) -> None:
    cases = prompts(8)
    lengths = [4 + 3 * i for i in range(8)]  # different lengths: rows leave at different steps
    alone = [drain(scheduler.submit(p, greedy(n))) for p, n in zip(cases, lengths, strict=True)]
    # Half start together; the rest join while the first ones are mid-generation.
    first = [scheduler.submit(p, greedy(n)) for p, n in zip(cases[:4], lengths[:4], strict=True)]
    first[0].events.get(timeout=30)  # the batch is running (one token consumed below)
    late = [scheduler.submit(p, greedy(n)) for p, n in zip(cases[4:], lengths[4:], strict=True)]
    together = [drain(seq) for seq in [*first, *late]]
    assert scheduler.load()["peak_running"] >= 5
    # first[0]'s first event was taken above; compare its remaining tokens.
    pairs = [(alone[0][1:], together[0]), *zip(alone[1:], together[1:], strict=True)]
    for solo, batched in pairs:
        assert tokens(solo) == tokens(batched)
        assert (
            max(abs(a - b) for a, b in zip(logprobs(solo), logprobs(batched), strict=True)) < 1e-4
        )
    assert len({tuple(tokens(e)) for e in alone}) == 8  # the outputs are not degenerate


def test_logprobs_are_the_full_forward_log_softmax(
    model: PreTrainedModel, scheduler: batching.Scheduler
) -> None:
    prompt = prompts(1, seed=3)[0]
    params = batching.SamplingParams(max_tokens=12, temperature=0.7, top_p=0.9, seed=5)
    events = drain(scheduler.submit(prompt, params))
    ids = torch.tensor([prompt + tokens(events)])
    with torch.no_grad():
        full = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    expected = [full[len(prompt) - 1 + i, t].item() for i, t in enumerate(tokens(events))]
    assert max(abs(a - b) for a, b in zip(expected, logprobs(events), strict=True)) < 1e-5


def test_top_logprobs_are_the_best_tokens(scheduler: batching.Scheduler) -> None:
    events = drain(scheduler.submit(prompts(1)[0], greedy(3, top_logprobs=4)))
    for event in events:
        assert len(event.top) == 4
        assert event.top[0] == (event.token_id, pytest.approx(event.logprob))  # greedy: the best
        values = [v for _, v in event.top]
        assert values == sorted(values, reverse=True)


def test_seeded_sampling_is_reproducible_alone_and_in_a_batch(
    scheduler: batching.Scheduler,
) -> None:
    prompt = prompts(1, seed=7)[0]
    params = batching.SamplingParams(max_tokens=16, temperature=1.0, seed=1234)
    alone = tokens(drain(scheduler.submit(prompt, params)))
    crowd = [scheduler.submit(p, greedy(16)) for p in prompts(6, seed=8)]
    seeded = scheduler.submit(prompt, params)
    assert tokens(drain(seeded)) == alone
    for seq in crowd:
        drain(seq)
    other = tokens(drain(scheduler.submit(prompt, batching.SamplingParams(16, seed=99))))
    assert other != alone


def test_tiny_top_p_is_greedy(scheduler: batching.Scheduler) -> None:
    prompt = prompts(1, seed=11)[0]
    expected = tokens(drain(scheduler.submit(prompt, greedy(10))))
    nucleus = batching.SamplingParams(max_tokens=10, temperature=1.5, top_p=1e-6, seed=3)
    assert tokens(drain(scheduler.submit(prompt, nucleus))) == expected


def test_sample_draws_only_from_the_nucleus() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    generator = torch.Generator().manual_seed(0)
    params = batching.SamplingParams(max_tokens=1, temperature=1.0, top_p=0.7)
    drawn = {batching.sample(logits, params, generator=generator) for _ in range(300)}
    assert drawn == {0, 1}  # 0.5 < 0.7 needs the second token; the third is never needed
    everything = batching.SamplingParams(max_tokens=1, temperature=1.0, top_p=1.0)
    assert {batching.sample(logits, everything, generator=generator) for _ in range(500)} == {
        0,
        1,
        2,
        3,
    }


def test_stop_order_length_then_eos_then_stop_tokens(model: PreTrainedModel) -> None:
    prompt = prompts(1, seed=5)[0]
    probe = batching.Scheduler(model, eos_token_id=None, max_model_len=2048)
    probe.start()
    free = tokens(drain(probe.submit(prompt, greedy(8))))
    probe.stop()
    eos = free[3]
    assert eos not in free[:3]
    scheduler = batching.Scheduler(model, eos_token_id=eos, max_model_len=2048)
    scheduler.start()
    try:
        stopped = drain(scheduler.submit(prompt, greedy(8)))
        assert tokens(stopped) == free[:4]
        assert (stopped[-1].finish_reason, stopped[-1].stop_reason) == ("stop", None)
        # max_tokens reached on the EOS token itself: length wins, as in vLLM.
        capped = drain(scheduler.submit(prompt, greedy(4)))
        assert (capped[-1].finish_reason, capped[-1].stop_reason) == ("length", None)
        stop_id = free[1]
        by_id = drain(scheduler.submit(prompt, greedy(8, stop_token_ids=frozenset({stop_id}))))
        assert tokens(by_id) == free[:2]
        assert (by_id[-1].finish_reason, by_id[-1].stop_reason) == ("stop", stop_id)
        assert all(e.finish_reason is None for e in by_id[:-1])
    finally:
        scheduler.stop()


def test_max_model_len_caps_generation(model: PreTrainedModel) -> None:
    scheduler = batching.Scheduler(model, eos_token_id=None, max_model_len=20)
    scheduler.start()
    try:
        events = drain(scheduler.submit(list(range(100, 115)), greedy(100)))
        assert len(events) == 5 and events[-1].finish_reason == "length"
    finally:
        scheduler.stop()


def test_max_batch_bounds_the_running_batch(model: PreTrainedModel) -> None:
    scheduler = batching.Scheduler(model, eos_token_id=None, max_batch=2, max_model_len=2048)
    scheduler.start()
    try:
        seqs = [scheduler.submit(p, greedy(6)) for p in prompts(5)]
        for seq in seqs:
            assert len(drain(seq)) == 6
        assert scheduler.load()["peak_running"] == 2
    finally:
        scheduler.stop()


def test_cancelled_request_leaves_the_batch(scheduler: batching.Scheduler) -> None:
    keep, gone = prompts(2, seed=21)
    expected = tokens(drain(scheduler.submit(keep, greedy(20))))
    dropped = scheduler.submit(gone, greedy(500))
    kept = scheduler.submit(keep, greedy(20))
    dropped.events.get(timeout=30)
    dropped.cancel()
    assert tokens(drain(kept)) == expected
    time.sleep(0.05)
    assert scheduler.load()["running"] == 0


def test_pause_holds_requests_until_resume(scheduler: batching.Scheduler) -> None:
    scheduler.pause()
    assert scheduler.paused
    seq = scheduler.submit(prompts(1)[0], greedy(3))
    time.sleep(0.2)
    assert seq.events.empty()
    assert scheduler.load()["waiting"] == 1
    scheduler.resume()
    assert len(drain(seq)) == 3


def test_update_mid_request_keeps_the_cache_and_moves_the_version(
    scheduler: batching.Scheduler, model: PreTrainedModel
) -> None:
    prompt = prompts(1, seed=31)[0]
    before = tokens(drain(scheduler.submit(prompt, greedy(200))))
    original = {k: v.clone() for k, v in model.state_dict().items()}
    other = tiny_model(1).state_dict()
    seq = scheduler.submit(prompt, greedy(200))
    head = [seq.events.get(timeout=30)]
    scheduler.pause()  # freeze it mid-request: everything emitted so far is in its queue
    head += [seq.events.get() for _ in range(seq.events.qsize())]
    assert all(isinstance(e, batching.TokenEvent) for e in head) and len(head) < 200
    version, _ = scheduler.update(
        lambda: weights.apply(weights.plan(model, other)), policy_version=None, drain=False
    )
    scheduler.resume()
    try:
        events = [*head, *drain(seq)]
        assert version == 1 and scheduler.policy_version == 1
        assert all(e.policy_version == 0 for e in events)  # the first token's version
        assert len(events) == 200 and events[-1].finish_reason == "length"
        assert tokens(events)[: len(head)] == before[: len(head)]
        assert tokens(events)[len(head) :] != before[len(head) :]  # from the new weights
        fresh = drain(scheduler.submit(prompt, greedy(3)))
        assert fresh[0].policy_version == 1
    finally:
        scheduler.update(
            lambda: weights.apply(weights.plan(model, original)), policy_version=0, drain=False
        )


def test_drain_update_waits_for_running_requests_and_admits_none(
    scheduler: batching.Scheduler, model: PreTrainedModel
) -> None:
    prompt = prompts(1, seed=41)[0]
    before = tokens(drain(scheduler.submit(prompt, greedy(200))))
    original = {k: v.clone() for k, v in model.state_dict().items()}
    other = tiny_model(2).state_dict()
    running = scheduler.submit(prompt, greedy(200))
    running.events.get(timeout=30)
    applied = threading.Event()

    def swap() -> None:
        weights.apply(weights.plan(model, other))
        applied.set()

    updater = threading.Thread(
        target=scheduler.update, args=(swap,), kwargs={"policy_version": 9, "drain": True}
    )
    updater.start()
    deadline = time.monotonic() + 30
    while not (scheduler.load()["draining"] or applied.is_set()):
        assert time.monotonic() < deadline
        time.sleep(0.001)
    newcomer = scheduler.submit(prompt, greedy(5))
    rest = drain(running)
    updater.join(timeout=30)
    try:
        assert applied.is_set()
        assert tokens(rest) == before[1:]  # no token of it came from the new weights
        late = drain(newcomer)
        assert late[0].policy_version == 9
        assert tokens(late) != before[:5]
    finally:
        scheduler.update(
            lambda: weights.apply(weights.plan(model, original)), policy_version=0, drain=False
        )


def test_drain_while_paused_is_refused(scheduler: batching.Scheduler) -> None:
    scheduler.pause()
    try:
        with pytest.raises(batching.SchedulerError, match="drain"):
            scheduler.update(lambda: None, policy_version=None, drain=True)
    finally:
        scheduler.resume()


def test_stop_fails_waiting_requests(model: PreTrainedModel) -> None:
    scheduler = batching.Scheduler(model, eos_token_id=None, max_model_len=2048)
    scheduler.start()
    scheduler.pause()
    seq = scheduler.submit([5, 6, 7], greedy(3))
    scheduler.stop()
    event = seq.events.get(timeout=5)
    assert isinstance(event, batching.ErrorEvent) and "shutting down" in event.message
    with pytest.raises(batching.SchedulerError):
        scheduler.submit([5], greedy(1))


def test_a_failing_step_fails_its_requests_not_the_scheduler(
    scheduler: batching.Scheduler,
) -> None:
    bad = scheduler.submit([5000], greedy(2))  # outside the embedding table
    event = bad.events.get(timeout=30)
    assert isinstance(event, batching.ErrorEvent) and "generation failed" in event.message
    assert len(drain(scheduler.submit([5, 6], greedy(2)))) == 2


def test_weights_plan_refuses_unknown_and_misshapen_tensors(model: PreTrainedModel) -> None:
    state = {k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    weights.plan(model, state)  # the tied lm_head is covered by the embeddings
    with pytest.raises(weights.WeightsError, match=r"tensor model\.bogus\.weight"):
        weights.plan(model, {**state, "model.bogus.weight": torch.zeros(1)})
    name = "model.layers.1.mlp.up_proj.weight"
    with pytest.raises(weights.WeightsError, match=rf"tensor {name}: shape \[2, 2\]"):
        weights.plan(model, {**state, name: torch.zeros(2, 2)})
    del state[name]
    with pytest.raises(weights.WeightsError, match=rf"tensor {name}: missing"):
        weights.plan(model, state)
    assert weights.plan(model, state, partial=True).names == tuple(sorted(state))


def test_weights_read_path_forms(tmp_path: Path, model: PreTrainedModel) -> None:
    model.save_pretrained(tmp_path / "single")
    single = weights.read_path(tmp_path / "single")
    assert set(single) <= set(model.state_dict())
    assert weights.read_path(tmp_path / "single" / "model.safetensors").keys() == single.keys()
    model.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert weights.read_path(tmp_path / "sharded").keys() == single.keys()
    with pytest.raises(weights.WeightsError, match="neither"):
        weights.read_path(tmp_path / "nowhere")
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(weights.WeightsError, match=r"junk\.safetensors"):
        weights.read_path(tmp_path / "junk.safetensors")
    with pytest.raises(weights.WeightsError, match="not a safetensors"):
        weights.read_bytes(b"\x00" * 16)
