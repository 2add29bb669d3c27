"""One manifest, one history of attempts, one outcome: the operator and ``openforge run``
try a failed rollout again under the same rule (``openforge.api.retries``).

Each case is a RolloutJob (one task, one sample) and a script saying how each attempt
ends. The operator's side is its planner, fed the attempts its pods would show until it
calls the job finished; the local side is the runner itself, journal and all, with only
the running of an attempt (a sidecar and a harness process) replaced by the script. Both
must run the same attempts and reach the same end. Before the rule was shared they did
not: with ``maxAttemptsPerRollout: 2`` and an Ignore rule on DeadlineExceeded the
operator ran 12 attempts and ``openforge run`` 2, and ``openforge run`` cut
``maxAttemptsPerRollout: 20`` down to 10.
"""

from __future__ import annotations

import dataclasses
import datetime
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from openforge.api import manifests, retries, v1alpha1
from openforge_operator import attempts, planner
from openforge_runner import executor, plan, runner

NOW = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)

ENV = {
    "apiVersion": v1alpha1.API_VERSION,
    "kind": "HarnessEnv",
    "metadata": {"name": "env"},
    "spec": {
        "api": "openai-chat",
        "baseUrl": {"env": ["OPENAI_BASE_URL"], "suffix": "/v1"},
        "template": {
            "spec": {
                "containers": [{"name": "harness", "image": "example/h:1", "command": ["true"]}]
            }
        },
        "grader": {"command": ["echo", "1"]},
    },
}

Ending = tuple[str, int | None, str | None]
"""How an attempt ends: (succeeded | failed, exit code, FailureReason or None)."""

TIMEOUT: Ending = ("failed", 137, "DeadlineExceeded")
GRADER: Ending = ("failed", 0, "GraderFailed")
EXIT_3: Ending = ("failed", 3, None)
EXIT_1: Ending = ("failed", 1, None)
OK: Ending = ("succeeded", 0, None)


def job_body(max_attempts: int, rules: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "harnessEnvRef": {"name": "env"},
        "tasks": {"inline": [{"id": "t", "prompt": "p"}]},
        "samplesPerTask": 1,
        "parallelism": 1,
        "maxAttemptsPerRollout": max_attempts,
        "policy": {"endpoint": "http://policy.test:8000", "model": "tiny"},
        "trainer": {"endpoint": "collector.test:50051"},
    }
    if rules:
        spec["failurePolicy"] = {"rules": rules}
    return {
        "apiVersion": v1alpha1.API_VERSION,
        "kind": "RolloutJob",
        "metadata": {"name": "parity", "uid": "u-1", "generation": 1},
        "spec": spec,
    }


IGNORE_TIMEOUTS = [{"action": "Ignore", "onReasons": ["DeadlineExceeded"]}]
FAIL_ON_3 = [{"action": "FailRollout", "onExitCodes": {"operator": "In", "values": [3]}}]
IGNORE_SIGKILL = [{"action": "Ignore", "onExitCodes": {"operator": "In", "values": [137]}}]

CASES: dict[
    str, tuple[int, list[dict[str, Any]], Callable[[int], Ending], tuple[list[int], str]]
] = {
    # name: (maxAttemptsPerRollout, rules, how attempt n ends, (attempts run, end))
    "ignored timeouts do not count, up to the cap": (
        2, IGNORE_TIMEOUTS, lambda n: TIMEOUT,
        (list(range(2 + retries.IGNORED_ATTEMPTS_CAP)), "failed"),
    ),
    "ignored timeouts, then counted failures": (
        2, IGNORE_TIMEOUTS, lambda n: [TIMEOUT, EXIT_1, TIMEOUT, GRADER][n],
        ([0, 1, 2, 3], "failed"),
    ),
    "a SIGKILL is exit code 137 to a rule": (
        2, IGNORE_SIGKILL, lambda n: TIMEOUT if n < 3 else OK, ([0, 1, 2, 3], "succeeded"),
    ),
    "retries count": (3, [], lambda n: GRADER, ([0, 1, 2], "failed")),
    "more than ten attempts when asked for": (
        20, [], lambda n: GRADER, (list(range(20)), "failed"),
    ),
    "one attempt": (1, [], lambda n: GRADER, ([0], "failed")),
    "FailRollout gives up at once": (3, FAIL_ON_3, lambda n: EXIT_3, ([0], "failed")),
    "a rule that does not match retries": (
        3, FAIL_ON_3, lambda n: [EXIT_1, OK][n], ([0, 1], "succeeded"),
    ),
    "success ends it": (
        3, IGNORE_TIMEOUTS, lambda n: [TIMEOUT, GRADER, OK][n], ([0, 1, 2], "succeeded"),
    ),
}  # fmt: skip


