"""The exporter against a real collector (gRPC on 127.0.0.1, real SQLite store)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import textwrap
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from openforge.trajectory import channel
from openforge.trajectory.v1 import trajectory_pb2
from openforge_sidecar.recording import exporter, spool
from openforge_trainer.collection import collector


def records(rollout: str, count: int, start: int = 0) -> list[trajectory_pb2.Record]:
    return [
        trajectory_pb2.Record(
            idempotency_key=f"{rollout}/call/{i}",
            job="job",
            rollout_id=rollout,
            call=trajectory_pb2.ModelCall(call_index=i, prompt_token_ids=[1, 2, i]),
        )
        for i in range(start, start + count)
    ]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def fast(s: spool.Spool, target: str, **options: object) -> exporter.Exporter:
    return exporter.Exporter(
        s,
        target,
        backoff_initial_s=0.02,
        backoff_max_s=0.2,
        **options,  # type: ignore[arg-type]
    )


async def drained(s: spool.Spool, port: int) -> exporter.Exporter:
    """An exporter of ``s`` run until everything is acknowledged, then stopped."""
    e = fast(s, f"127.0.0.1:{port}")
    e.start()
    assert await e.flush(10)
    await e.stop()
    return e


def run(
    tmp_path: Path,
    body: Callable[[collector.Collector, int, spool.Spool], Awaitable[None]],
    *,
    token: str | None = None,
) -> None:
    async def main() -> None:
        running, port = await collector.serve(tmp_path / "store.db", token=token)
        try:
            with spool.Spool(tmp_path / "spool") as s:
                await body(running, port, s)
        finally:
            await running.stop(0.5)

    asyncio.run(main())


def assert_stored_exactly(running: collector.Collector, s: spool.Spool) -> None:
    """The store holds every spooled record, once, byte for byte."""
    spooled = {r.idempotency_key: r for r in s.records_after(0)}
    assert running.store.record_count() == len(spooled)
    for rollout in {r.rollout_id for r in spooled.values()}:
        for stored in running.store.records(rollout):
            assert stored == spooled[stored.idempotency_key]


def test_streams_everything_and_acks_durably(tmp_path: Path) -> None:
    async def body(running: collector.Collector, port: int, s: spool.Spool) -> None:
        s.append(records("r1", 50))
        e = fast(s, f"127.0.0.1:{port}", batch_size=7, window=5)
        e.start()
        s.append(records("r1", 30, start=50))  # wakes the running exporter
        assert await e.flush(10)
        await e.stop()
        assert s.acked == 80
        assert e.stats()["sent"] == 80
        assert e.stats()["acked"] == 80
        assert e.stats()["unacked"] == 0
        assert_stored_exactly(running, s)
        assert running.store.watermark("r1") == 80
        with spool.Spool(tmp_path / "spool") as reopened:
            assert reopened.acked == 80

    run(tmp_path, body)


def test_acknowledged_segments_are_compacted(tmp_path: Path) -> None:
    async def body(running: collector.Collector, port: int, _: spool.Spool) -> None:
        with spool.Spool(tmp_path / "small", max_segment_bytes=256) as s:
            for i in range(30):
                s.append(records("r1", 1, start=i))
            assert len(list((tmp_path / "small").glob("segment-*"))) >= 4
            keep = fast(s, f"127.0.0.1:{port}")
            keep.start()
            assert await keep.flush(10)
            await keep.stop()
            assert len(list((tmp_path / "small").glob("segment-*"))) >= 4  # off by default
            s.append(records("r1", 1, start=30))
            e = fast(s, f"127.0.0.1:{port}", compact=True)
            e.start()
            assert await e.flush(10)
            await e.stop()
            assert len(list((tmp_path / "small").glob("segment-*"))) == 1
            assert running.store.record_count() == 31

    run(tmp_path, body)


def test_run_as_a_task_until_stopped(tmp_path: Path) -> None:
    async def body(running: collector.Collector, port: int, s: spool.Spool) -> None:
        e = fast(s, f"127.0.0.1:{port}")
        task = asyncio.create_task(e.run())
        s.append(records("r1", 5))
        assert await e.flush(10)
        await e.stop()
        await task  # ends normally when stopped
        assert s.acked == 5
        cancelled = asyncio.create_task(e.run())
        s.append(records("r1", 1, start=5))
        assert await e.flush(10)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert not e._tasks
        assert_stored_exactly(running, s)

    run(tmp_path, body)


def test_appends_from_another_thread_wake_the_exporter(tmp_path: Path) -> None:
    async def body(running: collector.Collector, port: int, s: spool.Spool) -> None:
        e = fast(s, f"127.0.0.1:{port}")
        e.start()
        await asyncio.sleep(0.1)  # the sender is idle, waiting for a notify

        def writer() -> None:
            for i in range(20):
                s.append(records("r1", 1, start=i))

        thread = threading.Thread(target=writer)
        thread.start()
        await asyncio.to_thread(thread.join)
        assert await e.flush(10)
        await e.stop()
        assert_stored_exactly(running, s)

    run(tmp_path, body)


def test_collector_down_then_back(tmp_path: Path) -> None:
    port = free_port()

    async def main() -> None:
        with spool.Spool(tmp_path / "spool") as s:
            s.append(records("r1", 40))
            e = fast(s, f"127.0.0.1:{port}")
            e.start()
            assert not await e.flush(0.5)
            assert e.stats()["reconnects"] >= 2
            assert "UNAVAILABLE" in e.last_error
            s.append(records("r1", 10, start=40))
            running, bound = await collector.serve(tmp_path / "store.db", f"127.0.0.1:{port}")
            assert bound == port
            try:
                assert await e.flush(10)
                await e.stop()
                assert_stored_exactly(running, s)
                assert running.store.watermark("r1") == 50
                assert e.stats()["acked"] == 50
                # The collector restarts mid-life: the exporter reconnects again.
                await running.stop(0.2)
                running, _ = await collector.serve(tmp_path / "store.db", f"127.0.0.1:{port}")
                e2 = fast(s, f"127.0.0.1:{port}")
                e2.start()
                s.append(records("r1", 5, start=50))
                assert await e2.flush(10)
                await e2.stop()
                assert_stored_exactly(running, s)
            finally:
                await running.stop(0.2)

    asyncio.run(main())


def test_restart_resumes_from_the_ack_mark(tmp_path: Path) -> None:
    async def body(running: collector.Collector, port: int, s: spool.Spool) -> None:
        s.append(records("r1", 500))
        first = fast(s, f"127.0.0.1:{port}", batch_size=4, window=4)
        first.start()
        while s.acked < 10:
            await asyncio.sleep(0.001)
        await first.stop()  # mid-stream, with records in flight
        acked_at_stop = s.acked
        assert 10 <= acked_at_stop < 500
        s.close()
        with spool.Spool(tmp_path / "spool") as again:
            assert again.acked == acked_at_stop
            again.append(records("r1", 10, start=500))
            second = fast(again, f"127.0.0.1:{port}")
            second.start()
            assert await second.flush(10)
            await second.stop()
            stats = second.stats()
            # Each record after the mark went once: sent, or skipped as already held.
            assert stats["sent"] + stats["skipped"] == 510 - acked_at_stop
            assert stats["duplicates"] == 0
            assert_stored_exactly(running, again)

    run(tmp_path, body)


def test_lost_ack_mark_is_recovered_from_the_watermark(tmp_path: Path) -> None:
    """A sidecar that died after the collector stored records but before the ack
    mark was written asks the collector, and sends nothing twice."""

    async def body(running: collector.Collector, port: int, s: spool.Spool) -> None:
        s.append(records("r1", 25))
        first = fast(s, f"127.0.0.1:{port}")
        first.start()
        assert await first.flush(10)
        await first.stop()
        (tmp_path / "spool" / "acked").unlink()  # as if the crash beat the mark
        with spool.Spool(tmp_path / "spool") as again:
            assert again.acked == 0
            again.append(records("r1", 5, start=25))
            second = fast(again, f"127.0.0.1:{port}")
            second.start()
            assert await second.flush(10)
            await second.stop()
            assert second.stats()["skipped"] == 25
            assert second.stats()["sent"] == 5
            assert second.stats()["duplicates"] == 0
            assert again.acked == 30
            assert_stored_exactly(running, again)

    run(tmp_path, body)


def test_redelivery_without_watermark_is_acked_as_duplicate(tmp_path: Path) -> None:
    """Records of a rollout whose sequence 1 the collector lacks get no watermark
    help; redelivering them is still harmless."""

    async def body(running: collector.Collector, port: int, s: spool.Spool) -> None:
        s.append(records("r0", 1))
        s.append(records("r1", 10))  # sequences 2..11: never contiguous from 1
        first = fast(s, f"127.0.0.1:{port}")
        first.start()
        assert await first.flush(10)
        await first.stop()
        (tmp_path / "spool" / "acked").unlink()
        with spool.Spool(tmp_path / "spool") as again:
            second = await drained(again, port)
            assert second.stats()["skipped"] == 1  # r0's one record
            assert second.stats()["duplicates"] == 10
            assert_stored_exactly(running, again)

    run(tmp_path, body)


def test_refused_record_is_counted_and_does_not_block(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def body(running: collector.Collector, port: int, s: spool.Spool) -> None:
        batch = records("r1", 5)
        batch[2].ClearField("call")
        s.append(batch)
        e = fast(s, f"127.0.0.1:{port}")
        e.start()
        assert await e.flush(10)
        await e.stop()
        assert e.stats()["refused"] == 1
        assert s.acked == 5
        assert running.store.record_count() == 4
        assert "r1/call/2" in caplog.text and "body is required" in caplog.text

    run(tmp_path, body)


def test_token_is_sent_and_a_wrong_one_is_refused(tmp_path: Path) -> None:
    async def body(running: collector.Collector, port: int, s: spool.Spool) -> None:
        wrong = fast(s, f"127.0.0.1:{port}", token="guess")
        wrong.start()
        # Nothing pending: the Push stream itself is refused, before any write.
        while wrong.stats()["reconnects"] < 2:
            await asyncio.sleep(0.01)
        assert "UNAUTHENTICATED" in wrong.last_error
        s.append(records("r1", 3))
        assert not await wrong.flush(0.3)
        await wrong.stop()
        assert "UNAUTHENTICATED" in wrong.last_error
        assert running.store.record_count() == 0
        right = fast(s, f"127.0.0.1:{port}", token="s3cret")
        right.start()
        assert await right.flush(10)
        await right.stop()
        assert_stored_exactly(running, s)

    run(tmp_path, body, token="s3cret")


CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from openforge.trajectory.v1 import trajectory_pb2
    from openforge_sidecar.recording import exporter, spool

    async def main():
        s = spool.Spool(Path(sys.argv[1]))
        e = exporter.Exporter(s, sys.argv[2], batch_size=3, window=4)
        e.start()
        def record(i):
            return trajectory_pb2.Record(
                idempotency_key=f"r1/call/{i}", job="job", rollout_id="r1",
                call=trajectory_pb2.ModelCall(call_index=i, prompt_token_ids=[i] * 50),
            )
        i = 0
        while s.acked < 40:
            s.append([record(i)])
            i += 1
            await asyncio.sleep(0.002)
        s.append([record(j) for j in range(i, i + 1000)])  # a burst the kill interrupts
        print(f"burst after {i}", flush=True)
        await asyncio.sleep(60)

    asyncio.run(main())
    """
)


