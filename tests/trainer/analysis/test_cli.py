from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from openforge.trajectory.v1 import trajectory_pb2
from openforge_trainer.analysis import cli as analyze_cli
from openforge_trainer.analysis import metrics as analysis
from openforge_trainer.collection import store
from rich.console import Console
from wire_trajectories import Call, Step, records

CHAT, RESPONSES = "WIRE_API_OPENAI_CHAT", "WIRE_API_OPENAI_RESPONSES"
ANTHROPIC, GEMINI = "WIRE_API_ANTHROPIC_MESSAGES", "WIRE_API_GEMINI"
REACT_TOOLS = ("lookup_color", "read_file", "write_file", "shell")
PATCH = "*** Begin Patch\n*** Add File: x.py\n+print(1)\n*** End Patch\n"


def plan(*statuses: str) -> Call:
    items = [{"step": f"step {i}", "status": s} for i, s in enumerate(statuses)]
    return Call("update_plan", {"plan": items}, "Plan updated")


def write(path: str) -> Call:
    return Call("write_file", {"path": path, "content": "print(1)"}, "wrote 8 bytes")


def episodes_of_a_run() -> list[trajectory_pb2.Record]:
    """Hand-built episodes of four harnesses, one per wire API, at two policy versions."""
    react = {"api": CHAT, "tools": REACT_TOOLS, "harness": "react"}
    out = []
    # react v0: a failed run left unverified after the fix, then a plain lookup
    out += records("react-0", **react, policy_version=0, reward=0.0, steps=[
        Step("", [write("a.py")]),
        Step("", [Call("shell", {"command": "python a.py"}, "Traceback\n[exit code 1]")]),
        Step("", [write("a.py")]),
        Step("done"),
    ])  # fmt: skip
    out += records("react-1", **react, policy_version=0, reward=1.0, steps=[
        Step("", [Call("lookup_color", {"item": "thoo"}, "blue")]),
        Step("blue"),
    ])  # fmt: skip
    # react v1: the fix is read back and the episode recovers; a text plan half followed
    out += records("react-2", **react, policy_version=1, reward=1.0, steps=[
        Step("", [write("a.py")]),
        Step("", [Call("shell", {"command": "python a.py"}, "[exit code 1]")]),
        Step("", [write("a.py")]),
        Step("", [Call("read_file", {"path": "a.py"}, "print(1)")]),
        Step("done"),
    ])  # fmt: skip
    out += records("react-3", **react, policy_version=1, reward=1.0, steps=[
        Step("Plan:\n1. look it up\n2. answer", [Call("lookup_color", {}, "blue")]),
        Step("blue"),
    ])  # fmt: skip
    # Codex (Responses): a completed update_plan, an apply_patch checked by pytest
    out += records("codex-0", api=RESPONSES, harness="codex", policy_version=0, reward=1.0,
        tools=("shell", "apply_patch", "update_plan"), steps=[
        Step("", [plan("pending", "pending")]),
        Step("", [Call("apply_patch", {"input": PATCH}, "Success.")]),
        Step("", [Call("shell", {"command": ["bash", "-lc", "pytest -q"]},
                       "Exit code: 0\n1 passed")]),
        Step("", [plan("completed", "completed")]),
        Step("All done."),
    ])  # fmt: skip
    # Claude Code (Anthropic): the read-back fails, flagged is_error
    out += records("claude-0", api=ANTHROPIC, harness="claude", policy_version=0, reward=0.0,
        tools=("Read", "Write", "Edit", "Bash", "TodoWrite"), steps=[
        Step("", [Call("Write", {"file_path": "/w/f.txt", "content": "x"}, "File created")]),
        Step("", [Call("Bash", {"command": "cat f.txt"}, "Exit code 1", is_error=True)]),
        Step("failed"),
    ])  # fmt: skip
    # Gemini CLI: no reward (the grader failed)
    out += records("gemini-0", api=GEMINI, harness="gemini", policy_version=1, reward=None,
        tools=("read_file", "run_shell_command"), steps=[
        Step("", [Call("run_shell_command", {"command": "ls"}, "Command: ls\nExit Code: 0")]),
        Step("ok"),
    ])  # fmt: skip
    # still running: skipped
    running = records("react-9", **react, policy_version=1, reward=1.0, steps=[Step("x")])
    return out + running[:-1]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    path = tmp_path / "store.db"
    with store.Store(path) as db:
        db.put(episodes_of_a_run())
    return path


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = analyze_cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def table_rows(text: str) -> dict[str, list[str]]:
    """A plain table's rows by their first cell (cells are 2+ spaces apart)."""
    rows = {}
    for line in text.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        rows.setdefault(cells[0], cells[1:])
    return rows


