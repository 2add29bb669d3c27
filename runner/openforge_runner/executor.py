"""One rollout, start to finish: sidecar up, harness, grader, finish record, sidecar down.

The rollout's files live under ``<run dir>/rollouts/<rollout id>/``: ``work/``
is the harness's working directory (and nothing else is in it), ``spool/``
the sidecar's durable spool, ``*.log`` the processes' output, and
``sidecar.json`` what the sidecar counted (its answer to the rollout's
finish: calls, merge rate, requests passed or answered without the policy).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openforge import control, endpoints, trajectory
from openforge.api import retries, verdict

from openforge_runner import plan, processes

Status = verdict.Status
FINISH_WAIT_SECONDS = 60
SIDECAR_FLUSH_SECONDS = 30
"""How long a stopped sidecar waits for the collector's acknowledgements."""
SIDECAR_STOP_SECONDS = SIDECAR_FLUSH_SECONDS + 15
"""How long the runner waits for a stopped sidecar before it kills it: past its flush."""
DRAIN_SECONDS = 10.0
"""How long the drain after a rollout waits for the collector (what is left waits for the next)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    rollout: plan.Rollout
    status: Status
    exit_code: int
    reward: float | None
    reason: str  # a FailureReason name or "" when it succeeded
    message: str
    calls: int
    seconds: float
    retried: bool = False
    """Its finish was reported to its sidecar as tried again: the store, and so the
    trainer, wait for the sample's next attempt, which the runner must then start."""


@dataclass(frozen=True, slots=True)
class Endpoints:
    engine: str  # inference server base URL
    collector: str  # host:port
    policy_version: int
    tokenizer: str = ""  # the policy's tokenizer directory ("": the engine serves its files)


INTERRUPTED = "Interrupted"
CONTROL_TOKEN = control.FILENAME
"""The sidecar's control token, beside its spool: only the runner reports the rollout."""


def _started(bundle: plan.Bundle, rollout: plan.Rollout, *, endpoints: Endpoints) -> dict[str, Any]:
    """The attempt's start as its sidecar records it (``openforge drain --started``)."""
    return {
        "job": bundle.name,
        "rollout_id": rollout.rollout_id,
        "task_id": rollout.task_id,
        "sample_index": rollout.sample,
        "attempt": rollout.attempt,
        "harness": bundle.env.metadata.name or "",
        "policy_version": endpoints.policy_version,
        "labels": {trajectory.BATCH_LABEL: plan.batch_label(bundle, rollout.iteration)},
    }


def sidecar_args(
    bundle: plan.Bundle, rollout: plan.Rollout, *, endpoints: Endpoints, home: Path, port: int
) -> list[str]:
    """The ``openforge`` arguments of one attempt's sidecar, listening on ``port`` and
    keeping its spool and control token in ``home``."""
    start = _started(bundle, rollout, endpoints=endpoints)
    return [
        "sidecar",
        "--listen",
        f"127.0.0.1:{port}",
        "--engine",
        endpoints.engine,
        "--spool",
        str(home / "spool"),
        "--collector",
        endpoints.collector,
        "--job",
        start["job"],
        "--rollout-id",
        start["rollout_id"],
        "--task-id",
        start["task_id"],
        "--sample-index",
        str(start["sample_index"]),
        "--attempt",
        str(start["attempt"]),
        "--harness",
        start["harness"],
        "--api",
        bundle.env.spec.api,
        "--policy-version",
        str(start["policy_version"]),
        "--control-token-file",
        str(home / CONTROL_TOKEN),
        "--flush-timeout",
        str(SIDECAR_FLUSH_SECONDS),
        "--finish-on-stop",
        *(arg for key, value in start["labels"].items() for arg in ("--label", f"{key}={value}")),
        *(["--tokenizer", endpoints.tokenizer] if endpoints.tokenizer else []),
    ]


