from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
from openforge.trajectory.v1 import trajectory_pb2
from openforge_sidecar.recording import spool


def call_record(n: int, *, rollout: str = "r1", size: int = 8) -> trajectory_pb2.Record:
    return trajectory_pb2.Record(
        idempotency_key=f"{rollout}/call/{n}",
        job="job",
        rollout_id=rollout,
        call=trajectory_pb2.ModelCall(
            call_index=n, prompt_token_ids=list(range(size)), completion_token_ids=[n]
        ),
    )


def keys(records: object) -> list[str]:
    return [r.idempotency_key for r in records]  # type: ignore[attr-defined]


def test_append_assigns_contiguous_sequences_and_reads_back(tmp_path: Path) -> None:
    with spool.Spool(tmp_path) as s:
        assert s.append([call_record(0), call_record(1)]) == [1, 2]
        assert s.append([call_record(2)]) == [3]
        assert s.append([]) == []
        records = list(s.records_after(0))
        assert [r.sequence for r in records] == [1, 2, 3]
        expected = call_record(2)
        expected.sequence = 3
        assert records[2] == expected
        assert keys(s.records_after(2)) == ["r1/call/2"]
        assert list(s.records_after(3)) == []
        assert s.last_sequence == 3
        assert s.unacked_count == 3


def test_sequences_continue_after_restart(tmp_path: Path) -> None:
    with spool.Spool(tmp_path) as s:
        s.append([call_record(i) for i in range(3)])
    with spool.Spool(tmp_path) as s:
        assert s.recovery.clean
        assert s.recovery.records == 3
        assert s.append([call_record(3)]) == [4]
        assert [r.sequence for r in s.records_after(0)] == [1, 2, 3, 4]


def test_ack_mark_is_durable_monotonic_and_bounded(tmp_path: Path) -> None:
    with spool.Spool(tmp_path) as s:
        s.append([call_record(i) for i in range(5)])
        s.mark_acked(3)
        s.mark_acked(2)  # never backwards
        assert s.acked == 3
        assert s.unacked_count == 2
        with pytest.raises(spool.SpoolError, match="last appended is 5"):
            s.mark_acked(6)
    with spool.Spool(tmp_path) as s:
        assert s.acked == 3
        assert [r.sequence for r in s.records_after(s.acked)] == [4, 5]


def _segment(tmp_path: Path) -> Path:
    (path,) = sorted(tmp_path.glob("segment-*.log"))
    return path


