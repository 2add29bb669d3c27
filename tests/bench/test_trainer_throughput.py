"""The trainer-throughput benchmark runs end to end and reports every figure.

Only the shape of its output is checked, and that both paths computed the
same losses; never a timing (timings belong to docs/benchmarks.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "trainer_throughput.py"


def test_quick_run_reports_both_paths_side_by_side() -> None:
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
    assert table.splitlines()[0].split() == ["path", "tokens/s", "step", "s", "of", "which"]
    assert [line.split()[0] for line in table.splitlines()[1:3]] == ["pipeline", "bare"]
    assert "overhead" in table.splitlines()[3]
    result = json.loads(summary)
    for key in (
        "pipeline_tokens_per_s",
        "bare_tokens_per_s",
        "tokens_per_step",
        "bare_step_s",
        "checkpoint_s",
    ):
        assert isinstance(result[key], float) and result[key] > 0, key
    assert isinstance(result["overhead"], float) and isinstance(result["meets_target"], bool)
    assert isinstance(result["overhead_total"], float) and len(result["overhead_per_step"]) == 2
    assert result["target_overhead"] == 0.10
    assert set(result["pipeline_breakdown_s"]) == {
        "select_export_s",
        "batch_s",
        "update_s",
        "total_s",
    }
    assert result["steps"] == 2 and result["workload"]["steps"] == 2
    assert result["loss_max_abs_diff"] < 1e-5  # same weights, same data: the same update
    assert result["first_step_logprob_diff_max"] < 1e-4
