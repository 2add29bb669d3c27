"""The reconcile planner (pure): from a job and its observed attempts to what to do.

Level-based: the plan depends only on the job (spec and last status), the
attempts its pods show, the number of rollouts and the time, never on what
happened before in this process, so an operator restarted mid-job plans
exactly what the old one would have. It says which pods to create (rollout
index, attempt) up to ``parallelism``, which live pods to delete, the status
to write, the Events worth recording, and whether the job's TTL ran out.

Per rollout, attempts are read in order and the failure policy decides
whether a failed one is tried again: ``openforge.api.retries``, the one rule
``openforge run`` follows too (Retry counts against ``maxAttemptsPerRollout``,
Ignore does not, up to ``retries.IGNORED_ATTEMPTS_CAP`` extra attempts;
FailRollout gives the rollout up at once).

The job is Complete when every rollout has finished and at least one
succeeded, Failed when none succeeded or when it ran past
``activeDeadlineSeconds`` (live pods are then deleted). Suspending stops new
attempts; attempts already running finish, and the deadline clock stops
(``startTime`` is cleared and set again on resume, as for a Job).

What the operator remembers of a rollout must outlive its pods, which anyone
may delete, the operator down or not. Each pod is created holding the
operator's finalizer and stays until its outcome is recorded elsewhere
(:attr:`Plan.release`): a finished rollout in the status (``completedIndexes``,
``failedIndexes``, which the planner reads back), a failed attempt that is
tried again on the next attempt's pod (``earlier``, from which the rollout's
history is read back). A pod deleted while the operator is down thus waits, in
its final state, for the operator to judge it, and no attempt number is ever
used twice (the records of two pods under one name would collide in the store).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from openforge.api import retries, rollouts, v1alpha1

from openforge_operator import attempts as attempts_

RolloutStateName = Literal["new", "retry", "live", "succeeded", "failed"]


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    """A Kubernetes Event to record on the job."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclasses.dataclass(frozen=True, slots=True)
class RolloutState:
    """Where one rollout stands, from its attempts."""

    index: int
    state: RolloutStateName
    next_attempt: int
    """The attempt number a new pod for this rollout gets (new, retry)."""
    retried: int
    """Failed attempts of this rollout that were retried."""
    last: attempts_.Attempt | None
    history: tuple[retries.Tried, ...] = ()
    """Its attempts that ended, in order (what a new pod for it records as ``earlier``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class NewPod:
    """A pod to create: attempt ``attempt`` of rollout ``index``, after ``earlier``."""

    index: int
    attempt: int
    earlier: tuple[retries.Tried, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    create: list[NewPod]
    """The pods to create, in order."""
    delete: list[str]
    """Names of live pods to delete."""
    status: dict[str, Any]
    """The job's whole status, as the API holds it."""
    events: list[Event]
    delete_job: bool = False
    requeue_after: float | None = None
    """Look again after this many seconds at the latest (deadline, TTL)."""
    finished: bool = False
    release: list[str] = dataclasses.field(default_factory=list)
    """Held pods whose outcome the status (once written) or a later attempt's pod records:
    their finalizer can go."""
    holding: bool = False
    """Pods of the job still hold the finalizer and cannot be let go yet."""


def rollout_state(
    index: int,
    attempts: Sequence[attempts_.Attempt],
    *,
    spec: v1alpha1.RolloutJobSpec,
    recorded: RolloutStateName | None = None,
) -> RolloutState:
    """Where rollout ``index`` stands, given every attempt of it seen so far (its pods,
    and the earlier attempts they record): the shared failure-policy rule
    (``openforge.api.retries``, which ``openforge run`` follows too) over the attempts
    that ended before the first live one, which is live unless they already decided
    the rollout. ``recorded`` is the outcome the job's status keeps for it (succeeded,
    failed), which stands whatever pods are left."""
    ordered = sorted(attempts, key=lambda a: a.attempt)
    live = next((a for a in ordered if a.live), None)
    ended = {a.attempt: a for a in ordered if live is None or a.attempt < live.attempt}
    tried = {t.attempt: t for a in ordered for t in a.earlier}
    tried = {n: t for n, t in tried.items() if live is None or n < live.attempt}
    tried.update((n, a.tried) for n, a in ended.items())
    history = tuple(tried[n] for n in sorted(tried))
    decision = retries.decide(spec, history)
    last = None
    if decision.last is not None:
        last = ended.get(decision.last.attempt) or _from_record(index, decision.last)
    numbers = [a.attempt for a in ordered] + list(tried)
    next_attempt = max(decision.next_attempt, max(numbers, default=-1) + 1)
    if recorded is not None and decision.state != recorded:
        return RolloutState(index, recorded, next_attempt, decision.retried, last, history)
    if live is not None and decision.state in ("new", "retry"):
        retried = decision.retried + (decision.state == "retry")
        return RolloutState(index, "live", live.attempt + 1, retried, live, history)
    return RolloutState(index, decision.state, next_attempt, decision.retried, last, history)