def test_sigkilled_sidecar_resumes_without_loss_or_duplicates(tmp_path: Path) -> None:
    async def body(running: collector.Collector, port: int, s: spool.Spool) -> None:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CHILD, str(tmp_path / "child-spool"), f"127.0.0.1:{port}",
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert child.stdout is not None
        try:
            async with asyncio.timeout(20):
                line = await child.stdout.readline()
            assert line.startswith(b"burst"), line
        finally:
            os.kill(child.pid, signal.SIGKILL)
            await child.wait()
        assert child.returncode == -signal.SIGKILL
        with spool.Spool(tmp_path / "child-spool") as survivor:
            appended = survivor.last_sequence
            assert appended >= 1040
            acked_at_kill = survivor.acked
            assert 40 <= acked_at_kill < appended  # killed mid-stream
            assert running.store.record_count() < appended
            resumed = fast(survivor, f"127.0.0.1:{port}")
            resumed.start()
            assert await resumed.flush(10)
            await resumed.stop()
            assert_stored_exactly(running, survivor)
            assert running.store.watermark("r1") == appended
            stats = resumed.stats()
            assert stats["sent"] + stats["skipped"] == appended - acked_at_kill

    run(tmp_path, body)


def test_ack_mark_moves_only_over_contiguous_acks(tmp_path: Path) -> None:
    async def main() -> None:
        with spool.Spool(tmp_path / "spool") as s:
            s.append(records("r1", 5))
            e = fast(s, "127.0.0.1:1")  # never started: acks are fed by hand
            for sequence in (2, 3, 5):
                e._on_ack(trajectory_pb2.Ack(sequence=sequence))
            await e._persist()
            assert s.acked == 0
            e._on_ack(trajectory_pb2.Ack(sequence=1, duplicate=True))
            await e._persist()
            assert s.acked == 3
            e._on_ack(trajectory_pb2.Ack(sequence=4, error="bad"))
            await e._persist()
            assert s.acked == 5
            stats = e.stats()
            assert (stats["acked"], stats["duplicates"], stats["refused"]) == (5, 1, 1)

    asyncio.run(main())


