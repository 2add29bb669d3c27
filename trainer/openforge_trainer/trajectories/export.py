"""Turns a rollout's captured calls into veRL agent-loop-shaped training rows.

An agent turn's prompt is usually the previous turn's prompt, the previous
completion, and whatever the harness appended (tool results, a user turn).
Such calls form one *segment* and become one row: the first call's prompt,
then a response that interleaves the model's completions (mask 1, with their
logprobs) and the appended tokens (mask 0, logprob 0.0). This is the layout
veRL's agent loop produces (``prompt_ids``, ``response_ids``,
``response_mask``, ``response_logprobs``).

Which segment a call continues is decided here from the tokens, not trusted
from the sidecar's ``segment_index``: a call extends a segment exactly when its
``prompt_token_ids`` begin with that segment's last call's prompt +
completion. Every segment stays open, so conversations that interleave (a
harness's side call for a title, a sub-agent, a summary) each stay one row: a
call joins the segment it extends (the longest context, when several do), and
a call that extends none starts a segment. When the sidecar said "extends" and
the tokens disagree, the disagreement is counted (``split_on_mismatch``); a
harness that rewrites its history (compaction, edited turns) thus yields
several rows, each token-exact.

The rows of a rollout form a tree: a row's ``branch_of`` is the earlier row
whose tokens its prompt shares the longest prefix with, ``branch_tokens`` that
prefix's length (``-1`` and 0 for a row that shares no token with an earlier
one). A compaction shares most of its conversation's prompt, a sub-agent its
system prompt, a side call little or nothing. Rows are grouped into
*conversations* (``conversation``): a row begins one unless it rewrites the
conversation of the row it branches from, i.e. the sidecar found it related
(same system prompt or opening turn: not ``first`` or ``new_conversation``)
and that row took no call after it began (a sub-agent runs beside its parent,
a compaction replaces it). The merge rate is per conversation: calls that
extended an earlier call over calls after their conversation's first.

Only completed calls are training data (:mod:`outcome`: HTTP 200, no error,
a finish reason other than "error"). A call that was aborted (the harness
hung up mid-stream: its tokens are partial), refused (4xx) or errored is
dropped here, before segments are formed, and counted by kind (``aborted``,
``refused``, ``errored``); it stays in the store. Dropping it leaves a gap
that the tokens, not the call order, bridge: the next call joins the segment
only if its prompt begins with the *last completed* call's prompt +
completion, the same test as for any call. A harness that retries the failed
turn sends that same context again, so the retry extends the segment and the
row is token-exact without the failed call; whatever the harness appended in
between (even the partial answer it was shown) becomes masked prompt tokens,
never trained ones. A call that does not continue those tokens starts a new
segment, so two token histories are never spliced across a failure.

Completed calls without prompt tokens (passthrough capture without token IDs)
cannot be trained on either and are skipped, counted in ``untokenized``.

A row also carries the images its tokens show (``images``: URLs, base64
``data:`` URLs for inline images, exactly as the harness sent them), read
from the segment's last request (:mod:`request_images`): the *n*-th image
placeholder in ``prompt_ids + response_ids`` is ``images[n]``. That is
veRL's multimodal layout (an ``images`` column beside ``<image>``
placeholders for ``RLHFDataset``; ``multi_modal_data["images"]`` for the
agent loop, see :mod:`verl_agent_loop`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from openforge_trainer.collection import store as store_module
from openforge_trainer.trajectories import outcome, request_images


class ExportError(Exception):
    """A stored call cannot be turned into a row (names the field at fault)."""


@dataclasses.dataclass(frozen=True)
class Row:
    rollout_id: str
    job: str
    task_id: str
    sample_index: int
    segment_index: int  # 0-based, in the order segments were found in this rollout
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    reward: float
    has_reward: bool
    policy_version: int  # the oldest policy that produced any token of the row
    policy_versions: list[int]  # per call
    call_indices: list[int]
    num_turns: int  # model calls in the row
    images: list[str] = dataclasses.field(default_factory=list)  # in placeholder order
    branch_of: int = -1  # the earlier row this one's prompt shares the most tokens with
    branch_tokens: int = 0  # how many (0: none; then branch_of is -1)
    conversation: int = 0  # 0-based, in the order conversations began in this rollout

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class ExportStats:
    rollouts: int = 0
    calls: int = 0
    aborted: int = 0  # calls never trained, by kind (see outcome)
    errored: int = 0
    refused: int = 0
    untokenized: int = 0  # completed calls without prompt tokens
    extended: int = 0  # calls that extended an earlier call of their segment
    followers: int = 0  # completed, tokenized calls after their conversation's first one
    conversations: int = 0
    split_on_mismatch: int = 0  # sidecar said "extends", tokens said no
    merged_across_index: int = 0  # sidecar said "new segment", tokens extend
    rows: int = 0

    @property
    def merge_rate(self) -> float:
        """Calls that extended an earlier call / calls after their conversation's first
        (0 when none): a side conversation does not count against it, a rewrite does."""
        return self.extended / self.followers if self.followers else 0.0

    def failures(self) -> dict[str, int]:
        """The calls never trained, by kind: ``{"aborted": n, "errored": n, "refused": n}``."""
        return {kind: getattr(self, kind) for kind in outcome.FAILURES}

    def add(self, other: ExportStats) -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))


def extends(previous: store_module.ModelCall, call: store_module.ModelCall) -> bool:
    """Whether ``call``'s prompt begins with ``previous``'s prompt + completion."""
    context = previous.prompt_token_ids + previous.completion_token_ids
    return call.prompt_token_ids[: len(context)] == context


def segments(
    calls: Sequence[store_module.ModelCall],
) -> tuple[list[list[store_module.ModelCall]], ExportStats]:
    """Split the completed calls (in call order) into token-verified segments, each call
    into the open segment it extends (see the module's docstring)."""
    stats = ExportStats(calls=len(calls))
    result: list[list[store_module.ModelCall]] = []
    for call in sorted(calls, key=lambda c: c.call_index):
        kind = outcome.outcome(call)
        if kind != outcome.COMPLETED:
            setattr(stats, kind, getattr(stats, kind) + 1)
            continue
        if not call.prompt_token_ids:
            stats.untokenized += 1
            continue
        if not result:
            result.append([call])
            continue
        target = _extended(result, call)
        if target is not None:
            stats.extended += 1
            stats.merged_across_index += call.segment_index != target[-1].segment_index
            target.append(call)
        else:
            stats.split_on_mismatch += not call.segment_reason  # the sidecar said "extends"
            result.append([call])
    return result, stats


def _extended(
    found: Sequence[list[store_module.ModelCall]], call: store_module.ModelCall
) -> list[store_module.ModelCall] | None:
    """The segment whose last call ``call`` extends, the longest context of those it
    does; None when it extends none."""
    return max(
        (segment for segment in found if extends(segment[-1], call)),
        key=lambda s: len(s[-1].prompt_token_ids) + len(s[-1].completion_token_ids),
        default=None,
    )


def _branch(rows: Sequence[Row], prompt: Sequence[int]) -> tuple[int, int]:
    """(row index, shared tokens) of the row among ``rows`` whose tokens ``prompt`` shares
    the longest prefix with; (-1, 0) when it shares none."""
    best, shared = -1, 0
    for index, row in enumerate(rows):
        tokens = (*row.prompt_ids, *row.response_ids)
        length = 0
        for a, b in zip(prompt, tokens, strict=False):
            if a != b:
                break
            length += 1
        if length > shared:
            best, shared = index, length
    return best, shared


def build_row(
    rollout: store_module.Rollout, segment: Sequence[store_module.ModelCall], *, index: int
) -> Row:
    """One row from one segment (whose calls each extend the previous one)."""
    first = segment[0]
    response: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    previous: store_module.ModelCall | None = None
    for call in segment:
        if previous is not None:
            appended = call.prompt_token_ids[
                len(previous.prompt_token_ids) + len(previous.completion_token_ids) :
            ]
            response += appended
            mask += [0] * len(appended)
            logprobs += [0.0] * len(appended)
        response += call.completion_token_ids
        mask += [1] * len(call.completion_token_ids)
        logprobs += _logprobs(rollout, call)
        previous = call
    versions = [call.policy_version for call in segment]
    last = segment[-1]
    try:
        images = request_images.request_images(last.wire_api, last.request_json)
    except request_images.ImageError as exc:
        raise ExportError(f"rollout {rollout.rollout_id!r} call {last.call_index}: {exc}") from exc
    return Row(
        rollout_id=rollout.rollout_id,
        job=rollout.job,
        task_id=rollout.task_id,
        sample_index=rollout.sample_index,
        segment_index=index,
        prompt_ids=list(first.prompt_token_ids),
        response_ids=response,
        response_mask=mask,
        response_logprobs=logprobs,
        reward=rollout.reward,
        has_reward=rollout.has_reward,
        policy_version=min(versions),
        policy_versions=versions,
        call_indices=[call.call_index for call in segment],
        num_turns=len(segment),
        images=images,
    )


def _logprobs(rollout: store_module.Rollout, call: store_module.ModelCall) -> list[float]:
    tokens, logprobs = len(call.completion_token_ids), len(call.completion_logprobs)
    if logprobs == tokens:
        return list(call.completion_logprobs)
    if logprobs == 0:
        return [0.0] * tokens  # not captured (passthrough): zeros, as for masked tokens
    raise ExportError(
        f"rollout {rollout.rollout_id!r} call {call.call_index}: completion_logprobs has "
        f"{logprobs} entries for {tokens} completion_token_ids"
    )


#: The sidecar's segment reasons for a call that shares neither the system prompt nor
#: the opening turn with any conversation before it.
NEW_CONVERSATION_REASONS = frozenset({"first", "new_conversation"})


def _conversation(
    rows: Sequence[Row],
    found: Sequence[Sequence[store_module.ModelCall]],
    *,
    index: int,
    branch_of: int,
) -> int | None:
    """The conversation row ``index`` continues as a rewrite, or None when it begins one.

    It begins one when it is the first row, when the sidecar found it related to
    no earlier conversation, or when the row it branches from (else the row before
    it) lives on after it began: what went on beside it is a side conversation (a
    sub-agent with the same system prompt, a concurrent sample). A rewrite
    (compaction, edited turns) replaces its conversation's last segment instead.
    """
    first = found[index][0]
    if index == 0 or first.segment_reason in NEW_CONVERSATION_REASONS:
        return None
    parent = branch_of if branch_of >= 0 else index - 1
    if found[parent][-1].call_index > first.call_index:
        return None
    return rows[parent].conversation


def rollout_rows(
    rollout: store_module.Rollout, calls: Sequence[store_module.ModelCall]
) -> tuple[list[Row], ExportStats]:
    found, stats = segments(calls)
    rows: list[Row] = []
    for index, segment in enumerate(found):
        row = build_row(rollout, segment, index=index)
        branch_of, branch_tokens = _branch(rows, row.prompt_ids)
        conversation = _conversation(rows, found, index=index, branch_of=branch_of)
        if conversation is None:
            conversation = stats.conversations
            stats.conversations += 1
        rows.append(
            dataclasses.replace(
                row, branch_of=branch_of, branch_tokens=branch_tokens, conversation=conversation
            )
        )
    stats.followers = sum(map(len, found)) - stats.conversations
    stats.rollouts = 1
    stats.rows = len(rows)
    return rows, stats


def job_rows(store: store_module.Store, job: str) -> tuple[list[Row], ExportStats]:
    """Rows of every complete rollout of ``job``, with the combined stats."""
    rows: list[Row] = []
    stats = ExportStats()
    for rollout in store.complete_rollouts(job):
        found, found_stats = rollout_rows(rollout, store.calls(rollout.rollout_id))
        rows += found
        stats.add(found_stats)
    return rows, stats


# -- writers -------------------------------------------------------------------

SCHEMA = pa.schema(
    [
        ("rollout_id", pa.string()),
        ("job", pa.string()),
        ("task_id", pa.string()),
        ("sample_index", pa.int32()),
        ("segment_index", pa.int32()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())),
        ("response_mask", pa.list_(pa.int32())),
        ("response_logprobs", pa.list_(pa.float32())),
        ("reward", pa.float64()),
        ("has_reward", pa.bool_()),
        ("policy_version", pa.int64()),
        ("policy_versions", pa.list_(pa.int64())),
        ("call_indices", pa.list_(pa.int32())),
        ("num_turns", pa.int32()),
        ("images", pa.list_(pa.string())),
        ("branch_of", pa.int32()),
        ("branch_tokens", pa.int32()),
        ("conversation", pa.int32()),
    ]
)


def write_jsonl(rows: Iterable[Row], path: Path) -> int:
    count = 0
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row.to_dict(), separators=(",", ":")) + "\n")
            count += 1
    return count


def write_parquet(rows: Iterable[Row], path: Path) -> int:
    dicts = [row.to_dict() for row in rows]
    table = pa.Table.from_pylist(dicts, schema=SCHEMA)
    pq.write_table(table, path)
    return len(dicts)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def read_parquet(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
    return rows


WRITERS = {"jsonl": write_jsonl, "parquet": write_parquet}
