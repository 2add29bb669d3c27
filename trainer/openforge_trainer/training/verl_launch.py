"""Train on veRL's own Ray trainer (GRPO, FSDP2 workers) from rollouts OpenForge captured.

A :class:`Plan` says what to train (model, store, job, tasks, group size,
steps) and where; :func:`overrides` turns it into veRL's Hydra overrides,
pure and testable; :func:`run` writes the dataset and the agent-loop config
into the run directory, composes veRL's own ``ppo_trainer`` config with those
overrides (and the user's, checked key by key), and runs veRL's
``main_ppo`` in this process: a local Ray cluster, veRL's TaskRunner, its
FSDP2 actor workers, TransferQueue, and our agent loop
(:class:`~openforge_trainer.training.verl_agent_loop.OpenForgeAgentLoop`),
which gives veRL session *k* of a task as sample *k* of that task from the
store.

Each dataset row is one task; veRL runs ``rollout.n`` sessions of it, so a
GRPO group is the task's n samples. The rollouts of veRL step *s* are those
whose batch label is ``batch.format(iteration=s - 1)`` (default
``"{iteration}"``; a fixed label without ``{iteration}`` gives every step the
same rollouts, which only a test wants). Without a label (``batch=""``) the
rollouts are a RolloutJob's own, as the operator's pods make them: step *s*
takes ``groups_per_step`` tasks in order, and epoch *e* (every task once) takes
samples ``e * group_size`` on, so a job of ``samplesPerTask`` = n x E trains E
epochs of its tasks, each group as soon as its rollouts are complete (the chart's
trainer Deployment, ``trainer.train.engine: verl``).

On a machine without GPUs (``device="cpu"``) the run uses
:mod:`verl_platform`: Ray declares one logical GPU per worker and the
workers' collectives run on gloo. Weights after each step go through the
``external`` rollout (:mod:`verl_rollout`) to the OpenForge servers in
``publish``, with ``policy_version`` = veRL's step. On GPUs, ``rollout="vllm"``
lets veRL's own vLLM servers serve the sidecars instead: veRL loads each step's
weights into them itself, and the agent loop writes where they are
(:mod:`verl_engines`) for the runner that starts the harnesses.

veRL's console metrics are also written, one JSON line per step, to
``{run_dir}/metrics.jsonl`` (veRL's ``file`` logger), and what each step
trained on to ``{run_dir}/rollouts/{step}.jsonl`` (veRL's rollout dump).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from openforge import policy_servers

from openforge_trainer.training import (
    verl_agent_loop,
    verl_platform,
    verl_plugin,
    verl_rollout,
)

PLUGIN = verl_plugin.__name__
AGENT = "openforge"
DATASET = "tasks.parquet"
AGENT_LOOPS = "agent_loops.yaml"
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
ROLLOUTS = ("external", "vllm")


class LaunchError(ValueError):
    """A setting of the veRL run is wrong (the message names it)."""


@dataclasses.dataclass(frozen=True)
class Plan:
    model: Path
    store: Path
    job: str
    tasks: tuple[str, ...]
    run_dir: Path
    group_size: int = 2  # rollout.n: a task's samples per step
    groups_per_step: int | None = None  # tasks per step (default: all)
    steps: int = 1
    batch: str = "{iteration}"
    workers: int = 2  # FSDP ranks (logical GPUs on CPU)
    device: str = "cpu"  # cpu | cuda
    lr: float = 1e-4
    seed: int = 0
    kl_coef: float = 0.0  # > 0: veRL's KL loss (low_var_kl) to the initial policy
    max_prompt_length: int = 4096
    max_response_length: int = 4096
    # rollout correction: recompute old log-probs (veRL's decoupled mode) instead of taking
    # the captured ones, and weight by truncated importance sampling (rollout_is: token |
    # sequence) when the engine's log-probs differ from the trainer's (vLLM on GPUs)
    recompute_old_log_probs: bool = False
    rollout_is: str | None = None
    rollout_is_threshold: float = 2.0
    publish: tuple[verl_rollout.Target, ...] = ()
    # who serves the sidecars: "external", OpenForge's servers (``publish`` gets each step's
    # weights), or "vllm", veRL's own vLLM servers (its hybrid engine; their addresses
    # are written to run_dir/engines.json each step, see verl_engines)
    rollout: str = "external"
    poll_interval: float = 1.0
    rollout_timeout: float = 3600.0
    verl: tuple[str, ...] = ()  # the user's own veRL keys, KEY=VALUE

    def tasks_per_step(self) -> int:
        return len(self.tasks) if self.groups_per_step is None else self.groups_per_step


# the trainer modes whose step s reads the rollouts of iteration s - 1 (veRL's async modes
# tag batches with the step they were submitted at, and warm up ahead)
SYNC_KEYS = {"trainer.v1.trainer_mode": "sync", "trainer.use_v1": "true"}


CHECKPOINTS_KEPT = 2
"""veRL checkpoints (``run_dir/checkpoints/global_step_N``) kept: the newest is resumed from."""

# veRL keys the plan decides itself (the platform, Ray's resources and the batch sizes follow
# them): key -> the Plan field that sets it (and that `plan_from` reads it into)
OWNED = {
    "trainer.device": "device",
    "trainer.n_gpus_per_node": "workers",
    policy_servers.ROLLOUT_OPTION: "rollout",
}
# veRL keys a user may not set: the plan sets them from its own fields (a second value would
# win silently), or the loop depends on them (a group of rollout.n samples, one batch of
# the tasks a step, one step an iteration, our rollout, agent loop, dataset and files)
PINNED = {
    "actor_rollout_ref.rollout.n": "group_size",
    "data.train_batch_size": "groups_per_step",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "groups_per_step",
    "trainer.total_training_steps": "steps",
    "actor_rollout_ref.actor.optim.lr": "lr",
    "data.seed": "seed",
    "actor_rollout_ref.actor.use_kl_loss": "kl_coef",
    "actor_rollout_ref.actor.kl_loss_coef": "kl_coef",
    "actor_rollout_ref.model.path": "model",
    "actor_rollout_ref.rollout.custom": "publish",
    "actor_rollout_ref.rollout.agent.default_agent_loop": "the OpenForge agent loop",
    "actor_rollout_ref.rollout.agent.agent_loop_config_path": "the OpenForge agent loop",
    "data.train_files": "tasks",
    "data.val_files": "tasks",
    "data.shuffle": "tasks (every task in every step)",
    "trainer.logger": "run_dir (metrics.jsonl)",
    "trainer.default_local_dir": "run_dir",
    "trainer.save_freq": "run_dir (a checkpoint every step, resumed from)",
    "trainer.resume_mode": "run_dir (a checkpoint every step, resumed from)",
    "trainer.rollout_data_dir": "run_dir",
}


def problems(plan: Plan) -> list[str]:
    """Everything wrong with the plan, each naming its setting and value ([] when none)."""
    out: list[str] = []
    if not plan.tasks:
        out.append("tasks: at least one task")
    twice = sorted({task for task in plan.tasks if plan.tasks.count(task) > 1})
    if twice:
        out.append(f"tasks: named twice: {', '.join(twice)}")
    if plan.group_size < 2:
        out.append(f"group_size: GRPO needs >= 2 samples per task, got {plan.group_size}")
    if plan.steps < 1:
        out.append(f"steps: >= 1, got {plan.steps}")
    if plan.workers < 1:
        out.append(f"workers: >= 1, got {plan.workers}")
    if plan.device not in ("cpu", "cuda"):
        out.append(f"device: cpu or cuda, got {plan.device!r}")
    if plan.rollout not in ROLLOUTS:
        out.append(f"rollout: external or vllm, got {plan.rollout!r}")
    elif plan.rollout == "vllm" and plan.device != "cuda":
        out.append("rollout: vllm (veRL's own vLLM servers) needs device cuda")
    elif plan.rollout == "vllm" and plan.publish:
        out.append(
            "publish: veRL's own vLLM servers (rollout vllm) get each step's weights from "
            "veRL; there is nothing to publish to (--serve, --vllm)"
        )
    per_step = plan.tasks_per_step()
    if plan.groups_per_step is not None and not 1 <= per_step <= len(plan.tasks):
        out.append(f"groups_per_step: 1..{len(plan.tasks)} (the tasks), got {per_step}")
    elif plan.workers >= 1 and (per_step * plan.group_size) % plan.workers:
        out.append(
            f"workers: {plan.workers} must divide the samples of a step "
            f"({per_step} tasks x {plan.group_size})"
        )
    if plan.rollout_is not in (None, "token", "sequence"):
        out.append(f"rollout_is: token or sequence, got {plan.rollout_is!r}")
    if not plan.rollout_is_threshold > 1:
        out.append(f"rollout_is_threshold: > 1, got {plan.rollout_is_threshold}")
    if plan.kl_coef < 0:
        out.append(f"kl_coef: >= 0, got {plan.kl_coef}")
    try:
        plan.batch.format(iteration=0)
    except (KeyError, IndexError, ValueError):
        out.append(f"batch: {plan.batch!r} is not a template of {{iteration}}")
    if not plan.batch and 1 <= per_step <= len(plan.tasks) and len(plan.tasks) % per_step:
        out.append(
            f"groups_per_step: {per_step} must divide the {len(plan.tasks)} tasks without a "
            "batch label (a job's samples are numbered on, epoch by epoch)"
        )
    for item in plan.verl:
        key, sep, value = item.partition("=")
        if not sep or not key:
            out.append(f"verl option {item!r}: expected KEY=VALUE")
        elif (owned := key.lstrip("+~")) in OWNED:
            out.append(f"verl option {item!r}: {owned} is set by the plan's {OWNED[owned]}")
        elif owned in PINNED or any(owned.startswith(f"{k}.") for k in PINNED):
            pinned = PINNED.get(owned) or next(v for k, v in PINNED.items() if owned.startswith(k))
            out.append(f"verl option {item!r}: {owned} is set by the plan's {pinned}")
        elif key.lstrip("+~") in SYNC_KEYS and value.strip().lower() != SYNC_KEYS[key.lstrip("+~")]:
            out.append(
                f"verl option {item!r}: only veRL's synchronous v1 trainer reads each step's "
                "own rollouts"
            )
    for name, path in (("model", plan.model), ("store", plan.store), ("run_dir", plan.run_dir)):
        if any(bad in str(path) for bad in UNQUOTABLE):
            out.append(f"{name}: {str(path)!r} has one of {UNQUOTABLE}, which veRL's config reads")
    return out


def check(plan: Plan) -> None:
    """Refuse a plan veRL would choke on later, naming every setting at fault."""
    found = problems(plan)
    if found:
        raise LaunchError("; ".join(found))


def dataset_rows(plan: Plan) -> list[dict[str, Any]]:
    """veRL dataset rows, one per task; the prompt is only a label (the harness has the task).

    Without a batch label (a RolloutJob's rollouts, numbered on across steps) the rows
    make epoch e's session k sample ``e * group_size + k`` of the task."""
    across_steps: dict[str, int] = {}
    if not plan.batch:
        across_steps = {
            verl_agent_loop.STRIDE_KEY: plan.group_size,
            verl_agent_loop.STEPS_PER_EPOCH_KEY: len(plan.tasks) // plan.tasks_per_step(),
        }
    return [
        {
            "data_source": "openforge",
            "prompt": [{"role": "user", "content": f"OpenForge task {task}"}],
            "agent_name": AGENT,
            "reward_model": {"style": "openforge", "ground_truth": ""},
            "extra_info": {
                "index": index,
                verl_agent_loop.TASK_KEY: task,
                verl_agent_loop.BATCH_KEY: plan.batch,
                **across_steps,
            },
        }
        for index, task in enumerate(plan.tasks)
    ]


def agent_loops(plan: Plan) -> list[dict[str, Any]]:
    """veRL's agent-loop config: our loop, reading ``plan.store`` (and, with veRL's own
    vLLM servers, writing where they are each step)."""
    engines = {"engines_file": str(engines_file(plan))} if plan.rollout == "vllm" else {}
    return [
        {
            "name": AGENT,
            "_target_": f"{verl_agent_loop.__name__}.OpenForgeAgentLoop",
            "store": str(plan.store.resolve()),
            "job": plan.job,
            "poll_interval": plan.poll_interval,
            "timeout": plan.rollout_timeout,
            **engines,
        }
    ]


def engines_file(plan: Plan) -> Path:
    """Where a ``rollout="vllm"`` run writes its servers' addresses each step."""
    return plan.run_dir.resolve() / policy_servers.FILE


# Hydra escapes a backslash only before a quote, and OmegaConf interpolates ``${`` even in
# quoted strings: such values are refused (check) rather than quoted wrongly
UNQUOTABLE = ("\\", '"', "${")


def _hydra(value: Any) -> str:
    """A value in Hydra's override grammar: bare dict keys, double-quoted strings."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{key}:{_hydra(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_hydra(item) for item in value) + "]"
    if isinstance(value, str):
        if any(bad in value for bad in UNQUOTABLE):
            raise LaunchError(f"{value!r}: has one of {UNQUOTABLE}, which veRL's config reads")
        return f'"{value}"'
    return json.dumps(value)  # numbers, true/false, null


def rollout_custom(plan: Plan) -> dict[str, Any]:
    """The ``external`` rollout's options (``actor_rollout_ref.rollout.custom``)."""
    return {
        "openforge": {
            "weights_dir": str(plan.run_dir.resolve() / "weights"),
            "publish": [dataclasses.asdict(t) for t in plan.publish],
        }
    }


def overrides(plan: Plan) -> list[str]:
    """veRL's ``ppo_trainer`` overrides for the plan, the user's ``verl`` keys last."""
    run = plan.run_dir.resolve()
    fp32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    keys: list[str] = [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=false",
        # by default old_log_probs are the captured ones: the policy that sampled the tokens
        f"algorithm.rollout_correction.bypass_mode={_hydra(not plan.recompute_old_log_probs)}",
        f"data.train_files={_hydra(str(run / DATASET))}",
        f"data.val_files={_hydra(str(run / DATASET))}",
        f"data.train_batch_size={plan.tasks_per_step()}",
        f"data.max_prompt_length={plan.max_prompt_length}",
        f"data.max_response_length={plan.max_response_length}",
        "data.dataloader_num_workers=0",
        "data.shuffle=false",
        "data.filter_overlong_prompts=false",
        f"data.seed={plan.seed}",
        f"actor_rollout_ref.model.path={_hydra(str(plan.model.resolve()))}",
        "actor_rollout_ref.actor.strategy=fsdp2",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={plan.tasks_per_step()}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        f"actor_rollout_ref.actor.use_kl_loss={_hydra(plan.kl_coef > 0)}",
        f"actor_rollout_ref.actor.optim.lr={plan.lr}",
        f"actor_rollout_ref.rollout.name={plan.rollout}",
        f"actor_rollout_ref.rollout.n={plan.group_size}",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={_hydra(str(run / AGENT_LOOPS))}",
        f"actor_rollout_ref.rollout.agent.default_agent_loop={AGENT}",
        f"trainer.n_gpus_per_node={plan.workers}",
        "trainer.nnodes=1",
        f"trainer.device={plan.device}",
        "trainer.logger=[console,file]",
        f"trainer.total_training_steps={plan.steps}",
        "trainer.total_epochs=1000000",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        # a checkpoint after every step, the newest resumed from: a stopped run goes on
        # (veRL publishes the resumed weights as its first act, as version = its step)
        "trainer.save_freq=1",
        "trainer.resume_mode=auto",
        f"trainer.max_actor_ckpt_to_keep={CHECKPOINTS_KEPT}",
        "trainer.project_name=openforge",
        f"trainer.experiment_name={_hydra(plan.job)}",
        f"trainer.default_local_dir={_hydra(str(run / CHECKPOINTS))}",
        f"trainer.rollout_data_dir={_hydra(str(run / 'rollouts'))}",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        # the reward comes with each rollout (its harness was graded); one idle reward worker
        "reward.num_workers=1",
    ]
    if plan.rollout == "external":
        keys.append(f"+actor_rollout_ref.rollout.custom={_hydra(rollout_custom(plan))}")
    # what veRL's processes need, also for Ray workers on other nodes (a local cluster's
    # inherit the driver's environment; a remote one's get only the runtime env)
    keys.append(f"+ray_kwargs.ray_init.runtime_env.env_vars={_hydra(environment(plan))}")
    if plan.kl_coef > 0:
        keys += [
            f"actor_rollout_ref.actor.kl_loss_coef={plan.kl_coef}",
            "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
        ]
        if plan.device == "cpu":  # the reference model as the actor: fp32, not compiled
            keys += [
                "actor_rollout_ref.ref.fsdp_config.dtype=float32",
                f"+actor_rollout_ref.ref.fsdp_config.mixed_precision={_hydra(fp32)}",
                "actor_rollout_ref.ref.use_torch_compile=false",
            ]
    if plan.rollout_is:
        keys += [
            f"algorithm.rollout_correction.rollout_is={plan.rollout_is}",
            f"algorithm.rollout_correction.rollout_is_threshold={plan.rollout_is_threshold}",
        ]
    if plan.device == "cpu":
        keys += [
            # no flash-attn on CPU: padded batches, torch's SDPA, fp32 for exact log-probs
            "actor_rollout_ref.model.use_remove_padding=false",
            "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
            "actor_rollout_ref.actor.fsdp_config.dtype=float32",
            f"+actor_rollout_ref.actor.fsdp_config.mixed_precision={_hydra(fp32)}",
            "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
            "actor_rollout_ref.actor.use_torch_compile=false",
            # one logical GPU per worker; logical CPUs for the TaskRunner, TransferQueue's
            # controller and storage, and each worker's placement bundle (veRL asks 3 CPUs)
            f"+ray_kwargs.ray_init.num_gpus={plan.workers}",
            f"+ray_kwargs.ray_init.num_cpus={3 * plan.workers + 4}",
            "+ray_kwargs.ray_init.include_dashboard=false",
        ]
    return keys + list(plan.verl)


def environment(plan: Plan) -> dict[str, str]:
    """What every veRL process (driver and Ray workers) needs in its environment."""
    env = {
        "VERL_USE_EXTERNAL_MODULES": PLUGIN,
        "VERL_FILE_LOGGER_PATH": str((plan.run_dir / METRICS).resolve()),
        "TOKENIZERS_PARALLELISM": "false",
        "RAY_DEDUP_LOGS": "0",
        # Ray keeps up to num_cpus idle workers alive, each ~0.8 GB once it has imported veRL
        "RAY_num_workers_soft_limit": "2",
    }
    if plan.device == "cpu":
        env[verl_platform.ENV] = verl_platform.PLATFORM
    return env


def compose(keys: Sequence[str]) -> Any:
    """veRL's ``ppo_trainer`` config with the overrides; a bad key is named."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException
    from verl.trainer import main_ppo

    config_dir = str(Path(main_ppo.__file__).parent / "config")
    try:
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            return hydra_compose("ppo_trainer", overrides=list(keys))
    except (HydraException, OmegaConfBaseException) as exc:
        raise LaunchError(f"veRL config: {exc}".splitlines()[0]) from exc


def validated_config(plan: Plan) -> Any:
    """veRL's config for the plan, checked as veRL checks it before it starts anything
    (the rollout options, the composed keys, then veRL's own ``validate_config``)."""
    from hydra.errors import HydraException
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    check(plan)
    verl_rollout.options(rollout_custom(plan))
    config = compose(overrides(plan))
    try:
        with contextlib.redirect_stdout(sys.stderr):  # what it prints is not our output
            validate_config(
                config=config,
                use_reference_policy=need_reference_policy(config),
                use_critic=need_critic(config),
            )
    except (HydraException, AssertionError, ValueError, TypeError, KeyError) as exc:
        said = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        said = said.replace(":; ", ": ")
        raise LaunchError(f"veRL config: {said}") from exc
    return config


def prepare(plan: Plan) -> None:
    """The run directory: the dataset of tasks and the agent-loop config."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    plan.run_dir.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(dataset_rows(plan)), plan.run_dir / DATASET)
    (plan.run_dir / AGENT_LOOPS).write_text(yaml.safe_dump(agent_loops(plan)))


def run(plan: Plan, *, ready: Callable[[], None] = lambda: None) -> None:
    """Train ``plan.steps`` steps with veRL's Ray trainer, in this process and a local Ray;
    ``ready`` is called once the plan and veRL's config are found valid."""
    check(plan)
    prepare(plan)
    os.environ.update(environment(plan))
    # this process imported veRL before the environment named the plugin: install it here too
    verl_plugin.install()
    import ray
    from verl.trainer import main_ppo

    config = validated_config(plan)
    ready()
    if plan.rollout == "vllm" and checkpointed_step(plan) >= plan.steps:
        # veRL would resume and run a step more, whose rollouts no runner starts; with
        # OpenForge's servers this rerun still publishes the weights it resumed, so it runs
        print(f"{PROG}: the checkpoint is at step {plan.steps}: every step is trained", flush=True)
        return
    try:
        main_ppo.run_ppo(config, task_runner_class=main_ppo.TaskRunnerV1)
    finally:
        ray.shutdown()


def checkpointed_step(plan: Plan) -> int:
    """The step of veRL's newest checkpoint in the run directory (what a rerun resumes
    from; 0 without one): veRL's own ``latest_checkpointed_iteration.txt``."""
    tracker = plan.run_dir / CHECKPOINTS / "latest_checkpointed_iteration.txt"
    try:
        return int(tracker.read_text().strip())
    except (FileNotFoundError, ValueError):
        return 0


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    """veRL's metrics, one dict per step (``{"step": s, "data": {...}}``)."""
    from openforge_trainer.training import metrics as train_metrics  # matplotlib: only here

    return train_metrics.read(run_dir / METRICS)


PROG = "openforge train-verl"
#: printed once the settings are valid and veRL's config composed, before Ray starts
READY = f"{PROG}: starting"


class _Parser(argparse.ArgumentParser):
    """Reads ``@FILE`` arguments one per line, skipping blank lines and ``#`` comments."""

    def convert_arg_line_to_args(self, arg_line: str) -> list[str]:
        line = arg_line.strip()
        return [] if not line or line.startswith("#") else [line]


def _parser() -> argparse.ArgumentParser:
    cli = _Parser(
        prog=PROG,
        description="Train with veRL's Ray trainer (GRPO, FSDP2 workers) on a job's captured "
        "rollouts, and publish each step's weights to the inference servers. @FILE reads "
        "arguments from FILE, one per line (examples/verl/ has the GPU recipes).",
        fromfile_prefix_chars="@",
    )
    cli.add_argument("--model", type=Path, required=True, help="initial policy (HF directory)")
    cli.add_argument("--store", type=Path, required=True, help="the collector's store")
    cli.add_argument("--job", required=True, help="the RolloutJob whose rollouts are trained on")
    cli.add_argument(
        "--task", dest="tasks", action="append", required=True, help="a task id (repeat: each)"
    )
    cli.add_argument("--run-dir", type=Path, required=True)
    cli.add_argument("--group-size", type=int, default=2, help="samples per task (rollout.n)")
    cli.add_argument("--groups-per-step", type=int, help="tasks per step (default: all)")
    cli.add_argument("--steps", type=int, default=1)
    cli.add_argument(
        "--batch",
        default="{iteration}",
        help="the openforge.dev/batch label of step s's rollouts; {iteration} is s - 1; empty: "
        "a RolloutJob's own rollouts (no label; epoch e's session k is sample e*group-size+k)",
    )
    cli.add_argument(
        "--workers", type=int, help="FSDP2 workers (default 2; or --verl trainer.n_gpus_per_node)"
    )
    cli.add_argument(
        "--device", choices=("cpu", "cuda"), help="default cpu; or --verl trainer.device"
    )
    cli.add_argument("--lr", type=float, default=1e-4)
    cli.add_argument("--seed", type=int, default=0)
    cli.add_argument(
        "--kl-coef", type=float, default=0.0, help="KL loss (low_var_kl) to the initial policy"
    )
    cli.add_argument(
        "--recompute-old-log-probs",
        action="store_true",
        help="recompute old log-probs with the trainer (veRL's decoupled mode) instead of "
        "taking the captured ones",
    )
    cli.add_argument(
        "--rollout-is",
        choices=("token", "sequence"),
        help="truncated importance sampling for engine/trainer log-prob mismatch",
    )
    cli.add_argument("--rollout-is-threshold", type=float, default=2.0)
    cli.add_argument("--serve", action="append", default=[], metavar="URL")
    cli.add_argument(
        "--serve-publish",
        choices=("path", "bytes"),
        default="path",
        help="how --serve servers get the weights: a path they read, or the bytes",
    )
    cli.add_argument("--vllm", action="append", default=[], metavar="URL")
    cli.add_argument(
        "--rollout",
        choices=ROLLOUTS,
        help="who serves the sidecars: external (OpenForge's servers, published to with "
        "--serve/--vllm; default) or vllm (veRL's own vLLM servers, on GPUs; their addresses "
        "go to RUN_DIR/engines.json each step)",
    )
    cli.add_argument(
        "--verl",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a veRL ppo_trainer key (checked against veRL's config), e.g. "
        "actor_rollout_ref.actor.clip_ratio=0.2",
    )
    cli.add_argument(
        "--option",
        dest="options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a veRL ppo_trainer key with its value as JSON, else as a string (what a "
        "RolloutJob's spec.training.options become), e.g. --option trainer.device='\"cuda\"'",
    )
    cli.add_argument(
        "--keep-running",
        action="store_true",
        help="after the last step, stay up until stopped (a Deployment's container: an "
        "exit would be restarted, and resume from the last checkpoint to train nothing)",
    )
    cli.add_argument(
        "--check",
        action="store_true",
        help="check the settings against veRL's config, print its overrides as JSON, and exit",
    )
    return cli


def _options(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """The veRL keys of ``--verl KEY=VALUE`` (Hydra's syntax, passed as given) and
    ``--option KEY=VALUE`` (JSON, else a string; written in Hydra's syntax here): the
    values of :data:`OWNED` keys by Plan field, and the other keys as overrides."""
    owned: dict[str, Any] = {}
    rest: list[str] = []
    seen: dict[str, str] = {}
    for flag, items in (("--verl", args.verl), ("--option", args.options)):
        for item in items:
            key, sep, text = item.partition("=")
            bare = key.strip().lstrip("+~")
            if sep and bare in seen:
                raise LaunchError(f"{flag} {item!r}: {bare} is already set (by {seen[bare]})")
            seen[bare] = f"{flag} {item}"
            if flag == "--verl":
                value: Any = text.strip().strip("'\"")  # a quoted string, as Hydra reads it
            else:
                try:
                    value = json.loads(text)
                except ValueError:
                    value = text
            if sep and bare in OWNED:
                owned[OWNED[bare]] = value
            elif flag == "--verl" or not sep:
                rest.append(item)
            else:
                try:
                    rest.append(f"{key.strip()}={_hydra(value)}")
                except LaunchError as exc:
                    raise LaunchError(f"--option {item!r}: {exc}") from None
    return owned, rest


def plan_from(args: argparse.Namespace) -> Plan:
    """The plan the command line asks for. ``trainer.device``, ``trainer.n_gpus_per_node``
    and ``actor_rollout_ref.rollout.name`` given as veRL keys set the device, workers and
    rollout (a flag that disagrees is an error)."""
    owned, rest = _options(args)
    settings: dict[str, Any] = {"device": "cpu", "workers": 2, "rollout": "external"}
    for field, value in owned.items():
        given = getattr(args, field)
        if field == "workers":
            try:
                number = float(value)
            except (TypeError, ValueError):
                number = float("nan")
            if isinstance(value, bool) or not number.is_integer():
                raise LaunchError(f"trainer.n_gpus_per_node={value}: not a whole number")
            value = int(number)
        if given is not None and given != value:
            raise LaunchError(f"--{field} {given} and the veRL key for it ({value}) disagree")
        settings[field] = value
    for field in ("device", "workers", "rollout"):
        if getattr(args, field) is not None:
            settings[field] = getattr(args, field)
    return Plan(
        model=args.model,
        store=args.store,
        job=args.job,
        tasks=tuple(args.tasks),
        run_dir=args.run_dir,
        group_size=args.group_size,
        groups_per_step=args.groups_per_step,
        steps=args.steps,
        batch=args.batch,
        lr=args.lr,
        seed=args.seed,
        kl_coef=args.kl_coef,
        recompute_old_log_probs=args.recompute_old_log_probs,
        rollout_is=args.rollout_is,
        rollout_is_threshold=args.rollout_is_threshold,
        publish=tuple(verl_rollout.Target(url=u, mode=args.serve_publish) for u in args.serve)
        + tuple(verl_rollout.Target(url=u, kind="vllm") for u in args.vllm),
        verl=tuple(rest),
        **settings,
    )


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    try:
        plan = plan_from(args)
        if args.check:
            validated_config(plan)
            print(json.dumps(overrides(plan), indent=2))
            return 0
        _stop_on_sigterm()
        run(
            plan,
            ready=lambda: print(f"{READY}: job {plan.job}, run dir {plan.run_dir}", flush=True),
        )
        if args.keep_running:
            print(f"{PROG}: trained {plan.steps} steps; staying up until stopped", flush=True)
            while True:
                time.sleep(3600)
    except (LaunchError, verl_rollout.OptionsError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: stopped", file=sys.stderr)
        return 130
    return 0


def _stop_on_sigterm() -> None:
    """SIGTERM (``openforge run`` stopping its services) ends the run as Ctrl-C does, so
    that Ray's local cluster is shut down on the way out."""

    def handle(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handle)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
