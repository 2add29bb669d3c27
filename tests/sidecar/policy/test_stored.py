from __future__ import annotations

import io
from array import array
from pathlib import Path
from typing import Any

import pytest
from openforge_sidecar.policy import stored


def test_ids_written_read_back_whole_and_in_chunks(tmp_path: Path) -> None:
    ids = array("i", range(-3, 200_000))
    kept = stored.StoredIds.write(tmp_path / "deep" / "a.ids", ids)
    assert len(kept) == len(ids) and kept.path.stat().st_size == 4 * len(ids)
    assert kept.load() == ids and stored.loaded(kept) == ids and stored.loaded(ids) is ids
    assert [len(c) for c in kept.chunks(90_000)] == [90_000, 90_000, 20_003]


def test_ids_compare_with_arrays_and_lists_chunk_by_chunk(tmp_path: Path) -> None:
    ids = array("i", range(70_000))
    kept = stored.StoredIds.write(tmp_path / "a.ids", ids)
    assert stored.same(ids, kept) and stored.same(list(ids), kept) and stored.same(ids, ids)
    other = array("i", ids)
    other[69_999] = 5
    assert not stored.same(other, kept) and not stored.same(ids[:-1], kept)


def test_a_short_file_is_an_error_and_a_discarded_one_is_gone(tmp_path: Path) -> None:
    kept = stored.StoredIds.write(tmp_path / "a.ids", array("i", range(10)))
    cut = stored.StoredIds(kept.path, 11)
    with pytest.raises(OSError):
        cut.load()
    kept.discard()
    kept.discard()  # again: nothing to do
    assert not kept.path.exists()


def test_a_missing_or_short_file_is_an_oserror_for_whole_and_chunked_reads(tmp_path: Path) -> None:
    path = tmp_path / "a.ids"
    path.write_bytes(b"\0" * 8)
    with pytest.raises(OSError, match="fewer than 3 IDs"):
        stored.StoredIds(path, 3).load()
    with pytest.raises(OSError, match="fewer than 3 IDs"):
        list(stored.StoredIds(path, 3).chunks(1))
    with pytest.raises(OSError):
        stored.StoredIds(tmp_path / "gone.ids", 1).load()
    assert stored.StoredIds(path, 0).load() == array("i")


def test_an_extended_copy_of_a_file_cut_short_is_refused(tmp_path: Path) -> None:
    ids = stored.StoredIds.write(tmp_path / "a.ids", array("i", range(10)))
    with ids.path.open("r+b") as handle:
        handle.truncate(8 * 4)
    with pytest.raises(OSError, match="not 10 IDs"):
        ids.extended(tmp_path / "b.ids", array("i", [1]))
    whole = stored.StoredIds.write(tmp_path / "c.ids", array("i", range(10)))
    longer = whole.extended(tmp_path / "d" / "e.ids", array("i", [7, 8]))
    assert longer.load().tolist() == [*range(10), 7, 8] and whole.load().tolist() == [*range(10)]


@pytest.mark.parametrize("count", [0, 10, 11, 500])
def test_a_writer_keeps_ids_in_memory_up_to_the_limit_then_in_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    monkeypatch.setattr(stored, "SPILL_IDS", 10)
    monkeypatch.setattr(stored, "CHUNK", 7)
    writer = stored.Writer(tmp_path / "sub" / "p.ids")
    expected = array("i")
    for start in range(0, count, 3):  # as an encoder adds them: runs, and single IDs
        writer.extend(array("i", range(start, min(start + 2, count))))
        expected.extend(range(start, min(start + 2, count)))
        if start + 2 < count:
            writer.append(start + 2)
            expected.append(start + 2)
        if count > 10 and len(expected) > 10:
            assert len(writer._held) <= 10  # written as they come, never all held
    ids = writer.done()
    assert stored.loaded(ids) == expected
    assert isinstance(ids, stored.StoredIds) == (count > 10)
    assert (tmp_path / "sub" / "p.ids").exists() == (count > 10)


def test_a_writer_without_a_path_or_discarded_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stored, "SPILL_IDS", 10)
    free = stored.Writer(None)
    free.extend(range(100))
    assert free.done() == array("i", range(100))
    dropped = stored.Writer(tmp_path / "p.ids")
    dropped.extend(range(100))
    assert (tmp_path / "p.ids").exists()
    dropped.discard()
    assert not (tmp_path / "p.ids").exists()


def test_a_writer_whose_file_fails_keeps_every_id_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file that cannot be made, or that fails after IDs went to it (a full disk), is
    read back: the IDs are all there, in memory, and the file is gone."""
    monkeypatch.setattr(stored, "SPILL_IDS", 10)
    monkeypatch.setattr(stored, "CHUNK", 10)
    (tmp_path / "dir.ids").mkdir()
    unmade = stored.Writer(tmp_path / "dir.ids")
    unmade.extend(range(50))
    assert unmade.done() == array("i", range(50))

    class Full(io.RawIOBase):
        """A file that takes 100 bytes, then fails as a full disk does, every time (so
        the buffer's flush on close fails again)."""

        def __init__(self, real: io.FileIO, room: int = 100) -> None:
            self.real, self.room = real, room

        def writable(self) -> bool:
            return True

        def write(self, data: Any) -> int:
            if self.room <= 0:
                raise OSError(28, "No space left on device")
            taken = self.real.write(bytes(data)[: self.room]) or 0
            self.room -= taken
            return taken

        def close(self) -> None:
            self.real.close()
            super().close()

    for extra in (5, 30):  # the tail left in the buffer, and a write that fails
        failing = stored.Writer(tmp_path / "p.ids")
        failing.extend(range(20))  # 80 bytes, written
        assert failing._handle is not None
        raw = io.FileIO(failing._handle.fileno(), "wb", closefd=False)
        failing._handle.close()
        failing._handle = io.BufferedWriter(Full(raw), buffer_size=16)
        failing.extend(range(20, 20 + extra))
        assert failing.done() == array("i", range(20 + extra))
        assert not (tmp_path / "p.ids").exists()
        broken = stored.Writer(tmp_path / "q.ids")
        broken.extend(range(20))
        assert broken._handle is not None
        broken._handle = io.BufferedWriter(Full(io.FileIO(tmp_path / "q.ids", "ab"), 0), 16)
        broken._handle.write(b"x" * 10)  # held in its buffer, failing when flushed
        broken.discard()
        assert not (tmp_path / "q.ids").exists()
