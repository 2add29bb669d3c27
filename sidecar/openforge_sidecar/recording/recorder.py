"""One rollout's recording, from the capture addon's finished calls to the collector.

The :class:`Recorder` owns everything between a record built and a record
acknowledged: the spool and its writer thread (fsync per batch), the call
indexes and the in-flight journal that lets a restarted sidecar report every
call it was answering as lost, the loss reports, the started and finished
records, and the exporter that streams the spool to the collector. The
capture addon decides what a call was; the recorder makes sure it reaches the
store exactly once or is reported lost, with a reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import queue
import shutil
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openforge.trajectory.v1 import trajectory_pb2 as pb

from openforge_sidecar import memory
from openforge_sidecar.policy import stored
from openforge_sidecar.recording import records, spool
from openforge_sidecar.recording import resume as resuming

if TYPE_CHECKING:  # imported only with a collector, once the proxy serves: gRPC is ~8 MB
    from openforge_sidecar.recording import exporter as exporting

log = logging.getLogger("openforge.sidecar")

#: A request body larger than this waits for its record in a file (:meth:`Recorder.stash`).
STASH_BYTES = memory.LARGE_BYTES


@dataclass(frozen=True, kw_only=True)
class Identity:
    """Who the records are of: the rollout, as its started record names it."""

    job: str
    rollout_id: str
    task_id: str = ""
    sample_index: int = 0
    attempt: int = 0
    harness: str = ""
    policy_version: int = 0
    labels: dict[str, str] = field(default_factory=dict)


class Writer:
    """Appends records to the spool from one thread, fsync per batch.

    Keeps the event loop free of disk waits; the spool tells its listeners
    (the exporter) after each batch is durable. ``put`` returns a ticket;
    ``wait`` blocks until every record up to that ticket is durable, or was
    given up: a batch the spool refuses is appended again a record at a time,
    and a record it still refuses (over the size limit, a stashed body
    changed, an ID out of range, the disk full) goes to ``on_failed``, whose
    answer (a loss report) is appended in its place, at once. One record
    never stops the writer, and with it every record after it.
    """

    def __init__(
        self,
        store: spool.Spool,
        *,
        on_failed: Callable[[spool.Entry, Exception], spool.Entry | None],
    ) -> None:
        self._spool = store
        self._on_failed = on_failed
        self._queue: queue.Queue[spool.Entry | None] = queue.Queue()
        self._durable = threading.Condition()
        self._queued = 0
        self._written = 0
        self._thread = threading.Thread(target=self._run, name="openforge-spool", daemon=True)
        self._thread.start()

    def put(self, record: spool.Entry) -> int:
        with self._durable:
            self._queued += 1
            ticket = self._queued
        self._queue.put(record)
        return ticket

    def wait(self, ticket: int, timeout: float | None = None) -> bool:
        with self._durable:
            return self._durable.wait_for(lambda: self._written >= ticket, timeout)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        stop = False
        while not stop:
            batch = [self._queue.get()]
            while not self._queue.empty():
                batch.append(self._queue.get_nowait())
            stop = None in batch
            found = [r for r in batch if r is not None]
            if any(isinstance(r, records.CallRecord) and r.large for r in found):
                # what the call freed (its answer's buffers, read whole) goes back to the
                # OS before its record is written beside it (this thread's wait, not the
                # event loop's)
                memory.return_freed_memory()
            if found:
                self._append(found)
                with self._durable:
                    self._written += len(found)
                    self._durable.notify_all()
            # not kept while waiting for the next record: a large call's would stay resident
            del batch, found

    def _append(self, entries: list[spool.Entry]) -> None:
        try:
            self._spool.append(entries)
        except Exception as exc:  # a bad record must not end the thread
            if len(entries) > 1:  # the spool wrote none of them: find the one at fault
                for entry in entries:
                    self._append([entry])
                return
            _release(entries)
            instead = self._on_failed(entries[0], exc)
            if instead is not None:
                try:
                    self._spool.append([instead])
                except Exception:  # the disk itself: a restart or the drain reports it
                    log.exception("spooling %s failed too", instead.idempotency_key)
            return
        _release(entries)


def _release(entries: list[spool.Entry]) -> None:
    for entry in entries:
        if isinstance(entry, records.CallRecord):
            entry.release()


class Recorder:
    """The records of one rollout, on the spool in ``directory``.

    Opening it resumes what the spool already holds (a restarted sidecar):
    call indexes go on after the highest one begun, calls that were in flight
    when the last sidecar stopped are reported lost, and the started record is
    written only once.
    """

    def __init__(self, directory: Path, *, identity: Identity, stats: Counter[str]) -> None:
        self.directory = directory
        self.identity = identity
        self.stats = stats
        self.spool = spool.Spool(directory)
        found = resuming.resume(self.spool, directory / resuming.INFLIGHT_JOURNAL)
        self._next_call, self._next_lost = found.next_call, found.next_lost
        self.finished = found.finished
        self.restarted = found.next_call > 0
        self._journal: int | None = os.open(
            directory / resuming.INFLIGHT_JOURNAL, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
        )
        shutil.rmtree(
            directory / records.STASH_DIRECTORY, ignore_errors=True
        )  # an earlier sidecar's
        self._losing = threading.Lock()  # loss reports come from the writer's thread too
        self._writer = Writer(self.spool, on_failed=self._not_spooled)
        self._exporter: exporting.Exporter | None = None
        self._exporter_task: asyncio.Task[None] | None = None
        for index in found.vanished_calls:
            self.lose(
                f"the sidecar stopped while call {index} was in flight",
                whole=False,
                call_index=index,
            )
        if not found.started:
            self._writer.put(
                records.started(
                    job=identity.job,
                    rollout_id=identity.rollout_id,
                    task_id=identity.task_id,
                    sample_index=identity.sample_index,
                    attempt=identity.attempt,
                    harness=identity.harness,
                    policy_version=identity.policy_version,
                    labels=identity.labels,
                )
            )

    @property
    def calls(self) -> int:
        """Call indexes given out, on this spool, by this sidecar and those before it."""
        return self._next_call

    def claim_call_index(self) -> int:
        """The next call index (noted in the journal by :meth:`journal`)."""
        index = self._next_call
        self._next_call += 1
        return index

    def stash(self, index: int, body: bytes) -> records.Body:
        """``body``, the request of call ``index``, as its record will take it: a body
        over :data:`STASH_BYTES` is written to a file beside the spool and read back, a
        piece at a time, when the record is spooled; until then the call is answered
        without it in memory. Not fsync'd: a sidecar that dies before the record is
        spooled reports the call lost (see :meth:`journal`), and its successor (or the
        drain) deletes the file. A body that cannot be written stays in memory."""
        if len(body) <= STASH_BYTES:
            return body
        path = self.directory / records.STASH_DIRECTORY / f"{index}.body"
        try:
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(body)
        except OSError as exc:
            log.warning("call %d: its body stays in memory (%s)", index, exc)
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
            return body
        return records.Stashed(path, len(body))

    def stash_ids(self, index: int, ids: stored.Ids) -> stored.Ids:
        """The prompt IDs of call ``index``, as its record will take them: over
        ``stored.SPILL_IDS`` they wait in a file beside the spool (if they are not in one
        already), as a large body does (:meth:`stash`), and are read back a chunk at a
        time when the record is spooled."""
        if isinstance(ids, stored.StoredIds) or len(ids) <= stored.SPILL_IDS:
            return ids
        path = self.directory / records.STASH_DIRECTORY / f"{index}.ids"
        try:
            return stored.StoredIds.write(path, ids)
        except OSError as exc:
            log.warning("call %d: its prompt's IDs stay in memory (%s)", index, exc)
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
            return ids

    def journal(self, index: int) -> None:
        """Note call ``index`` in the in-flight journal, before it is answered.

        Written, not fsync'd: it must survive a killed process, not a lost
        machine. A sidecar restarted on this spool reports every call the
        journal names and the spool lacks as lost, never drops it silently.
        """
        if self._journal is not None:
            os.write(self._journal, f"{index}\n".encode())

    def call(self, finished: records.Call) -> None:
        """Spool a finished call."""
        self._put(
            records.call(
                job=self.identity.job, rollout_id=self.identity.rollout_id, finished=finished
            )
        )
        self.stats["spooled_calls"] += 1

    def lose(self, reason: str, *, whole: bool, call_index: int = 0) -> None:
        """Report a call (or the whole rollout) lost, with why."""
        self._put(self._lost(reason, whole=whole, call_index=call_index))

    def _lost(self, reason: str, *, whole: bool, call_index: int) -> pb.Record:
        """A loss report with the next index (the writer's thread makes them too)."""
        with self._losing:
            record = records.lost(
                job=self.identity.job,
                rollout_id=self.identity.rollout_id,
                index=self._next_lost,
                reason=reason,
                call_index=call_index,
                whole=whole,
            )
            self._next_lost += 1
            self.stats["lost_reported"] += 1
        return record

    def _not_spooled(self, entry: spool.Entry, exc: Exception) -> pb.Record | None:
        """A record the spool refused (in the writer's thread): a call's loss report, to be
        spooled in its place."""
        log.error("spooling %s failed: %s", entry.idempotency_key, exc)
        with self._losing:
            self.stats["spool_failed"] += 1
        if not isinstance(entry, records.CallRecord):
            return None
        index = int(entry.record.call.call_index)
        return self._lost(f"spooling call {index} failed: {exc}", whole=False, call_index=index)

    def finish(
        self,
        *,
        exit_code: int,
        reward: float | None,
        grader_output: str,
        status: str,
        retried: bool = False,
    ) -> int | None:
        """Spool the rollout's finished record, once: its writer ticket, None when it was
        finished already."""
        if self.finished:
            return None
        self.finished = True
        return self._put(
            records.finished(
                job=self.identity.job,
                rollout_id=self.identity.rollout_id,
                exit_code=exit_code,
                reward=reward,
                grader_output=grader_output,
                call_count=self._next_call,
                status=status,
                retried=retried,
            )
        )

    def wait(self, ticket: int) -> bool:
        """Block until the record of ``ticket`` and all before it are durable."""
        return self._writer.wait(ticket)

    async def export(self, collector: str, *, token: str | None) -> None:
        """Start streaming the spool to ``collector`` (host:port), once.

        gRPC is imported in a worker thread (50 ms of CPU a rollout's first
        call should not wait for). Until the exporter runs, records wait,
        fsync'd, in the spool.
        """
        if self._exporter is not None:
            return
        module = await asyncio.to_thread(
            importlib.import_module, "openforge_sidecar.recording.exporter"
        )
        if self._exporter is None:  # another caller may have started it meanwhile
            self._exporter = module.Exporter(self.spool, collector, token=token)
            self._exporter_task = asyncio.create_task(self._exporter.run())

    async def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the collector to acknowledge every spooled record;
        True when it did, or when nothing exports."""
        if self._exporter is None:
            return True
        return await self._exporter.flush(timeout)

    def exporter_stats(self) -> dict[str, Any]:
        return self._exporter.stats() if self._exporter is not None else {}

    async def close(self, *, flush_timeout: float) -> None:
        """Make every record durable, give the collector ``flush_timeout`` s to acknowledge
        them, and stop. What it does not acknowledge stays in the spool for the next
        sidecar (or the drain) to send."""
        await asyncio.to_thread(self._writer.close)
        if self._exporter is not None:
            if not await self._exporter.flush(flush_timeout):
                log.error(
                    "collector did not acknowledge %d spooled records before shutdown; "
                    "they stay in %s and are sent when a sidecar restarts on it",
                    self.spool.unacked_count,
                    self.directory,
                )
            await self._exporter.stop()
        if self._journal is not None:
            os.close(self._journal)
            self._journal = None

    def _put(self, record: spool.Entry) -> int:
        return self._writer.put(record)