def run_rollout(
    bundle: plan.Bundle,
    rollout: plan.Rollout,
    *,
    run_dir: Path,
    endpoints: Endpoints,
    stop: threading.Event,
    tried_again: Callable[[retries.Tried], bool] = lambda tried: True,
) -> Outcome:
    """Run one attempt. When ``stop`` is set the harness is killed and the
    outcome's reason is :data:`INTERRUPTED` (the runner does not count it).
    ``tried_again`` says whether an attempt that ended so is tried again: an attempt
    its sidecar never finished is closed in the store as ``stopped`` if so (a trainer
    waits for its sample's next attempt), else as ``failed``."""
    started = time.monotonic()
    home = run_dir / "rollouts" / rollout.rollout_id
    workdir = home / "work"
    workdir.mkdir(parents=True, exist_ok=True)
    port = processes.free_port()
    sidecar = processes.Service(
        "sidecar",
        processes.openforge(
            *sidecar_args(bundle, rollout, endpoints=endpoints, home=home, port=port)
        ),
        home / "sidecar.log",
        port=port,
    )
    try:
        sidecar.start(timeout=60)
    except processes.ServiceError as exc:
        # record the attempt all the same, closed: a trainer waits for each sample's
        # newest attempt, and an earlier one's finish may have said this one would come
        failed = verdict.Verdict(-1, None, "", "failed", "SidecarFailed", str(exc))
        drained = drain(
            [home / "spool"],
            collector=endpoints.collector,
            reason=f"its sidecar did not start: {exc}",
            status=_closed_as(rollout, failed, tried_again=tried_again),
            started=_started(bundle, rollout, endpoints=endpoints),
        )
        return Outcome(
            rollout, "failed", -1, None, "SidecarFailed", f"{exc}; {drained.summary()}", 0,
            time.monotonic() - started,
        )  # fmt: skip
    died: int | None = None
    try:
        judged = attempt(bundle, rollout, sidecar_url=sidecar.url, home=home, stop=stop)
        if judged is None:
            return Outcome(
                rollout, "failed", -1, None, INTERRUPTED, "stopped", 0, time.monotonic() - started
            )
        died = None if sidecar.alive() else sidecar.stop()
        retried = _is_tried_again(rollout, judged, tried_again=tried_again)
        finish = (
            _finish(sidecar.url, home / CONTROL_TOKEN, judged=judged, retried=retried)
            if died is None
            else {"acknowledged": False}
        )
        (home / "sidecar.json").write_text(json.dumps(finish, indent=2) + "\n")
    finally:
        sidecar.stop(timeout=SIDECAR_STOP_SECONDS)
    final = verdict.settle(judged, finish).verdict
    if died is not None:
        # the sidecar is gone: deliver what its spool holds, and close the attempt it never finished
        reason = f"its sidecar exited with {died} before the rollout was finished"
        final = dataclasses.replace(final, status="failed", reason="SidecarFailed")
        drained = drain(
            [home / "spool"],
            collector=endpoints.collector,
            reason=reason,
            status=_closed_as(rollout, final, tried_again=tried_again),
        )
        final = dataclasses.replace(final, message=f"{reason}; {drained.summary()}")
    elif not finish.get("acknowledged"):
        drained = drain(
            [home / "spool"],
            collector=endpoints.collector,
            reason="its sidecar stopped with the rollout unfinished",
            status=_closed_as(rollout, final, tried_again=tried_again),
        )
        if "error" not in finish and drained.spools and not drained.kept and not drained.error:
            # the sidecar recorded the finish, and every record reached the store after all
            final = judged
        else:
            final = dataclasses.replace(final, message=f"{final.message}; {drained.summary()}")
    return Outcome(
        rollout,
        final.status,
        final.exit_code,
        final.reward,
        final.reason,
        final.message,
        int(finish.get("calls", 0) or 0),
        time.monotonic() - started,
        retried=died is None and retried,
    )


