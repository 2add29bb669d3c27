"""The CPU-per-call benchmark runs end to end, including a second checkout's sidecar.

Only the shape of its output is checked, never a figure (see
test_proxy_overhead.py). The second checkout is this one, which also checks
that ``--compare`` really runs the sidecar of the tree it is given, and
runs the load phase with a few clients.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "cpu_per_call.py"


def test_quick_run_reports_every_proxy() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--compare", str(ROOT), "--clients", "4"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table, marker, summary = done.stdout.partition("--- json ---\n")
    assert marker and "cpu ms/call" in table
    found = json.loads(summary)
    assert set(found) == {"mitmdump", "sidecar", f"sidecar@{ROOT}"}
    for name, row in found.items():
        assert row["cpu_ms_per_call"] >= 0, name  # 8 calls can fall between two clock ticks
        assert 0 < row["text_latency_ms"]["p50"] <= row["text_latency_ms"]["p99"], name
        assert row["text_ttft_ms"]["p50"] > 0 and row["peak_rss_mb"] > 10, name
        load = row["load"]
        assert load["cpu_ms_per_call"] >= 0 and load["calls_per_s"] > 0, name
        assert load["peak_rss_mb"] >= row["peak_rss_mb"], name
