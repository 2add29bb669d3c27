"""The grader-output rule shared by ``openforge run`` and the operator's in-pod agent."""

from __future__ import annotations

import pytest
from openforge.api import grading


@pytest.mark.parametrize(
    ("stdout", "exit_code", "expected"),
    [
        ('log line\n{"reward": 0.75}\n', 0, 0.75),
        ('{"reward": 1}', 3, 1.0),  # JSON decides, not the exit code
        ('{"reward": 0.2}\nnot json\n', 0, 0.2),  # trailing non-JSON lines are skipped
        ('{"reward": 0.2}\n{"score": 1}', 0, None),  # the last JSON line decides
        ('{"reward": true}', 0, None),  # a bool is not a number
        ('{"reward": NaN}', 0, None),  # Python's JSON reads these; no reward can be one
        ('{"reward": Infinity}', 0, None),
        ('{"reward": -Infinity}', 0, None),
        ('{"reward": 1e999}', 0, None),  # overflows to inf
        ("[1, 2]", 0, None),
        ("nothing here", 2, None),
        ("", 0, None),
    ],
)
def test_stdout_json(stdout: str, exit_code: int, expected: float | None) -> None:
    value, why = grading.reward("stdout-json", stdout=stdout, exit_code=exit_code)
    assert value == expected
    assert (why == "") == (expected is not None)


def test_reasons_name_what_was_wrong() -> None:
    assert (
        "without a numeric 'reward'"
        in grading.reward("stdout-json", stdout='{"score": 1}', exit_code=0)[1]
    )
    assert "no JSON line (exit 2)" in grading.reward("stdout-json", stdout="boom", exit_code=2)[1]
    assert (
        "not a finite number (nan)"
        in grading.reward("stdout-json", stdout='{"reward": NaN}', exit_code=0)[1]
    )


def test_exit_code() -> None:
    assert grading.reward("exit-code", stdout='{"reward": 0.5}', exit_code=0) == (1.0, "")
    assert grading.reward("exit-code", stdout="", exit_code=7) == (0.0, "")
