"""``openforge drain`` on spools a sidecar left behind, against a real collector process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from openforge.wire import conversation
from openforge_sidecar.recording import records, resume, spool
from openforge_trainer.collection import store as store_module

JOB, ROLLOUT = "job", "job-0-0"


def openforge(*args: str) -> list[str]:
    return [sys.executable, "-m", "openforge.cli", *args]


def call(index: int) -> records.CallRecord:
    return records.call(
        job=JOB, rollout_id=ROLLOUT,
        finished=records.Call(call_index=index, api=conversation.WireApi.OPENAI_CHAT,
                              prompt_ids=[1, 2, index], completion_ids=[7]),
    )  # fmt: skip


def killed_sidecar_spool(
    directory: Path, *, begun: int, spooled: int, finished: bool = False
) -> None:
    """What a sidecar SIGKILLed mid-rollout leaves: a started record, some calls, a journal
    naming every call it began (the last ones never spooled), and no finish."""
    with spool.Spool(directory) as s:
        s.append([
            records.started(job=JOB, rollout_id=ROLLOUT, task_id="t", sample_index=0, attempt=0,
                            harness="h", policy_version=0, labels={}),
            *[call(i) for i in range(spooled)],
        ])  # fmt: skip
        if finished:
            s.append([records.finished(job=JOB, rollout_id=ROLLOUT, exit_code=0, reward=1.0,
                                       grader_output="", call_count=spooled,
                                       status="succeeded")])  # fmt: skip
    (directory / resume.INFLIGHT_JOURNAL).write_text("".join(f"{i}\n" for i in range(begun)))


def drain(
    *spools: Path, port: int, close: bool = True, timeout: float = 20
) -> tuple[int, list[dict[str, object]]]:
    argv = [
        "drain",
        *map(str, spools),
        "--collector",
        f"127.0.0.1:{port}",
        "--timeout",
        str(timeout),
    ]
    argv += ["--close", "--reason", "the sidecar was killed"] if close else []
    done = subprocess.run(openforge(*argv), capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines()]


def test_a_killed_sidecar_s_spool_is_delivered_once_and_its_rollout_closed(
    tmp_path: Path, procs: Any
) -> None:
    directory = tmp_path / "spool"
    killed_sidecar_spool(directory, begun=3, spooled=2)
    stashed = directory / records.STASH_DIRECTORY / "2.body"  # call 2's request, left behind
    stashed.parent.mkdir()
    stashed.write_bytes(b"{}")
    port = procs.collector().port
    code, [report] = drain(directory, port=port)
    assert code == 0, report
    assert not stashed.parent.exists()
    assert report | {"spool": ""} == {
        "spool": "",
        "rollout_id": ROLLOUT,
        "closed": True,
        "lost_calls": 1,
        "unacked_before": 6,
        "unacked": 0,
        "error": "",
    }  # fmt: skip  started, 2 calls, call 2 lost, the rollout lost, its finish
    with store_module.Store(tmp_path / "store.db") as db:
        rollout = db.rollout(ROLLOUT)
        assert rollout is not None and rollout.finished and rollout.status == "stopped"
        assert not rollout.has_reward and rollout.call_count_expected == 3
        assert [c.call_index for c in db.calls(ROLLOUT)] == [0, 1]
        lost = sorted((x.whole_rollout, x.call_index, x.reason) for x in db.lost(JOB))
        assert lost == [
            (False, 2, "call 2 was in flight when its sidecar went away: the sidecar was killed"),
            (True, 0, "the sidecar was killed"),
        ]
        count = db.record_count()
    # again: nothing added, nothing stored twice, no connection needed
    code, [again] = drain(directory, port=port)
    assert (code, again["closed"], again["lost_calls"], again["unacked_before"]) == (0, False, 0, 0)
    with store_module.Store(tmp_path / "store.db") as db:
        assert db.record_count() == count


def test_with_the_collector_away_the_records_stay_for_the_next_drain(
    tmp_path: Path, procs: Any
) -> None:
    directory = tmp_path / "spool"
    killed_sidecar_spool(directory, begun=2, spooled=2)
    port = procs.free_port()
    code, [report] = drain(directory, port=port, timeout=1)
    assert code == 1
    assert report["closed"] and report["unacked"] == report["unacked_before"] == 5
    assert "did not acknowledge" in str(report["error"])
    procs.collector(port=port)
    code, [report] = drain(directory, port=port)
    assert (code, report["closed"], report["unacked"]) == (0, False, 0)  # closed once, by the first
    with store_module.Store(tmp_path / "store.db") as db:
        rollout = db.rollout(ROLLOUT)
        assert rollout is not None and rollout.status == "stopped"
        assert len([x for x in db.lost(JOB) if x.whole_rollout]) == 1


def test_a_finished_spool_is_only_delivered(tmp_path: Path, procs: Any) -> None:
    directory = tmp_path / "spool"
    killed_sidecar_spool(directory, begun=1, spooled=1, finished=True)
    port = procs.collector().port
    code, [report, missing] = drain(directory, tmp_path / "no-such-spool", port=port)
    assert code == 0
    assert (report["closed"], report["unacked_before"], report["unacked"]) == (False, 3, 0)
    assert (missing["rollout_id"], missing["error"]) == ("", "no spool")
    with store_module.Store(tmp_path / "store.db") as db:
        rollout = db.rollout(ROLLOUT)
        assert rollout is not None and (rollout.status, rollout.reward) == ("succeeded", 1.0)
        assert db.lost(JOB) == []


def test_an_attempt_whose_sidecar_never_started_is_recorded_started_and_closed(
    tmp_path: Path, procs: Any
) -> None:
    """``--started``: no spool at all (the sidecar never got that far), or one without a
    started record, gets the rollout's start, then its close, so the store holds the
    attempt as the trainer must see it: ``failed`` (its sample is done) with ``--status
    failed``. A spool that holds a start keeps its own."""
    start = {
        "job": JOB, "rollout_id": "job-0-1", "task_id": "t", "sample_index": 0, "attempt": 1,
        "harness": "h", "policy_version": 0, "labels": {"openforge.dev/batch": "0/1"},
    }  # fmt: skip
    port = procs.collector().port
    argv = ["drain", str(tmp_path / "never"), "--collector", f"127.0.0.1:{port}", "--close"]
    argv += ["--status", "failed", "--reason", "its sidecar did not start"]
    done = subprocess.run(
        openforge(*argv, "--started", json.dumps(start)), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [report] = [json.loads(line) for line in done.stdout.splitlines()]
    assert (report["rollout_id"], report["closed"], report["unacked"]) == ("job-0-1", True, 0)
    killed_sidecar_spool(tmp_path / "own", begun=0, spooled=0)
    done = subprocess.run(
        openforge(*argv[:1], str(tmp_path / "own"), *argv[2:], "--started", json.dumps(start)),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with store_module.Store(tmp_path / "store.db") as db:
        never = db.rollout("job-0-1")
        assert never is not None and never.complete
        assert (never.attempt, never.batch, never.status, never.has_reward) == (
            1, "0/1", "failed", False,
        )  # fmt: skip
        own = db.rollout(ROLLOUT)
        assert own is not None and (own.attempt, own.status) == (0, "failed")
    bad = subprocess.run(
        openforge(*argv, "--started", json.dumps({**start, "attempt": "1"})),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "attempt must be a JSON int" in bad.stderr
