"""The training loop: ready task groups -> veRL batch -> one update -> checkpoint -> marks ->
publish.

One step, in order (the order is what makes a crash harmless):

1. **select** (:func:`select_groups`): task groups of the job whose rollouts
   are complete and untrained, oldest policy first. Rollouts that can never
   be trained are skipped with a reason and counted: sampled more than
   ``max_staleness`` policy versions ago, no reward, logprobs not captured,
   no model tokens in its completed calls (aborted, refused and errored calls
   are never trained, :mod:`outcome`), superseded by a later attempt, a group
   left with fewer than two usable rollouts, or a late rollout of a task whose
   group was already trained or skipped whole. A group is ready by its samples, not
   its attempts: each sample's latest attempt (:func:`_ready`). A settled batch
   whose every group was skipped whole gets a step that trains nothing
   (:meth:`Trainer.skip_step`): the rest of the steps below, the weights unchanged.
2. **batch** (:mod:`rl_batch`): their rows as one veRL ``DataProto``;
   per-rollout advantages from veRL's estimator (GRPO by default).
3. **update** (:meth:`Trainer.update`): micro-batches within a token budget;
   each recomputes the current log-probs with a full-sequence forward pass
   (float32 log-softmax, temperature 1) and backpropagates veRL's clipped PPO
   loss against the captured log-probs (the policy that sampled); then one
   AdamW step after global-norm clipping. The first micro-batch also reports
   mean/max |recomputed - captured|: ~0 when the weights are those that
   sampled, which checks token exactness across the whole capture path.
4. **checkpoint** (:mod:`checkpoint`), atomically, with the trainer state
   (step, policy version, trained rollout ids).
5. **mark** the rollouts trained in the store, only now that the checkpoint
   is durable. On restart, :meth:`Trainer.reconcile` re-marks any rollout the
   checkpoint holds but the store does not (a crash between 4 and 5); a crash
   before 4 leaves the groups unmarked and the model at the previous
   checkpoint, so they are trained once, by the restarted trainer.
6. **publish** the checkpoint to every inference server with the new policy
   version, then write the step's metrics.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
import transformers
from openforge import trajectory
from verl import DataProto

from openforge_trainer.collection import store as store_module
from openforge_trainer.serving import publish
from openforge_trainer.training import algorithms, checkpoint, rl_batch, update_guard
from openforge_trainer.training import config as train_config
from openforge_trainer.training import metrics as metrics_module
from openforge_trainer.trajectories import export, outcome

MIN_GROUP = 2  # rollouts a group needs to compare anything
_K = TypeVar("_K")


@dataclasses.dataclass(frozen=True)
class Group:
    """One task's rollouts, ready to train, with their rows."""

    task_id: str
    rollouts: tuple[store_module.Rollout, ...]
    rows: tuple[export.Row, ...]
    staleness: int  # trainer policy version - oldest version that sampled a token


@dataclasses.dataclass
class Selection:
    groups: list[Group] = dataclasses.field(default_factory=list)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)  # rollout id -> reason
    closed: dict[str, str] = dataclasses.field(default_factory=dict)
    """Groups skipped whole (group key -> why): a later attempt of one of them is late."""
    settled: bool = False
    """The groups are all the batch will have: none of its rollouts is still running."""
    full: bool = False
    """A whole step: ``groups_per_step`` groups, or every group of a settled batch."""
    empty_batch: str = ""
    """A batch whose step trains nothing, due before any group is trained: every group
    of it was skipped whole (:func:`_empty_batch`, :meth:`Trainer.skip_step`)."""


# -- selection -------------------------------------------------------------------


def select_groups(
    db: store_module.Store,
    config: train_config.TrainConfig,
    *,
    state: checkpoint.TrainerState,
    limit: int,
) -> Selection:
    """Up to ``limit`` trainable groups of the oldest batch with untrained rollouts, and
    the rollouts (and groups) newly found untrainable."""
    selection = Selection()
    candidates: list[tuple[int, str, list[store_module.Rollout]]] = []
    everything = db.rollouts(config.job)
    untrained, skipped = _untrained_by_task(everything, state)
    for task, why in [(task, _late(state, task)) for task in untrained]:
        if why:  # its group was decided: a later attempt neither joins it nor holds its batch
            for rollout in untrained.pop(task):
                if rollout.complete:
                    selection.skipped[rollout.rollout_id] = (
                        "failed, and tried again as a new attempt" if rollout.retried else why
                    )
    _drop_tried_again(untrained, everything, skipped=selection.skipped)
    undecided = dict(untrained)
    batches = {rollout.batch for members in untrained.values() for rollout in members}
    batch = min(batches, key=_batch_order) if batches else ""
    untrained = {key: members for key, members in untrained.items() if members[0].batch == batch}
    selection.settled = _settled(everything, batch)
    cut_off = _cut_off(everything)
    for task, members in untrained.items():
        # an attempt tried again is its sample's until the next one starts, never trained
        complete = [rollout for rollout in members if rollout.complete and not rollout.retried]
        # with a group size, a sample skipped on an earlier poll (no reward, say) is one of
        # the group's samples all the same: its latest attempt is done
        samples = [*members, *skipped.get(task, [])] if config.group_size else members
        ready = _ready(config, samples, cut_off=cut_off.get(task, {}), settled=selection.settled)
        if ready and complete:
            oldest = min(rollout.policy_version for rollout in complete)
            candidates.append((oldest, task, complete))
    for _, task, complete in sorted(candidates, key=lambda item: (item[0], item[1])):
        if len(selection.groups) == limit:
            break
        group = _prepare(
            db, config, state=state, task=task, complete=complete, skipped=selection.skipped
        )
        if isinstance(group, Group):
            selection.groups.append(group)
        elif selection.settled or config.group_size:
            # decided on all the samples it will have: a later attempt of one is late.
            # Without either, later samples may still make a group of their own.
            selection.closed[task] = group
    pending = {
        members[0].batch for key, members in undecided.items() if key not in selection.closed
    }
    selection.empty_batch = _empty_batch(
        everything, state, closed=selection.closed, pending=pending
    )
    return selection


