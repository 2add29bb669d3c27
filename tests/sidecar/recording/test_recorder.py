from __future__ import annotations

import asyncio
import threading
from collections import Counter
from pathlib import Path

import pytest
from openforge.wire import conversation
from openforge_sidecar import memory
from openforge_sidecar.recording import recorder, records, spool


def a_recorder(directory: Path) -> recorder.Recorder:
    return recorder.Recorder(
        directory, identity=recorder.Identity(job="job", rollout_id="r1"), stats=Counter()
    )


def test_a_large_body_waits_in_a_file_until_its_record_is_spooled(tmp_path: Path) -> None:
    recording = a_recorder(tmp_path)
    small = b'{"small":1}'
    large = b'{"x":"' + b"y" * recorder.STASH_BYTES + b'"}'
    assert recording.stash(0, small) is small
    stashed = recording.stash(1, large)
    assert isinstance(stashed, records.Stashed) and len(stashed) == len(large)
    assert stashed.path.read_bytes() == large
    recording.call(
        records.Call(
            call_index=1, api=conversation.WireApi.OPENAI_CHAT, request_json=stashed,
            prompt_ids=[1, 2, 3], completion_ids=[4],
        )
    )  # fmt: skip
    asyncio.run(recording.close(flush_timeout=0))
    assert not stashed.path.exists()
    spooled = list(spool.Spool(tmp_path).records_after(0))
    assert [r.WhichOneof("body") for r in spooled] == ["started", "call"]
    assert spooled[1].call.request_json == large
    assert list(spooled[1].call.prompt_token_ids) == [1, 2, 3]


def test_freed_memory_is_handed_back_before_a_large_calls_record_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not before a small call's: only a large call leaves enough freed behind (its
    answer's buffers) to be worth the trim, which then runs in the writer's thread."""
    done: list[str] = []

    def trim() -> None:
        done.append(f"trim in {threading.current_thread().name}")

    monkeypatch.setattr(memory, "return_freed_memory", trim)
    stashed = a_recorder(tmp_path / "stash").stash(1, b"y" * (recorder.STASH_BYTES + 1))
    with spool.Spool(tmp_path / "spool") as store:
        append = store.append

        def appended(entries: list[spool.Entry]) -> list[int]:
            done.append("append")
            return append(entries)

        monkeypatch.setattr(store, "append", appended)
        writer = recorder.Writer(store, on_failed=lambda entry, exc: None)
        for body in (b"{}", stashed):
            finished = records.Call(call_index=0, api=conversation.WireApi.OPENAI_CHAT,
                                    request_json=body, prompt_ids=[1, 2])  # fmt: skip
            assert writer.wait(writer.put(records.call(job="j", rollout_id="r", finished=finished)))
        writer.close()
    assert done == ["append", "trim in openforge-spool", "append"]


def test_a_body_an_earlier_sidecar_left_stashed_is_deleted(tmp_path: Path) -> None:
    first = a_recorder(tmp_path)
    left = first.stash(0, b"z" * (recorder.STASH_BYTES + 1))
    first.journal(0)
    assert isinstance(left, records.Stashed) and left.path.exists()
    # the sidecar dies before the call's record is spooled (its started record written,
    # its writer stopped: two writers on one spool would tear it); the next one starts
    asyncio.run(first.close(flush_timeout=0))
    assert left.path.exists()
    again = a_recorder(tmp_path)
    assert not left.path.exists()
    asyncio.run(again.close(flush_timeout=0))
    lost = [r.lost for r in spool.Spool(tmp_path).records_after(0) if r.HasField("lost")]
    assert [(x.call_index, x.whole_rollout) for x in lost] == [(0, False)]


def test_a_record_the_spool_refuses_is_reported_lost_in_its_place_and_the_rest_are_spooled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused in a batch, the record stopped the writer's thread: nothing after it was
    ever spooled, and the rollout's finish waited for ever."""
    monkeypatch.setattr(spool, "MAX_RECORD_BYTES", 10_000)
    monkeypatch.setattr(recorder, "STASH_BYTES", 100)
    recording = a_recorder(tmp_path)
    changed = recording.stash(2, b"q" * 200)
    assert isinstance(changed, records.Stashed)
    changed.path.write_bytes(b"short")  # its file changed before the record was written
    calls = (
        (0, [1], b"{}"),
        (1, [7] * 50_000, b"{}"),  # over the size limit
        (2, [1], changed),
        (3, [-1], b"{}"),  # no token ID (a passthrough upstream's)
        (4, [1], b"{}"),
    )
    for index, prompt, body in calls:
        recording.call(
            records.Call(call_index=index, api=conversation.WireApi.OPENAI_CHAT,
                         request_json=body, prompt_ids=prompt)
        )  # fmt: skip
    ticket = recording.finish(exit_code=0, reward=1.0, grader_output="", status="complete")
    assert ticket is not None and recording.wait(ticket)
    asyncio.run(recording.close(flush_timeout=0))
    spooled = list(spool.Spool(tmp_path).records_after(0))
    kinds = [(r.WhichOneof("body"), r.call.call_index or r.lost.call_index) for r in spooled]
    assert kinds == [
        ("started", 0), ("call", 0), ("lost", 1), ("lost", 2), ("lost", 3), ("call", 4),
        ("finished", 0),
    ]  # fmt: skip
    reasons = [r.lost.reason for r in spooled if r.HasField("lost")]
    assert "over the 10000-byte limit" in reasons[0] and "holds 5 bytes" in reasons[1]
    assert "out of range" in reasons[2]
    assert recording.stats["spool_failed"] == 3 and recording.stats["lost_reported"] == 3


def test_a_refused_record_in_the_last_batch_is_still_reported_lost(tmp_path: Path) -> None:
    """Queued behind the writer's stop, the loss report was never written."""
    recording = a_recorder(tmp_path)
    recording.call(
        records.Call(call_index=0, api=conversation.WireApi.OPENAI_CHAT, prompt_ids=[-5])
    )
    asyncio.run(recording.close(flush_timeout=0))  # the stop may come in the same batch
    lost = [r.lost for r in spool.Spool(tmp_path).records_after(0) if r.HasField("lost")]
    assert [x.call_index for x in lost] == [0]


def test_a_stashed_body_whose_file_changed_is_not_spooled_as_another(tmp_path: Path) -> None:
    body = tmp_path / "body"
    body.write_bytes(b"12345")
    with pytest.raises(OSError, match="holds 5 bytes, not the body's 6"):
        b"".join(records.Stashed(body, 6).pieces())


def test_a_large_prompt_waits_in_a_file_and_one_that_cannot_stays_in_memory(
    tmp_path: Path,
) -> None:
    from array import array

    from openforge_sidecar.policy import stored

    recording = a_recorder(tmp_path)
    small = array("i", range(stored.SPILL_IDS))
    assert recording.stash_ids(0, small) is small
    large = array("i", range(stored.SPILL_IDS + 1))
    kept = recording.stash_ids(1, large)
    assert isinstance(kept, stored.StoredIds) and kept.load() == large
    (tmp_path / records.STASH_DIRECTORY / "2.ids").mkdir()  # the file cannot be written
    assert recording.stash_ids(2, large) is large
    heads = tmp_path / records.STASH_DIRECTORY / "heads"
    heads.mkdir()
    (heads / "head-1.ids").write_bytes(b"x")
    asyncio.run(recording.close(flush_timeout=0))
    again = a_recorder(tmp_path)  # a restart deletes everything the last sidecar stashed
    assert not (tmp_path / records.STASH_DIRECTORY).exists()
    asyncio.run(again.close(flush_timeout=0))
