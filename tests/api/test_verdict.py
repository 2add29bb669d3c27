"""The verdict of one attempt, in the order its rules apply (``openforge.api.verdict``);
tests/runner/test_verdict_parity.py runs both runners' real processes through it."""

from __future__ import annotations

import dataclasses

import pytest
from openforge.api import verdict

GRADED = verdict.Graded(stdout='{"reward": 0.5}', exit_code=0)


def judge(**overrides: object) -> verdict.Verdict:
    arguments: dict[str, object] = {
        "exit_code": 0,
        "grader": GRADED,
        "reward_from": "stdout-json",
        "failing_exit_codes": frozenset({3}),
    }
    return verdict.judge(**{**arguments, **overrides})  # type: ignore[arg-type]


def test_a_graded_attempt_succeeds_and_keeps_the_end_of_the_graders_output() -> None:
    assert judge() == verdict.Verdict(0, 0.5, '{"reward": 0.5}', "succeeded", "")
    long = judge(grader=verdict.Graded(stdout="x" * 9000 + '\n{"reward": 1}', exit_code=0))
    assert len(long.grader_output) == verdict.GRADER_OUTPUT_LIMIT and long.grader_output.endswith(
        '{"reward": 1}'
    )


def test_a_sidecar_that_failed_before_it_served_fails_the_attempt_whatever_else() -> None:
    failed = judge(sidecar_start_failed=True, timed_out=True)
    assert (failed.status, failed.reason, failed.reward) == ("failed", "SidecarFailed", None)


def test_a_harness_past_its_timeout_is_not_graded() -> None:
    late = judge(timed_out=True, timeout_seconds=30.0)
    assert (late.status, late.reason, late.reward, late.message) == (
        "failed",
        "DeadlineExceeded",
        None,
        "the harness ran past its timeout (30 s)",
    )


def test_no_reward_is_a_grader_failure_and_a_failing_exit_code_a_failure_though_graded() -> None:
    assert judge(grader=None).reason == "GraderFailed"
    assert (
        judge(grader=verdict.Graded(error="no such file")).message
        == "the grader could not run: no such file"
    )
    assert (
        judge(grader=verdict.Graded(stdout='{"reward": 1}', timed_out=True)).reason
        == "GraderFailed"
    )
    failing = judge(exit_code=3)
    assert (failing.status, failing.reason, failing.reward, failing.message) == (
        "failed",
        "",
        0.5,
        "harness exited with 3",
    )
    assert judge(exit_code=4).status == "succeeded"


def test_without_a_grader_the_exit_code_is_the_reward() -> None:
    assert (
        judge(reward_from=None, grader=None).reward,
        judge(reward_from=None, grader=None, exit_code=2).reward,
    ) == (1.0, 0.0)


def test_the_report_body_and_its_settling() -> None:
    judged = judge()
    assert judged.report(60).body() == {
        "exit_code": 0,
        "reward": 0.5,
        "grader_output": '{"reward": 0.5}',
        "status": "succeeded",
        "wait_seconds": 60,
        "retried": False,
    }
    failed = dataclasses.replace(judged, status="failed")
    sent = failed.report(60, retried=True).body()
    assert sent["retried"] is True and verdict.Report.parse(sent).retried
    assert verdict.settle(judged, {"acknowledged": True, "calls": 2}) == verdict.Settled(
        judged, True, 2
    )
    lost = verdict.settle(judged, {"acknowledged": False, "error": "timed out"})
    assert (lost.verdict.reason, lost.acknowledged, lost.verdict.reward) == (
        "SidecarFailed",
        False,
        0.5,
    )
    assert (
        lost.verdict.message == "the collector did not acknowledge the rollout's records: timed out"
    )


def test_a_report_survives_its_body_and_bad_fields_are_named() -> None:
    report = verdict.Report(
        exit_code=3, reward=None, grader_output="x", status="failed", wait_seconds=2.5
    )
    assert verdict.Report.parse(report.body()) == report
    assert verdict.Report.parse({}) == verdict.Report()
    assert verdict.Report.parse({"exit_code": 2}).status == "failed"  # by the exit code
    for body, field in [
        ([], "body"),
        ({"exit_code": 2**31}, "exit_code"),
        ({"exit_code": True}, "exit_code"),
        ({"reward": float("nan")}, "reward"),
        ({"reward": "1"}, "reward"),
        ({"grader_output": 1}, "grader_output"),
        ({"status": "done"}, "status"),
        ({"wait_seconds": 3601}, "wait_seconds"),
        ({"wait_seconds": -1}, "wait_seconds"),
    ]:
        with pytest.raises(ValueError, match=field):
            verdict.Report.parse(body)