def _empty_batch(
    rollouts: list[store_module.Rollout],
    state: checkpoint.TrainerState,
    *,
    closed: dict[str, str],
    pending: set[str],
) -> str:
    """The oldest batch that is owed a step that trains nothing, or "": one that gives its
    size, is settled, and whose every group was skipped whole (``closed`` now, or
    before), so no group of it was or will be trained, and that had no such step yet. It
    comes before any batch still ``pending`` (with rollouts to decide), so that each
    batch gets its step in order: ``openforge run`` waits for one per iteration. A
    batch whose rollouts another trainer marked trained is not owed one."""
    decided = [*state.skipped_tasks, *closed]
    stepped = {_batch_of(key) for key in state.trained_tasks} | set(state.empty_batches)
    owed = {r.batch for r in rollouts if r.batch.partition("/")[2].isdigit()} - stepped - pending
    first_pending = min((_batch_order(batch) for batch in pending), default=None)
    for batch in sorted(owed, key=_batch_order):
        if first_pending is not None and _batch_order(batch) > first_pending:
            break
        members = [r for r in rollouts if r.batch == batch]
        if any(r.trained_at is not None for r in members):
            continue
        if any(_batch_of(key) == batch for key in decided) and _settled(rollouts, batch):
            return batch
    return ""


def _drop_tried_again(
    untrained: dict[str, list[store_module.Rollout]],
    rollouts: list[store_module.Rollout],
    *,
    skipped: dict[str, str],
) -> None:
    """Skip each attempt tried again whose next attempt has started: it is its sample's
    no longer. That attempt may be in another group (sampled at a newer policy version),
    and a group left with only such attempts could never be decided, holding its batch."""

    def sample(rollout: store_module.Rollout) -> tuple[str, int, str]:
        return (rollout.task_id, rollout.sample_index, rollout.batch)

    newest = _newest((r for r in rollouts if r.started), key=sample)
    for task in list(untrained):
        kept = []
        for rollout in untrained[task]:
            later = newest[sample(rollout)].attempt
            if rollout.retried and rollout.complete and later > rollout.attempt:
                skipped[rollout.rollout_id] = f"failed, and tried again as attempt {later}"
            else:
                kept.append(rollout)
        if kept:
            untrained[task] = kept
        else:
            del untrained[task]


def _late(state: checkpoint.TrainerState, task: str) -> str:
    """Why a rollout of group ``task`` comes too late (its group was decided), or ""."""
    if task in state.trained_tasks:
        return f"late: task {task!r} was trained at step {state.trained_tasks[task]}"
    if task in state.skipped_tasks:
        return f"late: task {task!r} was skipped ({state.skipped_tasks[task]})"
    return ""


def _settled(rollouts: list[store_module.Rollout], batch: str) -> bool:
    """Whether every rollout ``batch`` names (``<number>/<rollouts>``) is complete: the
    latest attempt of each of its samples, and not one that was cut off (its sample is
    tried again). Its groups are then all it will have. Never for a batch that gives no
    size (or no batch: the operator's rollouts), whose groups are waited for by
    ``groups_per_step``."""
    size = batch.partition("/")[2]
    if not size.isdigit():
        return False
    latest = _newest(
        (r for r in rollouts if r.batch == batch), key=lambda r: (r.task_id, r.sample_index)
    )
    done = [
        r
        for r in latest.values()
        if r.complete and r.status != trajectory.STOPPED and not r.retried
    ]
    return len(done) >= int(size)


def _newest(
    rollouts: Iterable[store_module.Rollout], *, key: Callable[[store_module.Rollout], _K]
) -> dict[_K, store_module.Rollout]:
    """Each key's rollout of the highest attempt (a sample's latest attempt)."""
    newest: dict[_K, store_module.Rollout] = {}
    for rollout in rollouts:
        found = key(rollout)
        if found not in newest or rollout.attempt > newest[found].attempt:
            newest[found] = rollout
    return newest


