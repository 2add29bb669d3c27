"""Streams the spool to the collector until every record is acknowledged.

The exporter runs as one asyncio task beside the proxy. A session opens a
channel, asks the collector (``GetWatermark``) what it already holds of each
rollout still unacknowledged here, then keeps one ``Push`` stream open:
a sender writes unacknowledged records (at most ``window`` in flight) and
sleeps until :meth:`Exporter.notify` says more were appended; a receiver
reads Acks. Acks may come for any record; the spool's ack mark only moves
over a contiguous run (a persister task writes it, coalescing bursts so the
fsync is paid once per burst, not once per ack); with ``compact=True`` it
then deletes fully acknowledged segments. Compaction is off by default
because the capture addon rereads the whole spool when it restarts.

Any failure (collector down, stream broken, token refused) ends the session;
the next starts after a capped exponential backoff and resends from the ack
mark, skipping what was already acked out of order. Redelivered records are
acknowledged as duplicates by the collector, so resending is always safe.

A record the collector refuses (``Ack.error``) would be refused again: it is
counted, logged, and treated as acknowledged so it cannot block the spool.

A record over ``channel.PART_BYTES`` goes to a collector that joins parts (it says so
in its initial metadata) as ``RecordPart`` messages, read from the spool's segment one
part at a time: sent whole, it was held twice (the frame read, and gRPC's copy of it),
for a 30 MB call some 80 MB. To an older collector it goes whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from typing import Any, TypeAlias

import grpc
from openforge.trajectory import channel
from openforge.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc

from openforge_sidecar import memory
from openforge_sidecar.recording import records
from openforge_sidecar.recording import spool as spool_module

log = logging.getLogger(__name__)

Record = Any  # trajectory_pb2.Record


#: A batch read from the spool stops at this many bytes of records.
BATCH_BYTES = 8 * 1024 * 1024
#: A frame over this many bytes is a large call's record: freed memory is handed back
#: before it is sent (see :meth:`Exporter._send`).
LARGE_RECORD_BYTES = memory.LARGE_BYTES
_PUSH = "/{}/Push".format(trajectory_pb2.DESCRIPTOR.services_by_name["TrajectoryService"].full_name)


def _as_is(payload: bytes) -> bytes:
    """A Push message's serializer: the spool's frame is the record's serialization."""
    return payload


def _part(frame: spool_module.LargeFrame, *, offset: int, sequence: int) -> bytes:
    """The Push message of ``frame``'s part at ``offset``: its piece, read from the spool,
    behind the part's head (see ``records.part_head``): two copies of the part at once,
    since gRPC takes a message only as ``bytes`` (a ``bytearray`` read into in place is
    refused)."""
    piece = frame.read(offset, channel.PART_BYTES)
    head = records.part_head(
        sequence=sequence, offset=offset, total_bytes=len(frame), size=len(piece)
    )
    return head + piece


def _ack(data: bytes) -> Any:
    return trajectory_pb2.Ack.FromString(data)


class _StreamEnded(Exception):
    """The collector closed the Push stream (it should not, but may on shutdown)."""


