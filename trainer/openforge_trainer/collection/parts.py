"""Records sent in parts, joined back as they come on one ``Push`` stream.

A sidecar sends a record over ``channel.PART_BYTES`` as ``RecordPart`` messages (when
the collector's initial metadata says it joins them): each a Record with only its
``sequence`` and ``part`` set, in order, one record's parts before the next record's.
:class:`Joiner` turns the stream back into whole records. Parts that break that order
refuse their record (its Ack then names the fault, as for any refused record); parts of a
record the stream ends inside are dropped unacknowledged, and the sidecar sends the record
again on its next stream.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from google.protobuf import message
from openforge.trajectory import channel
from openforge.trajectory.v1 import trajectory_pb2

Record = Any  # trajectory_pb2.Record


@dataclasses.dataclass(frozen=True, slots=True)
class Refused:
    """A record whose parts could not be joined: its Ack carries ``reason`` as its error."""

    sequence: int
    reason: str


class Joiner:
    """Joins one stream's parts into records, one record at a time, at most ``max_bytes``
    each."""

    def __init__(self, *, max_bytes: int = channel.MAX_MESSAGE_BYTES) -> None:
        self._max_bytes = max_bytes
        self._sequence: int | None = None  # the record being joined
        self._total = 0
        self._joined = bytearray()
        self._dropping: int | None = None  # a refused record, whose later parts are ignored

    @property
    def unfinished(self) -> int | None:
        """The sequence of a record whose parts have not all come, if any."""
        return self._sequence

    def add(self, record: Record) -> list[Record | Refused]:
        """What ``record``, as it came on the stream, completes: itself, when it is whole;
        the record its parts make, with its last part; a refusal of a record whose parts
        stopped short (before ``record``) or break the order."""
        out: list[Record | Refused] = []
        if record.WhichOneof("body") != "part":
            self._dropping = None
            if self._sequence is not None:
                out.append(self._stopped(f"record {record.sequence} came instead"))
            out.append(record)
            return out
        sequence, part = int(record.sequence), record.part
        if sequence == self._dropping:
            return out
        self._dropping = None
        if self._sequence is not None and sequence != self._sequence:
            out.append(self._stopped(f"a part of record {sequence} came instead"))
        problem = self._problem(sequence, part)
        if problem is not None:
            out.append(self._refuse(sequence, problem))
            return out
        self._sequence, self._total = sequence, int(part.total_bytes)
        self._joined += part.data
        if len(self._joined) == self._total:
            out.append(self._finish(sequence))
        return out

    def _problem(self, sequence: int, part: Any) -> str | None:
        """Why ``part`` cannot be the next of record ``sequence``, if it cannot."""
        offset, total = int(part.offset), int(part.total_bytes)
        received = len(self._joined) if self._sequence == sequence else 0
        if self._sequence == sequence and total != self._total:
            return f"part at byte {offset} says total_bytes {total}, earlier parts {self._total}"
        if not 0 < total <= self._max_bytes:
            return f"part total_bytes {total} is not between 1 and the limit {self._max_bytes}"
        if offset != received:
            return f"part at byte {offset}, expected the one at byte {received}"
        if not part.data:
            return f"part at byte {offset} holds no data"
        if offset + len(part.data) > total:
            return f"part at byte {offset} holds {len(part.data)} bytes, past total_bytes {total}"
        return None

    def _finish(self, sequence: int) -> Record | Refused:
        joined = self._joined
        self._reset()
        try:
            record = trajectory_pb2.Record.FromString(joined)  # type: ignore[arg-type]  # (a buffer: no copy)
        except message.DecodeError as exc:
            return Refused(sequence, f"record {sequence}: its parts joined are not a record: {exc}")
        if record.WhichOneof("body") == "part":
            return Refused(sequence, f"record {sequence}: its parts joined are a part again")
        if record.sequence != sequence:
            return Refused(
                sequence, f"record {sequence}: its parts joined are record {record.sequence}"
            )
        return record

    def _stopped(self, why: str) -> Refused:
        sequence = self._sequence
        assert sequence is not None
        return self._refuse(
            sequence, f"its parts stopped at byte {len(self._joined)} of {self._total}: {why}"
        )

    def _refuse(self, sequence: int, problem: str) -> Refused:
        self._reset()
        self._dropping = sequence
        return Refused(sequence, f"record {sequence}: {problem}")

    def _reset(self) -> None:
        self._sequence, self._total, self._joined = None, 0, bytearray()
