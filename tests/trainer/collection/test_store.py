from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest
from openforge.trajectory.v1 import trajectory_pb2
from openforge_trainer.collection import store


def rollout_records(
    rollout: str,
    *,
    job: str = "job",
    task: str = "t1",
    sample: int = 0,
    calls: int = 2,
    reward: float = 1.0,
    finished: bool = True,
) -> list[trajectory_pb2.Record]:
    records = [
        trajectory_pb2.Record(
            idempotency_key=f"{rollout}/started/0",
            job=job,
            rollout_id=rollout,
            started=trajectory_pb2.RolloutStarted(
                task_id=task, sample_index=sample, attempt=1, harness="codex", policy_version=3
            ),
        )
    ]
    for i in range(calls):
        records.append(
            trajectory_pb2.Record(
                idempotency_key=f"{rollout}/call/{i}",
                job=job,
                rollout_id=rollout,
                call=trajectory_pb2.ModelCall(
                    call_index=i,
                    wire_api=trajectory_pb2.WIRE_API_OPENAI_CHAT,
                    prompt_token_ids=[1, 2, 3 + i],
                    completion_token_ids=[7, 8],
                    completion_logprobs=[-0.5, -0.25],
                    segment_index=0,
                    policy_version=3,
                ),
            )
        )
    if finished:
        records.append(
            trajectory_pb2.Record(
                idempotency_key=f"{rollout}/finished/0",
                job=job,
                rollout_id=rollout,
                finished=trajectory_pb2.RolloutFinished(
                    exit_code=0,
                    has_reward=True,
                    reward=reward,
                    call_count=calls,
                    status="succeeded",
                ),
            )
        )
    for sequence, record in enumerate(records, start=1):
        record.sequence = sequence
    return records


@pytest.fixture
def db(tmp_path: Path) -> store.Store:
    return store.Store(tmp_path / "store.db")


def test_put_reports_new_and_duplicate(db: store.Store) -> None:
    records = rollout_records("r1")
    assert db.put(records) == [True] * 4
    assert db.put(records[1:3]) == [False, False]
    assert db.put([*records[:1], *rollout_records("r2")[:1]]) == [False, True]
    assert db.record_count() == 5
    (rollout,) = [r for r in db.rollouts("job") if r.rollout_id == "r1"]
    assert rollout.calls_stored == 2  # duplicates did not count twice


def test_store_is_wal_with_full_sync_and_survives_reopen(tmp_path: Path) -> None:
    with store.Store(tmp_path / "s.db") as db:
        db.put(rollout_records("r1"))
        assert db._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    with store.Store(tmp_path / "s.db") as db:
        assert db.record_count("job") == 4
        # A second connection (another process, e.g. the CLI) reads while this one is open.
        reader = sqlite3.connect(tmp_path / "s.db")
        assert reader.execute("SELECT COUNT(*) FROM records").fetchone()[0] == 4
        reader.close()


def test_rollout_summary_and_completeness(db: store.Store) -> None:
    db.put(rollout_records("done", sample=0, reward=0.5))
    partial = rollout_records("missing-call", sample=1, calls=3)
    db.put([r for r in partial if r.idempotency_key != "missing-call/call/1"])
    db.put(rollout_records("running", sample=2, finished=False))
    by_id = {r.rollout_id: r for r in db.rollouts("job")}
    done = by_id["done"]
    assert (done.task_id, done.sample_index, done.attempt, done.harness) == ("t1", 0, 1, "codex")
    assert (done.status, done.reward, done.has_reward, done.finished) == (
        "succeeded",
        0.5,
        True,
        True,
    )
    assert done.complete
    assert by_id["missing-call"].calls_present == 2
    assert not by_id["missing-call"].complete
    assert not by_id["running"].complete
    assert [r.rollout_id for r in db.complete_rollouts("job")] == ["done"]
    db.put([r for r in partial if r.idempotency_key == "missing-call/call/1"])
    assert {r.rollout_id for r in db.complete_rollouts("job")} == {"done", "missing-call"}


