"""Chaos: a training run that is killed everywhere trains what a quiet run trains.

Two ``openforge run``s of the ReAct demo's job (4 tasks x 2 samples, 3 iterations,
training the tiny policy for real) from one manifest: one left alone, one whose
collector, one sidecar and the trainer (in a step) are SIGKILLed, and whose runner is
SIGKILLed once (while rollouts run) and stopped once (SIGTERM, while it waits for a
training step) and run again after each, at points drawn from a seeded generator
(``OPENFORGE_CHAOS_SEED`` picks another sweep). The points are counted in finished
rollouts (plus seconds, for those meant to land in a step), not wall time, so one seed
means much the same kills on a fast machine and a slow one. A stop before any rollout
(while the services start) is ``test_run_cli``'s, and the rerun of a finished run too.
Then:

- exactly once: every record in every sidecar spool of the run (each attempt keeps
  its own) is in the store, or its rollout or call is listed lost with a reason; no
  call is stored twice under another key; no attempt is left unfinished;
- the same training: the steps took the same groups (task, batch) at the same policy
  versions as the quiet run, each group its task's two samples.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from openforge_sidecar.recording import spool as sidecar_spool
from openforge_trainer.collection import store

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SEED = int(os.environ.get("OPENFORGE_CHAOS_SEED", "20261202"))
TASKS, SAMPLES, ITERATIONS = 4, 2, 3
PER_ITERATION = TASKS * SAMPLES
JOB = "react-toy"

pytestmark = pytest.mark.slow


def manifest(tmp_path: Path) -> Path:
    lines = (EXAMPLES / "tasks" / "toy-tools" / "demo.jsonl").read_text().splitlines()[:TASKS]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(lines) + "\n")
    text = (EXAMPLES / "react-toy.yaml").read_text()
    text = text.replace("$OPENFORGE_MANIFEST_DIR", str(EXAMPLES)).replace(
        "${OPENFORGE_MANIFEST_DIR}", str(EXAMPLES)
    )
    text = text.replace("file: tasks/toy-tools/demo.jsonl", f"file: {tasks}")
    text = text.replace("model: models/tiny-react", f"model: {EXAMPLES / 'models' / 'tiny-react'}")
    text = text.replace("samplesPerTask: 4", f"samplesPerTask: {SAMPLES}")
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def command(job: Path, run_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "openforge.cli",
        "run",
        str(job),
        "--run-dir",
        str(run_dir),
        "--iterations",
        str(ITERATIONS),
        "--quiet",
    ]


def journal(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "journal.jsonl"
    if not path.exists():
        return []
    entries = []
    for line in path.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:  # a line the runner was killed while writing
            continue
    return entries


def finishes(run_dir: Path) -> int:
    return sum(entry["event"] == "finish" for entry in journal(run_dir))


def pids(pattern: str) -> list[int]:
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True, check=False)
    return [int(pid) for pid in found.stdout.split()]


def kill(pattern: str) -> bool:
    """SIGKILL one process whose command line matches; whether there was one."""
    for pid in pids(pattern):
        try:
            os.kill(pid, signal.SIGKILL)
            return True
        except ProcessLookupError:
            continue
    return False


@dataclass
class Kill:
    """One planned kill: when the run has finished ``after`` rollouts (and ``delay`` seconds
    more)."""

    what: str
    after: int
    delay: float = 0.0
    done: bool = field(default=False, init=False)


def plan(rng: random.Random) -> tuple[list[Kill], Kill, Kill]:
    """The seeded sweep: the services' kills; the runner SIGKILLed while the second
    iteration's rollouts run, then (in the run after) stopped with SIGTERM once a later
    iteration's rollouts are done, while the runner waits for its training step."""
    trained_iteration = rng.randrange(ITERATIONS - 1)  # a step the trainer dies in
    kills = [
        Kill("collector", rng.randint(1, PER_ITERATION - 1)),
        Kill("sidecar", rng.randint(1, 2 * PER_ITERATION - 2)),
        Kill("trainer", PER_ITERATION * (trained_iteration + 1), delay=rng.uniform(0.5, 4.0)),
    ]
    runner_killed = Kill("runner", rng.randint(PER_ITERATION + 1, 2 * PER_ITERATION - 1))
    runner_stopped = Kill(
        "runner", PER_ITERATION * rng.randint(2, ITERATIONS), delay=rng.uniform(0.0, 1.0)
    )
    return kills, runner_killed, runner_stopped


