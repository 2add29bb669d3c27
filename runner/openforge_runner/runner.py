"""Iterations of a RolloutJob on one machine: rollouts in parallel, then a training step.

The runner keeps a journal (``<run dir>/journal.jsonl``) of every attempt it
starts, every failed attempt it tries again and every rollout it finishes, so a
rerun continues where a stopped run left off: finished rollouts are not run
again, an attempt that was cut off is retried under a new attempt number (its
partial records stay incomplete in the store and are never trained on; it is
not counted as a failure), and finished iterations are skipped. Whether a
failed attempt is tried again is the failure policy's rule that the operator
follows too (``openforge.api.retries``), over every attempt the journal holds.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from openforge import endpoints
from openforge.api import retries

from openforge_runner import executor, plan

T = TypeVar("T")


@dataclass
class IterationStats:
    iteration: int
    total: int
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    rewards: list[float] = field(default_factory=list)

    @property
    def done(self) -> int:
        return self.succeeded + self.failed

    @property
    def mean_reward(self) -> float | None:
        return sum(self.rewards) / len(self.rewards) if self.rewards else None


class Journal:
    """Append-only record of attempts started and rollouts finished (one JSON per line)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def entries(self) -> Iterator[dict[str, Any]]:
        if not self.path.exists():
            return
        for line in self.path.read_text().splitlines():
            try:
                yield json.loads(line)
            except ValueError:
                continue  # a line cut by a crash

    def write(self, entry: dict[str, Any]) -> None:
        with self._lock, self.path.open("a") as handle:
            handle.write(json.dumps(entry) + "\n")
            handle.flush()


@dataclass(frozen=True)
class Resume:
    finished: dict[tuple[int, int], dict[str, Any]]  # (iteration, index) -> finish entry
    next_attempt: dict[tuple[int, int], int]
    trained: set[int]  # iterations whose training step completed
    tried: dict[tuple[int, int], list[retries.Tried]] = field(default_factory=dict)
    """The failed attempts each unfinished rollout was tried again after."""
    trained_by: set[str] = field(default_factory=set)
    """The engines (``spec.training.engine``) that trained them."""


def resume_state(journal: Journal) -> Resume:
    finished: dict[tuple[int, int], dict[str, Any]] = {}
    next_attempt: dict[tuple[int, int], int] = {}
    trained: set[int] = set()
    trained_by: set[str] = set()
    tried: dict[tuple[int, int], list[retries.Tried]] = {}
    for entry in journal.entries():
        key = (int(entry.get("iteration", -1)), int(entry.get("index", -1)))
        if entry.get("event") == "start":
            next_attempt[key] = max(next_attempt.get(key, 0), int(entry["attempt"]) + 1)
        elif entry.get("event") == "retry":
            tried.setdefault(key, []).append(_tried(entry))
        elif entry.get("event") == "finish":
            finished[key] = entry
        elif entry.get("event") == "trained":
            trained.add(int(entry["iteration"]))
            trained_by.add(str(entry.get("engine", "openforge")))  # the only one before
    return Resume(finished, next_attempt, trained, tried, trained_by)


def _tried(entry: dict[str, Any]) -> retries.Tried:
    """One journalled attempt (a ``retry`` or ``finish`` entry) as the failure policy sees it."""
    exit_code = entry.get("exit_code")
    return retries.Tried(
        int(entry["attempt"]), entry.get("status") == "succeeded",
        None if exit_code is None else int(exit_code), entry.get("reason") or None,
    )  # fmt: skip


