"""The collector's durable store of trajectory records.

SQLite, in WAL mode with ``synchronous=FULL``:

* one file, in the standard library, nothing to run beside the trainer;
* transactions are crash-safe: with ``synchronous=FULL`` a commit has been
  fsync'd to the WAL before it returns, so a record the collector acks
  survives a power cut, not only a process crash (``NORMAL`` may lose the
  last commits on power loss, which would break the ack promise);
* WAL lets readers (``openforge trajectories``, the trainer) read while the
  collector writes, without blocking either;
* the ``idempotency_key`` primary key makes redelivery harmless for free:
  ``INSERT OR IGNORE`` stores a record once and tells us it was a duplicate.

Tables: ``records`` holds every record (its serialized protobuf in ``body``)
and ``rollouts`` one summary row per rollout, kept up to date in the same
transaction as the records that change it. ``records.call_index`` (NULL for
records that are not model calls) lets completeness be checked by SQL.
An attempt that never finished is closed when a later attempt of the same
rollout (job, task, sample, policy version and batch) starts: its pod or process
is gone (deleted, its node lost, SIGKILLed) and nothing else will ever finish it.
It becomes ``stopped`` (never trained) with ``closed_reason`` saying why, whichever
of the two attempts' ``started`` records arrives first; a ``finished`` record of its
own that arrives after all still wins, and clears the reason.
``job_owners`` remembers, per job name, the RolloutJob (namespace/name/uid)
whose per-job token first wrote it (see ``openforge.trajectory.auth``).
"""

from __future__ import annotations

import dataclasses
import math
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from openforge import trajectory
from openforge.trajectory.v1 import trajectory_pb2

Record = Any  # trajectory_pb2.Record (the generated module is untyped for mypy)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    idempotency_key TEXT PRIMARY KEY,
    job TEXT NOT NULL,
    rollout_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    kind TEXT NOT NULL,
    call_index INTEGER,
    body BLOB NOT NULL,
    stored_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS records_by_rollout ON records (rollout_id, kind, call_index);
