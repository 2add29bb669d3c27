"""From manifests to what ``openforge run`` starts: pure builders, no I/O but reading.

:func:`load` reads the manifests (and the task file they name) and checks
everything a local run needs before anything starts, so a bad manifest fails
with its file, field and what was expected. The other functions build the
argv / env / files of one rollout's harness and grader.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openforge import policy_servers
from openforge.api import manifests, rollout_env, rollouts, templates, v1alpha1
from openforge.api import tasks as task_records


class PlanError(ValueError):
    """A manifest set that cannot run locally; the message names file and field."""


@dataclass(frozen=True, slots=True)
class Bundle:
    """One RolloutJob with its HarnessEnv and tasks, ready to run.

    ``manifest_dir`` is the RolloutJob's file's directory, ``harness_dir`` the
    HarnessEnv's: they differ when a job runs a HarnessEnv kept elsewhere
    (``openforge run examples/harnesses/codex/harnessenv.yaml my-job.yaml``),
    whose commands then name their files by ``$OPENFORGE_HARNESS_DIR``.
    """

    env: v1alpha1.HarnessEnv
    job: v1alpha1.RolloutJob
    tasks: tuple[dict[str, Any], ...]
    manifest_dir: Path
    harness_dir: Path

    @property
    def name(self) -> str:
        return self.job.metadata.name or "job"


@dataclass(frozen=True, slots=True)
class Rollout:
    """One attempt of one sample of one task, in one iteration."""

    job: str
    iteration: int
    index: int
    attempt: int
    task: Mapping[str, Any]
    sample: int

    @property
    def task_id(self) -> str:
        return str(self.task["id"])

    @property
    def rollout_id(self) -> str:
        return rollouts.rollout_name(
            f"{self.job}-i{self.iteration}", self.index, attempt=self.attempt
        )

    def retry(self) -> Rollout:
        return Rollout(
            self.job, self.iteration, self.index, self.attempt + 1, self.task, self.sample
        )


@dataclass(frozen=True, slots=True)
class Command:
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    files: dict[Path, str]


def load(paths: Sequence[str | os.PathLike[str]]) -> Bundle:
    """The one RolloutJob in ``paths`` with its HarnessEnv and tasks."""
    resources: list[tuple[v1alpha1.Resource, Path]] = []
    problems: list[manifests.Problem] = []
    for path in paths:
        try:
            resources += [(r, Path(path)) for r in manifests.load_manifests(Path(path))]
        except manifests.ManifestError as exc:
            problems += exc.problems
        except OSError as exc:
            raise PlanError(f"{path}: cannot read: {exc.strerror}") from None
    if problems:
        raise manifests.ManifestError(problems)
    jobs = [(r, p) for r, p in resources if isinstance(r, v1alpha1.RolloutJob)]
    envs = {r.metadata.name: (r, p) for r, p in resources if isinstance(r, v1alpha1.HarnessEnv)}
    if len(jobs) != 1:
        raise PlanError(
            f"expected exactly one RolloutJob in {', '.join(map(str, paths))}, found {len(jobs)}"
        )
    job, job_path = jobs[0]
    assert isinstance(job, v1alpha1.RolloutJob)
    ref = job.spec.harness_env_ref.name
    if ref not in envs:
        raise PlanError(
            missing_env(job, job_path, ref=ref, names=sorted(name for name in envs if name))
        )
    env, env_path = envs[ref]
    assert isinstance(env, v1alpha1.HarnessEnv)
    try:
        env.spec.local_process()
    except ValueError as exc:
        raise PlanError(f"{env_path}: spec.template: {exc}") from None
    tasks = _tasks(job, job_path)
    _check_templates(env, env_path, tasks=tasks)
    return Bundle(env, job, tuple(tasks), job_path.resolve().parent, env_path.resolve().parent)


def _check_templates(
    env: v1alpha1.HarnessEnv, path: Path, *, tasks: Sequence[Mapping[str, Any]]
) -> None:
    """Render the task's args, env and file templates for every task now, so that a field
    one task lacks stops the run before anything starts, naming the line and the task."""
    delivery = env.spec.task
    checks: list[tuple[tuple[str | int, ...], Callable[[Mapping[str, Any]], str]]] = [
        *(
            (("spec", "task", "args", i), functools.partial(templates.render, arg))
            for i, arg in enumerate(delivery.args or [])
        ),
        *(
            (("spec", "task", "env", name), functools.partial(templates.render, value))
            for name, value in (delivery.env or {}).items()
        ),
    ]
    if delivery.file is not None:
        checks.append(
            (
                ("spec", "task", "file", "template"),
                functools.partial(task_records.render_file, delivery.file),
            )
        )
    for loc, render in checks:
        for task in tasks:
            try:
                render(task)
            except templates.TemplateError as error:
                line = manifests.line_of(path, "HarnessEnv", name=env.metadata.name or "", loc=loc)
                where = f"{path}:{line}" if line is not None else str(path)
                field = ".".join(str(part) for part in loc)
                raise PlanError(f"{where}: {field}: {error}") from None


def missing_env(job: v1alpha1.RolloutJob, path: Path, *, ref: str, names: list[str]) -> str:
    """The error for a ``harnessEnvRef`` that no given file defines: its line, and what
    the files hold instead (the closest name, or every name, or a hint)."""
    loc = ("spec", "harnessEnvRef", "name")
    line = manifests.line_of(path, "RolloutJob", name=job.metadata.name or "", loc=loc)
    where = f"{path}:{line}" if line is not None else str(path)
    close = difflib.get_close_matches(ref, names, n=1)
    if close:
        hint = f"did you mean {close[0]!r}?"
    elif names:
        hint = f"the files define {', '.join(repr(n) for n in names)}"
    else:
        hint = (
            "the files define none: give the HarnessEnv's file too "
            "(openforge run JOB.yaml ENV.yaml)"
        )
    return (
        f"{where}: spec.harnessEnvRef.name: no HarnessEnv named {ref!r} in the given files; {hint}"
    )


def _tasks(job: v1alpha1.RolloutJob, path: Path) -> list[dict[str, Any]]:
    try:
        records = _records(job, path)
        task_records.check_rollouts(records, job.spec.samples_per_task)
    except task_records.TaskError as error:
        line = (
            manifests.line_of(path, "RolloutJob", name=job.metadata.name or "", loc=error.loc)
            if error.loc
            else None
        )
        raise PlanError(
            f"{path}:{line}: {error}" if line is not None else f"{path}: {error}"
        ) from None
    return records


def _records(job: v1alpha1.RolloutJob, path: Path) -> list[dict[str, Any]]:
    source = job.spec.tasks
    if source.config_map_ref is not None:
        raise PlanError(
            f"{path}: spec.tasks.configMapRef: a ConfigMap exists only on a cluster; use "
            "spec.tasks.file or inline locally"
        )
    records = task_records.inline(source)
    if records is not None:
        return records
    assert source.file is not None
    task_file = (path.resolve().parent / source.file).resolve()
    if not task_file.is_file():
        raise PlanError(
            f"{path}: spec.tasks.file: {source.file} does not exist (looked for {task_file})"
        )
    size = task_file.stat().st_size
    limit = task_records.MAX_TASKS * task_records.MAX_TASK_BYTES
    if size > limit:
        raise PlanError(
            f"{path}: spec.tasks.file: {task_file} is {size} bytes; a task file holds at most "
            f"{limit}"
        )
    try:
        text = task_file.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise PlanError(
            f"{path}: spec.tasks.file: {task_file} is not UTF-8 text (at byte offset {error.start})"
        ) from None
    try:
        return task_records.parse_jsonl(text, where=str(task_file))
    except task_records.TaskError as error:
        raise PlanError(f"{path}: spec.tasks.file: {error}") from None


def rollouts_for(bundle: Bundle, iteration: int) -> list[Rollout]:
    """Every first attempt of an iteration: each task times samplesPerTask."""
    samples = bundle.job.spec.samples_per_task
    return [
        Rollout(
            bundle.name,
            iteration,
            rollouts.rollout_index(t, s, samples_per_task=samples),
            0,
            task,
            s,
        )
        for t, task in enumerate(bundle.tasks)
        for s in range(samples)
    ]


def harness_command(
    bundle: Bundle, rollout: Rollout, *, sidecar_url: str, workdir: Path
) -> Command:
    spec = bundle.env.spec
    process = spec.local_process()
    delivery = spec.task
    base = _base_env(bundle, rollout, workdir=workdir)
    argv = [*process.argv, *(templates.render(a, rollout.task) for a in delivery.args or [])]
    files: dict[Path, str] = {}
    if delivery.file is not None:
        content = task_records.render_file(delivery.file, rollout.task)
        files[workdir / delivery.file.path] = content
    cwd = (
        workdir / process.working_dir
        if process.working_dir and not os.path.isabs(process.working_dir)
        else Path(process.working_dir or workdir)
    )
    return Command(
        [rollout_env.expand(a, base) for a in argv],
        _harness_env(bundle, rollout, base=base, sidecar_url=sidecar_url),
        cwd,
        files,
    )


def grader_command(
    bundle: Bundle, rollout: Rollout, *, sidecar_url: str, workdir: Path, harness_exit: int
) -> Command | None:
    """The grader, in the harness's environment (as in a pod) with its exit code."""
    grader = bundle.env.spec.grader
    if grader is None:
        return None
    base = _base_env(bundle, rollout, workdir=workdir)
    env = {
        **_harness_env(bundle, rollout, base=base, sidecar_url=sidecar_url),
        "OPENFORGE_HARNESS_EXIT_CODE": str(harness_exit),
    }
    return Command([rollout_env.expand(a, base) for a in grader.command], env, workdir, {})


