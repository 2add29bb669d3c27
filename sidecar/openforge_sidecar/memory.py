"""The C allocator: large buffers in mappings of their own, freed memory handed back.

A large call's buffers (its body, prompt, IDs, record) are freed when it ends, but
glibc keeps what was freed in its heap, resident, for reuse: the sidecar's resident
size would then creep up by a call's worth and stay. These two calls (glibc's; on
another C library they do nothing) keep it near what is live.
"""

from __future__ import annotations

import ctypes
import threading

#: A request body, a prompt's text (in characters) or a record over this size is a large
#: call's: its body waits in a file, its prompt is rendered and encoded a piece at a time,
#: and freed memory is handed back around each step (its record goes out in parts too,
#: over ``channel.PART_BYTES``, the same size). Below it, that care costs more than it
#: saves; with 1 MiB here, a 1 MB call peaked at 6-10 times its size over idle, with
#: 256 KiB at 3.5-4.4 times (``bench/large_requests.py``, docs/benchmarks.md).
LARGE_BYTES = 256 * 1024

_trimming = threading.Lock()


def return_freed_memory() -> None:
    """Hand memory freed by the C allocator back to the OS (glibc's ``malloc_trim``).

    Loading a real policy tokenizer allocates about twice what it keeps: for a
    150k-token vocabulary ~104 MB more resident while parsing, of which glibc
    keeps ~56 MB for reuse after the parse, resident, until trimmed. Without
    glibc (musl) there is nothing to call and nothing is done.

    A call while another thread trims returns at once: that trim hands back what
    was freed, and glibc holds each heap's lock while it trims, so a second trim
    would only make the threads allocating in it wait longer.
    """
    if not _trimming.acquire(blocking=False):
        return
    try:
        try:
            trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):
            return
        trim(0)
    finally:
        _trimming.release()


#: glibc's ``mallopt`` parameter for the size from which an allocation is its own mapping.
_M_MMAP_THRESHOLD = -3
#: Buffers at least this large get mappings of their own, given back to the OS when freed.
MMAP_THRESHOLD_BYTES = 256 * 1024


def map_large_buffers() -> None:
    """Keep large buffers out of the C heap, so that freeing one gives its memory back.

    glibc maps a buffer over 128 KB apart and unmaps it when freed, but raises
    that threshold to the size of every mapped buffer freed (up to 32 MB): after
    one large call, the next large call's buffers (bodies, rendered prompts, token
    arrays) come from the heap, where what is freed stays resident, fragmented,
    beyond what ``malloc_trim`` gives back (some 50 MB after a 10 MB call). Fixing
    the threshold stops that. Without glibc nothing is done.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
