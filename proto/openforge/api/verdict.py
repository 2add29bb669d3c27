"""What one attempt came to: the rule ``openforge run`` and the in-pod agent share.

Each runner gathers what happened (the harness's exit code and whether it ran past
its timeout, what the grader printed and how it ended, whether the sidecar failed
before it served) and :func:`judge` turns that into a reward and a verdict; after the
rollout is reported to the sidecar, :func:`settle` turns the sidecar's answer (did
the collector acknowledge, and store, every record) into the final one. In order:

1. a sidecar that failed before it served (calls may have been refused unrecorded):
   SidecarFailed, whatever the harness did;
2. a harness that ran past its timeout: DeadlineExceeded, ungraded;
3. the reward: without a grader, 1.0 for exit code 0 and 0.0 otherwise; else the
   grader's (``openforge.api.grading``), and none (GraderFailed) when it could not
   run, ran past its timeout (its output may be cut short) or printed no reward;
4. a harness exit code the failure policy does not ignore
   (``retries.failing_exit_codes``): failed, though graded;
5. else succeeded: a graded rollout is training data whatever its exit code.

Then, the report: records the collector did not acknowledge, or acknowledged but
refused to store (a collector token of another job), make the attempt SidecarFailed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from openforge.api import grading

Status = Literal["succeeded", "failed"]
GRADER_OUTPUT_LIMIT = 4000
"""Characters of the grader's output (its end) kept with the rollout."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Graded:
    """How the grader ended."""

    stdout: str = ""
    exit_code: int | None = None
    timed_out: bool = False
    error: str = ""
    """Why it could not run at all (it then has no exit code)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """What one attempt came to."""

    exit_code: int
    reward: float | None
    grader_output: str
    status: Status
    reason: str
    """A FailureReason name, or "" (success, or a failing exit code)."""
    message: str = ""

    def finish_body(self, wait_seconds: float) -> dict[str, Any]:
        """The sidecar's ``/openforge/v1/rollout/finish`` request body."""
        return {
            "exit_code": self.exit_code,
            "reward": self.reward,
            "grader_output": self.grader_output,
            "status": self.status,
            "wait_seconds": wait_seconds,
        }


def judge(
    *,
    exit_code: int,
    grader: Graded | None,
    reward_from: str | None,
    failing_exit_codes: frozenset[int],
    timed_out: bool = False,
    timeout_seconds: float | None = None,
    sidecar_start_failed: bool = False,
) -> Verdict:
    """The verdict before the report. ``grader`` is None when the HarnessEnv has none
    (``reward_from`` is then None too) or when it did not run."""
    if sidecar_start_failed:
        message = "the sidecar failed before it served: the harness's first calls may have been refused unrecorded"
        return Verdict(exit_code, None, "", "failed", "SidecarFailed", message)
    if timed_out:
        after = f" ({timeout_seconds:g} s)" if timeout_seconds is not None else ""
        return Verdict(exit_code, None, "", "failed", "DeadlineExceeded", f"the harness ran past its timeout{after}")
    output = ""
    if reward_from is None:
        value: float | None = 1.0 if exit_code == 0 else 0.0
        why = ""
    elif grader is None or grader.error:
        value, why = None, f"the grader could not run: {grader.error if grader else 'no grader output'}"
    else:
        output = grader.stdout.strip()[-GRADER_OUTPUT_LIMIT:]
        if grader.timed_out:
            value, why = None, "the grader ran past its timeout"
        else:
            value, why = grading.reward(reward_from, stdout=grader.stdout, exit_code=grader.exit_code if grader.exit_code is not None else -1)
    if value is None:
        return Verdict(exit_code, None, output, "failed", "GraderFailed", why)
    if exit_code != 0 and exit_code in failing_exit_codes:
        return Verdict(exit_code, value, output, "failed", "", f"harness exited with {exit_code}")
    return Verdict(exit_code, value, output, "succeeded", "")


@dataclasses.dataclass(frozen=True, slots=True)
class Settled:
    """The verdict after the report, and whether the rollout's records are stored."""

    verdict: Verdict
    acknowledged: bool
    calls: int


def settle(verdict: Verdict, answer: Mapping[str, Any]) -> Settled:
    """The final verdict, from the sidecar's answer to the finish report."""
    acknowledged = bool(answer.get("acknowledged", False))
    refused = int((answer.get("exporter") or {}).get("refused", 0) or 0)
    calls = int(answer.get("calls", 0) or 0)
    if not acknowledged:
        why = answer.get("error") or {k: v for k, v in answer.items() if k != "acknowledged"}
        message = f"the collector did not acknowledge the rollout's records: {why}"
        return Settled(dataclasses.replace(verdict, status="failed", reason="SidecarFailed", message=message), False, calls)
    if refused:
        message = f"the collector refused {refused} of the rollout's records (the sidecar's log says why)"
        return Settled(dataclasses.replace(verdict, status="failed", reason="SidecarFailed", message=message), False, calls)
    return Settled(verdict, True, calls)
