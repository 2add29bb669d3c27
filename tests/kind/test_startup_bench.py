"""``bench/kind_startup.py`` end to end on the real cluster, tiny: both sides finish and the
report carries every figure (start-up spans, the sidecar's cgroup memory, rollouts per
minute and the ratios). Timings are never asserted: they belong to docs/benchmarks.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import kube_cluster
import pytest
import realpods

pytestmark = [pytest.mark.kind, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "kind_startup.py"


@pytest.mark.timeout(1500)
def test_the_startup_bench_reports_every_figure(kind: kube_cluster.Kube) -> None:
    env = {**os.environ, "KUBECTL": kind.kubectl_path, "HELM": realpods.helm_path()}
    args = [
        "--rollouts",
        "4",
        "--parallelism",
        "2",
        "--memory-pods",
        "1",
        "--throughput-rollouts",
        "4",
        "--throughput-parallelism",
        "4",
    ]
    result = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--kubeconfig", str(kind.kubeconfig)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1400,
        check=False,
    )
    realpods.ensure_platform(kind)  # the chart's own sidecar resources again
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.split("--- json ---", 1)[1])
    startup = report["startup"]
    for side in ("operator", "job"):
        assert startup[side]["pods"] == 4, startup
        for span in (
            "scheduled_to_answered",
            "created_to_answered",
            "scheduled_to_harness_running",
        ):
            assert all(isinstance(v, float) and v > 0 for v in startup[side][span]), (
                side,
                span,
                startup[side],
            )
    assert all(v > 0 for v in startup["operator"]["scheduled_to_sidecar_started"]), startup
    assert isinstance(startup["sidecar_adds_p50_s"], float) and startup["ratio_p50"] > 0
    memory = report["memory"]
    assert (
        memory["pods"] == 1
        and memory["usage_mib"][0] > 10
        and memory["peak_mib"][0] >= memory["usage_mib"][0]
    ), memory
    [throughput] = report["throughput"]
    assert throughput["operator"]["pods"] == throughput["job"]["pods"] == 4, throughput
    assert (
        throughput["operator"]["per_minute"] > 0
        and throughput["job"]["per_minute"] > 0
        and throughput["ratio"] > 0
    )
