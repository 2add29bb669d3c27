"""veRL's own Ray trainer (GRPO, 2 FSDP2 workers over gloo) on rollouts in a real store.

The builders are checked against veRL's real config; the run is veRL's
``main_ppo`` in a subprocess (its local Ray cluster, TaskRunner, TransferQueue,
FSDP2 actor workers, our agent loop and ``external`` rollout) publishing to a
real ``openforge serve``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from openforge_trainer.collection import store
from openforge_trainer.serving import publish
from openforge_trainer.serving import server as serve
from openforge_trainer.training import loop as trainer_loop
from openforge_trainer.training import rollout_sampler, verl_agent_loop, verl_launch, verl_rollout
from openforge_trainer.trajectories import export
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


# --- veRL's Ray trainer, for real ---------------------------------------------------------


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model and a store with each task's group in batches "0" and "1"."""
    base = tmp_path_factory.mktemp("verl")
    model_dir = rollout_sampler.build_tiny_model(base / "model")
    model = trainer_loop.load_model(model_dir, dtype="float32", device="cpu")
    with store.Store(base / "store.db") as db:
        for iteration in (0, 1):
            rollout_sampler.write_rollouts(
                db,
                model,
                job="job",
                tasks=list(TASKS),
                samples=SAMPLES,
                turns=2,
                batch=str(iteration),
                policy_version=iteration,
                seed=iteration,
            )
    return base


@pytest.fixture(scope="module")
def served(captured: Path) -> Iterator[str]:
    config = serve.ServeConfig(model_dir=captured / "model", model_name="tiny")
    url, _, stop = serve.start_in_thread(config)
    yield url
    stop()


@pytest.fixture(scope="module")
def trained(captured: Path, served: str) -> Path:
    """Two steps of veRL's trainer; the run directory."""
    run_dir = captured / "run"
    command = [
        sys.executable,
        "-m",
        "openforge_trainer.training.verl_launch",
        *("--model", str(captured / "model"), "--store", str(captured / "store.db")),
        *("--job", "job", "--task", "a", "--task", "b", "--run-dir", str(run_dir)),
        *("--group-size", str(SAMPLES), "--steps", "2", "--workers", "2", "--serve", served),
        *("--serve-publish", "bytes"),
        # recompute the old log-probs (veRL's decoupled mode) to measure them against the
        # captured ones, with truncated IS; OpenForge's default takes the captured ones
        *("--recompute-old-log-probs", "--rollout-is", "token"),
    ]
    done = subprocess.run(
        command,
        cwd=captured,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    (captured / "verl.log").write_text(done.stdout + done.stderr)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    return run_dir


def _decoded_rows(base: Path, batch: str) -> dict[str, set[tuple[str, str]]]:
    """Per task, the (prompt, response) texts of its rollouts in ``batch``, as veRL decodes them."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(base / "model")
    out: dict[str, set[tuple[str, str]]] = {}
    with store.Store(base / "store.db") as db:
        for rollout in db.rollouts("job"):
            if rollout.batch != batch:
                continue
            (row,), _ = export.rollout_rows(rollout, db.calls(rollout.rollout_id))
            text = (
                tokenizer.decode(row.prompt_ids, skip_special_tokens=True),
                tokenizer.decode(row.response_ids, skip_special_tokens=True),
            )
            out.setdefault(rollout.task_id, set()).add(text)
    return out


@pytest.mark.slow
@pytest.mark.timeout(1200)  # the fixture's veRL run: ~3-4 min
def test_verl_trains_each_step_on_its_groups_of_distinct_captured_rollouts(
    captured: Path, trained: Path
) -> None:
    for step, batch in ((1, "0"), (2, "1")):
        dumped = [
            json.loads(line)
            for line in (trained / "rollouts" / f"{step}.jsonl").read_text().splitlines()
        ]
        expected = _decoded_rows(captured, batch)
        assert len(dumped) == len(TASKS) * SAMPLES
        groups: dict[str, set[tuple[str, str]]] = {}
        for sample in dumped:  # veRL keys a sample {uid}_{session}_{output}
            uid = sample["uid"].rsplit("_", 2)[0]
            groups.setdefault(uid, set()).add((sample["input"], sample["output"]))
        # each group is one task's n distinct rollouts of this step's batch
        assert sorted(map(sorted, groups.values())) == sorted(map(sorted, expected.values()))
        assert all(len(g) == SAMPLES for g in groups.values())


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_verl_recomputes_the_captured_log_probs(trained: Path) -> None:
    steps = {entry["step"]: entry["data"] for entry in verl_launch.metrics(trained)}
    assert sorted(steps) == [1, 2]
    first = steps[1]
    # veRL's own comparison of the captured (rollout) and recomputed token probabilities;
    # bf16 autocast (veRL's default) measured 1.2e-5 here, fp32 3e-10
    assert first["training/rollout_probs_diff_valid"] == 1.0
    assert first["training/rollout_probs_diff_max"] < 1e-8
    assert first["training/rollout_actor_probs_pearson_corr"] > 0.999999
    assert first["actor/grad_norm"] > 0  # a real update
    # the rollout correction asked for is recorded (truncated IS weights, per token)
    assert any(key.startswith("rollout_corr/rollout_is") for key in first), sorted(first)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_weights_of_each_step_reach_openforge_serve(
    captured: Path, served: str, trained: Path
) -> None:
    lines = [
        json.loads(line)
        for line in (trained / "weights" / verl_rollout.RESULTS_FILE).read_text().splitlines()
    ]
    assert [(r["policy_version"], r["ok"], r["url"]) for r in lines] == [
        (0, True, served),
        (1, True, served),
        (2, True, served),
    ]
    assert publish.ServePublisher(served).policy()["policy_version"] == 2
    initial = safetensors_torch.load_file(captured / "model" / "model.safetensors")
    final = safetensors_torch.load_file(trained / "weights" / "policy-2" / verl_rollout.SINGLE_FILE)
    moved = [name for name in initial if not torch.equal(initial[name], final[name])]
    assert moved, "two GRPO steps changed no weight"
