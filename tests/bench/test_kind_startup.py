"""The kind start-up benchmark's pure parts: runtime timestamps, percentiles, spans, and
the manifests it applies (validated by the project's own API models). Its run on the
real cluster is ``tests/kind/test_startup_bench.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from openforge.api import manifests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import kind_startup  # noqa: E402


def test_runtime_timestamps_keep_their_nanoseconds() -> None:
    assert kind_startup.parse_time("2026-12-01T14:10:01.123456789Z") == pytest.approx(
        1796134201.123456789, abs=1e-6
    )
    assert kind_startup.parse_time("2026-12-01T14:10:01Z") == 1796134201.0


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 51)]
    assert kind_startup.percentile(values, 50) == 25.0
    assert kind_startup.percentile(values, 99) == 50.0
    assert kind_startup.percentile(list(reversed(values)), 50) == 25.0
    assert kind_startup.percentile([], 50) is None


def test_spans_skip_pods_that_lack_either_end() -> None:
    pods = {
        "a": kind_startup.PodTimes(created=1.0, scheduled=2.0, answered=3.5),
        "b": kind_startup.PodTimes(created=1.0, scheduled=2.5),
    }
    assert kind_startup.spans(pods, "scheduled", "answered") == [1.5]


def test_the_rollout_side_is_a_valid_harness_env_and_job() -> None:
    env, job = (
        manifests.parse(kind_startup.harness_env("b", 0)),
        manifests.parse(kind_startup.rollout_job("b", 50, 10)),
    )
    assert env.metadata.name == job.metadata.name == "b"
    assert len(job.spec.tasks.inline) == 50 and job.spec.parallelism == 10


def test_the_bare_side_runs_the_same_image_and_client_without_a_sidecar() -> None:
    bare = kind_startup.bare_job("b", 50, 10)
    [container] = bare["spec"]["template"]["spec"]["containers"]
    [harness] = kind_startup.harness_env("b", 0)["spec"]["template"]["spec"]["containers"]
    assert container["image"] == harness["image"] and container["command"] == harness["command"]
    assert bare["spec"]["completionMode"] == "Indexed" and bare["spec"]["completions"] == 50
    assert {e["name"] for e in container["env"]} == {"OPENAI_BASE_URL", "PROMPT_IDS"}
