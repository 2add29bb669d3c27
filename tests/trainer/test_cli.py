from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from openforge.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from openforge_trainer import cli, export, store


def rollout_records(rollout: str, sample: int, reward: float) -> list[trajectory_pb2.Record]:
    response = {
        "choices": [
            {
                "message": {
                    "content": "Let me look.",
                    "tool_calls": [{"function": {"name": "shell", "arguments": '{"cmd": "ls"}'}}],
                }
            }
        ]
    }
    calls = [
        trajectory_pb2.ModelCall(
            call_index=0,
            wire_api=trajectory_pb2.WIRE_API_OPENAI_CHAT,
            stream=True,
            prompt_token_ids=[1, 2, 3],
            completion_token_ids=[4, 5],
            completion_logprobs=[-0.5, -0.5],
            finish_reason="tool_calls",
            segment_reason="first",
            response_json=json.dumps(response).encode(),
            http_status=200,
        ),
        trajectory_pb2.ModelCall(
            call_index=1,
            wire_api=trajectory_pb2.WIRE_API_OPENAI_CHAT,
            prompt_token_ids=[1, 2, 3, 4, 5, 6],
            completion_token_ids=[7],
            completion_logprobs=[-0.25],
            finish_reason="stop",
            response_json=b'{"choices": [{"message": {"content": "Done."}}]}',
            http_status=200,
        ),
    ]
    records = [
        trajectory_pb2.Record(
            started=trajectory_pb2.RolloutStarted(task_id="fix-bug", sample_index=sample)
        ),
        *(trajectory_pb2.Record(call=c) for c in calls),
        trajectory_pb2.Record(
            finished=trajectory_pb2.RolloutFinished(
                has_reward=True, reward=reward, call_count=2, status="succeeded"
            )
        ),
    ]
    for sequence, record in enumerate(records, start=1):
        kind = record.WhichOneof("body")
        record.idempotency_key = f"{rollout}/{kind}/{sequence}"
        record.sequence, record.job, record.rollout_id = sequence, "job", rollout
    return records


def test_collector_serves_until_sigterm(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("s3cret\n")
    process = subprocess.Popen(
        [
            sys.executable, "-m", "openforge.cli", "collector",
            "--store", str(tmp_path / "store.db"), "--listen", "127.0.0.1:0",
            "--token-file", str(tmp_path / "token"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = re.search(r"listening on (127\.0\.0\.1:\d+)", line)
        assert match, line
        with grpc.insecure_channel(match.group(1)) as channel:
            stub = trajectory_pb2_grpc.TrajectoryServiceStub(channel)
            acks = list(
                stub.Push(
                    iter(rollout_records("r0", 0, 1.0)),
                    metadata=(("authorization", "Bearer s3cret"),),
                    timeout=10,
                )
            )
        assert [a.error for a in acks] == [""] * 4
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        assert "stopping" in process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    with store.Store(tmp_path / "store.db") as db:
        assert db.watermark("r0") == 4


def test_collector_rejects_an_empty_token_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "token").write_text("\n")
    with pytest.raises(SystemExit):
        cli.collector_main(
            ["--store", str(tmp_path / "s.db"), "--token-file", str(tmp_path / "token")]
        )
    assert "--token-file" in capsys.readouterr().err


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    path = tmp_path / "store.db"
    with store.Store(path) as db:
        db.put(rollout_records("r0", 0, 1.0))
        db.put(rollout_records("r1", 1, 0.0)[:2])  # still running
    return path


def test_ls(db_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.trajectories_main(["ls", "--store", str(db_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "rollout",
        "task",
        "sample",
        "status",
        "reward",
        "calls",
        "segments",
    ]
    assert lines[1].split() == ["r0", "fix-bug", "0", "succeeded", "1", "2/2", "1"]
    assert lines[2].split() == ["r1", "fix-bug", "1", "running", "-", "1", "1"]


def test_show(db_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.trajectories_main(["show", "r0", "--store", str(db_path)]) == 0
    out = capsys.readouterr().out
    assert "rollout r0" in out and "reward 1" in out
    assert "#0  WIRE_API_OPENAI_CHAT  stream=yes  prompt=3 completion=2  finish=tool_calls" in out
    assert "segment=0 (first)" in out
    assert 'response: "Let me look."; tools: shell' in out
    assert 'response: "Done."' in out
    assert cli.trajectories_main(["show", "nope", "--store", str(db_path)]) == 1


@pytest.mark.parametrize("format", ["jsonl", "parquet"])
def test_export(
    db_path: Path, tmp_path: Path, format: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / f"rows.{format}"
    argv = [
        "export",
        "--store",
        str(db_path),
        "--job",
        "job",
        "--format",
        format,
        "--out",
        str(out),
    ]
    assert cli.trajectories_main(argv) == 0
    assert "wrote 1 rows from 1 complete rollouts" in capsys.readouterr().out
    rows = export.read_jsonl(out) if format == "jsonl" else export.read_parquet(out)
    assert [(r["rollout_id"], r["response_ids"], r["response_mask"]) for r in rows] == [
        ("r0", [4, 5, 6, 7], [1, 1, 0, 1])
    ]


def test_missing_store_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.trajectories_main(["ls", "--store", str(tmp_path / "none.db")]) == 2
    assert "no store at" in capsys.readouterr().err
    assert not (tmp_path / "none.db").exists()