def test_the_table_has_one_column_per_harness_and_version(
    db_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["--store", str(db_path)], capsys)
    assert (code, err) == (0, "")
    headline = out.splitlines()[0]
    assert headline == (
        f"{db_path}: job job; 7 finished rollouts; 1 unfinished skipped; success: reward > 0"
    )
    rows = table_rows(out)
    assert rows["metric"] == ["claude v0", "codex v0", "gemini v1", "react v0", "react v1"]
    assert rows["episodes"] == ["1", "1", "1", "2", "2"]
    assert rows["rewarded"] == ["1", "1", "0", "2", "2"]
    assert rows["success"] == ["0.0% (0/1)", "100.0% (1/1)", "n/a", "50.0% (1/2)", "100.0% (2/2)"]
    assert rows["self-verif."] == [
        "100.0% (1/1)", "100.0% (1/1)", "n/a", "50.0% (1/2)", "100.0% (2/2)",
    ]  # fmt: skip
    assert rows["verif. episodes"][3:] == ["0.0% (0/1)", "100.0% (1/1)"]
    assert rows["failed calls"] == [
        "50.0% (1/2)", "0.0% (0/4)", "0.0% (0/1)", "25.0% (1/4)", "20.0% (1/5)",
    ]  # fmt: skip
    assert rows["error recovery"] == ["0.0% (0/1)", "n/a", "n/a", "0.0% (0/1)", "100.0% (1/1)"]
    assert rows["tool coverage"] == [
        "40.0% (n=1)", "100.0% (n=1)", "50.0% (n=1)", "37.5% (n=2)", "50.0% (n=2)",
    ]  # fmt: skip
    assert rows["plan episodes"] == ["0", "1 (1 tool)", "0", "0", "1 (1 text)"]
    assert rows["plan completion"] == ["n/a", "100.0% (n=1)", "n/a", "n/a", "50.0% (n=1)"]
    assert rows["tools used"][1] == "3/3 apply_patch,shell,update_plan"
    assert rows["turns"] == ["3", "5", "2", "3", "3.5"]


def test_json_by_harness(db_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["--store", str(db_path), "--by", "harness", "--json"], capsys)
    assert code == 0
    document = json.loads(out)
    assert (document["by"], document["jobs"], document["unfinished_skipped"]) == (
        "harness",
        ["job"],
        1,
    )
    groups = {g["harness"]: g for g in document["groups"]}
    assert list(groups) == ["claude", "codex", "gemini", "react"]
    react = groups["react"]
    assert react["policy_version"] is None
    assert react["episodes"] == 4
    assert react["self_verification"] == {"value": 0.75, "numerator": 3, "denominator": 4}
    assert react["error_recovery"] == {"value": 0.5, "numerator": 1, "denominator": 2}
    assert react["mean_reward"]["value"] == 0.75
    assert react["tools_used"] == ["lookup_color", "read_file", "shell", "write_file"]
    assert groups["gemini"]["success_rate"]["value"] is None  # no reward
    assert groups["codex"]["plans_fully_completed"]["value"] == 1.0
    assert document["problems"] == []
    assert "comparison" not in document


def test_compare_the_lowest_and_highest_versions(
    db_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["--store", str(db_path), "--compare"], capsys)
    assert code == 0
    comparison = out.split("react: policy v0 -> v1\n")[1]
    rows = table_rows(comparison)
    assert rows["metric"] == ["v0", "v1", "change"]
    assert rows["success"] == ["50.0% (1/2)", "100.0% (2/2)", "+50.0 pt"]
    assert rows["self-verif."] == ["50.0% (1/2)", "100.0% (2/2)", "+50.0 pt"]
    assert rows["turns"] == ["3", "3.5", "+0.5"]
    assert rows["plan completion"] == ["n/a", "50.0% (n=1)", "n/a"]
    assert "codex: policy" not in out  # codex has no v1


