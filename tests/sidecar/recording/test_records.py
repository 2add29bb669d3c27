from __future__ import annotations

from array import array
from pathlib import Path

import pytest
from openforge.trajectory.v1 import trajectory_pb2 as pb
from openforge.wire import conversation
from openforge_sidecar.recording import records, spool
from traced import traced


def a_call(*, prompt: int, request: bytes, completion: int = 3) -> records.CallRecord:
    return records.call(
        job="job",
        rollout_id="r1",
        finished=records.Call(
            call_index=4,
            api=conversation.WireApi.OPENAI_CHAT,
            model="m",
            request_json=request,
            response_json=b'{"ok":1}',
            request_headers={"user-agent": "x"},
            prompt_ids=array("i", (i * 7919 % 151_000 for i in range(prompt))),
            completion_ids=list(range(completion)),
            logprobs=[-0.5] * completion,
            finish_reason="stop",
            received_ns=123,
        ),
    )


@pytest.mark.parametrize("prompt", [0, 1, 8 * 1024, 8 * 1024 + 1, 200_000])
@pytest.mark.parametrize("request_json", [b"", b'{"messages":[]}', b"x" * 300_000])
def test_the_pieces_parse_as_the_whole_record(prompt: int, request_json: bytes) -> None:
    record = a_call(prompt=prompt, request=request_json, completion=70_000)
    length, pieces = record.serialized(17)
    payload = b"".join(pieces)
    assert len(payload) == length
    parsed = pb.Record.FromString(payload)
    whole = record.whole()
    assert parsed == whole and whole.sequence == 17
    assert parsed.call.request_json == request_json and len(parsed.call.prompt_token_ids) == prompt
    assert list(parsed.call.prompt_token_ids) == list(record.prompt_ids)
    assert parsed.call.completion_token_ids == list(range(70_000))


def test_the_spool_writes_a_call_in_pieces_and_reads_back_the_whole_record(
    tmp_path: Path,
) -> None:
    record = a_call(prompt=100_000, request=b'{"a":"' + b"y" * 100_000 + b'"}')
    with spool.Spool(tmp_path) as s:
        s.append([records.started(job="job", rollout_id="r1", task_id="t", sample_index=0,
                                  attempt=0, harness="h", policy_version=0, labels={}),
                  record])  # fmt: skip
    with spool.Spool(tmp_path) as reopened:  # recovery checks every frame's CRC and parse
        assert reopened.recovery.clean
        read = list(reopened.records_after(0))
    assert read[1] == record.whole() and read[1].sequence == 2


def test_spooling_a_large_call_copies_neither_its_request_nor_its_prompt(tmp_path: Path) -> None:
    """Built as one message, a 10 MB request's record held the request and the IDs
    again, and its serialization a third time, while it was written; and IDs copied 64 Ki
    at a time were a list of 2.5 MB each time (3.1 MB at the peak, here)."""
    record = a_call(prompt=2_000_000, request=b"z" * (10 * 1024 * 1024))
    with spool.Spool(tmp_path) as s:
        peak = traced(lambda: s.append([record])).peak
    assert peak < 1024 * 1024


@pytest.mark.parametrize("sequence", [0, 1, 300, 2**40])
@pytest.mark.parametrize("offset", [0, 5, 2**21])
@pytest.mark.parametrize("size", [1, 127, 128, 300_000])
def test_a_parts_head_and_its_data_are_the_message_protobuf_makes(
    sequence: int, offset: int, size: int
) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    total = offset + size + 7
    made = records.part_head(sequence=sequence, offset=offset, total_bytes=total, size=size)
    part = pb.RecordPart(offset=offset, total_bytes=total, data=data)
    assert made + data == pb.Record(sequence=sequence, part=part).SerializeToString()


def test_the_rollout_of_a_serialized_record_is_read_without_parsing_it() -> None:
    started = records.started(
        job="job", rollout_id="r-7", task_id="t", sample_index=0, attempt=0, harness="h",
        policy_version=0, labels={"a": "b"},
    )  # fmt: skip
    assert records.rollout_of(started.SerializeToString()) == "r-7"
    _, pieces = a_call(prompt=70_000, request=b"x" * 1000).serialized(3)
    assert records.rollout_of(b"".join(pieces)) == "r1"
    assert records.rollout_of(pb.Record(sequence=5).SerializeToString()) == ""
    whole = started.SerializeToString()
    with pytest.raises(ValueError, match="runs past the record's end"):
        records.rollout_of(whole[:-1])
    with pytest.raises(ValueError, match="wire type 7"):
        records.rollout_of(b"\x0f")


def test_a_call_whose_prompt_waits_in_a_file_is_written_from_it_then_the_file_goes(
    tmp_path: Path,
) -> None:
    from openforge_sidecar.policy import stored

    ids = array("i", (i * 7919 % 151_000 for i in range(200_000)))
    in_memory = a_call(prompt=200_000, request=b"{}")
    kept = stored.StoredIds.write(tmp_path / "0.ids", ids)
    on_disk = records.CallRecord(record=in_memory.record, request_json=b"{}", prompt_ids=kept)
    _, pieces = on_disk.serialized(4)
    assert pb.Record.FromString(b"".join(pieces)) == in_memory.whole() == on_disk.whole()
    on_disk.release()
    assert not kept.path.exists()
