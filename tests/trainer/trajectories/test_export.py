from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import call_outcomes
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from openforge.trajectory.v1 import trajectory_pb2
from openforge_trainer.collection import store
from openforge_trainer.trajectories import export


def call(
    index: int,
    prompt: Sequence[int],
    completion: Sequence[int],
    logprobs: Sequence[float] | None = None,
    *,
    segment: int = 0,
    version: int = 1,
    reason: str = "",
) -> trajectory_pb2.ModelCall:
    return trajectory_pb2.ModelCall(
        segment_reason=reason,
        call_index=index,
        prompt_token_ids=list(prompt),
        completion_token_ids=list(completion),
        completion_logprobs=list(logprobs if logprobs is not None else [-0.5] * len(completion)),
        segment_index=segment,
        policy_version=version,
        finish_reason="stop",
        http_status=200,
    )


def stored_calls(*calls: trajectory_pb2.ModelCall) -> list[store.ModelCall]:
    return [
        store.ModelCall.from_record(
            trajectory_pb2.Record(idempotency_key=f"r/call/{c.call_index}", rollout_id="r", call=c)
        )
        for c in calls
    ]


ROLLOUT = store.Rollout(
    rollout_id="r",
    job="job",
    task_id="t",
    sample_index=2,
    attempt=1,
    harness="codex",
    policy_version=1,
    started=True,
    status="succeeded",
    exit_code=0,
    reward=0.75,
    has_reward=True,
    call_count_expected=3,
    calls_stored=3,
    finished=True,
    trained_at=None,
    trained_checkpoint=None,
    calls_present=3,
)

# Three agent turns: each prompt is the last prompt + completion + a tool result.
MULTI_TURN = (
    call(0, [1, 2, 3], [10, 11], [-0.5, -0.25], version=4),
    call(1, [1, 2, 3, 10, 11, 20, 21], [12], [-0.125], version=5),
    call(2, [1, 2, 3, 10, 11, 20, 21, 12, 22], [13, 14], [-1.0, -2.0], version=5),
)


def test_multi_turn_calls_make_one_row_with_aligned_mask_and_logprobs() -> None:
    rows, stats = export.rollout_rows(ROLLOUT, stored_calls(*MULTI_TURN))
    (row,) = rows
    assert row.prompt_ids == [1, 2, 3]
    assert row.response_ids == [10, 11, 20, 21, 12, 22, 13, 14]
    assert row.response_mask == [1, 1, 0, 0, 1, 0, 1, 1]
    assert row.response_logprobs == [-0.5, -0.25, 0.0, 0.0, -0.125, 0.0, -1.0, -2.0]
    assert len(row.response_ids) == len(row.response_mask) == len(row.response_logprobs)
    assert (row.reward, row.has_reward, row.num_turns) == (0.75, True, 3)
    assert (row.rollout_id, row.job, row.task_id, row.sample_index) == ("r", "job", "t", 2)
    assert (row.policy_version, row.policy_versions) == (4, [4, 5, 5])
    assert row.call_indices == [0, 1, 2]
    assert (stats.extended, stats.followers, stats.merge_rate) == (2, 2, 1.0)


def test_history_rewrite_starts_a_new_segment_even_when_the_index_says_otherwise() -> None:
    calls = stored_calls(
        *MULTI_TURN,
        # The harness compacted its history; the sidecar (wrongly) kept segment 0.
        call(3, [1, 2, 3, 99], [15], [-0.75], segment=0),
        call(4, [1, 2, 3, 99, 15, 23], [16], [-0.5], segment=0),
    )
    rows, stats = export.rollout_rows(ROLLOUT, calls)
    assert [row.segment_index for row in rows] == [0, 1]
    assert [row.call_indices for row in rows] == [[0, 1, 2], [3, 4]]
    second = rows[1]
    assert second.prompt_ids == [1, 2, 3, 99]
    assert second.response_ids == [15, 23, 16]
    assert second.response_mask == [1, 0, 1]
    assert second.response_logprobs == [-0.75, 0.0, -0.5]
    assert stats.split_on_mismatch == 1
    assert (stats.extended, stats.followers) == (3, 4)
    assert stats.merge_rate == 0.75


