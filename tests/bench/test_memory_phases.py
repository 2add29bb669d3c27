"""The per-phase memory benchmark runs end to end: phases named, the call's peak seen."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "memory_phases.py"


def test_a_small_call_reports_its_rss_per_phase() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--size", "1", "--shape", "many", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout)
    phases, call = result["phases_mb"], result["call"]
    assert "Capture.request/TokenHistory.plan" in phases
    # mitmproxy's own work, named by the phase before it (sending the engine's request)
    assert "outside, after Capture.request" in phases
    assert any(name.startswith("Capture.request/OpenAIChatCodec.parse_request") for name in phases)
    # the sampler saw the sidecar's memory: never above its peak, and the call's own rise
    assert call["idle_mb"] < max(phases.values()) <= call["peak_mb"]
