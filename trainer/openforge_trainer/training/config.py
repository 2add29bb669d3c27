"""``openforge train`` settings: one validated, documented model.

Every field says what it does and what it defaults to. :func:`load` is the
boundary: it turns keyword values (from the command line or a test) into a
:class:`TrainConfig`, and any invalid value into a :class:`ConfigError` whose
message names each field at fault and the value it was given, e.g.
``lr: Input should be greater than 0 (got -0.1)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pydantic

from openforge_trainer.training import algorithms

LossAggMode = Literal[
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
]
KlType = Literal["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"]


class ConfigError(ValueError):
    """Invalid trainer settings; the message names every field at fault."""


class TrainConfig(pydantic.BaseModel):
    """What the trainer reads, how it updates the policy, where it writes."""

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")

    # -- where -----------------------------------------------------------------
    store: Path = pydantic.Field(description="SQLite trajectory store the collector writes.")
    job: str = pydantic.Field(min_length=1, description="Job whose rollouts are trained on.")
    model: Path = pydantic.Field(
        description="Initial policy: a Hugging Face model directory (config + safetensors + "
        "tokenizer files). Ignored on resume, which loads the run's last checkpoint."
    )
    run_dir: Path = pydantic.Field(
        description="Checkpoints, metrics.jsonl, TensorBoard events and the reward curve."
    )

    # -- how much ----------------------------------------------------------------
    steps: int | None = pydantic.Field(
        default=None, ge=1, description="Stop after this many steps in total (None: run on)."
    )
    groups_per_step: int = pydantic.Field(
        default=4, ge=1, description="Complete task groups (GRPO groups) per optimiser step."
    )
    group_size: int = pydantic.Field(
        default=0,
        ge=0,
        description="Rollouts per task. A group is ready once this many of its rollouts are "
        "complete; 0: once at least two are complete and none of the task's started rollouts "
        "is still running.",
    )
    wait_for_groups: float | None = pydantic.Field(
        default=None,
        ge=0,
        description="Seconds to wait for groups_per_step ready groups; then train on the ready "
        "ones, or end the run if there are none. None: wait until stopped.",
    )
    poll_interval: float = pydantic.Field(
        default=1.0, gt=0, description="Seconds between store polls while waiting for groups."
    )

    # -- algorithm -----------------------------------------------------------------
    adv_estimator: str = pydantic.Field(
        default="grpo", description="Advantage estimator, by name (algorithms.ADVANTAGES)."
    )
    norm_adv_by_std: bool = pydantic.Field(
        default=True, description="GRPO: divide by the group's reward std (False: Dr. GRPO)."
    )
    policy_loss: str = pydantic.Field(
        default="vanilla", description="veRL policy loss, by name (clipped PPO: 'vanilla')."
    )
    clip_ratio_low: float = pydantic.Field(default=0.2, gt=0, lt=1, description="PPO clip 1-eps.")
    clip_ratio_high: float = pydantic.Field(default=0.2, gt=0, description="PPO clip 1+eps.")
    clip_ratio_c: float = pydantic.Field(
        default=3.0, gt=1, description="Dual-clip bound for negative advantages."
    )
    loss_agg_mode: LossAggMode = pydantic.Field(
        default="token-mean", description="How token losses become one number (veRL agg_loss)."
    )
    max_staleness: int = pydantic.Field(
        default=4,
        ge=0,
        description="Skip (and count) groups sampled more than this many policy versions ago.",
    )
    kl_coef: float = pydantic.Field(
        default=0.0, ge=0, description="KL-to-reference loss weight; 0 loads no reference model."
    )
    kl_type: KlType = pydantic.Field(default="low_var_kl", description="veRL kl_penalty estimator.")
    entropy_coeff: float = pydantic.Field(
        default=0.0, ge=0, description="Entropy bonus weight (entropy is reported regardless)."
    )
    pass_threshold: float = pydantic.Field(
        default=1.0, description="A rollout passes when its reward is at least this."
    )

    # -- optimiser -----------------------------------------------------------------
    lr: float = pydantic.Field(default=1e-6, gt=0, description="AdamW learning rate.")
    weight_decay: float = pydantic.Field(default=0.0, ge=0, description="AdamW weight decay.")
    adam_beta1: float = pydantic.Field(default=0.9, ge=0, lt=1, description="AdamW beta1.")
    adam_beta2: float = pydantic.Field(default=0.999, ge=0, lt=1, description="AdamW beta2.")
    adam_eps: float = pydantic.Field(default=1e-8, gt=0, description="AdamW epsilon.")
    max_grad_norm: float = pydantic.Field(
        default=1.0, gt=0, description="Clip the global gradient norm to this."
    )
    update_backtracks: int = pydantic.Field(
        default=0,
        ge=0,
        le=30,
        description="Guard each step against overshooting (update_guard): re-score the step's "
        "batch after it and, while the step lowered the mean log-likelihood of its "
        "positive-advantage tokens (or moved further than max_update_kl), halve it, at most "
        "this many times, then drop it. 0: no check (no extra forward pass or parameter copy).",
    )
    max_update_kl: float = pydantic.Field(
        default=0.0,
        ge=0,
        description="With update_backtracks: the largest token-mean KL(before || after) one "
        "step may move the policy on its own batch (k3 estimate); 0: no limit.",
    )
    micro_batch_tokens: int = pydantic.Field(
        default=16384,
        ge=1,
        description="Token budget of one forward/backward (padded rows x columns); a row "
        "longer than the budget gets a micro-batch of its own.",
    )
    seed: int = pydantic.Field(default=0, description="Seed for torch (offset by the step).")
    device: str = pydantic.Field(default="cpu", description="torch device ('cpu', 'cuda', ...).")
    dtype: Literal["float32", "bfloat16"] = pydantic.Field(
        default="float32", description="Parameter dtype; log-probs are always float32."
    )

    # -- output --------------------------------------------------------------------
    keep_checkpoints: int = pydantic.Field(
        default=3, ge=1, description="Checkpoints kept in run_dir (older ones are deleted)."
    )
    serve_urls: tuple[str, ...] = pydantic.Field(
        default=(), description="`openforge serve` base URLs to publish new weights to."
    )
    vllm_urls: tuple[str, ...] = pydantic.Field(
        default=(), description="vLLM server base URLs (dev-mode endpoints) to publish to."
    )
    publish_timeout: float = pydantic.Field(
        default=300.0, gt=0, description="Seconds one publish request may take."
    )
    serve_publish: Literal["path", "bytes"] = pydantic.Field(
        default="path",
        description="How new weights reach `openforge serve`: `path` names the checkpoint "
        "directory (the server must see the trainer's files: one machine, a shared volume); "
        "`bytes` sends the weights in the request (servers in other pods or hosts).",
    )

    @pydantic.field_validator("adv_estimator")
    @classmethod
    def _known_estimator(cls, value: str) -> str:
        if value not in algorithms.ADVANTAGES:
            raise ValueError(f"unknown estimator {value!r}; known: {sorted(algorithms.ADVANTAGES)}")
        return value

    @pydantic.field_validator("policy_loss")
    @classmethod
    def _known_loss(cls, value: str) -> str:
        if value not in algorithms.POLICY_LOSSES:
            raise ValueError(
                f"unknown policy loss {value!r}; known: {list(algorithms.POLICY_LOSSES)}"
            )
        return value

    @pydantic.field_validator("serve_urls", "vllm_urls")
    @classmethod
    def _http_urls(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http:// or https:// URL")
        return tuple(url.rstrip("/") for url in value)

    @pydantic.model_validator(mode="after")
    def _group_size_fits(self) -> TrainConfig:
        if self.group_size == 1 and self.adv_estimator == "grpo":
            raise ValueError(
                "group_size 1 gives GRPO nothing to compare (got group_size=1 with "
                "adv_estimator='grpo'); use 0 or at least 2"
            )
        return self


def load(**values: Any) -> TrainConfig:
    """Validate ``values`` into a TrainConfig, or raise ConfigError naming each bad field."""
    try:
        return TrainConfig.model_validate(values)
    except pydantic.ValidationError as exc:
        raise ConfigError(describe(exc)) from None


def describe(error: pydantic.ValidationError) -> str:
    """One line per problem: ``field: message (got value)``."""
    lines = []
    for problem in error.errors():
        field = ".".join(str(part) for part in problem["loc"])
        message = problem["msg"].removeprefix("Value error, ")
        if not field:  # a check across fields: its message quotes the values itself
            lines.append(message)
        elif problem["type"] == "missing":
            lines.append(f"{field}: required")
        else:
            lines.append(f"{field}: {message} (got {problem['input']!r})")
    return "invalid trainer settings:\n  " + "\n  ".join(lines)