def test_tokens_decide_when_the_index_claims_a_split() -> None:
    calls = stored_calls(MULTI_TURN[0], call(1, [1, 2, 3, 10, 11, 5], [6], segment=1))
    rows, stats = export.rollout_rows(ROLLOUT, calls)
    assert len(rows) == 1
    assert stats.merged_across_index == 1


def test_interleaved_conversations_each_make_one_row_and_the_rows_form_a_tree() -> None:
    """A side call between two turns of the main conversation, and a sub-agent with the
    same system prompt: each conversation is one merged row, whatever came between its
    calls; each row says which earlier row its prompt branches from."""
    calls = stored_calls(
        call(0, [1, 2, 3, 4], [10], segment=0),  # main
        call(1, [7, 8], [30], segment=1, reason="system_changed"),  # a side call (a title)
        call(2, [1, 2, 3, 4, 10, 5], [11], segment=0),  # main again
        call(3, [1, 2, 3, 6], [40], segment=2, reason="history_rewritten"),  # a sub-agent
        call(4, [1, 2, 3, 6, 40, 9], [41], segment=2),
        call(5, [1, 2, 3, 4, 10, 5, 11, 5], [12], segment=0),  # main, after both
    )
    rows, stats = export.rollout_rows(ROLLOUT, calls)
    assert [row.call_indices for row in rows] == [[0, 2, 5], [1], [3, 4]]
    assert rows[0].response_ids == [10, 5, 11, 5, 12]
    assert rows[0].response_mask == [1, 0, 1, 0, 1]
    assert [(row.branch_of, row.branch_tokens) for row in rows] == [(-1, 0), (-1, 0), (0, 3)]
    # the side call and the sub-agent ran while the main conversation went on: each is a
    # conversation of its own, and neither counts against the merge rate
    assert [row.conversation for row in rows] == [0, 1, 2]
    assert (stats.extended, stats.followers, stats.conversations) == (3, 3, 3)
    assert (stats.merge_rate, stats.split_on_mismatch) == (1.0, 0)


def test_a_rewrite_is_a_new_segment_of_its_conversation() -> None:
    """A compaction (the old segment takes no call after it) continues its conversation
    in a new row, and counts against the merge rate; a new conversation does not."""
    calls = stored_calls(
        call(0, [1, 2, 3, 4], [10], segment=0),
        call(1, [1, 2, 3, 4, 10, 5], [11], segment=0),
        call(2, [1, 2, 3, 9], [12], segment=1, reason="history_rewritten"),  # compacted
        call(3, [1, 2, 3, 9, 12, 5], [13], segment=1),
        call(4, [7, 8], [30], segment=2, reason="new_conversation"),  # a title, at the end
    )
    rows, stats = export.rollout_rows(ROLLOUT, calls)
    assert [row.call_indices for row in rows] == [[0, 1], [2, 3], [4]]
    assert [row.conversation for row in rows] == [0, 0, 1]
    assert (rows[1].branch_of, rows[1].branch_tokens) == (0, 3)
    assert (stats.extended, stats.followers, stats.conversations) == (2, 3, 2)


def test_a_call_joins_the_longest_context_it_extends() -> None:
    calls = stored_calls(
        call(0, [1, 2], [3], segment=0),
        call(1, [1, 2, 3, 4], [5], segment=1, reason="history_rewritten"),  # extends row 0 too
    )
    rows, _ = export.rollout_rows(ROLLOUT, calls)
    assert [row.call_indices for row in rows] == [[0, 1]]
    longer = stored_calls(
        call(0, [1, 2], [3], segment=0),
        call(1, [9], [8], segment=1, reason="new_conversation"),
        call(2, [1, 2, 3, 4], [5], segment=0),
        call(3, [1, 2, 3, 4, 5, 6], [7], segment=0),
    )
    rows, _ = export.rollout_rows(ROLLOUT, longer)
    assert [row.call_indices for row in rows] == [[0, 2, 3], [1]]


def test_untokenized_calls_are_skipped_and_missing_logprobs_are_zero() -> None:
    calls = stored_calls(
        trajectory_pb2.ModelCall(call_index=0, http_status=200),  # passthrough without token IDs
        call(1, [1, 2], [3, 4], []),
    )
    (row,), stats = export.rollout_rows(ROLLOUT, calls)
    assert row.response_logprobs == [0.0, 0.0]
    assert row.response_mask == [1, 1]
    assert stats.untokenized == 1
    assert stats.followers == 0 and stats.merge_rate == 0.0