def _untrained_by_task(
    rollouts: list[store_module.Rollout], state: checkpoint.TrainerState
) -> tuple[dict[str, list[store_module.Rollout]], dict[str, list[store_module.Rollout]]]:
    """Per group, its rollouts still to be decided, and those the trainer skipped (never
    trained, but their samples are done)."""
    by_task: dict[str, list[store_module.Rollout]] = {}
    skipped: dict[str, list[store_module.Rollout]] = {}
    for rollout in rollouts:
        if rollout.rollout_id in state.trained or rollout.trained_at is not None:
            continue
        if not rollout.started or rollout.status == trajectory.STOPPED:
            # cut off: its sample is tried again as a new attempt, which the group waits for
            continue
        into = skipped if rollout.rollout_id in state.skipped else by_task
        into.setdefault(group_key(rollout), []).append(rollout)
    return by_task, skipped


def group_key(rollout: store_module.Rollout) -> str:
    """A GRPO group: one task's rollouts sampled from one policy version, in one batch.

    Training revisits the same tasks (iterations, epochs); each visit is a
    new group, compared only with rollouts of the same policy. Rollouts of two
    batches (``openforge run``'s iterations) are two groups even at one policy
    version, so that a stop and rerun cannot merge iterations: ``task@v3#1/32``.
    """
    key = f"{rollout.task_id}@v{rollout.policy_version}"
    return f"{key}#{rollout.batch}" if rollout.batch else key


def _batch_of(key: str) -> str:
    """The batch of group ``key`` (:func:`group_key`); "" for none."""
    return key.rpartition("#")[2] if "#" in key else ""


def _batch_order(batch: str) -> tuple[int, int, str]:
    """Batches in the order they were started: numbered ones (``<number>[/<rollouts>]``)
    by number."""
    number = batch.partition("/")[0]
    return (0, int(number), "") if number.isdigit() else (1, 0, batch)


def _cut_off(rollouts: list[store_module.Rollout]) -> dict[str, dict[int, int]]:
    """Per group, each sample's newest attempt that was cut off (``stopped``): the sample
    is tried again, so an attempt of it older than that one is not its last."""
    cut: dict[str, dict[int, int]] = {}
    for rollout in rollouts:
        if rollout.status == trajectory.STOPPED and rollout.started:
            samples = cut.setdefault(group_key(rollout), {})
            samples[rollout.sample_index] = max(
                samples.get(rollout.sample_index, -1), rollout.attempt
            )
    return cut


def _ready(
    config: train_config.TrainConfig,
    members: list[store_module.Rollout],
    *,
    cut_off: dict[int, int],
    settled: bool,
) -> bool:
    """Whether a group can be decided now. Samples count, not attempts, each by its latest
    attempt: done when that is complete; running when it is not. A sample whose newest
    attempt was cut off (``stopped``) is neither: it may be tried again (with a group
    size, its group waits for it by count) or never (a pod deleted at its job's deadline:
    without one, its group goes on without it). With ``group_size``, that many done
    samples (one whose attempt was skipped as untrainable, say without a reward, is done
    too); without, two and none running; in a settled batch, any (its groups are all it
    will have)."""
    latest = _newest(members, key=lambda r: r.sample_index)
    live = {s: r for s, r in latest.items() if cut_off.get(s, -1) < r.attempt}
    done = sum(rollout.complete and not rollout.retried for rollout in live.values())
    if settled:
        return done > 0
    if config.group_size:
        return done >= config.group_size
    return done >= MIN_GROUP and done == len(live)


def _prepare(
    db: store_module.Store,
    config: train_config.TrainConfig,
    *,
    state: checkpoint.TrainerState,
    task: str,
    complete: list[store_module.Rollout],
    skipped: dict[str, str],
) -> Group | str:
    """The group of ``task``'s latest complete attempts, or why the group is skipped
    whole (its rollouts are then in ``skipped``)."""
    usable: list[tuple[store_module.Rollout, list[export.Row]]] = []
    for rollout in _latest_attempts(complete, skipped):
        rows, reason = _rows(db, rollout)
        if reason:
            skipped[rollout.rollout_id] = reason
        else:
            usable.append((rollout, rows))
    ids = [rollout.rollout_id for rollout, _ in usable]
    if len(usable) < MIN_GROUP:
        reason = f"group too small: {len(usable)} usable rollout(s) in {task!r}"
        for rollout_id in ids:
            skipped[rollout_id] = reason
        return reason
    oldest = min(row.policy_version for _, rows in usable for row in rows)
    staleness = state.policy_version - oldest
    if staleness > config.max_staleness:
        reason = (
            f"stale: sampled at policy version {oldest}, trainer at {state.policy_version} "
            f"(max_staleness {config.max_staleness})"
        )
        for rollout_id in ids:
            skipped[rollout_id] = reason
        return reason
    return Group(
        task_id=task,
        rollouts=tuple(rollout for rollout, _ in usable),
        rows=tuple(row for _, rows in usable for row in rows),
        staleness=staleness,
    )


