"""Joining records sent in parts: whole records through, parts back into the record, and
every break of the order refusing its record once, by name."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openforge.trajectory.v1 import trajectory_pb2
from openforge_trainer.collection import parts


def record(sequence: int, size: int = 100) -> Any:
    return trajectory_pb2.Record(
        idempotency_key=f"r1/call/{sequence}", sequence=sequence, job="job", rollout_id="r1",
        call=trajectory_pb2.ModelCall(call_index=sequence, request_json=b"x" * size),
    )  # fmt: skip


def cut(whole: Any, size: int) -> list[Any]:
    """``whole``'s serialization as parts of ``size`` bytes, as the exporter sends them."""
    data = whole.SerializeToString()
    return [
        trajectory_pb2.Record(
            sequence=whole.sequence,
            part=trajectory_pb2.RecordPart(
                offset=start, total_bytes=len(data), data=data[start : start + size]
            ),
        )
        for start in range(0, len(data), size)
    ]


def part(sequence: int, offset: int, total: int, data: bytes) -> Any:
    return trajectory_pb2.Record(
        sequence=sequence,
        part=trajectory_pb2.RecordPart(offset=offset, total_bytes=total, data=data),
    )


def feed(joiner: parts.Joiner, stream: list[Any]) -> list[Any]:
    return [item for message in stream for item in joiner.add(message)]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 5000), min_size=1, max_size=6),
    cut_at=st.lists(st.integers(1, 700), min_size=6, max_size=6),
    whole=st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_parts_join_back_into_their_records_in_order(
    sizes: list[int], cut_at: list[int], whole: list[bool]
) -> None:
    records = [record(i + 1, size) for i, size in enumerate(sizes)]
    stream: list[Any] = []
    for index, r in enumerate(records):
        stream += [r] if whole[index] else cut(r, cut_at[index])
    assert feed(parts.Joiner(), stream) == records


def test_a_record_whose_parts_stop_short_is_refused_before_the_next() -> None:
    joiner = parts.Joiner()
    whole = record(1, 1000)
    out = feed(joiner, [*cut(whole, 300)[:2], record(2)])
    assert out[1] == record(2)
    size = whole.ByteSize()
    assert out[0] == parts.Refused(
        1, f"record 1: its parts stopped at byte 600 of {size}: record 2 came instead"
    )
    assert joiner.unfinished is None


def test_a_part_out_of_order_refuses_its_record_once_and_the_rest_is_ignored() -> None:
    joiner = parts.Joiner()
    pieces = cut(record(1, 1000), 300)
    out = feed(joiner, [pieces[0], pieces[2], pieces[1], pieces[3], record(2)])
    assert out == [
        parts.Refused(1, "record 1: part at byte 600, expected the one at byte 300"),
        record(2),
    ]


@pytest.mark.parametrize(
    ("stream", "reason"),
    [
        ([part(3, 10, 100, b"x")], "part at byte 10, expected the one at byte 0"),
        ([part(3, 0, 0, b"x")], "part total_bytes 0 is not between 1 and the limit 1000"),
        ([part(3, 0, 1001, b"x")], "part total_bytes 1001 is not between 1 and the limit 1000"),
        ([part(3, 0, 100, b"")], "part at byte 0 holds no data"),
        ([part(3, 0, 2, b"xyz")], "part at byte 0 holds 3 bytes, past total_bytes 2"),
        (
            [part(3, 0, 100, b"x" * 10), part(3, 10, 90, b"x")],
            "part at byte 10 says total_bytes 90, earlier parts 100",
        ),
        ([part(3, 0, 3, b"\xff\xff\xff")], "its parts joined are not a record"),
        (cut(record(4), 50)[:1] + cut(record(4), 50)[1:], None),  # fine: the control
    ],
)
def test_each_break_of_the_parts_is_refused_naming_it(
    stream: list[Any], reason: str | None
) -> None:
    out = feed(parts.Joiner(max_bytes=1000), stream)
    if reason is None:
        assert out == [record(4)]
        return
    assert len(out) == 1 and isinstance(out[0], parts.Refused) and out[0].sequence == 3
    assert out[0].reason.startswith("record 3: ") and reason in out[0].reason


def test_parts_that_join_into_another_record_or_into_a_part_are_refused() -> None:
    other = record(9).SerializeToString()
    nested = cut(record(9), 20)[0].SerializeToString()
    assert feed(parts.Joiner(), [part(3, 0, len(other), other)]) == [
        parts.Refused(3, "record 3: its parts joined are record 9")
    ]
    assert feed(parts.Joiner(), [part(3, 0, len(nested), nested)]) == [
        parts.Refused(3, "record 3: its parts joined are a part again")
    ]


def test_a_stream_that_ends_inside_a_record_leaves_it_unfinished_and_unanswered() -> None:
    joiner = parts.Joiner()
    assert feed(joiner, cut(record(5, 1000), 300)[:3]) == []
    assert joiner.unfinished == 5
