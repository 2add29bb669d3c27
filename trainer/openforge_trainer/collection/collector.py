"""The trajectory collector: the gRPC end of the sidecars' record streams.

``Push`` reads records as they come, takes whatever has arrived (up to
``batch_max`` records, waiting at most ``batch_wait_s`` for more once one is
in hand), commits the batch to the store in a worker thread, and only then
answers one Ack per record, in order. An Ack therefore always means durable
(or refused: a record that lacks a required field gets an Ack whose
``error`` names the field, and is not stored). Redelivered records are
acknowledged with ``duplicate`` set: durable either way. A record a sidecar sent in
parts is taken once its parts are joined (:mod:`parts`; the collector says it joins them
in the stream's initial metadata).

Authentication is a bearer token in the ``authorization`` metadata, of one
of two kinds; a collector that has either refuses a call without one
(UNAUTHENTICATED, before a record is read):

* a shared token (``token``): its holder may write any record (``openforge
  run``, one trusted job);
* a per-job token (``master_key``, see ``openforge.trajectory.auth``): the
  operator issues one per RolloutJob, and the stream may write that job's
  records only. Any other record gets an Ack whose ``error`` names the record
  and the job and is not stored; so does every record of a job name that
  another RolloutJob (another namespace, or a deleted one of the same name)
  claimed first in this store. ``GetWatermark`` answers "nothing held" for a
  rollout the token may not write, so the sidecar sends those records and
  learns why they are refused.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
from openforge.api import rollouts
from openforge.trajectory import auth, channel
from openforge.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc

from openforge_trainer.collection import parts
from openforge_trainer.collection import store as store_module

log = logging.getLogger(__name__)

Record = Any  # trajectory_pb2.Record

_END = object()
#: The initial metadata of an accepted ``Push``: it joins records sent in parts.
_ACCEPTED = ((channel.RECORD_PARTS_METADATA, "1"),)


class TrajectoryService(trajectory_pb2_grpc.TrajectoryServiceServicer):  # type: ignore[misc]
    def __init__(
        self,
        store: store_module.Store,
        *,
        token: str | None = None,
        master_key: bytes | None = None,
        batch_max: int = 512,
        batch_wait_s: float = 0.002,
    ) -> None:
        self.store = store
        self.token = token
        self.master_key = master_key
        self.batch_max = batch_max
        self.batch_wait_s = batch_wait_s
        # job name -> the identity that claimed it (claims never change)
        self._owners: dict[str, str] = {}

    async def _authenticate(self, context: grpc.aio.ServicerContext) -> auth.JobIdentity | None:
        """The job the caller's token binds it to; None for a shared token or no auth."""
        if self.token is None and self.master_key is None:
            return None
        metadata = dict(context.invocation_metadata() or ())
        presented = str(metadata.get("authorization", ""))
        scheme, _, token = presented.partition(" ")
        if scheme == "Bearer" and self.master_key is not None and auth.is_job_token(token):
            try:
                return auth.verify(self.master_key, token)
            except auth.TokenError as error:
                await context.abort(
                    grpc.StatusCode.UNAUTHENTICATED, f"bearer token refused: {error}"
                )
        if self.token is not None and hmac.compare_digest(
            presented.encode(), f"Bearer {self.token}".encode()
        ):
            return None
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        raise AssertionError("unreachable: abort raises")

    async def Push(
        self, request_iterator: AsyncIterator[Record], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Record]:
        identity = await self._authenticate(context)
        # Tells the client it is accepted before it writes anything (see
        # Exporter._open: a write racing a refusal hides the refusal).
        await context.send_initial_metadata(_ACCEPTED)
        queue: asyncio.Queue[object] = asyncio.Queue()
        reader = asyncio.create_task(_drain(request_iterator, queue))
        try:
            while True:
                batch = await self._next_batch(queue)
                if not batch:
                    break
                for ack in await self._commit(batch, identity):
                    yield ack
                if batch[-1] is _END:
                    break
        finally:
            reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)

    async def _next_batch(self, queue: asyncio.Queue[object]) -> list[Any]:
        first = await queue.get()
        batch = [first]
        if first is _END:
            return []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.batch_wait_s
        while len(batch) < self.batch_max and batch[-1] is not _END:
            if queue.empty():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(queue.get(), remaining))
                except TimeoutError:
                    break
            else:
                batch.append(queue.get_nowait())
        return batch

    async def _commit(self, batch: list[Any], identity: auth.JobIdentity | None) -> list[Record]:
        records = [item for item in batch if item is not _END]
        acks: list[Record] = []
        valid: list[Record] = []
        for record in records:
            if isinstance(record, parts.Refused):
                acks.append(trajectory_pb2.Ack(sequence=record.sequence, error=record.reason))
                log.warning("refused record seq=%d: %s", record.sequence, record.reason)
                continue
            ack = trajectory_pb2.Ack(
                idempotency_key=record.idempotency_key, sequence=record.sequence
            )
            try:
                store_module.check(record)
                if identity is not None:
                    await self._check_scope(record, identity)
            except store_module.StoreError as exc:
                ack.error = str(exc)
                log.warning("refused record seq=%d: %s", record.sequence, exc)
            else:
                valid.append(record)
            acks.append(ack)
        stored = iter(await asyncio.to_thread(self.store.put, valid) if valid else [])
        for ack in acks:
            if not ack.error:
                ack.duplicate = not next(stored)
        return acks

    async def _check_scope(self, record: Record, identity: auth.JobIdentity) -> None:
        """Raise StoreError unless a stream holding ``identity``'s token may write ``record``."""
        where = f"record {record.idempotency_key!r} (sequence {record.sequence})"
        problem = auth.record_problem(
            identity,
            job=record.job,
            rollout_id=record.rollout_id,
            idempotency_key=record.idempotency_key,
        )
        if problem is not None:
            raise store_module.StoreError(f"{where}: {problem}")
        owner = await self._claim(identity)
        if owner != str(identity):
            raise store_module.StoreError(
                f"{where}: job {identity.name!r} in this collector's store belongs to"
                f" {_describe(owner)}, and this stream's token is for {identity.describe()}"
                " (a job name holds one RolloutJob per store: give the job another name)"
            )

    async def _claim(self, identity: auth.JobIdentity) -> str:
        owner = self._owners.get(identity.name)
        if owner is None:
            owner = await asyncio.to_thread(self.store.claim_job, identity.name, str(identity))
            self._owners[identity.name] = owner
        return owner

    async def _may_read(self, rollout_id: str, identity: auth.JobIdentity | None) -> bool:
        if identity is None:
            return True
        if not rollouts.is_pod_of(identity.name, rollout_id):
            return False
        owner = self._owners.get(identity.name) or await asyncio.to_thread(
            self.store.job_owner, identity.name
        )
        return owner in (None, str(identity))

    async def GetWatermark(self, request: Record, context: grpc.aio.ServicerContext) -> Record:
        identity = await self._authenticate(context)
        if not request.rollout_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "rollout_id is required")
        rollout_id = request.rollout_id
        if not await self._may_read(rollout_id, identity):
            # not this token's to resume: "nothing held", so the sidecar sends the
            # records and each is refused with the reason
            return trajectory_pb2.Watermark(contiguous_sequence=0, known=False)
        known = await asyncio.to_thread(self.store.rollout, rollout_id) is not None
        contiguous = await asyncio.to_thread(self.store.watermark, rollout_id)
        return trajectory_pb2.Watermark(contiguous_sequence=contiguous, known=known)


