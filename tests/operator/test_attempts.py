"""Judging a rollout pod's attempt from hand-built pod dicts, as the API server shows them."""

from __future__ import annotations

import dataclasses
import json

import pytest
from openforge.api import retries
from openforge_operator import attempts
from operator_fixtures import pod, terminated

FAILING = frozenset({3})


def judge(body: dict, failing: frozenset[int] = FAILING) -> attempts.Attempt:
    found = attempts.observe(body, failing_exit_codes=failing)
    assert found is not None
    return found


def test_identity_comes_from_labels() -> None:
    assert attempts.identify(pod(7, 2)) == ("00000000-0000-0000-0000-000000000001", 7, 2)
    unlabelled = pod(0, 0)
    del unlabelled["metadata"]["labels"]["openforge.dev/attempt"]
    assert attempts.identify(unlabelled) is None
    assert attempts.observe(unlabelled, failing_exit_codes=FAILING) is None
    bad = pod(0, 0)
    bad["metadata"]["labels"]["openforge.dev/rollout"] = "x"
    assert attempts.summarize(bad) is None


@pytest.mark.parametrize(
    ("phase", "state"), [("Pending", "pending"), ("Running", "running"), ("Unknown", "pending")]
)
def test_unfinished_pods_are_live(phase: str, state: str) -> None:
    found = judge(pod(1, 0, phase=phase))
    assert (found.state, found.live, found.index, found.attempt, found.name) == (
        state,
        True,
        1,
        0,
        "job-1-0",
    )


def test_exit_zero_succeeds() -> None:
    found = judge(pod(0, 0, phase="Succeeded", status={"containerStatuses": [terminated(0)]}))
    assert (found.state, found.exit_code, found.reason) == ("succeeded", 0, None)


def test_a_failing_exit_code_fails_and_any_other_is_graded_data() -> None:
    failed = judge(pod(0, 0, phase="Failed", status={"containerStatuses": [terminated(3)]}))
    assert (failed.state, failed.exit_code, failed.reason) == ("failed", 3, None)
    assert "exited with 3" in failed.message
    graded = judge(pod(0, 0, phase="Failed", status={"containerStatuses": [terminated(4)]}))
    assert graded.state == "succeeded", "without a failure rule for 4, the rollout is graded data"
    assert (
        judge(
            pod(0, 0, phase="Failed", status={"containerStatuses": [terminated(3)]}), frozenset()
        ).state
        == "succeeded"
    )


def test_only_the_harness_container_exit_code_counts() -> None:
    statuses = [terminated(3, name="tools"), terminated(0)]
    assert (
        judge(pod(0, 0, phase="Failed", status={"containerStatuses": statuses})).state
        == "succeeded"
    )


def test_the_pods_own_verdict_wins_over_its_exit_code() -> None:
    verdict = {
        "exitCode": 0,
        "status": "failed",
        "reason": "GraderFailed",
        "reward": None,
        "acknowledged": True,
        "message": "grader printed no JSON line",
    }
    found = judge(
        pod(
            0,
            0,
            phase="Succeeded",
            status={"containerStatuses": [terminated(0, message=json.dumps(verdict))]},
        )
    )
    assert (found.state, found.reason, found.message) == (
        "failed",
        "GraderFailed",
        "grader printed no JSON line",
    )
    ok = {"exitCode": 3, "status": "succeeded", "reason": "", "reward": 0.5, "acknowledged": True}
    found = judge(
        pod(
            0,
            0,
            phase="Failed",
            status={"containerStatuses": [terminated(3, message=json.dumps(ok))]},
        )
    )
    assert (found.state, found.exit_code, found.acknowledged) == ("succeeded", 3, True)