def test_logprob_count_mismatch_names_the_field() -> None:
    calls = stored_calls(call(0, [1], [2, 3], [-0.5]))
    with pytest.raises(
        export.ExportError, match=r"call 0: completion_logprobs has 1 entries for 2"
    ):
        export.rollout_rows(ROLLOUT, calls)


def _store_with_rollouts(path: Path) -> store.Store:
    db = store.Store(path)
    for sample, reward in ((0, 1.0), (1, 0.0)):
        rollout = f"r{sample}"
        records = [
            trajectory_pb2.Record(
                idempotency_key=f"{rollout}/started/0",
                started=trajectory_pb2.RolloutStarted(task_id="t", sample_index=sample),
            ),
            *(
                trajectory_pb2.Record(idempotency_key=f"{rollout}/call/{c.call_index}", call=c)
                for c in MULTI_TURN
            ),
            trajectory_pb2.Record(
                idempotency_key=f"{rollout}/finished/0",
                finished=trajectory_pb2.RolloutFinished(
                    has_reward=True, reward=reward, call_count=3, status="succeeded"
                ),
            ),
        ]
        for sequence, record in enumerate(records, start=1):
            record.sequence, record.job, record.rollout_id = sequence, "job", rollout
        db.put(records)
    # An unfinished rollout is not exported.
    db.put(
        [
            trajectory_pb2.Record(
                idempotency_key="r9/call/0",
                sequence=1,
                job="job",
                rollout_id="r9",
                call=MULTI_TURN[0],
            )
        ]
    )
    return db


def test_jsonl_and_parquet_read_back_equal(tmp_path: Path) -> None:
    with _store_with_rollouts(tmp_path / "store.db") as db:
        rows, stats = export.job_rows(db, "job")
    assert [row.rollout_id for row in rows] == ["r0", "r1"]
    assert stats.rollouts == 2 and stats.rows == 2
    assert export.write_jsonl(rows, tmp_path / "rows.jsonl") == 2
    assert export.write_parquet(rows, tmp_path / "rows.parquet") == 2
    expected = [row.to_dict() for row in rows]
    assert export.read_jsonl(tmp_path / "rows.jsonl") == expected
    assert export.read_parquet(tmp_path / "rows.parquet") == expected
    schema = pq.read_schema(tmp_path / "rows.parquet")
    assert schema.field("response_ids").type == pa.list_(pa.int32())
    assert schema.field("response_logprobs").type == pa.list_(pa.float32())
    assert expected[1]["reward"] == 0.0 and expected[0]["reward"] == 1.0


def _chat_request(*image_urls: str) -> bytes:
    content = [{"type": "text", "text": "look"}] + [
        {"type": "image_url", "image_url": {"url": u}} for u in image_urls
    ]
    return json.dumps(
        {"model": "policy", "messages": [{"role": "user", "content": content}]}
    ).encode()


def test_a_row_carries_the_images_of_its_segments_last_request(tmp_path: Path) -> None:
    first, second, third = (
        call(i, c.prompt_token_ids, c.completion_token_ids, c.completion_logprobs)
        for i, c in enumerate(MULTI_TURN)
    )  # fmt: skip
    first.wire_api = second.wire_api = third.wire_api = trajectory_pb2.WIRE_API_OPENAI_CHAT
    first.request_json = _chat_request("data:image/png;base64,QUFB")
    second.request_json = _chat_request("data:image/png;base64,QUFB", "data:image/png;base64,QkJC")
    third.request_json = _chat_request(
        "data:image/png;base64,QUFB", "data:image/png;base64,QkJC", "https://x/c.png"
    )
    (row,), _ = export.rollout_rows(ROLLOUT, stored_calls(first, second, third))
    assert row.images == [
        "data:image/png;base64,QUFB",
        "data:image/png;base64,QkJC",
        "https://x/c.png",
    ]
    assert (
        export.write_jsonl([row], tmp_path / "rows.jsonl")
        == export.write_parquet([row], tmp_path / "rows.parquet")
        == 1
    )
    assert export.read_jsonl(tmp_path / "rows.jsonl")[0]["images"] == row.images
    assert export.read_parquet(tmp_path / "rows.parquet")[0]["images"] == row.images
    assert pq.read_schema(tmp_path / "rows.parquet").field("images").type == pa.list_(pa.string())


