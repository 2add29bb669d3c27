"""Rollout names, index <-> (task, sample), and compact index sets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from openforge.api import rollouts


def test_rollout_names_round_trip_even_when_the_job_name_has_dashes() -> None:
    name = rollouts.rollout_name("react-toy-2", 17, attempt=3)
    assert name == "react-toy-2-17-3"
    assert rollouts.parse_rollout_name(name) == ("react-toy-2", 17, 3)


@pytest.mark.parametrize("name", ["job", "job-1", "job-01-0", "job-1-x", "-1-0"])
def test_parse_rollout_name_rejects_what_rollout_name_never_makes(name: str) -> None:
    with pytest.raises(ValueError, match="not a rollout name"):
        rollouts.parse_rollout_name(name)


def test_rollout_name_rejects_negative_parts() -> None:
    with pytest.raises(ValueError, match="index=-1"):
        rollouts.rollout_name("job", -1, attempt=0)


def test_indexes_are_task_major_so_a_group_is_contiguous() -> None:
    assert [rollouts.task_and_sample(i, 3) for i in range(7)] == [
        (0, 0),
        (0, 1),
        (0, 2),
        (1, 0),
        (1, 1),
        (1, 2),
        (2, 0),
    ]
    assert rollouts.rollout_index(2, 1, samples_per_task=3) == 7
    assert rollouts.rollout_count(5, 4) == 20


@given(st.integers(0, 10_000), st.integers(1, 64))
def test_index_mapping_round_trips(index: int, group: int) -> None:
    task, sample = rollouts.task_and_sample(index, group)
    assert 0 <= sample < group
    assert rollouts.rollout_index(task, sample, samples_per_task=group) == index


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: rollouts.task_and_sample(3, 0), "samples_per_task must be >= 1"),
        (lambda: rollouts.rollout_index(0, 4, samples_per_task=4), "0 <= sample < 4"),
        (lambda: rollouts.task_and_sample(-1, 2), "must be >= 0"),
    ],
)
def test_index_mapping_rejects_out_of_range(call: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()  # type: ignore[operator]


def test_format_indexes_is_compact_and_sorted() -> None:
    assert rollouts.format_indexes([9, 1, 3, 4, 5, 4]) == "1,3-5,9"
    assert rollouts.format_indexes([]) == ""
    assert rollouts.format_indexes([0, 1]) == "0-1"


@given(st.sets(st.integers(0, 500)))
def test_compact_form_round_trips(indexes: set[int]) -> None:
    text = rollouts.format_indexes(indexes)
    assert rollouts.parse_indexes(text) == sorted(indexes)


def test_parse_ranges_does_not_expand() -> None:
    assert rollouts.parse_ranges("0-999999999999,1000000000000") == [
        (0, 999999999999),
        (1000000000000, 1000000000000),
    ]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("1,,2", "bad segment ''"),
        ("1, 2", "bad segment ' 2'"),
        ("a", "bad segment 'a'"),
        ("-1", "bad segment '-1'"),
        ("01", "bad segment '01'"),
        ("5-3", "must run from low to high"),
        ("3-3", "must run from low to high"),
        ("3,1", "does not ascend past 3"),
        ("1-4,3", "does not ascend past 4"),
        ("2,2", "does not ascend past 2"),
        (",", "bad segment"),
    ],
)
def test_parse_indexes_rejects_malformed_text(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        rollouts.parse_indexes(text)


def test_pod_names_are_cut_to_63_characters_with_a_hash_of_the_job() -> None:
    long_a, long_b = "a" * 60 + "-x", "a" * 60 + "-y"
    name_a, name_b = (
        rollouts.pod_name(long_a, 12345, attempt=2),
        rollouts.pod_name(long_b, 12345, attempt=2),
    )
    assert len(name_a) == 63 and len(name_b) == 63 and name_a != name_b
    assert name_a.endswith("-12345-2")
    assert rollouts.pod_name("short", 1, attempt=0) == "short-1-0"


@pytest.mark.parametrize(
    ("job", "name", "expected"),
    [
        ("a", "a-1-0", True),
        ("a", "a-1-0-0", False),  # job a-1's pod
        ("a-1", "a-1-0-0", True),
        ("a-1", "a-1-0", False),  # job a's pod
        ("a", "a-01-0", False),
        ("a", "b-1-0", False),
        ("a", "a-1", False),
        ("a", "a", False),
        ("a" * 62, rollouts.pod_name("a" * 62, 3, attempt=1), True),
        (
            "a" * 62,
            rollouts.rollout_name("a" * 62, 3, attempt=1),
            False,
        ),  # too long to be a pod name
        ("b" * 62, rollouts.pod_name("a" * 62, 3, attempt=1), False),
    ],
)
def test_is_pod_of_tells_a_jobs_pods_from_every_other_jobs(
    job: str, name: str, expected: bool
) -> None:
    assert rollouts.is_pod_of(job, name) is expected


_JOB = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")


@given(job=_JOB, other=_JOB, index=st.integers(0, 10**6), attempt=st.integers(0, 99))
def test_a_pod_name_belongs_to_its_job_only(job: str, other: str, index: int, attempt: int) -> None:
    name = rollouts.pod_name(job, index, attempt=attempt)
    assert len(name) <= rollouts.MAX_POD_NAME
    assert rollouts.is_pod_of(job, name)
    assert rollouts.is_pod_of(other, name) == (other == job)