def victim(what: str, run_dir: Path) -> str:
    return {
        "collector": f"[c]ollector --store {run_dir}/store.db",
        "sidecar": f"[s]idecar --listen .* --spool {run_dir}/rollouts/",
        "trainer": f"[t]rain --store {run_dir}/store.db",
    }[what]


def run_until(
    argv: list[str],
    run_dir: Path,
    *,
    stop: Kill | None,
    sig: int,
    kills: list[Kill],
    timeout: float,
) -> subprocess.CompletedProcess[str]:
    """Run ``openforge run`` while firing the kills that are due; with ``stop``, send the
    runner ``sig`` once it is due."""
    log = run_dir.parent / f"runner-{len(list(run_dir.parent.glob('runner-*.log')))}.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        deadline, due_at = time.monotonic() + timeout, dict[int, float]()
        try:
            while process.poll() is None:
                assert time.monotonic() < deadline, (
                    f"the run did not end within {timeout:g} s: {log.read_text()[-3000:]}"
                )
                count = finishes(run_dir)
                for number, planned in enumerate(kills):
                    if planned.done or count < planned.after:
                        continue
                    due = due_at.setdefault(number, time.monotonic() + planned.delay)
                    if time.monotonic() >= due:
                        planned.done = kill(victim(planned.what, run_dir))
                if (
                    stop is not None
                    and count >= stop.after
                    and time.monotonic() >= due_at.setdefault(-1, time.monotonic() + stop.delay)
                ):
                    os.kill(process.pid, sig)
                    stop.done, stop = True, None
                time.sleep(0.05)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(60)
    return subprocess.CompletedProcess(argv, process.returncode, log.read_text(), "")


def trained_steps(run_dir: Path) -> dict[str, list[tuple[str, str, int]]]:
    """Each step (its checkpoint's name): the groups it trained, (task, batch, policy version) per
    rollout."""
    steps: dict[str, list[tuple[str, str, int]]] = {}
    with store.Store(run_dir / "store.db") as db:
        for rollout in db.rollouts(JOB):
            if rollout.trained_checkpoint is not None:
                steps.setdefault(Path(rollout.trained_checkpoint).name, []).append(
                    (rollout.task_id, rollout.batch, rollout.policy_version)
                )
    return {step: sorted(groups) for step, groups in sorted(steps.items())}


def _retried_attempts(run_dir: Path) -> set[str]:
    """The rollout ids of attempts the journal shows started and then started again."""
    starts = [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]
    starts = [entry for entry in starts if entry["event"] == "start"]
    later = {(e["iteration"], e["index"], e["attempt"]) for e in starts}
    return {
        e["rollout_id"] for e in starts if (e["iteration"], e["index"], e["attempt"] + 1) in later
    }


