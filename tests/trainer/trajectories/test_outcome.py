from __future__ import annotations

import call_outcomes
import pytest
from openforge.trajectory.v1 import trajectory_pb2
from openforge_trainer.collection import store
from openforge_trainer.trajectories import outcome


def stored(call: trajectory_pb2.ModelCall) -> store.ModelCall:
    return store.ModelCall.from_record(
        trajectory_pb2.Record(idempotency_key="r/call/0", rollout_id="r", call=call)
    )


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (call_outcomes.completed(0, [1], [2]), "completed"),
        (call_outcomes.disconnected(0, [1], [2, 3]), "aborted"),
        (call_outcomes.refused(0, [1]), "refused"),
        (call_outcomes.refused(0, [1], status=413), "refused"),
        # the engine's stream ended before its finish_reason: delivered, but cut
        (trajectory_pb2.ModelCall(http_status=200, finish_reason="error"), "aborted"),
        (trajectory_pb2.ModelCall(http_status=200, finish_reason="stop", error="x"), "aborted"),
        (trajectory_pb2.ModelCall(http_status=502, finish_reason="error", error="x"), "errored"),
        (trajectory_pb2.ModelCall(http_status=503, error="tokenizer unavailable"), "errored"),
        (trajectory_pb2.ModelCall(finish_reason="stop"), "errored"),  # no status recorded
    ],
)
def test_outcome_of_a_call(call: trajectory_pb2.ModelCall, expected: str) -> None:
    assert outcome.outcome(stored(call)) == expected
    assert outcome.completed(stored(call)) == (expected == "completed")


def test_describe_names_the_failures_by_kind() -> None:
    assert outcome.describe({"aborted": 1, "errored": 0, "refused": 2}) == "1 aborted, 2 refused"
    assert outcome.describe({"aborted": 0, "errored": 0, "refused": 0}) == ""
    assert outcome.FAILURES == ("aborted", "errored", "refused")
    assert outcome.not_trained({"errored": 3}) == " (failed calls not trained: 3 errored)"
    assert outcome.not_trained({"aborted": 0}) == ""
