"""Attempts of one rollout under the failure policy: when a failed attempt is tried again.

One rule for both runners: the operator's planner reads a rollout's attempts from its
pods, ``openforge run`` from its journal, and both ask :func:`decide` what comes next.

Attempts are read in order. A failed attempt is retried while the failure policy's
action for it (``FailurePolicy.action_for``: the first matching rule, else Retry)
allows it, as a Kubernetes Job's ``podFailurePolicy`` does:

- Retry counts the attempt against ``maxAttemptsPerRollout`` (the first attempt
  included, like a Job's ``backoffLimit`` plus one);
- Ignore retries without counting it, up to :data:`IGNORED_ATTEMPTS_CAP` attempts
  beyond ``maxAttemptsPerRollout`` so that a rule cannot loop forever (the cap is on
  attempt numbers, so an attempt a stop cut off uses up one of them);
- FailRollout gives the rollout up at once.

An attempt that never ended (a stop cut it off) is not an attempt here: it is neither
a success nor a failure, and only its attempt number is used up.

Exit codes are a container's: a process killed by signal ``n`` exited with ``128 + n``
(:func:`exit_code`), so a rule ``onExitCodes: {operator: In, values: [137]}`` matches a
SIGKILLed harness in a pod and on one machine alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Literal

from openforge.api import v1alpha1

IGNORED_ATTEMPTS_CAP = 10
"""Attempts an Ignore rule may add beyond maxAttemptsPerRollout."""

State = Literal["new", "retry", "succeeded", "failed"]


@dataclasses.dataclass(frozen=True, slots=True)
class Tried:
    """One attempt that ended, as the failure policy sees it."""

    attempt: int
    succeeded: bool
    exit_code: int | None = None
    reason: str | None = None
    """A FailureReason name (``v1alpha1.FailureReason``), or None."""


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """Where one rollout stands after the attempts it had."""

    state: State
    next_attempt: int
    """The attempt number its next attempt gets (new, retry)."""
    retried: int
    """Its failed attempts that were (or, for retry, are now being) tried again, less the last."""
    last: Tried | None
    """The attempt the decision rests on: the deciding one, else the latest."""


def decide(spec: v1alpha1.RolloutJobSpec, history: Iterable[Tried]) -> Decision:
    """What comes next for a rollout that had the attempts ``history`` (any order)."""
    counted = retried = 0
    last: Tried | None = None
    cap = spec.max_attempts_per_rollout + IGNORED_ATTEMPTS_CAP
    for tried in sorted(history, key=lambda t: t.attempt):
        last = tried
        if tried.succeeded:
            return Decision("succeeded", tried.attempt + 1, retried, tried)
        action = spec.failure_action(exit_code=tried.exit_code, reason=tried.reason)
        counted += action != "Ignore"
        exhausted = counted >= spec.max_attempts_per_rollout or tried.attempt + 1 >= cap
        if action == "FailRollout" or exhausted:
            return Decision("failed", tried.attempt + 1, retried, tried)
        retried += 1
    if last is None:
        return Decision("new", 0, 0, None)
    return Decision("retry", last.attempt + 1, retried - 1, last)


def failing_exit_codes(spec: v1alpha1.RolloutJobSpec) -> frozenset[int]:
    """Harness exit codes that fail an attempt before it is graded: with failure rules, each
    non-zero code whose action is not Ignore; without rules, none (a graded rollout is
    training data whatever its harness's exit code)."""
    policy = spec.failure_policy
    if policy is None or not policy.rules:
        return frozenset()
    return frozenset(
        code for code in range(1, 256) if policy.action_for(exit_code=code, reason=None) != "Ignore"
    )


def exit_code(returncode: int) -> int:
    """A process's exit status as a container reports it: ``128 + n`` when signal ``n``
    killed it (Python's ``returncode`` is then ``-n``)."""
    return 128 - returncode if returncode < 0 else returncode
