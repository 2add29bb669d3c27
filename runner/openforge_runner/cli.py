"""``openforge run FILE...``: run a RolloutJob (and train on it) on this machine.

Starts the collector, the inference server (``openforge serve``, unless the
job names a ``policy.endpoint`` or the trainer serves the policy itself: veRL's
own vLLM servers, which it names in its engines file each step) and the trainer
(``openforge train``) as local processes, then loops: all rollouts of an
iteration (``parallelism`` at a time, each with its own sidecar), one training
step on their groups, new weights published to the server. Ctrl-C stops
cleanly; running the same command again continues where it stopped.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import FrameType

from openforge import cli, policy_servers
from openforge.api import manifests

from openforge_runner import executor, plan, processes, progress, runner, trainer_servers

# `openforge train` prints one of these once its settings are valid and its policy is loaded;
# `openforge train-verl` once its settings and veRL's config are, before its Ray cluster starts
TRAINER_READY = (
    "openforge train: starting",
    "openforge train: resumed",
    "openforge train-verl: starting",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="openforge run", description=cli.description(__doc__))
    parser.add_argument(
        "files", nargs="+", type=Path, help="YAML manifests: one RolloutJob and its HarnessEnv"
    )
    parser.add_argument(
        "--run-dir", type=Path, help="where everything of this run goes (default: runs/<job name>)"
    )
    parser.add_argument(
        "--iterations",
        type=int,
        help="rollout -> train iterations (default: spec.training.iterations, else 1)",
    )
    parser.add_argument("--no-train", action="store_true", help="only run and capture rollouts")
    parser.add_argument(
        "--quiet", action="store_true", help="no live display; a line per iteration"
    )
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        bundle = plan.load(args.files)
        model = plan.policy_model(bundle)
    except (manifests.ManifestError, plan.PlanError) as exc:
        print(f"openforge run: {exc}", file=sys.stderr)
        return 2
    if model is None and not args.no_train:
        print(
            f"openforge run: {bundle.manifest_dir}: spec.policy.endpoint: training locally needs "
            "the policy's weights, so spec.policy.model must be the local model directory that "
            "`openforge serve` loads (leave endpoint unset), or run with --no-train",
            file=sys.stderr,
        )
        return 2
    training = bundle.job.spec.training
    iterations = args.iterations or (training.iterations if training and training.iterations else 1)
    train = not args.no_train
    # veRL's own vLLM servers serve the sidecars (GPUs): no `openforge serve`
    trainer_serves = train and plan.trainer_serves(bundle)
    run_dir = (args.run_dir or Path("runs") / bundle.name).resolve()

    def trainer_args(serve: str | None) -> list[str]:
        """The trainer's arguments, its weights published to ``serve`` (none when it serves
        the policy itself)."""
        return plan.trainer_args(
            bundle,
            model=model,
            run_dir=run_dir,
            store=run_dir / "store.db",
            serve=None if trainer_serves else serve,
            iterations=iterations,
        )

    problem = _check_training(trainer_args(CHECK_SERVE_URL) if train else None)
    if problem:
        print(f"openforge run: RolloutJob {bundle.name}: spec.training: {problem}", file=sys.stderr)
        return 2
    trainer_engine = plan.engine(bundle) if train else None
    run_dir.mkdir(parents=True, exist_ok=True)
    finished = runner.finished_history(
        bundle, runner.Journal(run_dir / "journal.jsonl"), iterations=iterations, train=train
    )
    if finished is not None:  # nothing to start any process for
        print(
            progress.summary(
                finished, run_dir=run_dir, trained=train, engine=trainer_engine, nothing_left=True
            )
        )
        return 0
    problem = _cannot_resume(run_dir, trainer_engine)
    if problem:
        print(f"openforge run: {run_dir}: {problem}; run with a new --run-dir", file=sys.stderr)
        return 2
    stop = threading.Event()
    _on_signal(stop)
    services: list[processes.Service] = []
    supervisor = processes.Supervisor(
        stop=stop, on_event=runner.Journal(run_dir / "journal.jsonl").write
    )
    try:
        collector = supervisor.watch(
            _start(
                services,
                processes.Service(
                    "collector",
                    processes.openforge(
                        "collector",
                        "--store",
                        str(run_dir / "store.db"),
                        "--listen",
                        f"127.0.0.1:{(cport := processes.free_port())}",
                    ),
                    run_dir / "collector.log",
                    port=cport,
                    stopping=stop,
                ),
            )
        )
        _drain_leftovers(
            run_dir, collector=f"127.0.0.1:{collector.port}", when="left by an earlier run"
        )
        torch_env = processes.torch_threads_env()  # serve's and train's
        engine_url = bundle.job.spec.policy.endpoint
        if not trainer_serves and engine_url is None:
            assert model is not None
            eport = processes.free_port()

            def serve_argv() -> list[str]:  # a restart serves the newest checkpoint
                served = plan.latest_checkpoint(run_dir / "train") or model
                return processes.openforge(
                    "serve",
                    "--model",
                    str(served),
                    "--port",
                    str(eport),
                    "--model-name",
                    bundle.job.spec.policy.model,
                    "--policy-version",
                    str(plan.checkpoint_version(served)),
                )

            engine = supervisor.watch(
                _start(
                    services,
                    processes.Service(
                        "serve",
                        serve_argv(),
                        run_dir / "serve.log",
                        port=eport,
                        env=torch_env,
                        stopping=stop,
                    ),
                ),
                argv=serve_argv,
            )
            engine_url = engine.url
        trainer = None
        servers = None  # the trainer's own (veRL's vLLM servers), when it serves the policy
        if train:
            trainer_argv = processes.openforge(*trainer_args(engine_url))
            trainer = processes.Service(
                "trainer", trainer_argv, run_dir / "trainer.log", env=torch_env, stopping=stop
            )
            # it runs or is being restarted (a restarted trainer resumes from its checkpoint)
            trainer_alive = functools.partial(supervisor.alive, trainer)
            if trainer_serves:
                servers = trainer_servers.TrainerServers(
                    run_dir / "train" / policy_servers.FILE,
                    exit_code=trainer.exit_code,
                    alive=trainer_alive,
                    stop=stop,
                )
                servers.forget()  # an earlier trainer's are gone
            _start(services, trainer)
            trainer.wait_for_line(TRAINER_READY)

            def restart_argv() -> list[str]:
                if servers is not None:
                    servers.forget()  # the dead trainer's are gone
                return trainer_argv

            # veRL's trainer resumes from its own checkpoint, the rest of its dead Ray
            # cluster killed first
            supervisor.watch(trainer, argv=restart_argv)
        resume = runner.resume_state(runner.Journal(run_dir / "journal.jsonl"))
        if trainer is not None and resume.trained and engine_url is not None:
            # a resumed run's next rollouts are sampled by the weights it trained last:
            # `openforge serve` restarted on the initial model until veRL, resumed from its
            # checkpoint, publishes them (openforge train's newest checkpoint is served at once)
            trained_version = max(resume.trained) + 1
            if (
                runner.wait_for_policy(
                    engine_url,
                    trained_version,
                    alive=trainer_alive,
                    stop=stop,
                    timeout=1800,
                )
                is None
            ):
                raise processes.Stopped("stopped while the trainer resumed")
        collector_address = f"127.0.0.1:{collector.port}"
        served = itertools.count()  # the trainer's servers take the rollouts in turn

        def current_endpoints(rollout: plan.Rollout) -> executor.Endpoints:
            if servers is None:
                assert engine_url is not None
                version = runner.policy_version(engine_url)
                return executor.Endpoints(engine_url, collector_address, version)
            # the trainer's own servers, asked for each rollout (a restarted trainer's are new)
            up = servers.up_for(rollout.iteration)
            if up is None:
                raise processes.Stopped(
                    f"stopped before iteration {rollout.iteration + 1}'s servers"
                )
            engines = up.endpoints()
            return executor.Endpoints(
                engine=engines[next(served) % len(engines)], collector=collector_address,
                policy_version=up.iteration, tokenizer=str(model),
            )  # fmt: skip

        def trained(iteration: int) -> int | None:
            """The policy version after the trainer's step on ``iteration``; None if stopped."""
            if servers is not None:
                return servers.trained(iteration)
            assert engine_url is not None  # published to `openforge serve`
            return runner.wait_for_policy(
                engine_url, iteration + 1, alive=trainer_alive, stop=stop, timeout=1800
            )

        display = progress.Display(
            job=bundle.name, iterations=iterations, metrics=run_dir / "train" / "metrics.jsonl"
        )
        history: list[runner.IterationStats] = []
        with display if not args.quiet else _Null():
            job_runner = runner.Runner(
                bundle,
                run_dir=run_dir,
                endpoints=current_endpoints,
                on_change=display.update,
                stop=stop,
                ready=supervisor.up.is_set,
            )
            for iteration in range(iterations):
                if servers is not None and iteration not in resume.trained:
                    display.update(phase=f"iteration {iteration + 1}: waiting for the servers")
                    if servers.up_for(iteration) is None and stop.is_set():
                        break  # (None, not stopped: the trainer finished; nothing left to run)
                display.update(phase=f"iteration {iteration + 1}: rollouts")
                stats = job_runner.run_iteration(iteration)
                history.append(stats)
                if args.quiet:
                    print(
                        f"iteration {iteration + 1}/{iterations}: {stats.done}/{stats.total} done, "
                        f"{stats.failed} failed, mean reward {stats.mean_reward}",
                        flush=True,
                    )
                if stop.is_set():
                    break
                if trainer is not None and iteration not in resume.trained:
                    display.update(phase=f"iteration {iteration + 1}: training")
                    version = trained(iteration)
                    if version is None:
                        break  # stopped while the trainer trained: the rerun waits for it again
                    job_runner.journal.write(
                        {
                            "event": "trained",
                            "iteration": iteration,
                            "policy_version": version,
                            "engine": trainer_engine,
                        }
                    )
        supervisor.close()
        if supervisor.failure:
            print(f"openforge run: {supervisor.failure}", file=sys.stderr)
            return 1
        _drain_leftovers(
            run_dir,
            collector=f"127.0.0.1:{collector.port}",
            when="left with records unacknowledged",
        )
        print(
            progress.summary(
                history, run_dir=run_dir, trained=trainer is not None, engine=trainer_engine
            )
        )
        if stop.is_set():
            print(f"openforge run: stopped; {_how_to_continue(run_dir, trainer_engine)}")
            return 130
        return 0
    except processes.Stopped as exc:
        print(f"openforge run: {exc}; {_how_to_continue(run_dir, trainer_engine)}", file=sys.stderr)
        return 130
    except (processes.ServiceError, RuntimeError, TimeoutError) as exc:
        print(f"openforge run: {exc}", file=sys.stderr)
        return 1
    finally:
        supervisor.close()
        for service in reversed(services):
            service.stop()


