"""veRL agent-loop integration: veRL's own trainer, trained on OpenForge-captured rollouts.

For GPU clusters that run veRL's PPO/GRPO trainer (FSDP or Megatron actors,
vLLM rollout servers) rather than ``openforge train``. veRL asks an agent
loop (``verl.experimental.agent_loop.AgentLoopBase``) for one
``AgentLoopOutput`` per dataset sample; :class:`OpenForgeAgentLoop` answers
with the rollout a real harness produced through the OpenForge sidecar:
it waits until the sample's rollout is complete in the store, then converts
its captured row (:func:`to_output`): prompt ids, response ids (model and
tool tokens), response mask, the captured log-probs (veRL's
``rollout_log_probs``) and the reward.

Register it in veRL's agent-loop config (``agent_loop_config_path``)::

    - name: openforge
      _target_: openforge_trainer.training.verl_agent_loop.OpenForgeAgentLoop
      store: /data/openforge/store.db
      job: my-job

and give each dataset row ``agent_name: openforge`` and
``extra_info.openforge_rollout_id``. Something must start that rollout's
harness pod with the sidecar pointed at veRL's vLLM servers (the operator's
RolloutJob, or ``openforge run``); this loop only waits for its result.

A row with images (a multimodal harness, e.g. the GUI browser agent) also
gives veRL ``multi_modal_data={"images": [PIL images]}``, decoded from the
captured PNG bytes, one per image placeholder in its tokens, for veRL's
processor to turn into ``pixel_values``/``image_grid_thw``. Such a row's
response is never cut (a cut would drop placeholders but not their images):
a longer one is refused. For a VL model the placeholders must be the model's
own image tokens (Qwen2.5-VL: ``<|vision_start|><|image_pad|><|vision_end|>``);
the sidecar's template rendering writes ``<image>`` today (one token in the
tiny tokenizer), so only the trainer side of that path is tested here.

What needs a GPU and was not run here: veRL's trainer itself, its vLLM
servers and the harness pods; and veRL keeps one sequence per sample, so a
rollout whose history was rewritten (several segments) contributes its last
segment only (the others are counted in ``extra_fields``). What is tested on
CPU: the conversion, and this class constructed by veRL's own base class
with the tiny tokenizer and run against a real store.
"""

from __future__ import annotations

import asyncio
import io
import time
from pathlib import Path
from typing import Any

from PIL import Image
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from openforge_trainer.collection import store as store_module
from openforge_trainer.trajectories import export, request_images

ROLLOUT_KEY = "openforge_rollout_id"


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
        multi_modal_data={"images": [decode_image(url) for url in row.images]} if row.images else None,
        reward_score=row.reward if row.has_reward else None,
        num_turns=2 * row.num_turns,  # veRL counts user/tool and assistant turns
        metrics=AgentLoopMetrics(),
        extra_fields={
            ROLLOUT_KEY: row.rollout_id,
            "openforge_policy_version": row.policy_version,
            "openforge_segments": segments,
            "openforge_truncated_tokens": len(row.response_ids) - len(row.response_ids[:keep]),
        },
    )


def decode_image(url: str) -> Image.Image:
    """A captured image as veRL's processors take it: a PIL image in RGB."""
    try:
        with Image.open(io.BytesIO(request_images.image_bytes(url))) as image:
            return image.convert("RGB")
    except (request_images.ImageError, OSError) as exc:
        raise RolloutUnavailable(f"an image of the rollout cannot be decoded: {exc}") from exc


def rollout_id_of(sample: dict[str, Any]) -> str:
    """The rollout id a veRL dataset sample names (top level or in ``extra_info``)."""
    extra = sample.get("extra_info") or {}
    value = sample.get(ROLLOUT_KEY) or (extra.get(ROLLOUT_KEY) if isinstance(extra, dict) else None)
    if not value:
        raise RolloutUnavailable(
            f"dataset sample has no {ROLLOUT_KEY} (nor extra_info.{ROLLOUT_KEY})"
        )
    return str(value)


def captured_output(
    db: store_module.Store,
    rollout_id: str,
    *,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
    job: str = "",
) -> AgentLoopOutput | None:
    """The rollout's output if it is complete in the store, else None."""
    rollout = db.rollout(rollout_id)
    if rollout is None or not rollout.complete:
        return None
    if job and rollout.job != job:
        raise RolloutUnavailable(
            f"rollout {rollout_id!r} belongs to job {rollout.job!r}, not {job!r}"
        )
    rows, _ = export.rollout_rows(rollout, db.calls(rollout_id))
    if not rows:
        raise RolloutUnavailable(f"rollout {rollout_id!r} has no token-level calls")
    return to_output(
        rows[-1],
        max_prompt_length=max_prompt_length,
        max_response_length=max_response_length,
        segments=len(rows),
    )


@register("openforge")
class OpenForgeAgentLoop(AgentLoopBase):
    """Returns the OpenForge-captured rollout of each sample (waits until it is complete)."""

    def __init__(
        self,
        *args: Any,
        store: str,
        job: str = "",
        poll_interval: float = 1.0,
        timeout: float = 3600.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.store_path = Path(store)
        self.job = job
        self.poll_interval = poll_interval
        self.timeout = timeout

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        del sampling_params  # the harness's requests carry their own, through the sidecar
        rollout_id = rollout_id_of(kwargs)
        deadline = time.monotonic() + self.timeout
        while True:
            output = await asyncio.to_thread(self._read, rollout_id)
            if output is not None:
                return output
            if time.monotonic() >= deadline:
                raise RolloutUnavailable(
                    f"rollout {rollout_id!r} not complete in {self.store_path} after {self.timeout} s"
                )
            await asyncio.sleep(self.poll_interval)

    def _read(self, rollout_id: str) -> AgentLoopOutput | None:
        with store_module.Store(self.store_path) as db:
            return captured_output(
                db,
                rollout_id,
                max_prompt_length=self.rollout_config.get("prompt_length"),
                max_response_length=self.rollout_config.get("response_length"),
                job=self.job,
            )