def _latest_attempts(
    complete: list[store_module.Rollout], skipped: dict[str, str]
) -> list[store_module.Rollout]:
    latest: dict[int, store_module.Rollout] = {}
    for rollout in sorted(complete, key=lambda r: (r.sample_index, r.attempt, r.rollout_id)):
        previous = latest.get(rollout.sample_index)
        if previous is not None:
            skipped[previous.rollout_id] = f"superseded by attempt {rollout.attempt}"
        latest[rollout.sample_index] = rollout
    return list(latest.values())


def _rows(db: store_module.Store, rollout: store_module.Rollout) -> tuple[list[export.Row], str]:
    """The rollout's trainable rows, or an empty list and why there are none.

    The rows hold its completed calls only (``export.rollout_rows``, by the rule of
    :mod:`outcome`): an aborted, refused or errored call is never trained, and its
    missing log-probs do not disqualify the rest.
    """
    if not rollout.has_reward:
        return [], "no reward"
    calls = db.calls(rollout.rollout_id)
    for call in calls:
        if outcome.completed(call) and call.completion_token_ids and not call.completion_logprobs:
            return [], f"call {call.call_index}: logprobs were not captured"
    try:
        rows, stats = export.rollout_rows(rollout, calls)
    except export.ExportError as exc:
        return [], f"export: {exc}"
    rows = [row for row in rows if any(row.response_mask)]
    if rows:
        return rows, ""
    return [], "no model tokens" + outcome.not_trained(stats.failures())


# -- the trainer -------------------------------------------------------------------


def load_model(path: Path, *, dtype: str, device: str) -> Any:
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    model: Any = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=getattr(torch, dtype)
    )
    return model.to(device)


def micro_batches(
    prompt_lengths: Sequence[int], response_lengths: Sequence[int], *, budget: int
) -> list[list[int]]:
    """Row indices grouped so that rows x (widest prompt + widest response) <= budget.

    Rows go longest first (less padding); a row over the budget alone makes a batch.
    """
    order = sorted(
        range(len(prompt_lengths)), key=lambda i: -(prompt_lengths[i] + response_lengths[i])
    )
    batches: list[list[int]] = []
    current: list[int] = []
    widest_prompt = widest_response = 0
    for i in order:
        prompt = max(widest_prompt, prompt_lengths[i])
        response = max(widest_response, response_lengths[i])
        if current and (len(current) + 1) * (prompt + response) > budget:
            batches.append(current)
            current, prompt, response = [], prompt_lengths[i], response_lengths[i]
        current.append(i)
        widest_prompt, widest_response = prompt, response
    if current:
        batches.append(current)
    return batches


