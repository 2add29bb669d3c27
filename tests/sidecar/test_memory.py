"""The C allocator's calls: freed memory handed back to the OS."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
from openforge_sidecar import memory


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS"))
    return int(line.split()[1]) / 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_freed_memory_goes_back_to_the_os() -> None:
    """What a tokenizer's parse frees, glibc keeps resident until trimmed."""
    try:
        ctypes.CDLL(None).malloc_trim  # noqa: B018
    except AttributeError:
        pytest.skip("no glibc malloc_trim here")
    held = [bytes(1000) for _ in range(60_000)]  # ~60 MB in the C heap, below mmap size
    pin = bytes(1000)  # allocated after them: the heap cannot shrink from its top
    del held
    before = _rss_mb()
    memory.return_freed_memory()
    assert before - _rss_mb() > 20, "nothing was returned"
    del pin