def _describe(owner: str) -> str:
    try:
        return auth.JobIdentity.parse(owner).describe()
    except auth.TokenError:
        return repr(owner)


async def _drain(request_iterator: AsyncIterator[Record], queue: asyncio.Queue[object]) -> None:
    """Queue the stream's records as they come, those sent in parts once joined."""
    joiner = parts.Joiner()
    try:
        async for record in request_iterator:
            for item in joiner.add(record):
                queue.put_nowait(item)
    finally:
        if joiner.unfinished is not None:
            log.info("record %d: the stream ended inside its parts", joiner.unfinished)
        queue.put_nowait(_END)


@dataclasses.dataclass
class Collector:
    """A running collector: the gRPC server and the store it owns."""

    server: grpc.aio.Server
    store: store_module.Store
    port: int

    async def stop(self, grace: float | None = 5.0) -> None:
        """Stop accepting calls, let in-flight ones finish, close the store."""
        await self.server.stop(grace)
        self.store.close()

    async def wait_for_termination(self) -> None:
        await self.server.wait_for_termination()


async def serve(
    store_path: Path | str,
    listen: str = "127.0.0.1:0",
    *,
    token: str | None = None,
    master_key: bytes | None = None,
    **service_options: Any,
) -> tuple[Collector, int]:
    """Open the store and start serving; returns the collector and bound port.

    ``token`` is a shared bearer token, ``master_key`` the key of per-job tokens
    (``openforge.trajectory.auth``); either or both, or neither (no auth).

    Raises ValueError for a malformed ``listen`` and OSError when it cannot bind.
    """
    check_listen(listen)
    store = store_module.Store(store_path)
    server = grpc.aio.server(options=channel.options())
    trajectory_pb2_grpc.add_TrajectoryServiceServicer_to_server(
        TrajectoryService(store, token=token, master_key=master_key, **service_options), server
    )
    try:
        port = server.add_insecure_port(listen)
    except RuntimeError as exc:
        store.close()
        raise OSError(f"collector cannot listen on {listen}: {exc}") from exc
    if port == 0:
        store.close()
        raise OSError(f"collector cannot listen on {listen}")
    await server.start()
    log.info("collector serving %s on port %d", store_path, port)
    return Collector(server=server, store=store, port=port), port


def check_listen(listen: str) -> None:
    """Reject what gRPC would misread (it wraps port 99999 to 34463, silently)."""
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"listen: {listen!r} is not HOST:PORT with a port in 0..65535")
