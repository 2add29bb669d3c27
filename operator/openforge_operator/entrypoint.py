"""The harness container's entrypoint: run the harness, then the grader, then report.

A rollout pod runs the harness's own command under a short POSIX ``sh``
script (so the harness image needs ``/bin/sh``; nothing else of ours). The
script

0. with ``OPENFORGE_SIDECAR_WAIT`` set (a rollout pod), waits at most that many
   seconds for the sidecar's ``sidecar-ready`` in the run directory (created
   once it listens: the harness container starts beside the sidecar, not
   after it, and its start overlaps the sidecar's); if it never comes, writes
   a SidecarFailed termination message and exits with
   :data:`SIDECAR_NOT_READY_EXIT_CODE` without running the harness; the same
   exit, with the agent's verdict as the message, when the agent writes
   ``finished`` before ``sidecar-ready`` (the pod was never fenced);
1. runs the harness command unchanged and keeps its exit code (in the background,
   so that a TERM is passed on to it: as the container's PID 1, ``sh`` ignores
   one it has no trap for, and the pod's deletion would wait out the kubelet's
   whole grace period; a stopped harness exits the script with 143, ungraded and
   unreported: the sidecar records the rollout as stopped); like any background
   command of a non-interactive shell, its stdin is ``/dev/null``;
2. runs the grader, if the HarnessEnv has one, in the same container (the
   harness's filesystem and environment, ``OPENFORGE_HARNESS_EXIT_CODE`` set),
   under ``timeout`` when the image has it, its stdout and exit code to files;
3. writes ``harness-done`` into the run directory, an ``emptyDir`` it shares
   with the sidecar container, where the in-pod agent
   (:mod:`openforge_sidecar.podagent`; the files are :mod:`openforge.podrun`'s) turns those files
   into the reward, reports the rollout to the sidecar (``/openforge/v1/rollout/finish``) and
   waits for the collector's acknowledgement;
4. waits (at most ``OPENFORGE_FINISH_WAIT`` seconds) for the agent's verdict
   (``finished``, a small JSON object), copies it to the container's
   termination message, where the operator reads it from the pod status, and
   exits with the harness's exit code.

Waits look every 50 ms where ``sleep`` takes fractions of a second (GNU,
busybox), else every second. The harness and grader argv are passed as arguments, never spliced into
the script: ``sh -c SCRIPT openforge-rollout N GRADER... HARNESS...`` with ``N``
the grader's argument count. The script avoids ``$$`` and ``$(NAME)``, which
the kubelet would expand in a container's command.
"""

from __future__ import annotations

from collections.abc import Sequence

from openforge import podrun

ARGV0 = "openforge-rollout"
SIDECAR_NOT_READY_EXIT_CODE = podrun.SIDECAR_NOT_READY_EXIT_CODE

STOPPED_VERDICT = podrun.Termination(
    status="failed",
    exit_code=143,
    stopped=True,
    message="stopped by a TERM (the pod deleted, or past its deadline) before the rollout "
    "finished: not graded",
)
"""The verdict of a harness a TERM stopped (the pod deleted, or past its deadline)."""
NOT_LISTENING_VERDICT = podrun.Termination(
    status="failed",
    exit_code=SIDECAR_NOT_READY_EXIT_CODE,
    reason="SidecarFailed",
    calls=0,
    message="the capture sidecar did not listen within %s s: the harness never ran",
)
"""The verdict when the sidecar never listened (``%s``: the seconds waited, by ``printf``)."""