def _cannot_resume(run_dir: Path, trainer_engine: str | None) -> str:
    """Why this run directory's training cannot be continued by ``trainer_engine`` ("" when
    it can): a directory is trained by one engine (each resumes from its own checkpoints)."""
    resume = runner.resume_state(runner.Journal(run_dir / "journal.jsonl"))
    if trainer_engine is None or not resume.trained:
        return ""
    earlier = f"an earlier run trained {len(resume.trained)} iteration(s) with engine " + (
        ", ".join(sorted(resume.trained_by))
    )
    if resume.trained_by != {trainer_engine}:
        return f"{earlier}, and spec.training.engine is {trainer_engine}"
    return ""


def _how_to_continue(run_dir: Path, trainer_engine: str | None) -> str:
    """What a stopped run's user can do next: run it again, unless another engine trained it."""
    if _cannot_resume(run_dir, trainer_engine):
        return f"engine {trainer_engine} cannot continue this run; run with a new --run-dir"
    return f"run the same command again to continue ({run_dir})"


class _Null:
    def __enter__(self) -> _Null:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _drain_leftovers(run_dir: Path, *, collector: str, when: str) -> executor.Drained:
    """Deliver what stopped sidecars left in this run's spools, and close the attempts
    none of them finished (a killed run's): journalled, and said when it did anything."""
    spools = sorted((run_dir / "rollouts").glob("*/spool"))
    drained = executor.drain(
        spools, collector=collector, reason="the run stopped before this attempt was finished"
    )
    if drained.delivered or drained.closed or drained.kept or drained.error:
        runner.Journal(run_dir / "journal.jsonl").write(
            {"event": "drained", **dataclasses.asdict(drained)}
        )
        line = (
            f"openforge run: spools {when}: {drained.delivered} records delivered, "
            f"{drained.closed} unfinished attempts recorded lost and failed"
        )
        if drained.kept or drained.error:
            line += (
                f"; {drained.kept} records still unacknowledged ({drained.error}), "
                "kept for the next run"
            )
        print(line, file=sys.stderr, flush=True)
    return drained


