"""The files a rollout pod's two containers exchange in their shared run directory.

The harness container's entrypoint (``openforge_operator.entrypoint``, a ``sh``
script the operator puts in the pod) and the in-pod agent in the sidecar
container (``openforge_sidecar.podagent``) share an ``emptyDir`` mounted at
:data:`RUN_DIR`. The agent creates :data:`SIDECAR_READY` once the sidecar's
socket is bound (the harness may start) and :data:`SIDECAR_SERVING` once it
serves, or :data:`SIDECAR_START_FAILED`; the entrypoint writes the harness's
and the grader's results and then :data:`HARNESS_DONE`; the agent answers
with :data:`FINISHED`, the verdict the entrypoint copies into its termination
message (:class:`Termination`, which the operator reads back from the pod status).
The operator builds the pod around these names; this module is their one spelling
(``tests/operator/test_entrypoint.py`` holds the script to it), and
:class:`Termination` the one spelling of the verdict's fields, whoever writes it
(the agent, or the entrypoint when the agent could not).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

RUN_DIR = "/openforge/run"
HARNESS_DONE = "harness-done"
HARNESS_EXIT_CODE = "harness-exit-code"
GRADER_STDOUT = "grader-stdout"
GRADER_STDERR = "grader-stderr"
GRADER_EXIT_CODE = "grader-exit-code"
FINISHED = "finished"
SIDECAR_READY = "sidecar-ready"
SIDECAR_SERVING = "sidecar-serving"
SIDECAR_START_FAILED = "sidecar-start-failed"
SIDECAR_NOT_READY_EXIT_CODE = 125
"""The harness container's exit code when the sidecar never listened (the harness never ran)."""

#: Every file of the run directory, by the name above.
FILES = (
    HARNESS_DONE, HARNESS_EXIT_CODE, GRADER_STDOUT, GRADER_STDERR, GRADER_EXIT_CODE,
    FINISHED, SIDECAR_READY, SIDECAR_SERVING, SIDECAR_START_FAILED,
)  # fmt: skip


MESSAGE_LIMIT = 1000
"""Characters of a verdict's message kept: the kubelet keeps 4096 bytes of a termination
message, and the operator 500 characters of it."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Termination:
    """An attempt's verdict as the harness container's termination message carries it
    (``{"exitCode": 0, "status": "succeeded", ...}``, compact JSON).

    ``status`` and ``exit_code`` always; ``reason`` is a FailureReason name, or empty
    (success, or a failing exit code); ``calls``, the records the collector stored,
    when the sidecar answered; ``stopped``, when a TERM stopped the harness before the
    rollout finished (the entrypoint's own verdict: nothing graded or reported)."""

    status: Literal["succeeded", "failed"]
    exit_code: int | None
    reason: str | None = None
    reward: float | None = None
    acknowledged: bool = False
    calls: int | None = None
    stopped: bool = False
    message: str = ""

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "exitCode": self.exit_code,
            "status": self.status,
            "reason": self.reason,
            "reward": self.reward,
            "acknowledged": self.acknowledged,
        }
        if self.calls is not None:
            body["calls"] = self.calls
        if self.stopped:
            body["stopped"] = True
        body["message"] = self.message[:MESSAGE_LIMIT]
        return body

    def dumps(self) -> str:
        return json.dumps(self.body(), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def parse(cls, text: Any) -> Termination | None:
        """The verdict a termination message holds; None when it holds none (a harness's
        own message, or the kubelet's log tail). Lenient past ``status``: a field of the
        wrong type is left unset, never trusted."""
        if not isinstance(text, str) or not text.startswith("{"):
            return None
        try:
            body = json.loads(text)
        except ValueError:
            return None
        if not isinstance(body, dict) or body.get("status") not in ("succeeded", "failed"):
            return None
        code, reward, calls = body.get("exitCode"), body.get("reward"), body.get("calls")
        reason, message = body.get("reason"), body.get("message")
        return cls(
            status=body["status"],
            exit_code=code if _is_int(code) else None,
            reason=reason if isinstance(reason, str) else None,
            reward=_number(reward),
            acknowledged=body.get("acknowledged") is True,
            calls=calls if _is_int(calls) else None,
            stopped=body.get("stopped") is True,
            message=message if isinstance(message, str) else "",
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
