from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from openforge.trajectory import auth
from openforge.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from openforge_trainer.collection import collector, store

MASTER_KEY = b"m" * 48


def records(rollout: str, count: int, job: str = "job") -> list[trajectory_pb2.Record]:
    return [
        trajectory_pb2.Record(
            idempotency_key=f"{rollout}/call/{i}",
            sequence=i + 1,
            job=job,
            rollout_id=rollout,
            call=trajectory_pb2.ModelCall(call_index=i, prompt_token_ids=[1, i]),
        )
        for i in range(count)
    ]


async def push(
    port: int, batch: Sequence[trajectory_pb2.Record], metadata: tuple[tuple[str, str], ...] = ()
) -> list[Any]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = trajectory_pb2_grpc.TrajectoryServiceStub(channel)

        async def requests() -> AsyncIterator[trajectory_pb2.Record]:
            for record in batch:
                yield record

        return [ack async for ack in stub.Push(requests(), metadata=metadata)]


def with_collector(
    tmp_path: Path,
    body: Callable[[collector.Collector, int], Awaitable[None]],
    *,
    token: str | None = None,
    master_key: bytes | None = None,
) -> None:
    async def main() -> None:
        running, port = await collector.serve(
            tmp_path / "store.db", token=token, master_key=master_key
        )
        try:
            await body(running, port)
        finally:
            await running.stop(1.0)

    asyncio.run(main())


def test_duplicate_delivery_is_stored_once_and_acked_as_duplicate(tmp_path: Path) -> None:
    async def body(running: collector.Collector, port: int) -> None:
        batch = records("r1", 5)
        first = await push(port, batch + batch[:2])  # redelivered within one stream
        assert [(a.sequence, a.duplicate, a.error) for a in first] == [
            *((i, False, "") for i in range(1, 6)),
            (1, True, ""),
            (2, True, ""),
        ]
        # Redelivered on a new stream, and twice within one stream.
        again = await push(port, batch[2:] + batch[2:])
        assert [a.duplicate for a in again] == [True] * 6
        assert [a.idempotency_key for a in again] == [r.idempotency_key for r in batch[2:]] * 2
        assert running.store.record_count() == 5

    with_collector(tmp_path, body)


def test_acks_come_only_after_commit(tmp_path: Path) -> None:
    async def body(running: collector.Collector, port: int) -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = trajectory_pb2_grpc.TrajectoryServiceStub(channel).Push()
            for record in records("r1", 3):
                await call.write(record)
                ack = await call.read()
                # A fresh connection (as a crash-restarted collector would) sees it.
                with store.Store(tmp_path / "store.db") as other:
                    assert other.watermark("r1") == ack.sequence
            await call.done_writing()
            assert await call.read() is grpc.aio.EOF

    with_collector(tmp_path, body)


def test_bad_records_are_refused_naming_the_field(tmp_path: Path) -> None:
    async def body(running: collector.Collector, port: int) -> None:
        good = records("r1", 4)
        good[1].ClearField("idempotency_key")
        good[2].ClearField("rollout_id")
        good[3].ClearField("call")
        acks = await push(port, good)
        assert acks[0].error == ""
        assert "idempotency_key is required" in acks[1].error
        assert "rollout_id is required" in acks[2].error
        assert "body is required" in acks[3].error
        assert [a.sequence for a in acks] == [1, 2, 3, 4]
        assert running.store.record_count() == 1

    with_collector(tmp_path, body)


def test_watermark(tmp_path: Path) -> None:
    async def body(running: collector.Collector, port: int) -> None:
        batch = records("r1", 5)
        await push(port, [batch[0], batch[1], batch[3]])
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = trajectory_pb2_grpc.TrajectoryServiceStub(channel)
            mark = await stub.GetWatermark(trajectory_pb2.WatermarkRequest(rollout_id="r1"))
            assert (mark.contiguous_sequence, mark.known) == (2, True)
            mark = await stub.GetWatermark(trajectory_pb2.WatermarkRequest(rollout_id="nope"))
            assert (mark.contiguous_sequence, mark.known) == (0, False)
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await stub.GetWatermark(trajectory_pb2.WatermarkRequest())
            assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "rollout_id" in (error.value.details() or "")

    with_collector(tmp_path, body)