class Trainer:
    """Owns the model, optimiser, store connection, metrics and publishers of one run."""

    def __init__(
        self,
        *,
        config: train_config.TrainConfig,
        state: checkpoint.TrainerState,
        source: Path,
        model: Any,
        optimizer: torch.optim.Optimizer,
        reference: Any | None,
        store: store_module.Store,
        metrics: metrics_module.MetricsWriter,
        publishers: Sequence[publish.Publisher],
        resumed_from: Path | None,
        log: Callable[[str], None] = print,
    ) -> None:
        """Assemble a run from its parts (no I/O); :meth:`open` makes them."""
        self.config = config
        self.log = log
        self.state = state
        self.source = source
        self.model = model
        self.optimizer = optimizer
        self.reference = reference
        self.actor = algorithms.actor_config(
            clip_ratio_low=config.clip_ratio_low,
            clip_ratio_high=config.clip_ratio_high,
            clip_ratio_c=config.clip_ratio_c,
            loss_agg_mode=config.loss_agg_mode,
            policy_loss=config.policy_loss,
        )
        pad = model.config.pad_token_id
        self.pad_token_id = int(pad) if pad is not None else 0
        self.store = store
        self.metrics = metrics
        self.publishers = list(publishers)
        self.skipped_total = len(state.skipped)
        self.resumed_from = resumed_from
        self.remarked = 0

    @classmethod
    def open(
        cls,
        config: train_config.TrainConfig,
        *,
        publishers: Sequence[publish.Publisher] | None = None,
        log: Callable[[str], None] = print,
    ) -> Trainer:
        """Start or resume the run in ``config.run_dir``: load the last checkpoint (or the
        base model), its optimiser state and the reference model, open the store and the
        metrics, and re-mark in the store what the checkpoint says was trained."""
        last = checkpoint.latest(config.run_dir)
        state = (
            checkpoint.load_state(last)
            if last is not None
            else checkpoint.TrainerState(base_model=str(config.model))
        )
        source = last if last is not None else config.model
        torch.manual_seed(config.seed + state.step)
        model = load_model(source, dtype=config.dtype, device=config.device)
        model.train()
        optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=config.lr,
            betas=(config.adam_beta1, config.adam_beta2),
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
        )
        if last is not None:
            checkpoint.load_optimizer(last, optimizer)
        reference = None
        if config.kl_coef > 0:
            base = Path(state.base_model or config.model)
            reference = load_model(base, dtype=config.dtype, device=config.device).eval()
            reference.requires_grad_(False)
        trainer = cls(
            config=config,
            state=state,
            source=Path(source),
            model=model,
            optimizer=optimizer,
            reference=reference,
            store=store_module.Store(config.store),
            metrics=metrics_module.MetricsWriter(
                config.run_dir,
                resume_step=state.step,
                title=f"{config.job}: reward per training step",
            ),
            publishers=list(publishers) if publishers is not None else default_publishers(config),
            resumed_from=last,
            log=log,
        )
        trainer.remarked = trainer.reconcile()
        return trainer

    def close(self) -> None:
        self.metrics.close()
        self.store.close()

    # -- restart -------------------------------------------------------------------

    def reconcile(self) -> int:
        """Mark trained in the store every rollout the checkpoint says was trained."""
        by_step: dict[int, list[str]] = {}
        for rollout_id, step in self.state.trained.items():
            rollout = self.store.rollout(rollout_id)
            if rollout is not None and rollout.trained_at is None:
                by_step.setdefault(step, []).append(rollout_id)
        for step, ids in sorted(by_step.items()):
            self.store.mark_trained(ids, str(checkpoint.path_for(self.config.run_dir, step)))
        remarked = sum(len(ids) for ids in by_step.values())
        if remarked:
            self.log(
                f"openforge train: re-marked {remarked} rollouts trained (from the checkpoint)"
            )
        return remarked

    # -- the loop ------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None) -> int:
        """Train until ``steps`` is reached, ``stop`` is set or groups run out; steps trained."""
        stop = stop or threading.Event()
        if self.resumed_from is not None and self.publishers:
            self._publish(self.resumed_from, self.state.policy_version)
        trained = 0
        while not stop.is_set():
            if self.config.steps is not None and self.state.step >= self.config.steps:
                break
            selection = self.wait_for_groups(stop)
            if selection.empty_batch:
                self.skip_step(selection.empty_batch)
                trained += 1
                continue
            if not selection.groups:
                break
            if stop.is_set() and not selection.full:
                self.log(
                    "openforge train: stopped while waiting for groups; "
                    "the partial step is not trained"
                )
                break
            self.train_step(selection)
            trained += 1
        return trained

    def wait_for_groups(self, stop: threading.Event) -> Selection:
        """Poll the store until ``groups_per_step`` groups are ready, time runs out or stop."""
        deadline = (
            math.inf
            if self.config.wait_for_groups is None
            else time.monotonic() + self.config.wait_for_groups
        )
        while True:
            selection = select_groups(
                self.store, self.config, state=self.state, limit=self.config.groups_per_step
            )
            self._skip(selection)
            enough = (
                len(selection.groups) >= self.config.groups_per_step
                or (selection.settled and bool(selection.groups))
                or bool(selection.empty_batch)
            )
            selection.full = enough
            if enough or time.monotonic() >= deadline or stop.is_set():
                if not selection.groups and not selection.empty_batch and not stop.is_set():
                    self.log(
                        f"openforge train: no ready groups after {self.config.wait_for_groups} s"
                    )
                return selection
            stop.wait(min(self.config.poll_interval, max(0.0, deadline - time.monotonic())))

    def _skip(self, selection: Selection) -> None:
        for rollout_id, reason in selection.skipped.items():
            if rollout_id not in self.state.skipped:
                self.state.skipped[rollout_id] = reason
                self.log(f"openforge train: skipping rollout {rollout_id}: {reason}")
        self.state.skipped_tasks.update(selection.closed)

    def train_step(self, selection: Selection) -> dict[str, float]:
        """Batch, update, checkpoint, mark, publish and record one step; its metrics."""
        started = time.monotonic()
        groups = selection.groups
        batch = self.make_batch(groups)
        update = self.update(batch)
        rollout_ids = [rollout.rollout_id for group in groups for rollout in group.rollouts]
        step = self.state.step + 1
        state = dataclasses.replace(
            self.state,
            step=step,
            policy_version=self.state.policy_version + 1,
            trained={**self.state.trained, **dict.fromkeys(rollout_ids, step)},
            trained_tasks={**self.state.trained_tasks, **{g.task_id: step for g in groups}},
            skipped=dict(self.state.skipped),
            skipped_tasks=dict(self.state.skipped_tasks),
        )
        path, checkpoint_seconds = self._save(state)
        self.store.mark_trained(rollout_ids, str(path))
        published = self._publish(path, state.policy_version)
        record = self._record(groups, batch, update=update, published=published)
        record.update(
            checkpoint_seconds=checkpoint_seconds, step_seconds=time.monotonic() - started
        )
        self.metrics.write(record)
        self.log(_summary(record))
        return record

    def skip_step(self, batch: str) -> dict[str, float]:
        """The step of a batch with nothing to train: each of its groups was skipped whole
        (too small, stale; no rollout had a reward, say). It gets its step all the same,
        the weights unchanged under the next policy version, checkpointed and published,
        so that a producer waiting for a step per batch (``openforge run``'s iterations)
        goes on; its metrics say it trained nothing."""
        started = time.monotonic()
        state = dataclasses.replace(
            self.state,
            step=self.state.step + 1,
            policy_version=self.state.policy_version + 1,
            skipped=dict(self.state.skipped),
            skipped_tasks=dict(self.state.skipped_tasks),
            empty_batches={**self.state.empty_batches, batch: self.state.step + 1},
        )
        why = [
            reason for key, reason in sorted(state.skipped_tasks.items()) if _batch_of(key) == batch
        ]
        path, checkpoint_seconds = self._save(state)
        published = self._publish(path, state.policy_version)
        record: dict[str, float] = {
            "step": float(state.step),
            "policy_version": float(state.policy_version),
            "groups": 0.0,
            "rollouts": 0.0,
            "rows": 0.0,
            "groups_skipped": float(len(why)),
            **self._skips_and_publishing(published),
            "checkpoint_seconds": checkpoint_seconds,
            "step_seconds": time.monotonic() - started,
        }
        self.metrics.write(record)
        self.log(
            f"step {state.step} (policy v{state.policy_version}): nothing to train in batch "
            f"{batch!r}, every group skipped ({'; '.join(why)}); the weights are unchanged, "
            f"published {int(record['published_ok'])}/{len(published)}"
        )
        return record

    def _skips_and_publishing(self, published: Sequence[publish.PublishResult]) -> dict[str, float]:
        """The metrics every step has, trained or not: rollouts skipped so far, and where
        its checkpoint was published."""
        return {
            "skipped_total": float(len(self.state.skipped)),
            "skipped_stale_total": float(
                sum(reason.startswith("stale") for reason in self.state.skipped.values())
            ),
            "published_ok": float(sum(result.ok for result in published)),
            "published_failed": float(sum(not result.ok for result in published)),
        }

    def _save(self, state: checkpoint.TrainerState) -> tuple[Path, float]:
        """Checkpoint ``state`` with the current weights, and make it the trainer's; the
        checkpoint and the seconds it took."""
        saved_at = time.monotonic()
        path = checkpoint.save(
            self.config.run_dir,
            state=state,
            model=self.model,
            optimizer=self.optimizer,
            assets_from=self.source,
            keep=self.config.keep_checkpoints,
        )
        self.source = path
        self.state = state
        return path, time.monotonic() - saved_at

    def make_batch(self, groups: Sequence[Group]) -> DataProto:
        """The step's veRL batch, with ``advantages`` and ``old_log_probs`` added."""
        rows = [row for group in groups for row in group.rows]
        batch = rl_batch.build(rows, pad_token_id=self.pad_token_id)
        order, row_rollout = rl_batch.rollout_index(batch)
        rewards = {r.rollout_id: r.reward for group in groups for r in group.rollouts}
        tasks = {r.rollout_id: f"{r.job}/{r.task_id}" for group in groups for r in group.rollouts}
        advantages, per_rollout = algorithms.row_advantages(
            self.config.adv_estimator,
            scores=torch.tensor([rewards[rid] for rid in order], dtype=torch.float32),
            groups=algorithms.group_ids([tasks[rid] for rid in order]),
            row_rollout=row_rollout,
            response_mask=batch.batch["response_mask"],
            norm_by_std=self.config.norm_adv_by_std,
        )
        batch.batch["advantages"] = advantages
        batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]
        batch.meta_info["rollout_advantages"] = per_rollout.tolist()
        return batch

    def update(self, batch: DataProto) -> dict[str, float]:
        """One optimiser step on ``batch`` (micro-batched); the update's metrics."""
        started = time.monotonic()
        tensors = batch.batch
        mask = tensors["response_mask"]
        total_tokens = int(mask.sum())
        rows = len(batch)
        width = int(batch.meta_info["prompt_width"])
        attention = tensors["attention_mask"]
        prompt_lengths = attention[:, :width].sum(-1).tolist()
        response_lengths = attention[:, width:].sum(-1).tolist()
        sums: dict[str, float] = {}
        self.optimizer.zero_grad(set_to_none=True)
        # the step's own log-probs before it, for the step guard (update_guard)
        before = (
            torch.zeros(tensors["responses"].shape, dtype=torch.float32)
            if self.config.update_backtracks
            else None
        )
        parts = micro_batches(
            prompt_lengths, response_lengths, budget=self.config.micro_batch_tokens
        )
        for number, rows_in in enumerate(parts):
            part = _slice(
                tensors,
                rows_in,
                width=width,
                prompt_lengths=prompt_lengths,
                response_lengths=response_lengths,
                device=self.config.device,
            )
            part_sums, log_prob = self._micro_step(
                part, total_tokens=total_tokens, rows=rows, first=number == 0
            )
            if before is not None:
                before[torch.tensor(rows_in), : log_prob.shape[1]] = log_prob.cpu()
            for key, value in part_sums.items():
                sums[key] = sums.get(key, 0.0) + value
        parameters = [p for p in self.model.parameters() if p.grad is not None]
        grad_norm = float(torch.nn.utils.clip_grad_norm_(parameters, self.config.max_grad_norm))
        finite = math.isfinite(grad_norm)
        guarded: dict[str, float] = {}
        if finite:
            start = [p.detach().clone() for p in parameters] if before is not None else []
            self.optimizer.step()
            if before is not None and start:
                guarded = self._guard(batch, before, parameters=parameters, start=start)
        self.optimizer.zero_grad(set_to_none=True)
        seconds = time.monotonic() - started
        processed = int(attention.sum())
        tokens = max(total_tokens, 1)
        result = {
            "loss": sums.get("loss", 0.0),
            "pg_loss": sums.get("pg_loss", 0.0),
            "pg_clipfrac": sums.get("pg_clipfrac", 0.0) / tokens,
            "pg_clipfrac_lower": sums.get("pg_clipfrac_lower", 0.0) / tokens,
            "ppo_kl": sums.get("ppo_kl", 0.0) / tokens,
            "entropy": sums.get("entropy", 0.0) / tokens,
            "grad_norm": grad_norm,
            "update_skipped": float(not finite),
            "logprob_diff_mean": sums.get("logprob_diff_mean", 0.0),
            "logprob_diff_max": sums.get("logprob_diff_max", 0.0),
            "micro_batches": float(len(parts)),
            "tokens": float(processed),
            "response_tokens": float(total_tokens),
            "update_seconds": seconds,
            "tokens_per_s": processed / seconds if seconds > 0 else 0.0,
        }
        if self.reference is not None:
            result["kl"] = sums.get("kl", 0.0) / tokens
        result.update(guarded)
        return result

    def _guard(
        self,
        batch: DataProto,
        before: torch.Tensor,
        *,
        parameters: Sequence[torch.nn.Parameter],
        start: Sequence[torch.Tensor],
    ) -> dict[str, float]:
        """Halve the step just taken while it is unacceptable on its batch (update_guard)."""
        mask = batch.batch["response_mask"]
        advantages = batch.batch["advantages"]
        scale = 1.0
        size = update_guard.measure(
            before, self.current_log_probs(batch), mask=mask, advantages=advantages
        )
        backtracks = 0
        for next_scale in update_guard.scales(self.config.update_backtracks):
            if size.acceptable(self.config.max_update_kl):
                break
            update_guard.interpolate(parameters, start, ratio=next_scale / scale)
            scale, backtracks = next_scale, backtracks + 1
            if scale == 0.0:
                size = update_guard.StepSize(positive_shift=0.0, kl=0.0)
                break
            size = update_guard.measure(
                before, self.current_log_probs(batch), mask=mask, advantages=advantages
            )
        return {
            "update_scale": scale,
            "update_backtracks": float(backtracks),
            "update_positive_shift": size.positive_shift,
            "update_kl": size.kl,
        }

    def _micro_step(
        self, part: dict[str, torch.Tensor], *, total_tokens: int, rows: int, first: bool
    ) -> tuple[dict[str, float], torch.Tensor]:
        """Backpropagate one micro-batch's loss; its metric sums and its log-probs [b, r]."""
        mask = part["response_mask"]
        tokens = float(mask.sum())
        response_logits = forward_response_logits(self.model, part)
        log_prob = algorithms.token_log_probs(response_logits, part["responses"])
        sums: dict[str, float] = {}
        if first:
            valid = mask.bool()
            diff = (log_prob.detach() - part["old_log_probs"]).abs()[valid]
            sums["logprob_diff_mean"] = float(diff.mean()) if diff.numel() else 0.0
            sums["logprob_diff_max"] = float(diff.max()) if diff.numel() else 0.0
        scale = {"batch_num_tokens": total_tokens, "global_batch_size": rows}
        pg_loss, pg_metrics = algorithms.policy_loss(
            self.actor,
            old_log_prob=part["old_log_probs"],
            log_prob=log_prob,
            advantages=part["advantages"],
            response_mask=mask,
            **scale,
        )
        loss = pg_loss
        with torch.set_grad_enabled(self.config.entropy_coeff > 0):
            token_entropy = algorithms.entropy(
                response_logits if self.config.entropy_coeff > 0 else response_logits.detach()
            )
        if self.config.entropy_coeff > 0:
            bonus = algorithms.aggregate(self.actor, token_entropy, mask=mask, **scale)
            loss = loss - self.config.entropy_coeff * bonus
        if self.reference is not None:
            with torch.no_grad():
                reference_logits = forward_response_logits(self.reference, part)
                reference = algorithms.token_log_probs(reference_logits, part["responses"])
            kl = algorithms.kl_penalty(log_prob, reference, kind=self.config.kl_type)
            loss = loss + self.config.kl_coef * algorithms.aggregate(
                self.actor, kl, mask=mask, **scale
            )
            sums["kl"] = float((kl.detach() * mask).sum())
        loss.backward()  # type: ignore[no-untyped-call]
        sums.update(
            loss=float(loss.detach()),
            pg_loss=float(pg_loss.detach()),
            entropy=float((token_entropy.detach() * mask).sum()),
            **{key: value * tokens for key, value in pg_metrics.items()},
        )
        return sums, log_prob.detach()

    @torch.no_grad()
    def current_log_probs(self, batch: DataProto) -> torch.Tensor:
        """The current policy's log-probs of the batch's responses, [B, R] (0 on padding)."""
        tensors = batch.batch
        width = int(batch.meta_info["prompt_width"])
        attention = tensors["attention_mask"]
        prompt_lengths = attention[:, :width].sum(-1).tolist()
        response_lengths = attention[:, width:].sum(-1).tolist()
        result = torch.zeros(tensors["responses"].shape, dtype=torch.float32)
        for rows in micro_batches(
            prompt_lengths, response_lengths, budget=self.config.micro_batch_tokens
        ):
            part = _slice(
                tensors,
                rows,
                width=width,
                prompt_lengths=prompt_lengths,
                response_lengths=response_lengths,
                device=self.config.device,
            )
            logits = forward_response_logits(self.model, part)
            log_prob = algorithms.token_log_probs(logits, part["responses"])
            result[torch.tensor(rows), : log_prob.shape[1]] = log_prob.cpu()
        padding: torch.Tensor = tensors["attention_mask"][:, width:]
        return result * padding

    # -- publishing and records ------------------------------------------------------

    def _publish(self, path: Path, version: int) -> list[publish.PublishResult]:
        results = publish.publish_all(self.publishers, path, policy_version=version)
        for result in results:
            if not result.ok:
                self.log(f"openforge train: publish to {result.url} failed: {result.detail}")
        return results

    def _record(
        self,
        groups: Sequence[Group],
        batch: DataProto,
        *,
        update: dict[str, float],
        published: Sequence[publish.PublishResult],
    ) -> dict[str, float]:
        rewards = np.array([r.reward for g in groups for r in g.rollouts], dtype=np.float64)
        staleness = [g.staleness for g in groups]
        record: dict[str, float] = {
            "step": float(self.state.step),
            "policy_version": float(self.state.policy_version),
            "groups": float(len(groups)),
            "rollouts": float(rewards.size),
            "rows": float(len(batch)),
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std()),
            "reward_min": float(rewards.min()),
            "reward_max": float(rewards.max()),
            "pass_rate": float((rewards >= self.config.pass_threshold).mean()),
            "advantage_abs_mean": float(np.abs(batch.meta_info["rollout_advantages"]).mean()),
            "staleness_mean": float(np.mean(staleness)),
            "staleness_max": float(max(staleness)),
            **self._skips_and_publishing(published),
        }
        record.update(update)
        record["step"] = float(self.state.step)
        return record


