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

Then, the report (:class:`Report`, the body of the sidecar's ``rollout/finish``, which
both runners send and the sidecar parses): records the collector did not acknowledge,
or acknowledged but refused to store (a collector token of another job), make the
attempt SidecarFailed.
"""

from __future__ import annotations

import dataclasses
import math
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

    def report(self, wait_seconds: float, *, retried: bool = False) -> Report:
        """What the sidecar is told: this verdict, whether the attempt is tried again, and
        how long to wait for the collector."""
        return Report(
            exit_code=self.exit_code,
            reward=self.reward,
            grader_output=self.grader_output,
            status=self.status,
            wait_seconds=wait_seconds,
            retried=retried,
        )


#: A report's ``status`` values (the ``finished`` record's), its exit code's range
#: (the record's int32), and at most an hour's wait for the collector's acknowledgement.
REPORT_STATUSES = ("succeeded", "failed", "timeout")
INT32 = (-(2**31), 2**31 - 1)
MAX_WAIT_SECONDS = 3600.0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """The body of the sidecar's ``/openforge/v1/rollout/finish``: the rollout's end."""

    exit_code: int = 0
    reward: float | None = None
    grader_output: str = ""
    status: str = "succeeded"
    wait_seconds: float = 0.0
    """How long the sidecar waits for the collector to acknowledge every record (0: not at all)."""
    retried: bool = False
    """The attempt failed and its sample is tried again as a new attempt (the failure
    policy's decision): never trained, its group waits for the new attempt."""

    def body(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def parse(cls, body: Any) -> Report:
        """A report from a request body, checked; ValueError naming the field at fault.

        Checked before anything is recorded: a body that cannot become a record (an
        exit code past int32, a reward that is no finite number) once made the sidecar
        raise, the request went on to the engine, and the rollout's later reports were
        acknowledged but never stored. ``status`` defaults by the exit code.
        """
        if not isinstance(body, dict):
            raise ValueError("body must be a JSON object")
        exit_code = body.get("exit_code", 0)
        if not _is_int(exit_code) or not INT32[0] <= exit_code <= INT32[1]:
            raise ValueError(f"exit_code must be a 32-bit integer, not {exit_code!r}")
        reward = body.get("reward")
        if reward is not None and not (_is_number(reward) and math.isfinite(reward)):
            raise ValueError(f"reward must be a finite number or null, not {reward!r}")
        grader = body.get("grader_output", "")
        if not isinstance(grader, str):
            raise ValueError("grader_output must be a string")
        status = body.get("status", "succeeded" if exit_code == 0 else "failed")
        if status not in REPORT_STATUSES:
            raise ValueError(f"status must be one of {', '.join(REPORT_STATUSES)}, not {status!r}")
        wait = body.get("wait_seconds", 0)
        if not _is_number(wait) or not 0 <= wait <= MAX_WAIT_SECONDS:
            raise ValueError(
                f"wait_seconds must be a number from 0 to {MAX_WAIT_SECONDS:g}, not {wait!r}"
            )
        retried = body.get("retried", False)
        if not isinstance(retried, bool):
            raise ValueError(f"retried must be true or false, not {retried!r}")
        if retried and status == "succeeded":
            raise ValueError("retried must be false for a succeeded attempt: it is not tried again")
        return cls(
            exit_code=exit_code,
            reward=None if reward is None else float(reward),
            grader_output=grader,
            status=str(status),
            wait_seconds=float(wait),
            retried=retried,
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


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
        message = (
            "the sidecar failed before it served: "
            "the harness's first calls may have been refused unrecorded"
        )
        return Verdict(exit_code, None, "", "failed", "SidecarFailed", message)
    if timed_out:
        after = f" ({timeout_seconds:g} s)" if timeout_seconds is not None else ""
        return Verdict(
            exit_code,
            None,
            "",
            "failed",
            "DeadlineExceeded",
            f"the harness ran past its timeout{after}",
        )
    output = ""
    if reward_from is None:
        value: float | None = 1.0 if exit_code == 0 else 0.0
        why = ""
    elif grader is None or grader.error:
        value, why = (
            None,
            f"the grader could not run: {grader.error if grader else 'no grader output'}",
        )
    else:
        output = grader.stdout.strip()[-GRADER_OUTPUT_LIMIT:]
        if grader.timed_out:
            value, why = None, "the grader ran past its timeout"
        else:
            value, why = grading.reward(
                reward_from,
                stdout=grader.stdout,
                exit_code=grader.exit_code if grader.exit_code is not None else -1,
            )
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
        return Settled(
            dataclasses.replace(verdict, status="failed", reason="SidecarFailed", message=message),
            False,
            calls,
        )
    if refused:
        message = (
            f"the collector refused {refused} of the rollout's records (the sidecar's log says why)"
        )
        return Settled(
            dataclasses.replace(verdict, status="failed", reason="SidecarFailed", message=message),
            False,
            calls,
        )
    return Settled(verdict, True, calls)
