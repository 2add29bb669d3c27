"""The files a rollout pod's two containers exchange in their shared run directory.

The harness container's entrypoint (``openforge_operator.entrypoint``, a ``sh``
script the operator puts in the pod) and the in-pod agent in the sidecar
container (``openforge_sidecar.podagent``) share an ``emptyDir`` mounted at
:data:`RUN_DIR`. The agent creates :data:`SIDECAR_READY` once the sidecar's
socket is bound (the harness may start) and :data:`SIDECAR_SERVING` once it
serves, or :data:`SIDECAR_START_FAILED`; the entrypoint writes the harness's
and the grader's results and then :data:`HARNESS_DONE`; the agent answers
with :data:`FINISHED`, the verdict the entrypoint copies into its termination
message. The operator builds the pod around these names; this module is
their one spelling (``tests/operator/test_entrypoint.py`` holds the script to it).
"""

from __future__ import annotations

RUN_DIR = "/openforge/run"
HARNESS_DONE = "harness-done"
HARNESS_EXIT_CODE = "harness-exit-code"
GRADER_STDOUT = "grader-stdout"
GRADER_STDERR = "grader-stderr"
GRADER_EXIT_CODE = "grader-exit-code"
FINISHED = "finished"
SIDECAR_READY = "sidecar-ready"
SIDECAR_SERVING = "sidecar-serving"
SIDECAR_START_FAILED = "sidecar-start-failed"
SIDECAR_NOT_READY_EXIT_CODE = 125
"""The harness container's exit code when the sidecar never listened (the harness never ran)."""

#: Every file of the run directory, by the name above.
FILES = (
    HARNESS_DONE, HARNESS_EXIT_CODE, GRADER_STDOUT, GRADER_STDERR, GRADER_EXIT_CODE,
    FINISHED, SIDECAR_READY, SIDECAR_SERVING, SIDECAR_START_FAILED,
)  # fmt: skip