def _slice(
    tensors: Any,
    rows: list[int],
    *,
    width: int,
    prompt_lengths: Sequence[int],
    response_lengths: Sequence[int],
    device: str,
) -> dict[str, Any]:
    """The micro-batch's rows, trimmed to their own widest prompt and response."""
    index = torch.tensor(rows, dtype=torch.long)
    left = width - max(int(prompt_lengths[i]) for i in rows)
    right = max(int(response_lengths[i]) for i in rows)
    columns = slice(left, width + right)
    part: dict[str, Any] = {
        key: tensors[key][index][:, columns].to(device)
        for key in ("input_ids", "attention_mask", "position_ids")
    }
    for key in ("responses", "response_mask", "old_log_probs", "advantages"):
        if key in tensors.keys():  # noqa: SIM118 (TensorDict refuses `in`)
            part[key] = tensors[key][index][:, :right].to(device)
    part["response_start"] = width - left - 1  # logits at t predict token t+1
    return part


def forward_response_logits(model: Any, part: dict[str, Any]) -> torch.Tensor:
    """A full-sequence forward pass; the logits that predict each response token [b, R, V]."""
    logits: torch.Tensor = model(
        input_ids=part["input_ids"],
        attention_mask=part["attention_mask"],
        position_ids=part["position_ids"],
    ).logits
    start = part["response_start"]
    return logits[:, start : start + part["responses"].shape[1]]


