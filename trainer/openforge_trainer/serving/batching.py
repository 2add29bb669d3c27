"""Continuous batching: one scheduler thread decodes every running request together.

Requests join and leave the running batch between steps. A step is: drop the
requests whose clients went away; prefill each newly admitted request on its
own (batch of one, no padding) and sample its first token; merge the new
requests' KV caches into the running batch; run one batched decode forward
for the whole batch; sample each row's next token; retire the rows that
finished. Every token goes to its request's event queue as soon as its step
has sampled it, so a streaming client sees it at once.

**The batch layout** is one ``DynamicCache`` for the running batch, *left
padded*: row ``i`` holds its request's keys and values right-aligned, and an
attention mask marks the padding. Each decode step feeds one token per row
with explicit ``position_ids`` (the request's own token count, so rotary
embeddings see the positions the request would have alone) and the mask
extended by one column. Masked keys get exactly zero attention weight, so a
row computes what it would compute alone up to floating-point reduction order
(``tests/trainer/serving/test_batching.py`` checks greedy tokens are identical and
logprobs within 1e-4 alone and in a batch of 8). We chose this over per-request
caches stacked per step because the stacking would copy every cache on every
step, while the shared padded cache is only rebuilt when the batch's
membership changes (a join pads the shorter side once; a leave drops the row
and trims columns that became padding in every row). Prefill stays unpadded
and per request, so a prompt's first token does not depend on its neighbours
at all; the cost is that a long prompt delays the next decode step by its
prefill time (there is no chunked prefill).

**Sampling and logprobs.** Greedy when ``temperature`` is 0; otherwise the
logits are divided by the temperature, cut to the smallest set of tokens
whose probability reaches ``top_p``, and sampled with the request's own
``torch.Generator`` (seeded from ``seed`` when given, so a seeded request is
reproducible whatever else is running). The logprob reported for a token is
the *raw* one, like vLLM's default ``logprobs_mode="raw_logprobs"``:
``log_softmax`` of the model's logits at temperature 1, before temperature
and top-p, computed in float32. That is exactly what a trainer recomputes
with a full forward pass over prompt + completion.

**Weights change between steps** (:meth:`Scheduler.update`). The scheduler
holds at the next step boundary, the caller copies the new tensors in place,
the policy version moves on, and decoding resumes. In-flight requests keep
their KV caches (computed by the old weights) and continue with the new
weights; a request's policy version is that of the weights that produced its
*first* token. With ``drain`` the scheduler instead stops admitting requests
and the update waits for the running ones to finish, so no request mixes two
policies.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

LOGPROB_FLOOR = -9999.0  # vLLM clamps -inf logprobs to this in responses


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: frozenset[int] = frozenset()
    top_logprobs: int = 0  # alternatives reported per token, besides the sampled one


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One sampled token; the last event of a finished request has ``finish_reason``."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # the top_logprobs best (token, logprob), best first
    finish_reason: str | None
    stop_reason: int | str | None  # a stop token id, or (set by the server) a stop string
    policy_version: int  # the weights that produced the request's first token


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    """The request failed; no more events follow."""

    message: str


Event = TokenEvent | ErrorEvent


class SchedulerError(RuntimeError):
    """A control request the scheduler cannot honour in its current state."""


class Sequence:
    """One request's generation state, shared between its HTTP thread and the scheduler."""

    def __init__(
        self, prompt_ids: list[int], params: SamplingParams, *, device: torch.device
    ) -> None:
        self.prompt_ids = list(prompt_ids)
        self.params = params
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.output: list[int] = []
        self.policy_version = -1
        self.cancelled = False
        self.generator: torch.Generator | None = None
        if params.seed is not None:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(params.seed)

    def cancel(self) -> None:
        """Ask the scheduler to drop this request at the next step boundary."""
        self.cancelled = True

    @property
    def cached(self) -> int:
        """Tokens in this request's KV cache: all but the last sampled one."""
        return len(self.prompt_ids) + len(self.output) - 1


