"""The large-request benchmark runs end to end; only the shape of its output is checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "large_requests.py"


@pytest.mark.parametrize("shape", ["one", "many"])
def test_a_small_run_reports_memory_and_time_per_size(shape: str) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--sizes", "0.2", "1", "--shape", shape],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table, marker, summary = done.stdout.partition("--- json ---\n")
    assert marker and "peak-idle/body" in table
    results = json.loads(summary)
    assert set(results) == {"sidecar", "mitmproxy alone (floor)"}
    for rows in results.values():
        assert set(rows) == {"0.2 MB", "1 MB"}
        for row in rows.values():
            assert row["seconds"] >= 0 and row["idle_mb"] > 10
            assert row["peak_mb"] >= row["after_mb"] > 0
    assert all(row["seconds"] > 0 for row in results["sidecar"].values())


def test_the_many_shape_is_a_conversation_of_small_turns_ending_with_the_users() -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    import large_requests

    body = json.loads(large_requests.body_of(1, shape="many"))
    turns = body["messages"]
    assert len(turns) > 400 and turns[-1]["role"] == "user"
    assert max(len(t["content"]) for t in turns) < 2100
    assert abs(len(json.dumps(body)) - 1024 * 1024) < 0.02 * 1024 * 1024
