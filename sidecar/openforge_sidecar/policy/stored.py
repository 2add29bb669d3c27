"""Token IDs kept in a file while nothing needs them, instead of in memory.

A large call's prompt is millions of IDs (4 bytes each): a 30 MB request's are
some 25 MB. Once the engine has them, the call needs them again only at its end
(to check the engine's echo, to remember the conversation, to write the record),
and a conversation's head only when its next call comes. Kept in a file in the
meantime, they cost page cache, not the sidecar's memory.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeAlias

log = logging.getLogger(__name__)

#: IDs are read back (and written, see :class:`Writer`) this many at a time.
CHUNK = 64 * 1024
#: More IDs than this (1 MiB of them) wait in a file while nothing needs them: a large
#: call's prompt (from when it is encoded to when its record is written), a long
#: conversation's head between its calls.
SPILL_IDS = 256 * 1024
#: Bytes of one ID in a file (a machine int, as ``array("i")`` writes it).
_ITEM = array("i").itemsize


@dataclass(frozen=True, slots=True)
class StoredIds:
    path: Path
    count: int

    @classmethod
    def write(cls, path: Path, ids: array[int]) -> StoredIds:
        """``ids`` (a machine-int array) written to ``path``, its folder made if need be."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as handle:
            ids.tofile(handle)
        return cls(path, len(ids))

    def __len__(self) -> int:
        return self.count

    def load(self) -> array[int]:
        """All the IDs; OSError when the file is gone or lacks some."""
        return next(self.chunks(max(self.count, 1)), array("i"))

    def chunks(self, size: int = CHUNK) -> Iterator[array[int]]:
        """The IDs, ``size`` at a time; OSError when the file is gone or lacks some."""
        with self.path.open("rb") as handle:
            for start in range(0, self.count, size):
                chunk: array[int] = array("i")
                try:
                    chunk.fromfile(handle, min(size, self.count - start))
                except (EOFError, ValueError):  # none left, or part of one
                    raise OSError(f"{self.path} holds fewer than {self.count} IDs") from None
                yield chunk

    def equals(self, ids: Sequence[int]) -> bool:
        """Whether ``ids`` are these IDs, compared a chunk at a time."""
        if len(ids) != self.count:
            return False
        start = 0
        for chunk in self.chunks():
            piece = ids[start : start + len(chunk)]
            if chunk != (piece if isinstance(piece, array) else array("i", piece)):
                return False
            start += len(chunk)
        return True

    def extended(self, path: Path, more: array[int]) -> StoredIds:
        """These IDs then ``more``, in a new file at ``path``: the file copied by the OS,
        none of it read in (its folder made if need be)."""
        size = self.path.stat().st_size
        if size != self.count * _ITEM:
            raise OSError(f"{self.path} holds {size} bytes, not {self.count} IDs")
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.path, path)
        with path.open("ab") as handle:
            more.tofile(handle)
        return StoredIds(path, self.count + len(more))

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


#: Token IDs in memory, or in a file.
Ids: TypeAlias = "array[int] | StoredIds"


class Writer:
    """IDs as they are made (``append``, ``extend``), in memory up to :data:`SPILL_IDS`,
    then in a file at ``path``, written :data:`CHUNK` at a time: a long prompt's IDs are
    never all in memory. Without ``path``, all in memory.

    :meth:`done` gives them (:data:`Ids`); :meth:`discard` drops them. A file that
    cannot be written is read back, and the IDs stay in memory (logged).
    """

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._held: array[int] = array("i")
        self._handle: BinaryIO | None = None
        self._written = 0

    def append(self, value: int) -> None:
        self._held.append(value)

    def extend(self, values: Iterable[int]) -> None:
        self._held.extend(values)
        if self._path is not None and len(self._held) > (
            CHUNK if self._handle is not None else SPILL_IDS
        ):
            self._write()

    def done(self) -> Ids:
        """The IDs: in a file once there were more than :data:`SPILL_IDS`."""
        if self._handle is None:
            return self._held
        self._write()
        if self._handle is None:  # the file failed: read back
            return self._held
        self._handle.close()
        self._handle = None
        assert self._path is not None
        return StoredIds(self._path, self._written)

    def discard(self) -> None:
        self._close()
        if self._path is not None:
            with contextlib.suppress(OSError):
                self._path.unlink(missing_ok=True)
        self._held = array("i")

    def _close(self) -> None:
        """Close the file, whose errors, if any, were seen already (``_write`` flushes)."""
        if self._handle is not None:
            with contextlib.suppress(OSError):  # closing flushes again what failed
                self._handle.close()
            self._handle = None

    def _write(self) -> None:
        assert self._path is not None
        try:
            if self._handle is None:
                self._path.parent.mkdir(parents=True, exist_ok=True)
                self._handle = self._path.open("wb")
            self._held.tofile(self._handle)
            self._handle.flush()  # a full disk shows here, not at close
        except OSError as exc:
            log.warning("token IDs stay in memory: %s: %s", self._path, exc)
            written = StoredIds(self._path, self._written)
            self._close()
            self._held = (written.load() if self._written else array("i")) + self._held
            with contextlib.suppress(OSError):
                self._path.unlink(missing_ok=True)
            self._path = None
            return
        self._written += len(self._held)
        self._held = array("i")


def chunks(ids: Sequence[int] | StoredIds, size: int = CHUNK) -> Iterator[Sequence[int]]:
    """The IDs, ``size`` at a time, from memory or from their file (OSError as
    :meth:`StoredIds.chunks`)."""
    if isinstance(ids, StoredIds):
        yield from ids.chunks(size)
    else:
        for start in range(0, len(ids), size):
            yield ids[start : start + size]


def loaded(ids: Ids) -> array[int]:
    return ids.load() if isinstance(ids, StoredIds) else ids


def same(a: Sequence[int], b: Ids) -> bool:
    """Whether the IDs ``a`` and ``b`` are equal."""
    return b.equals(a) if isinstance(b, StoredIds) else a == b