def _harness_env(
    bundle: Bundle, rollout: Rollout, *, base: Mapping[str, str], sidecar_url: str
) -> dict[str, str]:
    """The base variables, the template's own, the task's, then the base URL's, in the
    order a pod's container merges them."""
    spec = bundle.env.spec
    env = {**base, **spec.local_process().env}
    env.update(
        {
            name: templates.render(value, rollout.task)
            for name, value in (spec.task.env or {}).items()
        }
    )
    if spec.base_url is not None:
        for name in spec.base_url.env:
            env[name] = sidecar_url + spec.base_url.suffix
    return env


def _base_env(bundle: Bundle, rollout: Rollout, *, workdir: Path) -> dict[str, str]:
    """What every harness and grader process sees about its rollout (``rollout_env.base_env``,
    as in a pod), and what only this machine has: ``PATH`` and the manifests' folders."""
    return {
        # this interpreter's directory first, so `python` in a manifest is the
        # environment OpenForge runs in
        "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
        **rollout_env.base_env(
            job=bundle.name,
            rollout_id=rollout.rollout_id,
            task=rollout.task,
            sample=rollout.sample,
            attempt=rollout.attempt,
            workdir=str(workdir),
        ),
        "OPENFORGE_MANIFEST_DIR": str(bundle.manifest_dir),
        "OPENFORGE_HARNESS_DIR": str(bundle.harness_dir),
    }