def test_groups_by_task_ordered_by_sample(db: store.Store) -> None:
    db.put(rollout_records("a1", task="a", sample=1))
    db.put(rollout_records("a0", task="a", sample=0))
    db.put(rollout_records("b0", task="b", sample=0))
    db.put(rollout_records("b1", task="b", sample=1, finished=False))
    db.put(rollout_records("other", job="other-job", task="a"))
    groups = db.groups("job")
    assert {task: [r.rollout_id for r in group] for task, group in groups.items()} == {
        "a": ["a0", "a1"],
        "b": ["b0"],
    }
    assert db.mark_trained(["a0", "a1"], "ckpt-1") == 2
    assert db.rollout("a0") is not None and db.rollout("a0").trained_checkpoint == "ckpt-1"  # type: ignore[union-attr]
    assert list(db.groups("job", untrained_only=True)) == ["b"]
    assert db.jobs() == ["job", "other-job"]


def test_calls_are_typed_and_ordered(db: store.Store) -> None:
    records = rollout_records("r1", calls=3)
    db.put(list(reversed(records)))
    calls = db.calls("r1")
    assert [c.call_index for c in calls] == [0, 1, 2]
    assert calls[1].prompt_token_ids == (1, 2, 4)
    assert calls[1].completion_logprobs == (-0.5, -0.25)
    assert calls[1].wire_api == "WIRE_API_OPENAI_CHAT"
    assert [r.sequence for r in db.records("r1")] == [1, 2, 3, 4, 5]


def test_lost_records(db: store.Store) -> None:
    lost = trajectory_pb2.Record(
        idempotency_key="r1/lost/0",
        sequence=5,
        job="job",
        rollout_id="r1",
        lost=trajectory_pb2.Lost(reason="engine timeout", call_index=4),
    )
    db.put([lost])
    assert db.lost("job") == [
        store.LostRecord(
            rollout_id="r1", sequence=5, reason="engine timeout", call_index=4, whole_rollout=False
        )
    ]


def test_watermark_is_the_contiguous_prefix(db: store.Store) -> None:
    records = rollout_records("r1", calls=4)  # sequences 1..6
    assert db.watermark("r1") == 0
    db.put([records[1]])
    assert db.watermark("r1") == 0
    db.put([records[0], records[2], records[4]])
    assert db.watermark("r1") == 3
    db.put([records[3]])
    assert db.watermark("r1") == 5


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("idempotency_key", "idempotency_key is required"),
        ("rollout_id", "rollout_id is required"),
        ("job", "job is required"),
        ("body", "body is required"),
    ],
)
def test_put_refuses_records_lacking_a_field(db: store.Store, field: str, message: str) -> None:
    good, bad = rollout_records("r1")[:2]
    bad.ClearField("call" if field == "body" else field)
    with pytest.raises(store.StoreError, match=message):
        db.put([good, bad])
    assert db.record_count() == 0  # nothing from the batch


@pytest.mark.parametrize("reward", [math.nan, math.inf, -math.inf])
def test_put_refuses_a_reward_that_is_not_a_finite_number(db: store.Store, reward: float) -> None:
    records = rollout_records("r1")
    finished = next(r for r in records if r.WhichOneof("body") == "finished")
    finished.finished.has_reward, finished.finished.reward = True, reward
    with pytest.raises(store.StoreError, match=r"finished\.reward must be a finite number"):
        db.put(records)
    assert db.record_count() == 0


def test_a_job_is_claimed_once_and_for_good(tmp_path: Path) -> None:
    with store.Store(tmp_path / "s.db") as db:
        assert db.job_owner("job") is None
        assert db.claim_job("job", "rl/job/uid-1") == "rl/job/uid-1"
        assert db.claim_job("job", "other/job/uid-2") == "rl/job/uid-1"
        assert db.claim_job("job-2", "other/job-2/uid-2") == "other/job-2/uid-2"
    with store.Store(tmp_path / "s.db") as db:
        assert db.job_owner("job") == "rl/job/uid-1"