@dataclass(frozen=True, slots=True)
class Drained:
    """What ``openforge drain`` did to some spools."""

    spools: int = 0
    delivered: int = 0
    """Records the collector acknowledged."""
    closed: int = 0
    """Attempts recorded lost and failed, as their sidecars never finished them."""
    kept: int = 0
    """Records still unacknowledged (kept in their spools for the next drain)."""
    error: str = ""

    def summary(self) -> str:
        text = f"drained its spool: {self.delivered} records delivered"
        if self.closed:
            text += ", the attempt recorded lost and failed"
        if self.kept:
            text += f", {self.kept} kept unacknowledged in the spool ({self.error})"
        return text


def _closed_as(
    rollout: plan.Rollout, final: verdict.Verdict, *, tried_again: Callable[[retries.Tried], bool]
) -> str:
    """The status an attempt its sidecar never finished is closed with in the store:
    ``stopped`` when it is tried again, else ``failed`` (its sample is done)."""
    return (
        trajectory.STOPPED if _is_tried_again(rollout, final, tried_again=tried_again) else "failed"
    )


def _is_tried_again(
    rollout: plan.Rollout, ended: verdict.Verdict, *, tried_again: Callable[[retries.Tried], bool]
) -> bool:
    """Whether the failure policy tries ``rollout``'s sample again after this attempt
    ended so (never after a success)."""
    if ended.status == "succeeded":
        return False
    return tried_again(retries.Tried(rollout.attempt, False, ended.exit_code, ended.reason or None))


def drain(
    spools: list[Path],
    *,
    collector: str,
    reason: str,
    timeout: float = DRAIN_SECONDS,
    status: str = trajectory.STOPPED,
    started: dict[str, Any] | None = None,
) -> Drained:
    """Run ``openforge drain --close`` over stopped sidecars' spools: deliver their records,
    close their rollouts if never finished (as ``status``: ``stopped`` when they are tried
    again, ``failed`` when not); with ``started``, the one spool's rollout is recorded as
    started first if it was not (the spool is made if missing). Never raises: what it
    could not do is counted."""
    present = [str(s) for s in spools if s.is_dir() or started is not None]
    if not present:
        return Drained()
    argv = processes.openforge(
        "drain",
        *present,
        "--collector",
        collector,
        "--close",
        "--reason",
        reason,
        "--status",
        status,
        "--timeout",
        str(timeout),
        *(["--started", json.dumps(started)] if started is not None else []),
    )
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=60 + timeout * len(present), check=False
        )
    except subprocess.TimeoutExpired:
        return Drained(len(present), error="openforge drain did not finish")
    reports = []
    for line in done.stdout.splitlines():
        try:
            reports.append(json.loads(line))
        except ValueError:
            continue
    if not reports and done.returncode:
        last = done.stderr.strip().splitlines()
        return Drained(
            len(present),
            error=last[-1] if last else f"openforge drain exited with {done.returncode}",
        )
    return Drained(
        spools=len(reports),
        delivered=sum(int(r["unacked_before"]) - int(r["unacked"]) for r in reports),
        closed=sum(bool(r["closed"]) for r in reports),
        kept=sum(int(r["unacked"]) for r in reports),
        error="; ".join(sorted({str(r["error"]) for r in reports if r["unacked"] and r["error"]})),
    )


def attempt(
    bundle: plan.Bundle,
    rollout: plan.Rollout,
    *,
    sidecar_url: str,
    home: Path,
    stop: threading.Event,
) -> verdict.Verdict | None:
    """Run the harness, then (unless it ran past its timeout) the grader, in ``home/work``,
    and judge them (``verdict.judge``, as the in-pod agent does); None when ``stop`` cut it off."""
    workdir = home / "work"
    exit_code, timed_out = _run_harness(
        bundle,
        rollout,
        sidecar_url=sidecar_url,
        workdir=workdir,
        log=home / "harness.log",
        stop=stop,
    )
    if stop.is_set():
        return None
    grader = bundle.env.spec.grader
    graded = (
        None
        if timed_out
        else _grade(
            bundle,
            rollout,
            sidecar_url=sidecar_url,
            workdir=workdir,
            exit_code=exit_code,
            log=home / "grader.log",
        )
    )
    return verdict.judge(
        exit_code=exit_code, grader=graded,
        reward_from=grader.reward_from if grader is not None else None,
        failing_exit_codes=retries.failing_exit_codes(bundle.job.spec), timed_out=timed_out,
        timeout_seconds=_harness_timeout(bundle),
    )  # fmt: skip