def test_a_termination_message_that_is_not_a_verdict_is_ignored() -> None:
    found = judge(
        pod(
            0,
            0,
            phase="Failed",
            status={"containerStatuses": [terminated(3, message="panic: oops")]},
        )
    )
    assert (found.state, found.exit_code) == ("failed", 3)
    found = judge(
        pod(
            0,
            0,
            phase="Failed",
            status={"containerStatuses": [terminated(3, message='{"not": "ours"}')]},
        )
    )
    assert found.state == "failed"


def test_eviction_is_a_reason_whatever_the_exit_code() -> None:
    found = judge(
        pod(
            0,
            0,
            phase="Failed",
            status={
                "reason": "Evicted",
                "message": "node low on memory",
                "containerStatuses": [terminated(0)],
            },
        )
    )
    assert (found.state, found.reason, found.message) == ("failed", "Evicted", "node low on memory")


def test_out_of_memory_in_any_container_is_oomkilled() -> None:
    status = {"containerStatuses": [terminated(137, reason="OOMKilled")]}
    assert judge(pod(0, 0, phase="Failed", status=status)).reason == "OOMKilled"
    status = {
        "containerStatuses": [terminated(0)],
        "initContainerStatuses": [terminated(137, reason="OOMKilled", name="openforge-sidecar")],
    }
    assert judge(pod(0, 0, phase="Failed", status=status)).reason == "OOMKilled"


def test_deadline_exceeded_and_image_pull_failures() -> None:
    assert (
        judge(pod(0, 0, phase="Failed", status={"reason": "DeadlineExceeded"})).reason
        == "DeadlineExceeded"
    )
    waiting = {"name": "harness", "state": {"waiting": {"reason": "ImagePullBackOff"}}}
    found = judge(
        pod(
            0,
            0,
            phase="Failed",
            status={"reason": "DeadlineExceeded", "containerStatuses": [waiting]},
        )
    )
    assert found.reason == "ImagePullFailed"


def test_a_failed_pod_without_a_harness_exit_code_failed() -> None:
    found = judge(
        pod(
            0,
            0,
            phase="Failed",
            status={"reason": "OutOfcpu", "message": "Node didn't have enough resource"},
        )
    )
    assert (found.state, found.reason, found.exit_code) == ("failed", None, None)
    assert "enough resource" in found.message


def test_a_live_pod_deleted_before_it_finished_failed() -> None:
    summary = attempts.summarize(
        pod(0, 0, phase="Running", deletionTimestamp="2026-01-01T00:00:00Z")
    )
    assert summary is not None and summary.deleting
    assert attempts.judge(summary, failing_exit_codes=FAILING).live
    gone = attempts.judge(_gone(summary), failing_exit_codes=FAILING)
    assert (gone.state, gone.reason) == ("failed", None)


def _stopped(exit_code: int, finished_at: str, message: str | None = None) -> dict:
    harness = terminated(exit_code, message=message)
    harness["state"]["terminated"]["finishedAt"] = finished_at
    return {"containerStatuses": [harness]}


def test_a_pod_deleted_while_its_harness_ran_failed_whatever_its_exit_code() -> None:
    # kubectl delete at 10:00:00 with 30 s grace; the kubelet stopped the harness (SIGKILL at
    # 10:00:30)
    deleted = {"deletionTimestamp": "2026-01-01T10:00:30Z", "deletionGracePeriodSeconds": 30}
    found = judge(
        pod(0, 0, phase="Failed", status=_stopped(137, "2026-01-01T10:00:30Z"), **deleted)
    )
    assert (found.state, found.reason, found.message) == (
        "failed",
        None,
        "the pod was deleted before it finished",
    )
    # the same with a harness that caught SIGTERM and exited 0, and the agent's failed verdict
    verdict = json.dumps({"status": "failed", "exitCode": -1, "reason": ""})
    assert (
        judge(
            pod(
                0,
                0,
                phase="Succeeded",
                status=_stopped(0, "2026-01-01T10:00:01Z", verdict),
                **deleted,
            )
        ).state
        == "failed"
    )
    # a harness that finished before the deletion was asked keeps its result
    assert (
        judge(
            pod(0, 0, phase="Succeeded", status=_stopped(0, "2026-01-01T09:59:59Z"), **deleted)
        ).state
        == "succeeded"
    )
    # and so does a rollout the agent reported finished (its records acknowledged) before it was
    # stopped
    verdict = json.dumps({"status": "succeeded", "exitCode": 0, "reason": "", "acknowledged": True})
    found = judge(
        pod(0, 0, phase="Failed", status=_stopped(137, "2026-01-01T10:00:30Z", verdict), **deleted)
    )
    assert (found.state, found.acknowledged) == ("succeeded", True)


