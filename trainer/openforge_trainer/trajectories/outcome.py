"""How a stored model call ended: the rule for which calls may become training data.

A call is *completed* when the harness received the whole answer the engine
sampled: HTTP 200, no ``error``, and a ``finish_reason`` other than "error"
(the sidecar writes "error" whenever a call ends in one). Only completed
calls are training data. :func:`openforge_trainer.trajectories.export.segments`
applies this rule, and everything that trains or exports takes its rows from
there: ``openforge trajectories export``, ``openforge train`` and veRL's
agent loop. The other calls stay in the store, for ``trajectories show``, and
are counted by kind:

* ``aborted``: HTTP 200 but an error: the answer had begun and did not end
  as sampled and recorded: the harness hung up mid-stream, the engine's
  stream was cut, or the capture of it failed. Its tokens, if any, are partial.
* ``refused``: HTTP 4xx: the request was turned away (the sidecar could not
  read it, or the engine refused it); nothing was sampled for it.
* ``errored``: any other status: the sidecar or the engine failed to answer
  (5xx), or no status was recorded (0).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

from openforge_trainer.collection import store as store_module

Outcome = Literal["completed", "aborted", "errored", "refused"]

COMPLETED: Final = "completed"
ABORTED: Final = "aborted"
ERRORED: Final = "errored"
REFUSED: Final = "refused"
FAILURES: Final = (ABORTED, ERRORED, REFUSED)
"""The kinds of calls that are never trained, in the order they are reported."""


def outcome(call: store_module.ModelCall) -> Outcome:
    if call.http_status == 200:
        return COMPLETED if not call.error and call.finish_reason != "error" else ABORTED
    if 400 <= call.http_status < 500:
        return REFUSED
    return ERRORED


def completed(call: store_module.ModelCall) -> bool:
    """Whether ``call`` may be trained on (see the module docstring)."""
    return outcome(call) == COMPLETED


def describe(failures: Mapping[str, int]) -> str:
    """``"1 aborted, 2 refused"``: the kinds counted, in :data:`FAILURES` order ("" when none)."""
    return ", ".join(f"{failures[kind]} {kind}" for kind in FAILURES if failures.get(kind))


def not_trained(failures: Mapping[str, int]) -> str:
    """``" (failed calls not trained: 1 aborted, 2 refused)"``, or "" when none failed: what
    a reason for having no rows adds."""
    described = describe(failures)
    return f" (failed calls not trained: {described})" if described else ""
