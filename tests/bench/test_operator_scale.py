"""The operator-scale benchmark runs end to end on the cluster and reports every figure.

A tiny run (8 rollouts, parallelism 4) on a cluster: both sides
finish, neither makes a duplicate pod, and the report carries the timings, the
ratios and the operator's CPU and peak RSS. Timings are never asserted: they
belong to docs/benchmarks.md, not to a test that could flake on a busy machine.

The cluster is ``$KUBECONFIG``'s, else a local one started here (the ``kube``
fixture lives with the cluster tests, out of this folder's reach), so with its
start-up this takes more than 30 s: marked slow as well as cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "operator_scale.py"
sys.path.insert(0, str(ROOT / "tests" / "cluster"))
import kube_cluster  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kube_cluster.Kube]:
    if os.environ.get("KUBECONFIG"):
        yield kube_cluster.from_kubeconfig(os.environ["KUBECONFIG"])
        return
    bin_dir = kube_cluster.built_binaries()
    if bin_dir is None:
        pytest.skip(
            "cluster binaries are not built (scripts/build_cluster_binaries.sh) "
            "and KUBECONFIG is unset"
        )
    directory = tmp_path_factory.mktemp("bench-cluster")
    try:
        yield kube_cluster.start_local(directory, bin_dir)
    finally:
        kube_cluster.stop_local(directory)


def test_a_small_run_reports_both_sides(kube: kube_cluster.Kube) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--rollouts", "8", "--parallelism", "4",
         "--duration", "200ms", "--kubeconfig", str(kube.kubeconfig)],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
        env={**os.environ, "KUBECTL": kube.kubectl_path}, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table, marker, summary = done.stdout.partition("--- json ---\n")
    assert marker and "RolloutJob" in table and "Indexed Job" in table
    result = json.loads(summary)
    for side in ("rolloutjob", "job"):
        assert result[side]["pods"] == 8 and result[side]["duplicates"] == 0
        assert (
            result[side]["all_created_s"] > 0
            and result[side]["all_complete_s"] >= result[side]["all_created_s"]
        )
    assert result["rolloutjob"]["status_counts"]["succeeded"] == 8
    assert (
        result["rolloutjob"]["operator_cpu_s"] > 0
        and result["rolloutjob"]["operator_peak_rss_mib"] > 10
    )
    assert result["ratio_all_created"] > 0 and result["ratio_all_complete"] > 0
