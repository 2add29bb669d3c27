"""The proxy-overhead benchmark runs end to end and reports every figure.

Only the shape of its output is checked, never a timing: timings belong to
the benchmark's report (docs/benchmarks.md), not to a test that could flake
on a busy machine. The smoke run starts real servers (test engine, sidecar,
stock mitmdump) on 127.0.0.1 and stops them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "proxy_overhead.py"
PATHS = {"direct", "mitmdump", "sidecar_stream", "sidecar_json"}
TOKEN_PATHS = {"direct_tokens", "mitmdump_tokens"}
STREAMED = {"direct", "mitmdump", "sidecar_stream"}
BASELINES = {"direct", "direct_tokens"}


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


def positive_pair(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and set(value) == {"p50", "p99"}
        and 0 < value["p50"] <= value["p99"]
    )


def test_runs_a_pure_overhead_phase_and_a_paced_phase(run: tuple[str, dict[str, Any]]) -> None:
    _, summary = run
    delays = [phase["token_delay_ms"] for phase in summary["phases"]]
    assert delays[0] == 0 and len(delays) == 2 and delays[1] > 0
    assert summary["quick"] is True and summary["machine"]["cpus"] >= 1


def test_latency_rows_cover_every_path_with_added_figures(run: tuple[str, dict[str, Any]]) -> None:
    _, summary = run
    overhead = summary["phases"][0]
    assert {(r["scenario"], r["path"]) for r in overhead["latency"]} == {
        (s, p) for s in ("tool_call", "text") for p in PATHS | TOKEN_PATHS
    }
    paced = summary["phases"][1]
    assert {r["path"] for r in paced["latency"]} == STREAMED
    for phase in summary["phases"]:
        for row in phase["latency"]:
            assert row["samples"] > 0 and positive_pair(row["latency_ms"]), row
            assert set(row["added_latency_ms"]) == {"p50", "p99"}
            if row["path"] in BASELINES:
                assert row["added_latency_ms"] == {"p50": 0.0, "p99": 0.0}


def test_ttft_is_reported_for_streamed_text_answers_only(run: tuple[str, dict[str, Any]]) -> None:
    _, summary = run
    for phase in summary["phases"]:
        for row in phase["latency"]:
            streamed_text = row["scenario"] == "text" and row["path"] in STREAMED | TOKEN_PATHS
            assert ("ttft_ms" in row) == streamed_text, row
            if streamed_text:
                assert (
                    positive_pair(row["ttft_ms"])
                    and row["ttft_ms"]["p50"] <= row["latency_ms"]["p50"]
                )
                assert set(row["added_ttft_ms"]) == {"p50", "p99"}


def test_throughput_memory_and_targets_are_reported(run: tuple[str, dict[str, Any]]) -> None:
    table, summary = run
    for phase in summary["phases"]:
        assert set(phase["throughput_calls_per_s"]) == STREAMED
        assert all(rate > 0 for rate in phase["throughput_calls_per_s"].values())
        assert set(phase["memory"]) == {"sidecar", "mitmdump"}
        assert all(m["peak_rss_mb"] >= m["sampled_rss_mb"] > 10 for m in phase["memory"].values())
        assert phase["sidecar_counters"]["calls"] == phase["sidecar_counters"]["spooled_calls"] > 0
    targets = summary["targets"]
    assert set(targets) == {
        "ttft_added_p50_le_2ms",
        "no_worse_than_stock_mitmdump",
        "sidecar_rss_le_100mb",
    }
    assert all(isinstance(t["met"], bool) for t in targets.values())
    assert "calls/s at 50 clients" in table and "peak RSS" in table
    for name in targets:
        assert f"target {name}: " in table
