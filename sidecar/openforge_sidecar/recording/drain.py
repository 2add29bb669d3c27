"""Deliver what a sidecar left in its spool, and close the rollout it never finished.

A sidecar's spool outlives its process. When the process is gone (it died,
it was killed, the run stopped) while records wait unacknowledged, or before
the rollout was finished, :func:`drain` does what the sidecar would have
done, without serving anything:

- with ``close``, it reports each call begun but never spooled as lost, and,
  when no ``finished`` record was spooled, reports the whole rollout lost
  with ``reason`` and records it finished (no reward: never trained or
  measured), so the store never keeps an abandoned attempt running: as
  ``stopped`` when its sample is tried again (a trainer then waits for that
  attempt), as ``failed`` when it is not (its sample is done);
- it streams every unacknowledged record to the collector and waits (at
  most ``timeout``) for the acknowledgements.

With ``started`` (the fields of a ``RolloutStarted``, and ``job`` and ``rollout_id``),
a spool that holds no started record gets one first, made if it does not exist: an
attempt whose sidecar never started (or died before it recorded the start) is still
recorded, and closed, so that a trainer never waits for it.

Drain is idempotent: the records it adds carry the same idempotency keys a
second drain would give them (the loss indexes continue the spool's), the
collector acknowledges redelivered records as duplicates, and a spool with
nothing unacknowledged and a finish is left as it is, without a connection.
"""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from openforge import trajectory

from openforge_sidecar.recording import records, resume, spool

STOPPED_EXIT_CODE = records.STOPPED_EXIT_CODE


@dataclass(frozen=True, slots=True)
class Drained:
    """What one drain did to one spool."""

    spool: str
    rollout_id: str
    closed: bool
    """A finish (failed) and a whole-rollout loss were recorded here."""
    lost_calls: int
    """Calls begun but never spooled, reported lost here."""
    unacked_before: int
    unacked: int
    """Records still unacknowledged when the drain ended (0: all delivered)."""
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def drain(
    directory: Path,
    *,
    collector: str,
    token: str | None = None,
    reason: str,
    close: bool,
    timeout: float,
    status: str = trajectory.STOPPED,
    started: dict[str, Any] | None = None,
) -> Drained:
    """Close (with ``close``) and deliver the spool in ``directory``; with ``started``,
    record the rollout's start first when the spool does not hold it."""
    if started is None and not (directory.is_dir() and any(directory.iterdir())):
        return Drained(str(directory), "", False, 0, 0, 0, "no spool")
    directory.mkdir(parents=True, exist_ok=True)
    # a dead sidecar's stashed request bodies: their calls are reported lost below
    shutil.rmtree(directory / records.STASH_DIRECTORY, ignore_errors=True)
    with spool.Spool(directory) as store:
        found = resume.resume(store, directory / resume.INFLIGHT_JOURNAL)
        if started is not None and not found.started:
            store.append([records.started(**started)])
            found = resume.resume(store, directory / resume.INFLIGHT_JOURNAL)
        added = _closing(found, reason=reason, status=status) if close and found.rollout_id else []
        if added:
            store.append(added)
        before = store.unacked_count
        error = ""
        if before:
            try:
                asyncio.run(_deliver(store, collector, token=token, timeout=timeout))
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
        closed = any(record.WhichOneof("body") == "finished" for record in added)
        return Drained(
            spool=str(directory),
            rollout_id=found.rollout_id,
            closed=closed,
            lost_calls=len(found.vanished_calls) if close else 0,
            unacked_before=before,
            unacked=store.unacked_count,
            error=error
            or (
                ""
                if not store.unacked_count
                else f"the collector at {collector} did not acknowledge within {timeout:g} s"
            ),
        )


def _closing(found: resume.Resume, *, reason: str, status: str) -> list[Any]:
    """The records that report ``found``'s vanished calls and, if unfinished, close it."""
    out: list[Any] = []
    index = found.next_lost
    for call in found.vanished_calls:
        out.append(records.lost(
            job=found.job, rollout_id=found.rollout_id, index=index, call_index=call,
            reason=f"call {call} was in flight when its sidecar went away: {reason}",
        ))  # fmt: skip
        index += 1
    if not found.finished:
        out.append(
            records.lost(
                job=found.job, rollout_id=found.rollout_id, index=index, reason=reason, whole=True
            )
        )
        out.append(records.finished(
            job=found.job, rollout_id=found.rollout_id, exit_code=STOPPED_EXIT_CODE, reward=None,
            grader_output="", call_count=found.next_call, status=status,
        ))  # fmt: skip
    return out


async def _deliver(
    store: spool.Spool, collector: str, *, token: str | None, timeout: float
) -> bool:
    from openforge_sidecar.recording import exporter  # gRPC: only when there is something to send

    sender = exporter.Exporter(store, collector, token=token, backoff_max_s=1.0)
    sender.start()
    try:
        return await sender.flush(timeout)
    finally:
        await sender.stop()


def main(argv: list[str]) -> int:
    """``openforge drain``: one JSON line per spool; exit 1 when any kept records."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="openforge drain", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "spools",
        nargs="+",
        type=Path,
        metavar="SPOOL",
        help="a stopped sidecar's --spool directory",
    )
    parser.add_argument("--collector", required=True, help="collector host:port")
    parser.add_argument(
        "--collector-token-file", default="", help="file holding the collector bearer token"
    )
    parser.add_argument(
        "--close",
        action="store_true",
        help="record each unfinished rollout as lost (with --reason) and finished (--status)",
    )
    parser.add_argument(
        "--status",
        choices=(trajectory.STOPPED, "failed"),
        default=trajectory.STOPPED,
        help="how --close finishes a rollout: stopped (its sample is tried again, the "
        "default) or failed (it is not)",
    )
    parser.add_argument(
        "--reason",
        default="its sidecar stopped before the rollout was finished",
        help="why, for --close",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="seconds to wait for each spool's acknowledgements",
    )
    parser.add_argument(
        "--started",
        type=_started,
        help="JSON object: the rollout's start (job, rollout_id, task_id, sample_index, "
        "attempt, harness, policy_version, labels), recorded first in a spool that lacks it "
        "(made if missing): for an attempt whose sidecar never started",
    )
    ns = parser.parse_args(argv)
    token = Path(ns.collector_token_file).read_text().strip() if ns.collector_token_file else None
    kept = 0
    for directory in ns.spools:
        done = drain(
            directory,
            collector=ns.collector,
            token=token,
            reason=ns.reason,
            close=ns.close,
            timeout=ns.timeout,
            status=ns.status,
            started=ns.started,
        )
        kept += done.unacked
        print(json.dumps(done.to_dict()), flush=True)
    return 1 if kept else 0


_STARTED_FIELDS = {
    "job": str, "rollout_id": str, "task_id": str, "sample_index": int, "attempt": int,
    "harness": str, "policy_version": int, "labels": dict,
}  # fmt: skip


def _started(text: str) -> dict[str, Any]:
    """``--started``'s value: a JSON object with every field of :data:`_STARTED_FIELDS`."""
    import argparse
    import json

    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict) or set(value) != set(_STARTED_FIELDS):
        raise argparse.ArgumentTypeError(
            f"must be a JSON object with exactly the keys {', '.join(_STARTED_FIELDS)}"
        )
    for key, kind in _STARTED_FIELDS.items():
        if not isinstance(value[key], kind) or isinstance(value[key], bool):
            raise argparse.ArgumentTypeError(f"{key} must be a JSON {kind.__name__}")
    return value