def on_the_operator(body: dict[str, Any], ends: Callable[[int], Ending]) -> tuple[list[int], str]:
    job = manifests.parse(body)
    assert isinstance(job, v1alpha1.RolloutJob)
    seen: list[attempts.Attempt] = []
    for _ in range(100):
        made = planner.plan(job=job, total=1, attempts=seen, now=NOW)
        if made.finished:
            counts = made.status["counts"]
            return [a.attempt for a in seen], "succeeded" if counts["succeeded"] else "failed"
        assert made.create, made.status
        for new in made.create:
            index, attempt = new.index, new.attempt
            assert [t.attempt for t in new.earlier] == [a.attempt for a in seen], (
                "a new pod records every attempt before it"
            )
            state, exit_code, reason = ends(attempt)
            seen.append(
                attempts.Attempt(
                    name=f"parity-{index}-{attempt}",
                    index=index,
                    attempt=attempt,
                    state=state,
                    exit_code=exit_code,
                    reason=reason,
                )
            )  # type: ignore[arg-type]
    raise AssertionError("the planner never finished the job")


class Scripted(runner.Runner):
    """The runner, with an attempt's run (sidecar, harness, grader) replaced by the script;
    ``stop_at`` interrupts that attempt as a Ctrl-C would."""

    def __init__(
        self,
        bundle: plan.Bundle,
        run_dir: Path,
        ends: Callable[[int], Ending],
        stop_at: int | None = None,
    ) -> None:
        super().__init__(
            bundle,
            run_dir=run_dir,
            endpoints=lambda rollout: executor.Endpoints("http://127.0.0.1:9", "127.0.0.1:9", 0),
            stop=threading.Event(),
        )
        self.ends, self.stop_at, self.ran = ends, stop_at, []

    def _run(self, rollout: plan.Rollout) -> executor.Outcome:
        if rollout.attempt == self.stop_at:
            self.stop.set()
            return executor.Outcome(
                rollout, "failed", 137, None, executor.INTERRUPTED, "stopped", 0, 0.0
            )
        self.ran.append(rollout.attempt)
        state, exit_code, reason = self.ends(rollout.attempt)
        reward = 1.0 if state == "succeeded" else None
        return executor.Outcome(rollout, state, exit_code or 0, reward, reason or "", "", 0, 0.0)  # type: ignore[arg-type]


def bundle_of(tmp_path: Path, body: dict[str, Any]) -> plan.Bundle:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump_all([ENV, body]))
    return plan.load([path])


def on_one_machine(
    tmp_path: Path, body: dict[str, Any], ends: Callable[[int], Ending]
) -> tuple[list[int], str]:
    scripted = Scripted(bundle_of(tmp_path, body), tmp_path, ends)
    scripted.run_iteration(0)
    [finish] = [e for e in scripted.journal.entries() if e["event"] == "finish"]
    return scripted.ran, finish["status"]


@pytest.mark.parametrize("case", CASES)
def test_the_operator_and_openforge_run_retry_alike(tmp_path: Path, case: str) -> None:
    max_attempts, rules, ends, expected = CASES[case]
    body = job_body(max_attempts, rules)
    assert on_the_operator(body, ends) == expected
    assert on_one_machine(tmp_path, body, ends) == expected