def test_torn_payload_is_truncated_and_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with spool.Spool(tmp_path) as s:
        s.append([call_record(i) for i in range(3)])
    path = _segment(tmp_path)
    good_size = path.stat().st_size
    # A crash in the middle of writing a fourth frame: header plus half the payload.
    payload = call_record(3).SerializeToString()
    with open(path, "ab") as handle:
        handle.write(len(payload).to_bytes(4, "big") + b"\0\0\0\0" + payload[: len(payload) // 2])
    with caplog.at_level(logging.ERROR), spool.Spool(tmp_path) as s:
        (cut,) = s.recovery.truncations
        assert cut.offset == good_size
        assert cut.bytes_dropped == 8 + len(payload) // 2
        assert cut.frames_dropped == 1
        assert "torn frame payload" in cut.reason
        assert s.recovery.records == 3
        assert path.stat().st_size == good_size
        assert s.append([call_record(3)]) == [4]
    assert "truncated segment" in caplog.text
    with spool.Spool(tmp_path) as s:
        assert s.recovery.clean
        assert [r.sequence for r in s.records_after(0)] == [1, 2, 3, 4]


def test_torn_header_is_truncated_and_reported(tmp_path: Path) -> None:
    with spool.Spool(tmp_path) as s:
        s.append([call_record(0)])
    with open(_segment(tmp_path), "ab") as handle:
        handle.write(b"\x00\x01\x02")
    with spool.Spool(tmp_path) as s:
        (cut,) = s.recovery.truncations
        assert "torn frame header (3 of 8 bytes)" in cut.reason
        assert cut.bytes_dropped == 3
        assert s.recovery.bytes_dropped == 3
        assert [r.sequence for r in s.records_after(0)] == [1]


def test_crc_mismatch_drops_the_record_and_everything_after(tmp_path: Path) -> None:
    with spool.Spool(tmp_path) as s:
        s.append([call_record(i) for i in range(4)])
        second = next(iter(s._segments)).offsets[1]
    path = _segment(tmp_path)
    data = bytearray(path.read_bytes())
    data[second + 8 + 2] ^= 0xFF  # flip a payload byte of record 2
    path.write_bytes(bytes(data))
    with spool.Spool(tmp_path) as s:
        (cut,) = s.recovery.truncations
        assert cut.reason == "CRC mismatch"
        assert cut.offset == second
        assert cut.frames_dropped == 3
        assert s.recovery.frames_dropped == 3
        assert [r.sequence for r in s.records_after(0)] == [1]


def test_segments_roll_and_compaction_keeps_unacked_and_sequence(tmp_path: Path) -> None:
    with spool.Spool(tmp_path, max_segment_bytes=200) as s:
        for i in range(10):
            s.append([call_record(i, size=30)])
        assert len(list(tmp_path.glob("segment-*.log"))) > 3
        s.mark_acked(10)
        assert s.compact() > 0
        assert len(list(tmp_path.glob("segment-*.log"))) == 1  # the newest stays
        s.mark_acked(10)
    with spool.Spool(tmp_path, max_segment_bytes=200) as s:
        assert s.append([call_record(10)]) == [11]
        kept = [r.sequence for r in s.records_after(0)]
        assert kept[0] > 1 and kept == list(range(kept[0], 12))
        assert [r.sequence for r in s.records_after(10)] == [11]


def test_reads_span_segments(tmp_path: Path) -> None:
    with spool.Spool(tmp_path, max_segment_bytes=150) as s:
        s.append([call_record(i, size=30) for i in range(3)])
        s.append([call_record(i, size=30) for i in range(3, 7)])
        s.append([call_record(7)])
        assert [r.sequence for r in s.records_after(2)] == [3, 4, 5, 6, 7, 8]
        assert [r.call.call_index for r in s.records_after(5)] == [5, 6, 7]


def test_concurrent_append_and_read(tmp_path: Path) -> None:
    notified = threading.Event()
    with spool.Spool(tmp_path, max_segment_bytes=4096) as s:
        s.add_listener(notified.set)

        def writer() -> None:
            for i in range(200):
                s.append([call_record(i, size=20)])

        thread = threading.Thread(target=writer)
        thread.start()
        while thread.is_alive():
            sequences = [r.sequence for r in s.records_after(0)]
            assert sequences == list(range(1, len(sequences) + 1))
        thread.join()
        assert notified.is_set()
        assert [r.sequence for r in s.records_after(0)] == list(range(1, 201))


def test_corrupt_ack_mark_is_an_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "acked").write_text("twelve\n")
    with pytest.raises(spool.SpoolError, match="acked: ack mark 'twelve'"):
        spool.Spool(tmp_path)


def test_frames_are_the_records_serialized_with_their_sequences(tmp_path: Path) -> None:
    with spool.Spool(tmp_path, max_segment_bytes=64) as s:
        for n in range(5):
            s.append([call_record(n)])
        frames = list(s.frames_after(2))
        assert [sequence for sequence, _ in frames] == [3, 4, 5]
        parsed = [trajectory_pb2.Record.FromString(payload) for _, payload in frames]
        assert parsed == list(s.records_after(2))
        assert [r.sequence for r in parsed] == [3, 4, 5]


def test_a_large_frame_that_is_no_record_is_a_value_error_and_its_mapping_closes(
    tmp_path: Path,
) -> None:
    """Read through its mapping, a large frame whose bytes are not a record's wire format
    is the parser's ValueError (the traceback's view of the mapping is released, so
    closing it is no BufferError)."""
    from openforge_sidecar.recording import records

    with spool.Spool(tmp_path) as s:
        s.append([trajectory_pb2.Record(idempotency_key="k", rollout_id="r1")])
    (segment,) = tmp_path.glob("segment-*")
    frame = spool.LargeFrame(segment, 8, segment.stat().st_size - 8)
    with frame.mapped() as view:
        assert records.rollout_of(view) == "r1"
    bad = spool.LargeFrame(segment, 0, segment.stat().st_size)  # from the frame's header
    with pytest.raises(ValueError), bad.mapped() as view:
        records.rollout_of(view)
