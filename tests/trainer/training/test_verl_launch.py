"""``openforge train-verl``: veRL's own Ray trainer (GRPO, FSDP2 workers) on captured rollouts.

The builders are checked against veRL's real config, the publishing against a
real ``openforge serve``. veRL's trainer itself runs in
tests/runner/test_verl_engine.py: ``openforge run`` of the demo with
``engine: verl``, its groups, log-probs and weights checked there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from openforge_trainer.serving import publish
from openforge_trainer.serving import server as serve
from openforge_trainer.training import rollout_sampler, verl_agent_loop, verl_launch, verl_rollout
from safetensors import torch as safetensors_torch

torch.set_num_threads(1)

TASKS = ("a", "b")
SAMPLES = 2


def plan_for(tmp: Path, **changes: Any) -> verl_launch.Plan:
    fields: dict[str, Any] = {
        "model": tmp / "model",
        "store": tmp / "store.db",
        "job": "job",
        "tasks": TASKS,
        "run_dir": tmp / "run",
    }
    fields.update(changes)
    return verl_launch.Plan(**fields)


def test_the_overrides_compose_into_verls_own_config(tmp_path: Path) -> None:
    plan = plan_for(
        tmp_path,
        steps=3,
        publish=(verl_rollout.Target(url="http://127.0.0.1:1"),),
        verl=("actor_rollout_ref.actor.clip_ratio_high=0.3",),
    )
    config = verl_launch.compose(verl_launch.overrides(plan))
    rollout = config.actor_rollout_ref.rollout
    assert (rollout.name, rollout.n) == ("external", SAMPLES)
    assert config.data.train_batch_size == len(TASKS)
    assert config.trainer.total_training_steps == 3
    assert config.actor_rollout_ref.actor.strategy == "fsdp2"
    assert config.actor_rollout_ref.actor.clip_ratio_high == 0.3  # the user's key, last
    assert config.algorithm.rollout_correction.bypass_mode is True
    assert config.algorithm.rollout_correction.rollout_is is None
    corrected = verl_launch.compose(
        verl_launch.overrides(
            plan_for(tmp_path, recompute_old_log_probs=True, rollout_is="sequence")
        )
    ).algorithm.rollout_correction
    assert (corrected.bypass_mode, corrected.rollout_is) == (False, "sequence")
    assert corrected.rollout_is_threshold == 2.0
    options = verl_rollout.options(rollout.custom)
    assert options.publish == plan.publish
    assert options.weights_dir == (plan.run_dir / "weights").resolve()
    # CPU: fp32 throughout (veRL's FSDP engine autocasts to bf16 unless told, which moved
    # the recomputed probabilities by 1.2e-5 where fp32 gave 3e-10)
    precision = config.actor_rollout_ref.actor.fsdp_config.mixed_precision
    assert (precision.param_dtype, precision.reduce_dtype) == ("fp32", "fp32")
    # GPU: the same keys with the device ones swapped
    gpu = verl_launch.compose(verl_launch.overrides(plan_for(tmp_path, device="cuda")))
    assert gpu.trainer.device == "cuda" and gpu.actor_rollout_ref.model.use_remove_padding


def test_a_bad_verl_key_is_named(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, verl=("actor_rollout_ref.actor.no_such_key=1",))
    with pytest.raises(verl_launch.LaunchError, match="no_such_key"):
        verl_launch.compose(verl_launch.overrides(plan))


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"tasks": ()}, "tasks"),
        ({"tasks": ("a", "a")}, "tasks"),
        ({"group_size": 1}, "group_size"),
        ({"device": "tpu"}, "device"),
        ({"groups_per_step": 3}, "groups_per_step"),
        ({"workers": 3}, "workers"),
        ({"batch": "{step}"}, "batch"),
        ({"verl": ("novalue",)}, "novalue"),
        ({"steps": 0}, "steps"),
        ({"workers": 0}, "workers"),
        ({"groups_per_step": 0}, "groups_per_step"),
        ({"verl": ("trainer.v1.trainer_mode=colocate_async",)}, "trainer_mode"),
        ({"verl": ("trainer.use_v1=false",)}, "use_v1"),
        ({"run_dir": Path("/tmp/${oops}")}, "run_dir"),
        ({"store": Path('/tmp/a"b.db')}, "store"),
        ({"rollout_is": "batch"}, "rollout_is"),
        ({"rollout_is_threshold": 0.5}, "rollout_is_threshold"),
    ],
)
def test_a_bad_plan_is_refused_naming_the_setting(
    tmp_path: Path, changes: dict[str, Any], named: str
) -> None:
    with pytest.raises(verl_launch.LaunchError, match=named):
        verl_launch.check(plan_for(tmp_path, **changes))


def test_every_bad_setting_is_named_at_once(tmp_path: Path) -> None:
    found = verl_launch.problems(plan_for(tmp_path, tasks=("a", "a"), steps=0, device="tpu"))
    assert [p.split(":")[0] for p in found] == ["tasks", "steps", "device"]
    assert "a" in found[0]
    assert verl_launch.problems(plan_for(tmp_path)) == []


@pytest.mark.parametrize(
    ("custom", "named"),
    [
        ({"openforge": {"publish": [{"url": "http://x"}]}}, "weights_dir"),
        ({"openforge": {"publish": [{"kind": "serve"}]}}, r"publish\[0\]"),
        ({"openforge": {"publish": [{"url": "http://x", "kind": "tgi"}]}}, "kind"),
        ({"openforge": {"keep": 0}}, "keep"),
        ({"openforge": {"colour": 1}}, "colour"),
    ],
)
def test_bad_rollout_options_are_named(custom: dict[str, Any], named: str) -> None:
    with pytest.raises(verl_rollout.OptionsError, match=named):
        verl_rollout.options(custom)


def _weights(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(4, 4, generator=generator)}


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    model_dir = rollout_sampler.build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    url, _, stop = serve.start_in_thread(serve.ServeConfig(model_dir=model_dir))
    yield model_dir, url
    stop()


def test_a_version_is_a_directory_that_serve_loads_by_path_and_by_bytes(
    tmp_path: Path, tiny_server: tuple[Path, str]
) -> None:
    model_dir, url = tiny_server
    tensors = safetensors_torch.load_file(model_dir / "model.safetensors")
    for version, mode in ((1, "path"), (2, "bytes")):
        opts = verl_rollout.options(
            {"openforge": {"weights_dir": str(tmp_path), "publish": [{"url": url, "mode": mode}]}}
        )
        (result,) = verl_rollout.publish_version(opts, tensors=tensors, version=version)
        assert result.ok, result.detail
        assert publish.ServePublisher(url).policy()["policy_version"] == version
    assert (tmp_path / "policy-2" / verl_rollout.SINGLE_FILE).is_file()
    assert not list(tmp_path.glob(".policy-*"))  # no partial left


def test_a_failed_publish_is_recorded_and_old_versions_pruned(tmp_path: Path) -> None:
    opts = verl_rollout.options(
        {
            "openforge": {
                "weights_dir": str(tmp_path),
                "keep": 2,
                "publish": [{"url": "http://127.0.0.1:9"}],
            }
        }
    )
    (tmp_path / "policy-x").mkdir(parents=True)  # not a version: left alone
    for version in range(4):
        (result,) = verl_rollout.publish_version(opts, tensors=_weights(version), version=version)
        assert not result.ok  # nothing listens there; recorded, not raised
    assert sorted(p.name for p in tmp_path.glob("policy-*")) == ["policy-2", "policy-3", "policy-x"]
    lines = (tmp_path / verl_rollout.RESULTS_FILE).read_text().splitlines()
    assert [(json.loads(line)["policy_version"], json.loads(line)["ok"]) for line in lines] == [
        (v, False) for v in range(4)
    ]


def test_the_rollout_publishes_a_steps_weights_and_nothing_without_a_step(
    tmp_path: Path, tiny_server: tuple[Path, str]
) -> None:
    model_dir, url = tiny_server
    tensors = safetensors_torch.load_file(model_dir / "model.safetensors")
    rollout = verl_rollout.ExternalRollout.__new__(verl_rollout.ExternalRollout)
    rollout.options = verl_rollout.options(
        {"openforge": {"weights_dir": str(tmp_path), "publish": [{"url": url}]}}
    )
    asyncio.run(rollout.update_weights(iter(tensors.items()), global_steps=None))
    assert not list(tmp_path.glob("policy-*"))
    asyncio.run(rollout.update_weights(iter(tensors.items()), global_steps=7))
    assert publish.ServePublisher(url).policy()["policy_version"] == 7
    with pytest.raises(ValueError, match="LoRA"):
        asyncio.run(rollout.update_weights(iter(()), global_steps=8, peft_config={"r": 8}))


def test_each_step_reads_its_iterations_batch() -> None:
    sample = {
        "extra_info": {verl_agent_loop.TASK_KEY: "a", verl_agent_loop.BATCH_KEY: "{iteration}/4"}
    }
    ref = verl_agent_loop.session_ref(sample, 1, global_steps=3)
    assert (ref.task_id, ref.batch, ref.sample_index) == ("a", "2/4", 1)
    with pytest.raises(verl_agent_loop.RolloutUnavailable, match="global_steps"):
        verl_agent_loop.session_ref(sample, 0)
    fixed = {"extra_info": {verl_agent_loop.TASK_KEY: "a", verl_agent_loop.BATCH_KEY: "x"}}
    assert verl_agent_loop.session_ref(fixed, 0, global_steps=5).batch == "x"


def test_a_jobs_own_rollouts_are_numbered_on_epoch_by_epoch() -> None:
    """Without a batch label (a RolloutJob's rollouts): 4 tasks, 2 a step, groups of 3:
    steps 1-2 are epoch 0 (samples 0-2), steps 3-4 epoch 1 (samples 3-5)."""
    plan = verl_launch.Plan(
        model=Path("m"), store=Path("s.db"), job="j", tasks=("a", "b", "c", "d"),
        run_dir=Path("r"), group_size=3, groups_per_step=2, steps=4, batch="",
    )  # fmt: skip
    rows = verl_launch.dataset_rows(plan)
    assert [r["extra_info"][verl_agent_loop.TASK_KEY] for r in rows] == ["a", "b", "c", "d"]
    for step, session, sample in ((1, 0, 0), (2, 2, 2), (3, 0, 3), (4, 2, 5), (5, 1, 7)):
        ref = verl_agent_loop.session_ref(rows[0], session, global_steps=step)
        assert (ref.batch, ref.sample_index) == ("", sample), (step, session)
    # with batch labels each step's samples start at 0 again
    labelled = verl_launch.dataset_rows(dataclasses.replace(plan, batch="{iteration}"))
    ref = verl_agent_loop.session_ref(labelled[0], 2, global_steps=4)
    assert (ref.batch, ref.sample_index) == ("3", 2)
    assert verl_agent_loop.STRIDE_KEY not in labelled[0]["extra_info"]
    uneven = dataclasses.replace(plan, groups_per_step=3)
    assert any("must divide the 4 tasks without a batch label" in p for p in
               verl_launch.problems(uneven))  # fmt: skip
    broken = {"extra_info": {**rows[0]["extra_info"], verl_agent_loop.STEPS_PER_EPOCH_KEY: 0}}
    with pytest.raises(verl_agent_loop.RolloutUnavailable, match="must be an integer >= 1"):
        verl_agent_loop.session_ref(broken, 0, global_steps=1)


def _args(*extra: str) -> Any:
    return verl_launch._parser().parse_args(
        ["--model", "m", "--store", "s.db", "--job", "j", "--task", "a", "--run-dir", "r", *extra]
    )


def test_the_device_and_workers_come_from_flags_or_veRLs_own_keys() -> None:
    plan = verl_launch.plan_from(_args())
    assert (plan.device, plan.workers, plan.verl) == ("cpu", 2, ())
    plan = verl_launch.plan_from(
        _args(
            *("--verl", "trainer.n_gpus_per_node=8", "--verl", 'trainer.device="cuda"'),
            *("--verl", "actor_rollout_ref.actor.clip_ratio=0.2"),
        )
    )
    assert (plan.device, plan.workers) == ("cuda", 8)
    assert plan.verl == ("actor_rollout_ref.actor.clip_ratio=0.2",)  # the rest pass through
    config = verl_launch.compose(verl_launch.overrides(plan))
    assert (config.trainer.device, config.trainer.n_gpus_per_node) == ("cuda", 8)
    with pytest.raises(verl_launch.LaunchError, match="--workers 4 and the veRL key"):
        verl_launch.plan_from(_args("--workers", "4", "--verl", "trainer.n_gpus_per_node=8"))
    with pytest.raises(verl_launch.LaunchError, match="n_gpus_per_node=eight: not a whole"):
        verl_launch.plan_from(_args("--verl", "trainer.n_gpus_per_node=eight"))
    assert verl_launch.plan_from(_args("--option", "trainer.n_gpus_per_node=4.0")).workers == 4
    # a Plan built directly cannot pass them beside its own device and workers
    with pytest.raises(verl_launch.LaunchError, match="set by the plan's workers"):
        verl_launch.check(
            dataclasses.replace(verl_launch.plan_from(_args()), verl=("trainer.n_gpus_per_node=4",))
        )


def test_check_names_a_bad_key_and_prints_the_overrides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--model", str(tmp_path / "m"), "--store", str(tmp_path / "s.db"), "--job", "j"]
    base += ["--task", "a", "--task", "b", "--run-dir", str(tmp_path / "r"), "--check"]
    assert verl_launch.main([*base, "--kl-coef", "0.05"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert "actor_rollout_ref.actor.use_kl_loss=true" in printed
    assert "actor_rollout_ref.actor.kl_loss_coef=0.05" in printed
    assert verl_launch.main([*base, "--verl", "trainer.no_such_key=1"]) == 2
    assert "openforge train-verl: veRL config:" in capsys.readouterr().err
    # veRL's own validate_config runs too (a value its schema takes, its checks refuse)
    assert verl_launch.main([*base, "--option", 'actor_rollout_ref.actor.loss_agg_mode="no"']) == 2
    assert "Invalid loss_agg_mode: no" in capsys.readouterr().err
    assert verl_launch.main([*base, "--group-size", "1"]) == 2
    assert "group_size: GRPO needs >= 2 samples per task" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()  # a check writes nothing


def test_options_are_json_written_in_hydras_syntax_once_each() -> None:
    plan = verl_launch.plan_from(
        _args(
            *("--option", 'trainer.device="cuda"', "--option", 'trainer.project_name="é x"'),
            *("--option", '+ray_kwargs.ray_init.runtime_env={"env_vars": {"A": "1"}}'),
            *("--option", "actor_rollout_ref.actor.clip_ratio=0.2"),
        )
    )
    assert plan.device == "cuda"
    assert plan.verl == (
        'trainer.project_name="é x"',
        '+ray_kwargs.ray_init.runtime_env={env_vars:{A:"1"}}',
        "actor_rollout_ref.actor.clip_ratio=0.2",
    )
    with pytest.raises(verl_launch.LaunchError, match="already set"):
        verl_launch.plan_from(_args("--option", "data.x=1", "--verl", "+data.x=2"))
    with pytest.raises(verl_launch.LaunchError, match="which veRL's config reads"):
        verl_launch.plan_from(_args("--option", 'trainer.project_name="a\\\\b"'))


@pytest.mark.parametrize(
    ("key", "owner"),
    [
        ("actor_rollout_ref.rollout.n=8", "group_size"),
        ("data.train_batch_size=4", "groups_per_step"),
        ("trainer.total_training_steps=9", "steps"),
        ("actor_rollout_ref.actor.optim.lr=1e-6", "lr"),
        ("trainer.logger=[console]", "run_dir"),
        ("+actor_rollout_ref.rollout.custom.openforge.keep=3", "publish"),
    ],
)
def test_a_key_the_plan_sets_is_refused_naming_its_setting(
    tmp_path: Path, key: str, owner: str
) -> None:
    with pytest.raises(verl_launch.LaunchError, match=f"set by the plan's {owner}"):
        verl_launch.check(plan_for(tmp_path, verl=(key,)))


RECIPES = Path(__file__).resolve().parents[3] / "examples" / "verl"


@pytest.mark.parametrize(
    ("recipe", "rollout"),
    [("fsdp2-openforge-vllm.args", "external"), ("fsdp2-verl-vllm.args", "vllm")],
)
def test_the_gpu_recipes_compose_and_pass_verls_own_checks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], recipe: str, rollout: str
) -> None:
    """The GPU recipes of docs/trainer.md, as a user runs them (``@FILE`` and the job's own
    arguments: 16 tasks x 8 samples over 2 nodes x 8 GPUs), checked as veRL checks a
    config before it starts anything: composed and validated (veRL's validate_config
    reads no device). Not run: nothing here has a GPU."""
    tasks = [arg for index in range(16) for arg in ("--task", f"t{index}")]
    args = [f"@{RECIPES / recipe}", "--model", str(tmp_path / "m"), "--store", "s.db"]
    args += ["--job", "j", *tasks, "--group-size", "8", "--run-dir", str(tmp_path / "r")]
    if rollout == "external":
        args += ["--vllm", "http://vllm-0:8000", "--vllm", "http://vllm-1:8000"]
    assert verl_launch.main([*args, "--check"]) == 0, capsys.readouterr().err
    plan = verl_launch.plan_from(verl_launch._parser().parse_args(args))
    assert (plan.device, plan.workers, plan.rollout) == ("cuda", 8, rollout)
    config = verl_launch.validated_config(plan)
    assert (config.trainer.nnodes, config.trainer.n_gpus_per_node) == (2, 8)
    assert config.actor_rollout_ref.rollout.name == rollout
    assert config.actor_rollout_ref.model.use_remove_padding is True  # no CPU keys
    assert "mixed_precision" not in config.actor_rollout_ref.actor.fsdp_config
    correction = config.algorithm.rollout_correction
    assert (correction.bypass_mode, correction.rollout_is) == (False, "token")
    [loop] = verl_launch.agent_loops(plan)
    if rollout == "vllm":
        assert config.actor_rollout_ref.rollout.tensor_model_parallel_size == 2
        assert "custom" not in config.actor_rollout_ref.rollout  # nothing to publish
        assert loop["engines_file"] == str((tmp_path / "r" / "engines.json").resolve())
    else:
        targets = verl_rollout.options(config.actor_rollout_ref.rollout.custom).publish
        assert [(t.url, t.kind) for t in targets] == [
            ("http://vllm-0:8000", "vllm"),
            ("http://vllm-1:8000", "vllm"),
        ]
        assert "engines_file" not in loop


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"rollout": "sglang"}, "rollout: external or vllm"),
        ({"rollout": "vllm"}, "needs device cuda"),
        (
            {
                "rollout": "vllm",
                "device": "cuda",
                "publish": (verl_rollout.Target(url="http://x"),),
            },
            "nothing to publish to",
        ),
        ({"verl": ("actor_rollout_ref.rollout.name=vllm",)}, "set by the plan's rollout"),
    ],
)
def test_veRLs_own_vllm_servers_are_asked_for_as_a_rollout(
    tmp_path: Path, changes: dict[str, Any], named: str
) -> None:
    with pytest.raises(verl_launch.LaunchError, match=named):
        verl_launch.check(plan_for(tmp_path, **changes))


def test_the_rollout_comes_from_the_flag_or_veRLs_own_key() -> None:
    """A RolloutJob's ``spec.training.options`` reach train-verl as ``--option``: veRL's
    own key for the rollout picks it, as ``--rollout`` does."""
    assert verl_launch.plan_from(_args()).rollout == "external"
    assert verl_launch.plan_from(_args("--rollout", "vllm")).rollout == "vllm"
    chosen = verl_launch.plan_from(_args("--option", 'actor_rollout_ref.rollout.name="vllm"'))
    assert (chosen.rollout, chosen.verl) == ("vllm", ())
    with pytest.raises(verl_launch.LaunchError, match="--rollout external and the veRL key"):
        verl_launch.plan_from(
            _args("--rollout", "external", "--verl", "actor_rollout_ref.rollout.name=vllm")
        )


def test_a_rerun_on_veRLs_own_servers_whose_checkpoint_is_at_the_last_step_trains_nothing(
    tmp_path: Path,
) -> None:
    """veRL resumed from its last step's checkpoint would run one step more, whose rollouts
    no runner starts (and, on its own servers, publish nothing a runner waits for): such a
    rerun exits 0 once its settings are checked, before Ray starts."""
    run_dir = tmp_path / "run"
    plan = plan_for(tmp_path, device="cuda", rollout="vllm", steps=3, run_dir=run_dir)
    assert verl_launch.checkpointed_step(plan) == 0
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("3\n")
    assert verl_launch.checkpointed_step(plan) == 3
    args = ["--model", str(tmp_path / "m"), "--store", str(tmp_path / "s.db"), "--job", "j"]
    args += ["--task", "a", "--task", "b", "--run-dir", str(run_dir), "--steps", "3"]
    done = subprocess.run(
        [sys.executable, "-m", "openforge.cli", "train-verl", *args, "--device", "cuda",
         "--rollout", "vllm"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert verl_launch.READY in done.stdout
    assert "the checkpoint is at step 3: every step is trained" in done.stdout