@pytest.mark.parametrize("metadata", [(), (("authorization", "Bearer wrong"),)])
def test_unauthenticated_push_is_refused(
    tmp_path: Path, metadata: tuple[tuple[str, str], ...]
) -> None:
    async def body(running: collector.Collector, port: int) -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = trajectory_pb2_grpc.TrajectoryServiceStub(channel)
            # Refused before reading anything. (Writing first would race the refusal,
            # which grpc/grpc#36066 then reports as INTERNAL on the client.)
            call = stub.Push(metadata=metadata)
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await call.read()
            assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "bearer token" in (error.value.details() or "")
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await stub.GetWatermark(
                    trajectory_pb2.WatermarkRequest(rollout_id="r1"), metadata=metadata
                )
            assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert running.store.record_count() == 0
        acks = await push(port, records("r1", 2), (("authorization", "Bearer s3cret"),))
        assert [a.error for a in acks] == ["", ""]
        assert running.store.record_count() == 2

    with_collector(tmp_path, body, token="s3cret")


def test_many_records_are_batched_and_all_acked_in_order(tmp_path: Path) -> None:
    async def body(running: collector.Collector, port: int) -> None:
        batch = records("r1", 2000)
        acks = await push(port, batch)
        assert [a.sequence for a in acks] == list(range(1, 2001))
        assert running.store.watermark("r1") == 2000

    with_collector(tmp_path, body)


def test_graceful_stop_closes_the_port(tmp_path: Path) -> None:
    async def main() -> None:
        running, port = await collector.serve(tmp_path / "store.db")
        await push(port, records("r1", 1))
        await running.stop(0.5)
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await push(port, records("r1", 1))
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE

    asyncio.run(main())


def test_serve_reports_an_address_it_cannot_bind(tmp_path: Path) -> None:
    async def main() -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            listen = f"127.0.0.1:{taken.getsockname()[1]}"
            with pytest.raises(OSError, match=f"cannot listen on {listen}"):
                await collector.serve(tmp_path / "store.db", listen=listen)
        for bad in ("127.0.0.1:99999", "127.0.0.1", ":50051", "127.0.0.1:http"):
            with pytest.raises(ValueError, match=r"listen: .* is not HOST:PORT"):
                await collector.serve(tmp_path / "store.db", listen=bad)

    asyncio.run(main())


# -- per-job tokens ------------------------------------------------------------------


def bearer(namespace: str, name: str, uid: str = "uid-1") -> tuple[tuple[str, str], ...]:
    token = auth.issue(MASTER_KEY, auth.JobIdentity(namespace, name, uid))
    return (("authorization", f"Bearer {token}"),)


async def watermark(port: int, rollout: str, metadata: tuple[tuple[str, str], ...]) -> Any:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = trajectory_pb2_grpc.TrajectoryServiceStub(channel)
        request = trajectory_pb2.WatermarkRequest(rollout_id=rollout)
        return await stub.GetWatermark(request, metadata=metadata)


def test_a_job_token_writes_its_jobs_records_and_none_of_another_jobs(tmp_path: Path) -> None:
    async def body(running: collector.Collector, port: int) -> None:
        own = records("job-a-0-0", 3, job="job-a")
        theirs = records("job-b-0-0", 2, job="job-b")
        # B's job name on B's rollout; A's job name on B's rollout; A's rollout, B's keys
        mislabelled = records("job-b-1-0", 1, job="job-a")
        squatting = records("job-a-1-0", 1, job="job-a")
        squatting[0].idempotency_key = "job-b-0-0/call/5"
        stream = [own[0], theirs[0], own[1], *mislabelled, theirs[1], *squatting, own[2], own[0]]
        acks = await push(port, stream, bearer("rl", "job-a"))
        assert [a.idempotency_key for a in acks] == [r.idempotency_key for r in stream]
        errors = [a.error for a in acks]
        assert errors[0] == errors[2] == errors[6] == errors[7] == ""
        assert errors[1] == (
            "record 'job-b-0-0/call/0' (sequence 1): job 'job-b' is not this stream's job:"
            " its token is for RolloutJob rl/job-a (uid uid-1)"
        )
        assert "record 'job-b-0-0/call/1' (sequence 2): job 'job-b'" in errors[4]
        assert "rollout_id 'job-b-1-0' is not a rollout of job 'job-a'" in errors[3]
        assert "idempotency_key 'job-b-0-0/call/5' does not start with" in errors[5]
        assert acks[7].duplicate, "a redelivery is acked as a duplicate"
        assert running.store.record_count("job-a") == 3, "A's records, each once"
        assert running.store.record_count() == 3, "nothing of B's"
        assert running.store.rollout("job-b-0-0") is None
        assert running.store.rollout("job-b-1-0") is None
        # B's own token still writes B's records: A took none of B's keys
        acks = await push(port, theirs, bearer("rl", "job-b"))
        assert [(a.error, a.duplicate) for a in acks] == [("", False), ("", False)]

    with_collector(tmp_path, body, master_key=MASTER_KEY)


