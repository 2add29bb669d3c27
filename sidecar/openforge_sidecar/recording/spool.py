"""The sidecar's durable spool: every record is on disk before anyone is told.

Records are appended to segment files as frames::

    +----------------+----------------+-----------------------------+
    | length (u32 BE)| crc32 (u32 BE) | serialized Record (length B) |
    +----------------+----------------+-----------------------------+

One ``append`` call writes its whole batch and fsyncs once (group commit),
so the capture addon pays one fsync per model call however many records the
call produced. Sequence numbers are assigned here, start at 1 and are
contiguous within the spool; after a restart they continue from the last
record on disk (or from the ack mark when everything was compacted away).

A crash mid-write leaves a torn tail. On open each segment is scanned and the
first frame that is short, fails its CRC, does not parse or breaks the
sequence order is where that segment is truncated. That is never silent: the
dropped bytes and frames, and the reason, are logged as an error and kept in
:attr:`Spool.recovery`. Only the tail of the newest segment can be torn by a
crash (fsync ordering); damage anywhere else is disk corruption, reported the
same way.

The ack mark (the highest sequence such that it and every lower one are
durable at the collector) lives in ``acked``, replaced atomically by
write-temp, fsync, rename, fsync-directory. Segments whose records are all
acked may be deleted by :meth:`Spool.compact`.

Segment files are named by their first sequence, so the order and the
sequence of an empty segment survive a restart.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import mmap
import os
import struct
import threading
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from openforge.trajectory.v1 import trajectory_pb2

log = logging.getLogger(__name__)

Record = Any  # trajectory_pb2.Record (the generated module is untyped for mypy)


class Pieced(Protocol):
    """A record serialized in pieces (a call's: ``records.CallRecord``)."""

    @property
    def idempotency_key(self) -> str: ...

    def serialized(self, sequence: int) -> tuple[int, Iterator[bytes | memoryview]]: ...


#: What the spool appends: a record, or one serialized in pieces.
Entry = Record | Pieced


@dataclasses.dataclass(frozen=True, slots=True)
class LargeFrame:
    """A record too large to be read whole (see :meth:`Spool.frames_after`): where its
    serialization is in its segment, to be read a piece at a time. A segment is deleted
    only once all its records are acknowledged, so an unacknowledged record's stays."""

    path: Path
    offset: int
    length: int

    def __len__(self) -> int:
        return self.length

    def read(self, start: int, size: int) -> bytes:
        """``size`` of its bytes from ``start`` (fewer at its end); OSError when its
        segment is gone or cut short."""
        want = max(0, min(size, self.length - start))
        with self.path.open("rb") as handle:
            handle.seek(self.offset + start)
            piece = handle.read(want)
        if len(piece) < want:
            raise OSError(f"{self.path} ends inside the record at byte {self.offset}")
        return piece

    @contextlib.contextmanager
    def mapped(self) -> Iterator[memoryview]:
        """Its bytes mapped from its segment, not read: only the pages looked at are read
        in (a record's head, to find its fields, leaves the rest on disk)."""
        with self.path.open("rb") as handle:
            start = self.offset - self.offset % mmap.ALLOCATIONGRANULARITY
            if os.fstat(handle.fileno()).st_size < self.offset + self.length:
                raise OSError(f"{self.path} ends inside the record at byte {self.offset}")
            with mmap.mmap(
                handle.fileno(), self.offset + self.length - start, offset=start,
                access=mmap.ACCESS_READ,
            ) as mapping:  # fmt: skip
                view = memoryview(mapping)[self.offset - start :]
                try:
                    yield view
                finally:
                    view.release()


_HEADER = struct.Struct(">II")
_SEGMENT_PREFIX = "segment-"
_SEGMENT_SUFFIX = ".log"
_ACK_FILE = "acked"
#: A frame claiming more than this is damage, not a record.
MAX_RECORD_BYTES = 64 * 1024 * 1024


class SpoolError(Exception):
    """The spool cannot be used (bad directory, record too large...)."""


@dataclasses.dataclass(frozen=True)
class Truncation:
    """One segment cut short during recovery."""

    segment: str
    offset: int  # where the segment now ends
    bytes_dropped: int
    frames_dropped: int  # frames whose header could be read (at least 1 when any byte dropped)
    reason: str


@dataclasses.dataclass(frozen=True)
class Recovery:
    """What opening the spool found and did."""

    segments: int = 0
    records: int = 0
    truncations: tuple[Truncation, ...] = ()

    @property
    def bytes_dropped(self) -> int:
        return sum(t.bytes_dropped for t in self.truncations)

    @property
    def frames_dropped(self) -> int:
        return sum(t.frames_dropped for t in self.truncations)

    @property
    def clean(self) -> bool:
        return not self.truncations


@dataclasses.dataclass
class _Segment:
    path: Path
    first: int  # sequence of the first record (or the next one, when empty)
    offsets: array[int]  # byte offset of each record; record i has sequence first + i
    size: int  # committed bytes (everything below is fsync'd and valid)

    @property
    def last(self) -> int:
        """Sequence of the last record, or first - 1 when empty."""
        return self.first + len(self.offsets) - 1


class Spool:
    """An append-only, fsync'd, CRC-checked record log with a durable ack mark.

    Thread-safe: one thread may append while others read and mark acks.
    """

    def __init__(self, directory: Path, *, max_segment_bytes: int = 64 * 1024 * 1024) -> None:
        self.directory = Path(directory)
        self.max_segment_bytes = max_segment_bytes
        self._lock = threading.Lock()
        self._ack_lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SpoolError(f"spool directory {self.directory}: {exc}") from exc
        self._acked = self._read_ack()
        self._segments, self.recovery = self._recover()
        self._writer: BinaryIO | None = None
        self._next = max(self._segments[-1].last + 1 if self._segments else 1, self._acked + 1)

    # -- writing -------------------------------------------------------------

    def append(self, records: Sequence[Entry]) -> list[int]:
        """Assign sequences, write and fsync the batch; return the sequences.

        The records are modified in place (their ``sequence`` is set).
        """
        if not records:
            return []
        with self._lock:
            sequences = list(range(self._next, self._next + len(records)))
            self._write(records, sequences)
            self._next = sequences[-1] + 1
        for listener in list(self._listeners):
            listener()
        return sequences

    def _write(self, records: Sequence[Entry], sequences: list[int]) -> None:
        segment = self._active_segment(sequences[0])
        writer = self._writer
        assert writer is not None
        # Written frame by frame, and a pieced record piece by piece: serialized and
        # joined first, a batch (a 10 MB request's record: ~20 MB) would be held twice.
        offsets: list[int] = []
        size = 0
        writer.seek(segment.size)
        try:
            for record, sequence in zip(records, sequences, strict=True):
                length, pieces = _serialized(record, sequence)
                if length > MAX_RECORD_BYTES:
                    raise SpoolError(
                        f"record {record.idempotency_key!r} is {length} bytes, "
                        f"over the {MAX_RECORD_BYTES}-byte limit"
                    )
                start = segment.size + size
                offsets.append(start)
                writer.write(bytes(_HEADER.size))  # its CRC is known once it is written
                crc = written = 0
                for piece in pieces:
                    crc = zlib.crc32(piece, crc)
                    written += len(piece)
                    writer.write(piece)
                if written != length:
                    raise SpoolError(
                        f"record {record.idempotency_key!r} came to {written} bytes, "
                        f"not the {length} it said"
                    )
                writer.seek(start)
                writer.write(_HEADER.pack(length, crc))
                writer.seek(start + _HEADER.size + length)
                size += _HEADER.size + length
            writer.flush()
            os.fsync(writer.fileno())
        except Exception:
            # Disk full or failing, or a bad record: leave no half batch behind.
            with contextlib.suppress(OSError):
                writer.truncate(segment.size)
            raise
        segment.offsets.extend(offsets)
        segment.size += size

    def _active_segment(self, first_sequence: int) -> _Segment:
        last = self._segments[-1] if self._segments else None
        if (
            last is not None
            and last.size < self.max_segment_bytes
            and last.last + 1 == first_sequence
        ):
            segment = self._segments[-1]
            if self._writer is None:
                self._writer = open(segment.path, "r+b")  # noqa: SIM115 (kept open)
            return segment
        if self._writer is not None:
            self._writer.close()
        path = self.directory / f"{_SEGMENT_PREFIX}{first_sequence:020d}{_SEGMENT_SUFFIX}"
        self._writer = open(path, "w+b")  # noqa: SIM115 (kept open)
        _fsync_directory(self.directory)
        segment = _Segment(path=path, first=first_sequence, offsets=array("Q"), size=0)
        self._segments.append(segment)
        return segment

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` (in the appending thread) after every append."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    # -- reading -------------------------------------------------------------

    def records_after(self, sequence: int) -> Iterator[Record]:
        """Every record with a sequence above ``sequence``, in order.

        Sees what was appended before the call; later appends need a new call.
        """
        for _, payload in self.frames_after(sequence):
            assert isinstance(payload, bytes)  # none is large without ``large``
            record = trajectory_pb2.Record()
            record.ParseFromString(payload)
            yield record

    def frames_after(
        self, sequence: int, *, large: int | None = None
    ) -> Iterator[tuple[int, bytes | LargeFrame]]:
        """:meth:`records_after` as each record's sequence and serialized bytes, not
        parsed: the exporter sends them as they are. A record over ``large`` bytes comes
        as where it is (:class:`LargeFrame`), not read."""
        with self._lock:
            snapshot = [
                (
                    s.path,
                    s.offsets[max(0, sequence + 1 - s.first)],
                    max(sequence + 1, s.first),
                    s.last - max(sequence, s.first - 1),
                )
                for s in self._segments
                if s.offsets and s.last > sequence
            ]
        for path, start, first, count in snapshot:
            try:
                handle = open(path, "rb")  # noqa: SIM115 (closed below)
            except FileNotFoundError:
                continue  # compacted: everything in it was acked
            with handle:
                handle.seek(start)
                yield from _read_frames(handle, first, count=count, large=large)

    @property
    def last_sequence(self) -> int:
        """The sequence of the newest record appended (0 when none ever)."""
        with self._lock:
            return self._next - 1

    # -- acks ----------------------------------------------------------------

    @property
    def acked(self) -> int:
        return self._acked

    @property
    def unacked_count(self) -> int:
        with self._lock:
            return max(0, self._next - 1 - self._acked)

    def mark_acked(self, sequence: int) -> None:
        """Durably record that every sequence up to ``sequence`` is acked.

        Never moves backwards; marking beyond the last appended record is an
        error (it would make the spool skip records it has not written yet).
        """
        with self._ack_lock:
            if sequence <= self._acked:
                return
            if sequence > self.last_sequence:
                raise SpoolError(
                    f"cannot ack sequence {sequence}: the last appended is {self.last_sequence}"
                )
            temporary = self.directory / f"{_ACK_FILE}.tmp"
            with open(temporary, "wb") as handle:
                handle.write(f"{sequence}\n".encode())
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, self.directory / _ACK_FILE)
            _fsync_directory(self.directory)
            self._acked = sequence

    def _read_ack(self) -> int:
        path = self.directory / _ACK_FILE
        try:
            text = path.read_text().strip()
        except FileNotFoundError:
            return 0
        try:
            return int(text)
        except ValueError as exc:
            raise SpoolError(f"{path}: ack mark {text!r} is not an integer") from exc

    # -- maintenance ---------------------------------------------------------

    def compact(self) -> int:
        """Delete segments whose records are all acked (never the newest one).

        Returns how many segments were deleted.
        """
        deleted = 0
        with self._lock:
            while len(self._segments) > 1 and self._segments[0].last <= self._acked:
                self._segments.pop(0).path.unlink(missing_ok=True)
                deleted += 1
        if deleted:
            _fsync_directory(self.directory)
        return deleted

    def close(self) -> None:
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- recovery ------------------------------------------------------------

    def _recover(self) -> tuple[list[_Segment], Recovery]:
        segments: list[_Segment] = []
        truncations: list[Truncation] = []
        records = 0
        previous = 0
        for path in sorted(self.directory.glob(f"{_SEGMENT_PREFIX}*{_SEGMENT_SUFFIX}")):
            first = _segment_first(path)
            segment, truncation = _scan_segment(path, first, previous=max(previous, first - 1))
            if truncation is not None:
                log.error(
                    "spool %s: truncated segment %s at byte %d, dropping %d bytes "
                    "(%d frame(s)): %s",
                    self.directory,
                    truncation.segment,
                    truncation.offset,
                    truncation.bytes_dropped,
                    truncation.frames_dropped,
                    truncation.reason,
                )
                truncations.append(truncation)
            segments.append(segment)
            records += len(segment.offsets)
            previous = max(previous, segment.last)
        return segments, Recovery(
            segments=len(segments), records=records, truncations=tuple(truncations)
        )


def _segment_first(path: Path) -> int:
    digits = path.name[len(_SEGMENT_PREFIX) : -len(_SEGMENT_SUFFIX)]
    try:
        return int(digits)
    except ValueError as exc:
        raise SpoolError(f"{path}: not a spool segment name") from exc


def _scan_segment(path: Path, first: int, *, previous: int) -> tuple[_Segment, Truncation | None]:
    """Index a segment's valid frames; truncate it at the first invalid one."""
    data = path.read_bytes()
    offsets: array[int] = array("Q")
    offset = 0
    reason = ""
    expected = first
    if first <= previous:
        reason = f"segment starts at sequence {first}, not after {previous}"
    while not reason and offset < len(data):
        reason, length, sequence = _check_frame(data, offset, expected=expected)
        if reason:
            break
        offsets.append(offset)
        offset += _HEADER.size + length
        expected = sequence + 1
    segment = _Segment(path=path, first=first, offsets=offsets, size=offset)
    if offset >= len(data):
        return segment, None
    frames = _count_frame_headers(data, offset)
    with open(path, "r+b") as handle:
        handle.truncate(offset)
        handle.flush()
        os.fsync(handle.fileno())
    return segment, Truncation(
        segment=path.name,
        offset=offset,
        bytes_dropped=len(data) - offset,
        frames_dropped=frames,
        reason=reason,
    )


def _check_frame(data: bytes, offset: int, *, expected: int) -> tuple[str, int, int]:
    """("", length, sequence) for a valid frame at ``offset``, else (reason, 0, 0)."""
    if offset + _HEADER.size > len(data):
        return f"torn frame header ({len(data) - offset} of {_HEADER.size} bytes)", 0, 0
    length, crc = _HEADER.unpack_from(data, offset)
    if length > MAX_RECORD_BYTES:
        return f"frame length {length} exceeds {MAX_RECORD_BYTES}", 0, 0
    payload = data[offset + _HEADER.size : offset + _HEADER.size + length]
    if len(payload) < length:
        return f"torn frame payload ({len(payload)} of {length} bytes)", 0, 0
    if zlib.crc32(payload) != crc:
        return "CRC mismatch", 0, 0
    record = trajectory_pb2.Record()
    try:
        record.ParseFromString(payload)
    except Exception as exc:  # protobuf raises DecodeError (and others on odd bytes)
        return f"record does not parse: {exc}", 0, 0
    if record.sequence != expected:
        return f"sequence {record.sequence} where {expected} was expected", 0, 0
    return "", length, int(record.sequence)


def _count_frame_headers(data: bytes, offset: int) -> int:
    """How many frames the dropped tail held, walking headers; at least 1."""
    frames = 0
    while offset < len(data):
        frames += 1
        if offset + _HEADER.size > len(data):
            break
        length, _ = _HEADER.unpack_from(data, offset)
        if length > MAX_RECORD_BYTES:
            break
        offset += _HEADER.size + length
    return max(frames, 1)


def _read_frames(
    handle: BinaryIO, first: int, *, count: int, large: int | None
) -> Iterator[tuple[int, bytes | LargeFrame]]:
    """The sequences and payloads of ``count`` frames already validated (at recovery or
    append), the first of them ``first``; a payload over ``large`` bytes as where it is."""
    for index in range(count):
        length, _crc = _HEADER.unpack(handle.read(_HEADER.size))
        if large is not None and length > large:
            frame = LargeFrame(Path(handle.name), handle.tell(), length)
            handle.seek(length, os.SEEK_CUR)
            yield first + index, frame
        else:
            yield first + index, handle.read(length)


def _serialized(record: Entry, sequence: int) -> tuple[int, Iterable[bytes | memoryview]]:
    """A record with ``sequence`` set, serialized: its length and its bytes in pieces."""
    if isinstance(record, trajectory_pb2.Record):
        record.sequence = sequence
        payload = record.SerializeToString()
        return len(payload), (payload,)
    return record.serialized(sequence)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