def test_a_rerun_counts_the_failures_before_the_stop_and_not_the_attempt_it_cut_off(
    tmp_path: Path,
) -> None:
    body = job_body(4, [])
    bundle = bundle_of(tmp_path, body)
    first = Scripted(bundle, tmp_path, lambda n: GRADER, stop_at=2)
    first.run_iteration(0)
    assert first.ran == [0, 1]
    second = Scripted(bundle, tmp_path, lambda n: GRADER)
    second.run_iteration(0)
    # attempt 2 was cut off: its number is used up, but it is no failure, so two more run
    assert second.ran == [3, 4]
    [finish] = [e for e in second.journal.entries() if e["event"] == "finish"]
    assert (finish["attempt"], finish["status"]) == (4, "failed")
    assert [e["attempt"] for e in second.journal.entries() if e["event"] == "retry"] == [0, 1, 3]


def test_a_harness_killed_by_a_signal_exits_with_128_plus_the_signal_as_in_a_container(
    tmp_path: Path,
) -> None:
    env = {
        **ENV,
        "spec": {
            **ENV["spec"],
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "harness",
                            "image": "example/h:1",
                            "command": ["sh", "-c", "kill -9 $$"],
                        }
                    ]
                }
            },
        },
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump_all([env, job_body(1, [])]))
    bundle = plan.load([path])
    [rollout] = plan.rollouts_for(bundle, 0)
    exit_code, timed_out = executor._run_harness(
        bundle,
        rollout,
        sidecar_url="http://127.0.0.1:9",
        workdir=tmp_path / "work",
        log=tmp_path / "harness.log",
        stop=threading.Event(),
    )
    assert (exit_code, timed_out) == (128 + signal.SIGKILL, False)


def test_exit_codes_and_failing_codes() -> None:
    assert [retries.exit_code(code) for code in (0, 3, -9, -15)] == [0, 3, 137, 143]
    job = manifests.parse(job_body(2, FAIL_ON_3 + IGNORE_SIGKILL))
    assert isinstance(job, v1alpha1.RolloutJob)
    failing = retries.failing_exit_codes(job.spec)
    assert 3 in failing and 1 in failing and 137 not in failing and 0 not in failing
    plain = manifests.parse(job_body(2, []))
    assert isinstance(plain, v1alpha1.RolloutJob)
    assert (
        retries.failing_exit_codes(plain.spec) == frozenset()
    )  # graded data whatever the exit code


def test_an_attempt_whose_finish_said_tried_again_is_tried_again(tmp_path: Path) -> None:
    """The finish went to the store saying the attempt is tried again (the grader failed
    it, which the policy retries); then the collector did not acknowledge it, and the
    verdict became SidecarFailed, which this policy gives up on. The store's word is
    kept: the trainer waits for the next attempt, so the runner runs it."""
    give_up = [{"action": "FailRollout", "onReasons": ["SidecarFailed"]}]

    class Promised(Scripted):
        def _run(self, rollout: plan.Rollout) -> executor.Outcome:
            outcome = super()._run(rollout)
            return dataclasses.replace(outcome, retried=rollout.attempt == 0)

    ends: Callable[[int], Ending] = lambda n: [("failed", 0, "SidecarFailed"), OK][n]  # noqa: E731
    promised = Promised(bundle_of(tmp_path, job_body(3, give_up)), tmp_path, ends)
    promised.run_iteration(0)
    [finish] = [e for e in promised.journal.entries() if e["event"] == "finish"]
    assert (promised.ran, finish["status"]) == ([0, 1], "succeeded")
    (tmp_path / "b").mkdir()
    unpromised = Scripted(bundle_of(tmp_path / "b", job_body(3, give_up)), tmp_path / "b", ends)
    unpromised.run_iteration(0)
    assert unpromised.ran == [0]