def default_publishers(config: train_config.TrainConfig) -> list[publish.Publisher]:
    publishers: list[publish.Publisher] = [
        publish.ServePublisher(url, mode=config.serve_publish, timeout=config.publish_timeout)
        for url in config.serve_urls
    ]
    publishers += [
        publish.VLLMPublisher(url, timeout=config.publish_timeout) for url in config.vllm_urls
    ]
    return publishers


def _summary(record: dict[str, float]) -> str:
    kl = f" kl {record['kl']:.4f}" if "kl" in record else ""
    if record.get("update_scale", 1.0) < 1.0:
        kl += f", step x{record['update_scale']:g}"
    published = int(record["published_ok"] + record["published_failed"])
    return (
        f"step {int(record['step'])} (policy v{int(record['policy_version'])}): "
        f"{int(record['groups'])} groups, {int(record['rollouts'])} rollouts, "
        f"reward {record['reward_mean']:.3f}±{record['reward_std']:.3f}, "
        f"pass {record['pass_rate']:.0%}, loss {record['loss']:.4f}, "
        f"entropy {record['entropy']:.3f}{kl}, clip {record['pg_clipfrac']:.3f}, "
        f"grad {record['grad_norm']:.3f}, |Δlogp| {record['logprob_diff_mean']:.2e}, "
        f"{record['tokens_per_s']:.0f} tok/s, published {int(record['published_ok'])}/{published}"
    )
