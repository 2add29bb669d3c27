"""veRL agent-loop integration: veRL's own trainer, trained on OpenForge-captured rollouts.

For GPU clusters that run veRL's PPO/GRPO trainer (FSDP or Megatron actors,
vLLM rollout servers) rather than ``openforge train``. veRL asks an agent
loop (``verl.experimental.agent_loop.AgentLoopBase``) for the outputs of one
session of a dataset sample: it runs ``actor_rollout_ref.rollout.n`` sessions
per sample and passes each its ``session_id``. :class:`OpenForgeAgentLoop`
answers session *k* with the rollout a real harness produced through the
OpenForge sidecar for sample index *k* of the sample's task, so a GRPO group
of n is n distinct rollouts of one task. It waits until that rollout is
complete in the store, then converts its captured rows (:func:`to_output`):
prompt ids, response ids (model and tool tokens), response mask, the captured
log-probs (veRL's ``rollout_log_probs``), the reward, and the policy versions
that sampled it as veRL's ``min_global_steps``/``max_global_steps`` (veRL's
weight version after step s is s, as OpenForge's policy version is).

Register it in veRL's agent-loop config (``agent_loop_config_path``)::

    - name: openforge
      _target_: openforge_trainer.training.verl_agent_loop.OpenForgeAgentLoop
      store: /data/openforge/store.db
      job: my-job

The class is deliberately not decorated with veRL's ``@register``: that
decorator runs when hydra first imports this module and would replace the
entry above (with its ``store``) by a bare ``_target_``, so every sample after
the first would fail to construct.

Each dataset row gives ``agent_name: openforge`` and, in ``extra_info`` (or
at top level), either ``openforge_task_id`` (and ``openforge_batch``, the
``openforge.dev/batch`` label its rollouts were started with, where
``{iteration}`` stands for veRL's step - 1): session *k* is the latest attempt
of sample *k* of that task in that batch; or
``openforge_rollout_ids``, one rollout id per session. A RolloutJob's own rollouts
carry no batch label and number their samples on across steps (a job of
``samplesPerTask`` = n x E trains E epochs of its tasks): a row with
``openforge_sample_stride`` n and ``openforge_steps_per_epoch`` S makes session *k*
of step *s* sample ``((s - 1) // S) * n + k``. Something must start
those rollouts' harness pods with the sidecar pointed at the policy's servers
(the operator's RolloutJob, or ``openforge run``); this loop only waits for
their results. With veRL's own vLLM servers as the policy's (``engines_file``),
the loop first writes where they are for that runner (:mod:`verl_engines`).

A rollout whose history was rewritten (several segments) gives one output per
segment, in order, each with the rollout's reward: veRL stores every output
of a session as its own sample (keys ``{uid}_{session}_{i}``), so no segment's
tokens are dropped; the group's advantage is still computed per task.

Only completed calls become outputs, by the rule ``openforge train`` and
``trajectories export`` apply (the rows come from ``export.rollout_rows``, see
:mod:`outcome`): a call the harness hung up on mid-stream, a refused or an
errored one gives veRL no tokens, and a rollout with no completed
token-level call is refused with the failed calls counted by kind.

A row with images (a multimodal harness, e.g. the GUI browser agent) also
gives veRL ``multi_modal_data={"images": [PIL images]}``, decoded from the
captured PNG bytes, one per image placeholder in its tokens, for veRL's
processor to turn into ``pixel_values``/``image_grid_thw``. Such a row's
response is never cut (a cut would drop placeholders but not their images):
a longer one is refused. For a VL model the placeholders must be the model's
own image tokens (Qwen2.5-VL: ``<|vision_start|><|image_pad|><|vision_end|>``);
the sidecar's template rendering writes ``<image>`` today (one token in the
tiny tokenizer), so only the trainer side of that path is tested here.

What is tested on CPU: the conversion, this class constructed by veRL's own
base class and run against a real store, session by session, and veRL's Ray
trainer driving it (:mod:`verl_launch`, 2 FSDP2 workers over gloo).
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import time
from pathlib import Path
from typing import Any

from openforge import policy_servers
from PIL import Image
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
)

from openforge_trainer.collection import store as store_module
from openforge_trainer.training import verl_engines
from openforge_trainer.trajectories import export, outcome, request_images

ROLLOUT_KEY = "openforge_rollout_id"  # in each output's extra_fields
ROLLOUT_IDS_KEY = "openforge_rollout_ids"  # a sample's rollouts, one per session
TASK_KEY = "openforge_task_id"
BATCH_KEY = "openforge_batch"
STRIDE_KEY = "openforge_sample_stride"  # a job's samples numbered on across epochs:
STEPS_PER_EPOCH_KEY = "openforge_steps_per_epoch"  # epoch e's session k is sample e*n + k


class RolloutUnavailable(RuntimeError):
    """The sample's rollout cannot become a veRL output (names the rollout and why)."""