class Runner:
    def __init__(
        self,
        bundle: plan.Bundle,
        *,
        run_dir: Path,
        endpoints: Callable[[plan.Rollout], executor.Endpoints],
        on_change: Callable[[IterationStats], None] = lambda stats: None,
        stop: threading.Event | None = None,
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        """``endpoints`` gives a rollout's servers as it starts; ``ready`` says whether a
        rollout may start now (the run's services are up)."""
        self.bundle = bundle
        self.run_dir = run_dir
        self.journal = Journal(run_dir / "journal.jsonl")
        self._endpoints = endpoints
        self._on_change = on_change
        self.stop = stop or threading.Event()
        self._ready = ready
        self._lock = threading.Lock()
        self._tried: dict[tuple[int, int], list[retries.Tried]] = {}

    def run_iteration(self, iteration: int) -> IterationStats:
        """Every rollout of one iteration, ``parallelism`` at a time, with retries."""
        resume = resume_state(self.journal)
        self._tried = {key: list(tried) for key, tried in resume.tried.items()}
        every = plan.rollouts_for(self.bundle, iteration)
        todo = [r for r in every if (iteration, r.index) not in resume.finished]
        stats = IterationStats(iteration, total=len(every))
        for entry in resume.finished.values():
            if entry["iteration"] == iteration:
                self._count(stats, entry)
        parallelism = self.bundle.job.spec.parallelism
        with ThreadPoolExecutor(max_workers=parallelism, thread_name_prefix="rollout") as pool:
            pending: dict[Future[executor.Outcome], plan.Rollout] = {}
            queue = [self._next_attempt(r, resume) for r in todo]
            while (queue or pending) and not self.stop.is_set():
                while (
                    queue
                    and len(pending) < parallelism
                    and not self.stop.is_set()
                    and self._ready()
                ):
                    rollout = queue.pop(0)
                    self._start(stats, rollout)
                    pending[pool.submit(self._run, rollout)] = rollout
                if not pending:  # waiting for a service to come back
                    self.stop.wait(0.2)
                    continue
                done, _ = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                for future in done:
                    rollout = pending.pop(future)
                    retry = self._settle(stats, rollout, outcome=future.result())
                    if retry is not None:
                        queue.append(retry)
        return stats

    def _next_attempt(self, rollout: plan.Rollout, resume: Resume) -> plan.Rollout:
        attempt = resume.next_attempt.get((rollout.iteration, rollout.index), 0)
        while rollout.attempt < attempt:
            rollout = rollout.retry()
        return rollout

    def _start(self, stats: IterationStats, rollout: plan.Rollout) -> None:
        self.journal.write(
            {
                "event": "start",
                "iteration": rollout.iteration,
                "index": rollout.index,
                "attempt": rollout.attempt,
                "rollout_id": rollout.rollout_id,
            }
        )
        with self._lock:
            stats.running += 1
        self._on_change(stats)

    def _run(self, rollout: plan.Rollout) -> executor.Outcome:
        return executor.run_rollout(
            self.bundle,
            rollout,
            run_dir=self.run_dir,
            endpoints=self._endpoints(rollout),
            stop=self.stop,
            tried_again=lambda tried: self._decide(rollout, tried).state == "retry",
        )

    def _decide(self, rollout: plan.Rollout, tried: retries.Tried) -> retries.Decision:
        """What the failure policy does after ``tried``, over the rollout's earlier attempts."""
        with self._lock:
            history = [*self._tried.get((rollout.iteration, rollout.index), []), tried]
        return retries.decide(self.bundle.job.spec, history)

    def _settle(
        self, stats: IterationStats, rollout: plan.Rollout, *, outcome: executor.Outcome
    ) -> plan.Rollout | None:
        with self._lock:
            stats.running -= 1
        if outcome.reason == executor.INTERRUPTED:
            return None  # not finished: a rerun starts it again, as a new attempt
        entry = {
            "event": "finish",
            "iteration": rollout.iteration,
            "index": rollout.index,
            "attempt": rollout.attempt,
            "rollout_id": rollout.rollout_id,
            "task_id": rollout.task_id,
            "status": outcome.status,
            "reward": outcome.reward,
            "reason": outcome.reason,
            "message": outcome.message[:500],
            "exit_code": outcome.exit_code,
            "calls": outcome.calls,
            "seconds": round(outcome.seconds, 3),
        }
        tried = _tried(entry)
        decision = self._decide(rollout, tried)
        with self._lock:
            self._tried.setdefault((rollout.iteration, rollout.index), []).append(tried)
        # a finish recorded as tried again is kept to (its sample's group waits for the
        # next attempt), also when the sidecar's answer turned the verdict into another
        if decision.state == "retry" or outcome.retried:
            self.journal.write({**entry, "event": "retry"})
            with self._lock:
                stats.retried += 1
            self._on_change(stats)
            return rollout.retry()
        self.journal.write(entry)
        self._count(stats, entry)
        self._on_change(stats)
        return None

    def _count(self, stats: IterationStats, entry: dict[str, Any]) -> None:
        with self._lock:
            count(stats, entry)


def count(stats: IterationStats, entry: dict[str, Any]) -> None:
    """Add one journal ``finish`` entry to an iteration's counts."""
    if entry["status"] == "succeeded":
        stats.succeeded += 1
        if entry.get("reward") is not None:
            stats.rewards.append(float(entry["reward"]))
    else:
        stats.failed += 1


def finished_history(
    bundle: plan.Bundle, journal: Journal, *, iterations: int, train: bool
) -> list[IterationStats] | None:
    """Each iteration's counts when an earlier run left nothing to do (every rollout of
    ``iterations`` finished, and trained on when ``train``), read from its journal; None
    when something is left."""
    resume = resume_state(journal)
    history = []
    for iteration in range(iterations):
        every = plan.rollouts_for(bundle, iteration)
        if any((iteration, r.index) not in resume.finished for r in every) or (
            train and iteration not in resume.trained
        ):
            return None
        stats = IterationStats(iteration, total=len(every))
        for rollout in every:
            count(stats, resume.finished[(iteration, rollout.index)])
        history.append(stats)
    return history


def policy_version(engine_url: str) -> int:
    with urllib.request.urlopen(engine_url + endpoints.POLICY, timeout=10) as response:
        return int(json.load(response).get("policy_version", 0))


POLL_SECONDS = 0.5


def poll_until(
    ready: Callable[[], T | None],
    *,
    alive: Callable[[], bool],
    stop: threading.Event,
    timeout: float,
    died: str,
    late: str,
) -> T | None:
    """What ``ready`` gives once it gives something (not None), asked every
    :data:`POLL_SECONDS`; None when ``stop`` is set first. The trainer dead (``alive``
    says no) is a ``RuntimeError`` saying ``died``, ``timeout`` passing a
    ``TimeoutError`` saying ``late``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if stop.is_set():
            return None
        found = ready()
        if found is not None:
            return found
        if not alive():
            raise RuntimeError(died)
        stop.wait(POLL_SECONDS)
    raise TimeoutError(late)


def wait_for_policy(
    engine_url: str,
    version: int,
    *,
    alive: Callable[[], bool],
    stop: threading.Event,
    timeout: float,
) -> int | None:
    """Block until the engine serves ``version`` or later (the trainer published); None
    when ``stop`` is set first."""

    def served() -> int | None:
        try:
            current = policy_version(engine_url)
        except OSError:  # the engine is being restarted: ask again
            return None
        return current if current >= version else None

    return poll_until(
        served,
        alive=alive,
        stop=stop,
        timeout=timeout,
        died="the trainer stopped before publishing new weights (see trainer.log)",
        late=f"the engine still serves a policy older than version {version} after {timeout:.0f} s",
    )