class _Refused(Exception):
    """The collector ended the Push stream before accepting it."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code


#: A record's sequence and bytes (or, to be sent in parts, where they are).
Frame: TypeAlias = "tuple[int, bytes | spool_module.LargeFrame]"


class Exporter:
    """Streams ``spool`` to the collector at ``target`` (``host:port``).

    ``start()`` in a running loop (or run ``await run()`` as a task),
    ``await flush(timeout)`` to drain (on SIGTERM), ``await stop()``.
    ``token`` is sent as a bearer token.
    """

    def __init__(
        self,
        spool: spool_module.Spool,
        target: str,
        *,
        token: str | None = None,
        batch_size: int = 256,
        window: int = 1024,
        backoff_initial_s: float = 0.1,
        backoff_max_s: float = 10.0,
        rpc_timeout_s: float = 10.0,
        compact: bool = False,
    ) -> None:
        self.spool = spool
        self.target = target
        self.batch_size = batch_size
        self.window = window
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.rpc_timeout_s = rpc_timeout_s
        self.compact = compact
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ()
        )
        self._stats = dict.fromkeys(
            ("sent", "acked", "duplicates", "refused", "skipped", "reconnects", "sessions"), 0
        )
        self._last_error = ""
        # Sequences above the durable mark that are already acknowledged.
        self._done: set[int] = set()
        self._contiguous = spool.acked
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._ack_progress = asyncio.Event()
        self._persisted = asyncio.Event()
        self._window_open = asyncio.Event()
        self._in_flight = 0
        self._tasks: list[asyncio.Task[None]] = []
        # This session's collector joins records sent in parts (see _open).
        self._parts = False

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        """Start the exporter's tasks in the running event loop."""
        if self._tasks:
            return
        self._loop = asyncio.get_running_loop()
        self.spool.add_listener(self.notify)
        self._tasks = [
            asyncio.create_task(self._run(), name="exporter"),
            asyncio.create_task(self._persist_forever(), name="exporter-persist"),
        ]

    async def run(self) -> None:
        """Start, then run until cancelled or stopped; stops cleanly either way.

        Returns when :meth:`stop` ends it; raises CancelledError when cancelled.
        """
        self.start()
        try:
            await asyncio.gather(*self._tasks)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
        finally:
            await self.stop()

    async def stop(self) -> None:
        """Stop streaming, after making the ack mark reached so far durable."""
        self.spool.remove_listener(self.notify)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self._persist()

    def notify(self) -> None:
        """Records were appended. Callable from any thread."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # loop closing: nothing left to wake
            loop.call_soon_threadsafe(self._wake.set)

    async def flush(self, timeout: float) -> bool:
        """Wait until everything appended so far is acknowledged and the mark durable."""
        target = self.spool.last_sequence
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.spool.acked < target:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            self._persisted.clear()
            if self.spool.acked >= target:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._persisted.wait(), remaining)
        return True

    def stats(self) -> dict[str, int]:
        """Counters: sent, acked, duplicates, refused, skipped, reconnects, sessions,
        plus the spool's current unacked count."""
        return {**self._stats, "unacked": self.spool.unacked_count}

    @property
    def last_error(self) -> str:
        return self._last_error

    # -- sessions -------------------------------------------------------------

    async def _run(self) -> None:
        delay = self.backoff_initial_s
        while True:
            acked_before = self._stats["acked"] + self._stats["skipped"]
            try:
                await self._session()
            # (OSError: a large record's segment unreadable while its parts are read)
            except (
                grpc.aio.AioRpcError, _Refused, _StreamEnded, asyncio.InvalidStateError, OSError
            ) as exc:  # fmt: skip
                self._note_failure(exc)
            except Exception as exc:  # the exporter must outlive any one bad session
                log.exception("exporter session failed unexpectedly")
                self._last_error = f"{type(exc).__name__}: {exc}"
            if self._stats["acked"] + self._stats["skipped"] > acked_before:
                delay = self.backoff_initial_s
            self._stats["reconnects"] += 1
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, self.backoff_max_s)

    def _note_failure(self, exc: BaseException) -> None:
        code: grpc.StatusCode | None = None
        if isinstance(exc, grpc.aio.AioRpcError):
            code, message = exc.code(), f"{exc.code().name}: {exc.details()}"
        elif isinstance(exc, _Refused):
            code, message = exc.code, str(exc)
        else:
            message = f"{type(exc).__name__}: {exc}"
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            log.error("collector %s refused the exporter: %s", self.target, message)
        else:
            log.warning("collector %s: %s; will reconnect", self.target, message)
        self._last_error = message

    async def _session(self) -> None:
        self._stats["sessions"] += 1
        async with grpc.aio.insecure_channel(
            self.target, options=channel.options()
        ) as grpc_channel:
            stub = trajectory_pb2_grpc.TrajectoryServiceStub(grpc_channel)
            await self._skip_held(stub)
            # the spool's frames are serialized records: sent as they are, not parsed and
            # serialized again (a large call's record would be held three times)
            push = grpc_channel.stream_stream(
                _PUSH,
                request_serializer=_as_is,
                response_deserializer=trajectory_pb2.Ack.FromString,
            )
            call = await self._open(push)
            self._in_flight = 0
            self._window_open.set()
            tasks = [
                asyncio.create_task(self._send(call), name="exporter-send"),
                asyncio.create_task(self._receive(call), name="exporter-receive"),
            ]
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                call.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            for task in done:
                task.result()
            raise _StreamEnded("the collector ended the Push stream")

    async def _open(self, push: Any) -> Any:
        """Open the Push stream and wait for the collector to accept it.

        The collector sends its initial metadata once the token is checked.
        Waiting for it before the first write matters: a write that races the
        collector's refusal makes grpc report INTERNAL instead of the real
        status (grpc/grpc#36066).
        """
        call = push(metadata=self._metadata)
        accepted = await call.initial_metadata()
        if call.done():
            raise _Refused(await call.code(), await call.details())
        self._parts = any(key == channel.RECORD_PARTS_METADATA for key, _ in accepted or ())
        return call

    async def _skip_held(self, stub: Any) -> None:
        """Treat as acked what the collector already holds (acks lost in a crash)."""
        pending = await asyncio.to_thread(self._pending, self._contiguous)
        rollouts = sorted({rollout_id for _, rollout_id in pending})
        watermarks: dict[str, int] = {}
        for rollout_id in rollouts:
            reply = await stub.GetWatermark(
                trajectory_pb2.WatermarkRequest(rollout_id=rollout_id),
                metadata=self._metadata,
                timeout=self.rpc_timeout_s,
            )
            watermarks[rollout_id] = int(reply.contiguous_sequence)
        for sequence, rollout_id in pending:
            if sequence <= watermarks.get(rollout_id, 0) and sequence not in self._done:
                self._done.add(sequence)
                self._stats["skipped"] += 1
        self._advance()

    def _pending(self, after: int) -> list[tuple[int, str]]:
        """The sequence and rollout of every record after ``after``, read one at a time
        (a large one's head only)."""
        pending: list[tuple[int, str]] = []
        for sequence, payload in self.spool.frames_after(after, large=LARGE_RECORD_BYTES):
            if isinstance(payload, bytes):
                pending.append((sequence, records.rollout_of(payload)))
            else:
                with payload.mapped() as view:
                    pending.append((sequence, records.rollout_of(view)))
        return pending

    def _unacked(self, after: int, limit: int) -> list[Frame]:
        """Up to ``limit`` frames after ``after``, and no more once those read are
        :data:`BATCH_BYTES` in all (always at least one). A record to be sent in parts is
        not read here (see :meth:`_write_parts`)."""
        frames: list[Frame] = []
        size = 0
        large = channel.PART_BYTES if self._parts else None
        for frame in self.spool.frames_after(after, large=large):
            frames.append(frame)
            size += len(frame[1]) if isinstance(frame[1], bytes) else 0
            if len(frames) >= limit or size >= BATCH_BYTES:
                break
        return frames

    async def _send(self, call: Any) -> None:
        cursor = self._contiguous
        while True:
            self._wake.clear()
            frames = await asyncio.to_thread(self._unacked, cursor, self.batch_size)
            if not frames:
                await self._wake.wait()
                continue
            large = max(len(payload) for _, payload in frames) > LARGE_RECORD_BYTES
            if large:
                # gRPC copies each frame: what the large call that made this one freed goes
                # back to the OS first, not kept resident beside the copy. In a thread: on
                # a large, fragmented heap a trim takes ~0.1 s, which the loop's streams
                # must not wait for.
                await asyncio.to_thread(memory.return_freed_memory)
            cursor = await self._write(call, frames)
            del frames  # not held while the next ones are read
            if large:  # and what sending it freed (its pieces, their messages)
                await asyncio.to_thread(memory.return_freed_memory)

    async def _write(self, call: Any, frames: list[Frame]) -> int:
        """Send ``frames`` not acknowledged yet, each let go of once it is written; the
        sequence of the last."""
        cursor = 0
        frames.reverse()
        while frames:
            cursor, payload = frames.pop()
            if cursor in self._done:
                continue
            while self._in_flight >= self.window:
                self._window_open.clear()
                await self._window_open.wait()
            if isinstance(payload, bytes):
                await call.write(payload)
            else:
                await self._write_parts(call, payload, sequence=cursor)
            self._in_flight += 1
            self._stats["sent"] += 1
        return cursor

    async def _write_parts(
        self, call: Any, frame: spool_module.LargeFrame, *, sequence: int
    ) -> None:
        """Send the record ``frame`` holds as ``RecordPart`` messages, each piece read
        from the spool (in a worker thread) just before it is sent.

        OSError (its segment unreadable) ends the session; the collector drops the
        parts it has, and the record is sent again by a later one."""
        for offset in range(0, len(frame), channel.PART_BYTES):
            message = await asyncio.to_thread(_part, frame, offset=offset, sequence=sequence)
            await call.write(message)
            del message

    async def _receive(self, call: Any) -> None:
        while True:
            ack = await call.read()
            if ack is grpc.aio.EOF:
                return
            self._on_ack(ack)

    def _on_ack(self, ack: Record) -> None:
        sequence = int(ack.sequence)
        self._in_flight = max(0, self._in_flight - 1)
        self._window_open.set()
        if ack.error:
            self._stats["refused"] += 1
            log.error(
                "collector refused record %s (sequence %d): %s; it will not be retried",
                ack.idempotency_key, sequence, ack.error,
            )  # fmt: skip
        elif ack.duplicate:
            self._stats["duplicates"] += 1
        self._stats["acked"] += 1
        if sequence > self._contiguous:
            self._done.add(sequence)
            self._advance()

    def _advance(self) -> None:
        advanced = False
        while self._contiguous + 1 in self._done:
            self._contiguous += 1
            self._done.discard(self._contiguous)
            advanced = True
        if advanced:
            self._ack_progress.set()

    # -- the durable mark ------------------------------------------------------

    async def _persist_forever(self) -> None:
        while True:
            await self._ack_progress.wait()
            self._ack_progress.clear()
            try:
                await self._persist()
            except OSError:
                log.exception("spool %s: cannot write the ack mark; retrying", self.spool.directory)
                self._ack_progress.set()
                await asyncio.sleep(self.backoff_max_s)

    async def _persist(self) -> None:
        if self._contiguous > self.spool.acked:
            await asyncio.to_thread(self._mark_and_compact, self._contiguous)
        self._persisted.set()

    def _mark_and_compact(self, sequence: int) -> None:
        self.spool.mark_acked(sequence)
        if self.compact:
            self.spool.compact()
