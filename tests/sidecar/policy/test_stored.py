from __future__ import annotations

from array import array
from pathlib import Path

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