def to_output(
    row: export.Row,
    *,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
    segments: int = 1,
) -> AgentLoopOutput:
    """One captured row as veRL's agent-loop output.

    A response longer than ``max_response_length`` is cut (its kept prefix
    stays token-exact); a longer prompt cannot be cut without changing what
    the log-probs were computed on, so it is refused.
    """
    if max_prompt_length is not None and len(row.prompt_ids) > max_prompt_length:
        raise RolloutUnavailable(
            f"rollout {row.rollout_id!r}: prompt has {len(row.prompt_ids)} tokens, "
            f"over veRL's prompt_length {max_prompt_length}"
        )
    keep = len(row.response_ids) if max_response_length is None else max_response_length
    if row.images and keep < len(row.response_ids):
        raise RolloutUnavailable(
            f"rollout {row.rollout_id!r}: response has {len(row.response_ids)} tokens, over veRL's "
            f"response_length {keep}, and cutting it would separate images from their placeholders"
        )
    return AgentLoopOutput(
        prompt_ids=list(row.prompt_ids),
        response_ids=row.response_ids[:keep],
        response_mask=row.response_mask[:keep],
        response_logprobs=row.response_logprobs[:keep],
        multi_modal_data={"images": [decode_image(url) for url in row.images]}
        if row.images
        else None,
        reward_score=row.reward if row.has_reward else None,
        num_turns=2 * row.num_turns,  # veRL counts user/tool and assistant turns
        metrics=AgentLoopMetrics(),
        extra_fields={
            ROLLOUT_KEY: row.rollout_id,
            "openforge_policy_version": row.policy_version,
            "openforge_segments": segments,
            "openforge_truncated_tokens": len(row.response_ids) - len(row.response_ids[:keep]),
            # veRL's weight versions this output was sampled across (its staleness metrics)
            "min_global_steps": min(row.policy_versions, default=row.policy_version),
            "max_global_steps": max(row.policy_versions, default=row.policy_version),
        },
    )


def decode_image(url: str) -> Image.Image:
    """A captured image as veRL's processors take it: a PIL image in RGB."""
    try:
        with Image.open(io.BytesIO(request_images.image_bytes(url))) as image:
            return image.convert("RGB")
    except (request_images.ImageError, OSError) as exc:
        raise RolloutUnavailable(f"an image of the rollout cannot be decoded: {exc}") from exc


@dataclasses.dataclass(frozen=True)
class SessionRef:
    """Which rollout one session of a dataset sample is: by id, or by task/batch/sample."""

    rollout_id: str = ""
    task_id: str = ""
    batch: str = ""
    sample_index: int = 0

    def describe(self) -> str:
        if self.rollout_id:
            return f"rollout {self.rollout_id!r}"
        return f"sample {self.sample_index} of task {self.task_id!r} in batch {self.batch!r}"


def _field(sample: dict[str, Any], key: str) -> Any:
    extra = sample.get("extra_info") or {}
    value = sample.get(key)
    if value is None and isinstance(extra, dict):
        value = extra.get(key)
    return value


def batch_label(template: str, global_steps: int | None) -> str:
    """The batch a step's rollouts carry: ``template`` with ``{iteration}`` = veRL step - 1."""
    if "{" not in template:
        return template
    if global_steps is None:
        raise RolloutUnavailable(
            f"{BATCH_KEY} {template!r} names the iteration, and veRL gave no global_steps"
        )
    try:
        return template.format(iteration=int(global_steps) - 1)
    except (KeyError, IndexError, ValueError) as exc:
        raise RolloutUnavailable(
            f"{BATCH_KEY} {template!r}: not a template of {{iteration}} ({exc})"
        ) from exc


def _sample_base(sample: dict[str, Any], global_steps: int | None) -> int:
    """The sample index session 0 of veRL's step ``global_steps`` is: 0, or with
    ``STRIDE_KEY`` n and ``STEPS_PER_EPOCH_KEY`` S, ``((step - 1) // S) * n``."""
    if _field(sample, STRIDE_KEY) is None:
        return 0
    stride, per_epoch = (_positive(sample, key) for key in (STRIDE_KEY, STEPS_PER_EPOCH_KEY))
    if global_steps is None:
        raise RolloutUnavailable(f"{STRIDE_KEY} needs veRL's global_steps, and veRL gave none")
    return (int(global_steps) - 1) // per_epoch * stride