def test_frames_are_sent_as_the_spool_holds_them_in_batches_of_bounded_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parsed and serialized again, a large call's record was held three times while it
    was sent, and a batch of them all at once."""
    monkeypatch.setattr(exporter, "BATCH_BYTES", 300)
    big = trajectory_pb2.Record(
        idempotency_key="r1/call/9", job="job", rollout_id="r1",
        call=trajectory_pb2.ModelCall(call_index=9, request_json=b"x" * 1000),
    )  # fmt: skip
    written: list[bytes] = []

    class Call:
        async def write(self, payload: bytes) -> None:
            written.append(payload)

    with spool.Spool(tmp_path) as s:
        s.append([*records("r1", 3), big, *records("r1", 2, start=3)])
        e = exporter.Exporter(s, "127.0.0.1:1", batch_size=100)
        batches = [[sequence for sequence, _ in e._unacked(after, 100)] for after in (0, 3, 4)]
        assert batches == [[1, 2, 3, 4], [4], [5, 6]]  # a batch ends with its 300th byte
        assert asyncio.run(e._write(Call(), list(s.frames_after(0)))) == 6
        assert written == [payload for _, payload in s.frames_after(0)]


def large_records(rollout: str, sizes: list[int]) -> list[trajectory_pb2.Record]:
    return [
        trajectory_pb2.Record(
            idempotency_key=f"{rollout}/call/{i}",
            job="job",
            rollout_id=rollout,
            call=trajectory_pb2.ModelCall(call_index=i, request_json=bytes([65 + i]) * size),
        )
        for i, size in enumerate(sizes)
    ]


@pytest.mark.parametrize("joins_parts", [True, False])
def test_a_large_record_goes_in_parts_to_a_collector_that_joins_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, joins_parts: bool
) -> None:
    """Sent whole, a 30 MB call's record was held twice in the sidecar (the frame read,
    gRPC's copy); in parts, one part at a time. A collector that does not say it joins
    parts (an older one) gets records whole."""
    monkeypatch.setattr(channel, "PART_BYTES", 1000)
    monkeypatch.setattr(exporter, "LARGE_RECORD_BYTES", 1000)
    if not joins_parts:
        monkeypatch.setattr(collector, "_ACCEPTED", ())
    sent: list[int] = []

    def as_is(payload: bytes) -> bytes:
        sent.append(len(payload))
        return payload

    monkeypatch.setattr(exporter, "_as_is", as_is)

    async def body(running: collector.Collector, port: int, s: spool.Spool) -> None:
        s.append(large_records("r1", [10, 999, 1000, 1500, 5000, 20]))
        e = await drained(s, port)
        assert e.stats()["sent"] == 6 and e.stats()["acked"] == 6 and s.acked == 6
        assert_stored_exactly(running, s)
        sizes = [len(payload) for _, payload in s.frames_after(0)]
        if joins_parts:  # those over 1000 bytes in parts of at most 1000, + framing
            assert max(sent) < 1100 and len(sent) == sum(-(-n // 1000) for n in sizes)
            assert len(sent) > 6
        else:
            assert max(sent) > 5000 and len(sent) == 6
        # a restart whose ack mark was lost learns the rollout of each record, the large
        # ones' from their heads only, and sends nothing again
        (tmp_path / "spool" / "acked").unlink()
        with spool.Spool(tmp_path / "spool") as again:
            second = await drained(again, port)
            assert second.stats()["skipped"] == 6 and second.stats()["sent"] == 0

    run(tmp_path, body)


def test_a_large_record_whose_segment_is_cut_short_ends_the_session_not_the_exporter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its parts so far are dropped by the collector, unacknowledged; nothing is stored
    half, and the exporter lives on to send it again."""
    monkeypatch.setattr(channel, "PART_BYTES", 1000)
    monkeypatch.setattr(exporter, "LARGE_RECORD_BYTES", 1000)

    async def body(running: collector.Collector, port: int, s: spool.Spool) -> None:
        s.append(large_records("r1", [5000]))
        (segment,) = (tmp_path / "spool").glob("segment-*")
        with segment.open("r+b") as handle:
            handle.truncate(3000)  # under the spool's feet, after it checked the frame
        e = fast(s, f"127.0.0.1:{port}")
        e.start()
        for _ in range(200):  # until a second session has tried it too
            if e.stats()["sessions"] >= 2:
                break
            await asyncio.sleep(0.05)
        assert e.stats()["sessions"] >= 2 and e.stats()["acked"] == 0
        assert "ends inside the record" in e.last_error
        assert running.store.record_count() == 0
        await e.stop()

    run(tmp_path, body)
