"""The C allocator's calls: freed memory handed back to the OS."""

from __future__ import annotations

import ctypes
import threading
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


def test_a_trim_while_another_thread_trims_returns_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """glibc holds a heap's lock while it trims it: a second trim would only make the
    threads allocating there wait twice as long, for nothing more handed back."""
    started, release = threading.Event(), threading.Event()
    calls: list[int] = []

    class Libc:
        def malloc_trim(self, pad: int) -> int:
            calls.append(pad)
            started.set()
            release.wait(10)
            return 1

    monkeypatch.setattr(memory.ctypes, "CDLL", lambda name: Libc())
    first = threading.Thread(target=memory.return_freed_memory)
    first.start()
    assert started.wait(10)
    memory.return_freed_memory()  # returns at once, without a trim of its own
    assert calls == [0]
    release.set()
    first.join(10)
    memory.return_freed_memory()  # the first is done: this one trims
    assert calls == [0, 0]