_TEMPLATE = r"""set -u
run="${OPENFORGE_RUN_DIR:-/openforge/run}"
termination="${OPENFORGE_TERMINATION_LOG:-/dev/termination-log}"
if sleep 0.01 2> /dev/null; then
  tick=0.05 ticks=20
else
  tick=1 ticks=1
fi
# A TERM (the pod deleted, or past its deadline) is passed on to the harness or the
# grader running; as the container's PID 1, sh would otherwise ignore it until the
# kubelet's SIGKILL at the end of the grace period. A stopped harness is not graded,
# and its verdict says it was stopped: once the kubelet has deleted the pod (a second
# deletion, with no grace), the pod's timestamps no longer tell.
stopped=0
child=
trap 'stopped=1; if [ -n "$child" ]; then kill -TERM "$child" 2> /dev/null; fi' TERM
stop() {
  printf @STOPPED_VERDICT@ > "$termination" 2> /dev/null
  exit 143
}
run_child() {
  "$@" &
  child=$!
  while :; do
    wait "$child"
    code=$?
    kill -0 "$child" 2> /dev/null || break
  done
  child=
}
grader_argc="$1"
shift
i=0
while [ "$i" -lt "$grader_argc" ]; do
  i=$((i + 1))
  eval "openforge_grader_$i=\"\$1\""
  shift
done
sidecar_wait="${OPENFORGE_SIDECAR_WAIT:-0}"
n=0
while [ "$sidecar_wait" -gt 0 ] && [ ! -e "$run/sidecar-ready" ]; do
  if [ "$stopped" = 1 ]; then
    stop
  fi
  if [ -e "$run/finished" ]; then
    cat "$run/finished" > "$termination" 2> /dev/null
    exit 125
  fi
  if [ "$n" -ge $((sidecar_wait * ticks)) ]; then
    printf @NOT_LISTENING_VERDICT@ "$sidecar_wait" > "$termination" 2> /dev/null
    exit 125
  fi
  sleep "$tick"
  n=$((n + 1))
done
run_child "$@"
if [ "$stopped" = 1 ]; then
  stop
fi
printf '%s\n' "$code" > "$run/harness-exit-code"
if [ "$grader_argc" -gt 0 ]; then
  set --
  if command -v timeout > /dev/null 2>&1; then
    set -- timeout "${OPENFORGE_GRADER_TIMEOUT:-300}"
  fi
  i=0
  while [ "$i" -lt "$grader_argc" ]; do
    i=$((i + 1))
    eval "set -- \"\$@\" \"\$openforge_grader_$i\""
  done
  harness_code="$code"
  OPENFORGE_HARNESS_EXIT_CODE="$harness_code"
  export OPENFORGE_HARNESS_EXIT_CODE
  run_child "$@" < /dev/null > "$run/grader-stdout" 2> "$run/grader-stderr"
  if [ "$stopped" = 1 ]; then
    stop
  fi
  printf '%s\n' "$code" > "$run/grader-exit-code"
  code="$harness_code"
fi
: > "$run/harness-done"
n=0
while [ ! -e "$run/finished" ] && [ "$stopped" = 0 ] && [ "$n" -lt $((${OPENFORGE_FINISH_WAIT:-90} * ticks)) ]; do
  sleep "$tick"
  n=$((n + 1))
done
if [ -e "$run/finished" ]; then
  cat "$run/finished" > "$termination" 2> /dev/null
fi
exit "$code"
"""  # noqa: E501 (a shell loop's condition)


def _printf_format(verdict: podrun.Termination) -> str:
    """``verdict`` as ``printf``'s format: one single-quoted shell word."""
    text = verdict.dumps()
    if "'" in text or "\\" in text or "%" in text.replace("%s", ""):
        raise ValueError(f"not a plain printf format: {text}")
    return f"'{text}'"


SCRIPT = _TEMPLATE.replace("@STOPPED_VERDICT@", _printf_format(STOPPED_VERDICT)).replace(
    "@NOT_LISTENING_VERDICT@", _printf_format(NOT_LISTENING_VERDICT)
)
COMMAND = ["/bin/sh", "-c", SCRIPT, ARGV0]


def arguments(harness: Sequence[str], grader: Sequence[str] | None) -> list[str]:
    """The container ``args`` after :data:`COMMAND` that run ``harness`` and then ``grader``."""
    if not harness:
        raise ValueError("the harness command is empty")
    grader = list(grader or [])
    return [str(len(grader)), *grader, *harness]