def _gone(summary: attempts.PodSummary) -> attempts.PodSummary:
    return dataclasses.replace(summary, gone=True)


def test_a_preempted_pod_that_vanished_failed_as_preempted() -> None:
    disruption = {
        "conditions": [
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
        ]
    }
    summary = attempts.summarize(pod(0, 0, phase="Running", status=disruption))
    assert summary is not None
    found = attempts.judge(_gone(summary), failing_exit_codes=FAILING)
    assert (found.state, found.reason) == ("failed", "Preempted")


def test_a_finished_pod_that_vanished_keeps_its_verdict() -> None:
    summary = attempts.summarize(
        pod(0, 0, phase="Succeeded", status={"containerStatuses": [terminated(0)]})
    )
    assert summary is not None
    assert attempts.judge(_gone(summary), failing_exit_codes=FAILING).state == "succeeded"


def test_namespace_is_kept() -> None:
    summary = attempts.summarize(pod(0, 0))
    assert summary is not None and summary.namespace == "ns" and summary.job_uid.endswith("1")


def test_a_pod_deleted_before_it_was_scheduled_failed() -> None:
    """No kubelet ends a pod never bound to a node: held by the finalizer it would wait
    Pending forever, a live attempt that no new one could replace."""
    deleted = pod(0, 0, node=None, deletionTimestamp="2026-01-01T00:00:00Z")
    found = judge(deleted)
    assert (found.state, found.message) == ("failed", "the pod was deleted before it finished")
    assert judge(pod(0, 0, node=None)).live, "not deleted: waiting to be scheduled"
    assert judge(pod(0, 0, deletionTimestamp="2026-01-01T00:00:00Z")).live, (
        "bound to a node: its kubelet stops it, and the phase says when"
    )


def test_the_finalizer_and_the_earlier_attempts_are_read_from_the_pod() -> None:
    history = [retries.Tried(0, False, 1, None), retries.Tried(2, False, None, "Evicted")]
    body = pod(
        0,
        3,
        finalizers=["other.example/keep", "openforge.dev/attempt-record"],
        annotations={"openforge.dev/earlier-attempts": attempts.earlier_annotation(history)},
    )
    summary = attempts.summarize(body)
    assert summary is not None and summary.held and summary.job == "job"
    assert summary.earlier == tuple(history)
    found = attempts.judge(summary, failing_exit_codes=FAILING)
    assert found.held and found.earlier == tuple(history)
    plain = attempts.summarize(pod(0, 3))
    assert plain is not None and not plain.held and plain.earlier == ()


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        '{"attempt": 0}',
        '[1, "x", null]',
        '[{"attempt": "0"}, {"attempt": -1}, {"attempt": 3}, {"attempt": true}]',
    ],
)
def test_an_earlier_attempts_annotation_that_is_no_record_is_left_out(text: str) -> None:
    assert attempts.earlier_attempts(text, before=3) == ()


def test_earlier_attempts_keep_what_is_well_formed_and_before_the_pods_own() -> None:
    text = (
        '[{"attempt": 1, "exitCode": "x", "reason": ""}, {"attempt": 0, "exitCode": 4},'
        ' {"attempt": 5, "exitCode": 1}]'
    )
    assert attempts.earlier_attempts(text, before=2) == (
        retries.Tried(0, False, 4, None),
        retries.Tried(1, False, None, None),
    )