def test_a_job_name_belongs_to_the_first_rolloutjob_that_wrote_it(tmp_path: Path) -> None:
    """Records name jobs by name: a same-named job in another namespace, or a later job
    of the same name (another uid), cannot write into (or resume from) the first one's."""

    async def body(running: collector.Collector, port: int) -> None:
        first = records("job-0-0", 2)
        assert [a.error for a in await push(port, first, bearer("team-a", "job"))] == ["", ""]
        for intruder in (bearer("team-b", "job"), bearer("team-a", "job", "uid-2")):
            mark = await watermark(port, "job-0-0", intruder)
            assert (mark.contiguous_sequence, mark.known) == (0, False)
            acks = await push(port, records("job-0-0", 3), intruder)
            assert all(
                "in this collector's store belongs to RolloutJob team-a/job (uid uid-1)" in a.error
                for a in acks
            )
            assert all("give the job another name" in a.error for a in acks)
        assert running.store.record_count() == 2
        mark = await watermark(port, "job-0-0", bearer("team-a", "job"))
        assert (mark.contiguous_sequence, mark.known) == (2, True)

    with_collector(tmp_path, body, master_key=MASTER_KEY)
    with store.Store(tmp_path / "store.db") as db:  # the claim outlives the process
        assert db.job_owner("job") == "team-a/job/uid-1"


def test_a_job_token_resumes_only_its_own_rollouts(tmp_path: Path) -> None:
    async def body(running: collector.Collector, port: int) -> None:
        await push(port, records("job-b-0-0", 2, job="job-b"), bearer("rl", "job-b"))
        await push(port, records("job-a-0-0", 3, job="job-a"), bearer("rl", "job-a"))
        mark = await watermark(port, "job-a-0-0", bearer("rl", "job-a"))
        assert (mark.contiguous_sequence, mark.known) == (3, True)
        mark = await watermark(port, "job-b-0-0", bearer("rl", "job-a"))
        assert (mark.contiguous_sequence, mark.known) == (0, False)

    with_collector(tmp_path, body, master_key=MASTER_KEY)


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ((), "missing or wrong bearer token"),
        ((("authorization", "Bearer s3cret"),), "missing or wrong bearer token"),
        (
            (
                (
                    "authorization",
                    f"Bearer {auth.issue(b'x' * 32, auth.JobIdentity('rl', 'job', 'u'))}",
                ),
            ),
            "bearer token refused: the token's mac does not match",
        ),
        ((("authorization", "Bearer ofj1.!!.AA"),), "bearer token refused: the token's job part"),
    ],
)
def test_a_collector_with_a_master_key_refuses_other_tokens(
    tmp_path: Path, metadata: tuple[tuple[str, str], ...], message: str
) -> None:
    async def body(running: collector.Collector, port: int) -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = trajectory_pb2_grpc.TrajectoryServiceStub(channel).Push(metadata=metadata)
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await call.read()
            assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert message in (error.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await watermark(port, "job-0-0", metadata)
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert running.store.record_count() == 0

    with_collector(tmp_path, body, master_key=MASTER_KEY)


def test_a_shared_token_beside_a_master_key_writes_any_record(tmp_path: Path) -> None:
    async def body(running: collector.Collector, port: int) -> None:
        shared = (("authorization", "Bearer s3cret"),)
        acks = await push(port, records("anything", 2, job="webhook"), shared)
        assert [a.error for a in acks] == ["", ""]
        acks = await push(port, records("job-0-0", 1), bearer("rl", "job"))
        assert [a.error for a in acks] == [""]
        assert running.store.record_count() == 3

    with_collector(tmp_path, body, token="s3cret", master_key=MASTER_KEY)