def _from_record(index: int, tried: retries.Tried) -> attempts_.Attempt:
    """An attempt known only from a later pod's record of it."""
    state: attempts_.State = "succeeded" if tried.succeeded else "failed"
    return attempts_.Attempt("", index, tried.attempt, state, tried.exit_code, tried.reason)


def plan(
    *,
    job: v1alpha1.RolloutJob,
    total: int | None,
    attempts: Iterable[attempts_.Attempt],
    now: datetime.datetime,
    blocked: str | None = None,
) -> Plan:
    """What to do now. ``total`` is the number of rollouts (None while the tasks are
    unknown); ``blocked`` says why no pod may start (a missing HarnessEnv, unreadable
    tasks), and keeps the planner from creating any."""
    spec = job.spec
    old = job.status or v1alpha1.RolloutJobStatus()
    generation = job.metadata.generation
    attempts = list(attempts)
    live = [a for a in attempts if a.live]
    if _terminal(old) is not None:
        return _after_finish(job, old, attempts=attempts, now=now)
    states = _states(attempts, total, spec=spec, recorded=_recorded(old))
    counts = _counts(states, live)
    failed = [s.index for s in states if s.state == "failed"]
    conditions = list(old.conditions)
    events: list[Event] = []
    start_time = old.start_time
    completion_time: datetime.datetime | None = None
    delete: list[str] = []
    create: list[NewPod] = []
    requeue: float | None = None

    def condition(
        type_: str, status: v1alpha1.ConditionStatus, *, reason: str, message: str
    ) -> None:
        nonlocal conditions
        conditions = v1alpha1.set_condition(
            conditions,
            v1alpha1.Condition(
                type=type_, status=status, reason=reason, message=message,
                last_transition_time=now, observed_generation=generation,
            ),
        )  # fmt: skip

    was_suspended = _is_true(old.conditions, v1alpha1.SUSPENDED)
    if spec.suspend:
        condition(
            v1alpha1.SUSPENDED,
            "True",
            reason="JobSuspended",
            message="suspended: no new attempts start",
        )
        if not was_suspended:
            events.append(
                Event(
                    "Normal", "Suspended", f"suspended with {counts.active} rollouts still running"
                )
            )
        start_time = None
    else:
        if was_suspended:
            condition(v1alpha1.SUSPENDED, "False", reason="JobResumed", message="resumed")
            events.append(Event("Normal", "Resumed", "resumed: new attempts start again"))
        if start_time is None:
            start_time = now
            what = f"{total} rollouts" if total is not None else "rollouts"
            events.append(
                Event("Normal", "Started", f"running {what}, at most {spec.parallelism} at once")
            )

    newly_failed = sorted(set(failed) - set(rollouts.parse_indexes(old.failed_indexes or "")))
    if newly_failed:
        events.append(Event("Warning", "RolloutsFailed", _failed_message(newly_failed, states)))

    deadline = spec.active_deadline_seconds
    finished = total is not None and all(s.state in ("succeeded", "failed") for s in states)
    if (
        deadline is not None
        and start_time is not None
        and now >= start_time + datetime.timedelta(seconds=deadline)
    ):
        message = f"ran past activeDeadlineSeconds ({deadline} s); {len(live)} live pods deleted"
        condition(v1alpha1.FAILED, "True", reason="DeadlineExceeded", message=message)
        events.append(Event("Warning", "DeadlineExceeded", message))
        delete = [a.name for a in live if not a.deleting]
        completion_time = now
    elif finished:
        summary = f"{counts.succeeded} rollouts succeeded, {counts.failed} failed"
        if counts.succeeded == 0 and counts.failed > 0:
            condition(v1alpha1.FAILED, "True", reason="NoRolloutSucceeded", message=summary)
            events.append(Event("Warning", "Failed", summary))
        else:
            condition(v1alpha1.COMPLETE, "True", reason="RolloutsFinished", message=summary)
            events.append(Event("Normal", "Completed", summary))
        completion_time = now
    else:
        if not spec.suspend and blocked is None:
            capacity = max(0, spec.parallelism - len(live))
            todo = (s for s in states if s.state in ("new", "retry"))
            create = [
                NewPod(s.index, s.next_attempt, tuple(t for t in s.history if not t.succeeded))
                for s, _ in zip(todo, range(capacity), strict=False)
            ]
        if deadline is not None and start_time is not None:
            requeue = (start_time + datetime.timedelta(seconds=deadline) - now).total_seconds()
    if completion_time is not None and spec.ttl_seconds_after_finished is not None:
        requeue = float(spec.ttl_seconds_after_finished)

    status = v1alpha1.RolloutJobStatus(
        observed_generation=generation,
        conditions=conditions,
        counts=counts,
        # pods of acknowledged rollouts may be gone; an acknowledgement is never taken back
        trajectories_acknowledged=max(
            old.trajectories_acknowledged, sum(a.acknowledged for a in attempts)
        ),
        failed_indexes=rollouts.format_indexes(failed) or None,
        completed_indexes=rollouts.format_indexes(s.index for s in states if s.state == "succeeded")
        or None,
        start_time=start_time,
        completion_time=completion_time,
    )
    finishing = completion_time is not None
    release = _releasable(attempts, states, finished=finishing)
    return Plan(
        create,
        delete,
        status.to_dict(),
        events,
        False,
        requeue,
        finishing,
        release=release,
        holding=_holding(attempts, release),
    )


