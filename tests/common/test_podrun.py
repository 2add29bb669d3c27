"""The verdict a rollout pod's termination message carries: one spelling, read back as written."""

from __future__ import annotations

import json

import pytest
from openforge import podrun


def test_a_verdict_reads_back_as_it_was_written() -> None:
    for written in (
        podrun.Termination(status="succeeded", exit_code=3, reason="", reward=0.5,
                           acknowledged=True, calls=4, message="harness exited with 3"),
        podrun.Termination(status="failed", exit_code=143, stopped=True, message="stopped"),
        podrun.Termination(status="failed", exit_code=125, reason="SidecarFailed", calls=0),
    ):  # fmt: skip
        assert podrun.Termination.parse(written.dumps()) == written


def test_the_message_is_cut_and_stays_utf8() -> None:
    verdict = podrun.Termination(status="failed", exit_code=1, message="é" * 5000)
    text = verdict.dumps()
    assert json.loads(text)["message"] == "é" * podrun.MESSAGE_LIMIT
    assert "é" in text  # not escaped: the kubelet keeps 4096 bytes, not characters


@pytest.mark.parametrize(
    "text",
    [None, 3, "", "panic: oops", "{not json", "[]", '{"status": "done"}', '{"exitCode": 0}'],
)
def test_a_message_that_is_no_verdict_is_none(text: object) -> None:
    assert podrun.Termination.parse(text) is None


def test_fields_of_the_wrong_type_are_left_unset() -> None:
    body = {"status": "failed", "exitCode": True, "reward": "1.0", "acknowledged": "yes",
            "calls": 2.5, "reason": 7, "message": ["x"], "stopped": 1}  # fmt: skip
    assert podrun.Termination.parse(json.dumps(body)) == podrun.Termination(
        status="failed", exit_code=None
    )