def test_a_store_from_before_batches_gains_the_column_and_keeps_its_rollouts(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    with store.Store(path) as db:
        db.put([trajectory_pb2.Record(
            idempotency_key="r/started", job="j", rollout_id="r",
            started=trajectory_pb2.RolloutStarted(task_id="t", labels={"openforge.dev/batch": "4"}),
        )])  # fmt: skip
    with sqlite3.connect(path) as raw:  # as a store made before batches were recorded
        raw.execute("ALTER TABLE rollouts DROP COLUMN batch")
    with store.Store(path) as db:
        rollout = db.rollout("r")
        assert rollout is not None and (rollout.task_id, rollout.batch) == ("t", "")
        db.put([trajectory_pb2.Record(
            idempotency_key="s/started", job="j", rollout_id="s",
            started=trajectory_pb2.RolloutStarted(task_id="t", labels={"openforge.dev/batch": "4"}),
        )])  # fmt: skip
        again = db.rollout("s")
        assert again is not None and again.batch == "4"


def attempt(
    rollout: str, number: int, *, batch: str = "0/4", finished: bool = False
) -> list[trajectory_pb2.Record]:
    records = rollout_records(rollout, calls=1, finished=finished)
    records[0].started.attempt = number
    records[0].started.labels["openforge.dev/batch"] = batch
    return records


def test_an_attempt_a_later_one_superseded_is_closed_stopped_with_the_reason(
    db: store.Store,
) -> None:
    """Its pod was deleted or its node lost: nothing else will ever finish it."""
    db.put(attempt("r-0", 0))
    first = db.rollout("r-0")
    assert first is not None and (first.finished, first.status) == (False, "")
    db.put(attempt("r-1", 1))
    closed, running = db.rollout("r-0"), db.rollout("r-1")
    assert closed is not None and running is not None
    assert (closed.finished, closed.status, closed.closed_reason) == (
        True,
        "stopped",
        "abandoned: attempt 1 of its rollout started",
    )
    assert closed.calls_stored == 1, "what it captured stays"
    assert (running.finished, running.closed_reason) == (False, "")


def test_only_attempts_of_the_same_rollout_are_closed(db: store.Store) -> None:
    db.put(attempt("a-0", 0, batch="0/4"))
    db.put(
        attempt("b-1", 1, batch="1/4")
    )  # another iteration's attempt of the same task and sample
    other = rollout_records("c-1", sample=1, calls=1, finished=False)
    other[0].started.attempt = 1
    other[0].started.labels["openforge.dev/batch"] = "0/4"
    db.put(other)  # another sample of the same batch
    kept = db.rollout("a-0")
    assert kept is not None and not kept.finished and kept.closed_reason == ""


def test_an_earlier_attempt_whose_start_arrives_late_is_closed_and_its_own_finish_still_wins(
    db: store.Store,
) -> None:
    db.put(attempt("r-1", 1))
    records = attempt("r-0", 0, finished=True)
    db.put(records[:-1])  # its spool drained late, after the next attempt started
    late = db.rollout("r-0")
    assert late is not None and (late.status, late.closed_reason) == (
        "stopped",
        "abandoned: attempt 1 of its rollout started",
    )
    db.put(records[-1:])
    finished = db.rollout("r-0")
    assert finished is not None and (
        finished.status,
        finished.closed_reason,
        finished.complete,
    ) == ("succeeded", "", True)


def test_a_store_from_before_closed_reasons_gains_the_column(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with store.Store(path) as db:
        db.put(attempt("r-0", 0))
    with sqlite3.connect(path) as raw:
        raw.execute("ALTER TABLE rollouts DROP COLUMN closed_reason")
    with store.Store(path) as db:
        db.put(attempt("r-1", 1))
        closed = db.rollout("r-0")
        assert (
            closed is not None
            and closed.status == "stopped"
            and "attempt 1" in closed.closed_reason
        )


def test_a_finish_tried_again_is_read_back_so_and_an_old_store_gains_the_column(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    with store.Store(path) as db:
        db.put(attempt("r-0", 0))
    with sqlite3.connect(path) as raw:  # as a store made before retries were recorded
        raw.execute("ALTER TABLE rollouts DROP COLUMN retried")
    with store.Store(path) as db:
        kept = db.rollout("r-0")
        assert kept is not None and not kept.retried
        records = attempt("r-1", 1, finished=True)
        records[-1].finished.status = "failed"
        records[-1].finished.retried = True
        db.put(records)
        retried = db.rollout("r-1")
        assert retried is not None and retried.complete and retried.retried