def test_text_rows_have_no_images_and_an_unreadable_request_names_the_call() -> None:
    (row,), _ = export.rollout_rows(ROLLOUT, stored_calls(*MULTI_TURN))
    assert row.images == []
    broken = call(0, [1], [2])
    broken.wire_api = trajectory_pb2.WIRE_API_OPENAI_CHAT
    broken.request_json = b"{not json"
    with pytest.raises(
        export.ExportError, match=r"rollout 'r' call 0: request_json: body is not valid JSON"
    ):
        export.rollout_rows(ROLLOUT, stored_calls(broken))


def test_only_completed_calls_become_rows_and_the_failed_are_counted_by_kind(
    tmp_path: Path,
) -> None:
    """A call cut off mid-stream and a refused one stay in the store but are no training data."""
    with store.Store(tmp_path / "store.db") as db:
        db.put(call_outcomes.records("mixed", call_outcomes.MIXED))
        assert len(db.calls("mixed")) == 3  # kept for inspection
        rows, stats = export.job_rows(db, "job")
    assert [row.call_indices for row in rows] == [[0]]
    (row,) = rows
    assert (row.prompt_ids, row.response_ids, row.response_mask) == ([1, 2, 3], [10, 11], [1, 1])
    assert (stats.calls, stats.aborted, stats.errored, stats.refused) == (3, 1, 0, 1)
    assert stats.failures() == {"aborted": 1, "errored": 0, "refused": 1}
    assert (stats.untokenized, stats.followers, stats.rows) == (0, 0, 1)


RETRY = [*call_outcomes.NEXT_PROMPT]  # the harness asks the cut-off turn again


def test_a_retry_after_a_failed_call_continues_the_last_completed_call() -> None:
    """The failed call is dropped and the tokens decide: its retry extends call 0, so the
    row runs 0 -> 2 -> 3 with no token of the failed call in it."""
    calls = stored_calls(
        call_outcomes.MIXED[0],
        call_outcomes.MIXED[1],
        call_outcomes.completed(2, RETRY, [12]),
        call_outcomes.completed(3, [*RETRY, 12, 22], [13]),
    )
    (row,), stats = export.rollout_rows(ROLLOUT, calls)
    assert row.call_indices == [0, 2, 3]
    assert row.response_ids == [10, 11, 20, 21, 12, 22, 13]
    assert row.response_mask == [1, 1, 0, 0, 1, 0, 1]
    assert (stats.aborted, stats.extended, stats.followers) == (1, 2, 2)


def test_the_partial_answer_a_harness_sends_back_is_context_never_trained() -> None:
    partial = list(call_outcomes.MIXED[1].completion_token_ids)
    calls = stored_calls(
        call_outcomes.MIXED[0],
        call_outcomes.MIXED[1],
        call_outcomes.completed(2, [*RETRY, *partial, 23], [12]),
    )
    (row,), _ = export.rollout_rows(ROLLOUT, calls)
    assert row.call_indices == [0, 2]
    assert row.response_ids == [10, 11, 20, 21, *partial, 23, 12]
    assert row.response_mask == [1, 1, 0, 0] + [0] * len(partial) + [0, 1]


def test_a_call_after_a_failure_that_does_not_continue_the_tokens_starts_a_new_row() -> None:
    calls = stored_calls(
        call_outcomes.MIXED[0],
        call_outcomes.refused(1, [*RETRY, *range(40, 90)]),
        call_outcomes.completed(2, [1, 2, 3, 99], [12]),  # the harness compacted its history
    )
    rows, stats = export.rollout_rows(ROLLOUT, calls)
    assert [row.call_indices for row in rows] == [[0], [2]]
    assert [row.segment_index for row in rows] == [0, 1]
    assert (stats.refused, stats.extended, stats.followers) == (1, 0, 1)


def test_a_failed_first_call_starts_no_row() -> None:
    calls = stored_calls(
        call_outcomes.disconnected(0, [1, 2, 3], [7, 8, 9]),
        call_outcomes.completed(1, [1, 2, 3], [10, 11]),
    )
    (row,), stats = export.rollout_rows(ROLLOUT, calls)
    assert (row.call_indices, row.prompt_ids, row.response_ids) == ([1], [1, 2, 3], [10, 11])
    assert (stats.aborted, stats.followers) == (1, 0)
