"""Where a rollout's recording picks up on a spool that already holds some of it.

A sidecar restarted on its rollout's spool (a native sidecar container the
kubelet restarted, a sidecar process started again) and the drain
(:mod:`openforge_sidecar.recording.drain`) both read the spool and the
in-flight journal to learn what was recorded: the calls spooled, the calls
begun but never spooled (the journal names each call when it begins), the
loss reports already written, and whether the rollout was started and
finished.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from openforge_sidecar.recording import spool

INFLIGHT_JOURNAL = "inflight.journal"
"""The file beside the spool's segments where each call's index is written as it begins."""


@dataclass(slots=True)
class Resume:
    next_call: int = 0
    """The index the next call gets: after the highest one begun, so idempotency keys never
    collide."""
    next_lost: int = 0
    """The index the next loss report gets."""
    started: bool = False
    finished: bool = False
    vanished_calls: list[int] = field(default_factory=list)
    """Calls begun but neither spooled nor already reported lost."""
    calls: int = 0
    """Calls spooled."""
    job: str = ""
    rollout_id: str = ""
    """The rollout the spool's records are of ("" for an empty spool)."""


def resume(store: spool.Spool, journal: Path) -> Resume:
    """What ``store`` and its in-flight ``journal`` hold of their rollout."""
    found = Resume()
    spooled: set[int] = set()
    reported: set[int] = set()
    for record in store.records_after(0):
        found.job, found.rollout_id = found.job or record.job, found.rollout_id or record.rollout_id
        kind = record.WhichOneof("body")
        if kind == "call":
            spooled.add(record.call.call_index)
        elif kind == "lost":
            found.next_lost += 1
            if not record.lost.whole_rollout:
                reported.add(record.lost.call_index)
        elif kind == "started":
            found.started = True
        elif kind == "finished":
            found.finished = True
    begun = {int(line) for line in journal.read_text().split()} if journal.exists() else set()
    found.next_call = max(begun | spooled, default=-1) + 1
    found.vanished_calls = sorted(begun - spooled - reported)
    found.calls = len(spooled)
    return found