def _positive(sample: dict[str, Any], key: str) -> int:
    value = _field(sample, key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise RolloutUnavailable(f"{key} must be an integer >= 1, not {value!r}")
    return value


def session_ref(
    sample: dict[str, Any], session_id: int, *, global_steps: int | None = None
) -> SessionRef:
    """The rollout session ``session_id`` of a veRL dataset sample names.

    Session *k* is sample index *k*: a group of n sessions is n distinct
    rollouts, never one rollout n times. A batch label with ``{iteration}``
    names the rollouts of veRL's step ``global_steps`` (iteration = step - 1).
    """
    ids = _field(sample, ROLLOUT_IDS_KEY)
    if ids is not None:
        ids = list(ids)
        if not 0 <= session_id < len(ids):
            raise RolloutUnavailable(
                f"dataset sample: {ROLLOUT_IDS_KEY} names {len(ids)} rollouts, no rollout for "
                f"session {session_id} (set it to rollout.n ids)"
            )
        return SessionRef(rollout_id=str(ids[session_id]))
    task = _field(sample, TASK_KEY)
    if task:
        batch = _field(sample, BATCH_KEY)
        return SessionRef(
            task_id=str(task),
            batch=batch_label("" if batch is None else str(batch), global_steps),
            sample_index=_sample_base(sample, global_steps) + session_id,
        )
    single = _field(sample, ROLLOUT_KEY)
    if single:
        if session_id != 0:
            raise RolloutUnavailable(
                f"dataset sample names one rollout ({ROLLOUT_KEY}={single!r}) but veRL asked for "
                f"session {session_id}: a group needs one rollout per session; give "
                f"{TASK_KEY} (and {BATCH_KEY}) or {ROLLOUT_IDS_KEY}"
            )
        return SessionRef(rollout_id=str(single))
    raise RolloutUnavailable(
        f"dataset sample has none of {TASK_KEY}, {ROLLOUT_IDS_KEY}, {ROLLOUT_KEY} "
        "(top level or in extra_info)"
    )


def find_rollout(
    db: store_module.Store, ref: SessionRef, *, job: str
) -> store_module.Rollout | None:
    """The session's rollout: the one named, or the latest attempt of its task, batch and sample."""
    if ref.rollout_id:
        return db.rollout(ref.rollout_id)
    if not job:
        raise RolloutUnavailable(f"finding {ref.describe()} needs the agent loop's job")
    attempts = [
        r
        for r in db.rollouts(job)
        if r.task_id == ref.task_id and r.sample_index == ref.sample_index and r.batch == ref.batch
    ]
    # the order the trainer supersedes attempts in (training.loop._latest_attempts)
    return max(attempts, key=lambda r: (r.attempt, r.rollout_id), default=None)


def captured_outputs(
    db: store_module.Store,
    ref: SessionRef,
    *,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
    job: str = "",
) -> list[AgentLoopOutput] | None:
    """The session's outputs, one per segment, if its rollout is complete in the store, else
    None (also while its latest attempt is one its producer tries again: the next one is
    the session's)."""
    rollout = find_rollout(db, ref, job=job)
    if rollout is None or not rollout.complete or rollout.retried:
        return None
    if job and rollout.job != job:
        raise RolloutUnavailable(
            f"rollout {rollout.rollout_id!r} belongs to job {rollout.job!r}, not {job!r}"
        )
    rows, stats = export.rollout_rows(rollout, db.calls(rollout.rollout_id))
    if not rows:
        raise RolloutUnavailable(
            f"rollout {rollout.rollout_id!r} has no completed token-level calls"
            + outcome.not_trained(stats.failures())
        )
    return [
        to_output(
            row,
            max_prompt_length=max_prompt_length,
            max_response_length=max_response_length,
            segments=len(rows),
        )
        for row in rows
    ]


class OpenForgeAgentLoop(AgentLoopBase):
    """Returns the OpenForge-captured rollout of each session (waits until it is complete)."""

    def __init__(
        self,
        *args: Any,
        store: str,
        job: str = "",
        poll_interval: float = 1.0,
        timeout: float = 3600.0,
        engines_file: str = "",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.store_path = Path(store)
        self.job = job
        self.poll_interval = poll_interval
        self.timeout = timeout
        # with veRL's own vLLM servers: where the step's servers are written for the runner
        self.engines_file = Path(engines_file) if engines_file else None

    # veRL's base class declares one output; its v1 (TransferQueue) worker, the default
    # trainer, takes a list and stores each output as its own sample
    # (AgentLoopWorkerTQ._agent_loop_postprocess)
    async def run(  # type: ignore[override]
        self, sampling_params: dict[str, Any], **kwargs: Any
    ) -> list[AgentLoopOutput]:
        del sampling_params  # the harness's requests carry their own, through the sidecar
        steps = kwargs.get("global_steps")
        ref = session_ref(
            kwargs,
            int(kwargs.get("session_id", 0)),
            global_steps=None if steps is None else int(steps),
        )
        if self.engines_file is not None:  # the servers are awake: say where they are
            if steps is None:
                raise RolloutUnavailable("announcing veRL's servers needs its global_steps")
            try:
                await verl_engines.announce(self.server_manager, self.engines_file, step=int(steps))
            except policy_servers.EnginesError as exc:
                raise RolloutUnavailable(str(exc)) from exc
        deadline = time.monotonic() + self.timeout
        while True:
            outputs = await asyncio.to_thread(self._read, ref)
            if outputs is not None:
                return outputs
            if time.monotonic() >= deadline:
                raise RolloutUnavailable(
                    f"{ref.describe()} not complete in {self.store_path} after {self.timeout} s"
                )
            await asyncio.sleep(self.poll_interval)

    def _read(self, ref: SessionRef) -> list[AgentLoopOutput] | None:
        with store_module.Store(self.store_path) as db:
            return captured_outputs(
                db,
                ref,
                max_prompt_length=self.rollout_config.get("prompt_length"),
                max_response_length=self.rollout_config.get("response_length"),
                job=self.job,
            )