def check_exactly_once(run_dir: Path) -> dict[str, int]:
    """Every spooled record stored, or its rollout or call listed lost; no call twice; nothing left
    open."""
    with store.Store(run_dir / "store.db") as db:
        lost = db.lost(JOB)
        rollouts = {r.rollout_id: r for r in db.rollouts(JOB)}
    whole = {item.rollout_id for item in lost if item.whole_rollout}
    lost_calls = {(item.rollout_id, item.call_index) for item in lost if not item.whole_rollout}
    assert all(item.reason for item in lost), lost
    with sqlite3.connect(run_dir / "store.db") as raw:
        keys = {key for (key,) in raw.execute("SELECT idempotency_key FROM records")}
        twice = raw.execute(
            "SELECT rollout_id, call_index, COUNT(*) FROM records WHERE kind = 'call' GROUP BY "
            "rollout_id, call_index HAVING COUNT(*) > 1"
        ).fetchall()
    assert twice == [], f"calls stored twice: {twice}"
    counts = {"spools": 0, "records": 0, "missing": 0}
    unstarted: list[str] = []
    for directory in sorted((run_dir / "rollouts").glob("*/spool")):
        rollout_id = directory.parent.name
        if not any(directory.iterdir()):
            # The runner makes the directory, then starts the sidecar; killed in between,
            # no sidecar ever ran for the attempt: nothing was spooled, nothing can be lost.
            unstarted.append(rollout_id)
            continue
        counts["spools"] += 1
        with sidecar_spool.Spool(directory) as spooled:
            for record in spooled.records_after(0):
                counts["records"] += 1
                if record.idempotency_key in keys:
                    continue
                counts["missing"] += 1
                kind = record.WhichOneof("body")
                covered = rollout_id in whole or (
                    kind == "call" and (rollout_id, record.call.call_index) in lost_calls
                )
                assert covered, (
                    f"{rollout_id}: a spooled {kind} record ({record.idempotency_key}) is neither "
                    "stored nor listed lost"
                )
    assert counts["spools"] == len(rollouts), "every attempt has its spool"
    retried = _retried_attempts(run_dir)
    assert all(rollout_id in retried for rollout_id in unstarted), (unstarted, retried)
    unfinished = [rollout_id for rollout_id, rollout in rollouts.items() if not rollout.finished]
    assert unfinished == [], f"attempts left open: {unfinished}"
    return counts


@pytest.mark.timeout(3000)
def test_a_run_killed_everywhere_trains_what_a_quiet_run_trains_and_loses_nothing(
    tmp_path: Path,
) -> None:
    job = manifest(tmp_path)
    quiet = tmp_path / "quiet" / "run"
    quiet.parent.mkdir()
    done = run_until(command(job, quiet), quiet, stop=None, sig=0, kills=[], timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:]
    expected = trained_steps(quiet)
    assert len(expected) == ITERATIONS, expected
    assert all(len(groups) == PER_ITERATION for groups in expected.values()), expected

    kills, runner_killed, runner_stopped = plan(random.Random(SEED))
    chaos = tmp_path / "chaos" / "run"
    chaos.parent.mkdir()
    argv = command(job, chaos)
    first = run_until(
        argv, chaos, stop=runner_killed, sig=signal.SIGKILL, kills=kills, timeout=1200
    )
    assert first.returncode == -signal.SIGKILL, (
        f"the runner was not killed at {runner_killed}: {first.stdout[-3000:]}"
    )
    second = run_until(
        argv, chaos, stop=runner_stopped, sig=signal.SIGTERM, kills=kills, timeout=1200
    )
    assert runner_stopped.done and second.returncode == 130, (
        f"not stopped at {runner_stopped}: {second.stdout[-3000:]}"
    )
    last = run_until(argv, chaos, stop=None, sig=0, kills=kills, timeout=1200)
    assert last.returncode == 0, last.stdout[-4000:]
    fired = {planned.what: planned.done for planned in kills}
    assert all(fired.values()), f"kills that found nothing to kill (seed {SEED}): {fired}"

    counts = check_exactly_once(chaos)
    assert counts["records"] > 0
    assert trained_steps(chaos) == expected, (
        f"seed {SEED}: kills {kills}, runner killed at {runner_killed}, stopped at {runner_stopped}"
    )
    events = [entry for entry in journal(chaos) if entry["event"] == "service"]
    assert {entry["service"] for entry in events} >= {"collector", "trainer"}, events
