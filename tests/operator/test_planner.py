"""The reconcile planner, exhaustively, on hand-built attempts: what it creates, what
status it writes, which Events it records, and that replanning from its own status
changes nothing (what an operator restarted mid-job relies on)."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import pytest
from openforge.api import retries, v1alpha1
from openforge_operator import planner
from operator_fixtures import NOW, attempt, job

RETRY_ALL = {
    "failurePolicy": {
        "rules": [{"action": "Retry", "onExitCodes": {"operator": "NotIn", "values": [0]}}]
    }
}


def made(plan: planner.Plan) -> list[tuple[int, int]]:
    """(rollout index, attempt) of the pods ``plan`` creates, in order."""
    return [(new.index, new.attempt) for new in plan.create]


def later(seconds: float) -> datetime.datetime:
    return NOW + datetime.timedelta(seconds=seconds)


def condition(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions", []) if c["type"] == type_), None)


def replan(previous: planner.Plan, **kwargs: Any) -> planner.Plan:
    """Plan again for a job whose status is what ``previous`` wrote."""
    spec = kwargs.pop("spec", None)
    return planner.plan(job=job(spec=spec, status=previous.status), **kwargs)


# -- a fresh job ---------------------------------------------------------------------------


def test_a_fresh_job_starts_parallelism_rollouts_from_index_zero() -> None:
    plan = planner.plan(job=job(), total=12, attempts=[], now=NOW)
    assert made(plan) == [(0, 0), (1, 0), (2, 0), (3, 0), (4, 0)]
    assert plan.status["counts"] == {
        "pending": 12,
        "active": 0,
        "succeeded": 0,
        "failed": 0,
        "retried": 0,
    }
    assert plan.status["startTime"] == "2026-01-02T03:04:05Z"
    assert plan.status["observedGeneration"] == 1
    assert [(e.type, e.reason) for e in plan.events] == [("Normal", "Started")]
    assert "12 rollouts, at most 5 at once" in plan.events[0].message
    assert not plan.finished and plan.delete == [] and not plan.delete_job


def test_parallelism_above_the_rollout_count_starts_every_rollout() -> None:
    plan = planner.plan(job=job(spec={"parallelism": 50}), total=12, attempts=[], now=NOW)
    assert made(plan) == [(i, 0) for i in range(12)]


def test_live_pods_take_slots_and_are_not_created_again() -> None:
    live = [attempt(0, 0, "running"), attempt(1, 0, "pending"), attempt(3, 0, "running")]
    plan = planner.plan(job=job(), total=12, attempts=live, now=NOW)
    assert made(plan) == [(2, 0), (4, 0)]
    assert plan.status["counts"]["active"] == 3
    assert plan.status["counts"]["pending"] == 9


def test_a_full_job_creates_nothing_and_a_lowered_parallelism_creates_nothing_either() -> None:
    live = [attempt(i, 0, "running") for i in range(5)]
    assert made(planner.plan(job=job(), total=12, attempts=live, now=NOW)) == []
    assert (
        made(planner.plan(job=job(spec={"parallelism": 2}), total=12, attempts=live, now=NOW)) == []
    )


def test_a_raised_parallelism_fills_the_new_slots() -> None:
    live = [attempt(i, 0, "running") for i in range(5)]
    plan = planner.plan(job=job(spec={"parallelism": 7}), total=12, attempts=live, now=NOW)
    assert made(plan) == [(5, 0), (6, 0)]


def test_finished_rollouts_free_their_slots() -> None:
    seen = [
        attempt(0, 0, "succeeded", exit_code=0),
        attempt(1, 0, "succeeded"),
        *(attempt(i, 0, "running") for i in (2, 3, 4)),
    ]
    plan = planner.plan(job=job(), total=12, attempts=seen, now=NOW)
    assert made(plan) == [(5, 0), (6, 0)]
    assert plan.status["counts"] == {
        "pending": 7,
        "active": 3,
        "succeeded": 2,
        "failed": 0,
        "retried": 0,
    }


# -- retries and the failure policy ----------------------------------------------------------


def test_a_failed_attempt_is_retried_under_the_next_attempt_number() -> None:
    plan = planner.plan(
        job=job(), total=12, attempts=[attempt(0, 0, "failed", exit_code=1)], now=NOW
    )
    assert made(plan)[0] == (0, 1)
    assert plan.status["counts"]["retried"] == 0, (
        "retried counts an attempt once its successor exists"
    )
    plan = planner.plan(
        job=job(),
        total=12,
        attempts=[attempt(0, 0, "failed", exit_code=1), attempt(0, 1, "running")],
        now=NOW,
    )
    assert (0, 1) not in made(plan) and (0, 2) not in made(plan)
    assert plan.status["counts"]["retried"] == 1


def test_a_rollout_fails_after_max_attempts_and_is_named_in_failed_indexes() -> None:
    tries = [attempt(2, n, "failed", exit_code=3) for n in range(3)]
    plan = planner.plan(job=job(spec=RETRY_ALL), total=12, attempts=tries, now=NOW)
    assert all(index != 2 for index, _ in made(plan))
    assert plan.status["failedIndexes"] == "2"
    assert plan.status["counts"]["failed"] == 1 and plan.status["counts"]["retried"] == 2
    event = next(e for e in plan.events if e.reason == "RolloutsFailed")
    assert event.type == "Warning"
    assert (
        "rollouts 2 failed" in event.message
        and "attempt 2" in event.message
        and "exit code 3" in event.message
    )


def test_max_attempts_one_means_no_retry() -> None:
    plan = planner.plan(
        job=job(spec={"maxAttemptsPerRollout": 1}),
        total=12,
        attempts=[attempt(0, 0, "failed", exit_code=1)],
        now=NOW,
    )
    assert plan.status["failedIndexes"] == "0"
    assert (0, 1) not in made(plan)


def test_fail_rollout_rule_gives_up_at_once() -> None:
    spec = {
        "failurePolicy": {
            "rules": [{"action": "FailRollout", "onExitCodes": {"operator": "In", "values": [42]}}]
        }
    }
    plan = planner.plan(
        job=job(spec=spec), total=12, attempts=[attempt(0, 0, "failed", exit_code=42)], now=NOW
    )
    assert plan.status["failedIndexes"] == "0"
    other = planner.plan(
        job=job(spec=spec), total=12, attempts=[attempt(0, 0, "failed", exit_code=1)], now=NOW
    )
    assert made(other)[0] == (0, 1), "a code no rule matches is retried"


@pytest.mark.parametrize(
    "reason",
    ["Evicted", "OOMKilled", "DeadlineExceeded", "Preempted", "GraderFailed", "SidecarFailed"],
)
def test_reason_rules_match_the_reason_the_attempt_failed_with(reason: str) -> None:
    spec = {"failurePolicy": {"rules": [{"action": "FailRollout", "onReasons": [reason]}]}}
    plan = planner.plan(
        job=job(spec=spec), total=12, attempts=[attempt(0, 0, "failed", reason=reason)], now=NOW
    )
    assert plan.status["failedIndexes"] == "0"


def test_ignored_failures_do_not_count_against_max_attempts() -> None:
    spec = {
        "maxAttemptsPerRollout": 2,
        "failurePolicy": {"rules": [{"action": "Ignore", "onReasons": ["Evicted", "Preempted"]}]},
    }
    tries = [
        attempt(0, 0, "failed", reason="Evicted"),
        attempt(0, 1, "failed", reason="Preempted"),
        attempt(0, 2, "failed", exit_code=1),
    ]
    plan = planner.plan(job=job(spec=spec), total=12, attempts=tries, now=NOW)
    assert made(plan)[0] == (0, 3), "one counted failure of two allowed"
    tries.append(attempt(0, 3, "failed", exit_code=1))
    assert (
        planner.plan(job=job(spec=spec), total=12, attempts=tries, now=NOW).status["failedIndexes"]
        == "0"
    )


def test_ignored_failures_stop_at_the_cap() -> None:
    spec = {
        "maxAttemptsPerRollout": 2,
        "failurePolicy": {"rules": [{"action": "Ignore", "onReasons": ["Evicted"]}]},
    }
    cap = 2 + retries.IGNORED_ATTEMPTS_CAP
    tries = [attempt(0, n, "failed", reason="Evicted") for n in range(cap)]
    assert (
        planner.plan(job=job(spec=spec), total=12, attempts=tries, now=NOW).status["failedIndexes"]
        == "0"
    )
    tries.pop()
    assert made(planner.plan(job=job(spec=spec), total=12, attempts=tries, now=NOW))[0] == (
        0,
        cap - 1,
    )


def test_rollout_state_reads_attempts_in_order_whatever_order_they_come_in() -> None:
    spec = job().spec
    state = planner.rollout_state(
        0, [attempt(0, 1, "succeeded"), attempt(0, 0, "failed", exit_code=1)], spec=spec
    )
    assert (state.state, state.retried, state.last and state.last.attempt) == ("succeeded", 1, 1)
    assert planner.rollout_state(0, [], spec=spec).state == "new"


def test_failed_indexes_are_compact_and_only_new_failures_raise_an_event() -> None:
    tries = [attempt(i, n, "failed", exit_code=3) for i in (1, 2, 3, 7) for n in range(3)]
    plan = planner.plan(job=job(spec=RETRY_ALL), total=12, attempts=tries, now=NOW)
    assert plan.status["failedIndexes"] == "1-3,7"
    again = replan(plan, spec=RETRY_ALL, total=12, attempts=tries, now=later(1))
    assert not [e for e in again.events if e.reason == "RolloutsFailed"]
    tries += [attempt(9, n, "failed", exit_code=3) for n in range(3)]
    more = replan(plan, spec=RETRY_ALL, total=12, attempts=tries, now=later(2))
    assert more.status["failedIndexes"] == "1-3,7,9"
    assert [e.message.split(":")[0] for e in more.events if e.reason == "RolloutsFailed"] == [
        "rollouts 9 failed"
    ]


# -- the end of a job ------------------------------------------------------------------------


def test_a_job_is_complete_when_every_rollout_finished() -> None:
    done = [attempt(i, 0, "succeeded", acknowledged=i % 2 == 0) for i in range(11)] + [
        attempt(11, n, "failed", exit_code=1) for n in range(3)
    ]
    plan = planner.plan(job=job(), total=12, attempts=done, now=NOW)
    complete = condition(plan.status, "Complete")
    assert (
        complete is not None
        and complete["status"] == "True"
        and complete["reason"] == "RolloutsFinished"
    )
    assert (
        complete["message"] == "11 rollouts succeeded, 1 failed"
        and complete["observedGeneration"] == 1
    )
    assert plan.status["completionTime"] == "2026-01-02T03:04:05Z"
    assert plan.status["trajectoriesAcknowledged"] == 6
    assert plan.finished and made(plan) == []
    assert ("Normal", "Completed") in [(e.type, e.reason) for e in plan.events]


def test_a_job_whose_every_rollout_failed_is_failed() -> None:
    tries = [attempt(i, n, "failed", exit_code=1) for i in range(2) for n in range(3)]
    plan = planner.plan(
        job=job(spec={"tasks": {"inline": [{"id": "a"}]}, "samplesPerTask": 2}),
        total=2,
        attempts=tries,
        now=NOW,
    )
    failed = condition(plan.status, "Failed")
    assert failed is not None and failed["reason"] == "NoRolloutSucceeded"
    assert condition(plan.status, "Complete") is None
    assert ("Warning", "Failed") in [(e.type, e.reason) for e in plan.events]


def test_a_finished_job_does_nothing_more_and_keeps_its_status() -> None:
    done = [attempt(i, 0, "succeeded") for i in range(12)]
    plan = planner.plan(job=job(), total=12, attempts=done, now=NOW)
    again = replan(plan, total=12, attempts=done, now=later(60))
    assert made(again) == [] and again.events == [] and again.finished
    assert again.status == plan.status


def test_ttl_after_finish_deletes_the_job_when_it_runs_out() -> None:
    spec = {"ttlSecondsAfterFinished": 30}
    done = [attempt(i, 0, "succeeded") for i in range(12)]
    plan = planner.plan(job=job(spec=spec), total=12, attempts=done, now=NOW)
    assert plan.requeue_after == 30 and not plan.delete_job
    waiting = replan(plan, spec=spec, total=12, attempts=done, now=later(10))
    assert waiting.requeue_after == pytest.approx(20) and not waiting.delete_job
    assert replan(plan, spec=spec, total=12, attempts=done, now=later(30)).delete_job


def test_ttl_zero_deletes_at_once() -> None:
    spec = {"ttlSecondsAfterFinished": 0}
    done = [attempt(i, 0, "succeeded") for i in range(12)]
    plan = planner.plan(job=job(spec=spec), total=12, attempts=done, now=NOW)
    assert replan(plan, spec=spec, total=12, attempts=done, now=NOW).delete_job


def test_active_deadline_fails_the_job_and_deletes_its_live_pods() -> None:
    spec = {"activeDeadlineSeconds": 100}
    first = planner.plan(job=job(spec=spec), total=12, attempts=[], now=NOW)
    assert first.requeue_after == pytest.approx(100)
    live = [attempt(0, 0, "running"), attempt(1, 0, "pending"), attempt(2, 0, "succeeded")]
    before = replan(first, spec=spec, total=12, attempts=live, now=later(99))
    assert before.requeue_after == pytest.approx(1) and before.delete == []
    past = replan(first, spec=spec, total=12, attempts=live, now=later(100))
    failed = condition(past.status, "Failed")
    assert failed is not None and failed["reason"] == "DeadlineExceeded"
    assert past.delete == ["job-0-0", "job-1-0"] and made(past) == []
    assert ("Warning", "DeadlineExceeded") in [(e.type, e.reason) for e in past.events]
    # after the deadline: pods still terminating are deleted again (a no-op), none created
    after = replan(past, spec=spec, total=12, attempts=live, now=later(101))
    assert made(after) == [] and after.delete == ["job-0-0", "job-1-0"] and after.events == []
    terminating = [attempt(0, 0, "running"), *live[1:]]
    object.__setattr__(terminating[0], "deleting", True)
    assert replan(past, spec=spec, total=12, attempts=terminating, now=later(102)).delete == [
        "job-1-0"
    ]


# -- suspend and resume ----------------------------------------------------------------------


def test_suspend_stops_new_attempts_and_resume_continues() -> None:
    running = planner.plan(job=job(), total=12, attempts=[], now=NOW)
    live = [attempt(i, 0, "running") for i in range(5)]
    suspended = replan(running, spec={"suspend": True}, total=12, attempts=live[:2], now=later(5))
    assert made(suspended) == []
    cond = condition(suspended.status, "Suspended")
    assert cond is not None and cond["status"] == "True" and cond["reason"] == "JobSuspended"
    assert "startTime" not in suspended.status, "the deadline clock stops"
    assert [(e.reason) for e in suspended.events] == ["Suspended"]
    still = replan(suspended, spec={"suspend": True}, total=12, attempts=[], now=later(10))
    assert still.events == [] and made(still) == []
    resumed = replan(suspended, total=12, attempts=[], now=later(20))
    cond = condition(resumed.status, "Suspended")
    assert cond is not None and cond["status"] == "False" and cond["reason"] == "JobResumed"
    assert [e.reason for e in resumed.events] == ["Resumed", "Started"]
    assert resumed.status["startTime"] == "2026-01-02T03:04:25Z"
    assert made(resumed) == [(i, 0) for i in range(5)]


def test_a_job_created_suspended_starts_nothing_and_has_no_start_time() -> None:
    plan = planner.plan(job=job(spec={"suspend": True}), total=12, attempts=[], now=NOW)
    assert made(plan) == [] and "startTime" not in plan.status
    assert [e.reason for e in plan.events] == ["Suspended"]


# -- blocked and unknown ---------------------------------------------------------------------


def test_a_blocked_job_creates_nothing_but_counts_what_it_sees() -> None:
    plan = planner.plan(
        job=job(),
        total=12,
        attempts=[attempt(0, 0, "running")],
        now=NOW,
        blocked="HarnessEnv 'env' not found",
    )
    assert made(plan) == []
    assert plan.status["counts"] == {
        "pending": 11,
        "active": 1,
        "succeeded": 0,
        "failed": 0,
        "retried": 0,
    }


def test_with_unknown_tasks_only_seen_rollouts_count_and_nothing_finishes() -> None:
    plan = planner.plan(
        job=job(),
        total=None,
        attempts=[attempt(0, 0, "succeeded"), attempt(4, 0, "running")],
        now=NOW,
        blocked="tasks",
    )
    assert plan.status["counts"] == {
        "pending": 0,
        "active": 1,
        "succeeded": 1,
        "failed": 0,
        "retried": 0,
    }
    assert not plan.finished and condition(plan.status, "Complete") is None


def test_attempts_past_the_last_rollout_are_ignored() -> None:
    plan = planner.plan(job=job(), total=12, attempts=[attempt(99, 0, "succeeded")], now=NOW)
    assert plan.status["counts"]["succeeded"] == 0


# -- restart safety --------------------------------------------------------------------------


def test_replanning_from_the_written_status_is_stable() -> None:
    seen = [
        attempt(0, 0, "succeeded"),
        attempt(1, 0, "failed", exit_code=1),
        attempt(1, 1, "running"),
        attempt(2, 0, "pending"),
    ]
    first = planner.plan(job=job(), total=12, attempts=seen, now=NOW)
    second = replan(first, total=12, attempts=seen, now=later(3))
    assert second.events == []
    assert made(second) == made(first)
    assert second.status == first.status, "timestamps, counts and conditions unchanged"


def test_condition_transition_times_move_only_when_the_status_changes() -> None:
    suspended = planner.plan(job=job(spec={"suspend": True}), total=12, attempts=[], now=NOW)
    again = replan(suspended, spec={"suspend": True}, total=12, attempts=[], now=later(50))
    cond = condition(again.status, "Suspended")
    assert cond is not None and cond["lastTransitionTime"] == "2026-01-02T03:04:05Z"


def test_observed_generation_follows_the_spec() -> None:
    first = planner.plan(job=job(), total=12, attempts=[], now=NOW)
    plan = planner.plan(
        job=job(status=first.status, generation=4), total=12, attempts=[], now=later(1)
    )
    assert plan.status["observedGeneration"] == 4


def test_the_status_is_a_valid_rollout_job_status() -> None:
    tries = [attempt(i, n, "failed", exit_code=3) for i in (1, 2) for n in range(3)]
    plan = planner.plan(job=job(spec=RETRY_ALL), total=12, attempts=tries, now=NOW)
    v1alpha1.RolloutJobStatus.model_validate(plan.status)


# -- what outlives the pods --------------------------------------------------------------------


def test_finished_rollouts_are_recorded_and_stay_finished_without_their_pods() -> None:
    seen = [
        attempt(0, 0, "succeeded"),
        attempt(1, 0, "failed", exit_code=1),
        attempt(1, 1, "failed", exit_code=1),
        attempt(1, 2, "failed", exit_code=1),
        attempt(2, 0, "running"),
    ]
    first = planner.plan(job=job(spec=RETRY_ALL), total=12, attempts=seen, now=NOW)
    assert first.status["completedIndexes"] == "0" and first.status["failedIndexes"] == "1"
    # every pod of rollouts 0 and 1 deleted (by hand, while the operator was down)
    after = replan(first, spec=RETRY_ALL, total=12, attempts=seen[4:], now=later(5))
    assert all(index not in (0, 1) for index, _ in made(after)), "neither is run again"
    assert after.status["completedIndexes"] == "0" and after.status["failedIndexes"] == "1"
    assert after.status["counts"] == {**first.status["counts"], "retried": 0}
    assert after.events == []


def test_a_new_pod_records_the_attempts_before_it() -> None:
    seen = [attempt(0, 0, "failed", exit_code=1), attempt(0, 1, "failed", reason="Evicted")]
    plan = planner.plan(job=job(spec=RETRY_ALL), total=12, attempts=seen, now=NOW)
    [new] = [n for n in plan.create if n.index == 0]
    assert (new.attempt, new.earlier) == (
        2,
        (retries.Tried(0, False, 1, None), retries.Tried(1, False, None, "Evicted")),
    )
    fresh = [n for n in plan.create if n.index != 0]
    assert fresh and all(n.earlier == () for n in fresh)


def test_a_retried_rollouts_history_is_read_back_from_its_latest_pod() -> None:
    """Attempts 0 and 1 failed and their pods are gone: attempt 2's pod records them, so
    the rollout has used up its three attempts, not one."""
    earlier = (retries.Tried(0, False, 1, None), retries.Tried(1, False, 1, None))
    last = attempt(4, 2, "failed", exit_code=1, earlier=earlier)
    plan = planner.plan(job=job(spec=RETRY_ALL), total=12, attempts=[last], now=NOW)
    assert plan.status["failedIndexes"] == "4"
    assert plan.status["counts"]["retried"] == 2
    alone = dataclasses.replace(last, earlier=())
    forgetful = planner.plan(job=job(spec=RETRY_ALL), total=12, attempts=[alone], now=NOW)
    assert (4, 3) in made(forgetful), "without the record, the rollout would run again"


def test_an_attempt_number_is_never_used_twice() -> None:
    """Whatever the pods left say, a new attempt's number is above every attempt known
    (two pods of one name would have their records collide in the store)."""
    earlier = (retries.Tried(5, False, None, "Evicted"),)
    running = attempt(3, 6, "running", earlier=earlier)
    plan = planner.plan(job=job(), total=12, attempts=[running], now=NOW)
    assert all(index != 3 for index, _ in made(plan))
    gone = attempt(3, 6, "failed", reason="Evicted", earlier=earlier)
    plan = planner.plan(job=job(), total=12, attempts=[gone], now=NOW)
    assert (3, 7) in made(plan)


def test_held_pods_are_let_go_once_their_outcome_is_recorded_elsewhere() -> None:
    seen = [
        attempt(0, 0, "succeeded", held=True),  # the status records it
        attempt(1, 0, "failed", exit_code=1, held=True),  # attempt 1's pod records it
        attempt(1, 1, "running", held=True),  # live
        attempt(2, 0, "failed", exit_code=1, held=True),  # its successor is not made yet
        attempt(3, 0, "succeeded"),  # not held
    ]
    spec = {**RETRY_ALL, "parallelism": 1}
    plan = planner.plan(job=job(spec=spec), total=12, attempts=seen, now=NOW)
    assert made(plan) == [], "parallelism 1, one live"
    assert plan.release == ["job-0-0", "job-1-0"]
    assert plan.holding


def test_a_finished_job_lets_every_pod_go() -> None:
    seen = [attempt(i, 0, "succeeded", held=True) for i in range(11)]
    seen.append(attempt(11, 0, "running", held=True))
    spec = {"activeDeadlineSeconds": 10}
    first = planner.plan(job=job(spec=spec), total=12, attempts=seen, now=NOW)
    past = replan(first, spec=spec, total=12, attempts=seen, now=later(11))
    assert past.delete == ["job-11-0"] and past.finished
    assert past.release == sorted(a.name for a in seen), "the live one too: nothing reruns"
    assert not past.holding
    after = replan(past, spec=spec, total=12, attempts=seen, now=later(12))
    assert after.release == past.release