def policy_model(bundle: Bundle) -> Path | None:
    """The model directory ``openforge serve`` loads when the job names no endpoint.

    Locally ``spec.policy.model`` is a path (relative to the manifest) to a
    Hugging Face model directory; on a cluster it is the name the inference
    service serves.
    """
    policy = bundle.job.spec.policy
    if policy.endpoint is not None:
        return None
    path = (bundle.manifest_dir / policy.model).resolve()
    if not (path / "config.json").is_file():
        raise PlanError(
            f"{bundle.manifest_dir}: spec.policy.model: {policy.model!r} is not a model directory "
            f"(no config.json in {path}); "
            "without spec.policy.endpoint it must name the local model to serve"
        )
    return path


def latest_checkpoint(train_dir: Path) -> Path | None:
    """The trainer's newest checkpoint (``checkpoints/step-NNNNNN``), if any."""
    steps = sorted((train_dir / "checkpoints").glob("step-*"))
    complete = [p for p in steps if (p / "config.json").is_file()]
    return complete[-1] if complete else None


def checkpoint_version(model_dir: Path) -> int:
    """The policy version a checkpoint holds (0 for a model that never trained)."""
    state = model_dir / "trainer_state.json"
    if not state.is_file():
        return 0
    return int(json.loads(state.read_text()).get("policy_version", 0))