def _recorded(status: v1alpha1.RolloutJobStatus) -> dict[int, RolloutStateName]:
    """The outcomes the status keeps for finished rollouts (their pods may be gone)."""
    recorded: dict[int, RolloutStateName] = {}
    for index in rollouts.parse_indexes(status.completed_indexes or ""):
        recorded[index] = "succeeded"
    for index in rollouts.parse_indexes(status.failed_indexes or ""):
        recorded[index] = "failed"
    return recorded


def _releasable(
    attempts: Sequence[attempts_.Attempt], states: Sequence[RolloutState], *, finished: bool
) -> list[str]:
    """Held pods whose outcome is recorded once this plan's status is written: every pod of
    a finished job (nothing is planned from them again); an ended attempt of a finished
    rollout (the status records it); an ended attempt that a later attempt's pod exists
    for (that pod records it as ``earlier``)."""
    held = [a for a in attempts if a.held and a.name]
    if finished:
        return sorted(a.name for a in held)
    by_index = {s.index: s for s in states}
    latest: dict[int, int] = {}
    for attempt in attempts:
        latest[attempt.index] = max(latest.get(attempt.index, -1), attempt.attempt)
    release = []
    for attempt in held:
        if attempt.live:
            continue
        state = by_index.get(attempt.index)
        if (state is not None and state.state in ("succeeded", "failed")) or latest[
            attempt.index
        ] > attempt.attempt:
            release.append(attempt.name)
    return sorted(release)


def _holding(attempts: Sequence[attempts_.Attempt], release: Sequence[str]) -> bool:
    let_go = set(release)
    return any(a.held and a.name not in let_go for a in attempts)


def _after_finish(
    job: v1alpha1.RolloutJob,
    old: v1alpha1.RolloutJobStatus,
    *,
    attempts: list[attempts_.Attempt],
    now: datetime.datetime,
) -> Plan:
    """A finished job: no new pods; a failed one's live pods deleted; every pod let go; the
    TTL."""
    live = [a for a in attempts if a.live]
    status = old.model_copy(update={"observed_generation": job.metadata.generation}).to_dict()
    delete = [a.name for a in live if not a.deleting] if _terminal(old) == v1alpha1.FAILED else []
    release = _releasable(attempts, [], finished=True)
    done = Plan([], delete, status, [], finished=True, release=release)
    ttl = job.spec.ttl_seconds_after_finished
    if ttl is None or old.completion_time is None:
        return done
    remaining = (old.completion_time + datetime.timedelta(seconds=ttl) - now).total_seconds()
    if remaining <= 0:
        return dataclasses.replace(done, delete_job=True)
    return dataclasses.replace(done, requeue_after=remaining)


def _states(
    attempts: Sequence[attempts_.Attempt],
    total: int | None,
    *,
    spec: v1alpha1.RolloutJobSpec,
    recorded: Mapping[int, RolloutStateName],
) -> list[RolloutState]:
    by_index: dict[int, list[attempts_.Attempt]] = defaultdict(list)
    for attempt in attempts:
        if total is None or attempt.index < total:
            by_index[attempt.index].append(attempt)
    known = sorted({*by_index, *recorded})
    indexes: Iterable[int] = range(total) if total is not None else known
    return [
        rollout_state(i, by_index.get(i, []), spec=spec, recorded=recorded.get(i)) for i in indexes
    ]


def _counts(
    states: Sequence[RolloutState], live: Sequence[attempts_.Attempt]
) -> v1alpha1.RolloutCounts:
    tally: dict[str, int] = defaultdict(int)
    for state in states:
        tally[state.state] += 1
    return v1alpha1.RolloutCounts(
        pending=tally["new"] + tally["retry"],
        active=len(live),
        succeeded=tally["succeeded"],
        failed=tally["failed"],
        retried=sum(s.retried for s in states),
    )


def _failed_message(indexes: list[int], states: Sequence[RolloutState], *, shown: int = 5) -> str:
    by_index = {s.index: s for s in states}
    details = []
    for index in indexes[:shown]:
        last = by_index[index].last
        if last is None:
            continue
        why = last.reason or (
            f"exit code {last.exit_code}" if last.exit_code is not None else "failed"
        )
        details.append(
            f"{index} after attempt {last.attempt} "
            f"({why}{': ' + last.message if last.message else ''})"
        )
    more = f"; {len(indexes) - shown} more" if len(indexes) > shown else ""
    return f"rollouts {rollouts.format_indexes(indexes)} failed: " + "; ".join(details) + more


def _terminal(status: v1alpha1.RolloutJobStatus) -> str | None:
    for type_ in (v1alpha1.COMPLETE, v1alpha1.FAILED):
        if _is_true(status.conditions, type_):
            return type_
    return None


def _is_true(conditions: list[v1alpha1.Condition], type_: str) -> bool:
    condition = v1alpha1.find_condition(conditions, type_)
    return condition is not None and condition.status == "True"