CREATE INDEX IF NOT EXISTS records_by_sequence ON records (rollout_id, sequence);
CREATE INDEX IF NOT EXISTS records_by_job_kind ON records (job, kind);
CREATE TABLE IF NOT EXISTS rollouts (
    rollout_id TEXT PRIMARY KEY,
    job TEXT NOT NULL,
    task_id TEXT NOT NULL DEFAULT '',
    sample_index INTEGER NOT NULL DEFAULT 0,
    attempt INTEGER NOT NULL DEFAULT 0,
    harness TEXT NOT NULL DEFAULT '',
    policy_version INTEGER NOT NULL DEFAULT 0,
    started INTEGER NOT NULL DEFAULT 0,
    status TEXT NOT NULL DEFAULT '',
    exit_code INTEGER NOT NULL DEFAULT 0,
    reward REAL NOT NULL DEFAULT 0,
    has_reward INTEGER NOT NULL DEFAULT 0,
    call_count_expected INTEGER NOT NULL DEFAULT 0,
    calls_stored INTEGER NOT NULL DEFAULT 0,
    finished INTEGER NOT NULL DEFAULT 0,
    trained_at REAL,
    trained_checkpoint TEXT,
    batch TEXT NOT NULL DEFAULT '',
    closed_reason TEXT NOT NULL DEFAULT '',
    retried INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS rollouts_by_job ON rollouts (job, task_id, sample_index);
CREATE TABLE IF NOT EXISTS job_owners (
    job TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    claimed_at REAL NOT NULL
);
"""

_ROLLOUT_COLUMNS = (
    "r.rollout_id, r.job, r.task_id, r.sample_index, r.attempt, r.harness, r.policy_version,"
    " r.started, r.status, r.exit_code, r.reward, r.has_reward, r.call_count_expected,"
    " r.calls_stored, r.finished, r.trained_at, r.trained_checkpoint, r.batch, r.closed_reason,"
    " r.retried,"
    " (SELECT COUNT(DISTINCT c.call_index) FROM records c"
    "   WHERE c.rollout_id = r.rollout_id AND c.kind IN ('call', 'lost')"
    "   AND c.call_index < r.call_count_expected) AS calls_present"
)


class StoreError(Exception):
    """A record cannot be stored as given (names the field at fault)."""


@dataclasses.dataclass(frozen=True)
class Rollout:
    rollout_id: str
    job: str
    task_id: str
    sample_index: int
    attempt: int
    harness: str
    policy_version: int
    started: bool
    status: str
    exit_code: int
    reward: float
    has_reward: bool
    call_count_expected: int
    calls_stored: int
    finished: bool
    trained_at: float | None
    trained_checkpoint: str | None
    # distinct call indices in 0..call_count_expected-1 accounted for: stored,
    # or reported lost by the sidecar (a lost call is never waited for)
    calls_present: int
    batch: str = ""
    """The batch it was started in (its started record's ``openforge.dev/batch`` label)."""
    closed_reason: str = ""
    """Why the store closed it (``stopped``) without a finish of its own, or ""."""
    retried: bool = False
    """Its finish says its sample is tried again as a new attempt (never trained; its
    group waits for the new attempt)."""

    @property
    def complete(self) -> bool:
        """Finished, and every call it announced is stored or reported lost."""
        return self.finished and self.calls_present == self.call_count_expected


@dataclasses.dataclass(frozen=True)
class ModelCall:
    """One stored model call (the parts of ``ModelCall`` training and tools use)."""

    rollout_id: str
    sequence: int
    call_index: int
    wire_api: str
    capture_mode: str
    stream: bool
    model: str
    http_status: int
    prompt_token_ids: tuple[int, ...]
    completion_token_ids: tuple[int, ...]
    completion_logprobs: tuple[float, ...]
    finish_reason: str
    segment_index: int
    segment_reason: str
    prefix_token_count: int
    policy_version: int
    token_exact: bool
    error: str
    time_to_first_token_ms: float
    total_ms: float
    request_json: bytes
    response_json: bytes

    @classmethod
    def from_record(cls, record: Record) -> ModelCall:
        call = record.call
        return cls(
            rollout_id=record.rollout_id,
            sequence=int(record.sequence),
            call_index=int(call.call_index),
            wire_api=trajectory_pb2.WireApi.Name(call.wire_api),
            capture_mode=trajectory_pb2.CaptureMode.Name(call.capture_mode),
            stream=bool(call.stream),
            model=call.model,
            http_status=int(call.http_status),
            prompt_token_ids=tuple(call.prompt_token_ids),
            completion_token_ids=tuple(call.completion_token_ids),
            completion_logprobs=tuple(call.completion_logprobs),
            finish_reason=call.finish_reason,
            segment_index=int(call.segment_index),
            segment_reason=call.segment_reason,
            prefix_token_count=int(call.prefix_token_count),
            policy_version=int(call.policy_version),
            token_exact=bool(call.token_exact),
            error=call.error,
            time_to_first_token_ms=float(call.timings.time_to_first_token_ms),
            total_ms=float(call.timings.total_ms),
            request_json=bytes(call.request_json),
            response_json=bytes(call.response_json),
        )


@dataclasses.dataclass(frozen=True)
class LostRecord:
    rollout_id: str
    sequence: int
    reason: str
    call_index: int
    whole_rollout: bool


class Store:
    """The durable record store. Thread-safe (one connection behind a lock)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            self.path, check_same_thread=False, isolation_level=None, timeout=30.0
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(rollouts)")}
        added = {  # columns a store made before they were recorded lacks
            "batch": "TEXT NOT NULL DEFAULT ''",
            "closed_reason": "TEXT NOT NULL DEFAULT ''",
            "retried": "INTEGER NOT NULL DEFAULT 0",
        }
        for column, declared in added.items():
            if column not in columns:
                self._db.execute(f"ALTER TABLE rollouts ADD COLUMN {column} {declared}")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing -------------------------------------------------------------

    def put(self, records: Sequence[Record]) -> list[bool]:
        """Store a batch in one transaction; True per newly stored record.

        False means the record was already stored (same idempotency key).
        Raises StoreError, storing nothing, if a record lacks a required field.
        """
        for record in records:
            check(record)
        now = time.time()
        stored: list[bool] = []
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for record in records:
                    stored.append(self._insert(record, now))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return stored

    def _insert(self, record: Record, now: float) -> bool:
        kind = record.WhichOneof("body")
        call_index = None
        if kind == "call":
            call_index = int(record.call.call_index)
        elif kind == "lost" and not record.lost.whole_rollout:
            call_index = int(record.lost.call_index)
        cursor = self._db.execute(
            "INSERT OR IGNORE INTO records"
            " (idempotency_key, job, rollout_id, sequence, kind, call_index, body, stored_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                record.idempotency_key,
                record.job,
                record.rollout_id,
                int(record.sequence),
                kind,
                call_index,
                record.SerializeToString(),
                now,
            ),
        )
        if cursor.rowcount == 0:
            return False
        self._db.execute(
            "INSERT OR IGNORE INTO rollouts (rollout_id, job) VALUES (?, ?)",
            (record.rollout_id, record.job),
        )
        if kind == "started":
            self._apply_started(record.rollout_id, record.started)
        elif kind == "call":
            self._db.execute(
                "UPDATE rollouts SET calls_stored = calls_stored + 1 WHERE rollout_id = ?",
                (record.rollout_id,),
            )
        elif kind == "finished":
            self._apply_finished(record.rollout_id, record.finished)
        return True

    def _apply_started(self, rollout_id: str, started: Any) -> None:
        self._db.execute(
            "UPDATE rollouts SET task_id = ?, sample_index = ?, attempt = ?, harness = ?,"
            " policy_version = ?, batch = ?, started = 1 WHERE rollout_id = ?",
            (
                started.task_id,
                int(started.sample_index),
                int(started.attempt),
                started.harness,
                int(started.policy_version),
                started.labels.get(trajectory.BATCH_LABEL, ""),
                rollout_id,
            ),
        )
        self._close_abandoned(rollout_id)

    def _close_abandoned(self, rollout_id: str) -> None:
        """Close the unfinished earlier attempts of this attempt's rollout (this one too,
        when a later attempt started first)."""
        identity = self._db.execute(
            "SELECT job, task_id, sample_index, policy_version, batch FROM rollouts WHERE "
            "rollout_id = ?",
            (rollout_id,),
        ).fetchone()
        same = (
            "job = ? AND task_id = ? AND sample_index = ? AND policy_version = ? AND batch = ? AND "
            "started = 1"
        )
        (latest,) = self._db.execute(
            f"SELECT MAX(attempt) FROM rollouts WHERE {same}", identity
        ).fetchone()
        self._db.execute(
            f"UPDATE rollouts SET status = ?, finished = 1, closed_reason = ? WHERE {same} AND "
            "finished = 0 AND attempt < ?",
            (
                trajectory.STOPPED,
                f"abandoned: attempt {latest} of its rollout started",
                *identity,
                latest,
            ),
        )

    def _apply_finished(self, rollout_id: str, finished: Any) -> None:
        self._db.execute(
            "UPDATE rollouts SET status = ?, exit_code = ?, reward = ?, has_reward = ?,"
            " call_count_expected = ?, finished = 1, closed_reason = '', retried = ?"
            " WHERE rollout_id = ?",
            (
                finished.status,
                int(finished.exit_code),
                float(finished.reward),
                int(finished.has_reward),
                int(finished.call_count),
                int(finished.retried),
                rollout_id,
            ),
        )

    def claim_job(self, job: str, owner: str) -> str:
        """Make ``owner`` the job's owner unless it has one; returns the owner on record.

        A claim is never changed or released, so what it returns stays true.
        """
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "INSERT OR IGNORE INTO job_owners (job, owner, claimed_at) VALUES (?, ?, ?)",
                    (job, owner, time.time()),
                )
                row = self._db.execute(
                    "SELECT owner FROM job_owners WHERE job = ?", (job,)
                ).fetchone()
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return str(row[0])

    def job_owner(self, job: str) -> str | None:
        """Who claimed ``job`` (``claim_job``), or None."""
        rows = self._query("SELECT owner FROM job_owners WHERE job = ?", (job,))
        return str(rows[0][0]) if rows else None

    def mark_trained(self, rollout_ids: Iterable[str], checkpoint: str) -> int:
        """Record that these rollouts went into ``checkpoint``; returns rows changed."""
        ids = list(rollout_ids)
        now = time.time()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                changed = 0
                for rollout_id in ids:
                    cursor = self._db.execute(
                        "UPDATE rollouts SET trained_at = ?, trained_checkpoint = ?"
                        " WHERE rollout_id = ?",
                        (now, checkpoint, rollout_id),
                    )
                    changed += cursor.rowcount
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return changed

    # -- reading -------------------------------------------------------------

    def _query(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def jobs(self) -> list[str]:
        return [row[0] for row in self._query("SELECT DISTINCT job FROM rollouts ORDER BY job")]

    def rollout(self, rollout_id: str) -> Rollout | None:
        rows = self._query(
            f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts r WHERE r.rollout_id = ?", (rollout_id,)
        )
        return _rollout(rows[0]) if rows else None

    def rollouts(self, job: str) -> list[Rollout]:
        rows = self._query(
            f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts r WHERE r.job = ?"
            " ORDER BY r.task_id, r.sample_index, r.attempt, r.rollout_id",
            (job,),
        )
        return [_rollout(row) for row in rows]

    def complete_rollouts(self, job: str) -> list[Rollout]:
        return [rollout for rollout in self.rollouts(job) if rollout.complete]

    def groups(self, job: str, *, untrained_only: bool = False) -> dict[str, list[Rollout]]:
        """Complete rollouts grouped by task (a GRPO group), by sample index."""
        groups: dict[str, list[Rollout]] = {}
        for rollout in self.complete_rollouts(job):
            if untrained_only and rollout.trained_at is not None:
                continue
            groups.setdefault(rollout.task_id, []).append(rollout)
        return groups

    def calls(self, rollout_id: str) -> list[ModelCall]:
        rows = self._query(
            "SELECT body FROM records WHERE rollout_id = ? AND kind = 'call'"
            " ORDER BY call_index, sequence",
            (rollout_id,),
        )
        return [ModelCall.from_record(_parse(row[0])) for row in rows]

    def records(self, rollout_id: str) -> list[Record]:
        """Every stored record of a rollout, in sequence order."""
        rows = self._query(
            "SELECT body FROM records WHERE rollout_id = ? ORDER BY sequence", (rollout_id,)
        )
        return [_parse(row[0]) for row in rows]

    def lost(self, job: str) -> list[LostRecord]:
        rows = self._query(
            "SELECT body FROM records WHERE job = ? AND kind = 'lost' "
            "ORDER BY rollout_id, sequence",
            (job,),
        )
        result = []
        for (body,) in rows:
            record = _parse(body)
            result.append(
                LostRecord(
                    rollout_id=record.rollout_id,
                    sequence=int(record.sequence),
                    reason=record.lost.reason,
                    call_index=int(record.lost.call_index),
                    whole_rollout=bool(record.lost.whole_rollout),
                )
            )
        return result

    def record_count(self, job: str | None = None) -> int:
        if job is None:
            return int(self._query("SELECT COUNT(*) FROM records")[0][0])
        return int(self._query("SELECT COUNT(*) FROM records WHERE job = ?", (job,))[0][0])

    def watermark(self, rollout_id: str) -> int:
        """The highest sequence n such that 1..n are all stored for this rollout.

        A sidecar serves one rollout per spool, so a rollout's sequences start
        at 1; 0 when sequence 1 is not stored.
        """
        rows = self._query(
            "SELECT sequence FROM records WHERE rollout_id = ? ORDER BY sequence", (rollout_id,)
        )
        contiguous = 0
        for (sequence,) in rows:
            if sequence == contiguous + 1:
                contiguous = sequence
            elif sequence > contiguous + 1:
                break
        return contiguous


def check(record: Record) -> None:
    """Raise StoreError naming the first required field ``record`` lacks, or the first
    value it cannot be stored with (a reward that is no finite number)."""
    if not record.idempotency_key:
        raise StoreError("idempotency_key is required")
    if not record.rollout_id:
        raise StoreError(f"record {record.idempotency_key!r}: rollout_id is required")
    if not record.job:
        raise StoreError(f"record {record.idempotency_key!r}: job is required")
    if record.WhichOneof("body") is None:
        raise StoreError(
            f"record {record.idempotency_key!r}: body is required"
            " (one of started, call, finished, lost)"
        )
    if (
        record.WhichOneof("body") == "finished"
        and record.finished.has_reward
        and not math.isfinite(record.finished.reward)
    ):
        raise StoreError(
            f"record {record.idempotency_key!r}: finished.reward must be a finite number, not "
            f"{record.finished.reward}"
        )


def _parse(body: bytes) -> Record:
    record = trajectory_pb2.Record()
    record.ParseFromString(body)
    return record


def _rollout(row: tuple[Any, ...]) -> Rollout:
    (
        rollout_id, job, task_id, sample_index, attempt, harness, policy_version, started,
        status, exit_code, reward, has_reward, expected, calls_stored, finished, trained_at,
        trained_checkpoint, batch, closed_reason, retried, calls_present,
    ) = row  # fmt: skip
    return Rollout(
        rollout_id=rollout_id,
        job=job,
        task_id=task_id,
        sample_index=sample_index,
        attempt=attempt,
        harness=harness,
        policy_version=policy_version,
        started=bool(started),
        status=status,
        exit_code=exit_code,
        reward=reward,
        has_reward=bool(has_reward),
        call_count_expected=expected,
        calls_stored=calls_stored,
        finished=bool(finished),
        trained_at=trained_at,
        trained_checkpoint=trained_checkpoint,
        calls_present=calls_present,
        batch=batch,
        closed_reason=closed_reason,
        retried=bool(retried),
    )
