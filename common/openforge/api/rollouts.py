"""Rollout identity: names, indexes, and compact index sets.

A RolloutJob runs ``len(tasks) * samplesPerTask`` rollouts. Rollout ``index``
counts them task-major, so the samples of one task (one GRPO group) are
contiguous: index ``i`` is sample ``i % samplesPerTask`` of task
``i // samplesPerTask``. Each try of a rollout is an *attempt*, counted from 0,
and runs as the pod (or local process) ``<job>-<index>-<attempt>``; a
deterministic name lets a duplicate create fail with 409 instead of running a
rollout twice. In a cluster the name is a pod's, which holds 63 characters:
:func:`pod_name` cuts a long job name and adds a hash of it, and
:func:`is_pod_of` tells whether a name is one of a job's pods (the collector
checks a per-job token's records with it).

Index sets in status (``failedIndexes``) use the compact form of Kubernetes
Jobs' ``completedIndexes``: ascending, comma-separated, runs written as ranges,
e.g. ``"1,3-5,9"``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

_NAME = re.compile(r"^(?P<job>.+)-(?P<index>0|[1-9][0-9]*)-(?P<attempt>0|[1-9][0-9]*)$")
_SEGMENT = re.compile(r"^(0|[1-9][0-9]*)(?:-(0|[1-9][0-9]*))?$")

MAX_POD_NAME = 63
"""Pod names become host names, which hold 63 characters."""


def rollout_name(job: str, index: int, *, attempt: int) -> str:
    """The pod (or process) name of one attempt of one rollout."""
    if index < 0 or attempt < 0:
        raise ValueError(f"index and attempt must be >= 0 (got index={index}, attempt={attempt})")
    return f"{job}-{index}-{attempt}"


def pod_name(job: str, index: int, *, attempt: int) -> str:
    """``<job>-<index>-<attempt>``; a job part that would push it past 63 characters
    is cut and given a hash of the whole job name, so names stay distinct."""
    name = rollout_name(job, index, attempt=attempt)
    if len(name) <= MAX_POD_NAME:
        return name
    suffix = f"-{index}-{attempt}"
    digest = hashlib.sha256(job.encode()).hexdigest()[:8]
    keep = MAX_POD_NAME - len(suffix) - len(digest) - 1
    return f"{job[:keep].rstrip('-.')}-{digest}{suffix}"


def is_pod_of(job: str, name: str) -> bool:
    """Whether ``name`` is the pod of some attempt of some rollout of ``job``.

    Unambiguous between jobs: job ``a``'s pods end in exactly two numbers after
    ``a-``, so ``a-1-0-0`` (job ``a-1``) is never one of them.
    """
    match = _NAME.match(name)
    return (
        match is not None
        and pod_name(job, int(match["index"]), attempt=int(match["attempt"])) == name
    )


def parse_rollout_name(name: str) -> tuple[str, int, int]:
    """Split ``<job>-<index>-<attempt>`` back into its parts."""
    match = _NAME.match(name)
    if match is None:
        raise ValueError(f"{name!r} is not a rollout name (expected <job>-<index>-<attempt>)")
    return match["job"], int(match["index"]), int(match["attempt"])


def rollout_count(task_count: int, samples_per_task: int) -> int:
    """How many rollouts a job with these tasks and group size runs."""
    _check_group_size(samples_per_task)
    return task_count * samples_per_task


def rollout_index(task_index: int, sample: int, *, samples_per_task: int) -> int:
    """The rollout index of ``sample`` (0-based) of task ``task_index``."""
    _check_group_size(samples_per_task)
    if task_index < 0 or not 0 <= sample < samples_per_task:
        raise ValueError(
            f"need task_index >= 0 and 0 <= sample < {samples_per_task} "
            f"(got task_index={task_index}, sample={sample})"
        )
    return task_index * samples_per_task + sample


def task_and_sample(index: int, samples_per_task: int) -> tuple[int, int]:
    """The (task index, sample) a rollout index stands for."""
    _check_group_size(samples_per_task)
    if index < 0:
        raise ValueError(f"rollout index must be >= 0 (got {index})")
    return divmod(index, samples_per_task)


def format_indexes(indexes: Iterable[int]) -> str:
    """Write a set of indexes compactly: ``[9, 1, 3, 4, 5]`` -> ``"1,3-5,9"``."""
    ordered = sorted(set(indexes))
    if ordered and ordered[0] < 0:
        raise ValueError(f"indexes must be >= 0 (got {ordered[0]})")
    segments: list[str] = []
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        low, high = ordered[start], ordered[end]
        segments.append(str(low) if low == high else f"{low}-{high}")
        start = end + 1
    return ",".join(segments)


def parse_indexes(text: str) -> list[int]:
    """Read the compact form back into ascending indexes; ``""`` is the empty set."""
    return [index for low, high in parse_ranges(text) for index in range(low, high + 1)]


def parse_ranges(text: str) -> list[tuple[int, int]]:
    """Read the compact form into inclusive ``(low, high)`` runs, without expanding them.

    Segments must ascend without overlapping and a range must run low to high,
    so a hand-edited status cannot smuggle in duplicates; checking a status
    this way costs nothing even when it names a range of millions.
    """
    if text == "":
        return []
    ranges: list[tuple[int, int]] = []
    for segment in text.split(","):
        match = _SEGMENT.match(segment)
        if match is None:
            raise ValueError(
                f"bad segment {segment!r} in {text!r} (expected N or N-M, e.g. '1,3-5,9')"
            )
        low = int(match[1])
        high = low if match[2] is None else int(match[2])
        if match[2] is not None and high <= low:
            raise ValueError(f"range {segment!r} in {text!r} must run from low to high")
        if ranges and low <= ranges[-1][1]:
            raise ValueError(
                f"segment {segment!r} in {text!r} does not ascend past {ranges[-1][1]}"
            )
        ranges.append((low, high))
    return ranges


def _check_group_size(samples_per_task: int) -> None:
    if samples_per_task < 1:
        raise ValueError(f"samples_per_task must be >= 1 (got {samples_per_task})")
