"""Python memory of one call, as tracemalloc sees it: what it kept, and its peak."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Traced(Generic[T]):
    value: T
    kept: int  # bytes the call allocated and still held after it
    peak: int  # the most it held at once


def traced(call: Callable[[], T]) -> Traced[T]:
    """``call()``, traced from start to end (nothing before it counts)."""
    tracemalloc.start()
    try:
        value = call()
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return Traced(value, kept, peak)