def _harness_timeout(bundle: plan.Bundle) -> float:
    return bundle.job.spec.rollout_timeout_seconds or bundle.env.spec.timeout_seconds or 600


def _run_harness(
    bundle: plan.Bundle,
    rollout: plan.Rollout,
    *,
    sidecar_url: str,
    workdir: Path,
    log: Path,
    stop: threading.Event,
) -> tuple[int, bool]:
    command = plan.harness_command(bundle, rollout, sidecar_url=sidecar_url, workdir=workdir)
    for path, content in command.files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    command.cwd.mkdir(parents=True, exist_ok=True)
    timeout = _harness_timeout(bundle)
    with log.open("ab") as handle:
        try:
            process = subprocess.Popen(
                processes.tethered(
                    command.argv
                ),  # a runner killed outright takes its harnesses too
                cwd=command.cwd,
                env={**os.environ, **command.env},
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            handle.write(f"openforge run: cannot start {command.argv[0]!r}: {exc}\n".encode())
            return 127, False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not stop.is_set():
            try:
                return retries.exit_code(process.wait(0.25)), False
            except subprocess.TimeoutExpired:
                continue
        os.killpg(process.pid, signal.SIGKILL)
        return retries.exit_code(process.wait()), not stop.is_set()


def _grade(
    bundle: plan.Bundle,
    rollout: plan.Rollout,
    *,
    sidecar_url: str,
    workdir: Path,
    exit_code: int,
    log: Path,
) -> verdict.Graded | None:
    """Run the grader (None without one) under its timeout."""
    command = plan.grader_command(
        bundle, rollout, sidecar_url=sidecar_url, workdir=workdir, harness_exit=exit_code
    )
    grader = bundle.env.spec.grader
    if command is None or grader is None:
        return None
    try:
        done = subprocess.run(
            command.argv, cwd=command.cwd, env={**os.environ, **command.env},
            stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=grader.timeout_seconds,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        stdout = (
            exc.stdout.decode(errors="replace")
            if isinstance(exc.stdout, bytes)
            else (exc.stdout or "")
        )
        log.write_text(f"{stdout}\nopenforge run: {exc}\n")
        return verdict.Graded(stdout=stdout, timed_out=True)
    except OSError as exc:
        log.write_text(f"openforge run: {exc}\n")
        return verdict.Graded(error=str(exc))
    log.write_text(done.stdout + done.stderr)
    return verdict.Graded(stdout=done.stdout, exit_code=retries.exit_code(done.returncode))


def _finish(
    sidecar_url: str, token_file: Path, *, judged: verdict.Verdict, retried: bool
) -> dict[str, Any]:
    """Report the rollout to its sidecar, with the control token it made before it
    listened, and whether its sample is tried again (the trainer's group waits for it)."""
    body = json.dumps(judged.report(FINISH_WAIT_SECONDS, retried=retried).body()).encode()
    try:
        request = urllib.request.Request(
            sidecar_url + endpoints.ROLLOUT_FINISH, data=body,
            headers={"content-type": "application/json",
                     **control.headers(control.read(token_file))},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=FINISH_WAIT_SECONDS + 10) as response:
            result: dict[str, Any] = json.load(response)
            return result
    except (OSError, ValueError) as exc:
        return {"acknowledged": False, "error": str(exc)}