#: The engine's address is known only once it listens; the settings check stands in this one.
CHECK_SERVE_URL = "http://127.0.0.1"


def _check_training(train_args: list[str] | None) -> str:
    """What the trainer's own validation (``openforge train --check``, or ``train-verl``'s,
    which also composes veRL's config) says is wrong
    with these settings; "" when nothing is (or nothing is trained). Run before anything
    starts, so that a bad ``spec.training`` option costs no service start and no rollout."""
    if train_args is None:
        return ""
    done = subprocess.run(
        processes.openforge(*train_args, "--check"), capture_output=True, text=True, check=False
    )
    if done.returncode == 0:
        return ""
    prefix = f"openforge {train_args[0]}: "
    lines = done.stderr.strip().splitlines()
    # from the trainer's own message on (veRL's imports log warnings before it); else all
    first = next((i for i, line in enumerate(lines) if line.startswith(prefix)), 0)
    lines = [line.removeprefix(prefix) for line in lines[first:]]
    return "\n".join(lines) or f"openforge {train_args[0]} --check exited with {done.returncode}"


def _start(services: list[processes.Service], service: processes.Service) -> processes.Service:
    services.append(service)
    return service.start()


def _on_signal(stop: threading.Event) -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        print(
            "\nopenforge run: stopping after cleaning up (Ctrl-C again to abort)", file=sys.stderr
        )
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