class Scheduler:
    """Runs generation for every submitted request on one thread."""

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        eos_token_id: int | None,
        extra_stop_ids: Iterable[int] = (),
        max_batch: int = 32,
        max_model_len: int,
        policy_version: int = 0,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch: must be at least 1, got {max_batch}")
        self.model = model
        self.device = model.device
        self.eos_token_id = eos_token_id
        self.extra_stop_ids = frozenset(extra_stop_ids) - {eos_token_id}
        self.max_batch = max_batch
        self.max_model_len = max_model_len
        self._version = policy_version
        self._batch = _Batch(self.device)
        self._waiting: deque[Sequence] = deque()
        self._cv = threading.Condition()
        self._stepping = False
        self._paused = False
        self._holds = 0
        self._draining = 0
        self._running = 0
        self._peak = 0
        self._stopping = False
        self._update_lock = threading.Lock()
        self._rng = torch.Generator(device=self.device)
        self._rng.seed()
        self._thread = threading.Thread(target=self._loop, name="openforge-scheduler", daemon=True)
        self.steps = 0

    # --- control, from any thread ------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop after the current step; waiting and running requests fail."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def policy_version(self) -> int:
        with self._cv:
            return self._version

    @property
    def paused(self) -> bool:
        with self._cv:
            return self._paused

    def load(self) -> dict[str, int]:
        """Request counts: running, waiting, the most ever running at once; drains pending."""
        with self._cv:
            return {
                "running": self._running,
                "waiting": len(self._waiting),
                "peak_running": self._peak,
                "draining": self._draining,
            }

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> Sequence:
        """Queue a request; its tokens arrive on the returned sequence's ``events``."""
        seq = Sequence(prompt_ids, params, device=self.device)
        with self._cv:
            if self._stopping:
                raise SchedulerError("the server is shutting down")
            self._waiting.append(seq)
            self._cv.notify_all()
        return seq

    def pause(self) -> None:
        """Stop stepping at the next step boundary; returns once the scheduler is there."""
        with self._cv:
            self._paused = True
            self._cv.wait_for(lambda: not self._stepping)

    def resume(self) -> None:
        with self._cv:
            self._paused = False
            self._cv.notify_all()

    def update(
        self, apply: Callable[[], None], *, policy_version: int | None, drain: bool
    ) -> tuple[int, float]:
        """Run ``apply`` (the weight copy) at a step boundary; move the policy version on.

        Returns the new policy version and the milliseconds spent waiting for
        the boundary (or, with ``drain``, for the running requests to finish).
        """
        with self._update_lock:
            start = time.perf_counter()
            with self._cv:
                if drain and self._paused:
                    raise SchedulerError(
                        "drain: the scheduler is paused, so running requests cannot finish; "
                        "resume first or update without drain"
                    )
                self._draining += drain
                try:
                    self._cv.wait_for(
                        lambda: (
                            self._stopping
                            or (not self._stepping and (not drain or self._running == 0))
                        )
                    )
                finally:
                    self._draining -= drain
                if self._stopping:
                    raise SchedulerError("the server is shutting down")
                self._holds += 1
            waited_ms = (time.perf_counter() - start) * 1000.0
            try:
                apply()
                with self._cv:
                    self._version = self._version + 1 if policy_version is None else policy_version
                    return self._version, waited_ms
            finally:
                with self._cv:
                    self._holds -= 1
                    self._cv.notify_all()

    # --- the scheduler thread ------------------------------------------------------

    def _has_work(self) -> bool:
        if self._stopping:
            return True
        if self._paused or self._holds:
            return False
        return bool(self._batch.seqs) or (bool(self._waiting) and not self._draining)

    def _loop(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(self._has_work)
                if self._stopping:
                    break
                admitted: list[Sequence] = []
                if not self._draining:
                    room = self.max_batch - len(self._batch.seqs)
                    while self._waiting and len(admitted) < room:
                        admitted.append(self._waiting.popleft())
                version = self._version
                self._stepping = True
            try:
                with torch.inference_mode():
                    self._step(admitted, version)
            except Exception as error:  # a failed step fails its requests, not the server
                self._fail([*self._batch.seqs, *admitted], f"generation failed: {error!r}")
                self._batch = _Batch(self.device)
            finally:
                with self._cv:
                    self._stepping = False
                    self._running = len(self._batch.seqs)
                    self._peak = max(self._peak, self._batch.peak)
                    self.steps += 1
                    self._cv.notify_all()
        with self._cv:
            pending = list(self._waiting)
            self._waiting.clear()
        self._fail([*self._batch.seqs, *pending], "the server is shutting down")
        self._batch = _Batch(self.device)

    def _step(self, admitted: list[Sequence], version: int) -> None:
        self._batch.keep([not seq.cancelled for seq in self._batch.seqs])
        joined: list[tuple[Sequence, list[tuple[torch.Tensor, torch.Tensor]]]] = []
        for seq in admitted:
            if seq.cancelled:
                continue
            seq.policy_version = version
            logits, layers = self._prefill(seq)
            if not self._emit([seq], logits)[0]:
                joined.append((seq, layers))
        self._batch.join(joined)
        self._batch.peak = max(self._batch.peak, len(self._batch.seqs))
        if self._batch.seqs:
            logits = self._batch.decode(self.model)
            done = self._emit(self._batch.seqs, logits)
            self._batch.keep([not finished for finished in done])

    def _prefill(
        self, seq: Sequence
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        ids = torch.tensor([seq.prompt_ids], dtype=torch.long, device=self.device)
        out = self.model(input_ids=ids, use_cache=True)
        return out.logits[:, -1, :], _cache_layers(out.past_key_values)

    def _emit(self, seqs: list[Sequence], logits: torch.Tensor) -> list[bool]:
        """Sample each row's token, send it as an event; return which requests finished."""
        logits = logits.float()
        logprobs = torch.log_softmax(logits, dim=-1)
        tokens = self._sample(seqs, logits)
        chosen = logprobs.gather(1, tokens[:, None])[:, 0].tolist()
        k = max(seq.params.top_logprobs for seq in seqs)
        top_values: list[list[float]] = []
        top_ids: list[list[int]] = []
        if k:
            best = torch.topk(logprobs, k, dim=-1)
            top_values, top_ids = best.values.tolist(), best.indices.tolist()
        finished = []
        for i, (seq, token) in enumerate(zip(seqs, tokens.tolist(), strict=True)):
            seq.output.append(token)
            reason, stop_reason = self._finish(seq, token)
            top: tuple[tuple[int, float], ...] = ()
            if seq.params.top_logprobs:
                n = seq.params.top_logprobs
                top = tuple(
                    (t, max(v, LOGPROB_FLOOR))
                    for t, v in zip(top_ids[i][:n], top_values[i][:n], strict=True)
                )
            seq.events.put(
                TokenEvent(
                    token_id=token,
                    logprob=max(chosen[i], LOGPROB_FLOOR),
                    top=top,
                    finish_reason=reason,
                    stop_reason=stop_reason,
                    policy_version=seq.policy_version,
                )
            )
            finished.append(reason is not None)
        return finished

    def _sample(self, seqs: list[Sequence], logits: torch.Tensor) -> torch.Tensor:
        tokens = torch.argmax(logits, dim=-1)
        for i, seq in enumerate(seqs):
            if seq.params.temperature > 0:
                generator = seq.generator or self._rng
                tokens[i] = sample(logits[i], seq.params, generator=generator)
        return tokens

    def _finish(self, seq: Sequence, token: int) -> tuple[str | None, int | None]:
        """vLLM's stop check, in its order: length first, then EOS, then stop tokens."""
        if len(seq.output) >= seq.params.max_tokens or seq.cached + 1 >= self.max_model_len:
            return "length", None
        if token == self.eos_token_id:
            return "stop", None
        if token in seq.params.stop_token_ids or token in self.extra_stop_ids:
            return "stop", token
        return None, None

    def _fail(self, seqs: list[Sequence], message: str) -> None:
        for seq in seqs:
            seq.events.put(ErrorEvent(message))


def sample(logits: torch.Tensor, params: SamplingParams, *, generator: torch.Generator) -> int:
    """One token from float32 ``logits`` ``[vocab]``: temperature, then top-p, then a draw."""
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1.0:
        ordered, order = torch.sort(probs, descending=True)
        before = torch.cumsum(ordered, dim=-1) - ordered  # mass of the better tokens
        ordered = ordered.masked_fill(before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(0, order, ordered)
    return int(torch.multinomial(probs, 1, generator=generator).item())


class _Batch:
    """The running requests and their shared, left-padded KV cache."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seqs: list[Sequence] = []
        self.cache: DynamicCache | None = None
        self.mask = torch.zeros((0, 0), dtype=torch.long, device=device)
        self.peak = 0

    def join(self, joined: list[tuple[Sequence, list[tuple[torch.Tensor, torch.Tensor]]]]) -> None:
        """Add prefilled requests, padding old and new rows on the left to one length."""
        if not joined:
            return
        parts = [
            (layers, torch.ones(len(seq.prompt_ids), dtype=torch.long, device=self.device))
            for seq, layers in joined
        ]
        if self.cache is not None:
            parts.insert(0, (_cache_layers(self.cache), self.mask))
        width = max(mask.shape[-1] for _, mask in parts)
        masks, columns = [], []
        for layers, mask in parts:
            pad = width - mask.shape[-1]
            masks.append(F.pad(mask.reshape(-1, mask.shape[-1]), (pad, 0)))
            columns.append(
                [(F.pad(k, (0, 0, pad, 0)), F.pad(v, (0, 0, pad, 0))) for k, v in layers]
            )
        merged = [
            (torch.cat([c[i][0] for c in columns]), torch.cat([c[i][1] for c in columns]))
            for i in range(len(columns[0]))
        ]
        self.mask = torch.cat(masks)
        self.cache = DynamicCache(merged)
        self.seqs = [*self.seqs, *(seq for seq, _ in joined)]

    def keep(self, rows: list[bool]) -> None:
        """Keep only the flagged rows; trim columns that are padding in every row left."""
        if all(rows):
            return
        self.seqs = [seq for seq, kept in zip(self.seqs, rows, strict=True) if kept]
        if not self.seqs or self.cache is None:
            self.cache = None
            self.mask = torch.zeros((0, 0), dtype=torch.long, device=self.device)
            return
        index = torch.tensor(
            [i for i, kept in enumerate(rows) if kept], dtype=torch.long, device=self.device
        )
        mask = self.mask[index]
        first = int(mask.any(dim=0).long().argmax().item())
        self.mask = mask[:, first:]
        layers = [(k[index, :, first:], v[index, :, first:]) for k, v in _cache_layers(self.cache)]
        self.cache = DynamicCache(layers)

    def decode(self, model: PreTrainedModel) -> torch.Tensor:
        """One forward step for every row; the next-token logits ``[rows, vocab]``."""
        tokens = torch.tensor([[seq.output[-1]] for seq in self.seqs], device=self.device)
        positions = torch.tensor([[seq.cached] for seq in self.seqs], device=self.device)
        column = torch.ones((len(self.seqs), 1), dtype=torch.long, device=self.device)
        self.mask = torch.cat([self.mask, column], dim=1)
        out = model(
            input_ids=tokens,
            attention_mask=self.mask,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
        )
        self.cache = out.past_key_values
        logits: torch.Tensor = out.logits[:, -1, :]
        return logits


def _cache_layers(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's ``(keys, values)``, ``[batch, kv_heads, length, head_dim]``.

    transformers' ``DynamicLayer`` keeps them as ``keys``/``values``
    attributes; this is the one place that relies on it. Other layer kinds
    (sliding-window, linear attention) do not fit a left-padded batch.
    """
    layers = []
    for index, layer in enumerate(cache.layers):
        if type(layer) is not DynamicLayer or layer.keys is None or layer.values is None:
            raise TypeError(
                f"cache layer {index} is a {type(layer).__name__}; openforge serve batches "
                "full-attention layers (DynamicLayer) only"
            )
        layers.append((layer.keys, layer.values))
    return layers
