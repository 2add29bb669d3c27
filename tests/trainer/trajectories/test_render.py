"""The ``trajectories show`` view, from a store written through the real Store API."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from openforge.trajectory.v1 import trajectory_pb2
from openforge_trainer.collection import store
from openforge_trainer.trajectories import render
from rich.console import Console

TINY_TOKENIZER = (
    Path(__file__).resolve().parents[3] / "trainer/openforge_trainer/assets/tiny-tokenizer"
)

SYSTEM = {"role": "system", "content": "You are an agent."}
USER = {"role": "user", "content": "List the files."}
TOOL_CALL = {
    "id": "c1",
    "type": "function",
    "function": {"name": "shell", "arguments": '{"cmd": "ls"}'},
}
ASSISTANT = {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]}
TOOL = {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}


def chat_call(
    index: int, messages: list[dict[str, object]], reply: dict[str, object], **fields: object
) -> trajectory_pb2.ModelCall:
    return trajectory_pb2.ModelCall(
        call_index=index,
        wire_api=trajectory_pb2.WIRE_API_OPENAI_CHAT,
        request_json=json.dumps(
            {
                "model": "policy",
                "messages": messages,
                "tools": [{"type": "function", "function": {"name": "shell"}}],
            }
        ).encode(),
        response_json=json.dumps({"choices": [{"message": reply}]}).encode(),
        http_status=200,
        token_exact=True,
        **fields,  # type: ignore[arg-type]
    )


def put_rollout(
    db: store.Store, rollout: str, calls: list[trajectory_pb2.ModelCall], *, finished: bool = True
) -> None:
    records = [
        trajectory_pb2.Record(started=trajectory_pb2.RolloutStarted(task_id="t", harness="react")),
        *(trajectory_pb2.Record(call=c) for c in calls),
    ]
    if finished:
        grade = trajectory_pb2.RolloutFinished(
            has_reward=True,
            reward=1.0,
            call_count=len(calls),
            status="succeeded",
            grader_output='{"reward": 1.0}',
        )
        records.append(trajectory_pb2.Record(finished=grade))
    for sequence, record in enumerate(records, start=1):
        record.idempotency_key = f"{rollout}/{sequence}"
        record.sequence, record.job, record.rollout_id = sequence, "job", rollout
    db.put(records)


def two_turns() -> list[trajectory_pb2.ModelCall]:
    """A tool call, then the answer after the tool result: one segment."""
    return [
        chat_call(0, [SYSTEM, USER], ASSISTANT, prompt_token_ids=[10, 11, 12],
                  completion_token_ids=[20, 21], completion_logprobs=[-0.1, -0.2],
                  finish_reason="tool_calls", segment_reason="first"),
        chat_call(1, [SYSTEM, USER, ASSISTANT, TOOL], {"content": "a.txt"},
                  prompt_token_ids=[10, 11, 12, 20, 21, 30], completion_token_ids=[40],
                  completion_logprobs=[-0.3], finish_reason="stop", prefix_token_count=5),
    ]  # fmt: skip


@pytest.fixture
def db(tmp_path: Path) -> Iterator[store.Store]:
    with store.Store(tmp_path / "store.db") as opened:
        yield opened


def test_a_continuing_call_shows_only_what_it_added(db: store.Store) -> None:
    put_rollout(db, "r0", two_turns())
    view = render.build(db, "r0")
    assert view is not None
    first, second = view.calls
    assert [m.role for m in first.messages] == ["system", "user"] and first.repeated == 0
    assert first.response is not None and first.response.tool_calls[0].name == "shell"
    assert [m.role for m in second.messages] == ["tool"] and second.repeated == 3
    assert view.grader_output == '{"reward": 1.0}'


def test_the_mask_is_the_training_row_cut_into_runs(db: store.Store) -> None:
    put_rollout(db, "r0", two_turns())
    view = render.build(db, "r0")
    assert view is not None
    [row] = view.rows
    assert row.row.call_indices == [0, 1]
    assert [(s.trained, s.token_ids) for s in row.spans] == [
        (True, [20, 21]),
        (False, [30]),
        (True, [40]),
    ]
    assert (row.trained, row.masked) == (3, 1)
    assert all(s.text is None for s in row.spans)


def test_spans_decode_with_the_policy_tokenizer(db: store.Store) -> None:
    put_rollout(db, "r0", two_turns())
    tokenizer = render.load_tokenizer(TINY_TOKENIZER)
    view = render.build(db, "r0", tokenizer=tokenizer)
    assert view is not None
    spans = view.rows[0].spans
    assert [s.text for s in spans] == [
        tokenizer.decode(s.token_ids, skip_special_tokens=False) for s in spans
    ]
    assert all(s.text for s in spans)


def test_a_rewritten_history_starts_a_new_row_and_shows_every_message(db: store.Store) -> None:
    calls = two_turns()
    calls[1].prompt_token_ids[:] = [10, 99, 12, 20, 21, 30]  # not an extension of call 0
    calls[1].segment_index, calls[1].segment_reason = 1, "history_rewritten"
    put_rollout(db, "r0", calls)
    view = render.build(db, "r0")
    assert view is not None
    assert view.calls[1].repeated == 0 and len(view.calls[1].messages) == 4
    assert [r.row.call_indices for r in view.rows] == [[0], [1]]
    out = io.StringIO()
    render.render_plain(view, out)
    assert "segment 1 (history_rewritten)" in out.getvalue()


def test_the_rows_are_drawn_as_a_tree_of_conversations(db: store.Store) -> None:
    """A title call beside the main conversation is a conversation of its own; a
    compaction of the main conversation is a second row of it, a rewrite."""
    title = [{"role": "system", "content": "Write a title."}, USER]
    summary = [SYSTEM, {"role": "user", "content": "Summary: a.txt listed."}]
    calls = [
        *two_turns(),
        chat_call(2, title, {"content": "Files"}, prompt_token_ids=[50, 51],
                  completion_token_ids=[52], completion_logprobs=[-0.1], finish_reason="stop",
                  segment_index=1, segment_reason="new_conversation"),
        chat_call(3, summary, {"content": "ok"}, prompt_token_ids=[10, 11, 60],
                  completion_token_ids=[61], completion_logprobs=[-0.1], finish_reason="stop",
                  segment_index=2, segment_reason="history_rewritten"),
    ]  # fmt: skip
    put_rollout(db, "r0", calls)
    view = render.build(db, "r0")
    assert view is not None
    out = io.StringIO()
    render.render_plain(view, out)
    lines = [line for line in out.getvalue().splitlines() if "row" in line]
    assert lines[1:] == [
        "conversation 0 · 2 rows, 3 calls · merge rate 50%",
        "├─ row 0 · calls #0, #1 · prompt 3 tokens · response 4 tokens: 3 trained, 1 masked"
        " · reward 1",
        "└─ row 2 · rewrites row 0 after 2 tokens (history_rewritten) · calls #3 · prompt 3"
        " tokens · response 1 tokens: 1 trained, 0 masked · reward 1",
        "conversation 1 · 1 row, 1 call",
        "└─ row 1 · calls #2 · prompt 2 tokens · response 1 tokens: 1 trained, 0 masked · reward 1",
    ]
    document = render.to_json(view)
    assert [(c["rows"], c["calls"]) for c in document["conversations"]] == [([0, 2], 3), ([1], 1)]
    console = Console(record=True, width=200, file=io.StringIO())
    render.render_rich(view, console)
    assert "rewrites row 0 after 2 tokens (history_rewritten)" in console.export_text()


def test_plain_rendering(db: store.Store) -> None:
    put_rollout(db, "r0", two_turns())
    view = render.build(db, "r0")
    assert view is not None
    out = io.StringIO()
    render.render_plain(view, out)
    text = out.getvalue()
    assert "rollout r0  job job  task t" in text and "reward 1  calls 2/2" in text
    assert "── call #0 · openai-chat · no stream · finish tool_calls" in text
    assert "segment 0 (first) · tokens: prompt 3, completion 2" in text
    assert (
        "segment 0 (continues) · tokens: prompt 6, 5 kept from the previous call, completion 1"
        in text
    )
    assert 'tool call shell {"cmd": "ls"}' in text
    assert "[tool] (result of c1)\n    a.txt" in text
    assert "conversation 0 · 1 row, 2 calls · merge rate 100%\n└─ row 0 · calls #0, #1 · " in text
    assert "prompt 3 tokens · response 4 tokens: 3 trained, 1 masked · reward 1" in text
    assert "     mask TT·T  (1 char = 1 token)" in text
    assert "     trained 2\n     masked 1\n     trained 1" in text


def test_rich_rendering_shows_the_same(db: store.Store) -> None:
    put_rollout(db, "r0", two_turns())
    view = render.build(db, "r0")
    assert view is not None
    console = Console(record=True, width=120, file=io.StringIO())
    render.render_rich(view, console)
    text = console.export_text()
    assert "call #1 · openai-chat" in text and 'tool call shell {"cmd": "ls"}' in text
    assert "██░█" in text and "[trained 2][masked 1][trained 1]" in text


def test_json_view(db: store.Store) -> None:
    put_rollout(db, "r0", two_turns())
    view = render.build(db, "r0")
    assert view is not None
    document = json.loads(json.dumps(render.to_json(view)))
    assert document["rollout"]["reward"] == 1.0 and document["rollout"]["complete"] is True
    assert [c["prompt_tokens"] for c in document["calls"]] == [3, 6]
    assert document["calls"][0]["response"]["tool_calls"] == [
        {"name": "shell", "arguments": '{"cmd": "ls"}', "id": "c1"}
    ]
    [row] = document["rows"]
    assert [(s["trained"], s["tokens"]) for s in row["spans"]] == [(True, 2), (False, 1), (True, 1)]


def test_long_texts_are_clipped_unless_full(db: store.Store) -> None:
    long = {"role": "system", "content": "x" * 5000}
    put_rollout(
        db,
        "r0",
        [
            chat_call(
                0, [long, USER], {"content": "ok"}, prompt_token_ids=[1], completion_token_ids=[2]
            )
        ],
    )
    view = render.build(db, "r0")
    assert view is not None
    clipped, full = io.StringIO(), io.StringIO()
    render.render_plain(view, clipped)
    render.render_plain(view, full, full=True)
    assert "… [+4400 chars; --full shows all]" in clipped.getvalue()
    assert "x" * 5000 in full.getvalue()


def test_mask_bar_fits_its_width() -> None:
    mask = [1] * 100 + [0] * 100
    bar = render.mask_bar(mask, width=50)
    assert bar == "T" * 25 + "·" * 25
    assert render.mask_bar([]) == ""


def test_untokenized_calls_and_losses_are_said(db: store.Store) -> None:
    call = chat_call(
        0, [USER], {"content": "hi"}, capture_mode=trajectory_pb2.CAPTURE_MODE_PASSTHROUGH
    )
    put_rollout(db, "r0", [call], finished=False)
    lost = trajectory_pb2.Record(lost=trajectory_pb2.Lost(reason="spool full", call_index=1))
    lost.idempotency_key, lost.sequence, lost.job, lost.rollout_id = "r0/lost", 9, "job", "r0"
    db.put([lost])
    view = render.build(db, "r0")
    assert view is not None and view.rows == []
    out = io.StringIO()
    render.render_plain(view, out)
    text = out.getvalue()
    assert "status running" in text and "lost call #1: spool full" in text
    assert "no rows (no tokenized calls)" in text


def test_a_rollout_whose_calls_all_failed_says_so(db: store.Store) -> None:
    calls = [
        chat_call(0, [USER], {"content": "h"}, prompt_token_ids=[1, 2], completion_token_ids=[3],
                  completion_logprobs=[-0.1], finish_reason="error",
                  error="connection failed: client disconnected"),
        chat_call(1, [USER], {"content": ""}, prompt_token_ids=[1, 2], finish_reason="error",
                  error="rejected: max_tokens: must be at least 1"),
    ]  # fmt: skip
    calls[1].http_status = 400
    put_rollout(db, "r-failed", calls)
    view = render.build(db, "r-failed")
    assert view is not None and view.rows == []
    out = io.StringIO()
    render.render_plain(view, out)
    assert (
        "no rows (no completed tokenized calls; failed calls not trained: 1 aborted, 1 refused)"
        in out.getvalue()
    )


def test_find_tokenizer_prefers_the_newest_checkpoint(tmp_path: Path) -> None:
    assert render.find_tokenizer(tmp_path / "store.db") is None
    for step in ("step-000001", "step-000002"):
        (tmp_path / "train" / "checkpoints" / step).mkdir(parents=True)
        (tmp_path / "train" / "checkpoints" / step / "tokenizer.json").write_text("{}")
    assert (
        render.find_tokenizer(tmp_path / "store.db")
        == tmp_path / "train/checkpoints/step-000002/tokenizer.json"
    )
