from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import call_outcomes
import grpc
import pytest
from openforge.trajectory import auth
from openforge.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from openforge_trainer import cli
from openforge_trainer.collection import store
from openforge_trainer.trajectories import export

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TINY_TOKENIZER = ROOT / "trainer" / "openforge_trainer" / "assets" / "tiny-tokenizer"


def rollout_records(rollout: str, sample: int, reward: float) -> list[trajectory_pb2.Record]:
    response = {
        "choices": [
            {
                "message": {
                    "content": "Let me look.",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "shell", "arguments": '{"cmd": "ls"}'},
                        }
                    ],
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
    (tmp_path / "master-key").write_text("k" * 64 + "\n")
    job_token = auth.issue(b"k" * 64, auth.JobIdentity("rl", "job", "uid-1"))
    process = subprocess.Popen(
        [
            sys.executable, "-m", "openforge.cli", "collector",
            "--store", str(tmp_path / "store.db"), "--listen", "127.0.0.1:0",
            "--token-file", str(tmp_path / "token"),
            "--master-key-file", str(tmp_path / "master-key"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = re.search(r"listening on (127\.0\.0\.1:\d+)", line)
        assert match, line
        assert "shared and per-job bearer tokens" in line
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
            # the per-job token writes its job's rollout, and not r0 (no rollout of "job")
            acks = list(
                stub.Push(
                    iter([*rollout_records("job-0-0", 0, 1.0), *rollout_records("r0", 0, 1.0)]),
                    metadata=(("authorization", f"Bearer {job_token}"),),
                    timeout=10,
                )
            )
        assert [bool(a.error) for a in acks] == [False] * 4 + [True] * 4
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        assert "stopping" in process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    with store.Store(tmp_path / "store.db") as db:
        assert db.watermark("r0") == 4
        assert db.watermark("job-0-0") == 4


def test_collector_rejects_a_short_master_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "key").write_text("short\n")
    with pytest.raises(SystemExit):
        cli.collector_main(
            ["--store", str(tmp_path / "s.db"), "--master-key-file", str(tmp_path / "key")]
        )
    assert "--master-key-file" in (err := capsys.readouterr().err) and "at least 32" in err


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


LS_COLUMNS = ["rollout", "task", "sample", "status", "reward", "calls", "failed", "segments"]


def test_ls(db_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.trajectories_main(["ls", "--store", str(db_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == LS_COLUMNS
    assert lines[1].split() == ["r0", "fix-bug", "0", "succeeded", "1", "2/2", "0", "1"]
    assert lines[2].split() == ["r1", "fix-bug", "1", "running", "-", "1", "0", "1"]
    assert lines[3] == "2 rollouts (1 running, 1 succeeded), 3 calls, mean reward 1 over 1"


def test_ls_json(db_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.trajectories_main(["ls", "--store", str(db_path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [
        (r["rollout"], r["status"], r["reward"], r["calls"], r["calls_expected"]) for r in rows
    ] == [
        ("r0", "succeeded", 1.0, 2, 2),
        ("r1", "running", None, 1, None),
    ]
    assert set(rows[0]) == {
        "job",
        "rollout",
        "task",
        "sample",
        "attempt",
        "status",
        "reward",
        "calls",
        "calls_expected",
        "failed_calls",
        "segments",
    }


def test_ls_of_an_empty_store_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store.Store(tmp_path / "empty.db").close()
    assert cli.trajectories_main(["ls", "--store", str(tmp_path / "empty.db")]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "no rollouts"


def test_show(db_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.trajectories_main(["show", "r0", "--store", str(db_path)]) == 0
    out = capsys.readouterr().out  # not a terminal: plain text
    assert "rollout r0  job job  task fix-bug" in out and "reward 1  calls 2/2" in out
    assert "── call #0 · openai-chat · stream · finish tool_calls" in out
    assert "segment 0 (first) · tokens: prompt 3, completion 2" in out
    assert '→ reply\n[assistant]\n    Let me look.\n    tool call shell {"cmd": "ls"}' in out
    assert "[assistant]\n    Done." in out
    assert "  mask TT·T" in out
    assert cli.trajectories_main(["show", "nope", "--store", str(db_path)]) == 1


def test_show_json(db_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.trajectories_main(["show", "r0", "--store", str(db_path), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [c["finish_reason"] for c in document["calls"]] == ["tool_calls", "stop"]
    assert [(s["trained"], s["tokens"]) for s in document["rows"][0]["spans"]] == [
        (True, 2),
        (False, 1),
        (True, 1),
    ]


def test_show_color_always_renders_with_rich(
    db_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.trajectories_main(["show", "r0", "--store", str(db_path), "--color", "always"]) == 0
    out = capsys.readouterr().out
    assert "\x1b[" in out and "╭─ call #0" in out


def test_show_names_a_tokenizer_it_cannot_load(
    db_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json")
    argv = ["show", "r0", "--store", str(db_path), "--tokenizer", str(tmp_path)]
    assert cli.trajectories_main(argv) == 2
    assert f"--tokenizer: cannot load {tmp_path}" in capsys.readouterr().err


def test_show_a_rollout_openforge_run_captured(procs: Any, tmp_path: Path) -> None:
    """The ReAct example run for real (harness, sidecar, collector) against the test
    engine, then shown by the CLI in a subprocess, as a user would."""
    engine = procs.engine()
    task = (EXAMPLES / "tasks" / "toy-tools" / "demo.jsonl").read_text().splitlines()[0]
    (tmp_path / "tasks.jsonl").write_text(task + "\n")
    text = (EXAMPLES / "react-toy.yaml").read_text()
    for old, new in [
        ("$OPENFORGE_MANIFEST_DIR", str(EXAMPLES)),
        ("${OPENFORGE_MANIFEST_DIR}", str(EXAMPLES)),
        ("file: tasks/toy-tools/demo.jsonl", f"file: {tmp_path / 'tasks.jsonl'}"),
        ("    model: models/tiny-react", f"    model: tiny\n    endpoint: {engine.url}"),
        ("samplesPerTask: 4", "samplesPerTask: 1"),
    ]:
        text = text.replace(old, new)
    (tmp_path / "job.yaml").write_text(text)
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "openforge.cli", "run", str(tmp_path / "job.yaml"), "--no-train",
         "--quiet", "--iterations", "1", "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    show = [sys.executable, "-m", "openforge.cli", "trajectories", "show", "react-toy-i0-0-0",
            "--store", str(run_dir / "store.db"), "--tokenizer", str(TINY_TOKENIZER)]  # fmt: skip
    document = json.loads(
        subprocess.run([*show, "--json"], capture_output=True, text=True, check=True).stdout
    )
    first, second = document["calls"]
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    [call] = first["response"]["tool_calls"]
    assert call["name"] == "lookup_color" and json.loads(call["arguments"]) == {"item": "thoo"}
    assert [m["role"] for m in second["messages"]] == ["tool"] and second["messages"][0][
        "text"
    ] == "blue"
    assert second["response"]["text"] == "blue"
    [row] = document["rows"]
    trained = [s for s in row["spans"] if s["trained"]]
    masked = [s for s in row["spans"] if not s["trained"]]
    assert [s["tokens"] for s in trained] == [
        first["completion_tokens"],
        second["completion_tokens"],
    ]
    appended = second["prompt_tokens"] - first["prompt_tokens"] - first["completion_tokens"]
    assert [s["tokens"] for s in masked] == [appended]
    assert "<tool_response>\nblue\n</tool_response>" in masked[0]["text"]
    assert document["rollout"]["reward"] == 1.0
    plain = subprocess.run(show, capture_output=True, text=True, check=True).stdout
    assert "tool call lookup_color" in plain and "trained" in plain and "masked" in plain


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


@pytest.fixture
def mixed_db_path(tmp_path: Path) -> Path:
    """r0 (two completed calls) and a rollout whose calls completed, were cut off and refused."""
    path = tmp_path / "store.db"
    with store.Store(path) as db:
        db.put(rollout_records("r0", 0, 1.0))
        db.put(call_outcomes.records("mixed", call_outcomes.MIXED, task="fix-bug", sample=1))
    return path


def test_export_trains_only_completed_calls_and_counts_the_failed_by_kind(
    mixed_db_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rows.jsonl"
    argv = [
        "export",
        "--store",
        str(mixed_db_path),
        "--job",
        "job",
        "--format",
        "jsonl",
        "--out",
        str(out),
    ]
    assert cli.trajectories_main(argv) == 0
    summary = capsys.readouterr().out
    assert summary.startswith("wrote 2 rows from 2 complete rollouts")
    assert (
        "untokenized calls 0, failed calls not trained: 1 aborted, 0 errored, 1 refused)" in summary
    )
    rows = export.read_jsonl(out)
    assert [(r["rollout_id"], r["call_indices"], r["response_ids"]) for r in rows] == [
        ("r0", [0, 1], [4, 5, 6, 7]),
        ("mixed", [0], [10, 11]),
    ]


def test_ls_counts_the_failed_calls_by_kind(
    mixed_db_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.trajectories_main(["ls", "--store", str(mixed_db_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == LS_COLUMNS
    assert lines[1].split() == ["r0", "fix-bug", "0", "succeeded", "1", "2/2", "0", "1"]
    assert lines[2].split() == ["mixed", "fix-bug", "1", "succeeded", "1", "3/3", "2", "1"]
    assert lines[3] == (
        "2 rollouts (2 succeeded), 5 calls (2 failed, never trained: 1 aborted, 1 refused),"
        " mean reward 1 over 2"
    )
    assert cli.trajectories_main(["ls", "--store", str(mixed_db_path), "--json"]) == 0
    listed = {r["rollout"]: r for r in json.loads(capsys.readouterr().out)}
    assert listed["mixed"]["failed_calls"] == {"aborted": 1, "errored": 0, "refused": 1}
    assert listed["r0"]["failed_calls"] == {"aborted": 0, "errored": 0, "refused": 0}


def test_missing_store_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.trajectories_main(["ls", "--store", str(tmp_path / "none.db")]) == 2
    assert "no store at" in capsys.readouterr().err
    assert not (tmp_path / "none.db").exists()
