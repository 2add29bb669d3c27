"""`openforge run` planning: manifests in, commands out; bad manifests fail first."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from openforge.api import grading, manifests
from openforge_runner import plan, processes

ENV = """\
apiVersion: openforge.dev/v1alpha1
kind: HarnessEnv
metadata: {name: echo}
spec:
  api: openai-chat
  baseUrl: {env: [OPENAI_BASE_URL, MY_URL], suffix: /v1}
  template:
    spec:
      containers:
        - name: harness
          image: example/echo:1
          command: [python, -c, "print(1)"]
          env: [{name: FIXED, value: "yes"}]
  task:
    env: {PROMPT: "{{ task.prompt }}"}
    args: [--id, "{{ task.id }}"]
    file: {path: task.json, format: json}
  grader:
    command: [python, "${OPENFORGE_MANIFEST_DIR}/grade.py", "${OPENFORGE_TASK_ID}"]
"""
JOB = """\
apiVersion: openforge.dev/v1alpha1
kind: RolloutJob
metadata: {name: demo}
spec:
  harnessEnvRef: {name: echo}
  tasks: {file: tasks.jsonl}
  samplesPerTask: 2
  parallelism: 2
  policy: {model: model}
"""


def write(tmp_path: Path, env: str = ENV, job: str = JOB, tasks: str | None = None) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(env + "---\n" + job)
    (tmp_path / "tasks.jsonl").write_text(
        tasks if tasks is not None else '{"id": "a", "prompt": "hi"}\n{"id": "b", "prompt": "yo"}\n'
    )
    return path


def test_rollouts_cover_every_task_sample_with_stable_ids(tmp_path: Path) -> None:
    bundle = plan.load([write(tmp_path)])
    rollouts = plan.rollouts_for(bundle, 3)
    assert [(r.task_id, r.sample, r.index) for r in rollouts] == [
        ("a", 0, 0),
        ("a", 1, 1),
        ("b", 0, 2),
        ("b", 1, 3),
    ]
    assert rollouts[1].rollout_id == "demo-i3-1-0"
    assert rollouts[1].retry().rollout_id == "demo-i3-1-1"


def test_harness_command_delivers_the_task_and_points_the_base_url_at_the_sidecar(
    tmp_path: Path,
) -> None:
    bundle = plan.load([write(tmp_path)])
    rollout = plan.rollouts_for(bundle, 0)[2]
    work = tmp_path / "w"
    command = plan.harness_command(bundle, rollout, sidecar_url="http://127.0.0.1:9", workdir=work)
    assert command.argv == ["python", "-c", "print(1)", "--id", "b"]
    assert command.env["OPENAI_BASE_URL"] == command.env["MY_URL"] == "http://127.0.0.1:9/v1"
    assert command.env["PROMPT"] == "yo" and command.env["FIXED"] == "yes"
    assert command.env["OPENFORGE_TASK_ID"] == "b"
    assert command.env["PATH"].split(":")[0] == str(Path(sys.executable).parent)
    assert json.loads(command.files[work / "task.json"]) == {"id": "b", "prompt": "yo"}
    assert command.cwd == work
    grader = plan.grader_command(
        bundle, rollout, sidecar_url="http://127.0.0.1:9", workdir=work, harness_exit=3
    )
    assert grader is not None
    assert grader.argv == ["python", f"{tmp_path}/grade.py", "b"]
    assert grader.env["OPENFORGE_HARNESS_EXIT_CODE"] == "3"


def test_a_harness_env_from_another_file_names_its_files_by_harness_dir(tmp_path: Path) -> None:
    harness = tmp_path / "catalog" / "echo"
    harness.mkdir(parents=True)
    (harness / "harnessenv.yaml").write_text(
        ENV.replace("OPENFORGE_MANIFEST_DIR", "OPENFORGE_HARNESS_DIR")
    )
    (tmp_path / "job.yaml").write_text(JOB)
    (tmp_path / "tasks.jsonl").write_text('{"id": "a", "prompt": "hi"}\n')
    bundle = plan.load([harness / "harnessenv.yaml", tmp_path / "job.yaml"])
    assert (bundle.manifest_dir, bundle.harness_dir) == (tmp_path, harness)
    rollout = plan.rollouts_for(bundle, 0)[0]
    command = plan.harness_command(
        bundle, rollout, sidecar_url="http://127.0.0.1:9", workdir=tmp_path / "w"
    )
    assert command.env["OPENFORGE_HARNESS_DIR"] == str(harness)
    assert command.env["OPENFORGE_MANIFEST_DIR"] == str(tmp_path)
    grader = plan.grader_command(
        bundle, rollout, sidecar_url="http://127.0.0.1:9", workdir=tmp_path / "w", harness_exit=0
    )
    assert grader is not None and grader.argv == ["python", f"{harness}/grade.py", "a"]


@pytest.mark.parametrize(
    ("stdout", "exit_code", "expected"),
    [
        ('noise\n{"reward": 0.5}\n', 0, 0.5),
        ('{"reward": 1}', 1, 1.0),
        ("no json", 0, None),
        ('{"score": 1}', 0, None),
        ('{"reward": true}', 0, None),
    ],
)
def test_reward_comes_from_the_graders_last_json_line(
    tmp_path: Path, stdout: str, exit_code: int, expected: float | None
) -> None:
    bundle = plan.load([write(tmp_path)])
    assert bundle.env.spec.grader is not None
    value, why = grading.reward(
        bundle.env.spec.grader.reward_from, stdout=stdout, exit_code=exit_code
    )
    assert value == expected
    assert (why == "") == (expected is not None)


@pytest.mark.parametrize(
    ("env", "job", "tasks", "message"),
    [
        (
            ENV,
            JOB.replace("samplesPerTask: 2", "samplesPerTask: two"),
            None,
            "job.yaml:27: spec.samplesPerTask: input should be a valid integer",
        ),
        (ENV, JOB.replace("parallelism: 2", "parallelism: 2\n  paralelism: 3"), None, "paralelism"),
        (
            ENV.replace('          command: [python, -c, "print(1)"]\n', ""),
            JOB,
            None,
            "needs a command to run locally",
        ),
        (
            ENV,
            JOB.replace("tasks.jsonl", "missing.jsonl"),
            None,
            "spec.tasks.file: missing.jsonl does not exist",
        ),
        (
            ENV,
            JOB.replace("name: echo}", "name: other}"),
            None,
            r"job.yaml:25: spec.harnessEnvRef.name: no HarnessEnv named 'other' in the given "
            r"files; the files define 'echo'",
        ),
        (
            ENV,
            JOB.replace("name: echo}", "name: ecko}"),
            None,
            r"job.yaml:25: .*'ecko'.*; did you mean 'echo'\?",
        ),
        ("", JOB, None, r"the files define none: give the HarnessEnv's file too"),
        (ENV, JOB, '{"id": "a"}\n{"prompt": "no id"}\n', "tasks.jsonl, line 2: id"),
        (
            ENV,
            JOB,
            '{"id": "a"}\n{"id": "a"}\n',
            "tasks.jsonl, line 2: id: .a. is already the id of line 1",
        ),
    ],
)
def test_bad_manifests_fail_before_anything_starts_naming_file_and_field(
    tmp_path: Path, env: str, job: str, tasks: str | None, message: str
) -> None:
    with pytest.raises((plan.PlanError, manifests.ManifestError), match=message):
        plan.load([write(tmp_path, env, job, tasks)])


def test_local_policy_model_must_be_a_model_directory(tmp_path: Path) -> None:
    bundle = plan.load([write(tmp_path)])
    with pytest.raises(
        plan.PlanError, match=r"spec\.policy\.model: 'model' is not a model directory"
    ):
        plan.policy_model(bundle)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    assert plan.policy_model(bundle) == tmp_path / "model"


def trainer_args(bundle: plan.Bundle, tmp_path: Path) -> list[str]:
    return plan.trainer_args(
        bundle,
        model=tmp_path / "model",
        run_dir=tmp_path / "run",
        store=tmp_path / "s.db",
        serve="http://x",
        iterations=3,
    )


def test_training_options_reach_the_trainer_as_options(tmp_path: Path) -> None:
    job = JOB + (
        "  training:\n    learningRate: 0.001\n"
        "    options: {adamEps: 1.0e-5, lossAggMode: seq-mean-token-mean}\n"
    )
    bundle = plan.load([write(tmp_path, job=job)])
    args = trainer_args(bundle, tmp_path)
    assert args[args.index("--lr") + 1] == "0.001"
    options = [args[i + 1] for i, arg in enumerate(args) if arg == "--option"]
    assert options == ["adamEps=1e-05", 'lossAggMode="seq-mean-token-mean"']


def test_a_containers_working_dir_is_the_rollouts_own_directory_locally(tmp_path: Path) -> None:
    env = ENV.replace(
        '          env: [{name: FIXED, value: "yes"}]\n',
        '          env: [{name: FIXED, value: "yes"}]\n          workingDir: /work\n',
    )
    bundle = plan.load([write(tmp_path, env=env)])
    rollout = plan.rollouts_for(bundle, 0)[0]
    command = plan.harness_command(
        bundle, rollout, sidecar_url="http://127.0.0.1:9", workdir=tmp_path / "w"
    )
    assert command.cwd == tmp_path / "w"  # not /work, an image path
    local = env.replace("  task:\n", "  local:\n    workingDir: sub\n  task:\n", 1)
    bundle = plan.load([write(tmp_path, env=local)])
    command = plan.harness_command(
        bundle, rollout, sidecar_url="http://127.0.0.1:9", workdir=tmp_path / "w"
    )
    assert command.cwd == tmp_path / "w" / "sub"


def test_a_task_file_that_is_not_utf8_names_the_byte(tmp_path: Path) -> None:
    path = write(tmp_path)
    (tmp_path / "tasks.jsonl").write_bytes(b'{"id": "a", "prompt": "caf\xe9"}\n')
    with pytest.raises(
        plan.PlanError,
        match=r"job.yaml: spec.tasks.file: .*tasks.jsonl is not UTF-8 text \(at byte offset 26\)",
    ):
        plan.load([path])


def test_engine_verl_runs_openforge_train_verl_on_every_task_with_verl_keys(
    tmp_path: Path,
) -> None:
    job = JOB + (
        "  training:\n    engine: verl\n    learningRate: 0.001\n    seed: 3\n"
        "    options: {trainer.n_gpus_per_node: 4, actor_rollout_ref.actor.clip_ratio: 0.2,"
        " trainer.device: cuda}\n"
    )
    bundle = plan.load([write(tmp_path, job=job)])
    args = trainer_args(bundle, tmp_path)
    assert args[0] == "train-verl"
    value = {arg: args[i + 1] for i, arg in enumerate(args[:-1]) if arg.startswith("--")}
    assert (value["--steps"], value["--group-size"], value["--lr"], value["--seed"]) == (
        "3",
        "2",
        "0.001",
        "3",
    )
    assert value["--run-dir"] == str(tmp_path / "run" / "train")
    # each step trains on every task's group of the iteration the sidecars labelled
    assert [args[i + 1] for i, arg in enumerate(args) if arg == "--task"] == ["a", "b"]
    assert value["--batch"] == "{iteration}/4"
    assert value["--batch"].format(iteration=2) == plan.batch_label(bundle, 2) == "2/4"
    assert [args[i + 1] for i, arg in enumerate(args) if arg == "--option"] == [
        "trainer.n_gpus_per_node=4",
        "actor_rollout_ref.actor.clip_ratio=0.2",
        'trainer.device="cuda"',
    ]
    assert "--groups-per-step" not in args


def test_with_veRLs_own_vllm_servers_the_trainer_serves_and_publishes_nowhere(
    tmp_path: Path,
) -> None:
    """``actor_rollout_ref.rollout.name: vllm`` (GPUs): veRL's own servers serve the
    sidecars, so no ``openforge serve`` runs and the trainer is given none to publish to;
    ``openforge train-verl`` takes the option as its rollout (its own check, run here)."""
    job = JOB + (
        "  training:\n    engine: verl\n    options: {actor_rollout_ref.rollout.name: vllm,"
        " trainer.device: cuda}\n"
    )
    bundle = plan.load([write(tmp_path, job=job)])
    assert plan.trainer_serves(bundle)
    args = plan.trainer_args(
        bundle, model=tmp_path / "model", run_dir=tmp_path / "run", store=tmp_path / "s.db",
        serve=None, iterations=3,
    )  # fmt: skip
    assert "--serve" not in args
    checked = subprocess.run(
        processes.openforge(*args, "--check"), capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stderr[-2000:]
    assert "actor_rollout_ref.rollout.name=vllm" in json.loads(checked.stdout)
    published = [*args, "--serve", "http://127.0.0.1:1", "--check"]
    refused = subprocess.run(
        processes.openforge(*published), capture_output=True, text=True, check=False
    )
    assert refused.returncode == 2 and "nothing to publish to" in refused.stderr, refused.stderr
    for options in ("{trainer.device: cuda}", "{actor_rollout_ref.rollout.name: external}"):
        other = JOB + f"  training:\n    engine: verl\n    options: {options}\n"
        assert not plan.trainer_serves(plan.load([write(tmp_path, job=other)]))
    assert not plan.trainer_serves(plan.load([write(tmp_path)]))


def test_engine_verl_refuses_max_staleness_naming_the_field(tmp_path: Path) -> None:
    job = JOB + "  training:\n    engine: verl\n    maxStaleness: 1\n"
    with pytest.raises(manifests.ManifestError) as error:
        plan.load([write(tmp_path, job=job)])
    assert "spec.training.maxStaleness" in str(error.value)
    assert "engine verl trains each step on that iteration's own rollouts" in str(error.value)


def test_an_unknown_engine_is_refused_naming_the_field(tmp_path: Path) -> None:
    job = JOB + "  training:\n    engine: ray\n"
    with pytest.raises(manifests.ManifestError) as error:
        plan.load([write(tmp_path, job=job)])
    assert "spec.training.engine" in str(error.value)