def test_compare_as_json(db_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["--store", str(db_path), "--compare", "0", "1", "--json"], capsys)
    assert code == 0
    (react,) = json.loads(out)["comparison"]
    assert (react["harness"], react["before"], react["after"]) == ("react", 0, 1)
    assert react["episodes"] == {"before": 2, "after": 2}
    assert react["metrics"]["error_recovery"] == {"before": 0.0, "after": 1.0, "delta": 1.0}
    assert react["metrics"]["plan_completion"] == {"before": None, "after": 0.5, "delta": None}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--compare", "0", "5"],
            "--compare: no finished rollouts at policy version 5 (present: 0, 1)",
        ),
        (["--compare", "1"], "--compare: give two policy versions BEFORE AFTER or none, not 1"),
        (["--job", "nope"], "--job: no job 'nope' in"),
        (["--job", "job", "--compare", "1", "1"], None),
    ],
)
def test_bad_arguments_name_the_flag(
    db_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str | None
) -> None:
    code, _, err = run(["--store", str(db_path), *argv], capsys)
    if message is None:
        assert code == 0  # comparing a version with itself is allowed (all changes 0)
    else:
        assert code == 2
        assert err.startswith(f"openforge analyze: {message}")


def test_missing_and_empty_stores(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["--store", str(tmp_path / "none.db")], capsys)
    assert (code, err) == (2, f"openforge analyze: --store: no store at {tmp_path / 'none.db'}\n")
    store.Store(tmp_path / "empty.db").close()
    code, _, err = run(["--store", str(tmp_path / "empty.db")], capsys)
    assert (code, err) == (
        1,
        f"openforge analyze: no finished rollouts in {tmp_path / 'empty.db'}\n",
    )


def test_one_version_cannot_be_compared(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "store.db"
    with store.Store(path) as db:
        db.put(records("r", api=CHAT, tools=(), reward=1.0, steps=[Step("x")]))
    code, _, err = run(["--store", str(path), "--compare"], capsys)
    assert (code, err) == (
        2,
        "openforge analyze: --compare: needs two policy versions, the store has 0\n",
    )


def test_harnesses_without_a_common_version_cannot_be_compared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "store.db"
    with store.Store(path) as db:
        db.put(records("a", api=CHAT, tools=(), reward=1.0, steps=[Step("x")], harness="a"))
        db.put(
            records("b", api=CHAT, tools=(), reward=1.0, steps=[Step("x")], harness="b",
                    policy_version=1)
        )  # fmt: skip
    code, _, err = run(["--store", str(path), "--compare"], capsys)
    assert code == 2
    assert "no harness has finished rollouts at both v0 and v1" in err


def test_undecodable_calls_are_counted_and_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "store.db"
    broken = records("r", api=CHAT, tools=("shell",), reward=1.0, steps=[Step("x")])
    broken[1].call.request_json = b'{"messages": "nope"}'
    with store.Store(path) as db:
        db.put(broken)
    code, out, err = run(["--store", str(path)], capsys)
    assert code == 0
    assert table_rows(out)["undecodable"] == ["1"]
    assert err == (
        "openforge analyze: 1 episode(s) have calls that did not decode and were measured"
        " without them; first: rollout r call 0 request_json:"
        " messages: expected an array, got string\n"
    )
    code, out, _ = run(["--store", str(path), "--json"], capsys)
    assert json.loads(out)["problems"] == [
        {
            "rollout_id": "r",
            "problems": ["call 0 request_json: messages: expected an array, got string"],
        }
    ]


def test_success_threshold(db_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        ["--store", str(db_path), "--by", "policy-version", "--success-threshold", "1"], capsys
    )
    assert code == 0
    assert "success: reward > 1" in out.splitlines()[0]
    assert table_rows(out)["success"] == ["0.0% (0/4)", "0.0% (0/2)"]  # gemini: no reward


def test_a_terminal_gets_a_rich_table() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=120, color_system=None)
    analyze_cli._print_table(
        console, analyze_cli.TableData(["metric", "react v0"], [["success", "50.0% (1/2)"]])
    )
    text = buffer.getvalue()
    assert "┃ metric" in text and "│ success │ 50.0% (1/2) │" in text


def test_the_front_door_runs_it(db_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "openforge.cli", "analyze", "--store", str(db_path), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    assert len(document["groups"]) == 5


def test_a_reader_that_stops_early_gets_no_traceback(db_path: Path) -> None:
    """`openforge analyze --json | head -1`: the closed pipe ends the command quietly."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write
    try:
        done = subprocess.run(
            [sys.executable, "-m", "openforge.cli", "analyze", "--store", str(db_path), "--json"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_metric_names_are_unique() -> None:
    names = [metric.name for metric in analysis.METRICS]
    assert len(names) == len(set(names))