def engine(bundle: Bundle) -> str:
    """The trainer the job asks for: ``openforge`` (``openforge train``) or ``verl``."""
    training = bundle.job.spec.training
    return training.engine if training is not None else "openforge"


def trainer_serves(bundle: Bundle) -> bool:
    """Whether the trainer runs the policy's servers itself: the veRL engine with its own
    vLLM servers (``spec.training.options`` ``actor_rollout_ref.rollout.name: vllm``, GPUs
    only). Then no ``openforge serve`` runs: the sidecars call the servers the trainer
    names in its engines file (:mod:`openforge.policy_servers`) each iteration."""
    training = bundle.job.spec.training
    return (
        training is not None
        and training.engine == "verl"
        and policy_servers.trainer_serves(training.options or {})
    )


def batch_label(bundle: Bundle, iteration: int | str) -> str:
    """The ``openforge.dev/batch`` label of an iteration's rollouts (the sidecar's
    ``--label``; the veRL engine's ``--batch`` template, with ``"{iteration}"``)."""
    return f"{iteration}/{len(bundle.tasks) * bundle.job.spec.samples_per_task}"


def trainer_args(
    bundle: Bundle,
    *,
    model: Path | None,
    run_dir: Path,
    store: Path,
    serve: str | None,
    iterations: int,
) -> list[str]:
    """The trainer's ``openforge`` arguments for a local run: one step per iteration,
    trained on every task's group of that iteration, its weights published to ``serve``
    (None: the trainer serves them itself, :func:`trainer_serves`). ``spec.training.options``
    pass through as ``--option NAME=VALUE`` (JSON): ``openforge train``'s fields, or
    veRL's keys for ``openforge train-verl``; the trainer validates them."""
    if model is None:
        raise PlanError("training locally needs spec.policy.model to be a local model directory")
    common = [
        "--store",
        str(store),
        "--job",
        bundle.name,
        "--model",
        str(model),
        "--run-dir",
        str(run_dir / "train"),
        *(["--serve", serve] if serve is not None else []),
        "--steps",
        str(iterations),
        "--group-size",
        str(bundle.job.spec.samples_per_task),
    ]
    training = bundle.job.spec.training
    if training is not None:
        # the settings both trainers take by the same flag
        for flag, value in (
            ("--lr", training.learning_rate),
            ("--seed", training.seed),
            ("--kl-coef", training.kl_coef),
        ):
            if value is not None:
                common += [flag, str(value)]
        # each trainer reads the JSON value and checks the name (train-verl: veRL's key)
        for name, value in (training.options or {}).items():
            common += ["--option", f"{name}={json.dumps(value)}"]
    if training is not None and training.engine == "verl":
        # every task is a dataset row, all of them in every step, read from its iteration
        tasks = [arg for task in bundle.tasks for arg in ("--task", str(task["id"]))]
        return ["train-verl", *common, "--batch", batch_label(bundle, "{iteration}"), *tasks]
    args = ["train", *common, "--groups-per-step", str(len(bundle.tasks))]
    if training is not None and training.max_staleness is not None:
        args += ["--max-staleness", str(training.max_staleness)]
    return args
