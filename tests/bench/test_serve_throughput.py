"""The serve-throughput benchmark runs end to end and reports every figure.

Only the shape of its output is checked, never a rate: rates belong to the
benchmark's report (docs/benchmarks.md), not to a test that could flake on a
busy machine. The one content check is that the server and ``generate``
produced the same greedy tokens, which holds on any machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "serve_throughput.py"


@pytest.fixture(scope="module")
def run() -> tuple[str, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table, marker, summary = done.stdout.partition("--- json ---\n")
    assert marker, done.stdout[-3000:]
    return table, json.loads(summary)


def test_every_level_has_every_path(run: tuple[str, dict[str, Any]]) -> None:
    table, summary = run
    assert summary["quick"] is True and summary["threads"] >= 1
    assert [row["concurrency"] for row in summary["levels"]] == [1, 8, 32]
    for row in summary["levels"]:
        paths = {"serve", "generate_seq"} | (
            {"generate_batch"} if row["concurrency"] > 1 else set()
        )
        assert paths <= set(row) and ("generate_batch" in row) == (row["concurrency"] > 1)
        for path in paths:
            assert row[path]["tokens_per_s"] > 0
            for sample in row[path]["samples"]:
                assert sample["requests"] == row["requests"] and sample["tokens"] > 0
        assert row["serve"]["ttft_p50_ms"] > 0
        assert row["same_tokens_as_generate"] == row["requests"]
    assert "generated tokens/s" in table and "serve/batch" in table
    assert summary["model"]["parameters"] > 0 and summary["machine"]["cpus"] >= 1
